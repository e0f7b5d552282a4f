"""The one place that applies a generated table to a record.

Every machine (producer, consumer, session) subclasses :class:`TableMachine`, supplying a record
type, guard predicates and effect builders named exactly as in the spec; this class looks the
``(state, event)`` pair up in the generated table, picks the first branch whose guard holds
(fallback last), updates the record, arms or disarms the state's timer, and asks the effect
builders to append effects.  It performs no I/O and reads no clock.

At construction the table is *compiled* once per machine: each rule's guards and effects become
bound methods, so applying an input is one dict lookup plus the calls the branch names (P4 in
docs/benchmarks.md measures the cost per event).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from kvtier.lifecycle._table import IGNORE, TRANSITION, Reason, Rule, TimerSpec
from kvtier.lifecycle.deadlines import DeadlineQueue
from kvtier.lifecycle.effects import Effect, Ignored
from kvtier.lifecycle.errors import InvalidTransition

Guard = Callable[[Any, Any, float], bool]
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


class TableMachine:
    """Applies one generated table. Subclasses set the class attributes and implement hooks.

    Guards are ``guard_<name>(rec, inp, now) -> bool`` and effects ``effect_<name>(rec, inp,
    reason, now, out)``, where ``inp`` is the input record of the event (``None`` for timer
    events), ``now`` the time of the input (seconds) and ``reason`` the :class:`Reason` the
    transition records.
    """

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
        self._rules: dict[tuple[Any, Any], tuple[Any, Any, tuple]] = {}
        self.compile()
        self.ignored = 0

    def compile(self) -> None:
        """(Re)build the rules from the table and the machine's current ``guard_*`` and
        ``effect_*`` callables (at construction; again after a test or a checker replaced some on
        the instance, e.g. to record which effect builders run)."""
        guards: dict[Any, Guard] = {g: getattr(self, f"guard_{g.value}") for g in self.GUARD_ENUM}
        effects: dict[Any, EffectBuilder] = {e: getattr(self, f"effect_{e.value}") for e in self.EFFECT_ENUM}
        rules: dict[tuple[Any, Any], tuple[Any, Any, tuple]] = {}
        ops: dict[tuple[Any, Any], tuple[Any, tuple]] = {}
        for (state, event), rule in self.TABLE.items():
            branches = []
            for b in rule.branches:
                if b.dest is not state and (state, b.dest) not in ops:
                    ops[state, b.dest] = (self.retime_op(state, b.dest), self.index_ops(state, b.dest))
                retime, index = ops.get((state, b.dest), (None, ()))
                branches.append((guards[b.guard] if b.guard is not None else None, b.dest,
                                 tuple(effects[e] for e in b.effects), b.reason, b.dest is not state, retime, index))
            rules[state, event] = (rule.kind, rule.reason, tuple(branches))
        self._rules.clear()
        self._rules.update(rules)

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
        while (key := dq.pop_due(now, self._is_live)) is not None:
            rec = self.records[key]
            rec.tseq = 0
            self.apply(rec, self.TIMERS[rec.timer].event, None, now, out)
            fired += 1
        dq.maybe_compact(len(self.records), self._is_live)
        return fired

    def effect_restart_timer(self, rec: Any, inp: Any, reason: Reason | None, now: float, out: list[Effect]) -> None:
        self.restart_timer(rec, now)

    def deadline_of(self, key: Any) -> float | None:
        """The live deadline of ``key`` if it has one (for tests and introspection; O(n))."""
        rec = self.records.get(key)
        if rec is None or not rec.tseq:
            return None
        return self._deadlines.when_of(key, rec.tseq)
