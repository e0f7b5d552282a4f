"""kvtier inside real vLLM 0.33.0 code, on CPU (no GPU, no model weights).

Two levels (see shared/design/vllm-harness.md):

* **manager level** ("level A"): the real ``OffloadingSpecFactory`` → ``TieringOffloadingSpec`` →
  ``TieringOffloadingManager`` with a real CPU primary tier over ``/dev/shm``; vLLM's
  ``SecondaryTierFactory`` loads :class:`kvtier.integrations.vllm.KvTierSecondaryTier` by
  ``module_path``.  The test drives the manager in the order the offloading connector does.
* **PD pair** ("level C"): a prefill engine and a decode engine, each a real v1 ``Scheduler`` with
  the real ``OffloadingConnector`` and its own kvtier tier, talking over kvtier's zmq transport on
  127.0.0.1.  Only the GPU worker is faked (it copies bytes between a fake GPU and the primary).

The whole module is skipped, with the reason shown, when vLLM 0.33.0 cannot be imported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# A private vLLM cache: a stale model-inspection cache elsewhere must not hide a missing dependency.
os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="kvtier-vllm-cache-"))
os.environ.setdefault("UCX_NET_DEVICES", "lo")  # the NIXL plane runs on loopback here
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

try:  # any failure (ImportError, or e.g. a half-installed transformers' TypeError) => skip
    import numpy as np
    import torch
    import vllm
    from vllm.v1.kv_offload.base import (
        LookupResult,
        OffloadPolicy,
        ReqContext,
        ScheduleEndContext,
        make_offload_key,
    )
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

    from kvtier.config import TierConfigError
    from kvtier.integrations.vllm import KvTierSecondaryTier
    from kvtier.transport import TransportError
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"vLLM 0.33.0 tiering is not importable here: {exc!r}", allow_module_level=True)

if getattr(vllm, "__version__", None) != "0.33.0":
    pytest.skip(f"kvtier's adapter targets vLLM 0.33.0, found {vllm.__version__}", allow_module_level=True)

pytestmark = [pytest.mark.vllm]

TOKENS = 16
ROW = 2 * TOKENS * 2 * 64 * 2  # K+V x 16 tokens x 2 heads x 64 dims x fp16 = 8192 bytes per block
TIER = {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm"}


# -- helpers --------------------------------------------------------------------------------------
def shm_files(engine_id: str) -> list[str]:
    return [f for f in os.listdir("/dev/shm") if engine_id in f]


def kvtier_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in ("kvtier-io", "vllm_offload_tier_poll")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offloading_config(entry: dict, *, n_chunks: int = 8, dp_index: int = 0, poll_s: float = 0.0):
    engine_id = f"kvtier-test-{uuid.uuid4().hex[:8]}"
    cfg = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=TOKENS, layer_names=("model.layers.0.self_attn.attn",),
                                      group_id=0),),
        worker_kv_bytes_per_block=ROW,
        enable_kv_cache_events=False,
        extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": n_chunks * ROW,
            "tier_poll_interval_s": poll_s,
            "secondary_tiers": [dict(entry)],
        },
        engine_id=engine_id,
        model=OffloadingModelConfig(name="dummy", dtype="float16", max_model_len=4096),
        cache=OffloadingCacheConfig(tokens_per_hash=TOKENS, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=dp_index, data_parallel_size=dp_index + 1, data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
    return cfg, engine_id


def assert_released(mgr: TieringOffloadingManager, engine_id: str) -> None:
    """The primary region is unmapped (no view of it survives) and its /dev/shm file is gone."""
    region = mgr.primary_tier._mmap_region
    assert region.mmap_obj is None, "vLLM kept the primary mapped: a view of it is still exported"
    assert not shm_files(engine_id), shm_files(engine_id)


@pytest.fixture
def managers() -> Iterator[Any]:
    """Build TieringOffloadingManagers through vLLM's factories; shut down and check at the end."""
    built: list[tuple[TieringOffloadingManager, str]] = []

    def build(entry: dict, **kw: Any) -> tuple[TieringOffloadingManager, KvTierSecondaryTier]:
        cfg, engine_id = offloading_config(entry, **kw)
        mgr = OffloadingSpecFactory.create_spec(cfg).get_manager()
        assert isinstance(mgr, TieringOffloadingManager)
        built.append((mgr, engine_id))
        (tier,) = mgr.secondary_tiers
        assert isinstance(tier, KvTierSecondaryTier)  # loaded by the factory via module_path
        return mgr, tier

    yield build
    for mgr, _ in built:  # shut everything down first, then check
        mgr.shutdown()  # without mgr.lock, as vLLM requires
    for mgr, engine_id in built:
        assert_released(mgr, engine_id)
    assert not kvtier_threads()


