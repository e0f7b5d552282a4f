"""``tools.snapshot``: a core's whole state as one canonical value, and a core restored
from it that behaves as the original did."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kvtier.lifecycle import ConsumerState, ProducerState, SessionState, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.producer import ProducerMachine
from kvtier.lifecycle.session import HelloInput
from kvtier.wire import messages as wm
from tools import snapshot
from tools.coreview import CoreView
from tools.fakenet import FakeNetwork

LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="snap", hash_seed="", instance="snap")
SETTINGS = CoreSettings(durations={k: 10.0 for k in TIMER_KEYS} | {"tombstone_retention_s": 30.0,
                                                                  "peer_timeout_s": 100.0},
                        tombstone_max=3, max_pending_fetches_per_peer=4)


def _busy_pair() -> tuple[FakeNetwork, TierCore, TierCore]:
    """A producer and a consumer with ids in many states: A done, B serving, C tombstoned, D
    awaiting, E parked, F queued behind nothing (in flight on the consumer), a named consumer, a
    retained order, a suspect-free session with both sides ready."""
    net = FakeNetwork()
    p, c = TierCore(SETTINGS, LOCAL), TierCore(SETTINGS, LOCAL, gen_base=500)
    net.attach("p", p)
    net.attach("c", c)
    net.connect("c", "p", 0.0)
    for i, kid in enumerate("ABCE"):
        net.apply("p", ix.StoreSubmitted(kid, f"r{kid}", i, (f"{kid}0".encode(),), (i,), (100 + i,)), 0.5)
    net.apply("p", ix.ConsumerNamed("E", "somebody"), 0.5)
    for kid, job in (("A", 10), ("B", 11), ("D", 12)):
        net.apply("c", ix.LoadAnnounced(kid, "p"), 1.0)
        net.apply("c", ix.LoadSubmitted(kid, job, (f"{kid}0".encode(),), (20 + job,)), 1.0)
    for _ in range(3):
        net.deliver("c", "p", 0, 1.5)  # the three fetches: A and B served, D awaiting
    net.deliver("p", "c", 0, 1.6)  # A's block_data: A loaded, receipt queued
    net.deliver("c", "p", 0, 1.7)  # A's receipt
    net.finish_transfer(0, 1.8)  # A released: done
    net.apply("p", ix.Received("c", wm.AbortFetch(gen=CoreView(p).session_gen("c"), kv_request_id="C", round=0,
                                                   fetched=False)), 2.0)  # C tombstoned
    assert [p.producer_state(k) for k in "ABCDE"] == [
        ProducerState.DONE, ProducerState.SERVING, ProducerState.TOMBSTONED, ProducerState.AWAITING,
        ProducerState.PARKED]
    assert c.consumer_state("B") is ConsumerState.IN_FLIGHT and c.consumer_state("D") is ConsumerState.IN_FLIGHT
    return net, p, c


def test_nothing_in_a_core_is_left_unclassified() -> None:
    assert snapshot.unknown_state(TierCore(SETTINGS, LOCAL)) == []


def test_an_attribute_nobody_classified_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ProducerMachine.__init__

    def grown(self: ProducerMachine, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.new_index = {}  # type: ignore[attr-defined]

    monkeypatch.setattr(ProducerMachine, "__init__", grown)
    assert snapshot.unknown_state(TierCore(SETTINGS, LOCAL)) == ["producer.new_index"]


def test_export_is_canonical_hashable_and_restores_exactly() -> None:
    _, p, c = _busy_pair()
    for core in (p, c):
        state = snapshot.export(core)
        again = snapshot.restore(state, SETTINGS, LOCAL)
        assert snapshot.export(again) == state and hash(snapshot.export(again)) == hash(state)
        assert snapshot.indexes(again) == snapshot.indexes(core)
        assert snapshot.index_problems(again) == snapshot.index_problems(core) == []
        assert CoreView(again).deadlines() == CoreView(core).deadlines()
        assert again.records().producers == core.records().producers
        assert again.records().consumers == core.records().consumers
        assert CoreView(again).sessions() == CoreView(core).sessions()
    state = snapshot.export(p)
    assert [e.kv_request_id for e in state.producer] == sorted(e.kv_request_id for e in state.producer)
    assert state.retained == ("A", "C") and state.named == (("E", "somebody"),)
    b = next(e for e in state.producer if e.kv_request_id == "B")
    assert b.blocks == ((b"B0", 1, 101),) and b.jobs == (1,) and b.peer == "c" and b.deadline == 11.5
    a = next(e for e in state.producer if e.kv_request_id == "A")
    assert (a.state, a.deadline, a.blocks, a.jobs) == (ProducerState.DONE, 31.8, (), ())


def test_a_restored_core_behaves_as_the_original() -> None:
    """The same inputs, applied to a core and to its restored copy, give the same effects and
    leave the same state, across deadlines, messages and reports."""
    _, p, _ = _busy_pair()
    copy = snapshot.restore(snapshot.export(p), SETTINGS, LOCAL)
    gen = CoreView(p).session_gen("c")
    steps: list[tuple[str, Any, float]] = [
        ("in", ix.Received("c", wm.Fetch(gen=gen, kv_request_id="C", round=7, keys=[b"C0"])), 3.0),  # late: refused
        ("in", ix.StoreSubmitted("D", "rD", 40, (b"D0",), (9,)), 3.5),  # meets D's demand: served
        ("in", ix.Received("c", wm.Receipt(gen=gen, kv_request_id="B", round=1)), 4.0),
        ("fire", None, 11.0),  # E's reap (10.5); B's transfer timer was confirmed
        ("in", ix.TransferReleased("B", 1), 12.0),
        ("fire", None, 40.0),  # prunes, D's transfer deadline, heartbeats
        ("in", ix.Received("c", wm.Fetch(gen=gen, kv_request_id="A", round=9, keys=[b"A0"])), 41.0),
        ("fire", None, 200.0),  # the session has been silent: it ends
    ]
    for kind, inp, now in steps:
        got = p.fire(now) if kind == "fire" else p.handle(inp, now)
        want = copy.fire(now) if kind == "fire" else copy.handle(inp, now)
        assert got == want, (kind, inp, now)
        assert snapshot.export(copy) == snapshot.export(p), (kind, inp, now)
    assert CoreView(p).session_state("c") is SessionState.ABSENT


def test_retime_moves_every_time_and_only_times() -> None:
    _, p, _ = _busy_pair()
    state = snapshot.export(p)
    seen: set[tuple[str, str]] = set()

    def clock(kind: str, machine: str, key: str, t: float) -> float:
        seen.add((kind, machine))
        return math.inf if kind == "deadline" else 0.0

    timeless = snapshot.retime(state, clock)
    assert {("deadline", "producer"), ("deadline", "session"), ("heard", "session"), ("active", "session")} <= seen
    assert all(e.deadline in (None, math.inf) for e in (*timeless.producer, *timeless.sessions, *timeless.consumer))
    assert all(e.heard == 0.0 for e in timeless.sessions)
    assert snapshot.retime(timeless, lambda kind, m, k, t: t) == timeless
    core = snapshot.restore(timeless, SETTINGS, LOCAL)
    assert core.fire(1e9) == [] and core.next_deadline() == math.inf, "armed at +inf: nothing ever falls due"
    assert sorted((d.machine, d.key, d.timer) for d in CoreView(core).deadlines()) == sorted(
        (d.machine, d.key, d.timer) for d in CoreView(p).deadlines()), "the same deadlines are armed"


def test_index_problems_names_an_index_that_drifted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A core whose per-peer index is not maintained (its index op planted away) is caught."""
    monkeypatch.setattr(ProducerMachine, "_bind_peer", lambda self, rec: None)
    _, p, _ = _busy_pair()
    problems = snapshot.index_problems(p)
    assert problems and problems[0].startswith("producer ids per bound peer")


