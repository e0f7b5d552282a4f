"""Issues 10 and 11 over two network namespaces (tests.support.netns): the producer process
listens on host a's veth address, the consumer process runs on host b; the link between them is
real TCP.  Every test but B42 runs on both data planes: zmq, and NIXL with UCX over TCP on the
veth (``UCX_TLS=tcp``, ``UCX_NET_DEVICES`` = each host's veth end, ``UCX_TCP_USER_TIMEOUT=2s``;
without ``UCX_TLS=tcp`` UCX would still find CMA, the two "hosts" being one machine).

- CURVE: the allowed consumer is served byte-exact; a stranger (no key, or a key nobody listed)
  cannot open a session, fetch, abort or otherwise destroy a parked id; another *allowed* peer
  cannot fetch or disturb an id whose producer request named its consumer.
- A partition mid-transfer fails the load with a reason within its bound while the link is still
  down (nothing waits for the producer); once healed a later load succeeds, and the cut-off
  producer's stalled transfer never reaches the slots the engine reused (on NIXL the consumer
  withdrew the session's window of its pool: docs/dataplane.md).
- A rate-limited link (tc tbf) makes a slow transfer that still completes byte-exact.
- B42 (slow): a producer restart whose reconnect SYNs are silently dropped is reconnected within
  a few seconds of the network healing (ZMQ_CONNECT_TIMEOUT), not after the kernel's backoff.

Every wait is bounded; nothing asserts on timing except B42's generous reconnect bound.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time

import msgspec
import pytest
import zmq

from kvtier.wire import PROTOCOL_VERSION
from tests.support.netns import TwoHosts, unavailable_reason
from tests.support.peer_process import PeerProcess, pattern_digest
from kvtier.transport import ZmqTransport
from kvtier.transport.curve import generate_keys

pytestmark = pytest.mark.timeout(180)

_WHY = unavailable_reason()
if _WHY is not None:
    pytest.skip(f"two-host tests need network namespaces: {_WHY}", allow_module_level=True)

PORT = 5710
DARK = PORT + 7  # an endpoint on host a that nothing answers once host a is black-holed
BB = 64 * 1024
TIMERS = {"heartbeat_interval_s": 0.3, "peer_timeout_s": 3.0, "handshake_timeout_s": 2.0, "connect_timeout_s": 1.0,
          "fetch_supply_timeout_s": 2.0, "load_timeout_s": 6.0}


@pytest.fixture(scope="module")
def hosts():
    # 32 mbit/s (4 MB/s): a 4 MiB load takes ~1 s, long enough to cut the link in its middle.
    with TwoHosts(rate="32mbit") as h:
        yield h


@pytest.fixture(scope="module")
def keys(tmp_path_factory, hosts):
    root = tmp_path_factory.mktemp("keys")
    generate_keys(root / "mine", "prefill-0", (hosts.addr_a,))
    generate_keys(root / "mine", "decode-0")
    generate_keys(root / "mine", "decode-1")
    generate_keys(root / "other", "mallory")
    allowed = root / "allowed"
    allowed.mkdir()
    for n in ("prefill-0", "decode-0", "decode-1"):
        shutil.copy(root / "mine" / f"{n}.key", allowed)
    return {"root": root, "allowed": str(allowed)}


def _curve(keys, name: str) -> dict:
    return {"auth": "curve", "auth_secret_key_file": str(keys["root"] / "mine" / f"{name}.key_secret"),
            "auth_allowed_keys_dir": keys["allowed"]}


def _ucx(dev: str) -> dict[str, str]:
    return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": dev, "UCX_TCP_USER_TIMEOUT": "2s"}


@pytest.fixture(scope="module")
def children(hosts):
    p = PeerProcess("kvt-prefill", netns=hosts.a, max_lifetime_s=300, env=_ucx(hosts.dev_a)).start()
    c = PeerProcess("kvt-decode", netns=hosts.b, max_lifetime_s=300, env=_ucx(hosts.dev_b)).start()
    try:
        p.wait_ready()
        c.wait_ready()
        yield p, c
    finally:
        p.close()
        c.close()


@pytest.fixture(scope="module", params=["zmq", "nixl"])
def procs(request, hosts, keys, children):
    """Both managers, on the data plane of this parameter (the same two processes for both)."""
    p, c = children
    plane = {"data_plane": request.param}
    p.start_manager({**TIMERS, **plane, **_curve(keys, "prefill-0"), "host": hosts.addr_a, "port": PORT},
                    num_blocks=256, block_bytes=BB)
    c.start_manager({**TIMERS, **plane, **_curve(keys, "decode-0"), "host": hosts.addr_b, "port": 0,
                     "allowed_peers": [f"{hosts.addr_a}:{PORT}", f"{hosts.addr_a}:{DARK}"]},
                    num_blocks=256, block_bytes=BB)
    try:
        yield p, c
    finally:
        c.stop_manager()
        p.stop_manager()


@pytest.fixture(scope="module")
def other_child(hosts):
    """A second consumer process on host b, whose key IS allowed in (principal ``decode-1``)."""
    c = PeerProcess("kvt-decode-1", netns=hosts.b, max_lifetime_s=300, env=_ucx(hosts.dev_b)).start()
    try:
        c.wait_ready()
        yield c
    finally:
        c.close()


@pytest.fixture
def other_consumer(hosts, keys, procs, other_child):
    """``decode-1``'s manager on the data plane of this run."""
    plane = {"data_plane": procs[1].plane()["name"]}
    other_child.start_manager({**TIMERS, **plane, **_curve(keys, "decode-1"), "host": hosts.addr_b, "port": 0,
                               "allowed_peers": [f"{hosts.addr_a}:{PORT}"]}, num_blocks=64, block_bytes=BB)
    try:
        yield other_child
    finally:
        other_child.stop_manager()


