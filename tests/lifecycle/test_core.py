"""The sans-I/O core against the spec: exhaustive table agreement with an independent reference
interpreter, effects returned (never performed), rejects that leave records untouched, and
deadline handling that costs O(expired)."""

from __future__ import annotations

import builtins
import socket
import time
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from tools import reference
from tools.spec import load
from kvtier.lifecycle import InvalidTransition, TierCore
from kvtier.lifecycle import deadlines as deadlines_mod
from kvtier.lifecycle import effects as effects_mod
from kvtier.lifecycle._table import ConsumerGuard, ProducerEvent, ProducerGuard, SessionGuard
from kvtier.lifecycle.consumer import ConsumerMachine, LoadInput
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.producer import FetchInput, ProducerMachine, StoreInput
from kvtier.lifecycle.session import HelloInput, SessionMachine
from kvtier.testing.fakenet import FakeNetwork

DURATIONS = {k: 10.0 for k in TIMER_KEYS}
LOCAL = HelloInput(version=1, block_bytes=16, layout="test", hash_seed="")
SPEC = load()
REFS = reference.build(SPEC)


def make_machine(name: str) -> Any:
    if name == "producer":
        return ProducerMachine(DURATIONS)
    if name == "consumer":
        return ConsumerMachine(DURATIONS, lambda peer: True)
    return SessionMachine(
        DURATIONS, LOCAL, gen_base=0, on_peer_down=lambda *a: None, on_ready=lambda *a: None
    )


# -- every name in the spec has an implementation ------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "guards"),
    [(ProducerMachine, ProducerGuard), (ConsumerMachine, ConsumerGuard), (SessionMachine, SessionGuard)],
)
def test_every_guard_has_a_predicate(cls: type, guards: Any) -> None:
    for g in guards:
        assert callable(getattr(cls, f"guard_{g.value}", None)), f"{cls.__name__} lacks guard_{g.value}"


@pytest.mark.parametrize("cls", [ProducerMachine, ConsumerMachine, SessionMachine])
def test_every_effect_has_a_builder(cls: type) -> None:
    for eff in cls.EFFECT_ENUM:
        assert callable(getattr(cls, f"effect_{eff.value}", None)), f"{cls.__name__} lacks effect_{eff.value}"


def test_every_spec_machine_has_a_core_class() -> None:
    assert {ProducerMachine.NAME, ConsumerMachine.NAME, SessionMachine.NAME} == set(SPEC.machines)
    for cls in (ProducerMachine, ConsumerMachine, SessionMachine):
        m = SPEC.machines[cls.NAME]
        assert {k[0].value for k in cls.TABLE} <= {s.name for s in m.states}
        assert {k[1].value for k in cls.TABLE} == set(m.events)
        assert {g.value for g in cls.GUARD_ENUM} == set(m.guards)
        assert {e.value for e in cls.EFFECT_ENUM} == set(m.effects)


# -- exhaustive agreement: State x Event x guard valuation ---------------------------------------


def _cases(name: str) -> Iterator[tuple[str, str, dict[str, bool]]]:
    m = SPEC.machines[name]
    ref = REFS[name]
    for s in m.states:
        if s.name in m.final:
            continue
        for event in m.events:
            for valuation in reference.valuations(ref.guards_of(s.name, event)):
                yield s.name, event, valuation


