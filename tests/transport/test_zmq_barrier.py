"""ZmqTransport.barrier over real sockets on 127.0.0.1 (decision T17): once it returns True, what
the kernel held for our connections when it began is in the sockets' queues.  Nothing asserts on
timing; the time limits only stop a hung test."""

from __future__ import annotations

import time

import pytest

from kvtier.transport import Transport, ZmqTransport
from test_zmq_transport import make  # noqa: F401 - the fixture: every transport made is closed

pytestmark = pytest.mark.timeout(60)


def _connected(make, **kw) -> tuple[ZmqTransport, ZmqTransport, str]:
    """A producer (listening) and a consumer that dialled it; the producer has read one message,
    so it knows the consumer's peer id."""
    prod, cons = make(**kw), make(**kw)
    peer = cons.connect(prod.address)
    cons.send(peer, [b"hello"])
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        prod.wait(0.05)
        got = prod.recv()
        if got:
            return prod, cons, got[0][0]
    raise AssertionError("the producer never heard the consumer")


def test_what_reached_the_kernel_before_the_barrier_is_read_by_the_next_draining_pass(make) -> None:
    """The consumer sends and crosses its own barrier (its I/O threads wrote the message into the
    loopback connection, so it is in the producer's kernel); the producer crosses its barrier and
    runs one non-blocking pass: the message is there, every time."""
    prod, cons, in_peer = _connected(make)
    peer = cons.peers()[0]
    for i in range(100):
        cons.send(peer, [b"m%d" % i])
        assert cons.barrier(5.0)
        assert prod.barrier(5.0)
        messages, events, drained = prod.service()
        assert [(p, [bytes(f) for f in fr]) for p, fr in messages] == [(in_peer, [b"m%d" % i])]
        assert drained and events == []
    # the answer the other way, the same
    prod.send(in_peer, [b"ack"])
    assert prod.barrier(5.0) and cons.barrier(5.0)
    assert [bytes(f) for f in cons.service()[0][0][1]] == [b"ack"]


def test_a_crossing_that_did_not_come_back_rests_the_barrier_then_it_crosses_again() -> None:
    """A crossing given no time does not come back: the barrier closes its pairs (a late arrival
    must not answer a later crossing) and rests: False at once for ``RETRY_S``, then twice that
    after the next failure; after the rest a crossing is made afresh and comes back."""
    import zmq

    from kvtier.transport.zmq_barrier import RETRY_S, IoBarrier

    ctx = zmq.Context(2)
    now = [100.0]
    b = IoBarrier(ctx, 2, clock=lambda: now[0])
    try:
        assert b.cross(0.0) is False
        assert b.cross(5.0) is False  # resting (else it would cross and say True)
        now[0] += RETRY_S + 0.001
        assert b.cross(5.0) is True
        assert b.cross(0.0) is False
        now[0] += RETRY_S + 0.001  # the rest is back to RETRY_S after a success
        assert b.cross(5.0) is True
        assert b.cross(0.0) is False
        now[0] += RETRY_S + 0.001
        assert b.cross(0.0) is False  # a second failure in a row: rests 2 * RETRY_S
        now[0] += RETRY_S + 0.001
        assert b.cross(5.0) is False
        now[0] += RETRY_S + 0.001
        assert b.cross(5.0) is True
    finally:
        b.close()
        ctx.term()


def test_settle_proves_the_bytes_received_before_it_even_while_more_arrive() -> None:
    """A connection that keeps receiving (a streaming peer) is proven once libzmq has read what
    it had received at the first check (received less unread); a backlog that does not move says
    False (a full queue: read first); a settle whose own budget runs out while the backlog moves
    says False without resting the barrier: the next settle, with nothing unread, says True."""
    import itertools

    import zmq

    from kvtier.transport.zmq_barrier import IoBarrier

    ctx = zmq.Context(1)
    b = IoBarrier(ctx, 1)
    try:
        streaming = iter([{7: (50, 100)}, {7: (60, 200)}])  # read 50 of 100, then 140 of 200
        assert b.settle(5.0, lambda: next(streaming)) is True
        assert b.settle(5.0, lambda: {7: (3, 10)}) is False
        slow = itertools.count(1)  # reads one byte per crossing of a backlog it never reaches
        assert b.settle(0.01, lambda: {7: (10**9 - next(slow), 10**9)}) is False
        assert b.settle(5.0, lambda: {}) is True
    finally:
        b.close()
        ctx.term()


@pytest.mark.parametrize("io_threads", [1, 3])
def test_no_crossing_is_delivered_as_a_message(make, io_threads) -> None:
    """Every I/O thread is crossed (three: three pairs, each pinned to its thread); nothing of
    it reaches the transport's owner."""
    t = make(io_threads=io_threads)
    assert t.barrier(5.0) is True and t.barrier(5.0) is True
    assert t.service() == ([], [], True)
    with pytest.raises(ValueError, match="timeout_s"):
        t.barrier(float("nan"))


