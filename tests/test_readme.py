"""The README's promises: its configuration table is generated from the code, and the commands it
gives are the ones CI and the Makefile run."""

from __future__ import annotations

from pathlib import Path

from kvtier.config import DEFAULTS
from tools.docgen import render_page

ROOT = Path(__file__).resolve().parents[1]


def test_readme_config_table_is_fresh() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert render_page(text, ("config table",)) == text, "run: python -m tools docs"
    for key in DEFAULTS:
        assert f"`{key}`" in text


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in readme and "make demo" in readme
    assert "make test" in ci.splitlines()[-1]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    # `make test` sets up (through `bytecode`, which needs `setup`) and runs pytest
    assert "\nbytecode: setup\n" in makefile and "\ntest: bytecode\n" in makefile
    assert "pytest" in makefile.split("\ntest: bytecode\n", 1)[1].splitlines()[0]


def test_readme_api_example_runs_as_written(capsys, caplog) -> None:
    """The README's Python example, executed (only its fixed port is swapped for a free one); it
    says whom each engine may dial, so a newcomer's first run prints no SECURITY warning."""
    import logging
    import socket

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("```python\nfrom kvtier.api import RequestContext, TransferJob") + len("```python\n")
    code = text[start : text.index("```", start)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        exec(compile(code.replace("5710", str(port)), "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "True None"
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
