"""Render the lifecycle spec, recorded scenarios and a counterexample as diagrams and review pages.

Usage (from a checkout)::

    python -m tools diagram            # rewrite diagrams/ and the generated docs (make diagrams)
    python -m tools diagram --check    # exit 1 if anything generated is stale

What is generated (every ``.dot`` also as ``.svg``):

==================================== =========================================================
``diagrams/<machine>.dot``            the full graph: every branch (this module, below)
``diagrams/<machine>-overview.dot``   the overview (:func:`tools.statecharts.overview_dot`)
``diagrams/states/<m>-<state>.dot``   one state's detail (:func:`~tools.statecharts.state_dot`)
``diagrams/scenarios/<name>.dot``     a recorded scenario (:mod:`tools.scenarios`)
``diagrams/counterexamples/<bug>.dot`` the model checker's trace for a planted bug
``docs/states/<machine>.md``          overview + per-state table + state details
``docs/review.md``                    the reviewer's page (:mod:`tools.reviewdoc`)
==================================== =========================================================

Files under ``diagrams/`` that nothing generates any more (a renamed state, a removed scenario)
are deleted by a render and reported by ``--check``.

The full graph's DOT text is written here, straight from the spec records (no ``transitions`` GraphMachine: its
output depends on its version and it draws neither timers nor ignore rules), so it is byte-stable:
states in spec order, then edges in spec order.  Conventions:

* an edge per transition branch, labelled ``event [guard] / effect, effect`` and, on a second
  line, ``(reason)`` when the branch sets a reason code; ``=`` (stay) transitions are self-loops;
* the initial state is marked by an arrow from a dot; final states are double circles;
* a state's timer is printed inside it (``timer reap = unbound_store_timeout_s``); a waiting state
  without a timer lists the engine calls that leave it (``exits: …``);
* ignore rules are **not drawn** (there are dozens); a note lists them per state, with their
  reason codes; reject rules are listed the same way.

SVG is produced by ``dot -Tsvg`` (:mod:`tools.dot`).  The SVG embeds the SHA-256 of the DOT text it
was made from (as a graph comment), so :func:`check` can tell a stale SVG without running ``dot``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tools.checkout import root as checkout_root
from tools.dot import render_svg, stamp
from tools.spec import Machine, Spec, load, spec_path

if TYPE_CHECKING:
    from tools.modelcheck import Result


def diagram_dir(root: Path | None = None) -> Path:
    """``diagrams/`` of checkout ``root`` (default: the one around the current directory)."""
    return (root if root is not None else checkout_root()) / "diagrams"


def docs_dir(root: Path | None = None) -> Path:
    """``docs/`` of checkout ``root`` (default: the one around the current directory)."""
    return (root if root is not None else checkout_root()) / "docs"


#: The planted bug whose model-checker counterexample the review page shows.
EXAMPLE_BUG = "write_after_abort"

__all__ = [
    "EXAMPLE_BUG",
    "check",
    "counterexample_lines",
    "counterexample_result",
    "diagram_dir",
    "docs_dir",
    "dot_source",
    "expected",
    "render_all",
    "render_svg",
]


def _q(text: str) -> str:
    """A DOT double-quoted string (newlines as centred line breaks)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _wrap(items: list[str], width: int) -> list[str]:
    """Greedy line wrap of comma-separated items."""
    lines: list[str] = []
    cur = ""
    for item in items:
        nxt = f"{cur}, {item}" if cur else item
        if cur and len(nxt) > width:
            lines.append(cur + ",")
            cur = item
        else:
            cur = nxt
    if cur:
        lines.append(cur)
    return lines


