"""The committed benchmark summary is written by the suite from the committed results, never typed:
``docs/benchmarks/summary.md`` and docs/benchmarks.md's run and targets blocks are exactly what
``python -m bench --summary`` renders from ``docs/benchmarks/results.json``, with one line per
target (its goal, the figure achieved, met) — no cell packing several targets or figures."""

from __future__ import annotations

import json
from pathlib import Path

from bench import _report, main

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "benchmarks" / "results.json"


def _committed() -> tuple[dict, dict]:
    doc = json.loads(RESULTS.read_text(encoding="utf-8"))
    return doc["benchmarks"], doc["meta"]


def test_the_committed_summary_is_rendered_from_the_committed_results() -> None:
    results, meta = _committed()
    summary = (ROOT / "docs" / "benchmarks" / "summary.md").read_text(encoding="utf-8")
    assert summary == _report.markdown(results, meta), "run: python -m bench --summary"
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page == _report.render_doc(page, results, meta), "run: python -m bench --summary"


def test_every_target_has_one_line_of_its_own() -> None:
    results, _ = _committed()
    table = _report.targets_markdown(results)
    lines = [line for line in table.splitlines() if line.startswith("| P")]
    targets = [(bid, t) for bid, r in results.items() for t in (r.get("targets") or [r["target"]])]
    assert len(lines) == len(targets) > 30
    for line, (bid, t) in zip(lines, targets):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[0] == bid and cells[1] == t["text"].replace("|", "\\|"), line
        assert cells[3] == {True: "yes", False: "NO", None: "—"}[t["met"]], line
        assert cells[2] == "—" if t["achieved"] is None else float(cells[2]) == float(f"{t['achieved']:.3g}"), line
    # the run's load is said once, from the results (a typed copy once disagreed with them)
    run = _report.run_markdown(*reversed(_committed()))
    assert f"{_committed()[1]['machine']['loadavg_at_start'][0]:.2f} at the start" in run


def test_summary_rewrites_summary_md_from_the_results_without_running(tmp_path: Path) -> None:
    out = tmp_path / "quick"
    out.mkdir()
    (out / "results.json").write_text(RESULTS.read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["--summary", "--quiet", "--out", str(out)]) == 0
    results, meta = _committed()
    assert (out / "summary.md").read_text(encoding="utf-8") == _report.markdown(results, meta)
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "summary.md"]  # nothing ran, nothing else
