"""One exploration of every model-check profile per session, shared by the tests that assert on it
(``test_modelcheck.py``'s default-bounds and every-profile tests, ``test_modelcheck_symmetric.py``'s
symmetric-profile test, ``test_duplicates.py``): the same searches used to run twice (the default
bounds are the ``core`` profile, the ``symmetric`` profile is one of the profiles).  Likewise one
search per planted bug (:func:`planted_checks`), which the trace, chart and planted-bug tests of
three modules each ran again.  ``tests/conftest.py`` keeps the tests that use each fixture on one
xdist worker, so the searches run once."""

from __future__ import annotations

import time
from typing import Any

import attrs
import pytest

from kvtier.lifecycle import _machine
from kvtier.lifecycle import Reason
from kvtier.lifecycle.effects import JobDone, OpenConnection, ReleasePins
from kvtier.wire import messages as wm
from tools.modelcheck import PROFILES, Bounds, Result, check, check_profiles, search
from tools.modelcheck.system import System


def reached(system: System) -> dict[str, set]:
    """Every serve, probe and round-load state the search's snapshots hold, every pin release and
    load result its core steps emitted, and what a consumer did with a handshake refused for now
    (``held``: ``"redial"`` when it dialled again, ``"failed"`` when a load failed on it; decision N25)."""
    out: dict[str, set] = {"serve": set(), "probe": set(), "loads": set(), "releases": set(), "jobs": set(),
                           "held": set()}
    for summary in system.cores.summaries:
        out["serve"] |= {v[0] for v in summary.serve.values()}
        out["probe"] |= {v[0] for v in summary.probe.values()}
        out["loads"] |= {v[0] for v in summary.loads.values()}
    msgs = system.cores.msgs
    for step in system.cores.memo.values():
        held = (step.inp[0] == "deliver" and type(msgs[step.inp[1]].msg) is wm.HelloReject
                and msgs[step.inp[1]].msg.reason == Reason.SESSION_STILL_HELD)
        for e in step.effects:
            if type(e) is ReleasePins:
                out["releases"].add(e.ok)
            elif type(e) is JobDone and e.job_id >= 3000:
                out["jobs"].add(e.ok)
            if held and type(e) is OpenConnection:
                out["held"].add("redial")
            elif held and type(e) is JobDone and e.reason == Reason.SESSION_STILL_HELD:
                out["held"].add("failed")
    return out


#: the wire messages' tags: a machine event of one of these names is a message from the peer
MESSAGE_TYPES = frozenset(c.TYPE for c in vars(wm).values() if isinstance(c, type) and hasattr(c, "TYPE"))

#: the "machine" of a delivery no machine met (the core dropped it first: a dead session's
#: generation, an unknown peer)
UNROUTED = "core"
#: (machine, state, message) -> for each kind of step, the sorted names of the effects it produced
Deliveries = dict[tuple[str, str, str], dict[tuple[str, ...], int]]


def deliveries(system: System) -> tuple[Deliveries, Deliveries]:
    """``(first, again)``: every message the search delivered, replayed on the core it reached,
    and delivered a second time on the core that first delivery left (a network duplicate arriving
    right after the original).  Each is traced per machine: the state the message met and the
    effects of the step (a message no machine met: ``(UNROUTED, "-", tag)``).  Replays are deterministic (the search's steps are), so ``first`` is what
    the search saw; ``again`` is what the duplicates did."""
    first: Deliveries = {}
    again: Deliveries = {}
    met: list[tuple[str, str, str]] = []
    original = _machine.TableMachine.apply

    def traced(self, rec, event, inp, now, out):  # type: ignore[no-untyped-def]
        if getattr(event, "value", None) in MESSAGE_TYPES:
            met.append((self.NAME, rec.state.value, event.value))
        return original(self, rec, event, inp, now, out)

    def feed(into: Deliveries, env: Any, snap: int) -> None:
        met.clear()
        _, effects, _ = system.feed(env.dst, system.cores.snaps[snap], ("deliver", env))
        kinds = tuple(sorted({type(e).__name__ for e in effects}))
        for pair in met or [(UNROUTED, "-", env.kind)]:
            counts = into.setdefault(pair, {})
            counts[kinds] = counts.get(kinds, 0) + 1

    _machine.TableMachine.apply = traced
    try:
        cores = system.cores
        for (sid, inp), step in list(cores.memo.items()):
            if inp[0] != "deliver" or len(inp) != 2:  # a plain delivery (not one landing corrupt)
                continue
            env = cores.msgs[inp[1]]
            feed(first, env, sid)
            feed(again, env, step.snap)
    finally:
        _machine.TableMachine.apply = original
    return first, again


def _merge(into: Deliveries, more: Deliveries) -> None:
    for pair, counts in more.items():
        got = into.setdefault(pair, {})
        for kinds, n in counts.items():
            got[kinds] = got.get(kinds, 0) + n


@attrs.frozen
class ProfileRuns:
    results: list[Result]
    """``check_profiles()``: every profile, in order"""
    reached: dict[str, dict[str, set]]
    """per profile name, :func:`reached` of the system its search built"""
    first: Deliveries
    """:func:`deliveries`' first deliveries, over every profile"""
    again: Deliveries
    """:func:`deliveries`' duplicates, over every profile"""
    cpu_s: dict[str, float]
    """per profile name, the CPU seconds its search took (this process's: the search is single
    threaded, so unlike wall time this does not grow with what else runs on the host)"""

    def of(self, name: str) -> Result:
        (r,) = [r for r in self.results if r.profile == name]
        return r


@pytest.fixture(scope="session")
def profile_runs() -> Any:
    """A plain ``python -m tools check`` (every profile on the real core), with what each search
    reached; the systems themselves are not kept (their memo is large)."""
    seen: dict[str, dict[str, set]] = {}
    cpu: dict[str, float] = {}
    first: Deliveries = {}
    again: Deliveries = {}
    original = search.System
    current: list[System] = []

    class Kept(original):  # type: ignore[misc, valid-type]
        def __init__(self, b):  # type: ignore[no-untyped-def]
            super().__init__(b)
            current.append(self)

    search.System = Kept
    try:
        results = []
        for name in PROFILES:  # check_profiles one profile at a time, summarising each system
            current.clear()
            t0 = time.process_time()
            (r,) = check_profiles((name,))
            cpu[name] = time.process_time() - t0
            results.append(r)
            seen[name] = reached(current[0])
            f, a = deliveries(current[0])
            _merge(first, f)
            _merge(again, a)
            current.clear()
            if not r.ok:
                break
    finally:
        search.System = original
    return ProfileRuns(results, seen, first, again, cpu)


@pytest.fixture(scope="session")
def planted_checks() -> Any:
    """``of(bug) -> Result``: ``check()`` of the bounds that find planted bug ``bug`` (its profile
    of :data:`tools.planted.PROFILE_OF`, named in the report, else the default bounds), searched
    once per session on first use.  The searches are deterministic, so every test that used to run
    one of them asserts on the same result; none of them changes a result."""
    from tools.planted import PROFILE_OF

    done: dict[str, Result] = {}

    def of(bug: str) -> Result:
        if bug not in done:
            profile = PROFILE_OF.get(bug)
            done[bug] = check(PROFILES[profile] if profile else Bounds(), bug=bug, profile=profile)
        return done[bug]

    return of