def steps_until(mgr: TieringOffloadingManager, done: Any, timeout_s: float = 5.0) -> None:
    """Step ``mgr`` until ``done()`` (kvtier applies engine calls on its own thread: a result the
    adapter refused comes back from it a moment later), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        with mgr.lock:
            step(mgr)
        if done() or time.monotonic() > deadline:
            return
        time.sleep(0.001)


def step(mgr: TieringOffloadingManager, new: tuple[str, ...] = ()) -> None:
    mgr.on_schedule_end(ScheduleEndContext(new_req_ids=list(new), preempted_req_ids=()))


def keys(prefix: str, n: int) -> list[bytes]:
    return [make_offload_key(hashlib.sha256(f"{prefix}-{i}".encode()).digest(), 0) for i in range(n)]


def scrambled_keys(prefix: str, n: int) -> list[bytes]:
    """Keys whose ``set`` iterates in neither list nor sorted order (string hashing is randomised
    per process), so a store job built from the set catches any pairing but the positional one."""
    for attempt in range(1000):
        ks = keys(f"{prefix}.{attempt}", n)
        if list(set(ks)) not in (ks, sorted(ks)):
            return ks
    raise AssertionError("no scrambled key set found")


def pattern(key: bytes) -> np.ndarray:
    seed = hashlib.sha256(key).digest()
    return np.frombuffer((seed * (ROW // len(seed) + 1))[:ROW], dtype=np.int8)


def stat(tier: KvTierSecondaryTier, prefix: str) -> float:
    """Sum of kvtier counters whose sample name starts with ``prefix`` (labels included)."""
    assert tier.kvtier is not None
    return sum(v for k, v in tier.kvtier.stats().items() if k.startswith(prefix))


def producer_store(mgr: TieringOffloadingManager, ctx: ReqContext, ks: list[bytes], view: np.ndarray) -> None:
    """prepare_store → the "GPU worker" writes the rows → complete_store (the cascade to tiers).

    ``complete_store`` gets a *set*, as from the connector, so the adapter must pair keys and
    chunk_ids in iteration order.
    """
    with mgr.lock:
        out = mgr.prepare_store(ks, ctx)
        step(mgr, (ctx.req_id,))
    assert out is not None and list(out.keys_to_store) == ks
    for k, cid in zip(ks, out.store_spec.chunk_ids.tolist()):
        view[cid] = pattern(k)
    with mgr.lock:
        mgr.complete_store(set(ks), ctx)


def promote(prod: TieringOffloadingManager, cons: TieringOffloadingManager, ctx: ReqContext,
            ks: list[bytes]) -> list[Any]:
    """Step both managers (each polls its tier once per step) until the consumer's promotion of
    ``ks`` ended: all HIT (loaded into its primary) or a MISS (the load failed)."""
    deadline = time.monotonic() + 10
    while True:
        with prod.lock:
            step(prod)
        with cons.lock:
            res = [cons.lookup(k, ctx) for k in ks]
            step(cons)
        if res == [LookupResult.HIT] * len(ks) or LookupResult.MISS in res:
            return res
        assert time.monotonic() < deadline, res
        time.sleep(0.002)


# -- manager level --------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_manager_level_store_park_lookup_load_finish(managers, data_plane) -> None:
    prod, ptier = managers({**TIER, "unbound_store_timeout_s": "180", "locality": "REMOTE", "data_plane": data_plane})
    cons, ctier = managers({**TIER, "data_plane": data_plane})
    assert ptier.config.unbound_store_timeout_s == 180.0  # the seed's string value is converted
    assert ptier.tier_type == "KvTierSecondaryTier" and ptier.cache_hit_source.name == "P2P"
    assert ptier.medium is None and ptier.locality is None
    assert prod._polled_tiers == [ptier]  # opted in to off-thread polling (thread off: poll_s=0)
    host, port = ptier.address.rsplit(":", 1)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    cview = np.asarray(cons.primary_tier.get_kv_memoryview())
    ks = scrambled_keys("prompt", 3)

    # producer leg: REQUEST_LEVEL, lookups MISS, the store is parked past on_request_finished
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "cmpl-K1"}})
    with prod.lock:
        assert prod.on_new_request(P).policy is OffloadPolicy.REQUEST_LEVEL
        assert prod.lookup(ks[0], P) is LookupResult.MISS
    producer_store(prod, P, ks, pview)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
        step(prod)
    assert len(prod._jobs) == 1, "the store job must stay outstanding (parked) until fetched"
    assert ptier.has_pending_work()

    # consumer leg: HIT -> promotion -> one submit_load -> fetch over zmq -> bytes in place
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "cmpl-K1", "remote_host": host, "remote_port": int(port)}})
    with cons.lock:
        assert cons.on_new_request(D).policy is OffloadPolicy.CHUNK_LEVEL
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.HIT_PENDING] * 3
        step(cons, ("req-D",))  # _flush_pending_promotions -> tier.submit_load
    assert promote(prod, cons, D, ks) == [LookupResult.HIT] * 3, ctier.kvtier.stats()
    with cons.lock:
        spec = cons.prepare_load(ks, D)
        for k, cid in zip(ks, spec.chunk_ids.tolist()):
            assert np.array_equal(cview[cid], pattern(k)), "promoted bytes differ from the prefill's"
        cons.complete_load(ks, D)
        cons.on_request_finished(D)
        step(cons)
    assert stat(ctier, "kvtier_block_bytes_landed") == 3 * ROW

    # the producer's store job is reported (success) once the transfer completed: rows unpinned
    deadline = time.monotonic() + 10
    while prod._jobs:
        with prod.lock:
            step(prod)
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert stat(ptier, 'kvtier_jobs_total{kind=store,outcome=ok') == 1
    # engine calls hand commands to kvtier's I/O thread: it has work until it applied the last ones
    while ctier.has_pending_work() or ptier.has_pending_work():
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert not cons._jobs
    del pview, cview


@pytest.mark.timeout(60)
def test_second_decode_request_for_one_id_fails_fast_and_recomputes(managers) -> None:
    prod, _ = managers(TIER)
    cons, ctier = managers(TIER)
    host, port = prod.secondary_tiers[0].address.rsplit(":", 1)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    ks = keys("twice", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K2"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    with prod.lock:
        prod.on_request_finished(P)
    src = {"remote_prefiller": {"kv_request_id": "K2", "remote_host": host, "remote_port": int(port)}}
    A = ReqContext("req-A", kv_transfer_params=src)
    B = ReqContext("req-B", kv_transfer_params=src)  # e.g. a proxy retry reusing the id
    with cons.lock:
        cons.on_new_request(A)
        assert [cons.lookup(k, A) for k in ks] == [LookupResult.HIT_PENDING] * 2
        step(cons)
    assert promote(prod, cons, A, ks) == [LookupResult.HIT] * 2
    t0 = time.monotonic()
    with cons.lock:  # A still runs; B asks for the same id: refused (at once or by its load)
        cons.on_new_request(B)
        cons.reset_cache()  # empty the primary so that B's lookups reach the tier
        cons.on_reset_flushed()
        first = [cons.lookup(k, B) for k in ks]
        step(cons)
    if first != [LookupResult.MISS] * 2:
        assert LookupResult.MISS in promote(prod, cons, B, ks)
    assert time.monotonic() - t0 < 5.0  # not load_timeout_s (30 s)
    with cons.lock:
        assert [cons.lookup(k, B) for k in ks] == [LookupResult.MISS] * 2  # and it stays MISS
        cons.on_request_finished(A)
        cons.on_request_finished(B)
        step(cons)
    assert not cons._jobs, cons._jobs  # every job reported exactly once
    assert stat(ctier, "kvtier_jobs_total{kind=load,outcome=ok") == 1
    del pview


@pytest.mark.timeout(60)
def test_hash_seed_is_resolved_lazily_and_checked_in_the_handshake(managers, monkeypatch) -> None:
    import vllm.v1.core.kv_cache_utils as kcu
    from vllm.utils.hashing import sha256

    prod, ptier = managers(TIER)  # built before init_none_hash, as in vLLM's EngineCore
    cons, ctier = managers({**TIER, "hash_seed": "another-seed"})  # explicit: wins, with a warning
    monkeypatch.setattr(kcu, "_NONE_HASH_SEED", kcu._NONE_HASH_SEED)  # restore vLLM's globals after
    monkeypatch.setattr(kcu, "NONE_HASH", getattr(kcu, "NONE_HASH", None), raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", "kvtier-seed-test")
    kcu.init_none_hash(sha256)
    with prod.lock:
        step(prod)  # the first poll after init_none_hash picks the seed up
    assert ptier.kvtier.local_hello.hash_seed == "kvtier-seed-test"

    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    ks = keys("seed", 1)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K3"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    host, port = ptier.address.rsplit(":", 1)
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "K3", "remote_host": host, "remote_port": int(port)}})
    t0 = time.monotonic()
    with cons.lock:
        cons.on_new_request(D)
        assert cons.lookup(ks[0], D) is LookupResult.HIT_PENDING
        step(cons)
    # the producer refuses the hello (hash_seed differs): the load fails, vLLM recomputes
    assert promote(prod, cons, D, ks) == [LookupResult.MISS]
    assert time.monotonic() - t0 < 5.0
    assert stat(ctier, "kvtier_session_ends_total{reason=handshake_mismatch}") == 1
    with cons.lock:
        cons.on_request_finished(D)
        step(cons)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
    del pview


@pytest.mark.timeout(60)
def test_config_is_validated_before_anything_is_built(monkeypatch) -> None:
    # a bool is not a number (Python's bool is an int): refused, and vLLM cleans up /dev/shm
    cfg, engine_id = offloading_config({**TIER, "unbound_store_timeout_s": True})
    with pytest.raises(TierConfigError, match=r"unbound_store_timeout_s=True"):
        OffloadingSpecFactory.create_spec(cfg).get_manager()
    assert not shm_files(engine_id)
    # +inf and a typo are refused too, the typo with a did-you-mean
    for bad, match in (({"load_timeout_s": float("inf")}, "load_timeout_s=inf"),
                       ({"unbound_store_timout_s": 180}, "did you mean 'unbound_store_timeout_s'")):
        cfg, engine_id = offloading_config({**TIER, **bad})
        with pytest.raises(TierConfigError, match=match):
            OffloadingSpecFactory.create_spec(cfg).get_manager()
        assert not shm_files(engine_id)

    # a failure after the pool exists (the port is taken) releases the primary memory too
    import vllm.v1.kv_offload.tiering.spec as spec_mod

    regions: list[Any] = []

    class SpyRegion(spec_mod.SharedOffloadRegion):  # type: ignore[name-defined,misc]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            regions.append(self)

    monkeypatch.setattr(spec_mod, "SharedOffloadRegion", SpyRegion)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cfg, engine_id = offloading_config({**TIER, "port": busy.getsockname()[1]})
        with pytest.raises(TransportError):
            OffloadingSpecFactory.create_spec(cfg).get_manager()
    (region,) = regions
    assert region.mmap_obj is None, "the failed constructor kept a view of the primary memory"
    assert not shm_files(engine_id)


@pytest.mark.timeout(60)
def test_port_adds_the_data_parallel_index(managers) -> None:
    port = free_port()
    _, tier = managers({**TIER, "port": port - 1}, dp_index=1)
    assert tier.address == f"127.0.0.1:{port}"
    assert tier.config.port == port


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


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

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


# -- PD pair: two real schedulers ------------------------------------------------------------------
BLOCK = 16
NUM_GPU_BLOCKS = 64
EOS = 2
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 1, "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": EOS,
}


class Engine:
    """A real v1 Scheduler (+ OffloadingConnector + kvtier tier) with a faked GPU worker."""

    def __init__(self, name: str, model_dir: str, tier_entry: dict, *, poll_s: float = 0.001) -> None:
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        self.name = name
        self.engine_id = f"kvtier-pd-{name}-{uuid.uuid4().hex[:6]}"
        vllm_config = VllmConfig(
            model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16",
                                     max_model_len=1024, seed=0),
            cache_config=CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto",
                                     enable_prefix_caching=True),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=1024,
                                             enable_chunked_prefill=True, is_encoder_decoder=False),
            kv_transfer_config=KVTransferConfig(
                kv_connector="OffloadingConnector", kv_role="kv_both", engine_id=self.engine_id,
                kv_connector_extra_config={
                    "spec_name": "TieringOffloadingSpec",
                    "cpu_bytes_to_use": 16 * ROW,
                    # > 0: vLLM's tier-poll thread drives kvtier between steps (default 1 ms);
                    # 0: no thread, kvtier is polled only when the engine steps
                    "tier_poll_interval_s": poll_s,
                    "secondary_tiers": [tier_entry],
                },
            ),
            device_config=DeviceConfig("cpu"),
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=NUM_GPU_BLOCKS, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], FullAttentionSpec(
                block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.float16))],
        )
        vllm_config.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
        self.sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                               structured_output_manager=StructuredOutputManager(vllm_config),
                               block_size=BLOCK, log_stats=True)
        self.manager: TieringOffloadingManager = self.sched.connector.connector_scheduler.manager
        (self.tier,) = self.manager.secondary_tiers
        assert isinstance(self.tier, KvTierSecondaryTier)
        self.primary: np.ndarray | None = np.asarray(self.manager.primary_tier.get_kv_memoryview())
        self.stored: dict[bytes, bytes] = {}  # block hash -> bytes the worker wrote (prefill)
        self.loaded: dict[str, list[bytes]] = {}  # req id -> block hashes loaded from primary
        self.loaded_bytes: dict[bytes, bytes] = {}  # block hash -> bytes the worker loaded (decode)
        self.scheduled: dict[str, int] = {}  # req id -> tokens scheduled (computed) so far
        self.finished: set[str] = set()

    def _gpu_block_hash(self, block_id: int) -> bytes:
        blk = self.sched.kv_cache_manager.block_pool.blocks[block_id]
        assert blk.block_hash is not None
        return bytes(blk.block_hash)[:-4]  # BlockHashWithGroupId = hash + 4-byte group id

    def step(self) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        so = self.sched.schedule()
        meta = so.kv_connector_metadata
        wmeta = OffloadingWorkerMetadata()
        recving: set[str] = set()
        assert self.primary is not None
        for jid, job in meta.store_jobs.items():  # GPU -> primary
            for bid, cid in zip(job.src_spec.block_ids.tolist(), job.dst_spec.chunk_ids.tolist()):
                h = self._gpu_block_hash(bid)
                self.primary[cid] = pattern(h)
                self.stored[h] = self.primary[cid].tobytes()
            wmeta.mark_completed(jid)
        for jid, job in meta.load_jobs.items():  # primary -> GPU
            req = self.sched.requests[job.req_id]
            first = job.dst_spec.block_indices[0]
            for i, cid in enumerate(job.src_spec.chunk_ids.tolist()):
                h = bytes(req.block_hashes[first + i])
                self.loaded.setdefault(job.req_id, []).append(h)
                self.loaded_bytes[h] = self.primary[cid].tobytes()
            wmeta.mark_completed(jid)
            if not job.sync:
                recving.add(job.req_id)
        for rid, n in so.num_scheduled_tokens.items():
            self.scheduled[rid] = self.scheduled.get(rid, 0) + n
        req_ids = list(so.num_scheduled_tokens)
        out = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[7] for _ in req_ids], logprobs=None, prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=KVConnectorOutput(finished_sending=set(), finished_recving=recving,
                                                  kv_connector_worker_meta=wmeta if wmeta.completed_jobs else None),
        )
        outputs = self.sched.update_from_output(so, out)
        for eco in outputs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)

    def add(self, req_id: str, prompt: list[int], max_tokens: int, params: dict) -> None:
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        sp = SamplingParams(max_tokens=max_tokens, extra_args={"kv_transfer_params": params})
        sp.update_from_generation_config({}, EOS)
        req = Request(request_id=req_id, prompt_token_ids=prompt, sampling_params=sp, pooling_params=None,
                      block_hasher=get_request_block_hasher(BLOCK, sha256))
        assert req.kv_transfer_params == params  # how the OpenAI server hands them over
        self.sched.add_request(req)

    def busy(self) -> bool:
        return self.sched.has_requests() or self.sched.connector.has_pending_push_work()

    def shutdown(self) -> None:
        self.primary = None  # our own view of the primary region
        self.sched.shutdown()


def run(engines: list[Engine], until, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        for e in engines:
            if e.busy():
                e.step()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


@pytest.fixture(scope="module")
def model_dir() -> str:
    """A config-only tiny Llama (no weights, no tokenizer), and vLLM's block-hash init."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    path = tempfile.mkdtemp(prefix="kvtier-tiny-llama-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_pd_pair_with_real_schedulers(model_dir: str, data_plane: str) -> None:
    """Prefill and decode engines with vLLM's real schedulers, on each data plane (NIXL: the
    adapter registers vLLM's primary-tier region with the agent; blocks are WRITten into it)."""
    load_timeout_s = 20.0
    plane = {"data_plane": data_plane}
    prefill = Engine("prefill", model_dir, {**TIER, **plane, "unbound_store_timeout_s": "5"})
    decode = Engine("decode", model_dir, {**TIER, **plane, "load_timeout_s": load_timeout_s})
    engines = [prefill, decode]
    try:
        host, port = prefill.tier.address.rsplit(":", 1)

        def consumer(kid: str) -> dict:
            return {"remote_prefiller": {"kv_request_id": kid, "remote_host": host, "remote_port": int(port)}}

        prompt = [(i * 7 + 3) % 1000 + 10 for i in range(50)]  # 3 full blocks + 2 tokens
        late_prompt = [(i * 11 + 5) % 1000 + 10 for i in range(40)]  # 2 full blocks + 8 tokens

        # 1. prefill both requests (max_tokens=1, as a PD proxy sends); their chunks are parked
        prefill.add("P1", prompt, 1, {"remote_decoder": {"kv_request_id": "cmpl-kv-1"}})
        prefill.add("P2", late_prompt, 1, {"remote_decoder": {"kv_request_id": "cmpl-kv-2"}})
        run([prefill], lambda: {"P1", "P2"} <= prefill.finished, "prefill")
        assert len(prefill.stored) == 5
        assert len(prefill.manager._jobs) >= 2  # parked store jobs (at least one per request)

        # 2. decode request 1: promoted from the prefill engine over kvtier, byte-identical
        decode.add("D1", prompt, 3, consumer("cmpl-kv-1"))
        run(engines, lambda: "D1" in decode.finished, "decode of D1")
        assert len(decode.loaded["D1"]) == 3
        for h in decode.loaded["D1"]:  # what the decode worker loaded == what the prefill stored
            assert decode.loaded_bytes[h] == prefill.stored[h] == pattern(h).tobytes()
        assert decode.scheduled["D1"] < len(prompt)  # only the tail + decode tokens computed
        assert stat(decode.tier, "kvtier_block_bytes_landed") == 3 * ROW

        # 3. the unfetched request 2 is reaped (short unbound_store_timeout_s): vLLM unpins it
        run([prefill], lambda: not prefill.manager._jobs, "the reap of cmpl-kv-2", timeout_s=15)
        assert stat(prefill.tier, "kvtier_jobs_total{kind=store,outcome=fail,reason=reaped}") >= 1
        assert stat(prefill.tier, "kvtier_jobs_total{kind=store,outcome=ok") >= 1  # request 1's

        # 4. a late decode for it is refused in one round trip, and vLLM recomputes locally
        t0 = time.monotonic()
        decode.add("D2", late_prompt, 2, consumer("cmpl-kv-2"))
        run(engines, lambda: stat(decode.tier, "kvtier_jobs_total{kind=load,outcome=fail") >= 1,
            "the failed load of D2", timeout_s=load_timeout_s)
        elapsed = time.monotonic() - t0
        assert elapsed < load_timeout_s / 4, f"late fetch took {elapsed:.1f}s to be refused"
        assert stat(prefill.tier, "kvtier_fetches_refused_total{reason=reaped}") == 1
        assert stat(decode.tier, "kvtier_jobs_total{kind=load,outcome=fail,reason=reaped}") == 1
        run(engines, lambda: "D2" in decode.finished, "the local recompute of D2")
        assert "D2" not in decode.loaded  # nothing was loaded for it ...
        assert decode.scheduled["D2"] >= len(late_prompt)  # ... the whole prompt was computed

        run(engines, lambda: not (prefill.busy() or decode.busy()), "both engines idle")
    finally:
        for e in engines:
            e.shutdown()
    # 5. clean shutdown: regions unmapped, /dev/shm files gone, no poll threads left
    for e in engines:
        assert_released(e.manager, e.engine_id)
        assert e.tier.kvtier is None
    assert not kvtier_threads()


