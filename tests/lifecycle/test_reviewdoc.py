"""docs/review.md (tools.reviewdoc): every spec property is established by a test or the
model checker, the timing keys come from the config and the spec, and the README shows the
overview (freshness of the page itself: tests/lifecycle/test_diagrams.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import reviewdoc
from tools.spec import load, loads, spec_path

SPEC = load()
ROOT = Path(__file__).resolve().parents[2]


def test_every_property_is_established_by_a_test_or_the_model_checker() -> None:
    ev = reviewdoc.evidence(SPEC)
    missing = [p for p, e in ev.items() if not e.established]
    assert missing == [], f"properties nothing checks: {missing}"
    # the mapping is read from the files, not assumed (property names are taken from the spec,
    # so this file itself never counts as evidence)
    by_kind = {kind: [p for p, v in SPEC.properties.items() if v["kind"] == kind]
               for kind in ("safety", "liveness", "structural")}
    assert all("tests/lifecycle/test_spec.py" in ev[p].tests for p in by_kind["structural"])
    assert all(ev[p].model_check for p in by_kind["liveness"])
    assert any("tests/stateful/stateful_model.py" in ev[p].tests for p in by_kind["safety"])
    assert not any(name in Path(__file__).read_text() for name in SPEC.properties)


def test_a_property_nothing_checks_fails_the_page(tmp_path: Path) -> None:
    name = "blocks_are_" + "purple"  # built here so this file does not name it
    text = spec_path().read_text() + f'\n[properties.{name}]\nkind = "safety"\ndoc = "Every block is purple."\n'
    spec = loads(text)
    ev = reviewdoc.evidence(spec)
    assert not ev[name].established
    with pytest.raises(reviewdoc.MissingEvidence, match=name):
        reviewdoc.review_page(spec, diagrams_rel="../diagrams", scenarios=[], awaiting={}, counterexample=None)
    # a test file that names it is evidence (whole words only)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tests" / "test_purple.py").write_text(f"def test_{name}_ish(): ...\n")
    assert not reviewdoc.evidence(spec, tmp_path)[name].established
    (tmp_path / "tests" / "test_purple.py").write_text(f"PROP = '{name}'\n")
    assert reviewdoc.evidence(spec, tmp_path)[name].tests == ("tests/test_purple.py",)
    (tmp_path / "tests" / "test_purple.py").unlink()
    (tmp_path / "tests" / "support").mkdir()  # test machinery naming it is not evidence
    (tmp_path / "tests" / "support" / "peer.py").write_text(f"PROP = '{name}'\n")
    assert not reviewdoc.evidence(spec, tmp_path)[name].established
    (tmp_path / "tools" / "modelcheck.py").write_text(f"PROPERTIES = ('{name}',)\n")
    assert reviewdoc.evidence(spec, tmp_path)[name].model_check


def test_timing_keys_cover_every_timer_and_the_park_clock() -> None:
    rows = {key: what for key, _default, what, _desc in reviewdoc.timing_keys(SPEC)}
    for m in SPEC.machines.values():
        for t in m.timers.values():
            assert t.config_key in rows and f"`{t.name}`" in rows[t.config_key]
    assert "park_clock_last" in rows["park_clock"]
    assert "max_peers" not in rows and "hash_seed" not in rows
    page = (ROOT / "docs" / "review.md").read_text()
    for key in rows:
        assert f"| `{key}` |" in page


def test_readme_shows_the_overview_not_the_full_wall() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "](diagrams/producer-overview.svg)" in readme
    assert "![producer lifecycle](diagrams/producer.svg)" not in readme
    assert "docs/review.md" in readme
