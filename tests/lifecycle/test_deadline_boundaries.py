"""Every timer of every machine fires exactly at its deadline: not a representable instant before it,
and at it.  The (state, timer) pairs come from the generated tables (``*_STATE_TIMER``,
``*_TIMERS``), so a state or timer added to ``spec/`` is covered without touching this file.

Each record is put straight into its state (``TableMachine.enter``, as a transition would: its
timer armed from ``t0``); guards and effects are stubbed (as in test_core's exhaustive agreement)
because only the timing is under test here.  Durations differ per config key, so a timer that
read another timer's duration is caught too.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from kvtier.lifecycle.consumer import ConsumerMachine, RoundCounter
from kvtier.lifecycle.core import TIMER_KEYS
from kvtier.lifecycle.notes import Notes
from kvtier.lifecycle.probe import ProbeMachine
from kvtier.lifecycle.producer import ProducerMachine
from kvtier.lifecycle.serve import ServeLimits, ServeMachine
from kvtier.lifecycle.session import HelloInput, SessionMachine
from kvtier.wire import messages as wm

#: a distinct, non-round duration per config key (seconds)
DURATIONS = {k: 1.25 + 0.5 * i for i, k in enumerate(TIMER_KEYS)}
LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="test", hash_seed="", instance="test")
T0 = 1000.0


def _machine(name: str) -> Any:
    sessions = SessionMachine(DURATIONS, LOCAL, Notes(), gen_base=0)
    return {
        "producer": lambda: ProducerMachine(DURATIONS),
        "consumer": lambda: ConsumerMachine(DURATIONS, sessions, Notes()),
        "session": lambda: sessions,
        "probe": lambda: ProbeMachine(DURATIONS, sessions, Notes(), RoundCounter()),
        "serve": lambda: ServeMachine(DURATIONS, Notes(), ServeLimits()),
    }[name]()


def _timed_states() -> list[tuple[str, str, str]]:
    """(machine, state, timer) for every state the tables give a timer."""
    out = []
    for name in ("producer", "consumer", "session", "probe", "serve"):
        cls = type(_machine(name))
        for state, timer in cls.STATE_TIMER.items():
            if timer is not None:
                out.append((name, state.value, timer))
    return out


CASES = _timed_states()


def test_every_machine_has_timed_states() -> None:
    assert {name for name, _, _ in CASES} == {"producer", "consumer", "session", "probe", "serve"}


@pytest.mark.parametrize(("name", "state", "timer"), CASES, ids=[f"{n}-{s}" for n, s, _ in CASES])
def test_a_timer_fires_exactly_at_its_deadline(name: str, state: str, timer: str) -> None:
    m = _machine(name)
    fired: list[Any] = []
    for g in m.GUARD_ENUM:
        setattr(m, f"guard_{g.value}", lambda rec, inp, now: False)
    for e in m.EFFECT_ENUM:
        if e.value != "restart_timer":
            setattr(m, f"effect_{e.value}", lambda *args: None)
    m.compile()
    real_apply = m.apply

    def apply(rec: Any, event: Any, inp: Any, now: float, out: list) -> bool:
        fired.append((rec.key, event, now))
        return real_apply(rec, event, inp, now, out)

    m.apply = apply
    st = type(m.INITIAL)(state)
    key = ("c1", "A", 7) if name == "serve" else "A"
    rec = m.enter(m.new_record(key), st, T0)
    duration = DURATIONS[m.TIMERS[timer].config_key]
    deadline = T0 + duration
    assert m.deadline_of(rec.key) == deadline
    assert m.next_deadline() == deadline

    before = math.nextafter(deadline, -math.inf)  # the last representable instant before it
    assert m.tick(before, []) == 0 and fired == []
    assert m.records[rec.key].state is st  # nothing happened

    assert m.tick(deadline, []) == 1
    assert fired == [(rec.key, m.TIMERS[timer].event, deadline)]
    assert m.tick(deadline, []) == 0 and len(fired) == 1  # once, not again at the same instant
