"""P7: prefill/decode disaggregation on SmolLM2-135M — decode time-to-first-token with KV fetched
through kvtier vs recomputing the prompt locally, over prompt lengths, producer and consumer in
separate processes (``torch.set_num_threads(1)`` on both sides, as in the demo).

* fetched: ``submit_load`` → successful JobResult → ``blocks_to_cache`` (DynamicCache rebuilt
  from the pool slots) → one decode step;
* recompute: ``prefill`` of the prompt → one decode step.

The producer prefills the longest prompt once and parks, for each length L, the first
``ceil(L / 16)`` blocks of that KV under a fresh id (a prefix's K/V equal the first L positions of
the longer prompt's, up to float rounding; only sizes matter for timing).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Callable

from bench._util import CpuMeter, paired_ratio, summary, target
from tools.child import Child, start_all


def _setup_model() -> tuple[Any, Any, Any]:
    import torch

    torch.set_num_threads(1)
    from demo.kvlayout import KvLayout
    from demo.weights import load_model

    model, tok = load_model()
    return model, tok, KvLayout.for_model(model)


def _token_ids(tok: Any, n: int) -> list[int]:
    """``n`` token ids of real text (the demo prompts, repeated)."""
    from demo.prompts import demo_prompts

    text = "\n\n".join(t for _, t in demo_prompts(2048))
    base = list(tok(text, add_special_tokens=False)["input_ids"])
    out: list[int] = []
    while len(out) < n:
        out.extend(base)
    return out[:n]


class _PDSide:
    """One side of the P7 pair (a child process): the model, its KV layout and a manager."""

    def __init__(self) -> None:
        import logging

        logging.getLogger("kvtier").setLevel(logging.WARNING)
        self.model, self.tok, self.layout = _setup_model()
        self.mgr: Any = None
        self._jobs = itertools.count(1)

    def close(self) -> None:
        if self.mgr is not None:
            self.mgr.shutdown()


class PDProducer(_PDSide):
    def hello(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "block_bytes": self.layout.block_bytes,
                "tokens_per_block": self.layout.tokens_per_block}

    def op_setup(self, max_tokens: int, config: dict[str, Any]) -> dict[str, Any]:
        from demo.kvlayout import cache_to_blocks
        from demo.model import prefill
        from kvtier.manager import KvTierManager
        from kvtier.memory import BlockPool

        self.ids = _token_ids(self.tok, max_tokens + 1)
        t0 = time.perf_counter()
        cache, _first = prefill(self.model, self.ids[:max_tokens])
        prefill_s = time.perf_counter() - t0
        blocks, _ = cache_to_blocks(cache, self.layout)
        del cache
        self.pool = BlockPool(len(blocks), self.layout.block_bytes)
        for i, b in enumerate(blocks):
            self.pool.view(i).copy_(b)
        del blocks
        self.mgr = KvTierManager(config, self.pool, layout=self.layout.fingerprint())
        return {"address": self.mgr.address, "ids": self.ids, "prefill_s": prefill_s}

    def op_park(self, kid: str, length: int) -> int:
        from kvtier.api import RequestContext, TransferJob
        from demo.run import block_keys

        self.mgr.get_finished_jobs()
        keys = block_keys(self.ids[:length], self.layout.tokens_per_block)
        req = RequestContext(req_id="P" + kid, kv_transfer_params={"remote_decoder": {"kv_request_id": kid}})
        self.mgr.on_new_request(req)
        self.mgr.submit_store(TransferJob(job_id=next(self._jobs), keys=keys, slots=tuple(range(len(keys))), req=req))
        self.mgr.on_request_finished(req)
        self.mgr.get_finished_jobs()  # vLLM's tier-poll thread calls it every 1 ms: the loop takes the store (C34)
        return len(keys)


class PDConsumer(_PDSide):
    def hello(self) -> dict[str, Any]:
        return {"pid": os.getpid()}

    def op_setup(self, max_tokens: int, producer: str, ids: list[int], config: dict[str, Any]) -> dict[str, Any]:
        from kvtier.manager import KvTierManager
        from kvtier.memory import BlockPool

        self.ids = ids
        self.pool = BlockPool(self.layout.num_blocks(max_tokens), self.layout.block_bytes)
        self.mgr = KvTierManager(config, self.pool, layout=self.layout.fingerprint())
        self.host, _, port = producer.rpartition(":")
        self.port = int(port)
        return {"pinned": self.pool.pinned}

    def op_fetched(self, kid: str, length: int) -> dict[str, Any]:
        from kvtier.api import RequestContext, TransferJob
        from demo.kvlayout import blocks_to_cache
        from demo.model import decode_greedy
        from demo.run import block_keys

        mgr = self.mgr
        ids = self.ids[:length]
        keys = block_keys(ids, self.layout.tokens_per_block)
        slots = tuple(range(len(keys)))
        req = RequestContext(req_id="C" + kid, kv_transfer_params={
            "remote_prefiller": {"kv_request_id": kid, "remote_host": self.host, "remote_port": self.port}})
        mgr.on_new_request(req)
        job = next(self._jobs)
        t0 = time.perf_counter()
        mgr.submit_load(TransferJob(job_id=job, keys=keys, slots=slots, req=req))
        res = None
        while res is None:
            for r in mgr.get_finished_jobs():
                if r.job_id == job:
                    res = r
            if res is None:
                # not mgr.poll(timeout): with background_poll=True that waits on the sockets outside
                # the manager lock, concurrently with the poll thread (libzmq sockets are not
                # thread-safe; it segfaulted here once). The demo's pattern: short sleeps.
                time.sleep(0.0002)
        t1 = time.perf_counter()
        if not res.success:
            raise RuntimeError(f"load of {kid} failed: {res.reason}")
        cache = blocks_to_cache([self.pool.view(s) for s in slots], length, self.layout)
        t2 = time.perf_counter()
        decode_greedy(self.model, cache, self.ids[length], 2, None)  # exactly one decode step
        t3 = time.perf_counter()
        mgr.on_request_finished(req)
        return {"total_s": t3 - t0, "load_s": t1 - t0, "rebuild_s": t2 - t1, "step_s": t3 - t2,
                "kv_bytes": len(keys) * self.layout.block_bytes}

    def op_recompute(self, length: int) -> dict[str, Any]:
        from demo.model import decode_greedy, prefill

        ids = self.ids[:length]
        t0 = time.perf_counter()
        cache, first = prefill(self.model, ids)
        t1 = time.perf_counter()
        decode_greedy(self.model, cache, first, 2, None)
        t2 = time.perf_counter()
        return {"total_s": t2 - t0, "prefill_s": t1 - t0, "step_s": t2 - t1}


def _model_available() -> str | None:
    try:
        from demo.weights import find_gguf

        find_gguf()
        import transformers  # noqa: F401
    except (ImportError, FileNotFoundError) as exc:
        return str(exc)
    return None


def run_p7(quick: bool, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    title = "PD on SmolLM2-135M: decode TTFT with fetched KV vs local recompute"
    why = _model_available()
    if why is not None:
        return {"P7": {"id": "P7", "title": title, "status": "skipped", "reason": why,
                       "ratio": None, "target": {"text": "fetch wins (ratio < 1)", "met": None}}}
    lengths = [128, 256] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    max_len = max(lengths)
    meter = CpuMeter()
    t_start = time.monotonic()
    # load the model in both children at once (two cores), then prefill on the producer
    cfg_p = {"host": "127.0.0.1", "port": 0, "background_poll": True}
    # background_poll on both sides, as in the demo: a consumer busy in a multi-second prefill
    # must still answer heartbeats, or the producer ends the session after peer_timeout_s
    cfg_c = {"host": "127.0.0.1", "port": 0, "background_poll": True}
    prod, cons = start_all(Child("bench.pd", "PDProducer", name="bench-pd-producer"),
                           Child("bench.pd", "PDConsumer", name="bench-pd-consumer"), timeout_s=600)
    rows = []
    try:
        setup = prod.call("setup", max_tokens=max_len, config=cfg_p, timeout_s=900)
        log(f"P7 producer prefilled {max_len} tokens in {setup['prefill_s']:.1f} s")
        cons.call("setup", max_tokens=max_len, producer=setup["address"], ids=setup["ids"], config=cfg_c)
        # warm-up: session handshake and both code paths
        prod.call("park", kid="warm", length=lengths[0])
        cons.call("fetched", kid="warm", length=lengths[0])
        cons.call("recompute", length=min(lengths[0], 16))
        samples: dict[int, dict[str, list[dict[str, Any]]]] = {L: {"fetched": [], "recompute": []} for L in lengths}
        reps_of = {L: (2 if quick or L >= 2048 else 3) for L in lengths}
        for rep in range(max(reps_of.values())):
            for L in lengths:
                if rep >= reps_of[L]:
                    continue
                order = ("fetched", "recompute") if rep % 2 == 0 else ("recompute", "fetched")
                for what in order:
                    if what == "fetched":
                        kid = f"pd-{L}-{rep}"
                        prod.call("park", kid=kid, length=L)
                        samples[L]["fetched"].append(cons.call("fetched", kid=kid, length=L))
                    else:
                        samples[L]["recompute"].append(cons.call("recompute", length=L, timeout_s=900))
                f, r = samples[L]["fetched"][-1], samples[L]["recompute"][-1]
                log(f"P7 L={L:>5} rep {rep}: fetched {f['total_s'] * 1e3:.1f} ms (load {f['load_s'] * 1e3:.1f}, "
                    f"rebuild {f['rebuild_s'] * 1e3:.1f}, step {f['step_s'] * 1e3:.1f}); recompute "
                    f"{r['total_s'] * 1e3:.0f} ms")
        for L in lengths:
            fs, rs = samples[L]["fetched"], samples[L]["recompute"]
            ft, rt = [x["total_s"] for x in fs], [x["total_s"] for x in rs]
            rows.append({
                "prompt_tokens": L,
                "kv_bytes": fs[0]["kv_bytes"],
                "fetched_s": summary(ft),
                "fetched_load_s": summary([x["load_s"] for x in fs]),
                "fetched_rebuild_s": summary([x["rebuild_s"] for x in fs]),
                "fetched_step_s": summary([x["step_s"] for x in fs]),
                "recompute_s": summary(rt),
                "recompute_prefill_s": summary([x["prefill_s"] for x in rs]),
                "recompute_step_s": summary([x["step_s"] for x in rs]),
                "ratio": paired_ratio(ft, rt),
                "load_gbps": summary([x["kv_bytes"] / x["load_s"] / 1e9 for x in fs]),
            })
    finally:
        noise = meter.stop()
        cons.close()
        prod.close()
    # the prompt length from which fetching wins at every longer length
    wins_from = None
    for row in reversed(rows):
        if row["ratio"]["median"] < 1:
            wins_from = row["prompt_tokens"]
        else:
            break
    ratios = [r["ratio"]["median"] for r in rows]
    headline = next((r for r in rows if r["prompt_tokens"] == 1024), rows[-1])
    return {
        "P7": {
            "id": "P7",
            "title": title,
            "status": "ok",
            "kvtier": {"label": f"fetched TTFT at {headline['prompt_tokens']} tokens (median)",
                       "value": headline["fetched_s"]["median"] * 1e3, "unit": "ms"},
            "baseline": {"label": f"recompute TTFT at {headline['prompt_tokens']} tokens (median)",
                         "value": headline["recompute_s"]["median"] * 1e3, "unit": "ms"},
            "ratio": dict(headline["ratio"], over=f"fetched/recompute pairs at {headline['prompt_tokens']} tokens; "
                          f"range over lengths {min(ratios):.3f}–{max(ratios):.3f}"),
            "ratio_range_over_lengths": {"min": min(ratios), "max": max(ratios)},
            "fetch_wins_from_tokens": wins_from,
            "smallest_length_measured": lengths[0],
            "target": target("<=", 1.0, max(ratios), "fetching wins (ratio < 1); report the crossover length"),
            "rows": rows,
            "producer_prefill_s": setup["prefill_s"],
            "noise": noise,
            "wall_s": round(time.monotonic() - t_start, 1),
            "method": (
                "two spawned processes, torch.set_num_threads(1) each, SmolLM2-135M float32 from the demo's "
                "converted-model cache, both managers with background_poll=True (the demo's setting); per length, "
                "interleaved (order alternates): fetched = park on the "
                "producer, then on the consumer submit_load → JobResult → blocks_to_cache → one decode step; "
                "recompute = prefill + one decode step on the consumer. Repeats: "
                + ", ".join(f"{L}: {reps_of[L]}" for L in lengths) + "."
            ),
        }
    }
