"""TierConfig's documentation and the lifecycle spec agree with the code: docs/configuration.md's
generated table, the cross-field rules it lists, the timer keys the spec names (B25)."""

from __future__ import annotations

import json
import re

import pytest

from kvtier import config as config_mod
from kvtier.config import CROSS_FIELD_RULES, DEFAULTS, config_table
from tests.config_helpers import DOC, REPO
from tools import docgen
from tools.cli import run
from tools.docgen import render_page


# ----------------------------------------------------------------- docs (B25)


def _doc_table() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        key = cells[0].strip("`")
        assert key not in rows, f"{key} documented twice"
        rows[key] = cells
    return rows


def test_doc_documents_every_key_with_the_code_default():
    rows = _doc_table()
    assert list(rows) == list(DEFAULTS), "doc keys differ from code keys"
    for key, cells in rows.items():
        documented = json.loads(cells[1].strip("`"))
        default = DEFAULTS[key]
        if isinstance(default, tuple):  # JSON has lists only
            default = list(default)
        assert documented == default, key
        assert type(documented) is type(default), key


def test_doc_generated_block_is_fresh():
    current = DOC.read_text(encoding="utf-8")
    assert render_page(current, ("config table",)) == current, (
        "docs/configuration.md is stale: run python -m tools docs"
    )
    assert run(["docs", "--check"]) == 0


def test_docs_command_finds_and_rewrites_a_stale_table(tmp_path):
    for rel in docgen.PAGES:  # a copy of the pages, one of them with an old table
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text(encoding="utf-8"), encoding="utf-8")
    page = tmp_path / "docs" / "configuration.md"
    fresh = page.read_text(encoding="utf-8")
    start = fresh.index(docgen.begin_marker("config table")) + len(docgen.begin_marker("config table"))
    page.write_text(fresh[:start] + "\nold\n" + fresh[fresh.index(docgen.END, start):], encoding="utf-8")
    assert docgen.stale_pages(tmp_path) == [page]
    assert docgen.write_pages(tmp_path) == [page]
    assert docgen.stale_pages(tmp_path) == [] and page.read_text(encoding="utf-8") == fresh


def test_the_runtime_renders_no_docs():
    """The tables are rendered by the repository's tools from declarations (docs/decisions.md W4):
    the config module neither parses its own source nor carries a renderer."""
    source = (REPO / "kvtier" / "config.py").read_text(encoding="utf-8")
    assert "import ast" not in source and "getsource" not in source
    assert not hasattr(config_mod, "render_config_doc") and not hasattr(config_mod, "main")


def test_doc_mentions_every_cross_field_rule():
    text = DOC.read_text(encoding="utf-8")
    for rule in CROSS_FIELD_RULES:
        assert rule.text() in text


def test_config_table_rows():
    rows = config_table()
    assert [r.key for r in rows] == list(DEFAULTS)
    for row in rows:
        assert row.default == DEFAULTS[row.key]
        assert row.description, f"{row.key} has no docstring"
        assert row.validation
        if row.key.endswith("_s"):
            assert row.unit == "s", row.key


# ------------------------------------------------------------ spec cross-check


def _config_keys_in(node) -> list[str]:
    if isinstance(node, dict):
        found = [node["config_key"]] if isinstance(node.get("config_key"), str) else []
        for value in node.values():
            found += _config_keys_in(value)
        return found
    if isinstance(node, list):
        return [k for item in node for k in _config_keys_in(item)]
    return []


def test_every_timer_key_named_by_the_lifecycle_spec_exists():
    """B25: a timer must read a key that exists (not a misspelled or stale one)."""
    import tomllib

    spec = REPO / "spec" / "lifecycle.toml"
    if not spec.exists():
        pytest.skip("spec/lifecycle.toml not present")
    keys = _config_keys_in(tomllib.loads(spec.read_text(encoding="utf-8")))
    assert keys, "spec names no config_key"
    units = {row.key: row.unit for row in config_table()}
    for key in keys:
        assert key in DEFAULTS, f"spec timer reads unknown config key {key!r}"
        assert units[key] == "s", key
