"""A second, independent interpreter of ``spec/lifecycle.toml``, built on ``transitions``.

The runtime core (:mod:`kvtier.lifecycle`) applies the *generated* table
(``kvtier/lifecycle/_table.py``).  This module builds a ``transitions.Machine`` straight from the
*spec records* (:func:`tools.spec.load`) — no generated code involved — so tests can check
that the generator, the table and the core's ``apply`` all agree with the spec:

* one ``transitions`` model per record (``auto_transitions=False``: no ``to_<state>()`` back
  doors); guards are ``conditions`` callables that read a guard valuation (``dict[guard, bool]``)
  set on the model before each input, guarded branches in spec order and the fallback last;
* an **ignore** rule is an internal transition that only records its reason (the
  ``ignore_invalid_triggers`` behaviour, but per (state, event) and with the reason kept);
* a **reject** rule raises :class:`Rejected` (the core raises ``InvalidTransition``);
* timers follow the spec's rule: a timer is armed on entering a state that names it, kept while
  moving between two states naming the same timer, re-armed by ``restart_timer``, disarmed on
  leaving.

:class:`Shadow` attaches a reference to a live core machine and checks every ``apply`` the core
makes (including the ones made from ``tick``, ``peer_lost`` or the tombstone cap) against the
reference: same branch, same destination, same effect *builders invoked*, same timer.  It is the
heart of ``tests/lifecycle/test_differential.py``.

transitions is a test/dev dependency; nothing in ``kvtier.lifecycle`` imports this module.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
from transitions import Machine, MachineError, State

from tools import spec as specmod

__all__ = ["Divergence", "Outcome", "ReferenceMachine", "Rejected", "Shadow", "build", "shadow_core", "valuations"]


class Rejected(Exception):
    """The spec rejects this input in this state (a reject rule). The model is unchanged."""

    def __init__(self, machine: str, state: str, event: str, reason: str) -> None:
        super().__init__(f"{machine}: {event!r} rejected in {state!r} ({reason})")
        self.machine, self.state, self.event, self.reason = machine, state, event, reason


class Divergence(AssertionError):
    """The core and the reference disagree about one input."""


@attrs.frozen
class Outcome:
    """What the reference did with one input."""

    kind: str
    """``transition``, ``ignore`` or ``reject``."""
    state: str
    """State after the input."""
    guard: str | None = None
    """Guard of the branch taken (None: the fallback, or not a transition)."""
    effects: tuple[str, ...] = ()
    """Effect names of the branch taken, in order."""
    reason: str | None = None
    """The branch's reason code (transition), or the rule's (ignore / reject)."""
    timer: str | None = None
    """Timer armed after the input (None: none)."""
    rearmed: bool = False
    """The input (re)started the timer: entered a state with another timer, or restart_timer."""


class _Model:
    """One record's model. Identity equality (transitions dedups models with ``==``)."""

    def __init__(self, key: Any) -> None:
        self.key = key
        self.valuation: Mapping[str, bool] = {}
        self.outcome: Outcome | None = None
        self.timer: str | None = None


class _Guard:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, event_data: Any) -> bool:
        try:
            return bool(event_data.model.valuation[self.name])
        except KeyError:
            raise KeyError(f"guard {self.name!r} has no value in the valuation") from None


class _Taken:
    """``after`` callback of one branch: records the outcome and updates the timer."""

    __slots__ = ("branch", "state_timer")

    def __init__(self, branch: specmod.Branch, state_timer: Mapping[str, str | None]) -> None:
        self.branch = branch
        self.state_timer = state_timer

    def __call__(self, event_data: Any) -> None:
        model = event_data.model
        b = self.branch
        new_timer = self.state_timer[b.dest]
        rearmed = False
        if new_timer != model.timer:
            model.timer = new_timer
            rearmed = new_timer is not None
        if "restart_timer" in b.effects and model.timer is not None:
            rearmed = True
        model.outcome = Outcome("transition", b.dest, b.guard, b.effects, b.reason, model.timer, rearmed)


class _Ignored:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __call__(self, event_data: Any) -> None:
        model = event_data.model
        model.outcome = Outcome("ignore", model.state, None, (), self.reason, model.timer, False)


class _Reject:
    __slots__ = ("machine", "event", "reason")

    def __init__(self, machine: str, event: str, reason: str) -> None:
        self.machine, self.event, self.reason = machine, event, reason

    def __call__(self, event_data: Any) -> None:
        raise Rejected(self.machine, event_data.model.state, self.event, self.reason)


