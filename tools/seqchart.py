"""Message sequence charts with Graphviz: lanes across, steps down, a clock column on the left.

The input is deliberately generic — a list of :class:`Lane` and a list of :class:`Step` — so the
same renderer draws a scenario trace recorded from two real managers
(:mod:`tools.scenarios`) and a model checker counterexample (the checker's structured steps,
``tools.modelcheck.to_chart_steps``, or its printed trace read back by
:func:`steps_from_trace_lines`; :func:`render_counterexample` draws either).

Layout: every lane is a column of invisible points, one per step row, chained top to bottom
(``group`` + heavy weight keep the column straight); each row is a ``rank=same`` subgraph whose
nodes are chained left to right by invisible edges, so lanes keep their order.  A step between
two lanes is an edge between their points in that row, always written left → right (``dir=back``
when it points left) so it never fights the lane order.  A step on one lane (``src == dst``) is a
box in that lane.  The DOT text is built with the ``graphviz`` package and depends only on the
input, so it is byte-stable (the freshness tests compare it).

Step kinds and how they are drawn:

======== ==========================================================
msg      solid arrow (a wire message)
call     bold blue arrow (an engine call into a manager)
result   dashed green arrow (a job result back to the engine)
timer    yellow box on the lane (a deadline fired)
note     grey box on the lane (a state change, an ignored input)
violation red box (or red bold arrow) — a broken property
======== ==========================================================
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import attrs
import graphviz

__all__ = [
    "KINDS",
    "Lane",
    "Step",
    "lanes_for_trace",
    "render_counterexample",
    "render_dot",
    "steps_from_trace_lines",
]

KINDS = ("msg", "call", "result", "timer", "note", "violation")

#: Font size (points) of every label in a chart; the review page shows charts at natural size.
FONT_SIZE = 14


@attrs.frozen
class Lane:
    """One vertical lane: ``key`` is what steps name, ``label`` its header text."""

    key: str
    label: str


@attrs.frozen
class Step:
    """One row of a chart.

    Attributes:
        src: lane key the step starts at.
        dst: lane key it ends at (``== src`` for a note or timer on one lane).
        label: text shown on the arrow or in the box (``\\n`` breaks lines).
        kind: one of :data:`KINDS`.
        t: seconds on the scenario clock, shown in the time column (None: no time).
    """

    src: str
    dst: str
    label: str
    kind: str
    t: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"step kind must be one of {KINDS}, got {self.kind!r}")


_EDGE_STYLE = {
    "msg": {"color": "black", "fontcolor": "black"},
    "call": {"color": "#1f4e9c", "fontcolor": "#1f4e9c", "penwidth": "2"},
    "result": {"color": "#1d7a2e", "fontcolor": "#1d7a2e", "style": "dashed"},
    "timer": {"color": "#8a6d00", "fontcolor": "#8a6d00", "style": "dotted", "penwidth": "2"},
    "note": {"color": "gray40", "fontcolor": "gray20", "style": "dotted"},
    "violation": {"color": "#c00000", "fontcolor": "#c00000", "penwidth": "3"},
}
_BOX_STYLE = {
    "timer": {"shape": "box", "style": "rounded,filled", "fillcolor": "#fff4c2", "color": "#8a6d00"},
    "note": {"shape": "box", "style": "filled", "fillcolor": "#f2f2f2", "color": "gray60"},
    "violation": {"shape": "box", "style": "filled,bold", "fillcolor": "#ffe0e0", "color": "#c00000",
                  "fontcolor": "#c00000", "penwidth": "2"},
    # a call or a message to itself: drawn as a box too, in the arrow's colour
    "msg": {"shape": "box", "style": "rounded", "color": "black"},
    "call": {"shape": "box", "style": "rounded", "color": "#1f4e9c", "fontcolor": "#1f4e9c"},
    "result": {"shape": "box", "style": "rounded,dashed", "color": "#1d7a2e", "fontcolor": "#1d7a2e"},
}


def _esc(text: str) -> str:
    """DOT text: backslashes kept literal, newlines as centred line breaks (the ``graphviz``
    package quotes the rest)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _fmt_t(t: float) -> str:
    return f"{t:.3f}".rstrip("0").rstrip(".") + " s"


