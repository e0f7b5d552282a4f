"""Render the lifecycle machines of ``spec/lifecycle.toml`` as Graphviz diagrams.

Usage::

    python -m kvtier._tools.diagrams            # write diagrams/<machine>.dot and .svg
    python -m kvtier._tools.diagrams --check    # exit 1 if a committed diagram is stale

The DOT text is written here, straight from the spec records (no ``transitions`` GraphMachine: its
output depends on its version and it draws neither timers nor ignore rules), so it is byte-stable:
states in spec order, then edges in spec order.  Conventions:

* an edge per transition branch, labelled ``event [guard] / effect, effect`` and, on a second
  line, ``(reason)`` when the branch sets a reason code; ``=`` (stay) transitions are self-loops;
* the initial state is marked by an arrow from a dot; final states are double circles;
* a state's timer is printed inside it (``timer reap = unbound_store_timeout_s``); a waiting state
  without a timer lists the engine calls that leave it (``exits: …``);
* ignore rules are **not drawn** (there are dozens); a note lists them per state, with their
  reason codes; reject rules are listed the same way.

SVG is produced by ``dot -Tsvg``.  The SVG embeds the SHA-256 of the DOT text it was made from
(as a graph comment), so :func:`check` can tell a stale SVG without running ``dot``.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from kvtier._tools.spec import Machine, Spec, load

DIAGRAM_DIR = Path(__file__).resolve().parents[2] / "diagrams"

__all__ = ["DIAGRAM_DIR", "check", "dot_source", "main", "render_all", "render_svg"]


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
        f"// GENERATED from spec/lifecycle.toml by `python -m kvtier._tools.diagrams` — DO NOT EDIT.",
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


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _stamp(dot: str) -> str:
    return f"kvtier_dot_sha256 {_sha(dot)}"


def render_svg(dot: str, dot_binary: str | None = None) -> str:
    """SVG text for ``dot`` (runs Graphviz ``dot -Tsvg``), stamped with the DOT text's hash.

    Raises:
        FileNotFoundError: Graphviz ``dot`` is not installed (``apt-get install graphviz``).
        subprocess.CalledProcessError: ``dot`` failed.
    """
    binary = dot_binary or shutil.which("dot")
    if binary is None:
        raise FileNotFoundError("Graphviz `dot` is not installed (apt-get install graphviz)")
    head, rest = dot.split("{\n", 1)
    stamped = f"{head}{{\n  comment={_q(_stamp(dot))};\n{rest}"
    proc = subprocess.run([binary, "-Tsvg"], input=stamped.encode(), capture_output=True, check=True)
    return proc.stdout.decode()


def _expected(spec: Spec) -> dict[str, str]:
    return {name: dot_source(m) for name, m in spec.machines.items()}


def render_all(out_dir: Path | str = DIAGRAM_DIR, spec: Spec | None = None, *, svg: bool = True) -> list[Path]:
    """Write ``<machine>.dot`` (and ``<machine>.svg`` unless ``svg=False``) for every machine into
    ``out_dir``; return the paths written (files whose content is unchanged are not rewritten)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = spec if spec is not None else load()
    written: list[Path] = []
    for name, dot in _expected(spec).items():
        dot_path = out / f"{name}.dot"
        if not dot_path.exists() or dot_path.read_text() != dot:
            dot_path.write_text(dot)
            written.append(dot_path)
        if svg:
            svg_path = out / f"{name}.svg"
            if not svg_path.exists() or _stamp(dot) not in svg_path.read_text():
                svg_path.write_text(render_svg(dot))
                written.append(svg_path)
    return written


def check(out_dir: Path | str = DIAGRAM_DIR, spec: Spec | None = None, *, svg: bool = True) -> list[Path]:
    """Paths in ``out_dir`` that are missing or stale: a DOT file that differs from what the spec
    renders to, or an SVG not made from the current DOT text (no ``dot`` binary needed)."""
    out = Path(out_dir)
    spec = spec if spec is not None else load()
    stale: list[Path] = []
    for name, dot in _expected(spec).items():
        dot_path = out / f"{name}.dot"
        if not dot_path.exists() or dot_path.read_text() != dot:
            stale.append(dot_path)
        if svg:
            svg_path = out / f"{name}.svg"
            if not svg_path.exists() or _stamp(dot) not in svg_path.read_text():
                stale.append(svg_path)
    return stale


def main(argv: list[str] | None = None) -> int:
    """``kvtier diagram [--check] [--out DIR] [--no-svg]``. Returns 0, 1 (stale, with --check) or 2
    (cannot render: no ``dot``)."""
    ap = argparse.ArgumentParser(prog="kvtier diagram", description="Render the lifecycle spec as diagrams.")
    ap.add_argument("--out", type=Path, default=DIAGRAM_DIR, help="output directory (default: diagrams/)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed diagram is stale")
    ap.add_argument("--no-svg", action="store_true", help="DOT only (no Graphviz needed)")
    args = ap.parse_args(argv)
    if args.check:
        stale = check(args.out, svg=not args.no_svg)
        for p in stale:
            print(f"stale: {p} (run `kvtier diagram`)", file=sys.stderr)
        if not stale:
            print(f"diagrams in {args.out} are up to date")
        return 1 if stale else 0
    try:
        written = render_all(args.out, svg=not args.no_svg)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    for p in written:
        print(f"wrote {p}")
    if not written:
        print(f"diagrams in {args.out} are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