class ReferenceMachine:
    """A ``transitions.Machine`` for one spec machine; one model per record key."""

    def __init__(self, m: specmod.Machine) -> None:
        self.spec = m
        self.name = m.name
        self.state_timer = {s.name: s.timer for s in m.states}
        transitions: list[dict[str, Any]] = []
        for s in m.states:  # spec order: deterministic machine construction
            for event in m.events:
                rule = m.rules.get((s.name, event))
                if rule is None:
                    continue
                if rule.kind == "transition":
                    ordered = [b for b in rule.branches if b.guard] + [b for b in rule.branches if not b.guard]
                    for b in ordered:
                        transitions.append(
                            {
                                "trigger": event,
                                "source": s.name,
                                "dest": b.dest,
                                "conditions": [_Guard(b.guard)] if b.guard else [],
                                "after": [_Taken(b, self.state_timer)],
                            }
                        )
                elif rule.kind == "ignore":
                    transitions.append(
                        {"trigger": event, "source": s.name, "dest": None, "after": [_Ignored(rule.reason or "")]}
                    )
                else:
                    transitions.append(
                        {
                            "trigger": event,
                            "source": s.name,
                            "dest": None,
                            "prepare": [_Reject(m.name, event, rule.reason or "")],
                        }
                    )
        self.machine = Machine(
            model=[],
            states=[State(s.name, final=s.name in m.final) for s in m.states],
            transitions=transitions,
            initial=m.initial,
            auto_transitions=False,
            send_event=True,
            ignore_invalid_triggers=False,
            name=m.name,
        )

    def new_model(self, key: Any = None, state: str | None = None) -> _Model:
        """A model for ``key`` in ``state`` (default: the initial state), timer as on entry."""
        model = _Model(key)
        st = state if state is not None else self.spec.initial
        self.machine.add_model(model, initial=st)
        model.timer = self.state_timer[st]
        return model

    def drop_model(self, model: _Model) -> None:
        self.machine.remove_model(model)

    def fire(self, model: _Model, event: str, valuation: Mapping[str, bool] | None = None) -> Outcome:
        """Apply ``event`` to ``model`` with the guard ``valuation``.

        Raises:
            Rejected: a reject rule (the model is unchanged).
            MachineError: no rule at all (a final state; the spec validator forbids anything
                else).
        """
        model.valuation = valuation or {}
        model.outcome = None
        model.trigger(event)
        if model.outcome is None:  # pragma: no cover - every rule records an outcome
            raise MachineError(f"{self.name}: {event!r} in {model.state!r} recorded no outcome")
        return model.outcome

    def guards_of(self, state: str, event: str) -> tuple[str, ...]:
        """Guards the (state, event) rule evaluates, in branch order."""
        rule = self.spec.rules.get((state, event))
        if rule is None or rule.kind != "transition":
            return ()
        return tuple(b.guard for b in rule.branches if b.guard)


def valuations(guards: tuple[str, ...]) -> Iterator[dict[str, bool]]:
    """Every assignment of True/False to ``guards`` (one empty dict when there are none)."""
    for values in itertools.product((False, True), repeat=len(guards)):
        yield dict(zip(guards, values))


def build(spec: specmod.Spec | None = None) -> dict[str, ReferenceMachine]:
    """One :class:`ReferenceMachine` per spec machine (loads the spec file by default)."""
    spec = spec if spec is not None else specmod.load()
    return {name: ReferenceMachine(m) for name, m in spec.machines.items()}


