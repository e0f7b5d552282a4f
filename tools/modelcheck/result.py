"""The outcome of a model check, and its text report."""

from __future__ import annotations

import attrs

from tools.modelcheck.bounds import Bounds
from tools.modelcheck.properties import PROPERTIES
from tools.modelcheck.reduction import applies
from tools.modelcheck.trace import TraceStep

__all__ = ["Result", "Violation", "format_result"]


@attrs.frozen
class Violation:
    """A property that failed, with its counterexample."""

    prop: str
    message: str
    trace: tuple[str, ...]
    """the text lines: ``  n. action`` then its indented notes"""
    steps: tuple[TraceStep, ...] = ()
    """the same counterexample as structured steps (:mod:`.trace`), a ``violation`` step last"""


@attrs.define
class Result:
    bounds: Bounds
    bug: str | None
    profile: str | None = None
    """the name of the :data:`~.bounds.PROFILES` entry explored, if it was one"""
    states: int = 0
    transitions: int = 0
    frontier_closure: int = 0
    """states first reached by the completion (liveness) search"""
    max_depth: int = 0
    core_steps: int = 0
    """distinct core steps run (memoised)"""
    seconds: float = 0.0
    violation: Violation | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.violation is None and not self.truncated

    @property
    def trace(self) -> tuple[str, ...]:
        """The counterexample's text lines (empty when no property failed)."""
        return self.violation.trace if self.violation else ()

    @property
    def steps(self) -> tuple[TraceStep, ...]:
        """The counterexample's structured steps (empty when no property failed)."""
        return self.violation.steps if self.violation else ()


def format_result(r: Result) -> str:
    """The report ``python -m tools check`` prints: bounds, counts, each property's verdict, the trace."""
    b = r.bounds
    head = (
        f"kvtier model check{f' [{r.profile}]' if r.profile else ''}"
        f"{f' (planted bug: {r.bug})' if r.bug else ''}: ids={b.ids} consumers={b.consumers} "
        f"depth={b.depth} faults={b.faults} chunks={b.chunks} loads_per_id={b.loads_per_id} lives={b.lives} "
        f"crashes={b.crashes} tombstone_max={b.tombstone_max} max_pending={b.max_pending} park_clock={b.park_clock}"
        f" routing={b.routing} fault_scope={b.fault_scope}"
        f"{' drain' if b.drain else ''}{' shutdown' if b.shutdown else ''}{' reorder' if b.reorder else ''}"
        f"{' one-sided' if b.one_sided else ''}{'' if b.batching else ' no-batching'}"
        f"{' pings' if b.pings else ''}{'' if b.connected else ' unconnected'}{' attach-later' if b.attach_later else ''}"
        f"{'' if b.corruption else ' no-corruption'}"
        f"{'' if b.prune_timers else ' no-prune-timers'}{'' if b.abandon else ' no-abandon'}"
        f"{' no-transfer-failures' if not b.transfer_failures else ''}"
        f"{f' symmetric sym_keys={b.sym_keys}' if b.symmetric else ''}"
    )
    if r.violation is None and not r.truncated:
        scope = (
            f"state space exhausted (longest path {r.max_depth} steps)"
            if r.max_depth < b.depth
            else f"bounded: paths cut at depth {b.depth}, then closed with {r.frontier_closure:,} completion states"
        )
    else:
        scope = f"depth bound {b.depth}"
    reduction = "partial-order reduction over ids" if applies(b) else "no partial-order reduction"
    lines = [
        head,
        (
            f"explored {r.states:,} states and {r.transitions:,} transitions in {r.seconds:.1f} s; {scope}; "
            f"{reduction}; {r.core_steps:,} distinct core steps"
        ),
    ]
    if r.truncated:
        lines.append(f"GAVE UP: more than {b.max_states:,} states; lower the bounds")
        return "\n".join(lines)
    failed = r.violation.prop if r.violation else None
    for prop in PROPERTIES:
        if prop == failed:
            lines.append(f"  FAIL {prop}")
        elif failed is None:
            lines.append(f"  ok   {prop}")
        else:
            lines.append(f"  ?    {prop} (search stopped)")
    if r.violation:
        lines.append("")
        lines.append(f"VIOLATION of {r.violation.prop}: {r.violation.message}")
        lines.append("counterexample:")
        lines.extend(r.violation.trace)
    return "\n".join(lines)
