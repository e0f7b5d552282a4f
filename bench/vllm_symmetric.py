"""The symmetric path in real vLLM 0.33.0 schedulers: kvtier's tier beside vLLM's own ``p2p`` tier.

Two engines in one process, each a real v1 ``Scheduler`` with the real ``OffloadingConnector``,
``TieringOffloadingManager`` and CPU primary tier over ``/dev/shm``, and one secondary tier: vLLM
0.33.0's own ``{"type": "p2p"}`` (ZeroMQ control, NIXL data) or kvtier's ``KvTierSecondaryTier``
(``serve_external`` on; ``--kvtier-plane zmq|nixl``), on 127.0.0.1.  Only the GPU worker is faked
(it copies bytes between a fake GPU and the primary), as in tests/integrations/test_vllm.py.

Engine A computes a prompt locally; engine B gets it with ``{"remote_kv_source": {...}}`` naming A.
Every tier call is observed (time, engine, method, result), and per rep we report request → first
HIT (or MISS), request → first scheduled (and in how many engine steps), each load's duration, the
tokens vLLM counted as computed, A's pins and their releases, and whether B's worker loaded
exactly the bytes A's worker stored.  Variants:

* ``full``    B's prompt == A's (6 full blocks + 2 tokens): every block HIT.
* ``partial`` A computed the same first 5 blocks and another 6th: 5 HIT, 1 MISS.
* ``closed``  B names a port nobody listens on.
* ``silent``  (not in the default set) B names a TCP listener that never answers.
* ``reset``   (with ``--poll-s 0``) A's engine resets its cache while it pins blocks for an
  unfetched round: does ``reset_cache`` survive?

Rep 0 of ``full`` pays the session's dial and handshake (cold).  Usage (vLLM 0.33.0 and, for the
``p2p`` tier and kvtier's NIXL plane, nixl-cu12 installed)::

    python -m bench.vllm_symmetric --tier both --reps 5 --out results.json

Timings come from a shared 2-core machine: compare the tiers within one run, not across runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
_CACHE_DIR = tempfile.mkdtemp(prefix="symbench-vllm-cache-")
os.environ.setdefault("VLLM_CACHE_ROOT", _CACHE_DIR)
os.environ.setdefault("UCX_NET_DEVICES", "lo")  # UCX listens on loopback only
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")  # what vLLM would set before importing nixl

# vLLM's p2p tier imports `nixl._api` (vllm/distributed/nixl_utils.py); the wheel installed here is
# nixl-cu12, whose package is `nixl_cu12`.  Alias it in this process only.
try:
    import nixl_cu12  # noqa: E402
    import nixl_cu12._api  # noqa: E402
    import nixl_cu12._bindings  # noqa: E402

    sys.modules.setdefault("nixl", nixl_cu12)
    sys.modules.setdefault("nixl._api", nixl_cu12._api)
    sys.modules.setdefault("nixl._bindings", nixl_cu12._bindings)
except ImportError:  # the p2p tier and kvtier's NIXL plane are then unavailable
    pass

import numpy as np  # noqa: E402
import torch  # noqa: E402

from vllm.v1.kv_offload.tiering.p2p.session.session import P2PSession  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager  # noqa: E402

TOKENS = 16
BLOCK = 16
ROW = 2 * TOKENS * 2 * 64 * 2  # K+V x 16 tokens x 2 heads x 64 dims x fp16 = 8192 bytes per block
NUM_GPU_BLOCKS = 128
EOS = 2
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 1, "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": EOS,
}
FULL_BLOCKS = 6
PROMPT_LEN = FULL_BLOCKS * BLOCK + 2  # 6 full blocks + 2 tokens

# -- observation -------------------------------------------------------------------------------
T0 = time.monotonic()
EVENTS: list[dict[str, Any]] = []
_ev_lock = threading.Lock()


def note(engine: str, what: str, **kw: Any) -> None:
    with _ev_lock:
        EVENTS.append({"t": time.monotonic(), "engine": engine, "thread": threading.current_thread().name,
                       "what": what, **kw})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pattern(block_hash: bytes) -> np.ndarray:
    seed = hashlib.sha256(block_hash).digest()
    return np.frombuffer((seed * (ROW // len(seed) + 1))[:ROW], dtype=np.int8)


_orig_do_send = P2PSession._do_send


def _traced_do_send(self: P2PSession, msg: dict) -> None:
    keys = msg.get("keys")
    note(self._local_id, "send", to=self.peer_id, type=msg.get("type"),
         kv_request_id=msg.get("kv_request_id"), n=None if keys is None else len(keys),
         hits=None if "hits" not in msg else sum(bool(h) for h in msg["hits"]),
         round=msg.get("round_seq"))
    return _orig_do_send(self, msg)


P2PSession._do_send = _traced_do_send  # every wire message either tier sends


def instrument(name: str, tier: Any, mgr: TieringOffloadingManager) -> None:
    """Wrap the tier's engine-facing methods and the ParentManager handed to it."""

    def wrap(obj: Any, meth: str, summarise) -> None:
        orig = getattr(obj, meth)

        def w(*a: Any, **kw: Any) -> Any:
            t_call = time.monotonic()
            r = orig(*a, **kw)
            s = summarise(a, r)
            if s is not None:
                note(name, meth, t_call=t_call, **s)
            return r

        setattr(obj, meth, w)

    def lookup_s(a, r):
        ctx = a[1]
        return {"req": ctx.req_id, "result": r.name}

    def jobs_s(a, r):
        r = list(r)
        if not r:
            return None
        return {"results": [(j.job_id, j.success, None if j.successful_keys is None else len(j.successful_keys))
                            for j in r]}

    def load_s(a, r):
        j = a[0]
        return {"job": j.job_id, "n": len(list(j.keys)), "req": j.req_context.req_id}

    def store_s(a, r):
        j = a[0]
        return {"job": j.job_id, "n": len(j.chunk_ids), "req": j.req_context.req_id}

    # get_finished_jobs returns a list; wrap so the list is re-materialised for the caller
    orig_gfj = tier.get_finished_jobs

    def gfj() -> list:
        r = list(orig_gfj())
        if r:
            note(name, "get_finished_jobs", results=[
                (j.job_id, j.success, None if j.successful_keys is None else len(j.successful_keys)) for j in r])
        return r

    tier.get_finished_jobs = gfj  # type: ignore[method-assign]
    wrap(tier, "lookup", lookup_s)
    wrap(tier, "submit_load", load_s)
    wrap(tier, "submit_store", store_s)
    wrap(tier, "on_new_request", lambda a, r: {"req": a[0].req_id, "policy": r.policy.name})
    wrap(tier, "on_request_finished", lambda a, r: {"req": a[0].req_id})
    wrap(tier, "on_schedule_end", lambda a, r: None)

    parent = mgr._tier_parents[tier]
    wrap(parent, "on_new_request", lambda a, r: {"req": a[0].req_id})
    wrap(parent, "lookup", lambda a, r: {"req": a[1].req_id, "result": r.name})
    wrap(parent, "create_store_job", lambda a, r: {"req": a[1].req_id, "job": r.job_id, "n": len(r.chunk_ids)})
    wrap(parent, "on_request_finished", lambda a, r: {"req": a[0].req_id})


