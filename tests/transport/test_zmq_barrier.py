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


def test_a_crossing_that_timed_out_is_waited_for_by_the_next(make) -> None:
    """A crossing given no time returns False; the next one waits for both, its own and the late
    one (a stale arrival proves nothing about a later start), and no crossing is ever delivered
    as a message."""
    t = make()
    assert t.barrier(0.0) is False
    assert t.barrier(5.0) is True
    assert t.barrier(5.0) is True
    assert t.service() == ([], [], True)


def test_after_close_the_barrier_says_false(make) -> None:
    t = make()
    assert isinstance(t, Transport)
    assert t.barrier(5.0)
    t.close()
    assert t.barrier(5.0) is False
