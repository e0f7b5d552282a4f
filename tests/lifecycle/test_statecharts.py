"""Reviewer views of the machines (tools.statecharts): the overview is legible at
1200 px, draws the normal path as a straight line and only state changes; per-state details and
tables cover every branch; hover text carries the spec's prose; the layout hint is validated."""

from __future__ import annotations

import html
import re
import shutil
import struct
import subprocess
from collections import defaultdict

import pytest

from tools import statecharts as sc
from tools.spec import SpecError, load, loads, spec_path

SPEC = load()
PRODUCER = SPEC.machines["producer"]
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")

#: Body text on a web page: nothing in the overview may render smaller.
BODY_PX = 12.0
WIDTH_PX = 1200


def _run_dot(dot: str, *args: str) -> bytes:
    return subprocess.run(["dot", *args], input=dot.encode(), capture_output=True, check=True).stdout


def _effective_font_px(svg: str, width_px: int) -> float:
    """Smallest label size in px when the SVG is drawn ``width_px`` wide."""
    vb = re.search(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ([\d.]+)"', svg)
    assert vb, "no viewBox"
    sizes = [float(x) for x in re.findall(r'font-size="([\d.]+)"', svg)]
    assert sizes, "no text"
    return min(sizes) * width_px / float(vb.group(1))


@needs_dot
@pytest.mark.parametrize("machine", list(SPEC.machines))
def test_overview_is_legible_at_1200_px(machine: str) -> None:
    dot = sc.overview_dot(SPEC.machines[machine])
    svg = _run_dot(dot, "-Tsvg").decode()
    px = _effective_font_px(svg, WIDTH_PX)
    assert px >= BODY_PX, f"{machine} overview: smallest label is {px:.1f} px at {WIDTH_PX} px wide"
    # and a PNG rendered 1200 px wide is what a reviewer would see (dpi 96, 12.5 in)
    png = _run_dot(dot, "-Tpng", "-Gdpi=96", f"-Gsize={WIDTH_PX / 96},100!")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, _height = struct.unpack(">II", png[16:24])
    assert width == WIDTH_PX


def _plain_nodes(dot: str) -> dict[str, tuple[float, float]]:
    out = {}
    for line in _run_dot(dot, "-Tplain").decode().splitlines():
        parts = line.split()
        if parts and parts[0] == "node":
            out[parts[1].strip('"')] = (float(parts[2]), float(parts[3]))
    return out


@needs_dot
@pytest.mark.parametrize("machine", list(SPEC.machines))
def test_normal_path_is_a_straight_line(machine: str) -> None:
    m = SPEC.machines[machine]
    pos = _plain_nodes(sc.overview_dot(m))
    path = m.layout.normal_path
    assert len(path) >= 3
    xs = {round(pos[s][0], 2) for s in path}
    assert len(xs) == 1, f"{machine}: normal path not vertical: {[(s, pos[s]) for s in path]}"
    ys = [pos[s][1] for s in path]
    assert ys == sorted(ys, reverse=True) and len(set(ys)) == len(ys)  # top to bottom, in order


def _overview_edges(dot: str) -> list[tuple[str, str, str]]:
    edges = []
    for line in dot.splitlines():
        m = re.match(r'\s*(\w+) -> (\w+) \[(.*)\]', line)
        if m and "style=invis" not in m.group(3):
            edges.append((m.group(1), m.group(2), m.group(3)))
    return edges


def test_overview_draws_state_changes_only_merged_and_labelled_by_event() -> None:
    for m in SPEC.machines.values():
        dot = sc.overview_dot(m)
        edges = [(a, b) for a, b, _ in _overview_edges(dot)]
        assert len(edges) == len(set(edges)), f"{m.name}: parallel edges not merged"
        assert all(a != b for a, b in edges), f"{m.name}: a self-loop in the overview"
        anywhere = sc.any_state_events(m)
        want: dict[tuple[str, str], set[str]] = defaultdict(set)
        for (src, event), rule in m.rules.items():
            for b in rule.branches:
                if b.dest == src:
                    continue
                if anywhere.get(event) == b.dest and src not in (m.initial, *m.final):
                    want[("__any", b.dest)].add(event)
                else:
                    want[(src, b.dest)].add(event)
        got = {(a, b) for a, b in edges if a != "__start"}
        assert got == set(want), m.name
        checked = 0
        for line in dot.splitlines():
            mm = re.match(r'\s*(\w+) -> (\w+) \[(?:.* )?label=("[^"]*"|\S+)', line)
            if mm and (mm.group(1), mm.group(2)) in want:
                events = {e.strip(",") for e in mm.group(3).strip('"').replace("\\n", " ").split()}
                assert events == want[(mm.group(1), mm.group(2))], line
                checked += 1
        assert checked == len(want), m.name
    # session: a send failure from every live state is one edge, not three
    assert sc.any_state_events(SPEC.machines["session"])["send_failed"] == "dead"


def test_roles_make_terminal_retained_and_failure_states_distinct() -> None:
    roles = sc.roles(PRODUCER)
    assert "final" in roles["pruned"] and "retained" in roles["done"] and "retained" in roles["tombstoned"]
    assert "failure" in roles["tombstoned"] and "failure" in roles["cancelling"]
    assert not roles["awaiting"] & {"failure", "retained", "final"}
    assert "retained" not in roles["serving"]
    # the session's ready state still does work on its way out: not retained
    assert "retained" not in sc.roles(SPEC.machines["session"])["ready"]
    dot = sc.overview_dot(PRODUCER)
    node = {line.split()[0]: line for line in dot.splitlines() if re.match(r"\s*\w+ \[", line)}
    assert "peripheries=2" in node["pruned"]
    assert "dashed" in node["done"] and "(retained)" in node["done"]
    assert "subgraph cluster_failure" in dot and "failure exits" in dot


@needs_dot
def test_hover_text_carries_the_spec_docs() -> None:
    svg = html.unescape(_run_dot(sc.overview_dot(PRODUCER), "-Tsvg").decode())
    for s in PRODUCER.states:
        assert f"{s.name}: {s.doc}" in svg, s.name
    assert PRODUCER.events["reap_deadline"] in svg  # event docs on edges
    assert PRODUCER.guards["demand_met"] in svg  # guard docs
    assert PRODUCER.effects["start_transfer"] in svg  # effect docs
    assert PRODUCER.timers["reap"].doc in svg  # timer docs on the state


def test_state_detail_has_every_branch_in_and_out() -> None:
    for m in SPEC.machines.values():
        for st in m.states:
            dot = sc.state_dot(m, st.name)
            drawn = [ln for ln in dot.splitlines() if " -> " in ln and "style=invis" not in ln
                     and "__start" not in ln]
            branches = [(src, b) for (src, _), r in m.rules.items() for b in r.branches]
            n_in = sum(1 for src, b in branches if b.dest == st.name and src != st.name)
            n_out = sum(1 for src, b in branches if src == st.name and b.dest != st.name)
            assert len(drawn) == n_in + n_out, (m.name, st.name)
            for (src, e), r in m.rules.items():
                if src != st.name:
                    continue
                if r.kind == "transition":
                    for b in r.branches:
                        assert e in dot and (b.guard is None or b.guard in dot)
                else:
                    assert f"({r.reason})" in dot and e in dot, (m.name, st.name, e)
    with pytest.raises(KeyError, match="no state 'nope'"):
        sc.state_dot(PRODUCER, "nope")


def test_machine_page_names_every_guard_effect_reason_and_ignore_rule() -> None:
    for m in SPEC.machines.values():
        page = sc.machine_page(m, diagrams_rel="../../diagrams")
        rows = [ln for ln in page.splitlines() if ln.startswith("| [`")]
        assert len(rows) == len(m.states)
        for (_, e), r in m.rules.items():
            assert f"`{e}`" in page or e in page
            if r.reason:
                assert f"`{r.reason}`" in page
            for b in r.branches:
                if b.guard:
                    assert f"`{b.guard}`" in page
                for eff in b.effects:
                    assert eff in page
                if b.reason:
                    assert f"`{b.reason}`" in page
        for st in m.states:
            assert f"../../diagrams/states/{m.name}-{st.name}.svg" in page


def _edit(old: str, new: str) -> str:
    text = spec_path().read_text()
    assert old in text
    return text.replace(old, new)


PATH_LINE = 'normal_path = ["absent", "parked", "serving", "delivering", "done", "pruned"]'


@pytest.mark.parametrize("new, message", [
    ('normal_path = ["absent", "parked", "parking", "done", "pruned"]', "undeclared state"),
    ('normal_path = ["parked", "serving", "delivering", "done", "pruned"]', "must start at the initial state"),
    ('normal_path = ["absent", "parked", "serving", "delivering", "done"]', "must end in a final state"),
    ('normal_path = ["absent", "serving", "delivering", "done", "pruned"]', "'absent' -> 'serving', but no transition"),
    ('normal_path = ["absent", "parked", "serving", "delivering", "done", "pruned"]\nrank = 1',
     "layout has unknown keys"),
])
def test_layout_hint_is_validated(new: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        loads(_edit(PATH_LINE, new))


def test_generator_fails_clearly_when_the_hint_names_a_state_that_no_longer_exists() -> None:
    spec = loads(_edit(PATH_LINE, PATH_LINE.replace('"serving"', '"sending"')), validate_spec=False)
    with pytest.raises(ValueError, match="normal_path names 'sending', which is not a state of producer"):
        sc.overview_dot(spec.machines["producer"])