_job = iter(range(1, 10**6))


def _store(p: PeerProcess, kv: str, n: int, seed: int, consumer: str | None = None) -> list[str]:
    job = next(_job)
    slots = list(range(n))
    out = p.store(kv, job, [f"{kv}/{i}".encode() for i in range(n)], slots, seed=seed, consumer=consumer)
    assert out["digests"] == [pattern_digest(seed, i, BB) for i in range(n)]
    return out["digests"]


_results: dict[int, list[dict]] = {}  # every consumer result seen, by job id


def _wait(c: PeerProcess, job: int, timeout_s: float) -> list[dict]:
    """Results of ``job`` (kept with every other result ``c`` reported meanwhile)."""
    if job not in _results:
        for k, v in c.wait_results([job], timeout_s=timeout_s).items():
            _results.setdefault(k, []).extend(v)
    return _results.get(job, [])


def _load(c: PeerProcess, hosts: TwoHosts, kv: str, n: int, *, first_slot: int = 0, timeout_s: float = 20.0):
    job = next(_job)
    slots = list(range(first_slot, first_slot + n))
    now = c.load(kv, job, [f"{kv}/{i}".encode() for i in range(n)], slots, host=hosts.addr_a, port=PORT, sentinel=0xAB)
    if now:  # answered inside the call (e.g. instance_down on a fresh dial)
        _results.setdefault(job, []).extend(now)
    [r] = _wait(c, job, timeout_s)
    return r, slots


def test_allowed_consumer_is_served_byte_exact(hosts, procs) -> None:
    p, c = procs
    want = _store(p, "kv-ok", 16, seed=1)
    r, slots = _load(c, hosts, "kv-ok", 16)
    assert r["success"], r
    assert c.digests(slots) == want


