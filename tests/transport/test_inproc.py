"""InprocTransport: the deterministic, in-memory stand-in for ZmqTransport."""

from __future__ import annotations

import threading

import pytest

from kvtier.testing.inproc import InprocNetwork, InprocTransport
from kvtier.transport import SendFailure, Transport, TransportError

pytestmark = pytest.mark.timeout(30)

P, C, C2 = "prefill:1", "decode:1", "decode:2"


@pytest.fixture
def net() -> InprocNetwork:
    return InprocNetwork()


def texts(msgs) -> list[tuple[str, list[bytes]]]:
    return [(p, [bytes(f) for f in frames]) for p, frames in msgs]


def test_is_a_transport(net: InprocNetwork) -> None:
    assert isinstance(InprocTransport(net, P), Transport)


def test_round_trip_and_peer_ids(net: InprocNetwork) -> None:
    prod, cons = InprocTransport(net, P), InprocTransport(net, C)
    peer = cons.connect(P)
    assert peer == P and cons.connect(P) == P
    h = cons.send(peer, [b"fetch", memoryview(b"k")])
    assert h.sent and h.done and not h.failed
    assert prod.wait(0) is True
    [(in_peer, frames)] = prod.recv()
    assert in_peer == "in:" + C and frames == [b"fetch", b"k"]
    assert all(type(f) is bytes for f in frames)
    prod.send(in_peer, [b"reply"])
    assert texts(cons.recv()) == [(P, [b"reply"])]
    assert prod.wait(10.0) is False  # nothing there, and it never sleeps


def test_frames_are_copied_at_send(net: InprocNetwork) -> None:
    prod, cons = InprocTransport(net, P), InprocTransport(net, C)
    buf = bytearray(b"original")
    cons.send(cons.connect(P), [buf])
    buf[:] = b"mutated!"
    assert prod.recv()[0][1] == [b"original"]


def test_fifo_and_deterministic_order(net: InprocNetwork) -> None:
    def run() -> list:
        n = InprocNetwork()
        prod = InprocTransport(n, P)
        cs = [InprocTransport(n, a) for a in (C, C2)]
        for i in range(6):
            c = cs[i % 2]
            c.send(c.connect(P), [b"%d" % i])
        return texts(prod.recv(max_messages=4)) + texts(prod.recv())

    first = run()
    assert [f[0] for _, f in first] == [b"%d" % i for i in range(6)]
    assert first == run()


def test_io_lag_keeps_arrivals_in_the_kernel_until_a_barrier_or_a_wait(net: InprocNetwork) -> None:
    """A stopped process's transport threads (decision T17): what arrives is not seen by the
    first service pass (it is counted as delivered); the barrier takes it in at once, a wait
    too, and a first pass without either takes it in after itself; the lag then ends."""
    prod, cons = InprocTransport(net, P), InprocTransport(net, C)
    peer = cons.connect(P)
    prod.io_lag = True
    cons.send(peer, [b"a"])
    assert prod.recv() == [] and prod.inbox_size() == 1
    assert prod.barrier(1.0) is True and prod.io_lag is False
    assert texts(prod.service()[0]) == [("in:" + C, [b"a"])]
    prod.io_lag = True
    cons.send(peer, [b"b"])
    assert prod.wait(0) is True and prod.io_lag is False
    assert texts(prod.recv()) == [("in:" + C, [b"b"])]
    prod.io_lag = True
    cons.send(peer, [b"c"])
    assert prod.service() == ([], [], True) and prod.io_lag is False  # empty sockets, a full kernel
    assert texts(prod.service()[0]) == [("in:" + C, [b"c"])]
    prod.close()
    assert prod.barrier(1.0) is False


def test_hold_completion(net: InprocNetwork) -> None:
    InprocTransport(net, P)
    cons = InprocTransport(net, C, hold_completion=True)
    peer = cons.connect(P)
    h1, h2 = cons.send(peer, [b"a"]), cons.send(peer, [b"b"])
    assert h1.sent and not h1.done and not h2.done
    assert cons.complete(1) == 1
    assert h1.done and not h2.done
    assert cons.complete() == 1 and h2.done


