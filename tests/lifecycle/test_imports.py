"""Dependency rules (docs/design.md): the lifecycle core and the wire codec are pure.

``kvtier/lifecycle/`` and ``kvtier/wire/`` import neither zmq nor torch nor ``time`` (the core
takes ``now`` as an argument), and the core never imports the dev-time tools (``tools``,
``transitions``, ``graphviz``).  Checked by scanning the source with ``ast``, so an import inside a
function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "kvtier"
FORBIDDEN = {
    "lifecycle": {"zmq", "torch", "time", "tools", "transitions", "graphviz", "socket", "threading", "asyncio"},
    "wire": {"zmq", "torch", "time", "tools", "transitions", "socket"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _violations(package: str) -> list[str]:
    bad = []
    for path in sorted((PKG / package).rglob("*.py")):
        for mod in imported_modules(path):
            for forbidden in FORBIDDEN[package]:
                if mod == forbidden or mod.startswith(forbidden + "."):
                    bad.append(f"{path.relative_to(PKG.parent)} imports {mod}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_pure_packages_import_no_io_no_clock(package: str) -> None:
    assert (PKG / package).is_dir()
    assert _violations(package) == []


def test_the_scanner_sees_function_level_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import time\n    from zmq import Context\n")
    assert imported_modules(f) == {"time", "zmq"}
