"""Malformed and fuzzed ``kv_transfer_params`` through vLLM 0.33.0's tiering manager: the adapter
turns them into "no hand-off" and never raises into the scheduler (harness:
:mod:`tests.integrations.vllm_harness`).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.integrations.vllm_harness import (  # the harness (and its module-level skips)
    TIER,
    LookupResult,
    OffloadPolicy,
    ReqContext,
    keys,
    managers,  # noqa: F401  (fixture)
    producer_store,
    stat,
    step,
    steps_until,
)

pytestmark = [pytest.mark.vllm]
MALFORMED = [
    "not-a-dict",
    ["remote_decoder"],
    {"remote_decoder": {}},
    {"remote_decoder": {"kv_request_id": 5}},
    {"remote_decoder": {"kv_request_id": "has space"}},
    {"remote_decoder": "K"},
    {"remote_prefiller": {"kv_request_id": "K", "remote_host": "127.0.0.1", "remote_port": "57x0"}},
    {"remote_prefiller": {"kv_request_id": "K", "remote_host": "127.0.0.1", "remote_port": True}},
    {"remote_prefiller": {"kv_request_id": "K", "remote_port": 5710}},
    {"remote_prefiller": []},
]


from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=30),
                    st.sampled_from(["5710", "127.0.0.1", "169.254.169.254", "K", "a" * 300, "has space"]))
_ANY = st.recursive(_SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=6)
_SUB = st.fixed_dictionaries({}, optional={"kv_request_id": _ANY, "remote_host": _ANY, "remote_port": _ANY,
                                           "consumer": _ANY})
_PARAMS = st.one_of(_ANY, st.dictionaries(
    st.sampled_from(["remote_prefiller", "remote_decoder", "prefill", "decode", "remote_kv_source", "x"]),
    st.one_of(_SUB, _ANY), max_size=3))
_fuzz_n = iter(range(10**9))


@pytest.mark.timeout(120)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=100)
@given(params=_PARAMS)
def test_fuzzed_kv_transfer_params_never_raise_out_of_the_adapter(managers, params) -> None:
    """B40 through vLLM's own manager and factory: whatever a client writes into
    kv_transfer_params, on_new_request / lookup / on_request_finished never raise (the adapter
    turns kvtier's ValueError into "no hand-off") and never dial an unlisted peer."""
    pair = getattr(managers, "fuzz_pair", None)  # one engine for every example of this test
    if pair is None:
        pair = managers.fuzz_pair = managers({**TIER, "allowed_peers": ["127.0.0.1"]})
    mgr, tier = pair
    i = next(_fuzz_n)
    ctx = ReqContext(f"fz-{i}", kv_transfer_params=params)  # type: ignore[arg-type]
    with mgr.lock:
        mgr.on_new_request(ctx)
        mgr.lookup(keys(f"fz-{i}", 1)[0], ctx)
        mgr.on_request_finished(ctx)
        step(mgr)
    for peer in tier.kvtier.transport.peers():
        assert peer.startswith("127.0.0.1:"), peer


@pytest.mark.timeout(60)
def test_malformed_kv_transfer_params_never_reach_the_scheduler(managers, caplog) -> None:
    mgr, tier = managers(TIER)
    view = np.asarray(mgr.primary_tier.get_kv_memoryview())
    caplog.set_level(logging.WARNING, logger="kvtier.integrations.vllm")
    for i, params in enumerate(MALFORMED):
        ctx = ReqContext(f"bad-{i}", kv_transfer_params=params)  # type: ignore[arg-type]
        ks = keys(f"bad-{i}", 1)
        with mgr.lock:
            assert mgr.on_new_request(ctx).policy is OffloadPolicy.CHUNK_LEVEL  # no kvtier role
            assert mgr.lookup(ks[0], ctx) is LookupResult.MISS
        producer_store(mgr, ctx, ks, view)  # the adapter fails the store job (reported once)
        with mgr.lock:
            mgr.on_request_finished(ctx)
        # the failure is a core input (JobSettled) applied by kvtier's I/O thread: a step or two
        steps_until(mgr, lambda: not mgr._jobs)
        assert not mgr._jobs, (params, mgr._jobs)
    assert any("ignoring the kv_transfer_params" in r.getMessage() for r in caplog.records)
    # a request without params is local: its store succeeds at once
    ok = ReqContext("local", kv_transfer_params=None)
    with mgr.lock:
        mgr.on_new_request(ok)
    producer_store(mgr, ok, keys("local", 1), view)
    with mgr.lock:
        mgr.on_request_finished(ok)
    steps_until(mgr, lambda: not mgr._jobs and not tier.has_pending_work())
    assert not mgr._jobs and not tier.has_pending_work()
    del view


@pytest.mark.timeout(60)
def test_reset_cache_drains_parked_store_jobs(managers) -> None:
    mgr, tier = managers(TIER)
    view = np.asarray(mgr.primary_tier.get_kv_memoryview())
    ctx = ReqContext("req-park", kv_transfer_params={"remote_decoder": {"kv_request_id": "K9"}})
    with mgr.lock:
        mgr.on_new_request(ctx)
    producer_store(mgr, ctx, keys("park", 2), view)
    with mgr.lock:
        mgr.on_request_finished(ctx)
        step(mgr)
    assert mgr._jobs, "parked"
    with mgr.lock:
        mgr.reset_cache()  # tier.drain_jobs(); _process_finished_jobs(); assert not self._jobs
        mgr.on_reset_flushed()
    assert not mgr._jobs
    assert stat(tier, "kvtier_jobs_total{kind=store,outcome=fail,reason=drained}") == 1
    del view