@pytest.mark.timeout(90)
def test_pd_pair_driven_by_engine_steps_only(model_dir: str) -> None:
    """tier_poll_interval_s = 0 and kvtier caller-driven (``background_poll: false``): no poll
    thread at all; kvtier progresses only when engines step, which they keep doing while a job is
    outstanding (has_pending_push_work)."""
    steps_only = {**TIER, "background_poll": False}
    prefill = Engine("prefill0", model_dir, steps_only, poll_s=0)
    decode = Engine("decode0", model_dir, steps_only, poll_s=0)
    engines = [prefill, decode]
    try:
        assert not kvtier_threads()
        host, port = prefill.tier.address.rsplit(":", 1)
        prompt = [(i * 13 + 1) % 1000 + 10 for i in range(64)]  # 4 full blocks
        prefill.add("P", prompt, 1, {"remote_decoder": {"kv_request_id": "cmpl-kv-steps"}})
        run([prefill], lambda: "P" in prefill.finished, "prefill")
        assert prefill.busy(), "a parked store job keeps the prefill engine stepping"
        decode.add("D", prompt, 2, {"remote_prefiller": {
            "kv_request_id": "cmpl-kv-steps", "remote_host": host, "remote_port": int(port)}})
        run(engines, lambda: "D" in decode.finished, "decode of D")
        run(engines, lambda: not (prefill.busy() or decode.busy()), "both engines idle")
        loaded = decode.loaded["D"]
        assert len(loaded) >= 3  # at least the blocks before the last (partly recomputed) one
        for h in loaded:
            assert decode.loaded_bytes[h] == prefill.stored[h]
    finally:
        for e in engines:
            e.shutdown()
    for e in engines:
        assert_released(e.manager, e.engine_id)


