"""ZmqTransport: routing ids that outlive their connection, and dials that never connect.

* A ROUTER keeps a closed connection's unread messages, and ``SRCFD`` names an fd *number*: a
  reader that fell behind reads them after a newer connection took the number.  Those leftovers
  must never bind the newer connection to the old routing id, so that ending the old peer never
  cuts the new one (decision T10; the stale route after a reconnect).
* A first message read from a connection that had already closed is followed by that
  connection's ``PeerClosed`` (nothing else would ever report it).
* A ``fail_fast`` dial to a port nothing listens on is reported ``refused`` at once, once; a dial
  without it keeps waiting for the producer (the contract the transport's own tests rely on).

Real sockets on 127.0.0.1; raw DEALERs play the consumers, so the order in which the ROUTER reads
them is under the test's control.  Every wait is bounded; nothing asserts on timing.
"""

from __future__ import annotations

import socket
import time

import pytest
import zmq

from kvtier.transport import CloseReason, PeerClosed, ZmqTransport

from test_zmq_transport import make, until  # noqa: F401  (make is a fixture)

pytestmark = pytest.mark.timeout(30)


def _dealer(ctx: zmq.Context, address: str, rid: bytes) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTING_ID, rid)
    s.connect(f"tcp://{address}")
    return s


def _read(t: ZmqTransport, want: int, timeout_s: float = 5.0) -> tuple[list, list]:
    msgs: list = []
    events: list = []
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and len(msgs) < want:
        t.wait(0.02)
        m, e, _ = t.service()
        msgs += m
        events += e
    return msgs, events


def test_leftovers_of_a_closed_connection_never_bind_the_connection_that_reused_its_fd(make) -> None:
    """A speaks once (bound), then sends three more messages and closes while the producer reads
    nothing; B connects on the fd number A had and speaks.  The producer then reads A's
    leftovers and B's message in whatever order the ROUTER gives them.  Every message is
    delivered under its own peer id, ending A (``drop_peer``) does not cut B, B still receives,
    and the only close reported is A's."""
    t = make()
    ctx = zmq.Context()
    try:
        ra, rb = b"kA" + b"\x01" * 14, b"kB" + b"\x02" * 14
        a = _dealer(ctx, t.address, ra)
        a.send(b"a0")
        [(peer_a, _)], _ = _read(t, 1)
        fd_a = t._conns.rid_fd[ra]
        for i in range(1, 4):
            a.send(f"a{i}".encode())
        time.sleep(0.2)  # A's bytes reach the producer's pipe; nothing reads them
        a.close()
        time.sleep(0.3)  # libzmq's I/O thread sees A's EOF and closes its fd
        b = _dealer(ctx, t.address, rb)
        time.sleep(0.2)
        b.send(b"b0")
        msgs, events = _read(t, 4)
        peer_b = "in:" + rb.hex()
        assert t._conns.rid_fd.get(rb) == fd_a, "precondition: B's connection reused A's fd number"
        assert sorted((p, f[0]) for p, f in msgs) == sorted(
            [(peer_a, b"a1"), (peer_a, b"a2"), (peer_a, b"a3"), (peer_b, b"b0")])
        assert t.drop_peer(peer_a) is False  # A's connection is gone; B's is not A's
        assert not t.send(peer_b, [b"to-b"]).failed
        assert b.poll(5000), "B was cut"
        assert b.recv() == b"to-b"
        _, more = _read(t, 0, timeout_s=0.3)
        assert [e for e in events + more if e.peer == peer_b] == []
        assert [e for e in events + more if e.peer == peer_a] == [PeerClosed(peer_a, CloseReason.DISCONNECTED)]
        b.close()
    finally:
        ctx.destroy(linger=0)


def test_a_first_message_of_a_connection_that_already_closed_is_followed_by_its_close(make) -> None:
    """A connects, says one thing and closes before the producer read anything: the message is
    delivered (it is input) and its connection's close follows it, so a leftover hello cannot
    open a session that nothing would ever end."""
    t = make()
    ctx = zmq.Context()
    try:
        ra = b"kC" + b"\x03" * 14
        a = _dealer(ctx, t.address, ra)
        a.send(b"hello")
        time.sleep(0.3)
        a.close()
        time.sleep(0.3)
        msgs, events = _read(t, 1)
        until(lambda: events.extend(t.events()) or events, 2.0)
        peer = "in:" + ra.hex()
        assert [(p, f[0]) for p, f in msgs] == [(peer, b"hello")]
        assert events == [PeerClosed(peer, CloseReason.DISCONNECTED)]
        assert t.peer_info(peer) is None
    finally:
        ctx.destroy(linger=0)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_fail_fast_dial_to_a_closed_port_is_reported_refused_once(make) -> None:
    t = make()
    address = f"127.0.0.1:{_closed_port()}"
    t.connect(address, fail_fast=True)
    got: list = []
    end = time.monotonic() + 5.0
    while time.monotonic() < end and not got:
        t.wait(0.02)
        got += t.service()[1]
    for _ in range(10):  # libzmq does not retry it: nothing more is reported
        t.wait(0.02)
        got += t.service()[1]
    assert got == [PeerClosed(address, CloseReason.REFUSED)]


def test_a_plain_dial_to_a_closed_port_waits_for_the_producer(make) -> None:
    t = make()
    port = _closed_port()
    address = f"127.0.0.1:{port}"
    t.connect(address)
    t.send(address, [b"early"])
    got: list = []
    for _ in range(10):
        t.wait(0.02)
        got += t.service()[1]
    assert got == []
    p = make(port=port)
    assert until(lambda: any(f[0] == b"early" for _, f in p.recv()), 10.0)


def test_a_fail_fast_dial_that_connects_reports_nothing(make) -> None:
    p, t = make(), make()
    t.connect(p.address, fail_fast=True)
    t.send(p.address, [b"x"])
    got: list = []
    seen = []
    end = time.monotonic() + 5.0
    while time.monotonic() < end and not seen:
        p.wait(0.02)
        seen += p.recv()
        got += t.service()[1]
    assert seen and got == []