def test_after_close_the_barrier_says_false(make) -> None:
    t = make()
    assert isinstance(t, Transport)
    assert t.barrier(5.0)
    t.close()
    assert t.barrier(5.0) is False


_RECEIVER = r"""
import json, select, sys
from kvtier.transport import ZmqTransport
t = ZmqTransport("127.0.0.1", 0, heartbeat_ivl_s=0)
print(json.dumps({"port": t.port}), flush=True)
seen = 0
while seen < 2:  # the hello, then the warm-up's end
    t.wait(0.1)
    seen += sum(bytes(f[0]) in (b"hello", b"warm-end") for _, f in t.recv())
print("{}", flush=True)
def continued():  # a line the test writes while this process is stopped
    return bool(select.select([sys.stdin], [], [], 0)[0])
while True:
    t.wait(0.001)
    if continued():
        break
    early = t.recv()
    if continued():  # stopped inside the read: it may have taken the message, the trial proves nothing
        if early:
            print(json.dumps({"inconclusive": True}), flush=True)
            sys.exit(0)
        break
    assert not early, "a message arrived before the stop"
ok = t.barrier(5.0)
first = 0
while True:  # one draining pass, as the loop's collect runs it
    msgs, _, drained = t.service(256)
    first += len(msgs)
    if drained:
        break
print(json.dumps({"crossed": ok, "first": first}), flush=True)
t.close()
"""


def _unread_at(port: int) -> int:
    """Bytes the kernel holds unread on the established TCP connections whose local port is
    ``port`` (``/proc/net/tcp``: rx_queue)."""
    total = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
                total += int(fields[4].split(":")[1], 16)
    return total


def test_a_multi_mib_message_that_reached_a_stopped_receiver_is_read_by_the_first_pass_after_the_barrier(make) -> None:
    """The receiver's process is stopped; a 4 MiB multipart message (64 frames of 64 KiB, as a
    ``block_data`` batch) goes into its kernel's buffer; once continued, the receiver crosses its
    barrier and runs one non-blocking draining pass: the message is there.  One crossing alone
    missed it in 8 of 12 trials (an I/O thread reads one buffer per connection per round).  A trial
    counts only when the whole message was in the kernel (else the rest was still in this process:
    not what the barrier covers) and the receiver was not stopped inside its own read."""
    import json
    import os
    import subprocess
    import sys

    from tests.support import wedge

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    conclusive = 0
    for _trial in range(16):
        if conclusive == 4:
            break
        child = subprocess.Popen([sys.executable, "-c", _RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=dict(os.environ, PYTHONPATH=root))
        try:
            port = json.loads(child.stdout.readline())["port"]
            s = make(heartbeat_ivl_s=0)
            peer = s.connect(f"127.0.0.1:{port}")
            s.send(peer, [b"hello"])
            for _ in range(64):  # grow the connection's window, as a session's earlier loads did
                s.send(peer, [b"w", b"y" * (1 << 20)])
            s.send(peer, [b"warm-end"])
            assert child.stdout.readline().strip() == "{}"
            with wedge.stopped(child.pid):
                s.send(peer, [b"batch"] + [b"x" * 65536] * 64)
                end = time.monotonic() + 0.3
                while time.monotonic() < end:  # into the stopped receiver's kernel (its window holds it)
                    s.flush()
                    time.sleep(0.01)
                held = _unread_at(port)  # all of it in the kernel, or the trial proves nothing
                child.stdin.write("continued\n")  # read once it runs again
                child.stdin.flush()
            out = json.loads(child.stdout.readline())
            assert child.wait(10) == 0
            if out != {"inconclusive": True} and held >= 64 * 65536:
                assert out == {"crossed": True, "first": 1}
                conclusive += 1
        finally:
            if child.poll() is None:
                wedge.cont(child.pid)
                child.kill()
                child.wait()
    assert conclusive == 4


def test_tcp_backlog_reports_unread_and_received_bytes_of_a_tcp_socket_only(tmp_path) -> None:
    import socket

    from kvtier.transport.zmq_barrier import tcp_backlog

    with socket.create_server(("127.0.0.1", 0)) as srv, socket.create_connection(srv.getsockname()) as c:
        a, _ = srv.accept()
        with a:
            assert tcp_backlog(a.fileno()) is None  # nothing unread
            c.sendall(b"x" * 10_000)
            end = time.monotonic() + 5.0
            while tcp_backlog(a.fileno()) != (10_000, 10_000) and time.monotonic() < end:
                time.sleep(0.001)
            assert tcp_backlog(a.fileno()) == (10_000, 10_000)
            a.recv(4_000, socket.MSG_WAITALL)
            assert tcp_backlog(a.fileno()) == (6_000, 10_000)
    with open(tmp_path / "f", "wb+") as f:
        f.write(b"y" * 100)
        f.seek(0)
        assert tcp_backlog(f.fileno()) is None  # a file (a reused fd number) holds no backlog
