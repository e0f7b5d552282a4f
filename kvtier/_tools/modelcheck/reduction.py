"""Partial-order reduction: expand one id's steps when they commute with everything else.

With ``routing="fixed"`` and as many consumers as ids, id i and consumer i form a *pair* whose
steps touch only that pair's records, channels, transfers and jobs; the pairs interact only
through shared budgets (faults in total, crashes) and the producer's retained-id cap.  In each
state, :func:`ample` looks for one pair whose enabled steps

* spend no shared budget (:meth:`.part.Part.shares_budget`),
* cannot be overtaken by another id's retirement evicting this id's record (when the cap binds:
  ``tombstone_max < ids``, a retained id's producer-side steps are never reduced, and a step that
  retires or un-retires the id is always interleaved both ways), and
* leave every other pair's projection (:meth:`.system.System.projection`) unchanged,

and expands only those (a persistent set); otherwise every enabled step.  Successors computed for
the check are handed back so the search does not compute them again.  The default configuration
is explored to exhaustion this way (the longest path is ~27 steps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier._tools.modelcheck.bounds import Bounds
from kvtier._tools.modelcheck.properties import P_RETAINED, Fail

if TYPE_CHECKING:
    from kvtier._tools.modelcheck.state import State
    from kvtier._tools.modelcheck.system import System

__all__ = ["ample", "applies"]


def applies(b: Bounds) -> bool:
    """Whether the reduction is used under ``b`` (each id its own consumer; no drain or shutdown,
    which touch every id at once)."""
    return b.reduce and b.routing == "fixed" and b.ids == b.consumers and not b.drain and not b.shutdown


def ample(system: System, g: State, acts: list[tuple]) -> list[tuple[tuple, State | None]]:
    """A persistent subset of ``acts`` (with successors already computed where known)."""
    full: list[tuple[tuple, State | None]] = [(a, None) for a in acts]
    b = system.b
    if not applies(b):
        return full
    owner = system.owner
    groups: dict[int, list[tuple]] = {}
    for a in acts:
        pid = owner[a[0]].process_of(a)
        if pid is None:
            return full
        groups.setdefault(pid, []).append(a)
    if len(groups) <= 1:
        return full
    cap_binding = b.tombstone_max < b.ids
    summaries = system.cores.summaries
    pstates = summaries[g.p].producer
    for pid in sorted(groups):
        E = groups[pid]
        if any(owner[a[0]].shares_budget(g, a) for a in E):
            continue  # they spend a budget the other ids share
        kid = system.kids[pid]
        retained = pstates.get(kid, ("absent",))[0] in P_RETAINED
        if cap_binding and retained and any(owner[a[0]].touches_producer(a) for a in E):
            continue  # another id's retirement may evict this one's record meanwhile
        others = [j for j in range(b.ids) if j != pid]
        before = {j: system.projection(g, j) for j in others}
        out: list[tuple[tuple, State | None]] = []
        ok = True
        for a in E:
            try:
                ng = system.apply(g, a)
            except Fail:
                return full  # let the main loop report it
            if cap_binding:
                now_ret = summaries[ng.p].producer.get(kid, ("absent",))[0] in P_RETAINED
                if now_ret != retained:
                    ok = False
                    break
            if any(system.projection(ng, j) != before[j] for j in others):
                ok = False
                break
            out.append((a, ng))
        if ok:
            return out
    return full
