"""One smoke P0 run per session (``python -m bench --smoke --only P0``), shared by the two tests that
assert on it: ``test_bench_quick.py``'s P0 group (the suite's record, plot and summary) and
``test_seed_quick.py`` (every size on every system, byte-exact).  P0 is the slowest benchmark (two
processes per system moving real bytes through vLLM's tiering manager), and it used to run twice;
``tests/conftest.py`` keeps both tests on one xdist worker so it runs once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import main


@pytest.fixture(scope="session")
def p0_smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """``(out, doc)``: the output directory and its ``results-smoke.json`` (main's exit status 0)."""
    out = tmp_path_factory.mktemp("p0") / "bench"
    assert main(["--smoke", "--quiet", "--only", "P0", "--out", str(out)]) == 0
    return out, json.loads((out / "results-smoke.json").read_text())