class Shadow:
    """Check every ``apply`` of a live core machine against a :class:`ReferenceMachine`.

    Installs an instance-level ``apply`` on ``machine`` (a
    :class:`kvtier.lifecycle._machine.TableMachine`) and wraps its effect builders to record which
    ones run (:meth:`~kvtier.lifecycle._machine.TableMachine.compile` rebuilds the machine's rules
    with them).  Before each input it evaluates *every* guard of the (state, event) rule with the
    core's own predicates, hands that valuation to the reference, then lets the core apply the
    input and compares: kind (transition / ignore / reject), destination state, effect builders
    invoked (names, in order), reason, armed timer and whether it was re-armed — and that a
    state with a timer always has a live deadline.  A mismatch raises :class:`Divergence`.

    The shadow sees what ``apply`` is given (the record, the event, the input) and the machine's
    public answers (``timer_token``); it keeps its own model per record key.

    Attributes:
        checked: inputs compared so far.
        trace: the last ``keep`` (key, state, event, outcome) tuples, for failure reports.
    """

    def __init__(self, machine: Any, ref: ReferenceMachine, *, keep: int = 50) -> None:
        self.machine = machine
        self.ref = ref
        self.models: dict[Any, _Model] = {}
        self.checked = 0
        self.trace: list[tuple[Any, str, str, Outcome | str]] = []
        self._keep = keep
        self._invoked: list[str] = []
        self._orig_apply = machine.apply
        for e in machine.EFFECT_ENUM:
            name = f"effect_{e.value}"
            setattr(machine, name, self._recorder(e.value, getattr(machine, name)))
        machine.compile()
        machine.apply = self.apply

    def _recorder(self, name: str, fn: Any) -> Any:
        invoked = self._invoked

        def effect(rec: Any, inp: Any, reason: Any, now: float, out: list[Any]) -> None:
            invoked.append(name)
            fn(rec, inp, reason, now, out)

        return effect

    def detach(self) -> None:
        """Stop checking (the core keeps working; the effect recorders stay, harmlessly)."""
        self.machine.apply = self._orig_apply

    def _model_for(self, rec: Any) -> _Model:
        key = rec.key
        model = self.models.get(key)
        if rec.state is self.machine.INITIAL:  # a record in the initial state is a fresh one
            if model is not None:
                self.ref.drop_model(model)
            model = self.ref.new_model(key)
            self.models[key] = model
        elif model is None or model.state != rec.state.value:
            raise Divergence(
                f"{self.ref.name} {key!r}: core record is in {rec.state.value!r} but the reference model is in "
                f"{getattr(model, 'state', None)!r} (state changed outside apply)"
            )
        return model

    def apply(self, rec: Any, event: Any, inp: Any, now: float, out: list[Any]) -> Any:
        from kvtier.lifecycle.errors import InvalidTransition

        model = self._model_for(rec)
        state, ev = rec.state.value, event.value
        machine = self.machine
        valuation = {g: bool(getattr(machine, f"guard_{g}")(rec, inp, now)) for g in self.ref.guards_of(state, ev)}
        try:
            expected: Outcome | Rejected = self.ref.fire(model, ev, valuation)
        except Rejected as exc:
            expected = exc
        self._invoked.clear()
        key = rec.key
        old_tseq = machine.timer_token(key)
        old_reason = rec.reason
        n_out = len(out)
        where = f"{self.ref.name} {rec.key!r}: {ev!r} in {state!r} with guards {valuation}"
        try:
            took = self._orig_apply(rec, event, inp, now, out)
        except InvalidTransition as exc:
            if not isinstance(expected, Rejected):
                raise Divergence(f"{where}: core raised {exc}, reference did {expected}") from exc
            if exc.reason != expected.reason or rec.state.value != state:
                raise Divergence(f"{where}: reject differs: core {exc.reason!r}, reference {expected.reason!r}") from exc
            self._note(rec.key, state, ev, "reject")
            self.checked += 1
            raise
        if isinstance(expected, Rejected):
            raise Divergence(f"{where}: reference rejects ({expected.reason}) but the core applied it")
        got_kind = "transition" if took else "ignore"
        problems = []
        if got_kind != expected.kind:
            problems.append(f"kind: core {got_kind}, reference {expected.kind}")
        if rec.state.value != expected.state:
            problems.append(f"state: core {rec.state.value!r}, reference {expected.state!r}")
        if tuple(self._invoked) != expected.effects:
            problems.append(f"effects: core {tuple(self._invoked)}, reference {expected.effects}")
        if took:
            # a move records the branch's reason (or, for a branch without one, the input's, else
            # the record keeps its own); a self-transition keeps the record's reason
            moved = expected.state != state
            want = (expected.reason or getattr(inp, "reason", None) or old_reason) if moved else old_reason
            core_reason = rec.reason.value if rec.reason is not None else None
            want_reason = want.value if hasattr(want, "value") else want
            if core_reason != want_reason:
                problems.append(f"reason: core {core_reason!r}, reference {want_reason!r} (branch {expected.reason!r})")
        else:
            ignored = out[n_out:]
            core_reason = getattr(ignored[-1], "reason", None) if ignored else None
            if core_reason != expected.reason:
                problems.append(f"ignore reason: core {core_reason!r}, reference {expected.reason!r}")
        final = rec.state in machine.FINAL or rec.state is machine.INITIAL
        if not final:
            if rec.timer != expected.timer:
                problems.append(f"timer: core {rec.timer!r}, reference {expected.timer!r}")
            tseq = machine.timer_token(key)
            if expected.rearmed and (tseq == old_tseq or tseq == 0):
                problems.append("timer: reference re-armed it, the core did not")
            if (
                expected.timer is not None
                and not expected.rearmed
                and expected.kind == "transition"
                and old_tseq
                and tseq != old_tseq
            ):
                problems.append("timer: the core re-armed it, the reference did not")
            if expected.timer is not None and tseq == 0:
                problems.append(f"timer {expected.timer!r} is armed per the spec but the core has no live deadline")
        if problems:
            raise Divergence(where + ": " + "; ".join(problems))
        self.checked += 1
        self._note(rec.key, state, ev, expected)
        if final:
            self.ref.drop_model(model)
            self.models.pop(rec.key, None)
        return took

    def _note(self, key: Any, state: str, event: str, what: Outcome | str) -> None:
        self.trace.append((key, state, event, what))
        if len(self.trace) > self._keep:
            del self.trace[: len(self.trace) - self._keep]


def shadow_core(core: Any, refs: Mapping[str, ReferenceMachine] | None = None) -> dict[str, Shadow]:
    """Attach a :class:`Shadow` to each machine of a :class:`~kvtier.lifecycle.TierCore`."""
    refs = refs if refs is not None else build()
    return {name: Shadow(machine, refs[name]) for name, machine in core.machines().items()}
