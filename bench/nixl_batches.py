"""The limit of a batched NIXL transfer: raw WRITEs posted back to back, cut as the NIXL plane cuts
a fetch, against one WRITE of the whole fetch (a measurement, not a test).

    python -m bench.nixl_batches [--reps 9] [--sizes 8,64,256] [--shm] [--digests]

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

With ``--digests``, two more cuts do kvtier's digest work around ``packed 16``, so the limit of a
fetch *with integrity* is measured the same way (decision N20):

* ``packed 16 + digests``: the source blocks' digests are taken on a digest pool first (a store
  right before its fetch, as P0 does), then the WRITEs; each WRITE's notification names its
  slots, the consumer checks them on its own digest pool as it arrives, and the time runs until
  the consumer says every block was checked (what kvtier's consumer waits for before its result);
* ``packed 16 + digests, overlapped``: the same, with one digest request per WRITE and each
  WRITE posted once its own digests are taken.

At most 64 MiB in flight (the plane's window).
The cuts are interleaved within every repetition, so each sees the same load; the table gives
the median time and the median of the per-repetition paired throughput ratios against ``one``.
Over CMA a WRITE's copy runs inside its post (the ``in post`` column), so a cut's cost is the
per-WRITE overhead (a post, a flush, a notification), not waiting.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from kvtier.integrity import digest

MiB = 1 << 20
CUTS = (("one", 0), ("plan", 8), ("packed 16", 16), ("packed 32", 32))
DIGESTED = "packed 16 + digests"
_FILLS = itertools.cycle(range(2, 256))  # a fresh fill per digest cut: the last one's bytes never pass
OVERLAPPED = "packed 16 + digests, overlapped"
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
    """The target: progresses every millisecond, as the plane does.  Told ``("check", n, digest)``,
    it checks each WRITE's blocks against ``digest`` on a digest pool as the WRITE's notification
    (``first,count`` of its slots) arrives, and answers ``n`` checked blocks on the pipe once the
    last check passed (what kvtier's consumer does before its result)."""
    from kvtier.dataplane.nixl_agent import NixlBlockAgent
    from kvtier.integrity import DigestPool

    region = _region(nblocks, 0, shm)
    agent = NixlBlockAgent(f"nb-c-{os.getpid()}", region)
    conn.send(agent.descriptor())
    agent.add_peer("p", conn.recv())
    pool = DigestPool()
    want, digest, checks, named = 0, 0, [], []
    while True:
        if conn.poll(0.001 if not want else 0):
            cmd = conn.recv()
            if cmd == "stop":
                break
            _, want, digest = cmd
            checks = []
        # a notification read before its command (a WRITE right behind it) waits for the digest
        named += [n.message for n in agent.progress() if n.message[:1] == b"@"]
        while want and named:
            first, count = map(int, named.pop(0)[1:].split(b","))
            bufs = [memoryview(region[i]) for i in range(first, first + count)]
            checks.append((count, pool.submit_check(bufs, [digest] * count)))
        if want and sum(c for c, f in checks if f.done()) >= want:
            bad = [f.result() for _, f in checks if f.result() >= 0]
            conn.send(("checked", want, bool(bad)))
            want, checks = 0, []
        elif want:
            time.sleep(0.0001)  # the plane's eager wait while a load is out (C20)
    pool.close()
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


def _write(agent: Any, n: int, pack: int, checks: Any = None, overlap: bool = False) -> tuple[float, float]:
    """Seconds post → every WRITE done, and seconds spent inside the posts.  With ``checks``
    (``(pipe, digest pool, region)``): the source blocks get a fill of their own first (so a
    block that did not land fails its check), their digests are taken on the pool (a store
    right before its fetch, as P0 does) — with ``overlap``, one request per WRITE, each WRITE
    posted once its own are taken (decision N20) — every WRITE names its slots in its
    notification, and the time runs until the consumer says every block was checked.

    Raises:
        RuntimeError: a WRITE failed, or the consumer found a block whose bytes do not match."""
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
    if checks is not None:
        conn, pool, region = checks
        region[:n] = next(_FILLS)
        conn.send(("check", n, digest(memoryview(region[0]))))
    t0 = time.perf_counter()
    taken: list[Any] = []
    if checks is not None:
        if overlap:
            taken = [pool.submit_digests([memoryview(region[i]) for i in src]) for src, _, _ in cuts]
        else:
            pool.submit_digests([memoryview(region[i]) for i in range(n)]).result()
    while done < len(cuts):
        while nxt < len(cuts) and (not inflight or sum(inflight.values()) + cuts[nxt][2] <= WINDOW_MIB):
            if taken and not taken[nxt].done():
                if inflight:
                    break  # take the outcomes meanwhile
                taken[nxt].result()
            t = time.perf_counter()
            src, dst, size = cuts[nxt]
            notif = NOTIF if checks is None else b"@%d,%d" % (int(dst.min()), size)
            inflight[agent.post_write("c", src, dst, notif=notif)] = size
            in_post += time.perf_counter() - t
            nxt += 1
        for ev in agent.poll():
            if ev.xfer_id in inflight:
                if ev.status != "done":
                    raise RuntimeError(f"WRITE failed: {ev.detail}")
                del inflight[ev.xfer_id]
                done += 1
    if checks is not None:
        while not conn.poll(0.0001):
            agent.poll()
        _, got, bad = conn.recv()
        if got != n or bad:
            raise RuntimeError(f"the consumer checked {got} of {n} blocks, bad={bad}")
    return time.perf_counter() - t0, in_post


def run(sizes: tuple[int, ...] = (8, 64, 256), reps: int = 9, shm: bool = False,
        digests: bool = False) -> dict[str, Any]:
    from bench._util import CpuMeter
    from kvtier.dataplane.nixl_agent import NixlBlockAgent
    from kvtier.integrity import DigestPool

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
        pool = DigestPool() if digests else None
        checks = (here, pool, region) if digests else None
        for size in sizes:
            cuts = list(CUTS) + ([(DIGESTED, 16), (OVERLAPPED, 16)] if digests else [])
            got: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in cuts}
            for _ in range(reps):
                for name, b in cuts:
                    got[name].append(_write(agent, size, b, checks if name in (DIGESTED, OVERLAPPED) else None,
                                            overlap=name == OVERLAPPED))
            one = [t for t, _ in got["one"]]
            for name, _ in cuts:
                ts = [t for t, _ in got[name]]
                out["rows"].append({"mib": size, "cut": name, "s": statistics.median(ts),
                                    "in_post_s": statistics.median(p for _, p in got[name]),
                                    "ratio": statistics.median(a / b for a, b in zip(one, ts))})
        if pool is not None:
            pool.close()
    finally:
        here.send("stop")
        child.join(10)
        agent.close(0.5)
    out["load"] = meter.stop()
    return out


def render(r: dict[str, Any]) -> str:
    lines = [("| request | cut | post → every WRITE done (digest cuts: → every block checked) | in post "
              "| throughput vs one WRITE (paired) |"),
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
    ap.add_argument("--digests", action="store_true",
                    help="also the packed 16 cut with kvtier's digest work: the source's digests on a digest pool "
                         "first, each WRITE's blocks checked on the consumer's pool as its notification arrives")
    a = ap.parse_args(argv)
    print(render(run(tuple(int(s) for s in a.sizes.split(",")), a.reps, a.shm, a.digests)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