# -- a producer request with nothing stored; remote_port as a string --------------------
@pytest.mark.timeout(60)
def test_nothing_stored_is_refused_in_one_round_trip_through_the_adapter(managers) -> None:
    """vLLM could not store the producer request's chunks (no prepare/complete_store, so kvtier
    never sees a store job) and the request finished.  The decode request's promotion then MISSes
    at once with the kvtier reason ``nothing_stored`` — well inside promote()'s 10 s bound while
    fetch_supply_timeout_s is 30 s — and vLLM recomputes.  The decode side names the producer with
    ``remote_port`` as a numeric string, as a JSON proxy writes it."""
    slow = {"fetch_supply_timeout_s": "30", "load_timeout_s": "60"}
    prod, ptier = managers({**TIER, **slow})
    cons, ctier = managers({**TIER, **slow})
    host, port = ptier.address.rsplit(":", 1)
    ks = keys("never-stored", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K9"}})
    with prod.lock:
        prod.on_new_request(P)
        step(prod, ("req-P",))
        prod.on_request_finished(P)  # finished without a single store
        step(prod)
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "K9", "remote_host": host, "remote_port": str(port)}})
    with cons.lock:
        cons.on_new_request(D)
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.HIT_PENDING] * 2
        step(cons, ("req-D",))
    assert LookupResult.MISS in promote(prod, cons, D, ks)
    assert stat(ctier, "kvtier_jobs_total{kind=load,outcome=fail,reason=nothing_stored}") == 1
    assert stat(ptier, "kvtier_fetches_refused_total{reason=nothing_stored}") == 1
    with cons.lock:
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.MISS] * 2
        cons.on_request_finished(D)
        step(cons)
    assert not cons._jobs and not prod._jobs


