"""A producer named by host name is looked up off the I/O loop (decision T19).

The system resolver is replaced by one that blocks on a gate for one name (``slow.test``) and
resolves it to loopback when the gate opens: what a DNS server that drops a packet does to
``getaddrinfo`` (seconds of retry timer), without a DNS server.  Real managers, real sockets.
"""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from mgr_helpers import Jobs, consumer_req, job, keys_for, metric_sum, producer_req, pump_until

pytestmark = pytest.mark.timeout(60)

SLOW = "slow.test"


class GatedResolver:
    """``socket.getaddrinfo`` with one name held until :attr:`gate` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        self.inside = threading.Event()  # a lookup of SLOW is blocked now
        self.returned = threading.Event()
        real = socket.getaddrinfo

        def getaddrinfo(host: object, *a: object, **k: object) -> object:
            if host != SLOW:
                return real(host, *a, **k)  # type: ignore[arg-type]
            self.inside.set()
            try:
                assert self.gate.wait(30), "the test never opened the gate"
                return real("127.0.0.1", *a, **k)  # type: ignore[arg-type]
            finally:
                self.inside.clear()
                self.returned.set()

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> GatedResolver:
    return GatedResolver(monkeypatch)


def _park(p, kv_id: str, n: int, job_id: int) -> list[bytes]:
    req = producer_req(f"p-{kv_id}", kv_id)
    p.on_new_request(req)
    keys = keys_for(kv_id, n)
    p.submit_store(job(job_id, keys, range(job_id * 4, job_id * 4 + n), req))
    return keys


def test_a_slow_name_lookup_holds_no_other_request(make_manager, resolver) -> None:
    """While the lookup of one producer's name hangs, a load from another producer completes; the
    named producer's load completes once its name answers."""
    slow_p, fast_p, c = make_manager(), make_manager(), make_manager()
    slow_keys, fast_keys = _park(slow_p, "kv-slow", 2, 1), _park(fast_p, "kv-fast", 2, 2)
    jobs = Jobs(c)
    slow_req = consumer_req("d-slow", "kv-slow", SLOW, slow_p.port)
    c.on_new_request(slow_req)
    c.submit_load(job(11, slow_keys, [20, 21], slow_req))
    assert pump_until(resolver.inside.is_set, managers=[slow_p, fast_p, c], jobs=[jobs])
    fast_req = consumer_req("d-fast", "kv-fast", "127.0.0.1", fast_p.port)
    c.on_new_request(fast_req)
    c.submit_load(job(12, fast_keys, [30, 31], fast_req))
    managers = [slow_p, fast_p, c]
    assert pump_until(lambda: jobs.has(12), managers=managers, jobs=[jobs])
    assert resolver.inside.is_set(), "the other load ended only once the lookup had returned"
    assert jobs.one(12).success and not jobs.has(11)
    resolver.gate.set()
    assert pump_until(lambda: jobs.has(11), managers=managers, jobs=[jobs])
    assert jobs.one(11).success, jobs.one(11)


def test_a_dial_that_ends_before_its_lookup_answers_opens_nothing_later(make_manager, resolver, caplog) -> None:
    """The handshake deadline bounds the lookup as it bounds a connection that never comes up;
    the log says the name never answered; the lookup's late answer dials nobody."""
    p = make_manager()
    c = make_manager({"handshake_timeout_s": 0.3})
    keys = _park(p, "kv-late", 1, 1)
    jobs = Jobs(c)
    req = consumer_req("d-late", "kv-late", SLOW, p.port)
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        c.on_new_request(req)
        c.submit_load(job(11, keys, [20], req))
        assert pump_until(lambda: jobs.has(11), managers=[p, c], jobs=[jobs])
    result = jobs.one(11)
    assert not result.success and result.reason == "handshake_timeout", result
    assert resolver.inside.is_set(), "the load ended only once the lookup had returned"
    assert any(f"dial of {SLOW}:{p.port} ended before its name lookup answered" in r.getMessage()
               for r in caplog.records)
    resolver.gate.set()
    assert resolver.returned.wait(10)
    for _ in range(10):  # the lookup's end is taken in the next passes
        for m in (c, p):
            m.poll(0.02)
    assert metric_sum(p, "kvtier_sessions") == 0 and metric_sum(p, "kvtier_session_ends_total") == 0
    assert metric_sum(c, "kvtier_sessions") == 0


DUAL = "dual.test"


def test_a_name_whose_first_address_refuses_is_dialled_at_its_next(make_manager, monkeypatch) -> None:
    """A name that resolves to ``::1`` before ``127.0.0.1`` (``localhost`` on a host whose
    /etc/hosts lists both) reaches a producer that listens on IPv4 only: the refused first address
    is followed by the next, not reported as ``connect_refused`` (decision T20)."""
    real = socket.getaddrinfo
    looked: list[object] = []

    def getaddrinfo(host: object, port: object, *a: object, **k: object) -> object:
        if host != DUAL:
            return real(host, port, *a, **k)  # type: ignore[arg-type]
        looked.append(host)
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    p = make_manager()
    c = make_manager({"allowed_peers": [DUAL]})
    keys = _park(p, "kv-dual", 2, 1)
    jobs = Jobs(c)
    req = consumer_req("d-dual", "kv-dual", DUAL, p.port)
    c.on_new_request(req)
    c.submit_load(job(11, keys, [20, 21], req))
    assert pump_until(lambda: jobs.has(11), managers=[p, c], jobs=[jobs])
    assert looked, "the name was never looked up"
    result = jobs.one(11)
    assert result.success, result


def test_a_name_whose_every_address_refuses_fails_connect_refused(make_manager, monkeypatch) -> None:
    """Each address is tried once: when the last refuses too, the load fails ``connect_refused``
    at once (not at the handshake deadline)."""
    real = socket.getaddrinfo
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def getaddrinfo(host: object, p: object, *a: object, **k: object) -> object:
        if host != DUAL:
            return real(host, p, *a, **k)  # type: ignore[arg-type]
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", p, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", p))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    c = make_manager({"allowed_peers": [DUAL], "handshake_timeout_s": 20})
    jobs = Jobs(c)
    req = consumer_req("d-none", "kv-none", DUAL, port)
    c.on_new_request(req)
    c.submit_load(job(11, [b"k0"], [20], req))
    assert pump_until(lambda: jobs.has(11), managers=[c], jobs=[jobs], timeout_s=20)
    result = jobs.one(11)
    assert not result.success and result.reason == "connect_refused", result
