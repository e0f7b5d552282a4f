"""The public test doubles: ``kvtier.testing.clock.VirtualClock`` and
``tools.fakenet.FakeNetwork``."""

from __future__ import annotations

import math

import pytest

from kvtier.lifecycle import TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.effects import JobDone, LandBlocks
from kvtier.lifecycle.session import HelloInput
from kvtier.testing.clock import VirtualClock
from kvtier.wire import messages as wm
from tools.coreview import CoreView
from tools.fakenet import Envelope, FakeNetwork


def test_virtual_clock_moves_only_forward() -> None:
    c = VirtualClock()
    assert c.now() == 0.0
    assert c.advance(1.5) == 1.5 and c.now() == 1.5
    assert c.advance(0) == 1.5
    with pytest.raises(ValueError, match="backwards"):
        c.advance(-0.1)
    assert c.now() == 1.5
    assert c.set(10) == 10.0
    with pytest.raises(ValueError, match="backwards"):
        c.set(9.9)
    for bad in (math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError):
            c.advance(bad)  # type: ignore[arg-type]
    assert VirtualClock(5).now() == 5.0


def _pair(**durations: float) -> tuple[FakeNetwork, TierCore, TierCore]:
    cs = CoreSettings(durations={**{k: 10.0 for k in TIMER_KEYS}, **durations})
    local = HelloInput(wm.PROTOCOL_VERSION, 16, "x", "", instance="x")
    net = FakeNetwork()
    p, c = TierCore(cs, local), TierCore(cs, local, gen_base=50)
    net.attach("p", p)
    net.attach("c", c)
    return net, p, c


def test_fake_network_carries_a_whole_transfer() -> None:
    net, p, c = _pair()
    net.apply("p", ix.StoreSubmitted("A", "r", 1, (b"k0", b"k1"), (3, 4)), 0.0)
    effs = net.apply("c", ix.LoadAnnounced("A", "p"), 0.0)  # dial: the transport comes up at once, hello queued
    assert [type(e).__name__ for e in effs] == ["OpenConnection", "Send"]
    assert [e.kind for e in net.pending("c", "p")] == ["hello"]
    _, effs = net.deliver("c", "p", 0, 0.0)  # the producer's plane takes the descriptor: ready, hello_ack
    assert [type(e).__name__ for e in effs] == ["AttachPeer", "Send"] and CoreView(p).session_ready("c")
    net.deliver("p", "c", 0, 0.0)  # hello_ack
    assert CoreView(c).session_ready("p")
    net.apply("c", ix.LoadSubmitted("A", 2, (b"k0", b"k1"), (8, 9)), 0.0)
    _, effs = net.deliver("c", "p", 0, 0.0)  # fetch -> SendBlocks
    assert len(net.transfers) == 1 and [e.kind for e in net.pending("p", "c")] == ["block_data"]
    _, effs = net.deliver("p", "c", 0, 0.0)
    assert LandBlocks("p", "A", 0, 0, (8, 9), (0, 0)) in effs and JobDone(2, True, None) in effs
    assert effs.index(LandBlocks("p", "A", 0, 0, (8, 9), (0, 0))) < effs.index(JobDone(2, True, None)), \
        "the landing is performed (and reported) before the load succeeds"
    assert [e.kind for e in net.pending("c", "p")] == ["receipt"]
    _, effs = net.finish_transfer(0, 0.0)  # released, but the store succeeds only on the receipt
    assert not any(isinstance(e, JobDone) for e in effs)
    _, effs = net.deliver("c", "p", 0, 0.0)
    assert JobDone(1, True, None) in effs
    assert net.in_flight() == 0


def test_fake_network_reorders_drops_and_duplicates() -> None:
    net = FakeNetwork()
    for i in range(3):
        net.send(Envelope("a", "b", wm.Ping(gen=0, t=float(i))))
    assert net.directions() == [("a", "b")]
    assert net.duplicate("a", "b", 4).msg.t == 1.0  # 4 % 3 == 1; the copy goes to the end
    assert [e.msg.t for e in net.pending("a", "b")] == [0.0, 1.0, 2.0, 1.0]
    assert net.drop("a", "b", 0).msg.t == 0.0
    env, effs = net.deliver("a", "b", 4, 0.0)  # 4 % 3 == 1; nobody attached as "b": counted, dropped
    assert env.msg.t == 2.0 and effs == [] and net.undeliverable == 1
    with pytest.raises(IndexError):
        net.deliver("b", "a", 0, 0.0)
    assert any(line.startswith("drop") for line in net.log)


def test_fake_network_kill_loses_everything_in_flight() -> None:
    net, p, c = _pair()
    net.apply("c", ix.LoadAnnounced("A", "p"), 0.0)
    assert net.in_flight() == 1
    lost = net.kill("c")
    assert len(lost) == 1 and net.in_flight() == 0 and "c" not in net.cores


def test_an_unread_message_is_read_before_the_deadlines_it_arrived_before() -> None:
    """Receive batching: a fetch that arrived at t=5 waits unread; a tick at t=20, past the reap
    deadline (t=10), reads it first and fires only what was due when the socket was last empty
    (t=5): the id is served, not reaped."""
    net, p, c = _pair(heartbeat_interval_s=100.0, peer_timeout_s=100.0, load_timeout_s=100.0)
    net.connect("c", "p", 0.0)
    net.apply("p", ix.StoreSubmitted("A", "r", 1, (b"k0",), (3,)), 0.0)  # reaped at t=10 unless fetched
    net.apply("c", ix.LoadAnnounced("A", "p"), 0.0)
    net.apply("c", ix.LoadSubmitted("A", 2, (b"k0",), (8,)), 0.0)
    env = net.arrive("c", "p", 0, 5.0)
    assert env.kind == "fetch" and net.unread("p") == [(5.0, env)] and net.in_flight() == 1
    effs = net.tick("p", 20.0)
    assert net.unread("p") == [] and p.producer_state("A").value == "serving"
    assert [e.kind for e in net.pending("p", "c")] == ["block_data"]
    assert not any(isinstance(e, JobDone) for e in effs), "the reap deadline did not beat the fetch"
    net2, p2, c2 = _pair(heartbeat_interval_s=100.0, peer_timeout_s=100.0, load_timeout_s=100.0)
    net2.connect("c", "p", 0.0)
    net2.apply("p", ix.StoreSubmitted("A", "r", 1, (b"k0",), (3,)), 0.0)
    effs = net2.tick("p", 20.0)  # nothing unread: the deadlines due now fire
    assert JobDone(1, False, "reaped") in effs and p2.producer_state("A").value == "tombstoned"