def dot_source(m: Machine) -> str:
    """The DOT text of one machine (deterministic)."""
    out = [
        f"// GENERATED from spec/lifecycle.toml by `python -m tools diagram` — DO NOT EDIT.",
        f"// machine {m.name}: {m.doc}",
        f"digraph {m.name} {{",
        f"  graph [rankdir=LR, fontname=Helvetica, fontsize=12, labelloc=t, nodesep=0.35, ranksep=0.55,"
        f" label={_q(f'{m.name}: {m.doc}')}];",
        "  node [shape=box, style=rounded, fontname=Helvetica, fontsize=10];",
        "  edge [fontname=Helvetica, fontsize=8];",
        '  __start [shape=point, width=0.12, label=""];',
    ]
    for s in m.states:
        lines = [s.name]
        if s.timer is not None:
            t = m.timers[s.timer]
            lines.append(f"timer {t.name} = {t.config_key}")
        elif s.exit:
            lines.extend(["exits: " + l if i == 0 else l for i, l in enumerate(_wrap(list(s.exit), 28))])
        attrs = [f"label={_q(chr(10).join(lines))}"]
        if s.name in m.final:
            attrs.insert(0, "shape=doublecircle")
            attrs.append("style=solid")
        out.append(f"  {s.name} [{', '.join(attrs)}];")
    out.append(f"  __start -> {m.initial};")
    ignored: dict[str, list[str]] = {}
    rejected: dict[str, list[str]] = {}
    for s in m.states:
        for event in m.events:
            rule = m.rules.get((s.name, event))
            if rule is None:
                continue
            if rule.kind == "ignore":
                ignored.setdefault(s.name, []).append(f"{event} ({rule.reason})")
                continue
            if rule.kind == "reject":
                rejected.setdefault(s.name, []).append(f"{event} ({rule.reason})")
                continue
            ordered = [b for b in rule.branches if b.guard] + [b for b in rule.branches if not b.guard]
            for b in ordered:
                head = event + (f" [{b.guard}]" if b.guard else "")
                label = head + (" / " + ", ".join(b.effects) if b.effects else "")
                if b.reason:
                    label += f"\n({b.reason})"
                out.append(f"  {s.name} -> {b.dest} [label={_q(label)}];")
    notes = []
    if ignored:
        notes.append("ignored inputs (not drawn):")
        for state, items in ignored.items():
            wrapped = _wrap(items, 90)
            notes.append(f"{state}: {wrapped[0]}")
            notes.extend(f"    {w}" for w in wrapped[1:])
    if rejected:
        notes.append("rejected inputs (InvalidTransition):")
        for state, items in rejected.items():
            notes.append(f"{state}: {', '.join(items)}")
    if notes:
        text = "".join(n.replace("\\", "\\\\").replace('"', '\\"') + "\\l" for n in notes)
        out.append(f'  __notes [shape=note, fontsize=8, label="{text}"];')
    out.append("}")
    return "\n".join(out) + "\n"


@functools.cache
def counterexample_lines(bug: str) -> tuple[str, ...]:
    """The text ``python -m tools check --bug BUG`` prints (run as a subprocess in the checkout
    these tools live in, cached per process).

    Raises:
        RuntimeError: the checker did not report a violation for ``bug`` (exit status 1).
    """
    proc = subprocess.run(
        [sys.executable, "-m", "tools.modelcheck", "--bug", bug],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1],
    )
    if proc.returncode != 1 or "counterexample:" not in proc.stdout:
        raise RuntimeError(
            f"`python -m tools check --bug {bug}` exited {proc.returncode} without a counterexample; "
            f"stdout tail: {proc.stdout[-400:]!r} stderr tail: {proc.stderr[-400:]!r}")
    return tuple(proc.stdout.splitlines())


@functools.cache
def counterexample_result(bug: str) -> Result:
    """The model checker's :class:`~tools.modelcheck.Result` for ``bug`` at the default
    (``core``) bounds, run in this process (cached per process; deterministic, so the chart drawn
    from its structured steps is byte-stable).

    Raises:
        RuntimeError: the checker reported no violation for ``bug``.
    """
    from tools.modelcheck import Bounds, check

    result = check(Bounds(), bug=bug, profile="core")
    if result.violation is None:
        raise RuntimeError(f"`python -m tools check --bug {bug}` found no violation: {result.states} states explored")
    return result


def expected(spec: Spec, out_dir: Path, docs_dir: Path, root: Path | None = None,
             ) -> tuple[dict[str, str], dict[str, str]]:
    """What the generated files must contain: ``(dots, docs)``, each ``{relative path: text}``
    (``dots`` relative to ``out_dir``, ``docs`` to ``docs_dir``).  Runs every recorded scenario
    (they assert their outcomes: a failing one raises
    :class:`~tools.scenarios.ScenarioFailed`) and the model checker for
    :data:`EXAMPLE_BUG` (its chart is drawn from the checker's structured steps)."""
    from tools import reviewdoc, scenarios, seqchart, statecharts

    dots: dict[str, str] = {}
    docs: dict[str, str] = {}
    rel = Path(os.path.relpath(out_dir, docs_dir)).as_posix()
    rel_states = Path(os.path.relpath(out_dir, docs_dir / "states")).as_posix()
    for name, m in spec.machines.items():
        dots[f"{name}.dot"] = dot_source(m)
        dots[f"{name}-overview.dot"] = statecharts.overview_dot(m)
        for st in m.states:
            dots[f"states/{name}-{st.name}.dot"] = statecharts.state_dot(m, st.name)
        docs[f"states/{name}.md"] = statecharts.machine_page(m, diagrams_rel=rel_states)
    recorded = []
    for sc in scenarios.SCENARIOS:
        trace = scenarios.record(sc, spec)
        dots[f"scenarios/{sc.name}.dot"] = seqchart.render_dot(scenarios.LANES, trace.steps(), sc.title)
        recorded.append((sc.name, sc.title, sc.doc, sc.properties, tuple(trace.checks)))
    from tools.modelcheck.chart import chart_dot, chart_title

    result = counterexample_result(EXAMPLE_BUG)
    title = chart_title(result)
    dots[f"counterexamples/{EXAMPLE_BUG}.dot"] = chart_dot(result)
    docs["review.md"] = reviewdoc.review_page(
        spec, diagrams_rel=rel, scenarios=recorded, awaiting=scenarios.AWAITING,
        counterexample=(EXAMPLE_BUG, title), root=root,
    )
    return dots, docs