def _stranger(hosts: TwoHosts, secret_file, server_key, kv: str) -> list:
    """From host b: hello, fetch, abort_fetch and fetch-with-made-up-keys for ``kv``; returns every
    reply that came back within a second."""

    def body():
        ctx = zmq.Context()
        try:
            d = ctx.socket(zmq.DEALER)
            d.linger = 0
            if secret_file is not None:
                pub, sec = zmq.auth.load_certificate(secret_file)
                d.curve_publickey, d.curve_secretkey, d.curve_serverkey = pub, sec, server_key
            d.connect(f"tcp://{hosts.addr_a}:{PORT}")
            enc = msgspec.msgpack.encode
            d.send(enc({"type": "hello", "gen": 7, "version": PROTOCOL_VERSION, "instance": "mallory", "block_bytes": BB,
                        "layout": "raw", "hash_seed": ""}))
            d.send(enc({"type": "fetch", "gen": 7, "kv_request_id": kv, "round": 0, "keys": []}))
            d.send(enc({"type": "abort_fetch", "gen": 7, "kv_request_id": kv, "round": 0}))
            d.send(enc({"type": "fetch", "gen": 7, "kv_request_id": kv, "round": 1, "keys": [b"made-up"]}))
            replies, end = [], time.monotonic() + 1.0
            while time.monotonic() < end:
                if d.poll(50):
                    replies.append(d.recv_multipart())
            return replies
        finally:
            ctx.destroy(linger=0)

    return hosts.run(hosts.b, body)


def test_stranger_cannot_fetch_or_destroy_a_parked_id(hosts, keys, procs) -> None:
    p, c = procs
    from kvtier.transport.curve import load_identity

    server_key = load_identity(keys["root"] / "mine" / "prefill-0.key_secret").public
    want = _store(p, "kv-target", 8, seed=2)
    assert _stranger(hosts, None, None, "kv-target") == []  # no key: not even a ZMTP session
    mallory = keys["root"] / "other" / "mallory.key_secret"
    assert _stranger(hosts, mallory, server_key, "kv-target") == []  # unlisted key: ZAP says no
    assert p.state("kv-target") == "parked"
    r, slots = _load(c, hosts, "kv-target", 8, first_slot=32)
    assert r["success"], r  # the real consumer is still served, byte-exact
    assert c.digests(slots) == want


def test_an_allowed_peer_cannot_touch_an_id_named_for_another_consumer(hosts, procs, other_consumer) -> None:
    """The producer request names ``decode-0``; ``decode-1`` is authenticated and
    allowed in, knows the id, and fetches it: refused ``not_authorised``, the id untouched (still
    parked, its timers unchanged), and the named consumer is served byte-exact afterwards."""
    p, c = procs
    want = _store(p, "kv-named", 8, seed=6, consumer="decode-0")
    r, _ = _load(other_consumer, hosts, "kv-named", 8)
    assert (r["success"], r["reason"]) == (False, "not_authorised"), r
    other_consumer.finish("c-kv-named")  # its abort (of a round that fetched) changes nothing either
    assert p.state("kv-named") == "parked"
    r, slots = _load(c, hosts, "kv-named", 8, first_slot=200)
    assert r["success"], r
    assert c.digests(slots) == want


def test_partition_mid_transfer_is_answered_within_the_bound_and_the_slots_stay_safe(hosts, procs) -> None:
    """The link goes down mid-transfer.  While it is still down — no proof can come from the
    producer — the load gets exactly one result, a failure that says why, within
    ``load_timeout_s + abort_ack_timeout_s + revoke_timeout_s`` (the session is lost before: by
    ``peer_timeout_s``).  On NIXL that is because the consumer withdrew the session's window of
    its pool (decision N14).  The engine refills the slots; once the link is back, whatever the
    producer's stalled transfer still does never reaches them, and a new load succeeds."""
    p, c = procs
    n = 64  # 4 MiB: ~1 s on this link
    _store(p, "kv-cut", n, seed=3)
    job = next(_job)
    slots = list(range(64, 64 + n))
    assert c.load("kv-cut", job, [f"kv-cut/{i}".encode() for i in range(n)], slots,
                  host=hosts.addr_a, port=PORT, sentinel=0xAB) == []
    time.sleep(0.3)
    hosts.link_down()
    bound_s = TIMERS["load_timeout_s"] + 5.0 + 1.0  # abort_ack_timeout_s, revoke_timeout_s: defaults
    try:
        t0 = time.monotonic()
        got = _wait(c, job, bound_s + 3.0)
        took = time.monotonic() - t0
        assert len(got) == 1 and not got[0]["success"] and got[0]["reason"], got
        assert took <= bound_s + 1.0, f"answered after {took:.1f} s (bound {bound_s} s)"
        assert c.stats()["kvtier_quarantined_blocks{role=consumer}"] == 0
        c.fill(slots, 0x3C)  # the engine reuses the slots at once
    finally:
        hosts.link_up()
    want = _store(p, "kv-after", 8, seed=4)
    deadline = time.monotonic() + 30.0
    while True:  # the first tries may meet the dead session or its suspect instance; a later one succeeds
        r, after = _load(c, hosts, "kv-after", 8, first_slot=160)
        if r["success"] or time.monotonic() > deadline:
            break
        c.finish("c-kv-after")
        time.sleep(0.2)
    assert r["success"], r
    assert c.digests(after) == want
    pump = time.monotonic() + 2.0  # let anything the producer still had in flight land (or fail)
    while time.monotonic() < pump:
        time.sleep(0.1)
    assert c.digests(slots) == [hashlib.sha256(bytes([0x3C]) * BB).hexdigest()] * n  # the refill, untouched
    assert len(_wait(c, job, 0.1)) == 1  # still exactly one result


