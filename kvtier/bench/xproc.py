"""P1 (kvtier vs raw pyzmq throughput), P2 (kvtier vs torch ``copy_``) and P3 (late-fetch
rejection latency vs a raw round trip): producer and consumer in separate processes.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from kvtier.bench._util import Child, CpuMeter, fmt_bytes, paired_ratio, summary, target

KiB, MiB = 1 << 10, 1 << 20

PRODUCER_CONFIG: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "background_poll": True}
CONSUMER_CONFIG: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "background_poll": False}
# The integrity axis of P1: the same managers with the per-block digest off ("integrity": "none").
NODIGEST = {"integrity": "none"}
DIGEST_COST_TARGET = 0.10  # issue 9: the digest is on by default where it costs at most 10 %


def _grid(quick: bool) -> list[tuple[int, int]]:
    if quick:
        sizes, counts, cap = (64 * KiB, 1 * MiB, 16 * MiB), (1, 8), 32 * MiB
    else:
        sizes, counts, cap = (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB), (1, 8, 64, 512), 256 * MiB
    return [(bs, n) for bs in sizes for n in counts if bs * n <= cap]


def _curve_configs(keydir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Producer and consumer configs with ``auth = "curve"`` (keys generated into ``keydir``)."""
    import os
    import shutil

    from kvtier.transport.curve import generate_keys

    mine, allowed = os.path.join(keydir, "mine"), os.path.join(keydir, "allowed")
    os.makedirs(allowed, exist_ok=True)
    generate_keys(mine, "bench-prefill", ("127.0.0.1",))
    generate_keys(mine, "bench-decode")
    for n in ("bench-prefill", "bench-decode"):
        shutil.copy(os.path.join(mine, f"{n}.key"), allowed)

    def cfg(base: dict[str, Any], name: str) -> dict[str, Any]:
        return {**base, "auth": "curve", "auth_secret_key_file": os.path.join(mine, f"{name}.key_secret"),
                "auth_allowed_keys_dir": allowed}

    return cfg(PRODUCER_CONFIG, "bench-prefill"), cfg(CONSUMER_CONFIG, "bench-decode")


def _children() -> tuple[Child, Child]:
    prod = Child("kvtier.bench._xfer", "Producer", name="bench-producer")
    try:
        cons = Child("kvtier.bench._xfer", "Consumer", name="bench-consumer")
    except BaseException:
        prod.close()
        raise
    return prod, cons


def run(quick: bool, log: Callable[[str], None], which: set[str]) -> dict[str, dict[str, Any]]:
    """Run the requested ones of P1/P2 (one run) and P3 between one pair of child processes."""
    out: dict[str, dict[str, Any]] = {}
    prod, cons = _children()
    try:
        if which & {"P1", "P2"}:
            out.update(run_p1p2(quick, log, prod, cons))
        if "P3" in which:
            out.update(run_p3(quick, log, prod, cons))
    finally:
        cons.close()  # consumer first: the producer then sees a clean disconnect, not a dead peer
        prod.close()
    return {k: v for k, v in out.items() if k in which}


