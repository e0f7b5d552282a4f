"""Shared pytest configuration: Hypothesis profiles and markers.

Profiles (``HYPOTHESIS_PROFILE=<name>`` selects one; otherwise ``ci`` when ``$CI`` is set — which
replaces the ``ci`` profile Hypothesis would load by itself — else ``dev``):

* ``dev`` — 50 examples, quick local runs;
* ``ci`` — derandomized, no example database, no deadline, failure blobs printed, ~200 examples;
* ``explore`` — randomized, 20 000 examples, for long nightly runs
  (``HYPOTHESIS_PROFILE=explore timeout 3600 pytest tests/stateful tests/lifecycle``);
* ``mutate`` — derandomized, no database, 30 examples, no shrinking: what ``make mutate`` runs for each mutant
  (docs/mutation.md).

Parallel runs (``pytest -n N``, pytest-xdist; docs/testing.md): every test owns its ports (port 0),
temp dirs and namespaces, so any test may run on any worker in any order.  Tests that share one
expensive session resource are kept on one worker by :func:`pytest_collection_modifyitems`
(``--dist loadgroup``, in pyproject's addopts), by the fixture they use, never by a list of files.
"""

from __future__ import annotations

import gc
import os
import sys

import pytest
from hypothesis import HealthCheck, Phase, settings

from tools.child import preload_vllm

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci",
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    max_examples=20_000,
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "mutate",
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,
    # a mutant is killed by the first failing example; shrinking it (minutes for a stateful run)
    # would only make the counterexample smaller, which no mutation verdict reads
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

# the suite's children include P0's six, which drive vLLM: each worker's fork server imports it once
# (decision V11; the demo and other callers of tools.child do not)
preload_vllm()


#: session fixture -> the xdist group of every test that uses it: one worker builds the resource
#: once (the SmolLM2 model is loaded into one worker, not into each; its on-disk cache needs no
#: group: demo.model serialises building it with a file lock); the model checker's profiles and
#: the P0 benchmark are run once and asserted on by several tests (docs/testing.md); the wheel and
#: the fresh virtualenv it is installed into (module fixtures of test_packaging.py) are built once,
#: not once on each worker that runs one of its tests
_ONE_WORKER = {"smollm2": "smollm2", "profile_runs": "profile_runs", "planted_checks": "planted_checks",
               "p0_smoke": "p0_smoke", "wheel": "packaging"}
#: shared session fixture -> the pytest-timeout (s) of every test that uses it: whichever of them runs
#: first pays for building it (every model-check profile: ~35 s of CPU, 240 s of wall measured at
#: load average 15-20, near the default 300 s hang guard)
_SETUP_TIMEOUT = {"profile_runs": 900}


def pytest_collection_finish(session):  # type: ignore[no-untyped-def]
    """Move everything collection imported (vLLM, torch, every test module: millions of objects)
    out of the garbage collector's reach (decision V4): each worker imports all of it, and every
    full collection during an allocation-heavy test (the stateful hunts, the model checker, the
    benchmarks) would scan it again; measured, a core benchmark ran 3.5x slower after the vLLM
    tests than on its own."""
    gc.collect()
    gc.freeze()


#: areas whose tests mostly wait on real time (child processes, sockets, namespaces, deadlines):
#: their modules are spread among the others (:func:`_interleave`, decision V12)
_WAITING = ("tests/manager/", "tests/security/", "tests/dataplane/", "tests/transport/", "tests/integrations/")


def _interleave(items: list[pytest.Item]) -> list[pytest.Item]:
    """The same items, each module's together and in its order, with the modules of the areas
    that wait on real time spread among the modules that compute (collection order within each
    kind), all of them handed out by the time 60 % of the others are.  pytest-xdist hands tests out
    in this order; in collection order every worker met the real-time tests at once and the two
    cores were half idle for about a minute (decision V12)."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    waiting = [m for m in modules if m.startswith(_WAITING)]
    computing = [m for m in modules if not m.startswith(_WAITING)]
    order: list[str] = []
    w = c = 0
    while w < len(waiting) or c < len(computing):
        # take from whichever kind is further behind its share of the run, the waiting modules
        # handed out by the time 60 % of the computing ones are: a run that ends on tests that
        # only wait leaves the cores idle
        if c >= len(computing) or (w < len(waiting) and 3 * w * len(computing) <= 5 * c * len(waiting)):
            order.append(waiting[w])
            w += 1
        else:
            order.append(computing[c])
            c += 1
    return [item for m in order for item in modules[m]]


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook, which reads the groups into node ids
def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    items[:] = _interleave(items)
    for item in items:
        for fixture, group in _ONE_WORKER.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
        for fixture, seconds in _SETUP_TIMEOUT.items():
            if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(seconds))
        if getattr(config.option, "loadgroup", False):
            _suffix_group(item)


def _suffix_group(item: pytest.Item) -> None:
    """What pytest-xdist 3.8's worker does for ``--dist loadgroup`` (``<nodeid>@<group>``, the
    scheduler's grouping key), for pytest 9, whose items keep their node id in a structured
    ``_id``: xdist's own assignment to ``item._nodeid`` no longer changes it, and every group was
    silently spread over all workers.  On older pytest xdist's hook does it, and this does nothing."""
    from _pytest.nodeid import NodeId  # pytest >= 9 only

    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    nodeid = item.nodeid
    if names and isinstance(getattr(item, "_id", None), NodeId) and "@" not in nodeid.rpartition("]")[2]:
        item._id = NodeId.parse(f"{nodeid}@{'_'.join(names)}")


def pytest_configure(config):  # type: ignore[no-untyped-def]
    for line in (
        "xdist_group(name): tests of one group run on one xdist worker (pytest-xdist's --dist loadgroup)",
        "slow: long runs kept out of the default suite (run with -m slow)",
        "model: uses the real SmolLM2 model",
        "e2e: multi-process end-to-end",
        "vllm: drives real vLLM code",
    ):
        config.addinivalue_line("markers", line)


#: temp-dir prefixes the suite makes outside pytest's own ``tmp_path`` (tests/integrations/vllm_harness.py)
_OWN_TMP = ("kvtier-tiny-llama-", "kvtier-vllm-cache-")
_tmp_before: set[str] = set()


def _own_tmp() -> set[str]:
    import tempfile

    root = tempfile.gettempdir()
    try:
        return {n for n in os.listdir(root) if n.startswith(_OWN_TMP)}
    except OSError:
        return set()


def pytest_sessionstart(session):  # type: ignore[no-untyped-def]
    _tmp_before.update(_own_tmp())


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    """Every test deletes what it made: a temp dir of the suite's own left behind by this run fails
    it (checked once, by the controller, after every worker ended)."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: its fixtures may still be running
        return
    harness = sys.modules.get("tests.integrations.vllm_harness")
    if harness is not None:  # tests ran in this process (no xdist): its cache goes before the check
        harness.remove_own_cache()
    left = sorted(_own_tmp() - _tmp_before)
    if left:
        import tempfile

        tw = session.config.get_terminal_writer()
        tw.line()
        tw.line(
            f"tests left {len(left)} temp dir(s) in {tempfile.gettempdir()}: {', '.join(left[:5])}", red=True)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
