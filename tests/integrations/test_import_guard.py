"""``import kvtier`` / ``import kvtier.integrations`` must not need (or import) vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_kvtier_integrations_imports_nothing_from_vllm() -> None:
    code = (
        "import sys\n"
        "import kvtier, kvtier.integrations, kvtier.manager, kvtier.config\n"
        "bad = sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


@pytest.mark.timeout(60)
def test_adapter_import_without_vllm_raises_a_clear_import_error() -> None:
    # Hide vLLM (a None entry in sys.modules makes `import vllm...` raise ImportError).
    code = (
        "import sys\n"
        "sys.modules['vllm'] = None\n"
        "try:\n"
        "    import kvtier.integrations.vllm\n"
        "except ImportError as exc:\n"
        "    assert 'needs vLLM 0.33.0' in str(exc), exc\n"
        "    print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