def test_slow_link_transfer_completes_byte_exact(hosts, procs) -> None:
    p, c = procs
    n = 96  # 6 MiB at 4 MB/s: one block_data message of ~1.5 s
    want = _store(p, "kv-slow", n, seed=5)
    r, slots = _load(c, hosts, "kv-slow", n, first_slot=128, timeout_s=40.0)
    assert r["success"], r
    assert c.digests(slots) == want


@contextlib.contextmanager
def _own_pair(hosts, name: str, timers: dict, port: int, num_blocks: int, block_bytes: int = BB):
    """A producer on host a (``port``) and a consumer on host b, each in a process of its own,
    managers started with ``timers`` over pools of ``num_blocks`` x ``block_bytes``; both closed
    on the way out."""
    p = PeerProcess(f"kvt-prefill-{name}", netns=hosts.a, max_lifetime_s=120, env=_ucx(hosts.dev_a)).start()
    c = PeerProcess(f"kvt-decode-{name}", netns=hosts.b, max_lifetime_s=120, env=_ucx(hosts.dev_b)).start()
    try:
        p.wait_ready()
        c.wait_ready()
        p.start_manager({**timers, "host": hosts.addr_a, "port": port}, num_blocks=num_blocks,
                        block_bytes=block_bytes)
        c.start_manager({**timers, "host": hosts.addr_b, "port": 0, "allowed_peers": [f"{hosts.addr_a}:{port}"]},
                        num_blocks=num_blocks, block_bytes=block_bytes)
        yield p, c
    finally:
        c.close()
        p.close()


def test_a_session_lives_while_one_message_outlasts_peer_timeout(hosts) -> None:
    """One block_data message of 8 MiB takes ~2 s on this link, longer than peer_timeout_s (1 s)
    plus a heartbeat: the producer's pongs wait behind it, but the consumer hears the bytes
    arriving (decision T22), so the load completes byte-exact instead of failing peer_timeout."""
    slow = {**TIMERS, "peer_timeout_s": 1.0, "heartbeat_interval_s": 0.2, "load_timeout_s": 30.0,
            "transfer_timeout_s": 30.0, "data_plane": "zmq"}
    port = PORT + 3
    with _own_pair(hosts, "slow", slow, port, 128) as (p, c):
        n, keys = 128, [b"kv-long/%d" % i for i in range(128)]
        want = p.store("kv-long", 1, keys, list(range(n)), seed=9)["digests"]
        now = c.load("kv-long", 2, keys, list(range(n)), host=hosts.addr_a, port=port, sentinel=0xAB)
        got = now or c.wait_results([2], timeout_s=40.0).get(2, [])
        assert [(r["success"], r["reason"]) for r in got] == [(True, None)], got
        assert c.digests(list(range(n))) == want


