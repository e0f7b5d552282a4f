"""``python -m demo`` (``make demo``): disaggregated prefill/decode of SmolLM2-135M through kvtier.

Three processes, connected only as a PD deployment would be:

* the **producer** (prefill instance) runs the prompt, writes its KV cache into its block pool
  block by block, parks it under a fresh ``kv_request_id`` (``submit_store``) and returns the first
  generated token — as a prefill instance answers a PD proxy;
* the **consumer** (decode instance) is handed ``(kv_request_id, host, port)`` by the proxy,
  fetches the blocks into its own pool slots through kvtier (``submit_load``), rebuilds the
  model's ``DynamicCache`` from the slots and decodes greedily;
* this process is the **proxy** and the referee: it also runs every prompt monolithically and
  checks the consumer's tokens are identical.

``data_plane`` (``--data-plane``) picks how the blocks travel: ``zmq`` (payload frames on the
control connection) or ``nixl`` (one-sided WRITEs into the consumer's slots through NIXL/UCX;
``UCX_NET_DEVICES`` defaults to ``lo`` here, every process being on this host).

A **late consumer** is held back past ``unbound_store_timeout_s``: the producer reaps the parked
blocks, the consumer's fetch is refused with reason ``reaped`` within one round trip, and the
consumer recomputes the prompt locally — still producing identical text.

A **shared-prefix run** (the symmetric path, ``remote_kv_source``) follows: instance A (the
producer process, ``serve_external`` on, its pool's blocks published in a
:class:`~kvtier.blocksource.BlockIndex`) answers a question under a long shared system prompt and
keeps the KV; instance B (the consumer process) gets other questions under the same system prompt
naming A as ``remote_kv_source``: its lookups answer RETRY until A's reply, then HIT for every full
block of the shared prefix, B loads those, computes only the rest of its prompt on top of them and
decodes — identical tokens to the monolithic run, and the time to the first token compared with
computing the whole prompt.

Every process uses one torch thread so the float32 results are bit-reproducible across processes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.config import DEFAULTS
from tools.child import Child, start_all

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_CONFIG: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 0,
    "background_poll": True,
    "serve_external": True,  # the shared-prefix run: instance A serves its cached blocks (loopback only)
    "allowed_peers": ["127.0.0.1"],  # both instances listen on loopback: dial nothing else (docs/security.md)
}

SHARED_SYSTEM = (
    "You are the help desk assistant of a small hardware store. You answer questions about tools, "
    "paint, garden supplies and opening hours politely, in plain words, and you never invent prices. "
)
"""The shared system prompt's paragraph, repeated to ``shared_prefix_tokens``."""


def block_keys(ids: list[int], tokens_per_block: int) -> tuple[bytes, ...]:
    """Chained content hashes of the prompt's blocks (like vLLM's prefix block hashes): key i
    names tokens ``[0, (i+1)*tokens_per_block)``, so both sides derive the same keys."""
    keys = []
    prev = b"kvtier-demo"
    for i in range(0, len(ids), tokens_per_block):
        chunk = ",".join(map(str, ids[i : i + tokens_per_block])).encode()
        prev = hashlib.sha256(prev + b"|" + chunk).digest()[:16]
        keys.append(prev)
    return tuple(keys)


# -- progress ---------------------------------------------------------------------------------
class DemoProgress(Protocol):
    """What :func:`run` reports while it works: the current stage, and requests done of total."""

    def stage(self, text: str) -> None: ...

    def requests(self, total: int) -> None: ...

    def advance(self) -> None: ...


class _Quiet:
    """The reporter of ``--json`` runs: says nothing."""

    def stage(self, text: str) -> None:
        pass

    def requests(self, total: int) -> None:
        pass

    def advance(self) -> None:
        pass


