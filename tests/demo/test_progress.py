"""`python -m demo` shows progress from its first second (without loading the model here)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from demo.run import RichProgress

REPO = Path(__file__).resolve().parents[2]


def test_the_first_stage_is_reported_before_torch_or_the_model_loads() -> None:
    code = (
        "import sys\n"
        "from demo.run import run\n"
        "class Seen(Exception): pass\n"
        "class First:\n"
        "    def stage(self, text):\n"
        "        raise Seen(text)\n"
        "try:\n"
        "    run(progress=First())\n"
        "except Seen as exc:\n"
        "    print(exc)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'loaded before the first stage'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("loading SmolLM2-135M")


def test_stages_print_as_timestamped_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with RichProgress(Console(file=out, force_terminal=False, width=120)) as p:
        p.stage("loading the model")
        p.requests(2)
        p.stage("capital: monolithic run")
        p.advance()
    lines = out.getvalue().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["loading the model", "capital: monolithic run"]
    assert all(line.startswith("[") and " s] " in line for line in lines)


def test_a_terminal_gets_a_live_line_with_the_stage_and_the_request_count() -> None:
    out = io.StringIO()
    with RichProgress(Console(file=out, force_terminal=True, width=120)) as p:
        p.stage("starting the producer and consumer processes")
        p.requests(3)
        p.advance()
        p._progress.refresh()
    text = out.getvalue()
    assert "starting the producer and consumer processes" in text and "1/3" in text