def test_rcvhwm_queues_then_drains_in_order(net: InprocNetwork) -> None:
    prod = InprocTransport(net, P, rcvhwm=2)
    cons = InprocTransport(net, C)
    peer = cons.connect(P)
    handles = [cons.send(peer, [b"%d" % i]) for i in range(5)]
    assert [h.sent for h in handles] == [True, True, False, False, False]
    assert cons.pending_sends() == 3 and not handles[2].done
    got = []
    while True:
        batch = prod.recv()
        if not batch:
            break
        got += batch
    assert [f[0] for _, f in got] == [b"%d" % i for i in range(5)]
    assert cons.pending_sends() == 0 and all(h.done for h in handles)


def test_connect_before_listen(net: InprocNetwork) -> None:
    cons = InprocTransport(net, C)
    peer = cons.connect(P)
    h = cons.send(peer, [b"early"])
    assert not h.sent and cons.pending_sends() == 1
    prod = InprocTransport(net, P)
    assert prod.recv() == []  # nothing until the sender flushes (as zmq's reconnect would)
    cons.flush()
    assert texts(prod.recv()) == [("in:" + C, [b"early"])] and h.done


def test_unknown_peers(net: InprocNetwork) -> None:
    t = InprocTransport(net, P)
    assert t.send("nowhere:1", [b"x"]).error == SendFailure.UNKNOWN_PEER
    h = t.send("in:nobody", [b"x"])
    assert h.failed and h.done and h.error == SendFailure.UNREACHABLE


def test_kill_and_restart(net: InprocNetwork) -> None:
    prod, cons = InprocTransport(net, P), InprocTransport(net, C)
    peer = cons.connect(P)
    cons.send(peer, [b"hi"])
    [(in_peer, _)] = prod.recv()
    cons.send(peer, [b"lost"])  # in the dying producer's inbox
    net.kill(P)
    assert prod.closed and net.dropped == 1
    assert prod.send(in_peer, [b"x"]).error == SendFailure.CLOSED
    h = cons.send(peer, [b"while-down"])
    assert not h.sent and cons.pending_sends() == 1  # waits for a restart, like a DEALER

    restarted = InprocTransport(net, P)  # same address: a restart
    cons.flush()
    assert texts(restarted.recv()) == [("in:" + C, [b"while-down"])]


def test_killed_consumer_is_unreachable(net: InprocNetwork) -> None:
    prod, cons = InprocTransport(net, P), InprocTransport(net, C)
    cons.send(cons.connect(P), [b"hi"])
    [(in_peer, _)] = prod.recv()
    net.kill(C)
    h = prod.send(in_peer, [b"x"])
    assert h.failed and h.error == SendFailure.UNREACHABLE


def test_partition_drops_silently_until_healed(net: InprocNetwork) -> None:
    prod, cons = InprocTransport(net, P), InprocTransport(net, C)
    peer = cons.connect(P)
    cons.send(peer, [b"hi"])
    [(in_peer, _)] = prod.recv()
    net.partition(P, C)
    assert net.is_partitioned(C, P)
    h1, h2 = cons.send(peer, [b"x"]), prod.send(in_peer, [b"y"])
    assert h1.done and h2.done and not h1.failed and not h2.failed
    assert prod.recv() == [] and cons.recv() == [] and net.dropped == 2
    net.heal(C, P)
    cons.send(peer, [b"z"])
    assert texts(prod.recv()) == [(in_peer, [b"z"])]


def test_disconnect(net: InprocNetwork) -> None:
    prod, cons = InprocTransport(net, P), InprocTransport(net, C)
    peer = cons.connect(P)
    cons.send(peer, [b"hi"])
    [(in_peer, _)] = prod.recv()
    cons.disconnect(peer)
    assert cons.send(peer, [b"x"]).error == SendFailure.UNKNOWN_PEER
    assert prod.send(in_peer, [b"x"]).error == SendFailure.UNREACHABLE
    cons.disconnect("unknown")


def test_disconnect_fails_queued(net: InprocNetwork) -> None:
    cons = InprocTransport(net, C)
    peer = cons.connect(P)
    h = cons.send(peer, [b"x"])
    cons.disconnect(peer)
    assert h.failed and h.error == SendFailure.DISCONNECTED and cons.pending_sends() == 0


def test_close(net: InprocNetwork) -> None:
    threads = threading.active_count()
    cons = InprocTransport(net, C, hold_completion=True)
    peer = cons.connect(P)
    queued = cons.send(peer, [b"x"])
    cons.close()
    cons.close()
    assert queued.error == SendFailure.CLOSED
    assert cons.send(peer, [b"x"]).error == SendFailure.CLOSED
    assert cons.recv() == [] and cons.wait(1.0) is False
    with pytest.raises(TransportError):
        cons.connect(P)
    InprocTransport(net, C)  # the address is free again
    assert threading.active_count() == threads


