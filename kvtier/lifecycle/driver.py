"""The contract between the core and whoever performs its effects: the order of one tick.

:func:`drive` is the only place that says in which order inputs, effects and deadlines meet, and
the shell (:mod:`kvtier.shell.loop`), the model checker and the stateful suite all call it, so
the rule the model checker verifies is the rule that runs:

1. Inputs are applied in arrival order.  After each one, its effects are performed and what the
   performers report (a landing checked, a connection up, a descriptor taken) is applied — and
   performed — before the next input.  A ``block_data`` is therefore landed and checked before the
   ``transfer_done`` that followed it on the wire is looked at.
   Each input is shown to ``applied`` (when given) right after the core applied it, before its
   effects are performed: the request forensics read the state it left its id in, a move no
   effect shows (decision E10).
2. Only then do deadlines fire, and only up to ``deadlines_at``: the time the shell last saw its
   inbound queue empty (spec property ``input_before_deadline``, decision I3).  Every message that
   arrived before that time is among the inputs already applied, so no deadline beats input that
   was waiting when it fell due; a stalled loop reaps nothing because of its own stall.

``perform(effects) -> inputs`` is the caller's: it carries the effects out (or models doing so)
and returns what they reported.  The driver never performs I/O itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.effects import Effect
from kvtier.lifecycle.inputs import Input

__all__ = ["Applied", "Perform", "drive", "settle"]

Perform = Callable[[Sequence[Effect]], Sequence[Input]]
Applied = Callable[[Input], None]


def settle(core: TierCore, effects: Sequence[Effect], now: float, perform: Perform,
           applied: Applied | None = None) -> None:
    """Perform ``effects``; apply what the performers report, one input at a time (each one's
    effects performed before the next, each input shown to ``applied`` first), until nothing
    more is reported."""
    pending: deque[Input] = deque(perform(effects) if effects else ())
    while pending:
        inp = pending.popleft()
        effects = core.handle(inp, now)
        if applied is not None:
            applied(inp)
        produced = perform(effects)
        if produced:
            pending.extendleft(reversed(produced))  # an input's consequences come before later inputs


def drive(core: TierCore, inputs: Iterable[Input], now: float, *, deadlines_at: float | None,
          perform: Perform, held: Callable[[], float] | None = None, applied: Applied | None = None) -> None:
    """One pass at ``now`` (seconds): every input (with its consequences), then the deadlines due
    at ``deadlines_at`` (None: none fire) — and no later than ``held()``, asked once the inputs
    were applied: the arrival stamp of the oldest input the caller has read but not handed over
    yet (a landing still running counts as unread input).  The caller states facts (when its
    inbound queue was last seen empty, what it still holds); the rule that a deadline never beats
    input that was waiting when it fell due is this function's."""
    for inp in inputs:
        effects = core.handle(inp, now)
        if applied is not None:
            applied(inp)
        settle(core, effects, now, perform, applied)
    if deadlines_at is not None:
        if held is not None:
            deadlines_at = min(deadlines_at, held())
        settle(core, core.fire(deadlines_at), now, perform, applied)