@pytest.mark.parametrize("plane", ["zmq", "nixl"])
def test_cancelling_one_load_on_a_slow_link_leaves_the_others_to_succeed(hosts, plane: str) -> None:
    """Decision L19, real processes, 32 Mbit/s: four 4 MiB loads from one producer; the engine
    finishes the first 0.3 s in.  The producer answers the abort at once, but its answer waits
    behind the blocks already on the connection (zmq) or for the WRITEs it had posted to drain
    (nixl) — longer than abort_ack_timeout_s (1 s).  The others must succeed byte-exact (the
    consumer used to end the session and fail them ``abort_unacknowledged``); the cancelled load
    gets one result within its bound, and its slots are never written after it."""
    timers = {**TIMERS, "load_timeout_s": 30.0, "transfer_timeout_s": 30.0, "abort_ack_timeout_s": 1.0,
              "peer_timeout_s": 5.0, "data_plane": plane}
    port = PORT + 4
    with _own_pair(hosts, "l19", timers, port, 320) as (p, c):
        n, want, slots = 64, {}, {}
        for i in range(4):
            keys = [b"kv-l19-%d/%d" % (i, b) for b in range(n)]
            want[i] = p.store(f"kv-l19-{i}", 100 + i, keys, list(range(i * n, (i + 1) * n)), seed=20 + i)["digests"]
        for i in range(4):
            slots[i] = list(range(i * n, (i + 1) * n))
            keys = [b"kv-l19-%d/%d" % (i, b) for b in range(n)]
            assert not c.load(f"kv-l19-{i}", 200 + i, keys, slots[i], host=hosts.addr_a, port=port, sentinel=0xAB)
        time.sleep(0.3)
        c.finish("c-kv-l19-0")
        got = c.wait_results([200, 201, 202, 203], timeout_s=45.0)
        assert [(r["success"], r["reason"]) for r in got[200]] == [(False, "cancelled")], got
        for i in (1, 2, 3):
            assert [(r["success"], r["reason"]) for r in got[200 + i]] == [(True, None)], got
            assert c.digests(slots[i]) == want[i]
        c.fill(slots[0], 0x3C)  # the cancelled load's slots, after its result: nothing may land there
        c.poll_for(1.0)
        assert c.digests(slots[0]) == [hashlib.sha256(bytes([0x3C]) * BB).hexdigest()] * n


def _cancelled_then_another(hosts, name: str, timers: dict, port: int, later_at_s: float,
                            cancel_at_s: float | None = 0.3) -> tuple[dict, bool]:
    """A 24 MiB load (384 blocks of 64 KiB) the engine finishes ``cancel_at_s`` in (None: never),
    and a 1 MiB one submitted ``later_at_s`` after it, from one producer: both loads' results (jobs
    0 and 1), and whether the later one's slots hold the producer's blocks."""
    big, small = 384, 16
    with _own_pair(hosts, name, timers, port, big + small) as (p, c):
        keys = {i: [b"kv-%s-%d/%d" % (name.encode(), i, b) for b in range(n)] for i, n in ((0, big), (1, small))}
        slots = {0: list(range(big)), 1: list(range(big, big + small))}
        want = {i: p.store(f"kv-{name}-{i}", 100 + i, keys[i], slots[i], seed=30 + i)["digests"] for i in (0, 1)}
        t0 = time.monotonic()
        assert not c.load(f"kv-{name}-0", 300, keys[0], slots[0], host=hosts.addr_a, port=port, sentinel=0xAB)
        if cancel_at_s is not None:
            time.sleep(cancel_at_s)
            c.finish(f"c-kv-{name}-0")
        time.sleep(max(0.0, t0 + later_at_s - time.monotonic()))
        assert not c.load(f"kv-{name}-1", 301, keys[1], slots[1], host=hosts.addr_a, port=port, sentinel=0xAB)
        got = c.wait_results([300, 301], timeout_s=30.0)
        return {0: got[300], 1: got[301]}, c.digests(slots[1]) == want[1]