# -- one engine: real scheduler, faked GPU worker (as tests/integrations/test_vllm.py) -----------
class Engine:
    def __init__(self, name: str, model_dir: str, tier_entry: dict, *, poll_s: float) -> None:
        from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        self.name = name
        self.engine_id = f"symbench-{name}-{uuid.uuid4().hex[:6]}"
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
                    "cpu_bytes_to_use": 96 * ROW,
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
        self.address = self.tier.address if hasattr(self.tier, "kvtier") else self.tier._local_id
        self.primary: np.ndarray | None = np.asarray(self.manager.primary_tier.get_kv_memoryview())
        self.stored: dict[bytes, bytes] = {}
        self.loaded: dict[str, list[bytes]] = {}
        self.loaded_bytes: dict[bytes, bytes] = {}
        self.scheduled: dict[str, int] = {}
        self.first_scheduled: dict[str, float] = {}
        self.finished: set[str] = set()
        self.steps = 0
        instrument(name, self.tier, self.manager)

    def _gpu_block_hash(self, block_id: int) -> bytes:
        blk = self.sched.kv_cache_manager.block_pool.blocks[block_id]
        assert blk.block_hash is not None
        return bytes(blk.block_hash)[:-4]

    def step(self) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        self.steps += 1
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
        now = time.monotonic()
        for rid, n in so.num_scheduled_tokens.items():
            if rid not in self.first_scheduled:
                self.first_scheduled[rid] = now
                note(self.name, "scheduled", req=rid, tokens=n, step=self.steps,
                     computed=self.sched.requests[rid].num_computed_tokens)
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

    def add(self, req_id: str, prompt: list[int], max_tokens: int, params: dict | None) -> None:
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        extra = {"kv_transfer_params": params} if params is not None else None
        sp = SamplingParams(max_tokens=max_tokens, extra_args=extra)
        sp.update_from_generation_config({}, EOS)
        req = Request(request_id=req_id, prompt_token_ids=prompt, sampling_params=sp, pooling_params=None,
                      block_hasher=get_request_block_hasher(BLOCK, sha256))
        note(self.name, "add", req=req_id)
        self.sched.add_request(req)

    def block_hashes(self, req_id: str) -> list[bytes]:
        return [bytes(h) for h in self.sched.requests[req_id].block_hashes]

    def shutdown(self) -> None:
        self.primary = None
        self.sched.shutdown()


