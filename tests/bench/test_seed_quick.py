"""Smoke test of P0 (``bench/seed.py``): vLLM's p2p tier and kvtier's adapter on both
planes, driven through vLLM's TieringOffloadingManager in two processes, hand off every size of
``--quick`` (``--smoke``: the same sizes, one round) byte-exact (the benchmark raises otherwise), and the result record is complete.
Nothing about timings is asserted."""

from __future__ import annotations

import math

import pytest

from bench import seed

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.timeout(600)
def test_quick_p0_hands_off_every_size_on_every_system(p0_smoke) -> None:
    """On the session's one smoke P0 run (``python -m bench --smoke --only P0``, tests/bench/conftest.py),
    whose record test_bench_quick.py checks too."""
    # Asked here, not at collection: importing vLLM's p2p tier costs every xdist worker ~2 s of CPU.
    why = seed.unavailable()
    if why is not None:
        pytest.skip(why)
    _, doc = p0_smoke
    res = doc["benchmarks"]["P0"]
    assert res["status"] == "ok", res.get("error")
    got = {(r["mib"], r["system"]) for r in res["rows"]}
    want = {(m, s) for m in seed.QUICK_SIZES_MIB for s in (*seed.SYSTEMS, "raw_nixl", "raw_zmq", "copy")}
    assert got == want
    for r in res["rows"]:
        assert _number(r["load_s"]["median"]) and r["load_s"]["median"] > 0, r
        if r["system"] in seed.SYSTEMS:
            assert _number(r["submit_store_s"]["median"]), r
            assert all(_number(v) and v >= 0 for v in r["cpu_s_per_gb"].values()), r
        if r["system"] == "raw_zmq":  # the zmq plane's raw baseline: each phase it has
            assert all(_number(r[k]["median"]) and r[k]["median"] > 0 for k in ("first_s", "done_s")), r
    assert set(res["late_s"]) == set(seed.SYSTEMS)
    assert res["targets"] and all(t["achieved"] is None or _number(t["achieved"]) for t in res["targets"])
    limits = [t for t in res["targets"] if t["text"].startswith("limit here: a raw NIXL WRITE")]
    assert len(limits) == len(seed.QUICK_SIZES_MIB) and all(_number(t["achieved"]) and t["met"] is None
                                                           for t in limits), limits
    text = seed.render(res)
    assert "vLLM p2p (NIXL)" in text and "late fetch" in text
    assert "kvtier zmq / raw pyzmq" in text and "kvtier nixl / raw NIXL WRITE" in text  # the per-phase table
    assert res["method"] == text  # the record carries the same rendering
