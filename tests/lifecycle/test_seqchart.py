"""Sequence charts (tools.seqchart): the generic Lane/Step renderer, and a model-checker
counterexample -- from a real ``python -m tools check --bug`` run -- drawn as a chart."""

from __future__ import annotations

import html
import re
import shutil

import pytest

from tools import diagrams
from tools.spec import load
from tools.seqchart import (
    Lane,
    Step,
    lanes_for_trace,
    render_counterexample,
    render_dot,
    steps_from_trace_lines,
)

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")

LANES = [Lane("pe", "engine (prefill)"), Lane("P", "producer"), Lane("C", "consumer"), Lane("ce", "engine (decode)")]
STEPS = [
    Step("pe", "P", "submit_store(job 1)", "call", 0.0),
    Step("P", "P", "A: absent → parked", "note", 0.0),
    Step("C", "P", "fetch(A, r0)", "msg", 1.5),
    Step("P", "P", "reap_deadline\nA: parked → tombstoned", "timer", 60.0),
    Step("P", "pe", "job 1 failed (reaped)", "result", 60.0),
    Step("C", "C", 'demo_property broken: "quoted" \\ text', "violation", None),
]


def _edges(dot: str) -> list[str]:
    return [ln.strip() for ln in dot.splitlines() if " -> " in ln and "style=invis" not in ln
            and "arrowhead=none" not in ln]


def test_render_dot_is_deterministic_and_draws_every_step() -> None:
    dot = render_dot(LANES, STEPS, "hand-built")
    assert dot == render_dot(list(LANES), list(STEPS), "hand-built")
    steps_drawn = _edges(dot)
    # three steps cross lanes; each is one edge, written left -> right
    assert len(steps_drawn) == 3
    call, msg, result = steps_drawn
    assert call.startswith("L_pe_") and "-> L_P_" in call and "dir=back" not in call
    assert msg.startswith("L_P_") and "-> L_C_" in msg and "dir=back" in msg  # consumer -> producer points left
    assert result.startswith("L_pe_") and "dir=back" in result and "style=dashed" in result
    # boxes on one lane: note, timer (two lines), violation (red)
    assert 'label="A: absent → parked"' in dot
    assert 'label="reap_deadline\\nA: parked → tombstoned"' in dot
    violation = next(ln for ln in dot.splitlines() if "demo_property broken" in ln)
    assert "#c00000" in violation and '\\"quoted\\" \\\\ text' in violation
    # the clock column shows a time only when it changes
    times = re.findall(r'label="([0-9.]+ s)"', dot)
    assert times == ["0 s", "1.5 s", "60 s"]
    # lane headers in order, at the top and the bottom
    heads = re.findall(r'label="?(engine \(prefill\)|producer|consumer|engine \(decode\))"? fillcolor', dot)
    assert heads[:4] == ["engine (prefill)", "producer", "consumer", "engine (decode)"]
    assert len(heads) == 8


def test_render_dot_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="names lane 'X'"):
        render_dot(LANES, [Step("P", "X", "m", "msg")], "t")
    with pytest.raises(ValueError, match="unique"):
        render_dot([Lane("P", "a"), Lane("P", "b")], [], "t")
    with pytest.raises(ValueError, match="at least one lane"):
        render_dot([], [], "t")
    with pytest.raises(ValueError, match="kind must be one of"):
        Step("P", "C", "m", "message")


def test_no_time_column_without_a_clock() -> None:
    dot = render_dot(LANES, [Step("pe", "P", "store", "call")], "model trace")
    assert 'label=time' not in dot and "t_0" not in dot


@needs_dot
def test_render_counterexample_returns_dot_and_svg_for_hand_built_steps() -> None:
    dot, svg = render_counterexample(STEPS, "hand-built counterexample")
    svg = html.unescape(svg)
    assert dot.startswith("digraph seqchart {")
    assert "<svg" in svg and "hand-built counterexample" in svg
    assert "job 1 failed (reaped)" in svg and "demo_property broken" in svg
    assert "kvtier_dot_sha256" in svg  # stamped like every generated SVG