def _exhaustive(name: str) -> dict[str, int]:
    """For each state, each event and each assignment of the rule's guards, the generated-table
    core and the transitions reference take the same branch: destination, effect builders run (in
    order), reason, armed timer, re-arming; rejects raise in both."""
    ref = REFS[name]
    spec_m = SPEC.machines[name]
    counts = {"transition": 0, "ignore": 0, "reject": 0}
    for n, (state, event, valuation) in enumerate(_cases(name)):
        machine = make_machine(name)
        current = dict(valuation)
        machine._guards = {g: (lambda rec, inp, g=g: current.get(g.value, False)) for g in machine.GUARD_ENUM}
        # effect builders are stubbed (their inputs are not built here) except the timer one
        machine._effects = {
            e: (f if e.value == "restart_timer" else (lambda *args: None)) for e, f in machine._effects.items()
        }
        shadow = reference.Shadow(machine, ref)
        key = f"k{n}"
        rec = machine.new_record(key)
        st = machine.INITIAL.__class__(state)
        if st is not machine.INITIAL:
            rec = machine.enter(rec, st, 1.0)
            shadow.models[key] = ref.new_model(key, state)
        ev = type(next(iter(machine.TABLE))[1])(event)
        rule = spec_m.rules[(state, event)]
        try:
            machine.apply(rec, ev, None, 1.0, [])
        except InvalidTransition as exc:
            assert rule.kind == "reject", (state, event)
            assert (exc.machine, exc.state, exc.event, exc.reason) == (name, state, event, rule.reason)
            counts["reject"] += 1
        else:
            counts[rule.kind] += 1
        assert shadow.checked == 1, (state, event, valuation)
        for model in shadow.models.values():
            ref.drop_model(model)
    assert sum(counts.values()) == len(list(_cases(name)))
    return counts


@pytest.mark.parametrize("name", ["producer", "consumer", "session"])
def test_core_agrees_with_the_reference_on_every_state_event_and_guard_value(name: str) -> None:
    counts = _exhaustive(name)
    assert counts["transition"] > 0 and counts["ignore"] > 0


@pytest.mark.parametrize(("bug", "name"), [("reap_forgets_jobs", "producer"), ("write_after_abort", "consumer")])
def test_exhaustive_agreement_catches_a_table_that_drifted_from_the_spec(bug: str, name: str) -> None:
    from tools.planted import PLANTED

    with PLANTED[bug](), pytest.raises(reference.Divergence):
        _exhaustive(name)


def test_reference_machine_has_no_auto_transitions() -> None:
    model = REFS["producer"].new_model("x")
    assert not hasattr(model, "to_parked")
    REFS["producer"].drop_model(model)


# -- effects are returned, never performed -------------------------------------------------------


@pytest.fixture
def no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket, file or clock use by the core fails the test."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the lifecycle core performed I/O or read a clock")

    monkeypatch.setattr(socket, "socket", forbidden)
    monkeypatch.setattr(builtins, "open", forbidden)
    for fn in ("time", "monotonic", "perf_counter", "sleep", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time, fn, forbidden)


def _all_effect_types() -> tuple[type, ...]:
    return tuple(
        v for v in vars(effects_mod).values() if isinstance(v, type) and attrs.has(v) and v.__module__ == effects_mod.__name__
    )


def test_effects_are_returned_not_performed(no_io: None) -> None:
    settings = CoreSettings(durations=DURATIONS)
    p, c = TierCore(settings, LOCAL), TierCore(settings, LOCAL, gen_base=100)
    net = FakeNetwork()
    net.attach("p", p)
    net.attach("c", c)
    seen: list[Any] = []
    now = 0.0
    seen += p.store(StoreInput("A", "r1", 1, (b"k1", b"k2"), (3, 4)), now)
    for eff_list in (c.announce("A", "p", now), c.submit_load(LoadInput("A", 2, (b"k1", b"k2"), (7, 8)), now)):
        seen += eff_list
        net.route("c", eff_list, now)
    while net.directions() or net.transfers:
        for src, dst in net.directions():
            _, effs = net.deliver(src, dst, 0, now)
            seen += effs
        if net.transfers:
            _, effs = net.finish_transfer(0, now)
            seen += effs
    seen += p.tick(100.0) + c.tick(100.0)
    kinds = _all_effect_types()
    assert seen and all(isinstance(e, kinds) for e in seen)
    for e in seen:
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(e, attrs.fields(type(e))[0].name, None)
    names = {type(e).__name__ for e in seen}
    assert {"SendBlocks", "LandBlocks", "SendReceipt", "JobDone", "SendFetch"} <= names
    assert p.pending_jobs() == 0 and c.pending_jobs() == 0