def _id(key: str) -> str:
    """A DOT identifier for a lane key (keys may hold any text)."""
    return "L_" + re.sub(r"[^A-Za-z0-9_]", lambda m: f"_{ord(m.group()):x}_", key)


def render_dot(lanes: Sequence[Lane], steps: Sequence[Step], title: str) -> str:
    """The DOT text of a sequence chart (deterministic for equal inputs).

    Raises:
        ValueError: no lanes, two lanes with one key, or a step naming an unknown lane.
    """
    if not lanes:
        raise ValueError("a sequence chart needs at least one lane")
    keys = [ln.key for ln in lanes]
    if len(set(keys)) != len(keys):
        raise ValueError(f"lane keys must be unique, got {keys}")
    col = {k: i for i, k in enumerate(keys)}
    for n, s in enumerate(steps, 1):
        for end in (s.src, s.dst):
            if end not in col:
                raise ValueError(f"step {n} ({s.label!r}) names lane {end!r}; lanes are {keys}")
    font = str(FONT_SIZE)
    g = graphviz.Digraph("seqchart")
    g.attr(
        "graph", label=_esc(title), labelloc="t", fontname="Helvetica", fontsize=str(FONT_SIZE + 4),
        nodesep="0.5", ranksep="0.12", newrank="true", splines="true",
    )
    # lane points are invisible: only the lane line and the arrows show
    g.attr("node", fontname="Helvetica", fontsize=font, shape="point", width="0.01", height="0.01",
           label="", style="invis")
    g.attr("edge", fontname="Helvetica", fontsize=font, arrowsize="0.8")
    has_time = any(st.t is not None for st in steps)  # no clock (a model trace): no time column
    cols = ["T", *keys] if has_time else list(keys)

    def nid(key: str, row: int) -> str:
        return f"t_{row}" if key == "T" else f"{_id(key)}_{row}"

    # Rows: the header, then per step its own row -- preceded by an empty spacer row when the
    # step is an arrow, because dot puts a flat edge's label in the rank above the edge: the
    # spacer gives it room instead of the previous step's arrow -- then the footer.
    step_row: list[int] = []
    row = 0
    spacers: list[int] = []
    for st in steps:
        if st.src != st.dst:
            row += 1
            spacers.append(row)
        row += 1
        step_row.append(row)
    last_row = row + 1
    for r in (0, last_row):
        with g.subgraph() as s:
            s.attr(rank="same")
            if has_time:
                s.node(nid("T", r), label="time" if r == 0 else "", shape="plaintext", group="T", style="solid")
            for ln in lanes:
                s.node(nid(ln.key, r), label=_esc(ln.label), shape="box", style="filled,bold",
                       fillcolor="#dde6f5", group=_id(ln.key), tooltip=_esc(ln.label))
    for r in spacers:
        with g.subgraph() as s:
            s.attr(rank="same")
            for c in cols:
                s.node(nid(c, r), group="T" if c == "T" else _id(c))
    shown_t: float | None = None
    for r, st in zip(step_row, steps):
        boxed = st.src == st.dst
        with g.subgraph() as s:
            s.attr(rank="same")
            tlabel = ""
            if st.t is not None and st.t != shown_t:
                tlabel, shown_t = _fmt_t(st.t), st.t
            if has_time:
                s.node(nid("T", r), label=tlabel, shape="plaintext", group="T", fontcolor="gray30", style="solid")
            for k in keys:
                if boxed and k == st.src:
                    s.node(nid(k, r), label=_esc(st.label), group=_id(k), tooltip=_esc(st.label),
                           **_BOX_STYLE[st.kind])
                else:
                    s.node(nid(k, r), group=_id(k))
    # lanes: vertical chains (kept straight and in order)
    for c in cols:
        for r in range(last_row):
            if c == "T":
                g.edge(nid(c, r), nid(c, r + 1), style="invis", weight="100")
            else:
                g.edge(nid(c, r), nid(c, r + 1), arrowhead="none", color="gray65", weight="100")
    # rows: invisible left-to-right chains fix the lane order
    for r in range(last_row + 1):
        for a, b in zip(cols, cols[1:]):
            g.edge(nid(a, r), nid(b, r), style="invis")
    # the steps that cross lanes
    for r, st in zip(step_row, steps):
        if st.src == st.dst:
            continue
        a, b = col[st.src], col[st.dst]
        left, right = (st.src, st.dst) if a < b else (st.dst, st.src)
        attrs_ = dict(_EDGE_STYLE[st.kind])
        if a > b:
            attrs_["dir"] = "back"
        g.edge(nid(left, r), nid(right, r), label=_esc(st.label), tooltip=_esc(st.label),
               constraint="false", **attrs_)
    return g.source


