"""The wheel: built without setuptools warnings, carries what kvtier needs, and works in a clean venv.

The clean venv gets kvtier only from the wheel; its dependencies (attrs, msgspec, pyzmq, torch, …)
come from the test's own environment through a ``.pth`` line (an editable kvtier there is *not*
visible: ``.pth`` files of a directory added that way are not processed), and the commands run from
a directory outside the checkout, so nothing can import the source tree by accident.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(180)


def _run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=150, env=env, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("wheel")
    res = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                "-w", str(out), str(REPO)], cwd=out)
    assert res.returncode == 0, res.stdout + res.stderr
    (whl,) = out.glob("kvtier-*.whl")
    return whl, res.stdout + res.stderr


def test_the_build_prints_no_setuptools_warnings(wheel) -> None:
    _, log = wheel
    for noise in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "deprecated", "!!"):
        assert noise not in log, log


def test_the_wheel_carries_every_module_the_package_data_and_the_license(wheel) -> None:
    whl, _ = wheel
    names = set(zipfile.ZipFile(whl).namelist())
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "kvtier").rglob("*.py") if "__pycache__" not in p.parts}
    assert sources <= names, sorted(sources - names)
    assert {"kvtier/py.typed", "kvtier/demo/prompts.txt"} <= names
    assert not any(n.startswith(("tests/", "docs/", "spec/")) for n in names)
    meta = zipfile.ZipFile(whl).read("kvtier-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta and "kvtier-0.1.0.dist-info/licenses/LICENSE" in names
    # every extra means something: [vllm] pins the release the adapter is written against
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert all(extras.values()), extras
    (pin,) = [ln for ln in (REPO / "requirements" / "vllm.txt").read_text().splitlines() if ln.startswith("vllm==")]
    assert f'Requires-Dist: {pin}; extra == "vllm"' in meta
    adapter = (REPO / "kvtier" / "integrations" / "vllm.py").read_text()
    assert f'TESTED_VLLM_VERSION = "{pin.removeprefix("vllm==")}"' in adapter


def test_the_wheel_imports_and_runs_in_a_clean_venv(wheel, tmp_path) -> None:
    whl, _ = wheel
    venv = tmp_path / "venv"
    res = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    py = venv / "bin" / "python"
    res = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", str(whl)],
               cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    clean_site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           cwd=tmp_path).stdout.strip())
    (clean_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    code = (
        "import importlib.resources, json, sys\n"
        "import kvtier, kvtier.config, kvtier.metrics, kvtier.manager, kvtier.top, kvtier.cli\n"
        "import kvtier.lifecycle, kvtier.wire, kvtier.transport, kvtier.integrations\n"
        "prompts = importlib.resources.files('kvtier.demo').joinpath('prompts.txt').read_text()\n"
        "typed = importlib.resources.files('kvtier').joinpath('py.typed').is_file()\n"
        "print(json.dumps({'file': kvtier.__file__, 'prompts': len(prompts), 'typed': typed}))\n"
    )
    res = _run([str(py), "-c", code], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["file"].startswith(str(clean_site)), info  # the wheel's copy, not the checkout
    assert info["prompts"] > 100 and info["typed"] is True

    res = _run([str(venv / "bin" / "kvtier"), "--help"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for command in ("demo", "top", "check", "bench"):
        assert command in res.stdout