def test_a_cancelled_loads_data_outlasting_its_deadline_ends_it_alone(hosts) -> None:
    """Decision L20, real processes, zmq, 32 Mbit/s: a 24 MiB load is cancelled 0.3 s in, but the
    batch already queued on the connection (8 MiB: one, T23) takes ~2 s to drain, past its own
    ``load_timeout_s`` (1.5 s) and its final give-up (1.8 s, ``abort_ack_timeout_s`` 0.5); a 1 MiB
    load submitted at 1.8 s arrives behind it.  At that give-up the producer is still sending: only
    that load ends (``cancelled``), the session stays and the later load succeeds byte-exact (it
    used to fail with the ended session)."""
    timers = {**TIMERS, "load_timeout_s": 1.5, "transfer_timeout_s": 30.0, "abort_ack_timeout_s": 0.5,
              "peer_timeout_s": 5.0, "data_plane": "zmq", "handshake_timeout_s": 1.0, "fetch_supply_timeout_s": 1.0}
    got, exact = _cancelled_then_another(hosts, "l20", timers, PORT + 5, later_at_s=1.8)
    assert [(r["success"], r["reason"]) for r in got[0]] == [(False, "cancelled")], got
    assert [(r["success"], r["reason"]) for r in got[1]] == [(True, None)] and exact, got


@pytest.mark.parametrize("plane", ["zmq", "nixl"])
def test_a_cancelled_load_commits_no_more_than_the_link_drains_before_its_answer(hosts, plane: str) -> None:
    """Decision T23, real processes, 32 Mbit/s: a 24 MiB load, the session's first, is cancelled
    0.3 s in; a 1 MiB load follows at 1 s.  Until the link's rate is known a transfer commits one
    batch (zmq: 8 MiB) or piece (nixl: 1 MiB), then what the link drains in half
    ``abort_ack_timeout_s`` (1 s): the cancel leaves at most ~2 s of data ahead of the abort's
    answer and the later load, not the whole 24 MiB (~6 s: zmq failed the later load
    ``load_timeout``; nixl ended the session past the cancelled load's deadline and failed it
    ``abort_unacknowledged``, a reason that was not its own).  Both get their own result:
    ``cancelled``, then byte-exact."""
    timers = {**TIMERS, "load_timeout_s": 5.0, "transfer_timeout_s": 30.0, "abort_ack_timeout_s": 1.0,
              "peer_timeout_s": 5.0, "data_plane": plane}
    got, exact = _cancelled_then_another(hosts, "t23", timers, PORT + 8, later_at_s=1.0)
    assert [(r["success"], r["reason"]) for r in got[0]] == [(False, "cancelled")], got
    assert [(r["success"], r["reason"]) for r in got[1]] == [(True, None)] and exact, got


def test_a_timed_out_nixl_load_leaves_only_what_the_link_drains_before_its_answer(hosts) -> None:
    """Decision T23, real processes, nixl, 32 Mbit/s: a 24 MiB load times out at 3 s (it needs ~6 s)
    and a 1 MiB load is submitted at 3.8 s.  With one whole 8 MiB batch in flight (~2 s) the
    producer's answer to the timed-out load's abort came past ``abort_ack_timeout_s`` (1 s) after its
    deadline, so the session ended and the later load failed ``abort_unacknowledged``; a batch larger
    than the window now goes in pieces, so what is in flight drains in half that time.  The timed-out
    load fails ``load_timeout``, the later one succeeds byte-exact."""
    timers = {**TIMERS, "load_timeout_s": 3.0, "transfer_timeout_s": 30.0, "abort_ack_timeout_s": 1.0,
              "peer_timeout_s": 5.0, "data_plane": "nixl"}
    got, exact = _cancelled_then_another(hosts, "tmo", timers, PORT + 9, later_at_s=3.8, cancel_at_s=None)
    assert [(r["success"], r["reason"]) for r in got[0]] == [(False, "load_timeout")], got
    assert [(r["success"], r["reason"]) for r in got[1]] == [(True, None)] and exact, got


