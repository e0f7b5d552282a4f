"""Block-digest candidates measured side by side: throughput on 1, 2 and N threads, and GIL release.

Self-contained: the standard library plus whichever candidate packages are installed (a missing
one is listed as skipped).  Run it in a scratch virtual env that has them, e.g.::

    python3 -m venv /tmp/hashvenv
    /tmp/hashvenv/bin/pip install xxhash==4.1.0 blake3 crc32c google-crc32c mmh3
    /tmp/hashvenv/bin/python bench/digests.py --json /tmp/digests.json

What it measures, per candidate and block size (64 KiB, 1 MiB, 8 MiB by default):

* ``1t`` — GB/s of one thread hashing many *distinct* buffers (``--total-mib`` of them, so the
  bytes come from memory, not from cache, as a parked request's would);
* ``pool k`` — GB/s of a ``ThreadPoolExecutor(k)`` for k = 1, 2, N (N =
  ``len(os.sched_getaffinity(0))``), the buffers split into k contiguous slices, one task each
  (how a digest pool splits a request's blocks);
* ``spin`` — the GIL check: how far a pure-Python counting thread gets while the main thread
  hashes, relative to how far it gets alone in the same time.  Near 1.0 on a machine with a free
  core: the hash releases the GIL; near 0.5 or below: it holds it (the two threads take turns).
* ``gil`` — the verdict from ``spin`` and the cache-hot 2-thread speed-up ``x2hot`` (memory
  bandwidth can cap the cold one, ``x2``);
* ``others`` — cores other processes kept busy meanwhile (/proc/stat): on a shared 2-core machine
  a row with ``others`` near 1 cannot show 2-thread scaling, whatever the hash does.

Every figure is repeated ``--repeat`` times; the table shows the best and the median GB/s (best is
the least disturbed on a shared machine).  ``/proc/loadavg`` is printed before and after.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence

Hash = Callable[[memoryview], int]


def _candidates() -> dict[str, tuple[str, int, Hash]]:
    """name -> (package and version, digest bits, function of one buffer returning an int)."""
    out: dict[str, tuple[str, int, Hash]] = {}
    try:
        import xxhash

        ver = f"xxhash {xxhash.VERSION} (libxxhash {xxhash.XXHASH_VERSION})"
        out["xxh3_64"] = (ver, 64, xxhash.xxh3_64_intdigest)
        out["xxh3_128"] = (ver, 128, xxhash.xxh3_128_intdigest)
    except ImportError:
        pass
    try:
        import blake3

        ver = f"blake3 {blake3.__version__}"

        def b3(buf: memoryview, _b=blake3.blake3) -> int:
            return int.from_bytes(_b(buf).digest(16), "little")

        def b3_auto(buf: memoryview, _b=blake3.blake3, _auto=blake3.blake3.AUTO) -> int:
            return int.from_bytes(_b(buf, max_threads=_auto).digest(16), "little")

        out["blake3"] = (ver, 128, b3)
        out["blake3_auto"] = (ver + " max_threads=AUTO", 128, b3_auto)
    except ImportError:
        pass
    try:
        import crc32c

        from importlib.metadata import version

        out["crc32c"] = (f"crc32c {version('crc32c')}", 32, crc32c.crc32c)
    except ImportError:
        pass
    # google-crc32c is left out: its C entry point parses its argument with "y#", which takes
    # only bytes objects, so a pool slot would have to be copied before every check.
    try:
        import mmh3

        from importlib.metadata import version

        out["mmh3_128"] = (f"mmh3 {version('mmh3')}", 128, mmh3.mmh3_x64_128_uintdigest)
    except ImportError:
        pass

    def b2(buf: memoryview, _h=hashlib.blake2b) -> int:
        return int.from_bytes(_h(buf, digest_size=16).digest(), "little")

    def s256(buf: memoryview, _h=hashlib.sha256) -> int:
        return int.from_bytes(_h(buf).digest()[:16], "little")

    out["blake2b_128"] = (f"hashlib ({hashlib.__name__}, {platform.python_version()})", 128, b2)
    out["sha256"] = ("hashlib (OpenSSL)", 256, s256)
    out["zlib_crc32"] = (f"zlib {zlib.ZLIB_RUNTIME_VERSION}", 32, zlib.crc32)
    return out


def _buffers(block_bytes: int, total_bytes: int) -> list[memoryview]:
    n = max(4, total_bytes // block_bytes)
    rng = random.Random(block_bytes)
    # one allocation sliced into distinct blocks: every block is different bytes, none is cache-hot
    arena = bytearray(n * block_bytes)
    step = 1 << 24
    for off in range(0, len(arena), step):
        arena[off : off + step] = rng.randbytes(min(step, len(arena) - off))
    mv = memoryview(arena)
    # read-only views: some bindings (google-crc32c) accept nothing else; it costs no copy
    return [mv[i * block_bytes : (i + 1) * block_bytes].toreadonly() for i in range(n)]


def _hot(bufs: Sequence[memoryview], block_bytes: int, total_bytes: int, k: int) -> list[memoryview]:
    """``total_bytes`` worth of hashing over a small cache-resident set: per thread, the first
    block of its own slice (so k threads never share lines), repeated."""
    reps = max(1, total_bytes // block_bytes // k)
    firsts = [s[0] for s in _slices(bufs, k)]
    return [b for b in firsts for _ in range(reps)]


def _serial(fn: Hash, bufs: Sequence[memoryview]) -> float:
    t0 = time.perf_counter()
    for b in bufs:
        fn(b)
    return time.perf_counter() - t0


def _slices(bufs: Sequence[memoryview], k: int) -> list[Sequence[memoryview]]:
    n = len(bufs)
    return [bufs[i * n // k : (i + 1) * n // k] for i in range(k)]


def _hash_slice(fn: Hash, bufs: Sequence[memoryview]) -> list[int]:
    return [fn(b) for b in bufs]


def _pooled(pool: cf.ThreadPoolExecutor, k: int, fn: Hash, bufs: Sequence[memoryview]) -> float:
    parts = _slices(bufs, k)
    t0 = time.perf_counter()
    futs = [pool.submit(_hash_slice, fn, p) for p in parts]
    for f in futs:
        f.result()
    return time.perf_counter() - t0


def _spin_ratio(fn: Hash, bufs: Sequence[memoryview], seconds: float) -> float:
    """Progress of a pure-Python counting thread while ``fn`` runs, over its progress alone."""

    def spin(stop: threading.Event, out: list[int]) -> None:
        n = 0
        while not stop.is_set():
            n += 1
        out.append(n)

    def run(busy: bool) -> float:
        stop, out = threading.Event(), []
        t = threading.Thread(target=spin, args=(stop, out))
        t0 = time.perf_counter()
        t.start()
        if busy:
            i = 0
            while time.perf_counter() - t0 < seconds:
                fn(bufs[i % len(bufs)])
                i += 1
        else:
            time.sleep(seconds)
        stop.set()
        t.join()
        return out[0] / (time.perf_counter() - t0)

    alone = run(False)
    return run(True) / alone


def _busy_s() -> float:
    """CPU seconds every CPU of the machine spent busy so far (/proc/stat; nan if unreadable)."""
    try:
        with open("/proc/stat") as f:
            vals = [float(v) for v in f.readline().split()[1:8]]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq = vals
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _ours_s() -> float:
    t = os.times()
    return t.user + t.system


class _Others:
    """How many cores other processes kept busy between start and stop (about +-0.2)."""

    def __init__(self) -> None:
        self.t0, self.b0, self.o0 = time.monotonic(), _busy_s(), _ours_s()

    def stop(self) -> float:
        wall = max(1e-9, time.monotonic() - self.t0)
        return max(0.0, (_busy_s() - self.b0 - (_ours_s() - self.o0)) / wall)


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return f.read().strip()
    except OSError:
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64K,1M,8M", help="block sizes, K/M suffixes (default 64K,1M,8M)")
    ap.add_argument("--total-mib", type=int, default=256, help="distinct bytes hashed per figure (default 256)")
    ap.add_argument("--repeat", type=int, default=5, help="repeats per figure (default 5)")
    ap.add_argument("--only", default="", help="comma-separated candidate names (default: all installed)")
    ap.add_argument("--spin-s", type=float, default=0.3, help="seconds per GIL-check run (default 0.3)")
    ap.add_argument("--json", default="", help="also write every sample here")
    a = ap.parse_args(argv)

    ncpu = len(os.sched_getaffinity(0))
    threads = sorted({1, 2, ncpu})
    cands = _candidates()
    if a.only:
        want = a.only.split(",")
        unknown = [w for w in want if w not in cands]
        if unknown:
            ap.error(f"unknown or not installed candidates {unknown}; installed: {sorted(cands)}")
        cands = {k: cands[k] for k in want}

    def size(s: str) -> int:
        s = s.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
        return int(s[:-1] if s[-1] in "KMG" else s) * mult

    sizes = [size(s) for s in a.sizes.split(",")]
    print(f"python {platform.python_version()}, cpus in affinity {ncpu}, threads {threads}")
    print(f"loadavg before: {_loadavg()}")
    for name, (ver, bits, _) in cands.items():
        print(f"  {name:14s} {bits:3d}-bit  {ver}")
    samples: dict = {"loadavg_before": _loadavg(), "ncpu": ncpu, "results": []}
    pools = {k: cf.ThreadPoolExecutor(max_workers=k) for k in threads}
    cols = ["1t"] + [f"pool{k}" for k in threads] + [f"hot{k}" for k in threads]
    print("GB/s (10^9 bytes/s), best/median of", a.repeat, "| 1t, poolK: distinct buffers from memory;"
          " hotK: K threads re-hashing a cache-resident block each | x2: pool2/pool1 best;"
          " x2hot: hot2/hot1 best | spin: see the module docstring")
    print(f"{'candidate':14s} {'block':>6s} " + " ".join(f"{c:>13s}" for c in cols)
          + f" {'x2':>5s} {'x2hot':>5s} {'spin':>5s} {'others':>6s}  gil")
    try:
        for bs in sizes:
            bufs = _buffers(bs, a.total_mib << 20)
            nbytes = len(bufs) * bs
            hot = {k: _hot(bufs, bs, a.total_mib << 20, k) for k in threads}
            for name, (ver, bits, fn) in cands.items():
                fn(bufs[0])  # warm: lazy imports, SIMD dispatch
                row: dict = {"candidate": name, "block_bytes": bs, "bytes": nbytes, "bits": bits, "package": ver}
                others = _Others()
                row["1t"] = [nbytes / _serial(fn, bufs) / 1e9 for _ in range(a.repeat)]
                for k in threads:
                    row[f"pool{k}"] = [nbytes / _pooled(pools[k], k, fn, bufs) / 1e9 for _ in range(a.repeat)]
                for k in threads:
                    hb = len(hot[k]) * bs
                    row[f"hot{k}"] = [hb / _pooled(pools[k], k, fn, hot[k]) / 1e9 for _ in range(a.repeat)]
                spins = [_spin_ratio(fn, hot[1][:64], a.spin_s) for _ in range(3)]
                row["spin"] = spins
                x2 = max(row["pool2"]) / max(row["pool1"])
                x2hot = max(row["hot2"]) / max(row["hot1"])
                spin = statistics.median(spins)
                row.update(x2=x2, x2hot=x2hot)
                # the cache-hot speed-up is the sure sign (memory bandwidth can cap the cold one)
                if x2hot > 1.5 or spin > 0.8:
                    verdict = "released"
                elif x2hot < 1.2 and spin < 0.65:
                    verdict = "held"
                else:
                    verdict = "unclear"
                row["gil"] = verdict
                row["others_cores"] = others.stop()
                samples["results"].append(row)
                cells = " ".join(f"{max(row[c]):6.2f}/{statistics.median(row[c]):<6.2f}" for c in cols)
                print(f"{name:14s} {bs >> 10:5d}K {cells} {x2:5.2f} {x2hot:5.2f} {spin:5.2f} {row['others_cores']:6.2f}  {verdict}", flush=True)
            del bufs, hot
    finally:
        for p in pools.values():
            p.shutdown()
    print(f"loadavg after: {_loadavg()}")
    samples["loadavg_after"] = _loadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(samples, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
