"""Everything ``python -m tools diagram`` generates is committed and fresh: ``diagrams/**/*.dot`` and
``*.svg`` (full graphs, overviews, state details, recorded scenarios, the example counterexample),
``docs/states/*.md`` and ``docs/review.md``.

Regenerate with ``python -m tools diagram`` (``make diagrams``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools import diagrams
from tools.cli import run
from tools.spec import load, loads, spec_path

SPEC = load()


def test_committed_diagrams_are_fresh() -> None:
    stale = diagrams.check()
    assert stale == [], f"stale diagrams or pages {stale}: run `python -m tools diagram`"


def test_dot_is_byte_stable() -> None:
    for m in SPEC.machines.values():
        assert diagrams.dot_source(m) == diagrams.dot_source(load().machines[m.name])


def test_a_spec_change_makes_the_dot_stale(tmp_path: Path) -> None:
    text = spec_path().read_text().replace(
        'parked = { doc = "Blocks stored, pinned, no fetch yet.", timer = "reap" }',
        'parked = { doc = "Blocks stored, pinned, no fetch yet.", timer = "supply" }',
    )
    edited = loads(text, validate_spec=False)
    out = tmp_path / "d"
    diagrams.render_all(out, SPEC, svg=False)
    assert diagrams.check(out, SPEC, svg=False) == []
    stale = diagrams.check(out, edited, svg=False)
    for rel in ("producer.dot", "producer-overview.dot", "states/producer-parked.dot", "docs/states/producer.md"):
        assert out / rel in stale, rel
    assert out / "consumer.dot" not in stale


def test_stale_pages_and_orphans_are_reported_and_orphans_removed(tmp_path: Path) -> None:
    out = tmp_path / "d"
    diagrams.render_all(out, SPEC, svg=False)
    review = out / "docs" / "review.md"
    review.write_text(review.read_text().replace("## 3. Properties", "## 3. Hand-edited"))
    orphan = out / "states" / "producer-renamed_state.dot"
    orphan.write_text("digraph x {}\n")
    assert set(diagrams.check(out, SPEC, svg=False)) == {review, orphan}
    changed = diagrams.render_all(out, SPEC, svg=False)
    assert set(changed) == {review, orphan} and not orphan.exists()
    assert diagrams.check(out, SPEC, svg=False) == []


def test_dot_conventions() -> None:
    dot = diagrams.dot_source(SPEC.machines["producer"])
    assert "pruned [shape=doublecircle" in dot  # final state
    assert '__start -> absent;' in dot  # initial state
    assert "timer reap = unbound_store_timeout_s" in dot  # timers on states
    assert 'parked -> serving [label="fetch [demand_met] / bind, start_transfer"];' in dot
    assert 'parked -> tombstoned [label="reap_deadline / fail_jobs\\n(reaped)"];' in dot
    # ignore rules are listed in the note, not drawn as edges
    assert "ignored inputs (not drawn)" in dot
    assert "parked: receipt (stale)" in dot
    assert "absent -> absent [label=\"transfer_released" not in dot
    consumer = diagrams.dot_source(SPEC.machines["consumer"])
    assert "exits: request_finished, shutdown" in consumer  # waiting state without timer
    assert "rejected inputs (InvalidTransition)" in consumer and "submit_load (not_announced)" in consumer


def test_every_transition_branch_is_an_edge() -> None:
    for m in SPEC.machines.values():
        dot = diagrams.dot_source(m)
        edges = [line for line in dot.splitlines() if " -> " in line and not line.strip().startswith("__start")]
        branches = sum(len(r.branches) for r in m.rules.values() if r.kind == "transition")
        assert len(edges) == branches, m.name


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")
def test_render_all_writes_dot_and_svg(tmp_path: Path) -> None:
    written = diagrams.render_all(tmp_path)
    dots, docs = diagrams.expected(SPEC, tmp_path, tmp_path / "docs")
    want = {tmp_path / d for d in dots} | {(tmp_path / d).with_suffix(".svg") for d in dots}
    want |= {tmp_path / "docs" / d for d in docs}
    assert set(written) == want
    for machine in SPEC.machines:  # every kind of artefact is there
        assert f"{machine}-overview.dot" in dots and f"states/{machine}-{SPEC.machines[machine].initial}.dot" in dots
    assert any(d.startswith("scenarios/") for d in dots) and any(d.startswith("counterexamples/") for d in dots)
    assert {"review.md", "states/producer.md"} <= set(docs)
    assert diagrams.check(tmp_path) == []
    assert diagrams.render_all(tmp_path) == []  # idempotent
    svg = (tmp_path / "session.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert (tmp_path / "session.dot").read_text() == (diagrams.diagram_dir() / "session.dot").read_text()


def test_main_check_exit_codes(tmp_path: Path) -> None:
    assert run(["diagram", "--check"]) == 0
    assert run(["diagram", "--check", "--out", str(tmp_path)]) == 1
    assert run(["diagram", "--no-svg", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / "review.md").exists()  # a trial render never touches docs/
    assert run(["diagram", "--check", "--no-svg", "--out", str(tmp_path)]) == 0


def test_lifecycle_doc_explains_every_name() -> None:
    """docs/lifecycle.md embeds every diagram and names every state, guard, timer (with its config
    key) and reason code of the spec: a spec change without prose fails here."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md").read_text()
    missing = []
    for m in SPEC.machines.values():
        if f"../diagrams/{m.name}.svg" not in doc:
            missing.append(f"diagram {m.name}")
        for s in m.states:
            if f"`{s.name}`" not in doc:
                missing.append(f"{m.name} state {s.name}")
        for g in m.guards:
            if f"`{g}`" not in doc:
                missing.append(f"{m.name} guard {g}")
        for t in m.timers.values():
            if f"`{t.name}` (`{t.config_key}`" not in doc:
                missing.append(f"{m.name} timer {t.name} ({t.config_key})")
    for r in SPEC.reasons:
        if f"`{r}`" not in doc:
            missing.append(f"reason {r}")
    assert missing == [], f"docs/lifecycle.md does not explain: {missing}"
