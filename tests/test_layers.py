"""The repository's layers (docs/design.md, *Layers*; docs/decisions.md W3): what each may import,
and no import ring among the development modules.

Checked by scanning the source with ``ast``, so an import inside a function counts too; imports
under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: layer -> the layers it may import (itself included).  Order: lowest first.
LAYERS: dict[str, set[str]] = {
    "kvtier": {"kvtier"},  # the runtime, what the wheel installs
    "kvtier.testing": {"kvtier", "kvtier.testing"},  # doubles a user may import (in the wheel)
    "tools": {"kvtier", "kvtier.testing", "tools"},
    "tests.support": {"kvtier", "kvtier.testing", "tools", "tests.support"},
    "demo": {"kvtier", "tools", "demo"},
    "bench": {"kvtier", "kvtier.testing", "tools", "tests.support", "demo", "bench"},
    "tests": {"kvtier", "kvtier.testing", "tools", "tests.support", "demo", "bench", "tests"},
}
FIRST_PARTY = ("kvtier", "tools", "bench", "demo", "tests")
DEV = ("tools", "tests.support", "demo", "bench")


def layer_of(module: str) -> str:
    """The most specific layer whose name prefixes ``module``."""
    best = ""
    for layer in LAYERS:
        if (module == layer or module.startswith(layer + ".")) and len(layer) > len(best):
            best = layer
    if not best:
        raise ValueError(f"{module} belongs to no layer")
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    """Module name -> file, for every first-party module of the checkout."""
    out = {}
    for top in FIRST_PARTY:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[module_name(path)] = path
    return out


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def imports(path: Path, module: str, known: set[str] | None = None) -> set[str]:
    """The first-party modules ``path`` (module ``module``) imports, function-level ones included.
    ``from pkg import name`` counts as importing ``pkg.name`` when that is a module in ``known``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _type_checking_blocks(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if known is not None and sub in known else base)
    return {m for m in out if m.split(".")[0] in FIRST_PARTY}


def test_every_layer_imports_only_the_layers_below_it() -> None:
    src = sources()
    assert {"kvtier.manager", "tools.cli", "tools.child", "tests.support.peer_process", "bench", "demo.run"} <= set(src)
    bad = []
    for module, path in src.items():
        allowed = LAYERS[layer_of(module)]
        for imported in imports(path, module, set(src)):
            if layer_of(imported) not in allowed:
                bad.append(f"{path.relative_to(ROOT)} ({layer_of(module)}) imports {imported} ({layer_of(imported)})")
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_development_modules_import_no_ring() -> None:
    src = sources()
    dev = {m: p for m, p in src.items() if layer_of(m) in DEV}
    graph = {m: {i for i in imports(p, m, set(src)) if i in dev and i != m} for m, p in dev.items()}
    assert _cycles(graph) == []


def test_the_scanner_sees_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import bench\n"
                 "def f():\n    import tools.spec\n    from kvtier import config\n    from . import sibling\n")
    assert imports(f, "demo.m", {"kvtier.config"}) == {"tools.spec", "kvtier.config", "demo"}


def test_the_ring_finder_finds_a_ring_hidden_in_functions() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_child_helper_imports_only_the_standard_library() -> None:
    """A child process pays nothing before its handler's own imports."""
    src = sources()
    assert imports(src["tools.child"], "tools.child", set(src)) == set()
