"""The one place that applies a generated table to a record.

Every machine (producer, consumer, session) subclasses :class:`TableMachine`, supplying a record
type, guard predicates and effect builders named exactly as in the spec; this class looks the
``(state, event)`` pair up in the generated table, picks the first branch whose guard holds
(fallback last), updates the record, arms or disarms the state's timer, and asks the effect
builders to append effects.  It performs no I/O and reads no clock.

Each rule is *compiled* once per machine, on its first use: its guards and effects become bound
methods, so applying an input is one dict lookup plus the calls the branch names (P4 in
docs/benchmarks.md measures the cost per event).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

from kvtier.lifecycle._table import IGNORE, TRANSITION, Reason, Rule, TimerSpec
from kvtier.lifecycle.deadlines import DeadlineQueue
from kvtier.lifecycle.effects import Effect, Ignored
from kvtier.lifecycle.errors import InvalidTransition

Guard = Callable[[Any, Any, float], bool]


class Due(NamedTuple):
    """A timer event's input for a machine that asks for it (:attr:`TableMachine.DUE_INPUT`):
    when the deadline fell due (seconds; ``now`` is later by how late it fired)."""

    when: float

EffectBuilder = Callable[[Any, Any, "Reason | None", float, list], None]


class Record:
    """Per-key state shared by all machines: small and slotted (one per live id)."""

    __slots__ = ("key", "state", "reason", "timer", "tseq")

    def __init__(self, key: Any, state: Any) -> None:
        self.key = key
        self.state = state
        self.reason: Reason | None = None
        self.timer: str | None = None
        self.tseq = 0


class _CompiledRules(dict):
    """``(state, event)`` -> ``(kind, reason, branches)``, compiled by ``build`` on first lookup;
    ``ops`` caches the per-move timer and index operations the branches share."""

    __slots__ = ("_build", "ops")

    def __init__(self, build: Callable[[tuple[Any, Any]], tuple[Any, Any, tuple]]) -> None:
        super().__init__()
        self._build = build
        self.ops: dict[tuple[Any, Any], tuple[Any, tuple]] = {}

    def __missing__(self, key: tuple[Any, Any]) -> tuple[Any, Any, tuple]:
        value = self[key] = self._build(key)
        return value

    def clear(self) -> None:
        super().clear()
        self.ops.clear()


class TableMachine:
    """Applies one generated table. Subclasses set the class attributes and implement hooks.

    Guards are ``guard_<name>(rec, inp, now) -> bool`` and effects ``effect_<name>(rec, inp,
    reason, now, out)``, where ``inp`` is the input record of the event (``None`` for timer
    events, or :class:`Due` where :attr:`DUE_INPUT` asks), ``now`` the time of the input
    (seconds) and ``reason`` the :class:`Reason` the transition records.
    """

    #: whether timer events carry :class:`Due` (when they fell due) instead of ``None``
    DUE_INPUT: ClassVar[bool] = False

    NAME: ClassVar[str]
    TABLE: ClassVar[Mapping[tuple[Any, Any], Rule]]
    STATE_TIMER: ClassVar[Mapping[Any, str | None]]
    TIMERS: ClassVar[Mapping[str, TimerSpec]]
    INITIAL: ClassVar[Any]
    FINAL: ClassVar[frozenset[Any]]
    GUARD_ENUM: ClassVar[type]
    EFFECT_ENUM: ClassVar[type]

    def __init__(self, durations: Mapping[str, float]) -> None:
        """``durations``: config key -> seconds for every timer of this machine (KeyError names
        the missing key)."""
        self._durations = {name: float(durations[t.config_key]) for name, t in self.TIMERS.items()}
        self.records: dict[Any, Record] = {}
        self._deadlines = DeadlineQueue()
        self._rules = _CompiledRules(self._compile_rule)
        self.ignored = 0

    def compile(self) -> None:
        """Forget the compiled rules, so that each is built again, on its next use, from the table
        and the machine's current ``guard_*`` and ``effect_*`` callables (after a test or a checker
        replaced some on the instance, e.g. to record which effect builders run).  A rule is
        compiled on its first use, not at construction: a core built for one request (a test, a
        model-check state) pays for the rules it applies, not for the whole table (decision V1)."""
        self._rules.clear()

    def _compile_rule(self, key: tuple[Any, Any]) -> tuple[Any, Any, tuple]:
        """The rule for ``(state, event)`` as ``(kind, reason, branches)``, each branch's guard and
        effects bound to this machine (KeyError: the table has no such pair)."""
        rule = self.TABLE[key]
        state = key[0]
        ops = self._rules.ops
        branches = []
        for b in rule.branches:
            moved = b.dest is not state
            if moved and (state, b.dest) not in ops:
                ops[state, b.dest] = (self.retime_op(state, b.dest), self.index_ops(state, b.dest))
            retime, index = ops[state, b.dest] if moved else (None, ())
            guard = getattr(self, f"guard_{b.guard.value}") if b.guard is not None else None
            effects = tuple(getattr(self, f"effect_{e.value}") for e in b.effects)
            branches.append((guard, b.dest, effects, b.reason, moved, retime, index))
        return (rule.kind, rule.reason, tuple(branches))

    # -- hooks ------------------------------------------------------------------------------
    def new_record(self, key: Any) -> Record:  # pragma: no cover - overridden
        return Record(key, self.INITIAL)

    def retime_op(self, old: Any, new: Any) -> Callable[[Any, float], None] | None:
        """What a move from ``old`` to ``new`` does to the record's timer (compiled once per
        pair): disarm the old state's, arm the new state's; None when both name the same one."""
        if self.STATE_TIMER[new] == self.STATE_TIMER[old]:
            return None
        timer = self.STATE_TIMER[new]
        duration = self._durations[timer] if timer else 0.0
        dq, live = self._deadlines, self._is_live

        def retime(rec: Any, now: float) -> None:
            if rec.tseq:  # its entry goes stale (0 first, so a compaction right now drops it)
                rec.tseq = 0
                dq.retire(live, rec.timer)
            rec.timer = timer
            rec.tseq = dq.arm(now + duration, rec.key, timer) if timer else 0

        return retime

    def index_ops(self, old: Any, new: Any) -> tuple[Callable[[Any], None], ...]:
        """Index maintenance for a move from ``old`` to ``new`` (compiled once per pair), run
        after the branch's effects so they see what the effects recorded.  The base class keeps
        ``records``: a record enters it when it leaves the initial state and leaves it (and
        :meth:`on_delete` runs) on reaching a final state or the initial one again."""
        records = self.records
        if new in self.FINAL or new is self.INITIAL:
            def drop(rec: Any) -> None:
                if records.pop(rec.key, None) is not None:
                    self.on_delete(rec)
            return (drop,)
        if old is self.INITIAL:
            def insert(rec: Any) -> None:
                records[rec.key] = rec
            return (insert,)
        return ()

    def on_delete(self, rec: Any) -> None:
        """Called once when a record reaches a final state or falls back to the initial one."""

    # -- applying inputs ---------------------------------------------------------------------
    def record(self, key: Any) -> Any:
        rec = self.records.get(key)
        return rec if rec is not None else self.new_record(key)

    def apply(self, rec: Any, event: Any, inp: Any, now: float, out: list[Effect]) -> bool:
        """Apply ``event`` (with input record ``inp``) to ``rec`` at time ``now`` (seconds).

        Returns False if an ignore rule dropped the input (an :class:`Ignored` effect says so),
        True if a branch was taken.
        Raises :class:`InvalidTransition` for a reject rule (the record is unchanged).
        """
        kind, rule_reason, branches = self._rules[rec.state, event]
        if kind is not TRANSITION:
            if kind is IGNORE:
                self.ignored += 1
                out.append(Ignored(self.NAME, str(rec.key), rec.state, event, rule_reason))
                return False
            raise InvalidTransition(self.NAME, str(rec.key), rec.state.value, event.value, rule_reason.value)
        for guard, new, effects, reason, changed, retime, index in branches:
            if guard is None or guard(rec, inp, now):
                break
        if reason is None:
            reason = getattr(inp, "reason", None) or rec.reason
        if changed:
            rec.reason = reason
            rec.state = new
            if retime is not None:
                retime(rec, now)
        for eff in effects:
            eff(rec, inp, reason, now, out)
        for op in index:
            op(rec)
        return True

    def enter(self, rec: Any, state: Any, now: float) -> Any:
        """Put a fresh record straight into ``state`` at ``now`` (seconds), indexed and with its
        timer armed as if a transition had brought it there; for tests and the model checker,
        which start from arbitrary states.  Returns the record now stored under its key (a
        machine may store a smaller record for some states)."""
        old = rec.state
        rec.state = state
        retime = self.retime_op(old, state)
        if retime is not None:
            retime(rec, now)
        for op in self.index_ops(old, state):
            op(rec)
        return self.records.get(rec.key, rec)

    def timer_token(self, key: Any) -> Any:
        """An opaque token for ``key``'s live deadline: 0 when none; a different value once the
        timer is re-armed (the reference checker compares them)."""
        rec = self.records.get(key)
        return rec.tseq if rec is not None else 0

    def durations_of(self, timer: str) -> float:
        """Seconds timer ``timer`` runs for (its config key's value)."""
        return self._durations[timer]

    def restart_timer(self, rec: Any, now: float) -> None:
        """Restart the record's current timer from ``now``."""
        if rec.timer is not None:
            if rec.tseq:  # its entry goes stale (0 first, so a compaction right now drops it)
                rec.tseq = 0
                self._deadlines.retire(self._is_live, rec.timer)
            rec.tseq = self._deadlines.arm(now + self._durations[rec.timer], rec.key, rec.timer)

    # -- deadlines ---------------------------------------------------------------------------
    def _is_live(self, key: Any, seq: int) -> bool:
        rec = self.records.get(key)
        return rec is not None and rec.tseq == seq

    def next_deadline(self) -> float | None:
        """Earliest pending deadline (seconds, caller's clock) or None."""
        return self._deadlines.next_when(self._is_live)

    def tick(self, now: float, out: list[Effect]) -> int:
        """Fire every deadline due at ``now``; O(expired) amortised. Returns how many fired."""
        fired = 0
        dq = self._deadlines
        due_input = self.DUE_INPUT
        while (due := dq.pop_due_at(now, self._is_live)) is not None:
            rec = self.records[due[1]]
            rec.tseq = 0
            self.apply(rec, self.TIMERS[rec.timer].event, Due(due[0]) if due_input else None, now, out)
            fired += 1
        dq.maybe_compact(len(self.records), self._is_live)
        return fired

    def effect_restart_timer(self, rec: Any, inp: Any, reason: Reason | None, now: float, out: list[Effect]) -> None:
        self.restart_timer(rec, now)

    def live_deadlines(self) -> list[tuple[float, Any, Any]]:
        """``(when, key, timer)`` of every live deadline (for introspection; O(n))."""
        return [(when, key, lane) for when, _seq, key, lane in self._deadlines.live(self._is_live)]

    def deadline_entries(self) -> int:
        """Entries in the deadline queue, stale ones not yet dropped included (O(1))."""
        return len(self._deadlines)

    def deadline_of(self, key: Any) -> float | None:
        """The live deadline of ``key`` if it has one (for tests and introspection; O(n))."""
        rec = self.records.get(key)
        if rec is None or not rec.tseq:
            return None
        return self._deadlines.when_of(key, rec.tseq)
