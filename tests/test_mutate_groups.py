"""The mutation-testing groups (``tools.mutate``, docs/mutation.md) name what exists: every module
and test they list, every function their scope names, and every mutant listed as equivalent, so a
module that moves or a test that is renamed cannot silently drop out of ``make mutate``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import mutate

REPO = Path(__file__).resolve().parents[1]


def _module_file(dotted: str) -> Path:
    return REPO / (dotted.replace(".", "/") + ".py")


@pytest.mark.parametrize("name", sorted(mutate.GROUPS))
def test_a_groups_modules_and_tests_exist(name: str) -> None:
    group = mutate.GROUPS[name]
    for pattern in group.modules:
        assert sorted(REPO.glob(pattern)), f"{name}: {pattern} matches no file"
    for test in group.tests:
        path, _, node = test.partition("::")
        assert (REPO / path).exists(), f"{name}: {path} does not exist"
        if node:
            assert f"def {node}(" in (REPO / path).read_text(encoding="utf-8"), f"{name}: no test {test}"


@pytest.mark.parametrize("name", sorted(n for n, g in mutate.GROUPS.items() if g.scope))
def test_a_groups_scope_names_functions_of_its_modules(name: str) -> None:
    group = mutate.GROUPS[name]
    files = {p.resolve() for pattern in group.modules for p in REPO.glob(pattern)}
    for prefix in group.scope:
        module, _, function = prefix.rstrip(".").partition(".x")
        if not function:  # a whole module: "kvtier.shell.jobs."
            module = prefix.rstrip(".")
        path = _module_file(module)
        assert path.resolve() in files, f"{name}: {prefix} is not in the group's modules"
        if function:
            method = function.split("ǁ")[-1].rstrip("_")
            assert f"def {method}(" in path.read_text(encoding="utf-8"), f"{name}: no function {prefix}"


def test_every_equivalent_mutant_is_of_a_mutated_function() -> None:
    for key in mutate.equivalent():
        module, _, mutant = key.rpartition(".")
        path = _module_file(module)
        assert path.exists(), key
        function = mutant.rsplit("__mutmut_", 1)[0].split("ǁ")[-1].removeprefix("x_")
        assert f"def {function}(" in path.read_text(encoding="utf-8"), key
