"""Counterexamples as sequence charts: ``python -m tools check --chart DIR`` and ``python -m tools diagram``.

A violation's structured steps (:func:`.trace.to_chart_steps`) are drawn by the sequence-chart
renderer (:mod:`tools.seqchart`): one lane per actor (the prefill engine, the producer,
the network, each consumer and its decode engine), one row per thing that happened,
the broken property in a red box at the end, labelled with the checker's message.  The DOT text
depends only on the counterexample, so it is byte-stable (``python -m tools diagram --check`` compares it).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from tools.modelcheck.trace import to_chart_steps

if TYPE_CHECKING:
    from tools.modelcheck.result import Result
    from tools.seqchart import Step

__all__ = ["chart_dot", "chart_name", "chart_steps", "chart_title", "write_chart"]


def chart_steps(result: Result) -> list[Step]:
    """The counterexample of ``result`` as :class:`~tools.seqchart.Step` rows: a deadline
    firing is a (yellow) box on the lane of the core it fired in rather than an arrow from the
    clock across the chart; the last (``violation``) row carries the property and the checker's
    message, wrapped.  Empty when every property held."""
    from tools.seqchart import Step

    steps = [
        Step(d["dst"], d["dst"], d["label"], "timer", None) if d["kind"] == "timer" else Step(**d)
        for d in to_chart_steps(result)
    ]
    v = result.violation
    if steps and v is not None and steps[-1].kind == "violation":
        last = steps[-1]
        text = "\n".join(textwrap.wrap(f"{v.prop}: {v.message}", 60))
        steps[-1] = Step(last.src, last.dst, text, "violation", None)
    return steps


def chart_title(result: Result) -> str:
    """``python -m tools check [--profile P] [--bug B]: counterexample`` (what produced the chart)."""
    bits = ["python -m tools check"]
    if result.profile and result.profile != "core":
        bits.append(f"--profile {result.profile}")
    if result.bug:
        bits.append(f"--bug {result.bug}")
    return " ".join(bits) + ": counterexample"


def chart_name(result: Result) -> str:
    """The file name (without suffix) of the chart: the bug's name, or ``counterexample``, with the
    profile's name when it is not ``core``."""
    name = result.bug or "counterexample"
    if result.profile and result.profile != "core":
        name += f"-{result.profile}"
    return name


def chart_dot(result: Result) -> str:
    """The DOT text of the counterexample chart (no Graphviz needed).  Raises ValueError when
    ``result`` has no counterexample."""
    from tools.seqchart import lanes_for_trace, render_dot

    steps = chart_steps(result)
    if not steps:
        raise ValueError("every property held: there is no counterexample to draw")
    return render_dot(lanes_for_trace(steps), steps, chart_title(result))


def write_chart(result: Result, directory: Path | str) -> list[Path]:
    """Write ``<directory>/<name>.dot`` and ``.svg`` (:func:`chart_name`) of the counterexample, drawn
    by :func:`tools.seqchart.render_counterexample`, and return their paths.  Raises
    ValueError when there is no counterexample, FileNotFoundError when Graphviz ``dot`` is not
    installed (nothing is written then)."""
    from tools.seqchart import render_counterexample

    steps = chart_steps(result)
    if not steps:
        raise ValueError("every property held: there is no counterexample to draw")
    dot, svg = render_counterexample(steps, chart_title(result))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    dot_path = out / f"{chart_name(result)}.dot"
    svg_path = dot_path.with_suffix(".svg")
    dot_path.write_text(dot)
    svg_path.write_text(svg)
    return [dot_path, svg_path]