def test_restoring_into_a_used_core_forgets_everything_it_held() -> None:
    """``into=``: a core that served other ids is emptied first; the restored core equals a new
    one restored from the same state, and behaves the same."""
    _, p, c = _busy_pair()
    state = snapshot.export(c)
    reused = snapshot.restore(state, SETTINGS, LOCAL, into=p)
    assert reused is p and snapshot.export(p) == state and snapshot.index_problems(p) == []
    pv = CoreView(p)
    assert pv.producer_ids() == [] and pv.evicted() == 0 and pv.deadlines() == CoreView(c).deadlines()
    fresh = snapshot.restore(state, SETTINGS, LOCAL)
    for now in (5.0, 12.0, 300.0):
        assert p.fire(now) == fresh.fire(now)
        assert snapshot.export(p) == snapshot.export(fresh)
    with pytest.raises(ValueError, match="other settings"):
        snapshot.restore(state, CoreSettings(durations=SETTINGS.durations), LOCAL, into=p)


# -- the symmetric path (decision M14) ---------------------------------------------------------


def _roundtrips(core: TierCore) -> snapshot.CoreState:
    """Export ``core``, restore it, and check the copy is the same core: the same export, indexes,
    deadlines and symmetric views."""
    state = snapshot.export(core)
    again = snapshot.restore(state, core.settings, core.local)
    assert snapshot.export(again) == state
    assert snapshot.indexes(again) == snapshot.indexes(core)
    assert snapshot.index_problems(core) == snapshot.index_problems(again) == []
    assert again.next_deadline() == core.next_deadline()
    for kid in core.probe_ids():
        assert CoreView(again).probe(kid) == CoreView(core).probe(kid)
    for key in CoreView(core).serve_ids():
        assert CoreView(again).serve(*key) == CoreView(core).serve(*key)
    assert again.round_loads() == core.round_loads()
    av, cv = CoreView(again), CoreView(core)
    assert av.pins_held() == cv.pins_held() and av.serve_pinned_blocks() == cv.serve_pinned_blocks()
    return state


