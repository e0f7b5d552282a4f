"""The limit of a batched NIXL transfer: raw WRITEs posted back to back, cut as the NIXL plane cuts
a fetch, against one WRITE of the whole fetch (a measurement, not a test).

    python -m bench.nixl_batches [--reps 9] [--sizes 8,64,256] [--shm]

Two spawned processes, each a :class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent` over a pool of
1 MiB blocks (CMA on one host).  The producer WRITEs a request of ``size`` MiB into the
consumer's slots (reverse order, as a fetch names them), every WRITE with a notification of a
header's size, and busy-polls post → every WRITE ``DONE``, in each of these cuts:

* ``one``: one WRITE of the whole request (P0's raw NIXL WRITE);
* ``plan``: one WRITE per batch of the core's plan (8 MiB tapering to 1 MiB: the NIXL plane
  before decision N18);
* ``packed 16``: the plan with its 8 MiB batches packed into WRITEs of up to 16 MiB (the plane
  now, N18);
* ``packed 32``: the same, up to 32 MiB.

At most 64 MiB in flight (the plane's window).
The cuts are interleaved within every repetition, so each sees the same load; the table gives
the median time and the median of the per-repetition paired throughput ratios against ``one``.
Over CMA a WRITE's copy runs inside its post (the ``in post`` column), so a cut's cost is the
per-WRITE overhead (a post, a flush, a notification), not waiting.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

MiB = 1 << 20
CUTS = (("one", 0), ("plan", 8), ("packed 16", 16), ("packed 32", 32))
WINDOW_MIB = 64
NOTIF = b"h" * 160  # a 1 MiB-block header with 8 digests is ~140 bytes


def _region(nblocks: int, fill: int, shm: bool) -> Any:
    """The pool: numpy's own array (anonymous memory, which numpy advises onto transparent huge
    pages) or, with ``shm``, a ``/dev/shm`` mapping of 4 KiB pages as vLLM's primary tier and P0's
    raw baselines use (``bench.seed_side._shared_rows``)."""
    import numpy as np

    if not shm:
        return np.full((nblocks, MiB), fill, dtype=np.uint8)
    from bench.seed_side import _shared_rows

    region = _shared_rows(nblocks, MiB)
    region[:] = fill
    return region


def _consumer(conn: Any, nblocks: int, shm: bool = False) -> None:
    from kvtier.dataplane.nixl_agent import NixlBlockAgent

    region = _region(nblocks, 0, shm)
    agent = NixlBlockAgent(f"nb-c-{os.getpid()}", region)
    conn.send(agent.descriptor())
    agent.add_peer("p", conn.recv())
    while not conn.poll(0.001):  # a target that progresses every millisecond, as the plane does
        agent.progress()
    conn.recv()
    agent.close(0.5)


def _sizes(n: int, pack: int) -> list[int]:
    """WRITE sizes (blocks of 1 MiB) of ``n`` blocks: one (``pack`` 0), the plan, or the plan
    with its 8 MiB batches packed up to ``pack`` MiB."""
    from kvtier.lifecycle.batches import plan_batches

    if not pack:
        return [n]
    plan = plan_batches(n, 8, 1)
    out: list[int] = []
    for b in plan:
        if out and b == 8 and out[-1] % 8 == 0 and out[-1] + b <= pack and len(out) < len(plan):
            out[-1] += b
        else:
            out.append(b)
    return out


def _write(agent: Any, n: int, pack: int) -> tuple[float, float]:
    """Seconds post → every WRITE done, and seconds spent inside the posts."""
    import numpy as np

    loc = np.arange(n, dtype=np.int32)
    rem = loc[::-1].copy()
    cuts, first = [], 0
    for size in _sizes(n, pack):
        cuts.append((loc[first:first + size], rem[first:first + size], size))
        first += size
    inflight: dict[int, int] = {}
    nxt = done = 0
    in_post = 0.0
    t0 = time.perf_counter()
    while done < len(cuts):
        while nxt < len(cuts) and (not inflight or sum(inflight.values()) + cuts[nxt][2] <= WINDOW_MIB):
            t = time.perf_counter()
            inflight[agent.post_write("c", cuts[nxt][0], cuts[nxt][1], notif=NOTIF)] = cuts[nxt][2]
            in_post += time.perf_counter() - t
            nxt += 1
        for ev in agent.poll():
            if ev.xfer_id in inflight:
                if ev.status != "done":
                    raise RuntimeError(f"WRITE failed: {ev.detail}")
                del inflight[ev.xfer_id]
                done += 1
    return time.perf_counter() - t0, in_post


def run(sizes: tuple[int, ...] = (8, 64, 256), reps: int = 9, shm: bool = False) -> dict[str, Any]:
    from bench._util import CpuMeter
    from kvtier.dataplane.nixl_agent import NixlBlockAgent

    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    meter = CpuMeter()
    nblocks = max(sizes)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_consumer, args=(there, nblocks, shm), daemon=True)
    child.start()
    region = _region(nblocks, 1, shm)
    agent = NixlBlockAgent(f"nb-p-{os.getpid()}", region)
    out: dict[str, Any] = {"rows": [], "memory": "/dev/shm (4 KiB pages)" if shm else "numpy (anonymous)"}
    try:
        agent.add_peer("c", here.recv())
        here.send(agent.descriptor())
        _write(agent, nblocks, 0)  # warm-up: first touch of the consumer's pages, the endpoint
        for size in sizes:
            cuts = list(CUTS)
            got: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in cuts}
            for _ in range(reps):
                for name, b in cuts:
                    got[name].append(_write(agent, size, b))
            one = [t for t, _ in got["one"]]
            for name, _ in cuts:
                ts = [t for t, _ in got[name]]
                out["rows"].append({"mib": size, "cut": name, "s": statistics.median(ts),
                                    "in_post_s": statistics.median(p for _, p in got[name]),
                                    "ratio": statistics.median(a / b for a, b in zip(one, ts))})
    finally:
        here.send("stop")
        child.join(10)
        agent.close(0.5)
    out["load"] = meter.stop()
    return out


def render(r: dict[str, Any]) -> str:
    lines = ["| request | cut | post → every WRITE done | in post | throughput vs one WRITE (paired) |",
             "|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['mib']} MiB | {row['cut']} | {row['s'] * 1e3:.2f} ms | {row['in_post_s'] * 1e3:.2f} ms "
                     f"| {row['ratio']:.2f} |")
    ld = r["load"]
    lines += ["", f"memory: {r['memory']}; load: 1-min loadavg {ld['loadavg_1m']:.2f}, other processes used {ld['others_cores']:.2f} cores"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--sizes", default="8,64,256", help="comma-separated MiB per request")
    ap.add_argument("--shm", action="store_true",
                    help="both pools over /dev/shm (4 KiB pages), as vLLM's primary tier and P0's raw baselines")
    a = ap.parse_args(argv)
    print(render(run(tuple(int(s) for s in a.sizes.split(",")), a.reps, a.shm)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