def test_a_nixl_handshake_with_big_blocks_fits_its_timeout_on_a_slow_link(hosts) -> None:
    """Decision N15 (warm-up READs of ``WARM_BYTES``): 4 MiB blocks at 32 Mbit/s.  The producer's
    three warm-up READs inside the handshake used to read a whole block each (3 s here, past
    ``handshake_timeout_s`` 2 s: every load failed ``handshake_timeout``); a 2-block load must
    now succeed byte-exact."""
    big = 4 << 20
    timers = {**TIMERS, "load_timeout_s": 8.0, "data_plane": "nixl"}
    port = PORT + 6
    with _own_pair(hosts, "warm", timers, port, 4, block_bytes=big) as (p, c):
        keys = [b"kv-warm/%d" % i for i in range(2)]
        want = p.store("kv-warm", 1, keys, [0, 1], seed=41)["digests"]
        now = c.load("kv-warm", 2, keys, [2, 3], host=hosts.addr_a, port=port, sentinel=0xAB)
        got = now or c.wait_results([2], timeout_s=20.0).get(2, [])
        assert [(r["success"], r["reason"]) for r in got] == [(True, None)], got
        assert c.digests([2, 3]) == want


def test_a_dial_into_a_black_hole_fails_after_connect_timeout(hosts, procs) -> None:
    """Host a silently drops everything (SYNs too): a load to it fails ``connect_timeout`` after
    ``connect_timeout_s`` (1 s here), not after ``handshake_timeout_s``, exactly once."""
    _, c = procs
    job = next(_job)
    hosts.blackhole_a(True)
    try:
        t0 = time.monotonic()
        now = c.load("kv-dark", job, [b"k"], [250], host=hosts.addr_a, port=DARK)
        got = now or _wait(c, job, TIMERS["connect_timeout_s"] + 3.0)
        took = time.monotonic() - t0
    finally:
        hosts.blackhole_a(False)
    assert [(r["success"], r["reason"]) for r in got] == [(False, "connect_timeout")], got
    assert took <= TIMERS["connect_timeout_s"] + 1.5, took  # a failure bound: handshake_timeout_s would be later
    c.finish("c-kv-dark")


@pytest.mark.slow
def test_b42_reconnect_after_dropped_syns_is_prompt() -> None:
    fast = dict(heartbeat_ivl_s=0.5, heartbeat_timeout_s=2.0, heartbeat_ttl_s=2.0,
                reconnect_ivl_s=0.1, reconnect_ivl_max_s=1.0, connect_timeout_s=1.0)
    with TwoHosts() as h:
        # Classic Linux SYN backoff (1, 3, 7, 15, 31 s) on host b; kernels >= 6.5 may start with
        # a few linear 1 s retries, which would hide the missing connect timeout.
        h.exec(h.b, ["sysctl", "-qw", "net.ipv4.tcp_syn_linear_timeouts=0"])
        prod = h.run(h.a, lambda: ZmqTransport(h.addr_a, PORT, **fast))
        cons = h.run(h.b, lambda: ZmqTransport(h.addr_b, 0, **fast))
        try:
            peer = cons.connect(f"{h.addr_a}:{PORT}")
            cons.send(peer, [b"before"])
            assert _recv(prod, 5.0) == [b"before"]
            prod.close()  # the producer restarts...
            h.blackhole_a(True)  # ...and while it is away, everything to it vanishes (SYNs too)
            prod = h.run(h.a, lambda: ZmqTransport(h.addr_a, PORT, **fast))
            cons.send(peer, [b"after"])
            end = time.monotonic() + 16.0  # long enough for the kernel's SYN backoff to reach 16 s
            while time.monotonic() < end:
                cons.wait(0.1)
                cons.recv()
            h.blackhole_a(False)
            healed = time.monotonic()
            assert _recv(prod, 10.0) == [b"after"]  # without CONNECT_TIMEOUT: ~15 s more
            assert time.monotonic() - healed < 10.0
        finally:
            prod.close()
            cons.close()


def _recv(t: ZmqTransport, timeout_s: float) -> list[bytes] | None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        t.wait(0.05)
        got = t.recv()
        if got:
            return [bytes(f) for f in got[0][1]]
    return None