def run_p1p2(quick: bool, log: Callable[[str], None], prod: Child, cons: Child) -> dict[str, dict[str, Any]]:
    import tempfile

    from kvtier.manager import MAX_BATCH_BYTES

    keydir = tempfile.TemporaryDirectory(prefix="kvtier-bench-keys-")
    p_curve, c_curve = _curve_configs(keydir.name)
    reps = 2 if quick else 7
    target_bytes = (8 if quick else 128) * MiB
    kmax = 40 if quick else 200
    grid = _grid(quick)
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    meter = CpuMeter()
    t_start = time.monotonic()
    try:
        raw_port = prod.hello["raw_port"]
        for bs in sorted({bs for bs, _ in grid}):
            ns = [n for b, n in grid if b == bs]
            nmax = max(ns)
            info = prod.call("setup", block_bytes=bs, num_blocks=nmax, config=PRODUCER_CONFIG, curve_config=p_curve,
                             alt_configs={"nodigest": {**PRODUCER_CONFIG, **NODIGEST}})
            addr = info["address"]
            cons.call("setup", block_bytes=bs, num_blocks=nmax, producer=addr, raw_port=raw_port,
                      config=CONSUMER_CONFIG, copy_source=True, curve_producer=info["curve_address"],
                      curve_config=c_curve,
                      alt={"nodigest": (info["alt_addresses"]["nodigest"], {**CONSUMER_CONFIG, **NODIGEST})})
            store_digest = prod.call("digest_rate", nblocks=nmax)["bytes_per_s"]
            per_msg = max(1, MAX_BATCH_BYTES // bs)
            # warm-up: session handshake, first-touch of zmq buffers, code paths
            ids = prod.call("park", prefix=f"w{bs}", count=2, nblocks=min(nmax, 8))
            cons.call("kvtier", ids=ids, nblocks=min(nmax, 8))
            ids = prod.call("park", prefix=f"wc{bs}", count=2, nblocks=min(nmax, 8), curve=True)
            cons.call("kvtier", ids=ids, nblocks=min(nmax, 8), curve=True)
            ids = prod.call("park", prefix=f"wn{bs}", count=2, nblocks=min(nmax, 8), variant="nodigest")
            cons.call("kvtier", ids=ids, nblocks=min(nmax, 8), variant="nodigest")
            cons.call("raw", count=2, nblocks=min(nmax, 8), per_msg=per_msg)
            for n in ns:
                nbytes = n * bs
                k = max(2, min(kmax, math.ceil(target_bytes / nbytes)))
                kv_s, raw_s, cp_s, cv_s, nd_s = [], [], [], [], []
                verified = True
                for rep in range(reps):
                    parked = {
                        "kv": prod.call("park", prefix=f"p1-{bs}-{n}-{rep}", count=k, nblocks=n),
                        "curve": prod.call("park", prefix=f"p1c-{bs}-{n}-{rep}", count=k, nblocks=n, curve=True),
                        "nodigest": prod.call("park", prefix=f"p1n-{bs}-{n}-{rep}", count=k, nblocks=n,
                                              variant="nodigest"),
                    }
                    verify = rep == 0
                    order = ("raw", "kv", "nodigest", "curve")
                    for what in order if rep % 2 == 0 else order[::-1]:
                        if what == "raw":
                            r = cons.call("raw", count=k, nblocks=n, per_msg=per_msg, verify=verify)
                            raw_s.append(r["seconds"])
                        else:
                            r = cons.call("kvtier", ids=parked[what], nblocks=n, verify=verify,
                                          variant="" if what == "kv" else what)
                            {"kv": kv_s, "curve": cv_s, "nodigest": nd_s}[what].append(r["seconds"])
                            if r["failures"]:
                                problems.append(f"{fmt_bytes(bs)}x{n}: kvtier loads failed: {r['failures'][:3]}")
                        if verify and not r.get("verified", True):
                            verified = False
                            problems.append(f"{fmt_bytes(bs)}x{n}: {what} landed wrong bytes")
                    cp_s.append(cons.call("copy", count=k, nblocks=n)["seconds"])
                moved = k * nbytes
                gbps = lambda ss: [moved / s / 1e9 for s in ss]  # noqa: E731
                row = {
                    "block_bytes": bs,
                    "blocks": n,
                    "request_bytes": nbytes,
                    "requests_per_sample": k,
                    "bytes_per_sample": moved,
                    "blocks_per_message": per_msg,
                    "kvtier_gbps": summary(gbps(kv_s)),
                    "kvtier_curve_gbps": summary(gbps(cv_s)),
                    "curve_vs_plain": paired_ratio(kv_s, cv_s),
                    "kvtier_nodigest_gbps": summary(gbps(nd_s)),
                    # throughput with the digest / without it, pairwise (1 - this = the digest's cost)
                    "digest_vs_none": paired_ratio(nd_s, kv_s),
                    "store_digest_gbps": store_digest / 1e9,
                    "raw_zmq_gbps": summary(gbps(raw_s)),
                    "copy_gbps": summary(gbps(cp_s)),
                    "kvtier_request_s": summary([s / k for s in kv_s]),
                    "raw_request_s": summary([s / k for s in raw_s]),
                    # throughput ratio = inverse time ratio, pairwise
                    "ratio_vs_raw": paired_ratio(raw_s, kv_s),
                    "ratio_vs_copy": paired_ratio(cp_s, kv_s),
                    "verified": verified,
                }
                rows.append(row)
                log(
                    f"P1 {fmt_bytes(bs):>7} x {n:<3}: kvtier {row['kvtier_gbps']['median']:.2f} GB/s, "
                    f"raw {row['raw_zmq_gbps']['median']:.2f}, copy_ {row['copy_gbps']['median']:.2f}, "
                    f"ratio {row['ratio_vs_raw']['median']:.2f}, CURVE {row['kvtier_curve_gbps']['median']:.2f} GB/s "
                    f"({row['curve_vs_plain']['median']:.2f}x plain), digest off "
                    f"{row['kvtier_nodigest_gbps']['median']:.2f} GB/s (on/off {row['digest_vs_none']['median']:.3f})"
                )
        pstats = prod.call("stats")
    finally:
        noise = meter.stop()
        keydir.cleanup()
    wall = time.monotonic() - t_start

    def headline(key: str) -> dict[str, Any]:
        meds = [r[key]["median"] for r in rows]
        return {"median": summary(meds)["median"], "min": min(meds), "max": max(meds), "n": len(meds),
                "over": "cells (each a median of interleaved pairs)"}

    r1 = headline("ratio_vs_raw")
    below = [r for r in rows if r["ratio_vs_raw"]["median"] < 0.8]
    big = [r for r in rows if r["request_bytes"] >= 8 * MiB]
    r1_big = headline_of(big, "ratio_vs_raw") if big else None
    worst = min(rows, key=lambda r: r["ratio_vs_raw"]["median"])
    best_kv = max(rows, key=lambda r: r["kvtier_gbps"]["median"])
    best_raw = max(rows, key=lambda r: r["raw_zmq_gbps"]["median"])
    t1 = target(">=", 0.8, worst["ratio_vs_raw"]["median"], "≥ 0.8× raw pyzmq in every cell")
    p1 = {
        "id": "P1",
        "title": "Cross-process throughput: kvtier vs raw pyzmq (ROUTER/DEALER, recv_into)",
        "status": "ok" if not problems else "problems",
        "kvtier": {"label": "best cell", "value": best_kv["kvtier_gbps"]["median"], "unit": "GB/s"},
        "baseline": {"label": "raw pyzmq, best cell", "value": best_raw["raw_zmq_gbps"]["median"], "unit": "GB/s"},
        "ratio": r1,
        "ratio_large": r1_big,
        "curve": {"label": "CURVE on vs off (kvtier, same run, paired)", **headline("curve_vs_plain"),
                  "best_gbps": max(r["kvtier_curve_gbps"]["median"] for r in rows)},
        "integrity": {
            "label": "integrity xxh3_64 vs none: kvtier throughput ratio (same run, paired)",
            **headline("digest_vs_none"),
            "cost": 1.0 - headline("digest_vs_none")["median"],
            "cost_large": (1.0 - headline_of(big, "digest_vs_none")["median"]) if big else None,
            "cost_worst_cell": 1.0 - min(r["digest_vs_none"]["median"] for r in rows),
            "store_digest_gbps": {fmt_bytes(r["block_bytes"]): r["store_digest_gbps"] for r in rows},
            "target": target("<=", DIGEST_COST_TARGET, 1.0 - headline("digest_vs_none")["median"],
                             "digest costs ≤ 10 % of kvtier's throughput (median over cells): on by default"),
        },
        "target": t1,
        "cells_meeting_target": f"{len(rows) - len(below)}/{len(rows)}",
        "worst_cell": {"block_bytes": worst["block_bytes"], "blocks": worst["blocks"],
                       "ratio": worst["ratio_vs_raw"]["median"]},
        "rows": rows,
        "problems": problems,
        "producer": pstats,
        "noise": noise,
        "wall_s": round(wall, 1),
        "method": (
            f"{reps} interleaved repeats per cell (raw/kvtier order alternates); a repeat = k sequential "
            f"requests of n blocks (k*n*block ≈ {fmt_bytes(target_bytes)}, 2 ≤ k ≤ {kmax}); "
            "kvtier: submit_load → JobResult(success); raw: DEALER request → ROUTER streams the same "
            "frames (same grouping per message, zero-copy) → recv_into the same pool slots. CURVE axis: "
            "a second pair of managers with auth='curve' (libzmq CURVE: authenticated, encrypted) over "
            "the same pools, interleaved with the plain pair in every repeat. Integrity axis: a third pair "
            "with integrity='none' (no per-block XXH3-64 digest at store, none checked on landing), "
            "interleaved the same way; the plain pair has the default integrity='xxh3_64'. The timed load "
            "includes the consumer's check; the producer's digest is taken at submit_store (before the "
            "timed load), so its rate is measured separately over the same pool blocks (store_digest_gbps)."
        ),
    }
    r2 = headline("ratio_vs_copy")
    best_cp = max(rows, key=lambda r: r["copy_gbps"]["median"])
    p2 = {
        "id": "P2",
        "title": "Same-host throughput: kvtier cross-process vs torch copy_ of the same bytes",
        "status": "ok" if not problems else "problems",
        "kvtier": {"label": "best cell", "value": best_kv["kvtier_gbps"]["median"], "unit": "GB/s"},
        "baseline": {"label": "torch copy_, best cell", "value": best_cp["copy_gbps"]["median"], "unit": "GB/s"},
        "ratio": r2,
        "ratio_large": headline_of(big, "ratio_vs_copy") if big else None,
        "target": {"text": "none (reported)", "op": None, "value": None, "achieved": r2["median"], "met": None},
        "rows": [
            {"block_bytes": r["block_bytes"], "blocks": r["blocks"], "kvtier_gbps": r["kvtier_gbps"],
             "copy_gbps": r["copy_gbps"], "ratio_vs_copy": r["ratio_vs_copy"]}
            for r in rows
        ],
        "noise": noise,
        "wall_s": round(wall, 1),
        "method": "same run as P1: after each kvtier/raw pair, per-block torch copy_ (1 thread) of the same "
        "number of bytes into the same pool slots, from a pre-faulted source region.",
    }
    return {"P1": p1, "P2": p2}


def headline_of(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    meds = [r[key]["median"] for r in rows]
    return {"median": summary(meds)["median"], "min": min(meds), "max": max(meds), "n": len(meds),
            "over": "cells with requests ≥ 8 MiB"}


def run_p3(quick: bool, log: Callable[[str], None], prod: Child, cons: Child) -> dict[str, dict[str, Any]]:
    batches = 2 if quick else 6
    per_batch = 30 if quick else 200
    bs, nblocks = 64 * KiB, 4
    reap_s = 0.05
    meter = CpuMeter()
    t_start = time.monotonic()
    kv_all, raw_all, batch_ratios, reasons, states_before, states_after = [], [], [], [], [], []
    try:
        cfg = dict(PRODUCER_CONFIG, unbound_store_timeout_s=reap_s)
        addr = prod.call("setup", block_bytes=bs, num_blocks=nblocks, config=cfg)["address"]
        cons.call("setup", block_bytes=bs, num_blocks=nblocks, producer=addr, raw_port=prod.hello["raw_port"],
                  config=CONSUMER_CONFIG)
        # warm up the session and both paths with a real (successful) load and a few round trips
        ids = prod.call("park", prefix="w", count=1, nblocks=nblocks)
        cons.call("kvtier", ids=ids, nblocks=nblocks)
        cons.call("rtt", count=50)
        for b in range(batches):
            ids = prod.call("park", prefix=f"late{b}", count=per_batch, nblocks=nblocks)
            deadline = time.monotonic() + 10
            while True:  # the producer's poll thread reaps them after reap_s
                time.sleep(reap_s * 2)
                st = prod.call("states", ids=ids)
                if all(s == "tombstoned" for s in st) or time.monotonic() > deadline:
                    break
            states_before.extend(st)
            r = cons.call("late", ids=ids, nblocks=nblocks)
            states_after.extend(prod.call("states", ids=ids))
            kv_all.extend(r["kvtier"])
            raw_all.extend(r["raw"])
            reasons.extend(r["reasons"])
            batch_ratios.append(summary(r["kvtier"])["median"] / summary(r["raw"])["median"])
            log(f"P3 batch {b}: kvtier late-fetch {summary(r['kvtier'])['median'] * 1e6:.0f} µs, "
                f"raw RTT {summary(r['raw'])['median'] * 1e6:.0f} µs")
    finally:
        noise = meter.stop()
    kv, raw = summary(kv_all), summary(raw_all)
    ratio = summary(batch_ratios)["median"]
    n_reaped = sum(1 for x in reasons if x == "reaped")
    problems = []
    if n_reaped != len(reasons):
        problems.append(f"{len(reasons) - n_reaped} late loads did not fail with 'reaped': "
                        f"{sorted({str(x) for x in reasons if x != 'reaped'})}")
    if any(s != "tombstoned" for s in states_before + states_after):
        problems.append("some ids were not tombstoned on the producer")
    return {
        "P3": {
            "id": "P3",
            "title": "Late-fetch rejection latency vs a raw request/reply round trip",
            "status": "ok" if not problems else "problems",
            "kvtier": {"label": "submit_load → failed JobResult (median)", "value": kv["median"] * 1e6, "unit": "µs"},
            "baseline": {"label": "raw DEALER→ROUTER RTT (median)", "value": raw["median"] * 1e6, "unit": "µs"},
            "ratio": {"median": ratio, "min": min(batch_ratios), "max": max(batch_ratios), "n": len(batch_ratios),
                      "over": "batches (ratio of batch medians)"},
            "target": target("<=", 3.0, ratio, "≤ 3× a raw round trip"),
            "kvtier_latency_s": kv,
            "raw_rtt_s": raw,
            "p99_ratio": kv.get("p99", math.nan) / raw.get("p99", math.nan) if "p99" in kv else None,
            "failed_with_reaped": f"{n_reaped}/{len(reasons)}",
            "producer_tombstoned": f"{sum(s == 'tombstoned' for s in states_after)}/{len(states_after)}",
            "samples": {"kvtier_us": [x * 1e6 for x in kv_all], "raw_us": [x * 1e6 for x in raw_all]},
            "problems": problems,
            "noise": noise,
            "wall_s": round(time.monotonic() - t_start, 1),
            "method": (
                f"producer parks {per_batch} ids x {batches} batches with unbound_store_timeout_s={reap_s}; its "
                "background poll thread reaps them (checked: all tombstoned); the consumer then loads each id "
                "(submit_load → JobResult(success=False, reason='reaped')) and does one raw round trip on a "
                "DEALER/ROUTER pair between the same two processes, back to back, alternating the order."
            ),
        }
    }
