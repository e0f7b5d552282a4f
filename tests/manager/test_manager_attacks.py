"""The attacks of docs/security.md that need no second host, each against a real manager on 127.0.0.1.

(The CURVE, partition and slow-link attacks run over two namespaces in tests/security.)
"""

from __future__ import annotations

import time

import socket

import msgspec
import pytest
import zmq

from kvtier.wire import PROTOCOL_VERSION
from kvtier.transport import CloseReason, PeerClosed
from mgr_helpers import Jobs, consumer_req, digests, fill_pattern, job, metric, metric_sum, producer_req, pump_until

pytestmark = pytest.mark.timeout(60)

pack = msgspec.msgpack.encode
BB = 4096
HB = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 5.0}


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


def _dealer(zctx, p, *, reconnect: bool = True):
    d = zctx.socket(zmq.DEALER)
    d.linger = 0
    if not reconnect:
        d.reconnect_ivl = -1  # once cut, stays cut (libzmq redials every 100 ms by default)
    d.connect(f"tcp://{p.host}:{p.port}")
    return d


def _replies(d, p, n, timeout_s=5.0) -> list:
    out: list = []

    def pred():
        while d.poll(0):
            out.append(d.recv_multipart())
        return len(out) >= n

    pump_until(pred, managers=[p], timeout_s=timeout_s)
    return out


def _served(make_manager, p, kv: str) -> None:
    """A legitimate consumer still gets byte-exact blocks from ``p``."""
    c = make_manager(HB, block_bytes=BB)
    jobs, pjobs = Jobs(c), Jobs(p)
    preq = producer_req(f"p-{kv}", kv)
    p.on_new_request(preq)
    want = fill_pattern(p.pool, [0, 1], seed=9)
    p.submit_store(job(1, [b"a", b"b"], [0, 1], preq))
    creq = consumer_req(f"c-{kv}", kv, p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, [b"a", b"b"], [3, 4], creq))
    assert pump_until(lambda: jobs.has(2), managers=[p], jobs=[jobs, pjobs])
    assert jobs.one(2).success and digests(c.pool, [3, 4]) == want


def test_wrong_hello_is_refused_without_our_hash_seed(make_manager, zctx) -> None:
    p = make_manager({**HB, "hash_seed": "s3cret-seed-value"}, block_bytes=BB)
    d = _dealer(zctx, p)
    d.send(pack({"type": "hello", "gen": 1, "version": PROTOCOL_VERSION, "instance": "x", "block_bytes": BB,
                 "layout": "raw", "hash_seed": "guess"}))
    [reply] = _replies(d, p, 1)
    assert b"s3cret" not in b"".join(reply)
    msg = msgspec.msgpack.decode(reply[0])
    assert (msg["type"], msg["reason"], msg["field"], msg["ours"]) == ("hello_reject", "handshake_mismatch", "hash_seed", "")


def test_idle_connections_are_cut_and_a_consumer_is_served(make_manager, zctx) -> None:
    p = make_manager({**HB, "handshake_timeout_s": 0.5}, block_bytes=BB)
    # 150 raw TCP connections that never speak ZMTP and 50 zmq DEALERs that complete the ZMTP
    # handshake but never send a message: our idle timer cuts them all (libzmq's own handshake cut
    # of the raw ones is a later backstop, decision T14).
    socks = [socket.create_connection((p.host, p.port)) for _ in range(150)]
    # (they do not redial: 50 redialling every 100 ms are never all cut at once on a loaded host,
    # where their idle timers drift apart — 1,521 cuts in 20 s and 36 still open, once)
    silent = [_dealer(zctx, p, reconnect=False) for _ in range(50)]
    mons = [d.get_monitor_socket(zmq.EVENT_DISCONNECTED) for d in silent]
    cut: set[int] = set()

    def every_dealer_cut() -> bool:  # the producer runs its idle cut only while it is polled
        cut.update(i for i, m in enumerate(mons) if i not in cut and m.poll(0))
        return len(cut) == len(mons)

    try:
        assert pump_until(lambda: every_dealer_cut() and p.transport.idle_connections() == 0,
                          managers=[p], timeout_s=20.0), (len(cut), p.transport.idle_connections())
        assert p.transport.idle_dropped >= 50
        for s in socks:  # every one was closed by the producer: EOF or reset (a hang times out)
            s.settimeout(5.0)
            try:
                while s.recv(1 << 16):  # zmq's greeting bytes may come first
                    pass
            except ConnectionResetError:
                pass
        _served(make_manager, p, "kv-idle")
    finally:
        for s in socks:
            s.close()
        for m in mons:
            m.close(linger=0)