class RichProgress:
    """Progress on a rich console: on a terminal a live line (spinner, stage, bar, requests done,
    elapsed time) that disappears before the final table; elsewhere (a pipe, a CI log) one
    timestamped line per stage.  Use as a context manager."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self._t0 = time.monotonic()
        self._progress = None
        if console.is_terminal:
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
            self._task = self._progress.add_task("python -m demo", total=None)

    def __enter__(self) -> RichProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def stage(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text)
        else:
            self.console.print(f"[{time.monotonic() - self._t0:6.1f} s] {text}", highlight=False, markup=False,
                               soft_wrap=True)

    def requests(self, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total, completed=0)

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)


# -- worker processes ---------------------------------------------------------------------------
def _setup_worker() -> tuple[Any, Any, Any]:
    import torch

    from demo.kvlayout import KvLayout
    from demo.weights import load_model

    torch.set_num_threads(1)
    model, tok = load_model()
    return model, tok, KvLayout.for_model(model)


class ProducerWorker:
    """The producer process (a :class:`tools.child.Child` handler): prefill, park, report."""

    def __init__(self, cfg: dict[str, Any], pool_blocks: int) -> None:
        from kvtier.manager import KvTierManager
        from kvtier.memory import BlockPool

        from kvtier.blocksource import BlockIndex

        self.model, tok, self.layout = _setup_worker()
        self.eos = _eos(tok)
        self.pool = BlockPool(pool_blocks, self.layout.block_bytes)
        self.mgr = KvTierManager(cfg, self.pool, layout=self.layout.fingerprint())
        # instance A of the shared-prefix run: the blocks of what it computed, for peers to fetch
        self.index = BlockIndex(pool_blocks)
        self.mgr.serve_from(self.index)
        self.jobs: dict[int, tuple[str, list[int]]] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.job_ids = itertools.count(1)

    def hello(self) -> dict[str, Any]:
        return {"address": self.mgr.address, "pinned": self.pool.pinned, "block_bytes": self.layout.block_bytes}

    def _collect(self) -> None:
        for r in self.mgr.get_finished_jobs():
            kid, slots = self.jobs.pop(r.job_id)
            self.pool.free(slots)
            self.outcomes[kid] = {"store_ok": r.success, "store_reason": r.reason}

    def wait(self, conn: Any) -> None:
        while not conn.poll(0.005):  # store results free their blocks as they come
            self._collect()

    def op_prefill(self, kv_request_id: str, ids: list[int]) -> dict[str, Any]:
        from kvtier.api import RequestContext, TransferJob
        from demo.kvlayout import cache_to_blocks
        from demo.model import prefill

        kid, layout, pool = kv_request_id, self.layout, self.pool
        t0 = time.perf_counter()
        cache, first = prefill(self.model, ids)
        prefill_s = time.perf_counter() - t0
        blocks, num_tokens = cache_to_blocks(cache, layout)
        slots = pool.alloc(len(blocks))
        for s, b in zip(slots, blocks):
            pool.view(s).copy_(b)
        req = RequestContext(req_id=f"prefill-{kid}", kv_transfer_params={"remote_decoder": {"kv_request_id": kid}})
        self.mgr.on_new_request(req)
        job = next(self.job_ids)
        self.jobs[job] = (kid, slots)
        self.mgr.submit_store(TransferJob(job_id=job, keys=block_keys(ids, layout.tokens_per_block), slots=tuple(slots),
                                          req=req))
        self.mgr.on_request_finished(req)
        return {"first_token": first, "num_tokens": num_tokens, "blocks": len(blocks),
                "kv_bytes": len(blocks) * layout.block_bytes, "prefill_s": prefill_s}

    def op_compute_local(self, ids: list[int], max_new_tokens: int) -> dict[str, Any]:
        """Instance A answers a request of its own: prefill, decode, and keep the prompt's KV
        blocks in the pool, published for peers (what an engine's prefix cache does)."""
        from demo.kvlayout import cache_to_blocks
        from demo.model import decode_greedy, prefill

        cache, first = prefill(self.model, ids)
        blocks, _ = cache_to_blocks(cache, self.layout)
        keys = block_keys(ids, self.layout.tokens_per_block)
        with self.mgr.lock:  # the index is read in the manager's serve windows
            slots = self.pool.alloc(len(blocks))
            for s, b, k in zip(slots, blocks, keys):
                self.pool.view(s).copy_(b)
                self.index.publish(k, s)
        tokens = decode_greedy(self.model, cache, first, max_new_tokens, self.eos)
        return {"tokens": tokens, "blocks": len(blocks)}

    def op_results(self) -> dict[str, Any]:
        self._collect()
        with self.mgr.lock:
            pins = self.index.pins_outstanding()
        return {"outcomes": self.outcomes, "stats": self.mgr.stats(), "pins_outstanding": pins}

    def close(self) -> None:
        self.mgr.shutdown()


def _eos(tok: Any) -> frozenset[int]:
    from demo.model import eos_token_ids

    return eos_token_ids(tok)


class ConsumerWorker:
    """The consumer process (a :class:`tools.child.Child` handler): fetch, decode or recompute."""

    def __init__(self, cfg: dict[str, Any], pool_blocks: int) -> None:
        from demo.model import eos_token_ids
        from kvtier.manager import KvTierManager
        from kvtier.memory import BlockPool

        self.model, tok, self.layout = _setup_worker()
        self.eos = eos_token_ids(tok)
        self.pool = BlockPool(pool_blocks, self.layout.block_bytes)
        self.mgr = KvTierManager(cfg, self.pool, layout=self.layout.fingerprint())
        self.job_ids = itertools.count(1)

    def op_decode(self, kv_request_id: str, ids: list[int], producer: str, num_tokens: int, first_token: int,
                  max_new_tokens: int) -> dict[str, Any]:
        from demo.kvlayout import blocks_to_cache
        from demo.model import decode_greedy, prefill, recompute_decode
        from kvtier.api import LookupResult, RequestContext, TransferJob

        kid, mgr, pool, layout, model = kv_request_id, self.mgr, self.pool, self.layout, self.model
        host, port = producer.rsplit(":", 1)
        req = RequestContext(req_id=f"decode-{kid}", kv_transfer_params={
            "remote_prefiller": {"kv_request_id": kid, "remote_host": host, "remote_port": int(port)}})
        mgr.on_new_request(req)
        keys = block_keys(ids, layout.tokens_per_block)
        hit = all(mgr.lookup(k, req) is LookupResult.HIT for k in keys)
        slots = pool.alloc(len(keys))
        job = next(self.job_ids)
        t0 = time.perf_counter()
        mgr.submit_load(TransferJob(job_id=job, keys=keys, slots=tuple(slots), req=req))
        result = None
        while result is None:
            for r in mgr.get_finished_jobs():
                result = r
            if result is None:
                time.sleep(0.0002)
        load_s = time.perf_counter() - t0
        row: dict[str, Any] = {"lookup_hit": hit, "load_s": load_s, "load_ok": result.success,
                               "reason": result.reason}
        if result.success:
            t1 = time.perf_counter()
            cache = blocks_to_cache([pool.view(s) for s in slots], num_tokens, layout)
            row["kv_ready_s"] = load_s + (time.perf_counter() - t1)
            tokens = decode_greedy(model, cache, first_token, max_new_tokens, self.eos)
            row["outcome"] = "fetched"
        else:
            t1 = time.perf_counter()
            tokens = recompute_decode(model, ids, max_new_tokens, self.eos)
            row["recompute_total_s"] = time.perf_counter() - t1
            row["outcome"] = "recomputed"
        pool.free(slots)
        mgr.on_request_finished(req)
        # the local-recompute comparison: how long until a KV cache is ready without kvtier
        t2 = time.perf_counter()
        prefill(model, ids)
        row["recompute_kv_ready_s"] = time.perf_counter() - t2
        row["tokens"] = tokens
        return row

    def op_shared(self, kv_request_id: str, ids: list[int], source: str, max_new_tokens: int) -> dict[str, Any]:
        """Instance B: a request under the shared system prompt naming instance A as its
        ``remote_kv_source``.  Probe (lookups RETRY until A answers), load the HIT prefix, compute
        the rest of the prompt on top of it, decode; then compute the whole prompt locally for the
        comparison."""
        import torch

        from demo.model import _greedy, decode_greedy, prefill
        from demo.kvlayout import blocks_to_cache
        from kvtier.api import LookupResult, RequestContext, TransferJob

        mgr, pool, layout, model = self.mgr, self.pool, self.layout, self.model
        t = layout.tokens_per_block
        host, port = source.rsplit(":", 1)
        req = RequestContext(req_id=f"shared-{kv_request_id}", kv_transfer_params={
            "remote_kv_source": {"kv_request_id": kv_request_id, "remote_host": host, "remote_port": int(port)}})
        keys = block_keys(ids, t)[: len(ids) // t]  # full blocks only: a partial one is always computed
        t0 = time.perf_counter()
        mgr.on_new_request(req)
        steps = 0
        while True:  # the engine's steps: scan (until the first MISS), then end the step
            steps += 1
            answers = []
            for k in keys:
                answers.append(mgr.lookup(k, req))
                if answers[-1] is LookupResult.MISS:
                    break
            mgr.on_schedule_end()
            if LookupResult.RETRY not in answers:
                break
            time.sleep(0.0002)
        answered_s = time.perf_counter() - t0
        hits = 0
        while hits < len(answers) and answers[hits] is LookupResult.HIT:
            hits += 1
        row: dict[str, Any] = {"hit_blocks": hits, "steps": steps, "answered_s": answered_s, "load_ok": None}
        cache = None
        if hits:
            slots = pool.alloc(hits)
            mgr.submit_load(TransferJob(job_id=next(self.job_ids), keys=keys[:hits], slots=tuple(slots), req=req))
            result = None
            while result is None:
                for r in mgr.get_finished_jobs():
                    result = r
                if result is None:
                    time.sleep(0.0002)
            row["load_ok"] = result.success
            row["load_s"] = time.perf_counter() - t0 - answered_s
            if result.success:
                cache = blocks_to_cache([pool.view(s) for s in slots], hits * t, layout)
            pool.free(slots)
        done = hits * t if cache is not None else 0
        with torch.no_grad():
            if cache is None:
                cache, first = prefill(model, ids)
            else:
                out = model(input_ids=torch.tensor([ids[done:]]), cache=cache, use_cache=True, logits_to_keep=1)
                cache, first = out.cache, _greedy(out.logits)
        row["ttft_fetched_s"] = time.perf_counter() - t0
        row["computed_tokens"] = len(ids) - done
        row["tokens"] = decode_greedy(model, cache, first, max_new_tokens, self.eos)
        mgr.on_request_finished(req)
        t1 = time.perf_counter()
        prefill(model, ids)  # the comparison: the whole prompt computed here
        row["ttft_recompute_s"] = time.perf_counter() - t1
        return row

    def op_results(self) -> dict[str, Any]:
        return {"stats": self.mgr.stats()}

    def close(self) -> None:
        self.mgr.shutdown()


# -- the proxy / referee -----------------------------------------------------------------------
def run(
    num_prompts: int | None = None,
    max_prompt_tokens: int = 2048,
    max_new_tokens: int = 24,
    unbound_store_timeout_s: float = 1.0,
    late_delay_s: float | None = None,
    no_late: bool = False,
    data_plane: str = "zmq",
    progress: DemoProgress | None = None,
    shared_prefix_tokens: int = 512,
    no_shared: bool = False,
) -> dict[str, Any]:
    """Run the demo; return a JSON-able report (see module docstring). ``progress`` hears every
    stage as it starts (nothing is reported without one).  ``data_plane``: ``"zmq"`` or
    ``"nixl"`` (config key ``data_plane``).  ``shared_prefix_tokens``: the shared system prompt's
    length in the shared-prefix run (``no_shared``: skip it)."""
    report = progress or _Quiet()
    report.stage("loading SmolLM2-135M (the first run converts its GGUF, ~30 s)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from demo.kvlayout import KvLayout
    from demo.prompts import demo_prompts
    from demo.model import encode_prompt, eos_token_ids, recompute_decode
    from demo.weights import load_model

    torch.set_num_threads(1)
    model, tok = load_model()  # converts and caches the GGUF once, before the workers start
    layout = KvLayout.for_model(model)
    prompts = demo_prompts(max_prompt_tokens, tok)
    if num_prompts is not None:
        prompts = prompts[:num_prompts]
    if not prompts:
        raise SystemExit(f"python -m demo: no prompt fits in {max_prompt_tokens} tokens; raise --max-prompt-tokens")
    encoded = [(name, encode_prompt(tok, text)) for name, text in prompts]
    late_name = None
    if not no_late:
        late_name = "late:" + encoded[0][0]
        encoded.append((late_name, encoded[0][1]))
    late_delay = late_delay_s if late_delay_s is not None else unbound_store_timeout_s + 0.5
    shared: list[tuple[str, list[int]]] = []
    if not no_shared:
        questions = [text for _, text in demo_prompts(256, tok)][:3]
        system = SHARED_SYSTEM * max(1, shared_prefix_tokens // max(1, len(tok(SHARED_SYSTEM)["input_ids"])))
        shared = [(f"shared:{i}", encode_prompt(tok, q, system=system)) for i, q in enumerate(questions)]
    pool_blocks = max(layout.num_blocks(len(ids)) for _, ids in encoded + shared) * (2 if shared else 1) + 4
    cfg = dict(DEFAULT_CONFIG, unbound_store_timeout_s=unbound_store_timeout_s, data_plane=data_plane)
    if data_plane == "nixl":
        os.environ.setdefault("UCX_NET_DEVICES", "lo")  # inherited by both workers: one host
        os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

    report.stage("starting the producer and consumer processes (each loads the model)")
    workers = {"cfg": cfg, "pool_blocks": pool_blocks}
    prod, cons = start_all(Child(__name__, "ProducerWorker", workers, name="demo-producer"),
                           Child(__name__, "ConsumerWorker", workers, name="demo-consumer"), timeout_s=600)
    rows: list[dict[str, Any]] = []
    try:
        hello = prod.hello
        report.requests(len(encoded))
        for i, (name, ids) in enumerate(encoded):
            late = name == late_name
            report.stage(f"{name}: monolithic run (the reference tokens)")
            reference = recompute_decode(model, ids, max_new_tokens, eos_token_ids(tok))  # monolithic
            kid = f"demo-{os.getpid()}-{i}"
            report.stage(f"{name}: PD run — prefill on the producer, park")
            pre = prod.call("prefill", kv_request_id=kid, ids=ids)
            if late:
                report.stage(f"{name}: late consumer — held back {late_delay:.1f} s, past the park timeout")
                time.sleep(late_delay)  # the consumer is queued somewhere: past the park timeout
                report.stage(f"{name}: late consumer — fetch after the reap (expect a refusal), recompute locally")
            else:
                report.stage(f"{name}: PD run — fetch over kvtier, decode on the consumer")
            dec = cons.call("decode", kv_request_id=kid, ids=ids, producer=hello["address"],
                            num_tokens=pre["num_tokens"], first_token=pre["first_token"],
                            max_new_tokens=max_new_tokens)
            rows.append({
                "name": name, "kv_request_id": kid, "prompt_tokens": len(ids), "blocks": pre["blocks"],
                "kv_bytes": pre["kv_bytes"], "prefill_s": pre["prefill_s"], "late": name == late_name,
                "outcome": dec["outcome"], "reason": dec["reason"], "load_s": dec["load_s"],
                "gbps": (pre["kv_bytes"] / dec["load_s"] / 1e9) if dec["load_ok"] and dec["load_s"] > 0 else None,
                "kv_ready_fetched_s": dec.get("kv_ready_s"), "kv_ready_recompute_s": dec["recompute_kv_ready_s"],
                "identical": dec["tokens"] == reference, "tokens": dec["tokens"], "reference": reference,
                "text": tok.decode(dec["tokens"], skip_special_tokens=True),
            })
            report.advance()
        shared_rows = _shared_prefix_run(shared, prod, cons, hello["address"], model, tok, max_new_tokens,
                                         layout.tokens_per_block, report)
        report.stage("collecting the producer's results")
        pres = prod.call("results")
    finally:
        cons.close(20.0)
        prod.close(20.0)
    for row in rows:
        row.update(pres["outcomes"].get(row["kv_request_id"], {}))
    fetched = [r for r in rows if r["outcome"] == "fetched"]
    ok = all(r["identical"] for r in rows) and (
        no_late or any(r["late"] and r["reason"] == "reaped" for r in rows)
    ) and all(r["outcome"] == "fetched" for r in rows if not r["late"])
    b_rows = [r for r in shared_rows if r["instance"] == "B"]
    ok = ok and all(r["identical"] for r in shared_rows) and all(
        r["hit_blocks"] == r["shared_blocks"] and r["load_ok"] for r in b_rows) and pres["pins_outstanding"] == 0
    summary = {
        "ok": ok,
        "data_plane": data_plane,
        "pinned_memory": hello["pinned"],
        "block_bytes": hello["block_bytes"],
        "unbound_store_timeout_s": unbound_store_timeout_s,
        "load_timeout_s": float(DEFAULTS["load_timeout_s"]),
        "median_kv_ready_fetched_s": statistics.median(r["kv_ready_fetched_s"] for r in fetched) if fetched else None,
        "median_kv_ready_recompute_s": statistics.median(r["kv_ready_recompute_s"] for r in fetched) if fetched else None,
        "late_rejection_ms": next((r["load_s"] * 1e3 for r in rows if r["late"]), None),
        "median_ttft_shared_fetched_s": statistics.median(r["ttft_fetched_s"] for r in b_rows) if b_rows else None,
        "median_ttft_shared_recompute_s": statistics.median(r["ttft_recompute_s"] for r in b_rows) if b_rows else None,
        "serve_pins_outstanding": pres["pins_outstanding"],
        "producer_metrics": {k: v for k, v in pres["stats"].items() if v and "_bucket{" not in k},
    }
    return {"summary": summary, "requests": rows, "shared_prefix": shared_rows}


def _shared_prefix_run(shared: list[tuple[str, list[int]]], prod: Any, cons: Any, source: str, model: Any, tok: Any,
                       max_new_tokens: int, t: int, report: DemoProgress) -> list[dict[str, Any]]:
    """Instance A (the producer process) answers the first question and keeps its KV; instance
    B (the consumer process) answers the others, fetching the shared system prompt's blocks from
    A instead of computing them.  Every answer is checked against the monolithic run."""
    from demo.model import eos_token_ids, recompute_decode

    if not shared:
        return []
    eos = eos_token_ids(tok)
    first = shared[0][1]
    common = min(next((i for i, (a, b) in enumerate(zip(first, ids)) if a != b), min(len(first), len(ids)))
                 for _, ids in shared[1:]) if len(shared) > 1 else len(first)
    rows = []
    for i, (name, ids) in enumerate(shared):
        report.stage(f"{name}: monolithic run (the reference tokens)")
        reference = recompute_decode(model, ids, max_new_tokens, eos)
        if i == 0:
            report.stage(f"{name}: instance A computes it and keeps its KV (its prefix cache)")
            a = prod.call("compute_local", ids=ids, max_new_tokens=max_new_tokens)
            rows.append({"name": name, "instance": "A", "prompt_tokens": len(ids), "shared_blocks": common // t,
                         "hit_blocks": 0, "load_ok": None, "identical": a["tokens"] == reference,
                         "tokens": a["tokens"], "reference": reference, "computed_tokens": len(ids)})
            continue
        report.stage(f"{name}: instance B probes A (remote_kv_source), fetches the shared prefix, computes the rest")
        b = cons.call("shared", kv_request_id=f"shared-{os.getpid()}-{i}", ids=ids, source=source,
                      max_new_tokens=max_new_tokens)
        rows.append({"name": name, "instance": "B", "prompt_tokens": len(ids), "shared_blocks": common // t,
                     "identical": b["tokens"] == reference, "reference": reference, **b})
    return rows


def _print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 160)
    t = Table(title="python -m demo: SmolLM2-135M, prefill and decode in separate processes, "
                    f"data plane {report['summary']['data_plane']}")
    for col in ("request", "prompt tok", "KV bytes", "blocks", "load ms", "GB/s", "outcome", "reason",
                "KV ready: fetched / recompute", "identical"):
        t.add_column(col, justify="right" if col not in ("request", "outcome", "reason") else "left")
    for r in report["requests"]:
        kvr = (f"{r['kv_ready_fetched_s'] * 1e3:.0f} / {r['kv_ready_recompute_s'] * 1e3:.0f} ms"
               if r["kv_ready_fetched_s"] is not None else f"— / {r['kv_ready_recompute_s'] * 1e3:.0f} ms")
        t.add_row(r["name"], str(r["prompt_tokens"]), f"{r['kv_bytes']:,}", str(r["blocks"]),
                  f"{r['load_s'] * 1e3:.2f}", f"{r['gbps']:.2f}" if r["gbps"] else "—", r["outcome"],
                  r["reason"] or "—", kvr, "[green]yes[/]" if r["identical"] else "[red]NO[/]")
    con.print(t)
    s = report["summary"]
    if s["median_kv_ready_fetched_s"] is not None:
        con.print(f"time to first decode step (KV ready): fetched via kvtier {s['median_kv_ready_fetched_s'] * 1e3:.1f} ms "
                  f"vs recompute {s['median_kv_ready_recompute_s'] * 1e3:.1f} ms (median over fetched requests)")
    late = next((r for r in report["requests"] if r["late"]), None)
    if late is not None:
        if late["outcome"] == "recomputed":
            con.print(f"late consumer: fetch refused with reason '{late['reason']}' in {late['load_s'] * 1e3:.2f} ms "
                      f"(no {s['load_timeout_s']:.0f} s load timeout); it recomputed locally")
        else:
            con.print("late consumer: the fetch was NOT refused (was it really late?)")
    shared = report.get("shared_prefix") or []
    if shared:
        t2 = Table(title="shared-prefix run: instance B fetches the shared system prompt's KV from instance A "
                         "(remote_kv_source) instead of computing it")
        for col in ("request", "instance", "prompt tok", "computed tok", "blocks HIT / shared", "probe steps",
                    "TTFT: fetched / recompute", "identical"):
            t2.add_column(col, justify="left" if col in ("request", "instance") else "right")
        for r in shared:
            ttft = (f"{r['ttft_fetched_s'] * 1e3:.0f} / {r['ttft_recompute_s'] * 1e3:.0f} ms"
                    if r["instance"] == "B" else "— (computes and keeps its KV)")
            t2.add_row(r["name"], r["instance"], str(r["prompt_tokens"]), str(r["computed_tokens"]),
                       f"{r['hit_blocks']} / {r['shared_blocks']}" if r["instance"] == "B" else "—",
                       str(r.get("steps", "—")), ttft, "[green]yes[/]" if r["identical"] else "[red]NO[/]")
        con.print(t2)
        if s.get("median_ttft_shared_fetched_s") is not None:
            con.print(f"time to first token under the shared prefix: fetched from the peer "
                      f"{s['median_ttft_shared_fetched_s'] * 1e3:.1f} ms vs computing the whole prompt "
                      f"{s['median_ttft_shared_recompute_s'] * 1e3:.1f} ms (median); instance A's pins left: "
                      f"{s['serve_pins_outstanding']}")
    con.print(f"pool memory: {'pinned' if s['pinned_memory'] else 'pageable (no accelerator on this machine)'}; "
              f"block = {s['block_bytes']:,} bytes")
    con.print("[bold green]OK[/]: every decode is identical to the monolithic run" if s["ok"]
              else "[bold red]FAILED[/]: see the table")


def main(*, as_json: bool = False, **opts: Any) -> int:
    """CLI entry: run, print a table (or JSON), exit 0 iff every row is identical and the late
    consumer was refused with ``reaped``."""
    if as_json:
        report = run(**opts)
        for r in report["requests"]:
            r.pop("text", None)
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        from rich.console import Console

        # the progress starts before run() imports torch: the user sees it from the first second
        with RichProgress(Console()) as progress:
            report = run(progress=progress, **opts)
        _print_report(report)
    return 0 if report["summary"]["ok"] else 1
