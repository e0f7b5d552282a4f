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


@pytest.mark.parametrize("io_threads", [1, 3])
def test_what_reached_the_kernel_before_the_barrier_is_read_by_the_next_draining_pass(make, io_threads) -> None:
    """The consumer sends and crosses its own barrier (its I/O threads wrote the message into the
    loopback connection, so it is in the producer's kernel); the producer crosses its barrier and
    runs one non-blocking pass: the message is there, every time."""
    prod, cons, in_peer = _connected(make, io_threads=io_threads)
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


def test_a_crossing_that_timed_out_rests_the_barrier_then_the_next_waits_for_both(make) -> None:
    """A crossing given no time returns False, and the barrier rests (``RETRY_S``): calls answer
    False at once, so a caller that crosses on every late pass does not wait each time.  After
    the rest, a crossing waits for its own message and the late one (a stale arrival proves
    nothing about a later start); no crossing is ever delivered as a message."""
    from kvtier.transport.zmq_barrier import RETRY_S

    t = make()
    assert t.barrier(0.0) is False
    assert t.barrier(5.0) is False  # resting (else it would wait for both and say True)
    time.sleep(RETRY_S + 0.05)
    assert t.barrier(5.0) is True
    assert t.barrier(5.0) is True
    assert t.service() == ([], [], True)


def test_after_close_the_barrier_says_false(make) -> None:
    t = make()
    assert isinstance(t, Transport)
    assert t.barrier(5.0)
    t.close()
    assert t.barrier(5.0) is False


_RECEIVER = r"""
import json, sys, time
from kvtier.transport import ZmqTransport
t = ZmqTransport("127.0.0.1", 0, heartbeat_ivl_s=0)
print(json.dumps({"port": t.port}), flush=True)
seen = 0
while seen < 2:  # the hello, then the warm-up's end
    t.wait(0.1)
    seen += sum(bytes(f[0]) in (b"hello", b"warm-end") for _, f in t.recv())
print("{}", flush=True)
while True:  # a wait that ends much later than asked: this process was stopped
    a = time.monotonic()
    t.wait(0.001)
    if time.monotonic() - a > 0.2:
        break
    assert not t.recv(), "the message arrived before the stop"
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


def test_a_multi_mib_message_that_reached_a_stopped_receiver_is_read_by_the_first_pass_after_the_barrier(make) -> None:
    """The receiver's process is stopped; a 4 MiB multipart message (64 frames of 64 KiB, as a
    ``block_data`` batch) fills its kernel's buffer; once continued, the receiver crosses its
    barrier and runs one non-blocking draining pass: the message is there.  One crossing alone
    missed it in 8 of 12 trials (an I/O thread reads one buffer per connection per round)."""
    import json
    import os
    import subprocess
    import sys

    from tests.support import wedge

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for _ in range(4):
        child = subprocess.Popen([sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONPATH=root))
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
                while time.monotonic() < end:  # into the stopped receiver's kernel, as far as it takes
                    s.flush()
                    time.sleep(0.01)
            out = json.loads(child.stdout.readline())
            assert out == {"crossed": True, "first": 1}
            assert child.wait(10) == 0
        finally:
            if child.poll() is None:
                wedge.cont(child.pid)
                child.kill()
                child.wait()