def test_the_symmetric_path_exports_and_restores_at_every_step() -> None:
    """A probe with a hit and a miss, the serve window pinning, the round's load, its transfer:
    after every step both cores round-trip, and the export names the probe, the round's load and
    the serve record (with its pin) while they live."""
    from kvtier.lifecycle import ProbeState, ServeState
    from tests.symmetric.harness import SymNet, make_core

    net = SymNet()
    c, p = make_core("C"), make_core("P")
    net.attach("C", c)
    net.attach("P", p)
    keys = (b"k1" * 4, b"k2" * 4)
    net.engines["P"].blocks[keys[0]] = 7  # the producer's engine holds the first key only
    seen: dict[str, set] = {"probe": set(), "rounds": set(), "serve": set(), "pins": set()}

    def both() -> None:
        for core in (c, p):
            st = _roundtrips(core)
            seen["probe"].update(e.state for e in st.probe)
            seen["rounds"].update(e.state for e in st.rounds)
            seen["serve"].update(e.state for e in st.serve)
            seen["pins"].update(pin for e in st.serve for pin in e.pins)

    def settle(now: float) -> None:
        for _ in range(50):
            moved = False
            for src, dst in net.directions():
                net.deliver(src, dst, 0, now)
                both()
                moved = True
            if net.windows["P"].pending():
                net.serve_window("P", now)
                both()
                moved = True
            if net.transfers:
                net.finish_transfer(0, now)
                both()
                moved = True
            if not moved:
                return

    net.engine_input("C", ix.ProbeAnnounced("sym", "P"), 0.0)
    both()
    settle(0.0)
    for k in keys:
        net.engine_input("C", ix.KeyLookedUp("sym", k), 0.1)
        both()
    net.engine_input("C", ix.ScheduleEnded(), 0.1)
    both()
    settle(0.2)
    assert c.probe_state("sym") is ProbeState.OFFERED
    net.engine_input("C", ix.LoadSubmitted("sym", 5, (keys[0],), (30,)), 0.3)
    both()
    settle(0.4)
    net.engine_input("C", ix.RequestFinished("sym", producer=False), 0.5)
    both()
    settle(0.6)
    assert net.results[5][0].ok
    assert {ProbeState.COLLECTING, ProbeState.PROBING, ProbeState.OFFERED} <= seen["probe"]
    assert ConsumerState.IN_FLIGHT in seen["rounds"]
    assert {ServeState.LOOKING_UP, ServeState.OFFERED, ServeState.SERVING} <= seen["serve"] and seen["pins"]
    assert not CoreView(p).serve_ids() and not CoreView(p).pins_held()


def test_a_core_without_symmetric_records_exports_no_symmetric_state() -> None:
    """The five PD profiles' state counts rest on this: the symmetric fields stay at their
    defaults, so such an export equals one made before they existed."""
    _, p, c = _busy_pair()
    for core in (p, c):
        st = snapshot.export(core)
        assert (st.probe, st.rounds, st.serve, st.serve_closing) == ((), (), (), False)