def _orphans(out: Path, dots: dict[str, str]) -> list[Path]:
    """Generated-looking files under ``out`` that nothing generates any more."""
    keep = set(dots) | {d[: -len(".dot")] + ".svg" for d in dots}
    found = [p for ext in ("*.dot", "*.svg") for p in out.rglob(ext)] if out.exists() else []
    return sorted(p for p in found if p.relative_to(out).as_posix() not in keep)


def _docs_dir(out: Path, docs: Path | str | None, root: Path) -> Path:
    """The pages go to ``docs/`` beside the committed ``diagrams/``; with another diagram
    directory, to ``<out_dir>/docs`` unless named (so a trial render never rewrites docs/)."""
    if docs is not None:
        return Path(docs)
    return docs_dir(root) if out.resolve() == diagram_dir(root).resolve() else out / "docs"


def _out_of_date(out: Path, docs_out: Path, dots: dict[str, str], docs: dict[str, str], svg: bool,
                 ) -> list[tuple[Path, Callable[[], str] | None]]:
    """Every generated path whose file is missing or differs, with what to write there (a
    callable, so an SVG is only rendered when needed), or ``None`` for an orphan to delete."""
    todo: list[tuple[Path, Callable[[], str] | None]] = []
    for rel, dot in dots.items():
        dot_path = out / rel
        if not dot_path.exists() or dot_path.read_text() != dot:
            todo.append((dot_path, lambda dot=dot: dot))
        svg_path = dot_path.with_suffix(".svg")
        if svg and (not svg_path.exists() or stamp(dot) not in svg_path.read_text()):
            todo.append((svg_path, lambda dot=dot: render_svg(dot)))
    for rel, text in docs.items():
        path = docs_out / rel
        if not path.exists() or path.read_text() != text:
            todo.append((path, lambda text=text: text))
    todo.extend((orphan, None) for orphan in _orphans(out, dots))
    return todo


def render_all(out_dir: Path | str | None = None, spec: Spec | None = None, *, svg: bool = True,
               docs_dir: Path | str | None = None, root: Path | None = None) -> list[Path]:
    """Write every generated file (see the module docstring) of checkout ``root`` (default: the
    one around the current directory) and delete orphans; return the paths written or deleted
    (files whose content is unchanged are not rewritten).  ``out_dir`` defaults to ``diagrams/``,
    ``docs_dir`` to ``docs/`` for the committed ``diagrams/``, else ``<out_dir>/docs``.

    Raises:
        FileNotFoundError: ``svg`` and Graphviz ``dot`` is not installed.
        tools.scenarios.ScenarioFailed: a scenario no longer shows its outcome.
    """
    root = root if root is not None else checkout_root()
    out = Path(out_dir) if out_dir is not None else diagram_dir(root)
    docs_out = _docs_dir(out, docs_dir, root)
    spec = spec if spec is not None else load(spec_path(root))
    todo = _out_of_date(out, docs_out, *expected(spec, out, docs_out, root), svg)
    for path, make in todo:
        if make is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(make())
    return [path for path, _ in todo]


def check(out_dir: Path | str | None = None, spec: Spec | None = None, *, svg: bool = True,
          docs_dir: Path | str | None = None, root: Path | None = None) -> list[Path]:
    """Paths that are missing, stale or orphaned: a DOT or markdown file that differs from what a
    render would write, an SVG not made from the current DOT text (no ``dot`` binary needed), or
    a file under ``out_dir`` nothing generates."""
    root = root if root is not None else checkout_root()
    out = Path(out_dir) if out_dir is not None else diagram_dir(root)
    docs_out = _docs_dir(out, docs_dir, root)
    spec = spec if spec is not None else load(spec_path(root))
    return [path for path, _ in _out_of_date(out, docs_out, *expected(spec, out, docs_out, root), svg)]


def main(out: Path | None, docs: Path | None, *, check_only: bool, svg: bool, root: Path) -> int:
    """``python -m tools diagram [--check] [--out DIR] [--docs DIR] [--no-svg]``. Returns 0, 1
    (stale, with ``check_only``) or 2 (cannot render: no ``dot``, a scenario failed, the checker
    broke)."""
    from tools.scenarios import ScenarioFailed

    out = out if out is not None else diagram_dir(root)
    try:
        if check_only:
            stale = check(out, svg=svg, docs_dir=docs, root=root)
            for p in stale:
                print(f"stale: {p} (run `python -m tools diagram`)", file=sys.stderr)
            if not stale:
                print(f"diagrams in {out} and pages in {_docs_dir(out, docs, root)} are up to date")
            return 1 if stale else 0
        written = render_all(out, svg=svg, docs_dir=docs, root=root)
    except (FileNotFoundError, ScenarioFailed, RuntimeError) as exc:
        print(f"python -m tools diagram: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    for p in written:
        print(f"{'deleted' if not p.exists() else 'wrote'} {p}")
    if not written:
        print(f"diagrams in {out} and pages in {_docs_dir(out, docs, root)} are up to date")
    return 0