# -- reject leaves the record unchanged ----------------------------------------------------------


def _snapshot(rec: Any) -> dict[str, Any]:
    out = {}
    for klass in type(rec).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            v = getattr(rec, slot)
            out[slot] = v.copy() if isinstance(v, (dict, list, bytearray)) else v
    return out


@pytest.mark.parametrize("name", ["producer", "consumer", "session"])
def test_reject_rules_raise_and_leave_the_record_unchanged(name: str) -> None:
    spec_m = SPEC.machines[name]
    rejects = [(s, e, r) for (s, e), r in spec_m.rules.items() if r.kind == "reject"]
    for state, event, rule in rejects:
        machine = make_machine(name)
        rec = machine.new_record("k")
        st = machine.INITIAL.__class__(state)
        rec.state = st
        if st is not machine.INITIAL:
            machine.records["k"] = rec
        before = _snapshot(rec)
        records_before = dict(machine.records)
        ev_cls = type(next(iter(machine.TABLE))[1])
        with pytest.raises(InvalidTransition) as info:
            machine.apply(rec, ev_cls(event), None, 1.0, [])
        assert (info.value.state, info.value.event, info.value.reason) == (state, event, rule.reason)
        assert _snapshot(rec) == before
        assert machine.records == records_before
    if name == "consumer":
        assert rejects, "the consumer spec rejects submit_load for an unannounced id"


def test_submit_load_before_announce_raises_and_creates_nothing() -> None:
    core = TierCore(CoreSettings(durations=DURATIONS), LOCAL)
    with pytest.raises(InvalidTransition) as info:
        core.submit_load(LoadInput("A", 1, (b"k",), (0,)), 0.0)
    assert info.value.reason == "not_announced"
    assert "A" not in core.consumer.records and core.pending_jobs() == 0


# -- deadlines cost O(expired) -------------------------------------------------------------------


class _CountingHeapq:
    def __init__(self, real: Any) -> None:
        self.real = real
        self.pops = 0

    def heappop(self, heap: list) -> Any:
        self.pops += 1
        return self.real.heappop(heap)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_tick_with_nothing_due_pops_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    durations = dict(DURATIONS, unbound_store_timeout_s=100.0, tombstone_retention_s=1000.0)
    m = ProducerMachine(durations, tombstone_max=100_000)
    out: list[Any] = []
    for i in range(20_000):
        m.store(StoreInput(f"id{i}", f"r{i}", i, (b"k",), (i,)), 0.0, out)
    for i in range(10_000):
        m.abort_fetch(FetchInput("c", f"id{i}", 0), 0.0, out)
    states = {m.state_of(f"id{i}").value for i in (0, 19_999)}
    assert states == {"tombstoned", "parked"}
    counter = _CountingHeapq(deadlines_mod.heapq)
    monkeypatch.setattr(deadlines_mod, "heapq", counter)
    out.clear()
    t0 = time.perf_counter()
    fired = m.tick(50.0, out)
    elapsed = time.perf_counter() - t0
    assert fired == 0 and out == [] and counter.pops == 0
    assert elapsed < 0.05, f"an idle tick over 20k records took {elapsed * 1000:.1f} ms"
    # exactly the expired ones are handled when they are due
    fired = m.tick(100.0, out)
    assert fired == 10_000
    assert counter.pops <= 10_000 + 10_000  # the fired entries plus at most the stale ones superseded
    counter.pops = 0
    assert m.tick(150.0, out) == 0 and counter.pops == 0


def test_drain_respects_the_tombstone_count_cap() -> None:
    m = ProducerMachine(DURATIONS, tombstone_max=2)
    out: list[Any] = []
    for i in range(5):
        m.store(StoreInput(f"id{i}", "r", i, (b"k",), (i,)), 0.0, out)
    m.broadcast(ProducerEvent.DRAIN, 1.0, out)  # what TierCore.drain does
    assert len(m.retained) <= 2
