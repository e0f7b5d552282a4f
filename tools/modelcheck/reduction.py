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
the check are handed back so the search does not compute them again.

**Finished pairs** (:func:`visit_key`).  The ample sets run one pair's steps until it has none
left (it is *finished*: nothing queued, no deadline that may fire, no engine work), then the
next pair's.  Without more, the second pair would be explored once per distinct way the first
one finished (a failure reason, a fault budget left or spent ...) — the same steps each time, since
nothing a pair does depends on another pair's records (the premise of the reduction).  So the
search deduplicates states by :func:`visit_key`, in which a finished pair is a marker: two states
that differ only in how a finished pair ended are one.  Each finished pair was checked when it
finished (every property of that state, and liveness from it), and a finished pair never moves
again (no other pair's step changes its projection: the reduction checks it).

The default configuration is explored to exhaustion this way.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING

from tools.modelcheck.bounds import Bounds
from tools.modelcheck.properties import P_RETAINED, Fail

if TYPE_CHECKING:
    from tools.modelcheck.state import State
    from tools.modelcheck.system import System

__all__ = ["ample", "applies", "merges", "visit_key"]


def applies(b: Bounds) -> bool:
    """Whether the reduction is used under ``b`` (each id its own consumer; no drain or shutdown,
    which touch every id at once)."""
    return b.reduce and b.routing == "fixed" and b.ids == b.consumers and not b.drain and not b.shutdown


def ample(system: System, g: State, acts: list[tuple]) -> list[tuple[tuple, State | None]]:
    """A persistent subset of ``acts`` (with successors already computed where known)."""
    b = system.b
    if not applies(b):
        return list(zip(acts, repeat(None)))
    known: list[State | None] = [None] * len(acts)  # successors computed for a pair that did not qualify

    def full() -> list[tuple[tuple, State | None]]:
        return list(zip(acts, known))

    owner = system.owner
    groups: dict[int, list[int]] = {}  # pair -> the indexes of its actions
    for n, a in enumerate(acts):
        pid = owner[a[0]].process_of(a)
        if pid is None:
            return full()
        groups.setdefault(pid, []).append(n)
    if len(groups) <= 1:
        return full()
    cap_binding = b.tombstone_max < b.ids
    summaries = system.cores.summaries
    pstates = summaries[g.p].producer
    for pid in sorted(groups):
        E = [acts[n] for n in groups[pid]]
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
        for n, a in zip(groups[pid], E):
            try:
                ng = system.apply(g, a)
            except Fail:
                return full()  # let the main loop report it
            known[n] = ng
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
    return full()


FINISHED = "finished"
"""the marker of a finished pair in a :func:`visit_key`"""


def merges(b: Bounds) -> bool:
    """Whether :func:`visit_key` may merge states under ``b`` (else it is the state itself)."""
    return applies(b) and b.tombstone_max >= b.ids


def visit_key(system: System, g: State, acts: list[tuple] | None = None) -> object:
    """What the search deduplicates ``g`` by: ``g`` itself, or — when the reduction applies and a
    pair is finished (no enabled step belongs to it) while no enabled step couples the pairs — each
    unfinished pair's projection, :data:`FINISHED` for each finished one, and what the pairs share
    (:meth:`.system.System.shared`).  ``acts``: ``system.actions(g, True)``, if the caller has them."""
    b = system.b
    if not merges(b):
        return g
    owner = system.owner
    if acts is None:
        acts = system.actions(g, True)  # type: ignore[assignment]
    busy: set[int | None] = {owner[a[0]].process_of(a) for a in acts}
    if None in busy or len(busy) == b.ids:
        return g
    return (
        tuple(system.projection(g, i) if i in busy else FINISHED for i in range(b.ids)),
        system.shared(g),
    )
