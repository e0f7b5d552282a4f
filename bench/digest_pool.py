"""kvtier's DigestPool measured: GB/s of one request's digests on 1, 2 and N threads, and what
the pool does to another Python thread (the engine's) meanwhile.

Run from a checkout: ``PYTHONPATH=$PWD .venv/bin/python bench/digest_pool.py``.

* ``GB/s`` — one ``submit_digests`` of a whole request (``--request-mib`` of distinct blocks),
  submit to result, best/median of ``--repeat``;
* ``serial`` — :func:`kvtier.integrity.block_digests` of the same request on the calling thread;
* ``late`` — while the pool hashes requests back to back, a Python thread sleeping 1 ms at a
  time wakes this much later than asked (median / p99): how long the engine's thread waits for
  the GIL.  ``late idle`` is the same with nothing hashing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence

from kvtier.integrity import DigestPool, block_digests


def _blocks(n: int, size: int) -> list[memoryview]:
    arena = bytearray(n * size)
    rng = random.Random(size)
    step = 1 << 24
    for off in range(0, len(arena), step):
        arena[off : off + step] = rng.randbytes(min(step, len(arena) - off))
    mv = memoryview(arena)
    return [mv[i * size : (i + 1) * size] for i in range(n)]


def _lateness(busy: threading.Event | None, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        time.sleep(0.001)
        out.append(time.perf_counter() - t0 - 0.001)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64K,1M,8M")
    ap.add_argument("--request-mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args(argv)
    ncpu = len(os.sched_getaffinity(0))
    threads = sorted({1, 2, ncpu})
    print(f"cpus {ncpu}, loadavg {os.getloadavg()}")
    print(f"{'block':>6s} {'serial':>13s} " + " ".join(f"{'pool ' + str(k):>13s}" for k in threads)
          + f" {'x2':>5s} {'late idle':>13s} " + " ".join(f"{'late pool ' + str(k):>15s}" for k in threads))
    for s in a.sizes.split(","):
        s = s.strip().upper()
        size = int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}[s[-1]]
        bufs = _blocks(max(1, (a.request_mib << 20) // size), size)
        nbytes = len(bufs) * size
        want = block_digests(bufs, "xxh3_64")
        serial = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            block_digests(bufs, "xxh3_64")
            serial.append(nbytes / (time.perf_counter() - t0) / 1e9)
        rates: dict[int, list[float]] = {}
        late: dict[int, list[float]] = {}
        for k in threads:
            with DigestPool(k) as pool:
                assert pool.submit_digests(bufs).result() == want
                rates[k] = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    pool.submit_digests(bufs).result()
                    rates[k].append(nbytes / (time.perf_counter() - t0) / 1e9)
                stop = threading.Event()

                def load(pool: DigestPool = pool) -> None:
                    while not stop.is_set():
                        pool.submit_digests(bufs).result()

                t = threading.Thread(target=load)
                t.start()
                late[k] = sorted(_lateness(stop, 1.5))
                stop.set()
                t.join()
        idle = sorted(_lateness(None, 0.5))

        def q(xs: list[float], p: float) -> float:
            return xs[min(len(xs) - 1, int(len(xs) * p))] * 1e6

        cells = " ".join(f"{max(rates[k]):6.2f}/{statistics.median(rates[k]):<6.2f}" for k in threads)
        lcells = " ".join(f"{q(late[k], 0.5):6.0f}/{q(late[k], 0.99):<6.0f}µs" for k in threads)
        x2 = max(rates[2]) / max(rates[1])
        print(f"{s:>6s} {max(serial):6.2f}/{statistics.median(serial):<6.2f} {cells} {x2:5.2f} "
              f"{q(idle, 0.5):5.0f}/{q(idle, 0.99):<5.0f}µs {lcells}", flush=True)
    print(f"loadavg after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
