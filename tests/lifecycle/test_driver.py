"""The order of one tick (:mod:`kvtier.lifecycle.driver`): inputs and their consequences first,
then the deadlines due by ``deadlines_at`` (no later than what the caller still holds), and what
the performers report applied at the tick's ``now`` before anything after it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtier.lifecycle import ProducerState, Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.driver import drive, settle
from kvtier.lifecycle.effects import JobDone
from tests.lifecycle.scenario_pair import Pair, keys


class Performer:
    """Records what it was asked to perform; reports a store of ``B`` once it sees A's reap."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def __call__(self, effects: Sequence[Any]) -> list[Any]:
        self.calls.append(list(effects))
        if any(isinstance(e, JobDone) and e.reason == Reason.REAPED for e in effects):
            return [ix.StoreSubmitted("B", "req-B", 99, keys("B", 1), (7,))]
        return []


def test_what_a_deadline_leads_to_is_applied_at_the_ticks_now() -> None:
    s = Pair()
    s.store("A", 1, 0.0)
    perform = Performer()
    drive(s.p, [], 70.0, deadlines_at=60.0, perform=perform)  # A's reap (T_park 60 s) is due
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    assert s.p.producer_state("B") is ProducerState.PARKED
    (b,) = [v for v in s.p.records().producers if v.kv_request_id == "B"]
    assert b.deadline == 70.0 + 60.0  # parked at the tick's now, not at the deadline's time


def test_no_deadline_fires_past_what_the_caller_still_holds_or_without_deadlines_at() -> None:
    s = Pair()
    s.store("A", 1, 0.0)
    perform = Performer()
    drive(s.p, [], 70.0, deadlines_at=None, perform=perform)
    assert s.p.producer_state("A") is ProducerState.PARKED
    drive(s.p, [], 70.0, deadlines_at=65.0, perform=perform, held=lambda: 59.0)  # an input read at 59
    assert s.p.producer_state("A") is ProducerState.PARKED
    drive(s.p, [], 70.0, deadlines_at=65.0, perform=perform, held=lambda: 60.0)
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED


def test_the_performer_is_asked_only_when_there_is_something_to_perform() -> None:
    s = Pair()
    perform = Performer()
    drive(s.p, [ix.StoreSubmitted("A", "req-A", 1, keys("A", 1), (0,))], 1.0, deadlines_at=1.0, perform=perform)
    assert s.p.producer_state("A") is ProducerState.PARKED
    assert perform.calls == []  # a store that parks has no effect to perform


class ScriptedCore:
    """Answers each input with the effects a script names, and records what it handled when."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script, self.handled = script, []

    def handle(self, inp: str, now: float) -> list[str]:
        self.handled.append((inp, now))
        return self.script.get(inp, [])


def test_an_inputs_consequences_are_applied_before_the_inputs_reported_after_it() -> None:
    """``e0`` reports x1 and x2; x1's effect reports y: y is applied before x2 (a landing checked
    before the message that followed its block_data), all at the pass's ``now``."""
    core = ScriptedCore({"x1": ["e1"]})
    reports = {"e0": ["x1", "x2"], "e1": ["y"]}
    asked: list[list[str]] = []

    def perform(effects: Sequence[str]) -> list[str]:
        asked.append(list(effects))
        return [inp for e in effects for inp in reports.get(e, [])]

    settle(core, ["e0"], 5.0, perform)  # type: ignore[arg-type]
    assert core.handled == [("x1", 5.0), ("y", 5.0), ("x2", 5.0)]
    assert [a for a in asked if a] == [["e0"], ["e1"]]
    settle(core, [], 6.0, perform)  # type: ignore[arg-type]
    assert core.handled[-1] == ("x2", 5.0)  # nothing to perform: nothing applied


def test_each_input_is_shown_once_applied_and_before_its_effects_are_performed() -> None:
    """``applied`` sees every input — read, reported by a performer, either — right after the core
    applied it and before its effects are performed (the request forensics read the state it left
    its id in, decision E10): a move with no effect is seen too."""
    core = ScriptedCore({"a": ["e1"], "x": ["e2"]})
    reports = {"e1": ["x"]}
    order: list[str] = []

    def perform(effects: Sequence[str]) -> list[str]:
        order.extend(f"perform {e}" for e in effects)
        return [inp for e in effects for inp in reports.get(e, [])]

    def applied(inp: str) -> None:
        assert core.handled[-1][0] == inp  # the core has applied it
        order.append(f"applied {inp}")

    drive(core, ["a", "b"], 1.0, deadlines_at=None, perform=perform, applied=applied)  # type: ignore[arg-type]
    assert order == ["applied a", "perform e1", "applied x", "perform e2", "applied b"]
