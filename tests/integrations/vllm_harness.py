"""The harness for kvtier inside real vLLM 0.33.0 code, on CPU (no GPU, no model weights).

Two levels:

* **manager level** ("level A"): the real ``OffloadingSpecFactory`` → ``TieringOffloadingSpec`` →
  ``TieringOffloadingManager`` with a real CPU primary tier over ``/dev/shm``; vLLM's
  ``SecondaryTierFactory`` loads :class:`kvtier.integrations.vllm.KvTierSecondaryTier` by
  ``module_path``.  The test drives the manager in the order the offloading connector does.
* **PD pair** ("level C"): a prefill engine and a decode engine, each a real v1 ``Scheduler`` with
  the real ``OffloadingConnector`` and its own kvtier tier, talking over kvtier's zmq transport on
  127.0.0.1.  Only the GPU worker is faked (it copies bytes between a fake GPU and the primary).

Importing this module skips the importing test module, with the reason shown, when vLLM 0.33.0
cannot be imported. Tests: ``test_vllm.py`` (manager level), ``test_vllm_params.py``,
``test_vllm_pd.py`` (the PD pair), ``test_vllm_metrics.py``, ``test_vllm_symmetric.py``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
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
# Made once per process tree (a child inherits the variable) and removed by the process that made it.
OWN_CACHE_ROOT: str | None = None
"""The vLLM cache this process made (``None`` if it inherited one): removed at exit, or at the
end of the test session when pytest runs in this process (``remove_own_cache``)."""
if "VLLM_CACHE_ROOT" not in os.environ:
    OWN_CACHE_ROOT = os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="kvtier-vllm-cache-")
    atexit.register(shutil.rmtree, OWN_CACHE_ROOT, ignore_errors=True)


def remove_own_cache() -> None:
    """Remove the vLLM cache this process made, now: a one-process pytest run checks for temp dirs
    left behind (tests/conftest.py) before ``atexit`` handlers run."""
    if OWN_CACHE_ROOT is not None:
        shutil.rmtree(OWN_CACHE_ROOT, ignore_errors=True)
os.environ.setdefault("UCX_NET_DEVICES", "lo")  # the NIXL plane runs on loopback here
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

try:  # any failure (ImportError, or e.g. a half-installed transformers' TypeError) => skip
    import numpy as np
    import torch
    import vllm
    from vllm.v1.kv_offload.base import (
        LookupResult,
        OffloadPolicy,  # noqa: F401  (for the tests)
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

    from kvtier.config import TierConfigError  # noqa: F401  (for the tests)
    from kvtier.integrations.vllm import KvTierSecondaryTier
    from kvtier.transport import TransportError  # noqa: F401  (for the tests)
except Exception as exc:
    pytest.skip(f"vLLM 0.33.0 tiering is not importable here: {exc!r}", allow_module_level=True)

if getattr(vllm, "__version__", None) != "0.33.0":
    pytest.skip(f"kvtier's adapter targets vLLM 0.33.0, found {vllm.__version__}", allow_module_level=True)

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


def free_ports(n: int) -> int:
    """A port P with P .. P + n - 1 all free now (bound together, then released): a test whose
    ports follow from one another (a rank's index, a metrics port) must not land on one that a
    test running beside it holds."""
    for _ in range(100):
        base, socks = free_port(), []
        try:
            for p in range(base, base + n):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", p))
            return base
        except (OSError, OverflowError):  # a neighbour is taken, or past 65535: another base
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports on 127.0.0.1")


def offloading_config(entry: dict, *, n_chunks: int = 8, dp_index: int = 0, poll_s: float = 0.0,
                      kv_cache_layout: str | None = None):
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
        kv_cache_layout=kv_cache_layout,
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


def finish(prod: TieringOffloadingManager, cons: TieringOffloadingManager, p: ReqContext, c: ReqContext) -> None:
    """Both engines finish their request (``c`` on the consumer, ``p`` on the producer), each
    followed by a step."""
    with cons.lock:
        cons.on_request_finished(c)
        step(cons)
    with prod.lock:
        prod.on_request_finished(p)
        step(prod)


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

    def __init__(self, name: str, model_dir: str, tier_entry: dict, *, poll_s: float = 0.001,
                 multi: bool = False) -> None:
        """``multi``: the offloading connector is the only one of a ``MultiConnector`` (as beside a
        NixlConnector), which builds it from its own ``--kv-transfer-config`` entry."""
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
        self.multi = multi
        offloading = {
            "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": 16 * ROW,
                # > 0: vLLM's tier-poll thread drives kvtier between steps (default 1 ms);
                # 0: no thread, kvtier is polled only when the engine steps
                "tier_poll_interval_s": poll_s,
                "secondary_tiers": [tier_entry],
            },
        }
        vllm_config = VllmConfig(
            model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16",
                                     max_model_len=1024, seed=0),
            cache_config=CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto",
                                     enable_prefix_caching=True),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=1024,
                                             enable_chunked_prefill=True, is_encoder_decoder=False),
            kv_transfer_config=KVTransferConfig(engine_id=self.engine_id, **(
                {"kv_connector": "MultiConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"connectors": [offloading]}} if multi else offloading)),
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
        connector = self.sched.connector.sub_connectors[0] if multi else self.sched.connector
        self.manager: TieringOffloadingManager = connector.connector_scheduler.manager
        (self.tier,) = self.manager.secondary_tiers
        assert isinstance(self.tier, KvTierSecondaryTier)
        self.primary: np.ndarray | None = np.asarray(self.manager.primary_tier.get_kv_memoryview())
        self.stored: dict[bytes, bytes] = {}  # block hash -> bytes the worker wrote (prefill)
        self.loaded: dict[str, list[bytes]] = {}  # req id -> block hashes loaded from primary
        self.loaded_bytes: dict[bytes, bytes] = {}  # block hash -> bytes the worker loaded (decode)
        self.scheduled: dict[str, int] = {}  # req id -> tokens scheduled (computed) so far
        self.finished: set[str] = set()

    def _worker_meta(self, wmeta: Any) -> Any:
        if not wmeta.completed_jobs:
            return None
        if not self.multi:
            return wmeta
        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorWorkerMetadata

        return MultiKVConnectorWorkerMetadata(metadata=(wmeta,))

    def _gpu_block_hash(self, block_id: int) -> bytes:
        blk = self.sched.kv_cache_manager.block_pool.blocks[block_id]
        assert blk.block_hash is not None
        return bytes(blk.block_hash)[:-4]  # BlockHashWithGroupId = hash + 4-byte group id

    def step(self) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        so = self.sched.schedule()
        meta = so.kv_connector_metadata.metadata[0] if self.multi else so.kv_connector_metadata
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
                                                  kv_connector_worker_meta=self._worker_meta(wmeta)),
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
def model_dir() -> Iterator[str]:
    """A config-only tiny Llama (no weights, no tokenizer), and vLLM's block-hash init; removed
    after the module's tests."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    path = tempfile.mkdtemp(prefix="kvtier-tiny-llama-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    yield path
    shutil.rmtree(path, ignore_errors=True)
