"""The sans-I/O core against the spec: exhaustive table agreement with an independent reference
interpreter, effects returned (never performed), rejects that leave records untouched, and
deadline handling that costs O(expired)."""

from __future__ import annotations

import builtins
import socket
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from kvtier.lifecycle import InvalidTransition, TierCore
from kvtier.lifecycle import deadlines as deadlines_mod
from kvtier.lifecycle import effects as effects_mod
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle._table import ConsumerGuard, ProducerGuard, SessionGuard
from kvtier.lifecycle.consumer import ConsumerMachine
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.notes import Notes
from kvtier.lifecycle.probe import ProbeMachine
from kvtier.lifecycle.producer import ProducerMachine
from kvtier.lifecycle.serve import ServeMachine
from kvtier.lifecycle.session import HelloInput, SessionMachine
from kvtier.wire import messages as wm
from tools import reference, snapshot
from tools.coreview import CoreView
from tools.fakenet import FakeNetwork
from tools.spec import load

DURATIONS = {k: 10.0 for k in TIMER_KEYS}
LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="test", hash_seed="", instance="test")
SPEC = load()
REFS = reference.build(SPEC)


def make_machine(name: str) -> Any:
    """A machine on its own (the exhaustive agreement drives one machine at a time)."""
    if name == "producer":
        return ProducerMachine(DURATIONS)
    sessions = SessionMachine(DURATIONS, LOCAL, Notes(), gen_base=0)
    if name == "consumer":
        return ConsumerMachine(DURATIONS, sessions, Notes())
    return sessions


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
    machines = (ProducerMachine, ConsumerMachine, SessionMachine, ProbeMachine, ServeMachine)
    assert {cls.NAME for cls in machines} == set(SPEC.machines)
    for cls in machines:
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
        for g in machine.GUARD_ENUM:
            setattr(machine, f"guard_{g.value}", lambda rec, inp, now, g=g: current.get(g.value, False))
        # effect builders are stubbed (their inputs are not built here) except the timer one
        for e in machine.EFFECT_ENUM:
            if e.value != "restart_timer":
                setattr(machine, f"effect_{e.value}", lambda *args: None)
        machine.compile()
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
        v for v in vars(effects_mod).values()
        if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == effects_mod.__name__
    )


def test_effects_are_returned_not_performed(no_io: None) -> None:
    settings = CoreSettings(durations=DURATIONS)
    p, c = TierCore(settings, LOCAL), TierCore(settings, LOCAL, gen_base=100)
    net = FakeNetwork()
    net.attach("p", p)
    net.attach("c", c)
    seen: list[Any] = []
    now = 0.0
    seen += net.apply("p", ix.StoreSubmitted("A", "r1", 1, (b"k1", b"k2"), (3, 4)), now)
    seen += net.apply("c", ix.LoadAnnounced("A", "p"), now)
    seen += net.apply("c", ix.LoadSubmitted("A", 2, (b"k1", b"k2"), (7, 8)), now)
    while net.directions() or net.transfers:
        for src, dst in net.directions():
            _, effs = net.deliver(src, dst, 0, now)
            seen += effs
        if net.transfers:
            _, effs = net.finish_transfer(0, now)
            seen += effs
    seen += p.fire(100.0) + c.fire(100.0)
    kinds = _all_effect_types()
    assert seen and all(isinstance(e, kinds) for e in seen)
    for e in seen:
        with pytest.raises(AttributeError):
            setattr(e, type(e).__struct_fields__[0], None)
    names = {type(e).__name__ for e in seen}
    assert {"SendBlocks", "LandBlocks", "Send", "JobDone", "OpenConnection", "AttachPeer"} <= names
    sent = {e.msg.TYPE for e in seen if isinstance(e, effects_mod.Send)}
    assert {"hello", "hello_ack", "fetch", "receipt"} <= sent
    assert CoreView(p).pending_jobs() == 0 and CoreView(c).pending_jobs() == 0


# -- reject leaves the core unchanged ------------------------------------------------------------

#: (machine, event) of each reject rule -> the engine input that hits it on a fresh core
REJECT_INPUTS = {("consumer", "submit_load"): ix.LoadSubmitted("A", 1, (b"k",), (0,))}