def run(engines: list[Engine], until, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        for e in engines:
            e.step()  # (the p2p tier's has_pending_work() is always True; stepping always is fair to both)
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.001)


def make_model_dir() -> str:
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    path = tempfile.mkdtemp(prefix="symbench-tiny-llama-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    return path


def prompt_for(tag: str, n: int = PROMPT_LEN) -> list[int]:
    h = hashlib.sha256(tag.encode()).digest()
    return [10 + (h[i % 32] * 31 + i * 7) % 1000 for i in range(n)]


# -- one variant run -----------------------------------------------------------------------------
def one(a: Engine, b: Engine, variant: str, rep: int) -> dict[str, Any]:
    tag = f"{variant}-{rep}-{uuid.uuid4().hex[:6]}"
    prompt_b = prompt_for(tag)
    kid = f"kv-{tag}"
    host, port = a.address.rsplit(":", 1)
    silent = None
    if variant == "closed":
        port = str(free_port())  # nobody listens there
    elif variant == "silent":
        # a TCP listener that never accepts: the kernel completes the TCP handshake, nothing ever
        # answers ZMTP (a wedged or black-holed peer, as seen from the consumer)
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = str(silent.getsockname()[1])
    else:
        prompt_a = list(prompt_b)
        if variant == "partial":  # same first 5 blocks, a different 6th: A lacks B's last block
            for i in range(5 * BLOCK, 6 * BLOCK):
                prompt_a[i] = 10 + (prompt_a[i] + 1) % 1000
        ra = f"A-{tag}"
        a.add(ra, prompt_a, 1, None)
        run([a], lambda: ra in a.finished, f"A computing {ra}")
        # let A's offload of the last chunks complete (the store job is reported a step later)
        for _ in range(3):
            a.step()
    rb = f"B-{tag}"
    i0 = len(EVENTS)
    t_add = time.monotonic()
    b.add(rb, prompt_b, 2, {"remote_kv_source": {"kv_request_id": kid, "remote_host": host,
                                                   "remote_port": int(port)}})
    steps0 = b.steps
    run([a, b], lambda: rb in b.finished, f"B serving {rb}", timeout_s=120.0)
    if silent is not None:
        silent.close()
    # a few more steps so A's pins (its store jobs) are reported released
    for _ in range(5):
        a.step()
        b.step()
        time.sleep(0.001)
    ev = EVENTS[i0:]

    def first(pred) -> float | None:
        for e in ev:
            if pred(e):
                return e["t"]
        return None

    t_hit = first(lambda e: e["engine"] == "B" and e["what"] == "lookup" and e["req"] == rb and e["result"] == "HIT")
    t_miss = first(lambda e: e["engine"] == "B" and e["what"] == "lookup" and e["req"] == rb and e["result"] == "MISS")
    t_retry = first(lambda e: e["engine"] == "B" and e["what"] == "lookup" and e["req"] == rb and e["result"] == "RETRY")
    loads = [{**e, "t": e["t_call"]} for e in ev
             if e["engine"] == "B" and e["what"] == "submit_load" and e["req"] == rb]
    load_jobs = {e["job"]: e for e in loads}
    load_done = {}
    for e in ev:
        if e["engine"] == "B" and e["what"] == "get_finished_jobs":
            for jid, ok, sk in e["results"]:
                if jid in load_jobs and jid not in load_done:
                    load_done[jid] = (e["t"], ok, sk)
    pins = [e for e in ev if e["engine"] == "A" and e["what"] == "create_store_job"]
    pin_jobs = {e["job"]: e for e in pins}
    released = {}
    for e in ev:
        if e["engine"] == "A" and e["what"] == "get_finished_jobs":
            for jid, ok, _ in e["results"]:
                if jid in pin_jobs:
                    released.setdefault(jid, []).append((round((e["t"] - t_add) * 1e3, 2), ok))
    sends = [(round((e["t"] - t_add) * 1e3, 2), e["engine"], e["type"], e.get("n"), e.get("hits"), e.get("round"))
             for e in ev if e["what"] == "send" and e.get("type") not in ("connect", "connect_ack")]
    handshake = [(round((e["t"] - t_add) * 1e3, 2), e["engine"], e["type"]) for e in ev
                 if e["what"] == "send" and e.get("type") in ("connect", "connect_ack")]
    sched = first(lambda e: e["engine"] == "B" and e["what"] == "scheduled" and e["req"] == rb)
    sched_ev = next((e for e in ev if e["engine"] == "B" and e["what"] == "scheduled" and e["req"] == rb), None)
    steps_to_schedule = None if sched_ev is None else sched_ev["step"] - steps0
    # bytes: what B's worker loaded == what A's worker stored, for every block B loaded
    loaded = b.loaded.get(rb, [])
    same = all(b.loaded_bytes[h] == a.stored.get(h) == pattern(h).tobytes() for h in loaded)
    ms = lambda t: None if t is None else round((t - t_add) * 1e3, 2)  # noqa: E731
    res = {
        "variant": variant, "rep": rep,
        "t_first_retry_ms": ms(t_retry), "t_hit_ms": ms(t_hit), "t_miss_ms": ms(t_miss),
        "t_scheduled_ms": ms(sched),
        "computed_at_schedule": None if sched_ev is None else sched_ev["computed"],
        "b_steps_to_schedule": steps_to_schedule,
        "tokens_first_step": None if sched_ev is None else sched_ev["tokens"],
        # tokens vLLM counted as already computed when it first scheduled the request (the loaded prefix)
        "tokens_counted_computed": None if sched_ev is None else sched_ev["computed"] - sched_ev["tokens"],
        "loads": [{"job": j, "n": e["n"], "submit_ms": ms(e["t"]),
                   "done_ms": ms(load_done[j][0]) if j in load_done else None,
                   "load_ms": round((load_done[j][0] - e["t"]) * 1e3, 2) if j in load_done else None,
                   "ok": load_done[j][1] if j in load_done else None,
                   "successful_keys": load_done[j][2] if j in load_done else None}
                  for j, e in load_jobs.items()],
        "blocks_loaded": len(loaded), "bytes_identical": same and bool(loaded) if variant not in ("closed", "silent") else None,
        "tokens_scheduled_total": b.scheduled.get(rb), "prompt_len": len(prompt_b),
        "pins": [{"job": j, "n": e["n"], "req": e["req"], "pinned_ms": ms(e["t"]), "released_ms_ok": released.get(j)}
                 for j, e in pin_jobs.items()],
        "pins_released_once": all(len(released.get(j, [])) == 1 for j in pin_jobs),
        "a_outstanding_jobs_after": len(a.manager._jobs) if variant not in ("closed", "silent") else None,
        "sends": sends, "handshake": handshake,
        "b_steps": b.steps - steps0,
    }
    return res


def held_pin_reset(a: Engine, b: Engine) -> dict[str, Any]:
    """A pinned blocks for B's probe (HIT answered) and B has not fetched yet when A's engine resets
    its cache (sleep / weight update): vLLM's reset_cache() drains every tier, then asserts that no
    job is outstanding.  Needs --poll-s 0 (no tier-poll thread) so the steps are ours to order."""
    tag = f"reset-{uuid.uuid4().hex[:6]}"
    prompt = prompt_for(tag)
    ra, rb = f"A-{tag}", f"B-{tag}"
    a.add(ra, prompt, 1, None)
    run([a], lambda: ra in a.finished, f"A computing {ra}")
    for _ in range(3):
        a.step()
    host, port = a.address.rsplit(":", 1)
    b.add(rb, prompt, 2, {"remote_kv_source": {"kv_request_id": f"kv-{tag}", "remote_host": host,
                                               "remote_port": int(port)}})
    i0 = len(EVENTS)
    b.step()  # lookups RETRY; the LookupMsg leaves in on_schedule_end
    time.sleep(0.005)
    a.step()  # A polls the LookupMsg and serves it: create_store_job pins the hits
    pins = [e for e in EVENTS[i0:] if e["engine"] == "A" and e["what"] == "create_store_job"]
    outstanding = len(a.manager._jobs)
    outcome: str
    with a.manager.lock:
        try:
            a.manager.reset_cache()
            a.manager.on_reset_flushed()
            outcome = "reset_cache returned"
        except AssertionError as exc:
            outcome = f"AssertionError: {exc!s:.120}"
    # let B go on (its fetch of the pinned blocks, or a MISS), so both engines end cleanly
    run([a, b], lambda: rb in b.finished, f"B after A's reset {rb}", timeout_s=60.0)
    for _ in range(5):
        a.step()
        b.step()
    return {"variant": "reset", "pins_before_reset": [(e["job"], e["n"]) for e in pins],
            "a_jobs_outstanding_before_reset": outstanding, "reset_outcome": outcome,
            "b_blocks_loaded": len(b.loaded.get(rb, [])), "a_jobs_outstanding_after": len(a.manager._jobs)}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in ("full", "partial", "closed", "silent"):
        rs = [r for r in rows if r["variant"] == variant]
        if not rs:
            continue
        warm = [r for r in rs if r["rep"] > 0] or rs

        def stat(vals: list[float | None]) -> dict[str, float] | None:
            v = [x for x in vals if x is not None]
            return None if not v else {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}

        key = "t_miss_ms" if variant in ("closed", "silent") else "t_hit_ms"
        out[variant] = {
            "cold_rep0": {key: rs[0][key], "t_scheduled_ms": rs[0]["t_scheduled_ms"]},
            "warm": {
                key: stat([r[key] for r in warm]),
                "t_scheduled_ms": stat([r["t_scheduled_ms"] for r in warm]),
                "load_ms": stat([ld["load_ms"] for r in warm for ld in r["loads"]]),
                "b_steps_to_schedule": stat([r["b_steps_to_schedule"] for r in warm]),
            },
        }
    return out


def _entry(tier: str, port: int, plane: str) -> dict[str, Any]:
    if tier == "seed":
        return {"type": "p2p", "host": "127.0.0.1", "port": port}
    return {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "host": "127.0.0.1",
            "port": port, "serve_external": True, "data_plane": plane}


def run_tier(tier: str, model_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every variant of ``args.variants`` on one engine pair of ``tier`` (``seed`` or ``kvtier``)."""
    t = time.monotonic()
    a = Engine("A", model_dir, _entry(tier, free_port(), args.kvtier_plane), poll_s=args.poll_s)
    b = Engine("B", model_dir, _entry(tier, free_port(), args.kvtier_plane), poll_s=args.poll_s)
    build_s = time.monotonic() - t
    rows = []
    try:
        for variant in args.variants.split(","):
            if variant == "reset":
                rows.append(held_pin_reset(a, b))
                continue
            for rep in range(args.reps):
                rows.append(one(a, b, variant, rep))
    finally:
        a.shutdown()
        b.shutdown()
    return {"tier": tier, "plane": "nixl" if tier == "seed" else args.kvtier_plane, "build_s": round(build_s, 2),
            "rows": rows, "summary": summarise(rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.vllm_symmetric", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", choices=["seed", "kvtier", "both"], default="both")
    ap.add_argument("--kvtier-plane", choices=["zmq", "nixl"], default="nixl",
                    help="kvtier's data plane (the p2p tier always uses NIXL)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--poll-s", type=float, default=0.001, help="tier_poll_interval_s (0: no tier-poll thread)")
    ap.add_argument("--variants", default="full,partial,closed")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    model_dir = make_model_dir()
    tiers = ["seed", "kvtier"] if args.tier == "both" else [args.tier]
    report: dict[str, Any] = {"poll_s": args.poll_s, "reps": args.reps, "tiers": {}}
    try:
        for tier in tiers:
            report["tiers"][tier] = run_tier(tier, model_dir, args)
    finally:
        import shutil

        shutil.rmtree(model_dir, ignore_errors=True)
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
    report["shm_left"] = [f for f in os.listdir("/dev/shm") if "symbench" in f]
    text = json.dumps(report, indent=1, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(json.dumps({t: {"plane": r["plane"], "summary": r["summary"]} for t, r in report["tiers"].items()}
                     | {"shm_left": report["shm_left"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
