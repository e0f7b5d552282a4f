"""``python -m tools.mutate [GROUP ...]``: mutation testing with mutmut (``make mutate``).

Each *group* mutates a few runtime modules and runs, for each mutant, only the tests of its own
selection that reach the mutated function (mutmut maps tests to functions in a first, traced
run).  A group runs in its own workspace, ``.mutate/<group>/`` (git-ignored): links to the
checkout, a ``pyproject.toml`` whose ``[tool.mutmut]`` names the group's modules and tests, and
mutmut's ``mutants/`` tree, which keeps every verdict, so a second run only tests what changed.
Hypothesis runs its ``mutate`` profile there (tests/conftest.py: derandomized, 30 examples).

    python -m tools.mutate --list          the groups, their modules and tests
    python -m tools.mutate codec config    run two groups (all when none is named)
    python -m tools.mutate --report        the scores and surviving mutants of what ran
    python -m tools.mutate --retest codec  test codec's surviving mutants again (after new tests)
    python -m tools.mutate --fresh codec   the same, each mutant in a fresh process (see fresh())
    python -m tools.mutate lifecycle --only kvtier.lifecycle.consumer   one module of a group

The score is killed / (killed + survived + timeout + suspicious + no tests - equivalent), per
group (and per module in the report); docs/mutation.md
keeps the committed figures and, for every surviving mutant, the test that now kills it or the
reason it is equivalent (decision V3).  Not part of CI's run: on this 2-core host the lifecycle
group alone takes hours; run it a module at a time (``--only``).

Two limits of mutmut 3 this tool works around (docs/mutation.md): a mutant of code that runs at
import time (attrs field declarations, validator tuples) is never switched on in mutmut's workers,
which fork from a process that imported the module first, so it always *survives* there:
``--fresh`` tests each survivor again in a fresh process; and a test whose id pytest escapes
(non-ASCII) cannot be selected again by its id, which mutmut reports as a *timeout* of every
mutant that test reaches: test ids stay ASCII.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".mutate"
#: what the tests read from the checkout besides kvtier/ and tests/ (copied into mutants/; README.md:
#: test_config_docs checks its generated block)
ALSO = ["tools", "spec", "docs", "bench", "diagrams", "README.md"]
#: mutmut's exit codes -> verdicts (mutmut.stats.status_by_exit_code)
VERDICT = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
           36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", 37: "killed"}


class Group(NamedTuple):
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    scope: tuple[str, ...] = ()
    """Mutant name prefixes the group is about (empty: every mutant of its modules): mutmut mutates
    whole files, so a module that also does other jobs has its other functions' mutants made but
    neither run nor counted."""


#: the lifecycle core, the shell's result and landing paths, the wire codec and config, each with
#: the fast tests that exercise it; the planted-bug hunts test the tests and are left out (they
#: pass under most mutants and would only slow every run down)
GROUPS: dict[str, Group] = {
    "codec": Group(("kvtier/wire/codec.py",), ("tests/wire",)),
    "config": Group(("kvtier/config.py", "kvtier/config_kinds.py"), ("tests/test_config.py",
                    "tests/test_config_rules.py", "tests/test_config_properties.py", "tests/test_config_docs.py",
                    "tests/test_config_auth_rules.py", "tests/test_config_lists.py", "tests/test_config_messages.py",
                    "tests/test_config_names.py")),
    # the shell's result and landing paths: the job book (one result per job), the per-byte work
    # (landings on the pool, their results and what waits behind them) and the performers that
    # land a block_data and queue a job's result (outbound); all on the virtual clock.  The
    # stateful manager-pair test (tests/manager/test_manager_stateful.py) is left out: it is 95 %
    # of the selection's time and reaches every function, so each surviving mutant cost 20 s
    "shell": Group(("kvtier/shell/jobs.py", "kvtier/shell/perbyte.py", "kvtier/shell/outbound.py"),
                   ("tests/manager/test_perbyte.py", "tests/manager/test_jobbook.py",
                    "tests/manager/test_virtual_results.py", "tests/manager/test_virtual_park.py",
                    "tests/manager/test_virtual_failures.py", "tests/manager/test_virtual_requests.py",
                    "tests/manager/test_manager_limits.py", "tests/manager/test_request_passes.py",
                    "tests/symmetric/test_shell_symmetric.py::test_one_sided_successful_keys_are_rechecked_at_reporting"),
                   # outbound's other performers (sends, hellos, connections, serve pins) are not results
                   scope=("kvtier.shell.jobs.", "kvtier.shell.perbyte.", "kvtier.shell.outbound.xǁOutboundǁ_job_done_",
                          "kvtier.shell.outbound.xǁOutboundǁ_verified_", "kvtier.shell.outbound.xǁOutboundǁ_land_")),
    "lifecycle": Group(("kvtier/lifecycle/*.py",),
                       ("tests/lifecycle", "tests/stateful/test_interleavings.py", "tests/symmetric/test_core_symmetric.py",
                        "tests/symmetric/test_stateful_symmetric.py", "tests/symmetric/test_core_views.py",
                        "tests/symmetric/test_core_survivors_symmetric.py"),
                       exclude=("kvtier/lifecycle/_table.py",)),
}
#: tests under a group's selection that do not test the runtime's behaviour (rendering, docs
#: freshness, import hygiene) or wait on the real clock: deselected, so they neither kill nor slow
#: anything
DESELECT = ("tests/lifecycle/test_diagrams.py", "tests/lifecycle/test_statecharts.py",
            "tests/lifecycle/test_reviewdoc.py", "tests/lifecycle/test_seqchart.py", "tests/lifecycle/test_imports.py",
            # real clock and a poll thread: seconds of waiting per mutant; the same reap is checked
            # on the virtual clock by the other b16 test of the file
            "tests/manager/test_virtual_park.py::test_b16_reaper_runs_without_any_engine_call",
            # measures a record's retained memory with tracemalloc, which mutmut's own tracing of
            # which test reaches which function (its first, "stats" run) allocates into
            "tests/lifecycle/test_retained_size.py",
            # reads TierCore's attribute names (the public surface), which mutmut's trampolines
            # multiply (``xǁTierCoreǁ<method>__mutmut_<n>``): it fails before any mutant runs
            "tests/lifecycle/test_core_surface.py")


def _toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def workspace(name: str) -> Path:
    """Create (or refresh) ``.mutate/<name>/`` and return it."""
    g = GROUPS[name]
    ws = WORK / name
    ws.mkdir(parents=True, exist_ok=True)
    for entry in ["kvtier", "tests", *ALSO]:
        link = ws / entry
        if not link.exists():
            link.symlink_to(REPO / entry)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    selection = _selection(name)
    pyproject += (
        "\n[tool.mutmut]\n"
        'source_paths = ["kvtier"]\n'
        f"only_mutate = {_toml_list(g.modules)}\n"
        f"do_not_mutate = {_toml_list(g.exclude)}\n"
        f"also_copy = {_toml_list(ALSO)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(selection)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "--timeout=120"]\n'
        'process_isolation = "forkserver"\n'
        "use_git_change_detection = false\n"
    )
    target = ws / "pyproject.toml"
    if not target.exists() or target.read_text(encoding="utf-8") != pyproject:
        target.write_text(pyproject, encoding="utf-8")
    return ws


def _selection(name: str) -> list[str]:
    g = GROUPS[name]
    return [*g.tests, *(f"--deselect={d}" for d in DESELECT if any(d.split("::")[0].startswith(t) for t in g.tests))]


def _lived(name: str, only: str = "") -> list[str]:
    """The group's mutants that survived, timed out, were suspicious or reached by no test (whose
    name contains one of the comma-separated ``only``)."""
    parts = [o for o in only.split(",") if o] or [""]
    eq = equivalent()
    return sorted(k for k, v in verdicts(name).items()
                  if v in ("survived", "timeout", "suspicious", "no tests") and any(o in k for o in parts) and k not in eq)


def run(name: str, children: int, only: str = "", *, again: bool = False) -> int:
    """Test the group's mutants not tested yet; ``only`` (comma-separated name prefixes: a module,
    ``kvtier.lifecycle.consumer``, or a function, ``kvtier.shell.outbound.xǁOutboundǁ_land``): only
    those of its mutants not tested yet; ``again``: the mutants that lived (after new tests were
    written), not the others."""
    ws = workspace(name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI")}
    env["HYPOTHESIS_PROFILE"] = "mutate"
    print(f"==> mutate {name}: {only or ', '.join(GROUPS[name].modules)}", flush=True)
    prefixes = [o for o in only.split(",") if o] or list(GROUPS[name].scope)
    names = (_lived(name, only) if again else
             sorted(k for k, v in verdicts(name).items() if v == "not checked" and k.startswith(tuple(prefixes)))
             if prefixes and verdicts(name) else [f"{o}*" for o in prefixes])
    if (again or prefixes) and not names:
        return 0
    return subprocess.call([sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names], cwd=ws,
                           env=env)


def fresh(name: str, only: str = "", timeout: float = 600.0, tests: list[str] | None = None) -> int:
    """Test again, each in a fresh Python process, the group's mutants that lived (after new tests
    were written), or only those whose name contains ``only``; record the new verdicts where
    :func:`verdicts` reads them.

    A fresh process imports the mutated modules with the mutant already switched on, so a mutant
    of code that runs at import time (attrs field declarations, validator tuples) is active too:
    mutmut's own workers fork from a process that imported the modules before any mutant was on,
    and such a mutant always *survives* there.  Each run is the group's whole test selection,
    stopped at the first failure (not only the tests mutmut traced to the function), so it is
    also a second opinion on a verdict a loaded host may have got wrong.

    ``tests`` (paths or node ids of the group's selection): run only those, and record only the
    mutants they kill; one that lives keeps its verdict (a part of the selection proves a kill,
    never a survival)."""
    mutants = workspace(name) / "mutants"
    todo = _lived(name, only)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(HYPOTHESIS_PROFILE="mutate", PYTHONPATH=str(mutants))
    print(f"==> fresh {name}: {len(todo)} mutants, each in a fresh process", flush=True)
    # mutmut copied the tests when it made the mutants: test with those of the checkout now
    shutil.copytree(REPO / "tests", mutants / "tests", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    for n, key in enumerate(todo, 1):
        env["MUTANT_UNDER_TEST"] = key
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                                 "--timeout=120", *(tests or _selection(name))], check=False, cwd=mutants, env=env,
                                timeout=timeout,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        except subprocess.TimeoutExpired:
            rc = 36
        if rc == 2:  # the tests could not even be collected: the mutant broke an import (they pass without it)
            rc = 1
        if tests and rc not in (1, 3):
            print(f"    [{n}/{len(todo)}] {key}: not killed by {' '.join(tests)} (verdict kept)", flush=True)
            continue
        _record(mutants, key, rc)
        print(f"    [{n}/{len(todo)}] {key}: {VERDICT.get(rc, 'suspicious')}", flush=True)
    return 0


def _record(mutants: Path, key: str, rc: int) -> None:
    module = key.rpartition(".")[0]
    meta = mutants / (module.replace(".", "/") + ".py.meta")
    data = json.loads(meta.read_text(encoding="utf-8"))
    data["exit_code_by_key"][key] = rc
    meta.write_text(json.dumps(data, indent=4), encoding="utf-8")


def verdicts(name: str, *, everything: bool = False) -> dict[str, str]:
    """mutant name -> verdict, for every mutant of group ``name`` that was generated (in its
    scope, unless ``everything``)."""
    scope = () if everything else GROUPS[name].scope
    out: dict[str, str] = {}
    for meta in sorted((WORK / name / "mutants").rglob("*.py.meta")):
        data = json.loads(meta.read_text(encoding="utf-8"))
        for key, code in data.get("exit_code_by_key", {}).items():
            if not scope or key.startswith(scope):
                out[key] = "not checked" if code is None else VERDICT.get(code, "suspicious")
    return out


def equivalent() -> dict[str, str]:
    """mutant name -> why it is equivalent (tools/mutate_equivalent.toml)."""
    path = Path(__file__).with_name("mutate_equivalent.toml")
    if not path.exists():
        return {}
    return {k: v for k, v in tomllib.loads(path.read_text(encoding="utf-8")).items() if isinstance(v, str)}


def _equivalents_tested(v: dict[str, str], eq: dict[str, str]) -> list[str]:
    """The listed equivalents among ``v``'s mutants that were tested and not killed: one not
    checked yet is in no count, and one killed is no equivalent."""
    return sorted(k for k, s in v.items() if s not in ("killed", "not checked") and k in eq)


def report(names: list[str]) -> dict[str, dict]:
    eq = equivalent()
    summary: dict[str, dict] = {}
    for name in names:
        v = verdicts(name)
        if not v:
            continue
        counts = Counter(v.values())
        # a mutant no test reaches lives as surely as one the tests missed: it counts against the score
        survivors = sorted(k for k, s in v.items() if s in ("survived", "suspicious", "timeout", "no tests")
                           and k not in eq)
        equiv = _equivalents_tested(v, eq)
        checked = counts["killed"] + counts["survived"] + counts["timeout"] + counts["suspicious"] + counts["no tests"]
        score = round(100 * counts["killed"] / (checked - len(equiv)), 1) if checked > len(equiv) else None
        summary[name] = {"counts": dict(counts), "equivalent": len(equiv), "score": score, "survivors": survivors}
        print(f"{name}: {dict(counts)}; equivalent {len(equiv)}; score {score} % of non-equivalent mutants")
        if GROUPS[name].scope:
            outside = len(verdicts(name, everything=True)) - len(v)
            summary[name]["outside_scope"] = outside
            print(f"    ({outside} mutants of the same files are outside the group's scope: not run, not counted)")
        modules = sorted({k.rpartition(".")[0] for k in v})
        for module in modules if len(modules) > 1 else ():
            mv = {k: s for k, s in v.items() if k.rpartition(".")[0] == module}
            mc = Counter(mv.values())
            me = len(_equivalents_tested(mv, eq))
            tested = mc["killed"] + mc["survived"] + mc["timeout"] + mc["suspicious"] + mc["no tests"] - me
            ms = round(100 * mc["killed"] / tested, 1) if tested > 0 else None
            summary[name].setdefault("modules", {})[module] = {"counts": dict(mc), "equivalent": me, "score": ms}
            print(f"    {module}: {dict(mc)}; equivalent {me}; score {ms} %")
        for k in survivors:
            print(f"    survived: {k}")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.mutate", description=__doc__.split("\n")[0])
    ap.add_argument("groups", nargs="*", help=f"groups to run (default: all of {', '.join(GROUPS)})")
    ap.add_argument("--list", action="store_true", help="list the groups")
    ap.add_argument("--report", action="store_true", help="only report what earlier runs found")
    ap.add_argument("--retest", action="store_true", help="test the surviving mutants again (after new tests)")
    ap.add_argument("--fresh", action="store_true",
                    help="test the surviving mutants again, each in a fresh process (import-time code)")
    ap.add_argument("--tests", nargs="+", help="with --fresh: run only these tests; record only the kills")
    ap.add_argument("--only", default="",
                    help="run: only this module's mutants (kvtier.lifecycle.consumer); --retest, --fresh: only the "
                         "mutants whose name contains one of these (comma-separated)")
    ap.add_argument("--children", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = ap.parse_args(argv)
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        ap.error(f"unknown group(s) {unknown}; groups: {', '.join(GROUPS)}")
    names = args.groups or list(GROUPS)
    if args.list:
        for name in names:
            g = GROUPS[name]
            scope = f" (only {', '.join(g.scope)})" if g.scope else ""
            print(f"{name}: mutates {', '.join(g.modules)}{scope}; tests {', '.join(g.tests)}")
        return 0
    rc = 0
    if not args.report:
        for name in names:
            rc = (fresh(name, args.only, tests=args.tests) if args.fresh
                  else run(name, args.children, args.only, again=args.retest)) or rc
    summary = report(names)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return rc


if __name__ == "__main__":
    sys.exit(main())
