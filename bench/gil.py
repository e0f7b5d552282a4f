"""What an engine thread that runs Python costs kvtier's own threads, and what Python's GIL switch
interval changes about it (a measurement, not a test).

    python -m bench.gil [--switch S] [--duty 0,0.5,0.9,1] [--requests N]

kvtier's digest pool, its I/O loop and the engine share one interpreter lock.  Each of kvtier's
blocking calls — one block's digest (XXH3 drops the lock while it hashes), one wait in the loop's
poll — takes the lock back when it returns, and while another thread runs Python that can take up
to the switch interval (``sys.getswitchinterval()``, 5 ms by default): the engine's thread keeps the
lock until the interval ends.  Two figures, each beside an "engine" loop that runs Python for
``duty`` of every 4 ms step and sleeps the rest (vLLM's scheduler thread runs Python while it
schedules and launches a step):

* **digests**: a 256 MiB store's digests (1 MiB blocks) on a two-thread
  :class:`~kvtier.integrity.DigestPool` — the pool a large store's digests and a large landing's
  checks run on (the engine loop runs on its own thread);
* **requests**: a 1-block (64 KiB) request between two managers of this process, both with their
  I/O loops on their own threads (``background_poll``), the engine loop on a thread of its own and
  the caller polling ``get_finished_jobs`` every 0.1 ms: ``submit_load`` → its ``JobResult``.

``--switch S`` sets ``sys.setswitchinterval(S)`` first (the config key ``gil_switch_interval_s``).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import threading
import time
from typing import Any

MiB = 1 << 20
STEP_S = 0.004


def _engine_step(duty: float) -> None:
    """One engine step: Python for ``duty`` of :data:`STEP_S`, asleep for the rest."""
    end = time.perf_counter() + STEP_S * duty
    x = 0
    while time.perf_counter() < end:
        x += 1
    if duty < 1.0:
        time.sleep(STEP_S * (1.0 - duty))


def digests(duty: float, reps: int = 3) -> float:
    """Median seconds for a 256 MiB store's digests beside an engine thread at ``duty``."""
    import numpy as np

    from kvtier.integrity import DigestPool

    region = np.ones((256, MiB), np.uint8)
    bufs = [memoryview(region[i]) for i in range(256)]
    pool = DigestPool(2)
    stop = threading.Event()

    def engine() -> None:
        while not stop.is_set():
            _engine_step(duty)

    t = threading.Thread(target=engine, daemon=True) if duty > 0 else None
    try:
        pool.submit_digests(bufs[:2]).result()  # the pool's threads started
        if t is not None:
            t.start()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            pool.submit_digests(bufs).result()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        stop.set()
        if t is not None:
            t.join()
        pool.close()


def requests(duty: float, n: int = 50, plane: str = "zmq") -> float:
    """Median seconds per 1-block request (``submit_load`` → ``JobResult``) between two managers
    with their loops on threads, beside an engine thread at ``duty``."""
    from bench.reqloop import start_one
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    logger = logging.getLogger("kvtier")
    level = logger.level
    logger.setLevel(logging.ERROR)  # put back when done: a test may run this beside others
    cfg = {"host": "127.0.0.1", "port": 0, "data_plane": plane, "allowed_peers": ["127.0.0.1"],
           "background_poll": True}
    prod, cons = KvTierManager(cfg, BlockPool(4, 64 << 10)), KvTierManager(cfg, BlockPool(4, 64 << 10))
    host, _, port = prod.address.rpartition(":")
    jobs = itertools.count(1)
    times = []
    stop = threading.Event()

    def engine() -> None:
        while not stop.is_set():
            _engine_step(duty)

    t = threading.Thread(target=engine, daemon=True) if duty > 0 else None
    if t is not None:
        t.start()
    try:
        for i in range(n + 5):
            kid = f"g{i}"
            creq, job, t0 = start_one(prod, cons, kid, jobs, host, int(port))
            done: list[Any] = []
            while not done:
                done = [r for r in cons.get_finished_jobs() if r.job_id == job]
                if not done:
                    time.sleep(0.0001)
            if not done[0].success:
                raise RuntimeError(f"request {kid} failed: {done[0]}")
            if i >= 5:
                times.append(time.perf_counter() - t0)
            cons.on_request_finished(creq)
            deadline = time.monotonic() + 5
            while prod.has_pending_work() and time.monotonic() < deadline:  # the receipt, the store's result
                prod.get_finished_jobs()
                time.sleep(0.0005)
        return statistics.median(times)
    finally:
        stop.set()
        if t is not None:
            t.join()
        cons.shutdown(grace_s=0.2)
        prod.shutdown(grace_s=0.2)
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--switch", type=float, default=None, help="sys.setswitchinterval(S) first (seconds)")
    ap.add_argument("--duty", default="0,0.5,0.9,1", help="engine duty cycles (share of each 4 ms step in Python)")
    ap.add_argument("--requests", type=int, default=50, help="1-block requests per duty")
    a = ap.parse_args(argv)
    if a.switch is not None:
        sys.setswitchinterval(a.switch)
    print(f"GIL switch interval {sys.getswitchinterval() * 1e3:g} ms")
    print("| engine thread in Python | 256 MiB store's digests (2 threads) | 1-block request, zmq |")
    print("|---|---|---|")
    for duty in (float(d) for d in a.duty.split(",")):
        d = digests(duty)
        r = requests(duty, a.requests)
        print(f"| {duty:.0%} of each 4 ms | {d * 1e3:.1f} ms | {r * 1e3:.2f} ms |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