@pytest.mark.timeout(60)
def test_remote_port_as_a_numeric_string_loads_through_the_adapter(managers) -> None:
    """``remote_port: "<digits>"`` is accepted and the promotion loads the producer's bytes."""
    prod, ptier = managers(TIER)
    cons, _ = managers(TIER)
    host, port = ptier.address.rsplit(":", 1)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    cview = np.asarray(cons.primary_tier.get_kv_memoryview())
    ks = keys("string-port", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K10"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "K10", "remote_host": host, "remote_port": str(port)}})
    with cons.lock:
        cons.on_new_request(D)
        # the scheduler looks the blocks up when it schedules the request, in that same step
        # (a request scheduled with nothing to load tells its producer so at the step's end)
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.HIT_PENDING] * 2
        step(cons, ("req-D",))
    assert promote(prod, cons, D, ks) == [LookupResult.HIT] * 2
    with cons.lock:
        spec = cons.prepare_load(ks, D)
        for k, cid in zip(ks, spec.chunk_ids.tolist()):
            assert np.array_equal(cview[cid], pattern(k))
        cons.complete_load(ks, D)
        cons.on_request_finished(D)
        step(cons)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
    del pview, cview


@pytest.mark.timeout(60)
@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_a_decode_that_needs_nothing_releases_the_prefill_at_once(managers, data_plane) -> None:
    """The decode request is scheduled without loading anything (every block hit locally: no
    lookup, no submit_load).  At the end of that step the adapter tells the producer (an empty
    fetch, decision L16): the prefill's parked store job succeeds within a second (bound),
    counted ``not_needed``, not after ``unbound_store_timeout_s`` (180 s here)."""
    prod, ptier = managers({**TIER, "unbound_store_timeout_s": "180", "data_plane": data_plane})
    cons, ctier = managers({**TIER, "data_plane": data_plane})
    host, port = ptier.address.rsplit(":", 1)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    ks = keys("cached", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "cmpl-N1"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
    assert len(prod._jobs) == 1  # parked
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "cmpl-N1", "remote_host": host, "remote_port": int(port)}})
    with cons.lock:
        cons.on_new_request(D)
        step(cons, ("req-D",))  # scheduled for the first time, nothing to load
    t0 = time.monotonic()
    while prod._jobs or ctier.has_pending_work():
        with prod.lock:
            step(prod)
        with cons.lock:
            step(cons)
        assert time.monotonic() - t0 < 1.0, (len(prod._jobs), ptier.kvtier.stats())
        time.sleep(0.002)
    assert stat(ptier, "kvtier_jobs_total{kind=store,outcome=ok,reason=not_needed}") == 1
    assert not cons._jobs  # the adapter's own empty load reports nothing to vLLM
    with cons.lock:
        cons.on_request_finished(D)
        step(cons)
    del pview


