"""ZmqTransport connection events, drop_peer, peer_info, idle cut-off and close(linger_s).

Real sockets on 127.0.0.1 (ephemeral ports). Every wait is bounded; nothing asserts on timing.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import zmq

from kvtier.transport import CloseReason, PeerClosed, PeerInfo, SendFailure, ZmqTransport
from kvtier.transport.zmq_transport import _Conn

from test_zmq_transport import make, recv_until, until  # noqa: F401  (make is a fixture)

pytestmark = pytest.mark.timeout(30)


def events_until(t: ZmqTransport, pred, deadline_s: float = 5.0) -> list:
    got: list = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        t.wait(0.02)
        t.recv()
        got.extend(t.events())
        if pred(got):
            break
    return got


def hello_pair(make):
    producer, consumer = make(), make()
    peer = consumer.connect(producer.address)
    consumer.send(peer, [b"hello"])
    [(in_peer, _)] = recv_until(producer, 1)
    return producer, consumer, peer, in_peer


def test_router_reports_peer_closed_when_dialler_goes(make) -> None:
    producer, consumer, _, in_peer = hello_pair(make)
    assert producer.events() == []
    consumer.close()
    got = events_until(producer, lambda g: g)
    assert got == [PeerClosed(in_peer, CloseReason.DISCONNECTED)]
    assert producer.peer_info(in_peer) is None
    assert producer.send(in_peer, [b"x"]).failed


def test_dealer_reports_peer_closed_when_producer_goes(make) -> None:
    producer, consumer, peer, _ = hello_pair(make)
    producer.close()
    got = events_until(consumer, lambda g: g)
    assert got == [PeerClosed(peer, CloseReason.DISCONNECTED)]


def test_wait_wakes_up_for_an_event(make) -> None:
    producer, consumer, _, in_peer = hello_pair(make)
    consumer.close()
    assert until(lambda: producer.wait(0.05))
    assert producer.events() == [PeerClosed(in_peer, CloseReason.DISCONNECTED)]
    assert producer.events() == []  # reported exactly once


def test_peer_info_names_remote_address(make) -> None:
    producer, consumer, peer, in_peer = hello_pair(make)
    info = producer.peer_info(in_peer)
    assert isinstance(info, PeerInfo) and info.principal is None
    host, _, port = info.address.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0 and int(port) != producer.port
    assert consumer.peer_info(peer) == PeerInfo(producer.address, None)
    assert producer.peer_info("in:00ff") is None and producer.peer_info("nope") is None


def test_drop_peer_releases_zero_copy_sends_to_a_peer_that_never_reads(make) -> None:
    producer = make(sndhwm=1000)
    # A raw DEALER that says hello and then never reads: the kernel buffers fill up and libzmq
    # keeps the zero-copy frames queued.
    ctx = zmq.Context()
    try:
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.RCVHWM, 1)
        d.setsockopt(zmq.RCVBUF, 4096)
        d.connect(f"tcp://{producer.address}")
        d.send(b"hello")
        [(in_peer, _)] = recv_until(producer, 1)
        big = np.ones(16 << 20, dtype=np.uint8)
        handles = [producer.send(in_peer, [b"hdr", big], track=True) for _ in range(6)]
        time.sleep(0.2)
        assert not all(h.done for h in handles)  # still held by libzmq
        assert producer.drop_peer(in_peer) is True
        assert until(lambda: (producer.recv(), all(h.done for h in handles))[1])
        got = events_until(producer, lambda g: g)
        assert got == [PeerClosed(in_peer, CloseReason.DROPPED)]
        late = producer.send(in_peer, [b"after"])
        assert late.failed
        assert producer.drop_peer(in_peer) is False  # gone
        d.close(linger=0)
    finally:
        ctx.destroy(linger=0)


def test_drop_peer_on_a_dialled_producer(make) -> None:
    producer, consumer, peer, in_peer = hello_pair(make)
    assert consumer.drop_peer(peer) is True
    assert consumer.events() == [PeerClosed(peer, CloseReason.DROPPED)]
    assert consumer.peers() == [] and consumer.send(peer, [b"x"]).error == SendFailure.UNKNOWN_PEER
    assert consumer.drop_peer(peer) is False
    got = events_until(producer, lambda g: g)  # the producer sees the connection go
    assert got == [PeerClosed(in_peer, CloseReason.DISCONNECTED)]


def test_drop_peer_unknown_returns_false(make) -> None:
    t = make()
    assert t.drop_peer("in:0011") is False
    assert t.drop_peer("10.1.1.1:5") is False
    assert t.drop_peer("garbage") is False


def test_shutdown_guard_refuses_a_reused_fd(make) -> None:
    # An fd whose recorded remote address does not match (closed and reused) is never shut down.
    producer, consumer, _, in_peer = hello_pair(make)
    fd = producer._conns.rid_fd[bytes.fromhex(in_peer[3:])]
    wrong = _Conn(fd, "127.0.0.1:1", 0.0)
    assert producer._conns._shutdown_conn(wrong) is False
    consumer.send(consumer.peers()[0], [b"still here"])
    assert [bytes(f[0]) for _, f in recv_until(producer, 1)] == [b"still here"]


def test_idle_connection_is_cut(make) -> None:
    producer = make(idle_timeout_s=0.3)
    raw = socket.create_connection(("127.0.0.1", producer.port))
    try:
        raw.settimeout(5.0)
        assert until(lambda: (producer.wait(0.02), producer.idle_connections())[1] == 1)
        assert until(lambda: (producer.wait(0.05), producer.idle_dropped)[1] == 1)
        # the kernel sees the close: read returns EOF (or reset), never blocks
        data = b"x"
        try:
            while data:
                data = raw.recv(4096)
        except ConnectionResetError:
            pass
        assert producer.events() == []  # no peer id: nothing to report
    finally:
        raw.close()


def test_active_connection_is_not_cut(make) -> None:
    producer = make(idle_timeout_s=0.2)
    consumer = make()
    peer = consumer.connect(producer.address)
    consumer.send(peer, [b"hello"])
    [(in_peer, _)] = recv_until(producer, 1)
    end = time.monotonic() + 0.6
    while time.monotonic() < end:
        producer.wait(0.05)
        producer.recv()
    assert producer.idle_dropped == 0 and producer.events() == []
    assert producer.send(in_peer, [b"ok"]).sent


def test_close_with_linger_delivers_the_goodbye(make) -> None:
    producer, consumer, peer, in_peer = hello_pair(make)
    for i in range(50):
        producer.send(in_peer, [b"bye%d" % i])
    start = time.monotonic()
    producer.close(linger_s=2.0)
    assert time.monotonic() - start < 5.0  # bounded (generous: a shared CI box)
    got = recv_until(consumer, 50)
    assert [bytes(f[0]) for _, f in got] == [b"bye%d" % i for i in range(50)]


def test_close_linger_is_bounded_with_a_dead_peer(make) -> None:
    consumer = make()
    peer = consumer.connect("127.0.0.1:9")  # nobody listens: nothing can leave
    for _ in range(5):
        consumer.send(peer, [b"lost"])
    start = time.monotonic()
    consumer.close(linger_s=0.3)
    assert time.monotonic() - start < 3.0


def test_close_cuts_at_once_a_dial_that_never_completed_its_handshake(make) -> None:
    """A peer that accepted the TCP connection but never speaks ZMTP (a black hole: a listening
    socket nobody serves) can take no goodbye, so close does not wait the linger out for it;
    a dial that completed its handshake still gets its goodbye through (decision T13)."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)  # the kernel completes the TCP handshake; nothing ever answers ZMTP's greeting
    try:
        producer, consumer, peer, _ = hello_pair(make)
        lost = consumer.connect(f"127.0.0.1:{hole.getsockname()[1]}")
        consumer.send(lost, [b"bye"])
        consumer.send(peer, [b"bye"])
        start = time.monotonic()
        consumer.close(linger_s=20.0)
        assert time.monotonic() - start < 10.0  # it waited 20 s: the whole linger, for the hole
        assert [bytes(f[0]) for _, f in recv_until(producer, 1)] == [b"bye"]
    finally:
        hole.close()


def test_close_linger_rejects_bad_values(make) -> None:
    t = make()
    with pytest.raises(ValueError):
        t.close(linger_s=-1)
    with pytest.raises(ValueError):
        t.close(linger_s=float("inf"))
    t.close()


def test_sub_millisecond_waits_still_deliver(make) -> None:
    """A wait under 1 ms (zmq_poll counts whole milliseconds) is served by non-blocking polls
    (decision N17): with nothing there it reports nothing after at least the time asked for, and
    a message that arrives while such waits run is reported and received."""
    producer, consumer, peer, in_peer = hello_pair(make)
    t0 = time.monotonic()
    assert producer.wait(0.0003) is False
    assert time.monotonic() - t0 >= 0.0003  # it waited (a lower bound: never flaky)
    consumer.send(peer, [b"ping"])
    assert until(lambda: producer.wait(0.0003), step=lambda: None)
    assert producer.recv() == [(in_peer, [b"ping"])]
