"""The search: safety by breadth-first exploration, liveness by completion, counterexamples.

1. **Safety.**  Breadth-first from the initial state to the depth bound, with every kind of step
   (shortest counterexamples first), expanding an ample set per state and merging states that
   differ only in how a finished pair ended (:mod:`.reduction`, :func:`~.reduction.visit_key`).
   Every transition runs the properties' step checks, every new state their state checks
   (:mod:`.properties`); the first :class:`~.properties.Fail` stops the search.
2. **Liveness** (``no_stuck_ids``: ``fetch_always_answered`` and the liveness half of
   ``exactly_once_job_result``).  From every explored state a *quiescent* state
   (:func:`.properties.quiescent`) must be reachable by *completion* steps only — arrivals and
   deliveries, the data plane's releases once the session that carried them ended, revocations,
   deadlines, the producer's request finishing, a shutdown's grace ending
   (``actions(g, full=False)``).
   New work, faults, crashes and the consumer giving up on its own are not completion steps (an
   engine waits for its load), so a load that only ends when its engine abandons it counts as
   stuck.  Each state first tries a greedy path (the first completion step in priority order;
   every state on it shares its verdict); only if that fails, every completion path.  States
   first reached here are counted in ``frontier_closure``.
3. **Counterexamples.**  Each reached state remembers its parent and the action that reached it;
   a violation replays the path from the initial state with a :class:`~.trace.Recorder`, which
   yields both the text trace and the structured steps (:mod:`.trace`).

:func:`check` explores one :class:`~.bounds.Bounds`; :func:`check_profiles` the named
:data:`~.bounds.PROFILES` in turn (what a plain ``python -m tools check`` does).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from contextlib import nullcontext
from typing import Any

from tools.modelcheck.bounds import PROFILES, Bounds
from tools.modelcheck.properties import Fail
from tools.modelcheck.reduction import ample, merges, visit_key
from tools.modelcheck.result import Result, Violation
from tools.modelcheck.state import State
from tools.modelcheck.system import System
from tools.modelcheck.trace import NETWORK, Recorder, TraceStep

__all__ = ["check", "check_profiles"]


def check_profiles(
    names: tuple[str, ...] | None = None, *, bug: str | None = None, progress: bool = False
) -> list[Result]:
    """Explore the named :data:`~.bounds.PROFILES` (all, in order, by default) one after another,
    stopping after the first that finds a violation or gives up; returns their results in order.
    Raises KeyError for an unknown profile or bug."""
    out: list[Result] = []
    for name in names or tuple(PROFILES):
        if name not in PROFILES:
            raise KeyError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
        r = check(PROFILES[name], bug=bug, progress=progress, profile=name)
        out.append(r)
        if not r.ok:
            break
    return out


def check(
    bounds: Bounds | None = None, *, bug: str | None = None, progress: bool = False, profile: str | None = None
) -> Result:
    """Explore ``bounds`` (with planted bug ``bug`` of :mod:`tools.planted` active, if
    given) and return the result (``profile``: the name the report gives the bounds).  Raises
    KeyError naming the known bugs for an unknown ``bug``; ``progress`` prints a state count to
    stderr every 100,000 states."""
    bounds = bounds or Bounds()
    if bug is not None:
        from tools.planted import PLANTED

        if bug not in PLANTED:
            raise KeyError(f"unknown planted bug {bug!r}; known: {', '.join(sorted(PLANTED))}")
        ctx: Any = PLANTED[bug]()
    else:
        ctx = nullcontext()
    with ctx:
        r = _search(bounds, bug, progress)
    r.profile = profile
    return r


class _Trail:
    """Parent links of every reached state, and counterexample reconstruction from them."""

    def __init__(self, system: System, init: State) -> None:
        self.system = system
        self.parent: dict[State, tuple[State | None, tuple | None]] = {init: (None, None)}

    def replay(
        self, g: State, last: tuple | None = None, mark: str = ""
    ) -> tuple[tuple[str, ...], list[TraceStep]]:
        """Text lines and structured steps of the path to ``g`` (then ``last`` from ``g``, marked)."""
        path: list[tuple[State, tuple]] = []
        cur = g
        while True:
            par, action = self.parent[cur]
            if par is None:
                break
            path.append((par, action))
            cur = par
        path.reverse()
        if last is not None:
            path.append((g, last))
        lines: list[str] = []
        steps: list[TraceStep] = []
        for n, (state, action) in enumerate(path, 1):
            rec = Recorder(n)
            try:
                self.system.apply(state, action, rec)
            except Fail:
                pass
            tail = mark if (last is not None and n == len(path)) else ""
            lines.append(f"{n:3d}. {self.system.label(state, action)}{tail}")
            lines.extend(f"       {note}" for note in rec.notes)
            steps.extend(rec.steps)
        return tuple(lines), steps

    def violation(self, g: State, prop: str, message: str, lane: str | None, last: tuple | None = None) -> Violation:
        mark = f"   <-- violates {prop}" if last is not None else ""
        lines, steps = self.replay(g, last, mark)
        n = steps[-1].n if steps else 0
        lane = lane or NETWORK
        steps.append(TraceStep(n, "violation", lane, lane, f"violates {prop}"))
        return Violation(prop, message, lines, tuple(steps))


def _search(b: Bounds, bug: str | None, progress: bool) -> Result:
    t0 = time.perf_counter()
    system = System(b)
    result = Result(bounds=b, bug=bug)
    init = system.initial()
    trail = _Trail(system, init)
    parent = trail.parent
    # each queued state with its depth and, when visit_key needed them, its enabled actions (computing
    # them is a good part of a state's cost, so they are not computed twice)
    queue: deque[tuple[State, int, list[tuple] | None]] = deque([(init, 0, None)])
    merging = merges(b)

    def fail(g: State, action: tuple, f: Fail) -> Result:
        result.violation = trail.violation(g, f.prop, f.message, f.lane, action)
        return result

    deepest = 0
    # the keys of the states that visit_key merged into another (a state whose key is itself is
    # found in ``parent``: a State never equals a merged key, a pair of the projections and the shared part)
    visited: set[object] = {visit_key(system, init)}
    try:
        system.check_state(init)
        # 1. safety: BFS to the depth bound with every kind of step
        while queue:
            g, d, acts = queue.popleft()
            if d >= b.depth:
                continue
            for action, ng in ample(system, g, system.actions(g, True) if acts is None else acts):
                result.transitions += 1
                try:
                    if ng is None:
                        ng = system.apply(g, action)
                    if ng in parent:
                        continue
                    nacts = None
                    if merging:
                        nacts = system.actions(ng, True)  # type: ignore[assignment]
                        key = visit_key(system, ng, nacts)
                        if key is not ng:
                            if key in visited:
                                continue
                            visited.add(key)
                    system.check_state(ng)
                except Fail as f:
                    return fail(g, action, f)
                parent[ng] = (g, action)
                deepest = max(deepest, d + 1)
                queue.append((ng, d + 1, nacts))
                if len(parent) > b.max_states:
                    result.truncated = True
                    return result
                if progress and len(parent) % 100000 == 0:
                    print(f"  ... {len(parent):,} states", file=sys.stderr)
        # 2. liveness: from every explored state a quiescent state is reachable by completion steps
        can: dict[State, bool] = {}
        for g0 in list(parent):  # every state the BFS reached, in its order
            if g0 in can:
                continue
            path: list[State] = []
            on_path: set[State] = set()
            cur = g0
            ok = False
            while True:
                if cur in can:
                    ok = can[cur]
                    break
                if system.quiescent(cur):
                    ok = True
                    break
                if cur in on_path:
                    break
                path.append(cur)
                on_path.add(cur)
                nxt = None
                for action in system.actions(cur, False):
                    result.transitions += 1
                    try:
                        ng = _successor(system, cur, action, parent)
                    except Fail as f:
                        return fail(cur, action, f)
                    if ng not in parent:
                        parent[ng] = (cur, action)
                        result.frontier_closure += 1
                    nxt = ng
                    break  # greedy: the first completion step in priority order
                if nxt is None:
                    break
                cur = nxt
            if not ok:
                ok = _exhaustive_completion(system, g0, parent, result)
            for p in path:  # every state on the greedy path shares g0's fate
                can[p] = ok
            can[g0] = ok
            if not ok:
                items = system.stuck(g0)
                why = "; ".join(text for _, text in items) or "no quiescent state is reachable"
                result.violation = trail.violation(
                    g0,
                    "no_stuck_ids",
                    f"from this state no quiescent state is reachable: {why}",
                    items[0][0] if items else None,
                )
                return result
        return result
    finally:
        result.max_depth = deepest
        result.states = len(parent)
        result.core_steps = system.cores.core_steps
        result.seconds = time.perf_counter() - t0


def _successor(system: System, g: State, action: object, known: dict) -> State:
    """``action`` applied to ``g``; a state not in ``known`` yet has its properties checked (raises
    :class:`Fail`)."""
    ng = system.apply(g, action)
    if ng not in known:
        system.check_state(ng)
    return ng


def _exhaustive_completion(system: System, g0: State, parent: dict, result: Result) -> bool:
    """Search every completion path from ``g0`` for a quiescent state (the greedy path failed)."""
    seen = {g0}
    work = deque([g0])
    while work:
        g = work.popleft()
        if system.quiescent(g):
            return True
        for action in system.actions(g, False):
            result.transitions += 1
            try:
                ng = _successor(system, g, action, parent)
            except Fail:
                continue  # reported by the main search if reachable there; here only reachability matters
            if ng not in parent:
                parent[ng] = (g, action)
                result.frontier_closure += 1
            if ng not in seen:
                seen.add(ng)
                work.append(ng)
                if len(seen) > system.b.max_states:
                    return True  # give up proving stuckness rather than report a false one
    return False