# -- model checker counterexamples ------------------------------------------------------------------

_STEP_RE = re.compile(r"^\s*(\d+)\.\s+(.*?)(?:\s+<--\s+violates\s+(\S+))?\s*$")
_NOTE_RE = re.compile(r"^\s+([A-Za-z][\w-]*):\s+(.*)$")
_CALL_RE = re.compile(r"^(P|c\d+)\.(\w+)\((.*)")
_MSG_RE = re.compile(r"^(deliver|LOSE|DUPLICATE)\s+(\w+)->(\w+)\s+(.*)$")
_TIMER_RE = re.compile(r"^timer\s+(\S+)\s+of\s+(P|c\d+)\.")
_TRANSPORT_RE = re.compile(r"^transport:\s+(.*)$")
_SESSION_RE = re.compile(r"^session\s+p<->(c\d+)\s+(.*)$")


def _lane_of(name: str) -> str:
    """The lane key of a component name in a trace (``p``/``P`` is the producer)."""
    return "P" if name.lower() == "p" else name


def _engine_of(lane: str) -> str:
    return "pe" if lane == "P" else f"{lane}.e"


def steps_from_trace_lines(lines: Iterable[str]) -> list[Step]:
    """Steps of a ``python -m tools check`` counterexample, read from its text output.

    Reads the numbered lines after ``counterexample:`` (anything before is skipped; if there is
    no such header every line is read): ``P.store(...)`` / ``c1.load(...)`` become engine
    calls, ``deliver a->b ...`` a message (``LOSE``/``DUPLICATE`` say so in the label), ``timer
    T of X...`` a timer on X's lane, ``transport: ...`` a note on the producer, ``session p<->c1
    ...`` a violation-free note across both lanes, and the indented ``X: ...`` lines notes on X's
    lane.  The step marked ``<-- violates PROP`` is followed by a ``violation`` step; the
    ``VIOLATION of PROP: message`` line, when present, becomes its label.  Unknown step lines
    become notes on the producer lane, so a new action kind still renders.  Model steps carry no
    time (``t=None``).

    Raises:
        ValueError: no numbered step line was found.
    """
    lines = [ln.rstrip("\n") for ln in lines]
    message = ""
    for ln in lines:
        if ln.startswith("VIOLATION of "):
            message = ln[len("VIOLATION of "):]
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == "counterexample:") + 1
    except StopIteration:
        start = 0
    steps: list[Step] = []
    pending_violation: tuple[str, str] | None = None  # (lane, property) of the marked step
    seen_step = False

    def flush_violation() -> None:
        nonlocal pending_violation
        if pending_violation is not None:
            lane, prop = pending_violation
            text = message if message.startswith(prop) else f"{prop} violated" + (f": {message}" if message else "")
            steps.append(Step(lane, lane, _wrap(text, 60), "violation"))
            pending_violation = None

    for ln in lines[start:]:
        m = _STEP_RE.match(ln)
        if m:
            flush_violation()
            seen_step = True
            action, prop = m.group(2), m.group(3)
            step = _action_step(action)
            steps.append(step)
            if prop:
                pending_violation = (step.dst, prop)
            continue
        n = _NOTE_RE.match(ln)
        if n and seen_step:
            lane = _lane_of(n.group(1))
            steps.append(Step(lane, lane, n.group(2), "note"))
    flush_violation()
    if not seen_step:
        raise ValueError("no counterexample steps (lines like '  1. P.store(X chunk 0)') in the trace")
    return steps