def test_frame_over_the_socket_cap_is_never_received_whole(make_manager, zctx) -> None:
    p = make_manager({**HB, "max_message_bytes": 4096}, block_bytes=BB)
    d = _dealer(zctx, p)
    mon = d.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    d.send(pack({"type": "ping", "gen": 1, "t": 0.0}))  # a first message: the connection is up
    _replies(d, p, 1)
    d.send(b"\x81" + b"x" * (16 << 20))  # 16 MiB header: libzmq cuts us before it is read
    from zmq.utils.monitor import recv_monitor_message

    assert pump_until(lambda: mon.poll(0) and recv_monitor_message(mon)["event"] == zmq.EVENT_DISCONNECTED,
                      managers=[p], timeout_s=5.0)
    assert metric_sum(p, "kvtier_wire_errors_total") == 0  # never decoded, never counted
    assert metric(p, "kvtier_internal_errors_total") == 0
    mon.close(linger=0)
    _served(make_manager, p, "kv-cap")


def test_peer_invented_error_reasons_mint_no_label_sets(make_manager, zctx) -> None:
    p = make_manager(HB, block_bytes=BB)
    d = _dealer(zctx, p)
    for i in range(500):
        d.send(pack({"type": "error", "gen": 0, "reason": f"made-up-{i}", "detail": "x", "kv_request_id": ""}))
    d.send(pack({"type": "error", "gen": 0, "reason": "malformed", "detail": "x", "kv_request_id": ""}))
    assert pump_until(lambda: metric_sum(p, "kvtier_wire_errors_total") == 501, managers=[p])
    labels = {k for k in p.stats() if k.startswith("kvtier_wire_errors_total")}
    assert labels == {"kvtier_wire_errors_total{reason=peer_reported_other}",
                      "kvtier_wire_errors_total{reason=peer_reported_malformed}"}
    assert metric(p, "kvtier_wire_errors_total", reason="peer_reported_other") == 500


def test_dropping_a_peer_reports_it(make_manager, zctx) -> None:
    p = make_manager(HB, block_bytes=BB)
    d = _dealer(zctx, p)
    d.send(pack({"type": "ping", "gen": 1, "t": 0.0}))
    _replies(d, p, 1)
    [peer] = [k for k in p.transport._conns.rid_fd]
    in_peer = "in:" + peer.hex()
    assert p.transport.peer_info(in_peer).address.startswith("127.0.0.1:")
    assert p.transport.drop_peer(in_peer)
    got: list = []
    deadline = time.monotonic() + 5.0
    while not got and time.monotonic() < deadline:  # the transport alone: the manager would consume it
        p.transport.wait(0.05)
        got.extend(p.transport.events())
    assert got == [PeerClosed(in_peer, CloseReason.DROPPED)]


_VICTIM = """
import sys, time
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
m = KvTierManager({"host": "127.0.0.1", "port": 0, "heartbeat_interval_s": 0.05, "peer_timeout_s": 30.0},
                  BlockPool(4, 4096, pin=False))
print(m.port, flush=True)
sys.stdin.readline()  # the attacker flooded us (we read nothing: libzmq stopped reading it) and reset
time.sleep(0.5)  # ten heartbeat intervals while that connection is stopped and reset
m.poll(0.05)
m.shutdown(0.5)
print("alive", flush=True)
"""


