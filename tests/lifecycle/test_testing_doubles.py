"""The public test doubles: ``kvtier.testing.clock.VirtualClock`` and
``kvtier.testing.fakenet.FakeNetwork``."""

from __future__ import annotations

import math

import pytest

from kvtier.lifecycle import TierCore
from kvtier.lifecycle.consumer import LoadInput
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.effects import JobDone, LandBlocks
from kvtier.lifecycle.producer import StoreInput
from kvtier.lifecycle.session import HelloInput
from kvtier.testing.clock import VirtualClock
from kvtier.testing.fakenet import Envelope, FakeNetwork


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


def _pair() -> tuple[FakeNetwork, TierCore, TierCore]:
    cs = CoreSettings(durations={k: 10.0 for k in TIMER_KEYS})
    local = HelloInput(1, 16, "x", "")
    net = FakeNetwork()
    p, c = TierCore(cs, local), TierCore(cs, local, gen_base=50)
    net.attach("p", p)
    net.attach("c", c)
    return net, p, c


def test_fake_network_carries_a_whole_transfer() -> None:
    net, p, c = _pair()
    p.store(StoreInput("A", "r", 1, (b"k0", b"k1"), (3, 4)), 0.0)
    net.route("c", c.announce("A", "p", 0.0), 0.0)  # dial: transport comes up at once, hello queued
    assert [e.kind for e in net.pending("c", "p")] == ["hello"]
    net.deliver("c", "p", 0, 0.0)
    net.deliver("p", "c", 0, 0.0)  # hello_ack
    net.route("c", c.submit_load(LoadInput("A", 2, (b"k0", b"k1"), (8, 9)), 0.0), 0.0)
    _, effs = net.deliver("c", "p", 0, 0.0)  # fetch -> SendBlocks
    assert len(net.transfers) == 1 and [e.kind for e in net.pending("p", "c")] == ["block_data"]
    _, effs = net.deliver("p", "c", 0, 0.0)
    assert LandBlocks("p", "A", 0, 0, 2, (8, 9)) in effs and JobDone(2, True, None) in effs
    assert [e.kind for e in net.pending("c", "p")] == ["receipt"]
    _, effs = net.finish_transfer(0, 0.0)  # released, but the store succeeds only on the receipt
    assert not any(isinstance(e, JobDone) for e in effs)
    _, effs = net.deliver("c", "p", 0, 0.0)
    assert JobDone(1, True, None) in effs
    assert net.in_flight() == 0


def test_fake_network_reorders_drops_and_duplicates() -> None:
    net = FakeNetwork()
    for i in range(3):
        net.send(Envelope("a", "b", "ping", 0, round=i))
    assert net.directions() == [("a", "b")]
    assert net.duplicate("a", "b", 4).round == 1  # 4 % 3 == 1; the copy goes to the end
    assert [e.round for e in net.pending("a", "b")] == [0, 1, 2, 1]
    assert net.drop("a", "b", 0).round == 0
    env, effs = net.deliver("a", "b", 4, 0.0)  # 4 % 3 == 1; nobody attached as "b": counted, dropped
    assert env.round == 2 and effs == [] and net.undeliverable == 1
    with pytest.raises(IndexError):
        net.deliver("b", "a", 0, 0.0)
    assert any(line.startswith("drop") for line in net.log)


def test_fake_network_kill_loses_everything_in_flight() -> None:
    net, p, c = _pair()
    net.route("c", c.announce("A", "p", 0.0), 0.0)
    assert net.in_flight() == 1
    lost = net.kill("c")
    assert len(lost) == 1 and net.in_flight() == 0 and "c" not in net.cores