def _action_step(action: str) -> Step:
    m = _CALL_RE.match(action)
    if m:
        lane = _lane_of(m.group(1))
        return Step(_engine_of(lane), lane, action.split(".", 1)[1], "call")
    m = _MSG_RE.match(action)
    if m:
        verb, src, dst, rest = m.groups()
        label = rest if verb == "deliver" else f"{rest}\n({'lost' if verb == 'LOSE' else 'duplicated'})"
        return Step(_lane_of(src), _lane_of(dst), label, "msg")
    m = _TIMER_RE.match(action)
    if m:
        lane = _lane_of(m.group(2))
        return Step(lane, lane, action, "timer")
    m = _TRANSPORT_RE.match(action)
    if m:
        return Step("P", "P", action, "note")
    m = _SESSION_RE.match(action)
    if m:
        return Step("P", _lane_of(m.group(1)), m.group(2), "note")
    return Step("P", "P", action, "note")


def _wrap(text: str, width: int) -> str:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(cur)
    return "\n".join(lines)


_MODEL_LANES = {"clock": "clock", "engine:prefill": "engine (prefill)", "producer": "producer", "network": "network"}
_MODEL_LANE_RE = re.compile(r"^(consumer|engine:decode):(\d+)$")


def _model_lanes(used: set[str]) -> list[Lane]:
    """Lanes for the model checker's structured steps (``tools.modelcheck.trace``): the
    clock, the producer's engine, the producer, the network (messages cross it), then each consumer
    and its engine by number; only the lanes the steps use, unknown keys last."""
    lanes = [Lane(k, label) for k, label in _MODEL_LANES.items() if k in used]
    numbered = sorted(
        (int(m.group(2)), m.group(1) != "consumer", k)
        for k in used if (m := _MODEL_LANE_RE.match(k))
    )
    for n, is_engine, k in numbered:
        lanes.append(Lane(k, f"engine (decode c{n})" if is_engine else f"consumer c{n}"))
    lanes.extend(Lane(k, k) for k in sorted(used - {ln.key for ln in lanes}))
    return lanes


def lanes_for_trace(steps: Sequence[Step]) -> list[Lane]:
    """Lanes for counterexample steps: the producer's engine, the producer, then each consumer
    and its engine in order of first appearance (``c1``, ``c1.e``, ``c2`` …).  Steps in the model
    checker's own lane vocabulary (``producer``, ``consumer:1``, ``engine:decode:1``, ``network``,
    ``clock``: :func:`tools.modelcheck.to_chart_steps`) get those lanes instead."""
    used = {k for s in steps for k in (s.src, s.dst)}
    if used & {"producer", "engine:prefill"} or any(_MODEL_LANE_RE.match(k) for k in used):
        return _model_lanes(used)
    consumers = sorted({k for k in used if k not in ("pe", "P") and not k.endswith(".e")},
                       key=lambda k: (len(k), k))
    lanes = [Lane("pe", "engine (prefill)"), Lane("P", "producer")]
    for c in consumers:
        lanes.append(Lane(c, f"consumer {c}"))
        lanes.append(Lane(f"{c}.e", f"engine (decode {c})"))
    extra = sorted(used - {ln.key for ln in lanes})
    lanes.extend(Lane(k, k) for k in extra)
    return lanes


def render_counterexample(steps: Sequence[Step], title: str) -> tuple[str, str]:
    """``(dot, svg)`` of a counterexample chart; lanes are chosen by :func:`lanes_for_trace`.

    Raises:
        FileNotFoundError: Graphviz ``dot`` is not installed.
        ValueError: see :func:`render_dot`.
    """
    from tools.dot import render_svg

    dot = render_dot(lanes_for_trace(steps), steps, title)
    return dot, render_svg(dot)