TRACE = """\
kvtier model check (planted bug: x): ids=2
VIOLATION of demo_property: c1 wrote block data for X into slots (0,) while its load was aborting
counterexample:
  1. P.store(X chunk 0) + P.request_finished
       P: X absent->parked
  2. c1.load(X)
       c1: X absent->in_flight, SendFetch(X)
  3. deliver c1->p fetch X r0 keys=1 g101
       P: X parked->serving, SendBlocks(X)
  4. timer load of c1.consumer(X) fires
       c1: X in_flight->aborting, SendAbortFetch(X)
  5. LOSE p->c1 abort_ack X r0 g101
  6. transport: complete X r0 (to c1)
  7. session p<->c2 dies (both sides get disconnect)
  8. something new the adapter has never seen
  9. deliver p->c1 block_data X r0 [0:1] g101   <-- violates demo_property
"""


def test_steps_from_trace_lines_reads_every_action_kind() -> None:
    steps = steps_from_trace_lines(TRACE.splitlines())
    kinds = [(s.src, s.dst, s.kind) for s in steps]
    assert kinds == [
        ("pe", "P", "call"), ("P", "P", "note"),
        ("c1.e", "c1", "call"), ("c1", "c1", "note"),
        ("c1", "P", "msg"), ("P", "P", "note"),
        ("c1", "c1", "timer"), ("c1", "c1", "note"),
        ("P", "c1", "msg"),
        ("P", "P", "note"),
        ("P", "c2", "note"),
        ("P", "P", "note"),
        ("P", "c1", "msg"), ("c1", "c1", "violation"),
    ]
    assert steps[8].label.endswith("(lost)")
    assert steps[-1].label.startswith("demo_property: c1 wrote block data")
    assert all(s.t is None for s in steps)
    assert [ln.key for ln in lanes_for_trace(steps)] == ["pe", "P", "c1", "c1.e", "c2", "c2.e"]


def test_steps_from_trace_lines_without_header_or_steps() -> None:
    body = TRACE.split("counterexample:\n", 1)[1]
    first = steps_from_trace_lines(body.splitlines())[0]
    assert first == Step("pe", "P", "store(X chunk 0) + P.request_finished", "call")
    with pytest.raises(ValueError, match="no counterexample steps"):
        steps_from_trace_lines(["VIOLATION of x: y", "counterexample:"])


@needs_dot
def test_a_planted_bug_counterexample_renders_as_a_chart() -> None:
    """A real `python -m tools check --bug` run: its printed trace becomes a chart whose steps are the
    trace's steps and whose last box is the violated property."""
    lines = diagrams.counterexample_lines("prune_before_retention")
    numbered = [ln for ln in lines if re.match(r"^\s*\d+\.\s", ln)]
    prop = next(ln.split()[2].rstrip(":") for ln in lines if ln.startswith("VIOLATION of "))
    assert prop in load().properties
    steps = steps_from_trace_lines(lines)
    violation = steps[-1]
    assert violation.kind == "violation" and violation.label.startswith(prop)
    # every numbered action is a step (notes come on top)
    actions = [s for s in steps if s.kind in ("call", "msg", "timer")]
    assert len(actions) == len(numbered)
    assert any(s.kind == "timer" and "reap" in s.label for s in steps)
    assert any(s.kind == "msg" and s.src == "c1" and s.dst == "P" and "fetch X" in s.label for s in steps)
    dot, svg = render_counterexample(steps, "prune_before_retention")
    svg = html.unescape(svg)
    assert prop in svg and "consumer c1" in svg
    assert dot == render_dot(lanes_for_trace(steps), steps, "prune_before_retention")


def test_model_checker_lanes_for_its_structured_steps() -> None:
    """Steps in the model checker's own lane vocabulary (tools.modelcheck.to_chart_steps)
    get its lanes: only those used, the producer side first, the network between the producer and
    the consumers, each consumer beside its engine, by number."""
    steps = [
        Step("engine:decode:2", "consumer:2", "load(Y)", "call"),
        Step("consumer:2", "producer", "fetch Y r0", "msg"),
        Step("network", "producer", "transfer_released(Y r0)", "result"),
        Step("consumer:10", "consumer:10", "note", "note"),
        Step("engine:prefill", "producer", "store(Y chunk 0)", "call"),
        Step("somewhere", "somewhere", "unknown lane", "note"),
    ]
    lanes = lanes_for_trace(steps)
    assert [(ln.key, ln.label) for ln in lanes] == [
        ("engine:prefill", "engine (prefill)"), ("producer", "producer"), ("network", "network"),
        ("consumer:2", "consumer c2"), ("engine:decode:2", "engine (decode c2)"), ("consumer:10", "consumer c10"),
        ("somewhere", "somewhere"),
    ]
    assert render_dot(lanes, steps, "model").startswith("digraph seqchart {")
