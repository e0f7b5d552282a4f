"""One exploration of every model-check profile per session, shared by the tests that assert on it
(``test_modelcheck.py``'s default-bounds and every-profile tests, ``test_modelcheck_symmetric.py``'s
symmetric-profile test): the same searches used to run twice (the default bounds are the ``core``
profile, the ``symmetric`` profile is one of the profiles).  ``tests/conftest.py`` keeps the tests
that use :func:`profile_runs` on one xdist worker, so the searches run once."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from kvtier.lifecycle.effects import JobDone, ReleasePins
from tools.modelcheck import PROFILES, Result, check_profiles, search
from tools.modelcheck.system import System


def reached(system: System) -> dict[str, set]:
    """Every serve, probe and round-load state the search's snapshots hold, and every pin release
    and load result its core steps emitted."""
    out: dict[str, set] = {"serve": set(), "probe": set(), "loads": set(), "releases": set(), "jobs": set()}
    for summary in system.cores.summaries:
        out["serve"] |= {v[0] for v in summary.serve.values()}
        out["probe"] |= {v[0] for v in summary.probe.values()}
        out["loads"] |= {v[0] for v in summary.loads.values()}
    for step in system.cores.memo.values():
        for e in step.effects:
            if type(e) is ReleasePins:
                out["releases"].add(e.ok)
            elif type(e) is JobDone and e.job_id >= 3000:
                out["jobs"].add(e.ok)
    return out


@attrs.frozen
class ProfileRuns:
    results: list[Result]
    """``check_profiles()``: every profile, in order"""
    reached: dict[str, dict[str, set]]
    """per profile name, :func:`reached` of the system its search built"""

    def of(self, name: str) -> Result:
        (r,) = [r for r in self.results if r.profile == name]
        return r


@pytest.fixture(scope="session")
def profile_runs() -> Any:
    """A plain ``python -m tools check`` (every profile on the real core), with what each search
    reached; the systems themselves are not kept (their memo is large)."""
    seen: dict[str, dict[str, set]] = {}
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
            (r,) = check_profiles((name,))
            results.append(r)
            seen[name] = reached(current[0])
            current.clear()
            if not r.ok:
                break
    finally:
        search.System = original
    return ProfileRuns(results, seen)
