"""What the manager's API docstrings promise about their arguments holds: seconds of any real
number type, bools where bools are typed, reasons that are spec codes, a request id named when it
is no string, a lookup key checked whatever the request's role."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zmq

from kvtier.api import RequestContext
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.testing.inproc import InprocNetwork, InprocTransport
from tests.manager.mgr_helpers import job


@pytest.fixture
def mgr():
    m = KvTierManager({}, BlockPool(8, 64, pin=False), transport=InprocTransport(InprocNetwork(), "api:1"))
    try:
        yield m
    finally:
        m.shutdown()


def _record(raised: list[BaseException], fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # the test reads it
        raised.append(exc)


def test_any_finite_seconds_are_taken_numpy_scalars_and_past_the_sockets_limits_too() -> None:
    """A numpy scalar is a number of seconds; a wait longer than a lock or libzmq's linger can
    hold is capped, never an OverflowError, and a shutdown with such a grace still closes."""
    m = KvTierManager({"host": "127.0.0.1", "port": 0, "background_poll": True}, BlockPool(4, 64, pin=False))
    try:
        m.poll(np.int64(0))
        m.drain_jobs(np.float64(1.0))
        raised: list[BaseException] = []
        waiting = threading.Thread(target=lambda: _record(raised, m.poll, 1e10), daemon=True)
        waiting.start()  # waits for the loop's next pass, however far: never an OverflowError
        waiting.join(0.5)
        assert waiting.is_alive() and not raised, raised
        m.finish_job(9, store=True, success=True)  # a pass
        waiting.join(10.0)
        assert not waiting.is_alive() and not raised, raised
    finally:
        m.shutdown(1e7)
    with zmq.Context() as ctx, ctx.socket(zmq.ROUTER) as s:
        s.bind(f"tcp://127.0.0.1:{m.port}")  # the port was released


def test_finish_job_refuses_what_no_result_can_carry(mgr):
    for kw, err, says in ((dict(store=True, success=False, reason="bogus"), ValueError, "reason must be"),
                          (dict(store=False, success=False, reason=3), ValueError, "reason must be"),
                          (dict(store=True, success=None), TypeError, "success must be a bool"),
                          (dict(store="yes", success=True), TypeError, "store must be a bool")):
        with pytest.raises(err, match=says):
            mgr.finish_job(7, **kw)
        assert not mgr.is_outstanding(7)  # nothing registered
    mgr.finish_job(7, store=True, success=False, reason="job_refused")  # a code is its Reason
    assert [(r.job_id, r.success, r.reason) for r in mgr.get_finished_jobs()] == [(7, False, "job_refused")]


@pytest.mark.parametrize("call", ["submit_store", "submit_load", "hand_over_store"])
def test_a_request_id_that_is_not_a_string_is_named_by_the_job_calls_too(mgr, call):
    req = RequestContext(req_id=["x"], kv_transfer_params=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"job 5: req.req_id must be a non-empty str"):
        if call == "hand_over_store":
            mgr.hand_over_store(5, req, (b"k",), [0])
        else:
            getattr(mgr, call)(job(5, [b"k"], [0], req))
    assert not mgr.is_outstanding(5)


@pytest.mark.parametrize("kv", [None, {"remote_decoder": {"kv_request_id": "p1"}}])
def test_lookup_names_a_bad_key_whatever_the_requests_role(mgr, kv):
    req = RequestContext(req_id=f"role-{kv is None}", kv_transfer_params=kv)
    for r in (req, RequestContext(req_id="never-announced", kv_transfer_params=None)):
        if r is req:
            mgr.on_new_request(req)
        for key in (None, "abc", b"", b"x" * 300):
            with pytest.raises(ValueError, match="key must be 1..256 bytes"):
                mgr.lookup(key, r)


@pytest.mark.parametrize("slots", [False, True])
@pytest.mark.parametrize("kid, life, n, key_bytes", [("k" * 256, "L" * 64, 15, 250), ("a", "", 100, 32),
                                                    ("k" * 256, "", 3000, 1), ("b" * 40, "L" * 64, 1, 256)])
def test_the_fetch_size_check_is_an_upper_bound_of_the_real_fetch(kid, life, n, key_bytes, slots) -> None:
    """A fetch submit_load lets through is never one the producer refuses ``oversize``: a limit one
    byte under the encoded fetch (the longest id and life, slot numbers on one-sided planes) is
    refused at submit, naming max_message_bytes; the bound exceeds it by a few fixed bytes only."""
    from kvtier.shell.checks import check_fetch_size
    from kvtier.wire.codec import encode
    from kvtier.wire.messages import Fetch

    keys = tuple(dict.fromkeys((i.to_bytes(3, "big") * 86)[:key_bytes] for i in range(n)))
    for top in (5, 200, 60_000, 2**32 - 1):  # the largest slot sets msgpack's width for every one
        numbers = [top - i % (top + 1) for i in range(len(keys))]
        real = len(encode(Fetch(gen=2**62, kv_request_id=kid, round=2**62, keys=list(keys), life=life, low=2**62,
                                slots=numbers if slots else [], offered=True)))
        job_ = job(3, keys, numbers, RequestContext(req_id="r", kv_transfer_params=None))
        with pytest.raises(ValueError, match=r"job 3: a fetch of .* exceeds max_message_bytes"):
            check_fetch_size(job_, real - 1, kid, life, slots)
        check_fetch_size(job_, real + 40, kid, life, slots)  # the bound's slack is the fixed fields' only


def test_set_hash_seed_after_shutdown_raises_like_every_other_mutating_call(mgr) -> None:
    mgr.set_hash_seed("seed-1")  # open: taken
    mgr.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        mgr.set_hash_seed("seed-2")


def test_shutdown_from_two_threads_returns_in_each_once_every_job_has_its_result(make_manager) -> None:
    """A second thread's shutdown() while one runs returns when that one has ended (A12), not at
    once with a load still in flight: each caller may free the pool once its call returned."""
    from tests.manager.mgr_helpers import consumer_req, producer_req

    p = make_manager({"background_poll": True})
    c = make_manager({"background_poll": True})
    p.on_new_request(producer_req("p1", "kv-sd"))  # announced, never stored: the load stays in flight
    req = consumer_req("c1", "kv-sd", p.host, p.port)
    c.on_new_request(req)
    c.submit_load(job(1, (b"k0",), [0], req))
    seen: list[set[int]] = []

    def shut() -> None:
        c.shutdown(0.5)
        seen.append(set(c.jobs_in_flight()))

    threads = [threading.Thread(target=shut) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [set(), set()]
    assert [(r.job_id, r.success) for r in c.get_finished_jobs()] == [(1, False)]


class _WatchedTransport(InprocTransport):
    """Holds a caller-driven poll's wait until released, and notes any use of the sockets meanwhile."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.entered, self.release = threading.Event(), threading.Event()
        self.waiting = self.overlapped = False

    def wait(self, timeout_s: float) -> bool:
        self.waiting = True
        self.entered.set()
        self.release.wait(10)
        self.waiting = False
        return super().wait(0)

    def service(self, *a: Any, **kw: Any) -> Any:
        self.overlapped |= self.waiting
        return super().service(*a, **kw)


def test_a_call_from_another_thread_waits_for_a_caller_driven_poll_instead_of_sharing_its_sockets() -> None:
    """Outside the contract (one engine thread), yet it must not abort the process: libzmq's
    sockets are not thread-safe, so a caller-driven poll's wait holds the manager's lock and
    another thread's call runs after it (A12), never beside it."""
    t = _WatchedTransport(InprocNetwork(), "api:2")
    m = KvTierManager({}, BlockPool(8, 64, pin=False), transport=t)
    try:
        poller = threading.Thread(target=m.poll, args=(5.0,))
        poller.start()
        assert t.entered.wait(10)
        other = threading.Thread(target=m.get_finished_jobs)
        other.start()
        other.join(0.5)  # before A12 it ran a pass on the sockets here, beside the wait
        t.release.set()
        poller.join(10)
        other.join(10)
        assert not (poller.is_alive() or other.is_alive())
        assert not t.overlapped
    finally:
        t.release.set()
        m.shutdown()