def _zmtp_flood_then_reset(port: int) -> None:
    """Speak ZMTP 3.0 (NULL, as a DEALER) by hand: greet, flood small messages without reading a
    byte, then close with SO_LINGER 0 — a TCP reset, as a crashed peer's kernel sends."""
    s = socket.create_connection(("127.0.0.1", port))
    try:
        # the greeting and READY exactly as libzmq 4.3's own DEALER sends them (ZMTP 3.1, NULL)
        s.sendall(b"\xff" + b"\x00" * 7 + b"\x01\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32)
        ready = (b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
                 + b"\x08Identity" + (0).to_bytes(4, "big"))
        s.sendall(b"\x04" + bytes([len(ready)]) + ready)
        got = b""
        while len(got) < 66 or len(got) < 66 + got[65]:  # its greeting and READY: the handshake is over
            chunk = s.recv(4096)
            assert chunk, "the manager closed the connection during the handshake"
            got += chunk
        s.setblocking(False)
        frame, sent, end = b"\x00\x08junk....", 0, time.monotonic() + 5.0
        while sent < 200_000 and time.monotonic() < end:  # far past the manager's rcvhwm of 1,000
            try:
                s.send(frame * 512)
                sent += 512
            except BlockingIOError:
                time.sleep(0.001)  # the victim's libzmq stopped reading: its pipe is full
                if sent >= 20_000:
                    break
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    finally:
        s.close()


def test_a_peer_that_floods_and_resets_while_the_loop_does_not_read_never_aborts_the_process() -> None:
    """Decision T18: libzmq 4.3.5 aborts the process (``Assertion failed: !_io_error``) when its
    ZMTP heartbeat timer fires on a connection whose input it stopped (the receive pipe full) and
    that then failed (a reset) — a flooding peer that crashes, or a producer killed mid-transfer
    while its consumer was busy.  The manager leaves ZMTP heartbeats off (its own pings carry
    liveness), so the process lives and goes on."""
    import subprocess
    import sys

    victim = subprocess.Popen([sys.executable, "-c", _VICTIM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        port = int(victim.stdout.readline())
        _zmtp_flood_then_reset(port)
        out, err = victim.communicate("go\n", timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert "Assertion failed" not in err, err
    assert victim.returncode == 0 and out.strip() == "alive", (victim.returncode, out, err[-2000:])


@pytest.mark.parametrize("threaded", [False, True], ids=["caller-driven", "io-thread"])
def test_a_flood_of_costly_messages_never_holds_another_peers_load(make_manager, zctx, threaded) -> None:
    """Decision C36: one peer floods fetches that are legal in size but slow to decode (10,000 keys,
    refused only once decoded: the last repeats the first).  A pass reads headers up to
    ``READ_HEADER_BYTES`` per service call and decodes for at most ``RECV_TIME_S``, so the ROUTER's
    fair queue brings the other peer's messages in within a few passes: its load succeeds with the
    parked bytes well within a 2 s ``load_timeout_s`` (a pass used to read up to 8,192 messages,
    seconds of decoding, before the core saw any of them).  On the I/O thread, what a pass read and
    left undecoded makes the next pass start at once (the sockets may be empty by then)."""
    import threading

    p = make_manager({**HB, "background_poll": threaded}, block_bytes=BB)
    keys = [i.to_bytes(4, "big") for i in range(10_000)] + [b"\x00\x00\x00\x00"]
    heavy = pack({"type": "fetch", "gen": 1, "kv_request_id": "heavy", "round": 0, "keys": keys})
    stop = threading.Event()

    def flood() -> None:
        d = _dealer(zctx, p)
        try:
            while not stop.is_set():
                try:
                    d.send(heavy, zmq.NOBLOCK)
                except zmq.Again:
                    time.sleep(0.0005)
                while d.poll(0):
                    d.recv_multipart()
        finally:
            d.close(linger=0)

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        pump_until(lambda: metric_sum(p, "kvtier_wire_errors_total") >= 20, managers=[p], timeout_s=10.0)
        assert metric_sum(p, "kvtier_wire_errors_total") >= 20  # the flood reached the producer's passes
        c = make_manager({**HB, "load_timeout_s": 2.0, "fetch_supply_timeout_s": 1.0, "handshake_timeout_s": 1.0,
                          "abort_ack_timeout_s": 0.5}, block_bytes=BB)
        jobs, pjobs = Jobs(c), Jobs(p)
        preq = producer_req("p-kv-flood", "kv-flood")
        p.on_new_request(preq)
        want = fill_pattern(p.pool, [0, 1], seed=9)
        p.submit_store(job(1, [b"a", b"b"], [0, 1], preq))
        creq = consumer_req("c-kv-flood", "kv-flood", p.host, p.port)
        c.on_new_request(creq)
        c.submit_load(job(2, [b"a", b"b"], [3, 4], creq))
        assert pump_until(lambda: jobs.has(2), managers=[p, c], jobs=[jobs, pjobs], timeout_s=20.0)
        r = jobs.one(2)
        assert (r.success, r.reason) == (True, None) and digests(c.pool, [3, 4]) == want, r
    finally:
        stop.set()
        flooder.join(5.0)


_CHEAP_FLOOD = """
import sys, time, zmq
c = zmq.Context(); d = c.socket(zmq.DEALER); d.linger = 0; d.sndhwm = 100_000; d.connect(sys.argv[1])
junk, end = b"\\x81\\xa4type\\xa4ping", time.monotonic() + float(sys.argv[2])  # not a valid ping: refused cheaply
while time.monotonic() < end:  # as fast as it can, its own queue bounded (~100,000 messages)
    for _ in range(100):
        try:
            d.send(junk, zmq.NOBLOCK)
        except zmq.Again:
            break
    while d.poll(0):
        d.recv_multipart()
"""


def test_a_flood_that_never_lets_the_queue_empty_holds_deadlines_for_at_most_hold_max_s(make_manager) -> None:
    """Decision C37: deadlines fire only up to when the inbound queue was last seen empty (I3), so
    a peer sending faster than the producer reads used to hold every deadline — a reap, and the
    store job's result with it — for as long as it kept sending.  Now they wait at most
    ``HOLD_MAX_S`` (1 s) of passes that never see the queue empty: a 0.5 s reap lands within a
    few seconds of a 12 s flood, not after it."""
    import subprocess
    import sys

    p = make_manager({**HB, "unbound_store_timeout_s": 0.5}, block_bytes=BB)
    jobs = Jobs(p)
    flooder = subprocess.Popen([sys.executable, "-c", _CHEAP_FLOOD, f"tcp://{p.host}:{p.port}", "12"])
    try:
        assert pump_until(lambda: metric_sum(p, "kvtier_wire_errors_total") > 0, managers=[p], timeout_s=10.0)
        preq = producer_req("p-kv-held", "kv-held")
        p.on_new_request(preq)
        p.submit_store(job(1, [b"a"], [0], preq))
        p.on_request_finished(preq)
        t0 = time.monotonic()
        assert pump_until(lambda: jobs.has(1), managers=[p], jobs=[jobs], timeout_s=20.0)
        took = time.monotonic() - t0
        assert flooder.poll() is None, "no result while the flood ran: the reap waited for it to end"
        r = jobs.one(1)
        assert (r.success, r.reason) == (False, "reaped"), r
        assert took < 6.0, took  # 0.5 s reap + 1 s hold, on a loaded host; the flood runs 12 s
    finally:
        flooder.kill()
        flooder.wait()
