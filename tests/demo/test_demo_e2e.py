"""The main job end to end: `python -m demo` on the real SmolLM2 model, in three processes.

One short prompt plus the late-consumer scenario, then the shared-prefix run (the symmetric path)
under a short system prompt, so CI proves the demo works on every change.  The shared prompt is 64
tokens (the demo's default is 512): a few shared blocks exercise the same path, and the monolithic
reference runs on every prompt cost less (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.model, pytest.mark.e2e]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_demo_json_one_prompt_and_late_consumer(model_cache_dir, data_plane) -> None:
    cmd = [sys.executable, "-m", "demo", "--prompts", "1", "--max-new-tokens", "6",
           "--max-prompt-tokens", "256", "--unbound-store-timeout", "0.5", "--data-plane", data_plane,
           "--shared-prefix-tokens", "64", "--json"]
    env = dict(os.environ, KVTIER_CACHE_DIR=str(model_cache_dir), HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)  # stdout is exactly one JSON document ...
    assert "loading SmolLM2" not in proc.stdout + proc.stderr  # ... and --json shows no progress
    rows = report["requests"]
    assert len(rows) == 2
    normal, late = rows
    # the fetched KV decodes to exactly the monolithic tokens
    assert normal["outcome"] == "fetched" and normal["identical"] is True
    assert normal["tokens"] == normal["reference"] and len(normal["tokens"]) >= 1
    assert normal["store_ok"] is True  # the producer's store job completed after the transfer
    # the late consumer is refused with 'reaped' (one round trip, not a load timeout) and recomputes
    assert late["late"] is True and late["outcome"] == "recomputed" and late["reason"] == "reaped"
    assert late["identical"] is True
    assert late["store_ok"] is False and late["store_reason"] == "reaped"
    assert late["load_s"] < 5.0  # far below load_timeout_s (30 s): answered, not timed out
    # the shared-prefix run: A computes the first question; B fetches the shared blocks for the others
    shared = report["shared_prefix"]
    assert [r["instance"] for r in shared] == ["A", "B", "B"]
    assert all(r["identical"] is True for r in shared)
    for r in shared[1:]:
        assert r["shared_blocks"] >= 2 and r["hit_blocks"] == r["shared_blocks"] and r["load_ok"] is True, r
        assert r["computed_tokens"] < r["prompt_tokens"], r  # the fetched prefix was not computed
    assert report["summary"]["ok"] is True
    assert report["summary"]["data_plane"] == data_plane
    assert normal["gbps"] > 0  # the transfer's throughput, shown in the table