@pytest.mark.timeout(60)
def test_the_two_documented_examples_run_side_by_side_on_one_host(managers) -> None:
    """docs/integrations/vllm.md's prefill and decode tier entries, built through vLLM's factories
    in one process (host 127.0.0.1; every port shifted by one offset so that other runs on this
    machine do not collide, their relation kept): both listeners and both metrics endpoints bind
    together, the decode engine dials the listed prefill endpoint and loads from it."""
    import json
    import random
    import re
    import urllib.request
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "integrations" / "vllm.md").read_text()
    blobs = re.findall(r"--kv-transfer-config '(\{.*?\})'", text, flags=re.S)
    prefill, decode = (json.loads(b)["kv_connector_extra_config"]["secondary_tiers"][0] for b in blobs[:2])
    assert prefill["metrics_port"] != decode["metrics_port"]
    shift = random.randrange(20000, 40000)
    p_entry = {**prefill, "host": "127.0.0.1", "port": prefill["port"] + shift,
               "metrics_port": prefill["metrics_port"] + shift}
    d_entry = {**decode, "host": "127.0.0.1", "metrics_port": decode["metrics_port"] + shift,
               "allowed_peers": [f"127.0.0.1:{prefill['port'] + shift}"]}
    assert decode["allowed_peers"] == [f"{prefill['host']}:{prefill['port']}"]
    prod, ptier = managers(p_entry)
    cons, ctier = managers(d_entry)
    for tier in (ptier, ctier):
        with urllib.request.urlopen(f"http://{tier.kvtier.metrics_address}/metrics", timeout=5) as r:
            assert b"kvtier_" in r.read()
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    cview = np.asarray(cons.primary_tier.get_kv_memoryview())
    ks = keys("documented", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K-doc"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "K-doc", "remote_host": "127.0.0.1", "remote_port": prefill["port"] + shift}})
    with cons.lock:
        cons.on_new_request(D)
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.HIT_PENDING] * 2
        step(cons, ("req-D",))
    assert promote(prod, cons, D, ks) == [LookupResult.HIT] * 2
    with cons.lock:
        spec = cons.prepare_load(ks, D)
        for k, cid in zip(ks, spec.chunk_ids.tolist()):
            assert np.array_equal(cview[cid], pattern(k))
        cons.complete_load(ks, D)
        cons.on_request_finished(D)
        step(cons)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
    del pview, cview