def test_address_taken_and_bad_args(net: InprocNetwork) -> None:
    t = InprocTransport(net, P)
    with pytest.raises(TransportError):
        InprocTransport(net, P)
    with pytest.raises(ValueError):
        InprocTransport(net, "")
    with pytest.raises(ValueError):
        InprocTransport(net, C, rcvhwm=0)
    with pytest.raises(ValueError):
        t.connect(P)  # ourselves
    for frames in ([], b"x", [1]):
        with pytest.raises(ValueError):
            t.send("x", frames)
    with pytest.raises(ValueError):
        t.recv(0)


# -- connection events, drop_peer, peer_info, close(linger_s) -----------------------------------

from kvtier.transport import CloseReason, PeerClosed, PeerInfo  # noqa: E402


def _connected(net: InprocNetwork, **kw):
    prod, cons = InprocTransport(net, P, **kw), InprocTransport(net, C, principal="decode-0")
    cons.send(cons.connect(P), [b"hello"])
    [(in_peer, _)] = prod.recv()
    return prod, cons, in_peer


def test_close_connection_reports_both_ends(net: InprocNetwork) -> None:
    prod, cons, in_peer = _connected(net)
    assert net.close_connection(C, P) is True
    assert prod.events() == [PeerClosed(in_peer, CloseReason.DISCONNECTED)]
    assert cons.events() == [PeerClosed(P, CloseReason.DISCONNECTED)]
    assert prod.events() == [] and cons.events() == []
    assert prod.send(in_peer, [b"x"]).error == SendFailure.UNREACHABLE
    assert net.close_connection(C, P) is False  # already gone
    cons.send(P, [b"again"])  # the dialler reconnects on its own, as a zmq DEALER does
    assert texts(prod.recv()) == [(in_peer, [b"again"])]


def test_kill_reports_peer_closed_to_both_kinds_of_peer(net: InprocNetwork) -> None:
    prod, cons, in_peer = _connected(net)
    net.kill(C)
    assert prod.events() == [PeerClosed(in_peer, CloseReason.DISCONNECTED)]
    prod2, cons2, in2 = _connected(InprocNetwork())
    prod2.close()
    assert cons2.events() == [PeerClosed(P, CloseReason.DISCONNECTED)]


def test_drop_peer_releases_held_handles(net: InprocNetwork) -> None:
    prod, cons, in_peer = _connected(net, hold_completion=True)
    h = prod.send(in_peer, [b"block"], track=True)
    other = prod.send(in_peer, [b"block2"], track=True)
    assert h.sent and not h.done and not other.done
    assert prod.drop_peer(in_peer) is True
    assert h.done and other.done
    assert prod.events() == [PeerClosed(in_peer, CloseReason.DROPPED)]
    assert cons.events() == [PeerClosed(P, CloseReason.DISCONNECTED)]
    assert prod.send(in_peer, [b"late"]).failed
    assert prod.drop_peer(in_peer) is False


def test_drop_dialled_peer(net: InprocNetwork) -> None:
    prod, cons, in_peer = _connected(net)
    assert cons.drop_peer(P) is True
    assert cons.events() == [PeerClosed(P, CloseReason.DROPPED)]
    assert prod.events() == [PeerClosed(in_peer, CloseReason.DISCONNECTED)]
    assert cons.peers() == [] and cons.send(P, [b"x"]).error == SendFailure.UNKNOWN_PEER
    assert cons.drop_peer(P) is False


def test_peer_info(net: InprocNetwork) -> None:
    prod, cons, in_peer = _connected(net)
    assert prod.peer_info(in_peer) == PeerInfo(C, "decode-0")
    assert cons.peer_info(P) == PeerInfo(P, None)
    assert prod.peer_info("in:nobody") is None and prod.peer_info("x") is None


def test_close_with_linger_flushes_queued_sends(net: InprocNetwork) -> None:
    prod = InprocTransport(net, P, rcvhwm=1)
    cons = InprocTransport(net, C)
    cons.send(cons.connect(P), [b"1"])
    h = cons.send(P, [b"2"])  # queued: the producer's inbox is full
    assert not h.sent
    prod.recv()  # room again, but nobody flushed yet
    cons.close(linger_s=1.0)
    assert h.sent and texts(prod.recv()) == [("in:" + C, [b"2"])]
    with pytest.raises(ValueError):
        prod.close(linger_s=-1)