@pytest.mark.parametrize("name", ["producer", "consumer", "session"])
def test_reject_rules_raise_and_leave_the_core_unchanged(name: str) -> None:
    spec_m = SPEC.machines[name]
    rejects = [(s, e, r) for (s, e), r in spec_m.rules.items() if r.kind == "reject"]
    for state, event, rule in rejects:
        assert state == spec_m.initial and (name, event) in REJECT_INPUTS, (
            f"teach this test to reach the reject rule ({name}, {state}, {event})")
        core = TierCore(CoreSettings(durations=DURATIONS), LOCAL)
        before = snapshot.export(core)
        with pytest.raises(InvalidTransition) as info:
            core.handle(REJECT_INPUTS[(name, event)], 1.0)
        assert (info.value.machine, info.value.state, info.value.event, info.value.reason) == (
            name, state, event, rule.reason)
        assert snapshot.export(core) == before
    if name == "consumer":
        assert rejects, "the consumer spec rejects submit_load for an unannounced id"


def test_submit_load_before_announce_raises_and_creates_nothing() -> None:
    core = TierCore(CoreSettings(durations=DURATIONS), LOCAL)
    with pytest.raises(InvalidTransition) as info:
        core.handle(ix.LoadSubmitted("A", 1, (b"k",), (0,)), 0.0)
    assert (info.value.key, info.value.reason) == ("A", "not_announced")
    assert str(info.value) == "consumer 'A': input 'submit_load' is not allowed in state 'absent' (not_announced)"
    assert CoreView(core).consumer_ids() == [] and core.consumer("A") is None and CoreView(core).pending_jobs() == 0


# -- deadlines cost O(expired) -------------------------------------------------------------------


def _ready_producer(durations: dict[str, float], **kw: Any) -> TierCore:
    """A producer core with a ready inbound session from ``c`` (gen 7)."""
    p = TierCore(CoreSettings(durations=durations, **kw), LOCAL)
    p.handle(ix.Received("c", wm.Hello(gen=7, version=wm.PROTOCOL_VERSION, instance="c", block_bytes=16,
                                        layout="test", hash_seed="")), 0.0)
    p.handle(ix.PeerAttached("c", 7), 0.0)
    assert CoreView(p).session_ready("c")
    return p


def test_tick_with_nothing_due_pops_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    durations = dict(DURATIONS, unbound_store_timeout_s=100.0, tombstone_retention_s=1000.0, heartbeat_interval_s=1000.0,
                     peer_timeout_s=1000.0)
    p = _ready_producer(durations, tombstone_max=100_000)
    for i in range(20_000):
        p.handle(ix.StoreSubmitted(f"id{i}", f"r{i}", i, (b"k",), (i,)), 0.0)
    for i in range(10_000):
        p.handle(ix.Received("c", wm.AbortFetch(gen=7, kv_request_id=f"id{i}", round=0, fetched=False)), 0.0)
    states = {p.producer_state(f"id{i}").value for i in (0, 19_999)}
    assert states == {"tombstoned", "parked"}
    popped = []
    real = deadlines_mod.DeadlineQueue.pop_due_at

    def counting(self: Any, now: float, is_live: Any) -> Any:
        due = real(self, now, is_live)
        if due is not None:
            popped.append(due[1])
        return due

    monkeypatch.setattr(deadlines_mod.DeadlineQueue, "pop_due_at", counting)
    t0 = time.perf_counter()
    out = p.fire(50.0)
    elapsed = time.perf_counter() - t0
    assert out == [] and popped == []
    assert elapsed < 0.05, f"an idle tick over 20k records took {elapsed * 1000:.1f} ms"
    # exactly the expired ones are handled when they are due
    out = p.fire(100.0)
    reaped = [e for e in out if isinstance(e, effects_mod.JobDone)]
    assert len(reaped) == 10_000 and {e.reason for e in reaped} == {"reaped"}
    assert len(popped) == 10_000
    popped.clear()
    assert p.fire(150.0) == [] and popped == []


def test_drain_respects_the_tombstone_count_cap() -> None:
    core = TierCore(CoreSettings(durations=DURATIONS, tombstone_max=2), LOCAL)
    for i in range(5):
        core.handle(ix.StoreSubmitted(f"id{i}", "r", i, (b"k",), (i,)), 0.0)
    out = core.handle(ix.DrainStarted(), 1.0)
    assert sorted(e.job_id for e in out if isinstance(e, effects_mod.JobDone)) == list(range(5))
    assert CoreView(core).retained() <= 2 and CoreView(core).evicted() == 3
