"""P1 (kvtier vs raw pyzmq throughput), P2 (kvtier vs torch ``copy_``) and P3 (late-fetch
rejection latency vs a raw round trip): producer and consumer in separate processes, on each data
plane (zmq, and NIXL when it is installed: one-sided WRITEs, UCX CMA on this host) side by side.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

from bench import _profile
from bench._util import CpuMeter, fmt_bytes, paired_ratio, summary, target
from tools.child import Child, start_all

KiB, MiB = 1 << 10, 1 << 20

PRODUCER_CONFIG: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "background_poll": True}
CONSUMER_CONFIG: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "background_poll": False}


def _grid(quick: bool, smoke: bool = False) -> list[tuple[int, int]]:
    if smoke:  # one cell of ≥ 8 MiB, which the digest's cost is measured over
        sizes, counts, cap = (64 * KiB, 1 * MiB), (1, 8), 8 * MiB
    elif quick:
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


def _nixl_available() -> str | None:
    """None if the NIXL plane can run here, else why not."""
    try:
        from kvtier.dataplane.nixl_agent import load_nixl_api

        load_nixl_api()
    except ImportError as exc:
        return str(exc)
    return None


NODIGEST = {"integrity": "none"}
WINDOW = 4  # P2's windowed NIXL run: requests in flight at once (an engine loads many requests)
DIGEST_COST_TARGET = 0.10  # the digest is on by default where it costs at most 10 %


def _pairs(curve: tuple[dict[str, Any], dict[str, Any]]) -> tuple[dict[str, dict], dict[str, dict]]:
    """Producer and consumer configs by pair name: zmq, curve, nodigest (integrity off), and nixl
    when installed."""
    prod = {"zmq": PRODUCER_CONFIG, "curve": curve[0], "nodigest": {**PRODUCER_CONFIG, **NODIGEST}}
    cons = {"zmq": CONSUMER_CONFIG, "curve": curve[1], "nodigest": {**CONSUMER_CONFIG, **NODIGEST}}
    if _nixl_available() is None:
        prod["nixl"] = {**PRODUCER_CONFIG, "data_plane": "nixl"}
        cons["nixl"] = {**CONSUMER_CONFIG, "data_plane": "nixl"}
        prod["nixl_nodigest"] = {**prod["nixl"], **NODIGEST}
        cons["nixl_nodigest"] = {**cons["nixl"], **NODIGEST}
    return prod, cons


def _record(prod: Child, cons: Child, stem: str) -> _profile.Recorder | None:
    """py-spy on both children for one measured phase (``python -m bench`` only: ``_profile.OUT``)."""
    if _profile.OUT is None:
        return None
    rec = _profile.Recorder()
    rec.start({"producer": prod.hello["pid"], "consumer": cons.hello["pid"]}, _profile.OUT, stem)
    return rec


def _children() -> tuple[Child, Child]:
    # one host: UCX on loopback (CMA does the copies); quiet NIXL; inherited by both children
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    prod, cons = start_all(Child("bench._xfer", "Producer", name="bench-producer"),
                           Child("bench._xfer", "Consumer", name="bench-consumer"), timeout_s=300)
    return prod, cons


def run(quick: bool, log: Callable[[str], None], which: set[str], smoke: bool = False) -> dict[str, dict[str, Any]]:
    """Run the requested ones of P1/P2 (one run) and P3 between one pair of child processes
    (``smoke``: the test suite's shape, smaller than ``quick``)."""
    out: dict[str, dict[str, Any]] = {}
    prod, cons = _children()
    try:
        if which & {"P1", "P2"}:
            out.update(run_p1p2(quick, log, prod, cons, smoke))
        if "P3" in which:
            out.update(run_p3(quick, log, prod, cons, smoke))
    finally:
        cons.close()  # consumer first: the producer then sees a clean disconnect, not a dead peer
        prod.close()
    return {k: v for k, v in out.items() if k in which}


def run_p1p2(quick: bool, log: Callable[[str], None], prod: Child, cons: Child,
             smoke: bool = False) -> dict[str, dict[str, Any]]:
    import tempfile

    from kvtier.manager import MAX_BATCH_BYTES

    keydir = tempfile.TemporaryDirectory(prefix="kvtier-bench-keys-")
    pcfgs, ccfgs = _pairs(_curve_configs(keydir.name))
    pairs = list(pcfgs)  # zmq, curve, nodigest[, nixl, nixl_nodigest]
    nixl_on = "nixl" in pairs
    reps = 1 if smoke else 2 if quick else 7
    target_bytes = (8 if quick else 128) * MiB
    kmax = 40 if quick else 200
    grid = _grid(quick, smoke)
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    meter = CpuMeter()
    t_start = time.monotonic()
    profiles: dict[str, Any] | None = None
    try:
        raw_port = prod.hello["raw_port"]
        for bs in sorted({bs for bs, _ in grid}):
            ns = [n for b, n in grid if b == bs]
            nmax = max(ns)
            addrs = prod.call("setup", block_bytes=bs, num_blocks=nmax, configs=pcfgs)
            # the consumer's pool holds WINDOW requests' slots for the windowed NIXL run
            cons.call("setup", block_bytes=bs, num_blocks=nmax * (WINDOW if nixl_on else 1), producers=addrs,
                      raw_port=raw_port, configs=ccfgs, copy_source=True)
            store_digest = prod.call("digest_rate", nblocks=nmax)["bytes_per_s"]
            per_msg = max(1, MAX_BATCH_BYTES // bs)
            # warm-up: session handshakes, first-touch of buffers, code paths
            for pair in pairs:
                ids = prod.call("park", prefix=f"w{pair}{bs}", count=2, nblocks=min(nmax, 8), pair=pair)
                cons.call("kvtier", ids=ids, nblocks=min(nmax, 8), pair=pair)
            cons.call("raw", count=2, nblocks=min(nmax, 8), per_msg=per_msg)
            for n in ns:
                nbytes = n * bs
                k = max(2, min(kmax, math.ceil(target_bytes / nbytes)))
                # the 1-block cell of the smallest block: where a request's fixed cost shows
                first_cell = n == 1 and bs == min(b for b, _ in grid)
                recorder = _record(prod, cons, f"p1-{bs >> 10}KiBx1") if first_cell else None
                windowed = nixl_on and nbytes >= 8 * MiB  # P2's cells: also WINDOW requests in flight
                runs = [*pairs, *(["nixl_window"] if windowed else [])]
                secs: dict[str, list[float]] = {name: [] for name in ("raw", "copy", *runs)}
                verified = True
                for rep in range(reps):
                    ids = {pair: prod.call("park", prefix=f"p1{pair}-{bs}-{n}-{rep}", count=k, nblocks=n,
                                           pair="nixl" if pair == "nixl_window" else pair)
                           for pair in runs}
                    verify = rep == 0
                    order = ["raw", *runs]
                    if rep % 2:
                        order.reverse()
                    for what in order:
                        if what == "raw":
                            r = cons.call("raw", count=k, nblocks=n, per_msg=per_msg, verify=verify)
                        else:
                            if what == "nixl_window":  # into WINDOW slot ranges: checked by digest only
                                r = cons.call("kvtier", ids=ids[what], nblocks=n, pair="nixl", window=WINDOW)
                            else:
                                r = cons.call("kvtier", ids=ids[what], nblocks=n, verify=verify, pair=what)
                            if r["failures"]:
                                problems.append(f"{fmt_bytes(bs)}x{n}: {what} loads failed: {r['failures'][:3]}")
                        secs[what].append(r["seconds"])
                        if verify and not r.get("verified", True):
                            verified = False
                            problems.append(f"{fmt_bytes(bs)}x{n}: {what} landed wrong bytes")
                    secs["copy"].append(cons.call("copy", count=k, nblocks=n)["seconds"])
                if recorder is not None:
                    profiles = recorder.stop()
                moved = k * nbytes
                gbps = lambda ss: summary([moved / s / 1e9 for s in ss])  # noqa: E731
                kv_s, raw_s, cp_s = secs["zmq"], secs["raw"], secs["copy"]
                row = {
                    "block_bytes": bs,
                    "blocks": n,
                    "request_bytes": nbytes,
                    "requests_per_sample": k,
                    "bytes_per_sample": moved,
                    "blocks_per_message": per_msg,
                    "kvtier_gbps": gbps(kv_s),
                    "kvtier_curve_gbps": gbps(secs["curve"]),
                    "curve_vs_plain": paired_ratio(kv_s, secs["curve"]),
                    "kvtier_nodigest_gbps": gbps(secs["nodigest"]),
                    # throughput with the digest / without it, pairwise (1 - this = the digest's cost)
                    "digest_vs_none": paired_ratio(secs["nodigest"], kv_s),
                    "store_digest_gbps": store_digest / 1e9,
                    "raw_zmq_gbps": gbps(raw_s),
                    "copy_gbps": gbps(cp_s),
                    "kvtier_request_s": summary([s / k for s in kv_s]),
                    "raw_request_s": summary([s / k for s in raw_s]),
                    # throughput ratio = inverse time ratio, pairwise
                    "ratio_vs_raw": paired_ratio(raw_s, kv_s),
                    "ratio_vs_copy": paired_ratio(cp_s, kv_s),
                    "verified": verified,
                }
                if "nixl" in secs:
                    nx = secs["nixl"]
                    row.update({
                        "kvtier_nixl_gbps": gbps(nx),
                        "nixl_request_s": summary([s / k for s in nx]),
                        "nixl_vs_raw": paired_ratio(raw_s, nx),
                        "nixl_vs_copy": paired_ratio(cp_s, nx),
                        "nixl_vs_plain": paired_ratio(kv_s, nx),
                        "kvtier_nixl_nodigest_gbps": gbps(secs["nixl_nodigest"]),
                        "nixl_nodigest_vs_copy": paired_ratio(cp_s, secs["nixl_nodigest"]),
                        "nixl_digest_vs_none": paired_ratio(secs["nixl_nodigest"], nx),
                    })
                if windowed:
                    row.update({
                        "kvtier_nixl_window_gbps": gbps(secs["nixl_window"]),
                        "nixl_window_vs_copy": paired_ratio(cp_s, secs["nixl_window"]),
                    })
                rows.append(row)
                log(
                    f"P1 {fmt_bytes(bs):>7} x {n:<3}: kvtier {row['kvtier_gbps']['median']:.2f} GB/s, "
                    f"raw {row['raw_zmq_gbps']['median']:.2f}, copy_ {row['copy_gbps']['median']:.2f}, "
                    f"ratio {row['ratio_vs_raw']['median']:.2f}, CURVE {row['kvtier_curve_gbps']['median']:.2f} GB/s"
                    + (f", NIXL {row['kvtier_nixl_gbps']['median']:.2f} GB/s "
                       f"({row['nixl_vs_copy']['median']:.2f}x copy_; without digests "
                       f"{row['kvtier_nixl_nodigest_gbps']['median']:.2f} GB/s, "
                       f"{row['nixl_nodigest_vs_copy']['median']:.2f}x copy_)" if "nixl" in secs else "")
                )
        pstats = prod.call("stats")
    finally:
        noise = meter.stop()
        keydir.cleanup()
    wall = time.monotonic() - t_start
    nixl = "nixl" in pairs

    def headline(key: str, of: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        meds = [r[key]["median"] for r in (rows if of is None else of)]
        return {"median": summary(meds)["median"], "min": min(meds), "max": max(meds), "n": len(meds),
                "over": "cells (each a median of interleaved pairs)"}

    r1 = headline("ratio_vs_raw")
    below = [r for r in rows if r["ratio_vs_raw"]["median"] < 0.8]
    big = [r for r in rows if r["request_bytes"] >= 8 * MiB]
    one = [r for r in rows if r["blocks"] == 1]
    r1_big = headline_of(big, "ratio_vs_raw") if big else None
    worst = min(rows, key=lambda r: r["ratio_vs_raw"]["median"])
    best_kv = max(rows, key=lambda r: r["kvtier_gbps"]["median"])
    best_raw = max(rows, key=lambda r: r["raw_zmq_gbps"]["median"])
    t1 = target(">=", 0.8, worst["ratio_vs_raw"]["median"], "≥ 0.8× raw pyzmq in every cell")
    # a 1-block request within 2x a raw round trip plus byte time, i.e. within
    # 2x the raw pyzmq request→block exchange of the same cell (throughput ratio >= 0.5)
    fixed = {"zmq": headline("ratio_vs_raw", one)}
    targets = [t1, target(">=", 0.5, fixed["zmq"]["min"], "1-block requests (zmq) ≤ 2× a raw request/reply with the block")]
    if nixl:
        fixed["nixl"] = headline("nixl_vs_raw", one)
        targets.append(target(">=", 0.5, fixed["nixl"]["min"],
                              "1-block requests (nixl) ≤ 2× a raw request/reply with the block"))
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
        "nixl": ({"label": "NIXL plane vs raw pyzmq (same run, paired)", **headline("nixl_vs_raw"),
                  "vs_plain": headline("nixl_vs_plain"),
                  "best_gbps": max(r["kvtier_nixl_gbps"]["median"] for r in rows)} if nixl else None),
        "one_block_vs_raw": fixed,
        "integrity": {
            "label": "integrity xxh3_64 vs none: zmq-plane throughput ratio (same run, paired)",
            **headline("digest_vs_none"),
            "cost": 1.0 - headline("digest_vs_none")["median"],
            "cost_large": (1.0 - headline_of(big, "digest_vs_none")["median"]) if big else None,
            "cost_worst_cell": 1.0 - min(r["digest_vs_none"]["median"] for r in rows),
            "store_digest_gbps": {fmt_bytes(r["block_bytes"]): r["store_digest_gbps"] for r in rows},
            "target": target("<=", DIGEST_COST_TARGET, 1.0 - headline("digest_vs_none")["median"],
                             "digest costs ≤ 10 % of the zmq plane's throughput (median over cells): on by default"),
        },
        "targets": targets,
        "cells_meeting_target": f"{len(rows) - len(below)}/{len(rows)}",
        "worst_cell": {"block_bytes": worst["block_bytes"], "blocks": worst["blocks"],
                       "ratio": worst["ratio_vs_raw"]["median"]},
        "rows": rows,
        "problems": problems,
        "producer": pstats,
        "profiles": profiles,
        "noise": noise,
        "wall_s": round(wall, 1),
        "method": (
            f"{reps} interleaved repeats per cell (order reverses every repeat); a repeat = k sequential "
            f"requests of n blocks (k*n*block ≈ {fmt_bytes(target_bytes)}, 2 ≤ k ≤ {kmax}); "
            "kvtier: submit_load → JobResult(success); raw: DEALER request → ROUTER streams the same "
            "frames (same grouping per message, zero-copy) → recv_into the same pool slots. Pairs of "
            f"managers over the same pools, interleaved in every repeat: {', '.join(pairs)} (curve: "
            "auth='curve', libzmq CURVE; nodigest: integrity='none', no per-block XXH3-64 digest taken at "
            "store or checked on landing; nixl: data_plane='nixl', NIXL 1.5 / UCX CMA one-sided WRITEs). The "
            "timed load includes the consumer's check; the producer's digest is taken at submit_store "
            "(before the timed load), so its rate is measured separately over the same blocks "
            "(store_digest_gbps)."
        ),
    }
    r2 = headline("ratio_vs_copy")
    best_cp = max(rows, key=lambda r: r["copy_gbps"]["median"])
    p2_targets = [{"text": "zmq: none (reported)", "op": None, "value": None, "achieved": r2["median"], "met": None}]
    if nixl and big:
        worst_big = min(r["nixl_vs_copy"]["median"] for r in big)
        p2_targets.append(target(">=", 0.6, worst_big,
                                 "nixl ≥ 0.6× torch copy_ for every request ≥ 8 MiB (one request at a time)"))
        worst_win = min(r["nixl_window_vs_copy"]["median"] for r in big)
        p2_targets.append(target(">=", 0.6, worst_win,
                                 f"nixl ≥ 0.6× torch copy_ for every request ≥ 8 MiB ({WINDOW} requests in flight)"))
    p2 = {
        "id": "P2",
        "title": "Same-host throughput: kvtier cross-process vs torch copy_ of the same bytes",
        "status": "ok" if not problems else "problems",
        "kvtier": {"label": "best cell" + (" (nixl)" if nixl else ""), "unit": "GB/s",
                   "value": max(r["kvtier_nixl_gbps" if nixl else "kvtier_gbps"]["median"] for r in rows)},
        "baseline": {"label": "torch copy_, best cell", "value": best_cp["copy_gbps"]["median"], "unit": "GB/s"},
        "ratio": headline("nixl_vs_copy") if nixl else r2,
        "ratio_zmq": r2,
        "ratio_large": headline_of(big, "ratio_vs_copy") if big else None,
        "ratio_large_nixl": headline_of(big, "nixl_vs_copy") if (big and nixl) else None,
        "ratio_large_nixl_window": headline_of(big, "nixl_window_vs_copy") if (big and nixl) else None,
        "ratio_large_nixl_nodigest": headline_of(big, "nixl_nodigest_vs_copy") if (big and nixl) else None,
        "nixl_digest_cost_large": (1.0 - headline_of(big, "nixl_digest_vs_none")["median"]) if (big and nixl) else None,
        "targets": p2_targets,
        "rows": [
            {"block_bytes": r["block_bytes"], "blocks": r["blocks"], "kvtier_gbps": r["kvtier_gbps"],
             "copy_gbps": r["copy_gbps"], "ratio_vs_copy": r["ratio_vs_copy"],
             **({"kvtier_nixl_gbps": r["kvtier_nixl_gbps"], "nixl_vs_copy": r["nixl_vs_copy"],
                 "nixl_nodigest_vs_copy": r["nixl_nodigest_vs_copy"]} if nixl else {}),
             **({"kvtier_nixl_window_gbps": r["kvtier_nixl_window_gbps"],
                 "nixl_window_vs_copy": r["nixl_window_vs_copy"]} if "nixl_window_vs_copy" in r else {})}
            for r in rows
        ],
        "noise": noise,
        "wall_s": round(wall, 1),
        "method": "same run as P1: after each repeat of the planes and raw, per-block torch copy_ (1 thread) of "
        "the same number of bytes into the same pool slots, from a pre-faulted source region. The headline "
        "ratio is the NIXL plane's when NIXL is installed (zmq: ratio_zmq), one request at a time (each "
        f"request's fixed cost on the clock); for requests ≥ 8 MiB the NIXL plane is also run with {WINDOW} "
        "requests in flight, each into its own slots (nixl_window: how an engine with many requests loads), "
        "and without digests (nixl_nodigest).",
    }
    return {"P1": p1, "P2": p2}


def headline_of(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    meds = [r[key]["median"] for r in rows]
    return {"median": summary(meds)["median"], "min": min(meds), "max": max(meds), "n": len(meds),
            "over": "cells with requests ≥ 8 MiB"}


def run_p3(quick: bool, log: Callable[[str], None], prod: Child, cons: Child,
           smoke: bool = False) -> dict[str, dict[str, Any]]:
    planes = ["zmq"] + (["nixl"] if _nixl_available() is None else [])
    batches = 2 if quick else 6
    per_batch = 10 if smoke else 30 if quick else 200
    bs, nblocks = 64 * KiB, 4
    reap_s = 0.05
    meter = CpuMeter()
    t_start = time.monotonic()
    per: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    profiles: dict[str, Any] = {}
    try:
        for plane in planes:
            kv_all, raw_all, batch_ratios, reasons, states_before, states_after = [], [], [], [], [], []
            floor_all, floor_reasons = [], []
            pcfg = dict(PRODUCER_CONFIG, unbound_store_timeout_s=reap_s, data_plane=plane)
            addrs = prod.call("setup", block_bytes=bs, num_blocks=nblocks, configs={"zmq": pcfg})
            cons.call("setup", block_bytes=bs, num_blocks=nblocks, producers=addrs, raw_port=prod.hello["raw_port"],
                      configs={"zmq": dict(CONSUMER_CONFIG, data_plane=plane)}, floor_port=prod.call("floor"))
            # warm up the session and both paths with a real (successful) load and a few round trips
            ids = prod.call("park", prefix=f"w{plane}", count=1, nblocks=nblocks)
            cons.call("kvtier", ids=ids, nblocks=nblocks)
            cons.call("rtt", count=50)
            recorder = _record(prod, cons, f"p3-{plane}")
            for b in range(batches):
                ids = prod.call("park", prefix=f"late{plane}{b}", count=per_batch, nblocks=nblocks)
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
                floor_all.extend(r["floor"])
                floor_reasons.extend(r["floor_reasons"])
                batch_ratios.append(summary(r["kvtier"])["median"] / summary(r["raw"])["median"])
                log(f"P3 {plane} batch {b}: kvtier late-fetch {summary(r['kvtier'])['median'] * 1e6:.0f} µs, "
                    f"raw RTT {summary(r['raw'])['median'] * 1e6:.0f} µs, "
                    f"Python floor {summary(r['floor'])['median'] * 1e6:.0f} µs")
            if recorder is not None:
                profiles.update(recorder.stop())
            n_reaped = sum(1 for x in reasons if x == "reaped")
            if n_reaped != len(reasons):
                problems.append(f"{plane}: {len(reasons) - n_reaped} late loads did not fail with 'reaped': "
                                f"{sorted({str(x) for x in reasons if x != 'reaped'})}")
            if any(x != "reaped" for x in floor_reasons):
                problems.append(f"{plane}: the floor server answered {sorted(set(floor_reasons) - {'reaped'})}")
            if any(s != "tombstoned" for s in states_before + states_after):
                problems.append(f"{plane}: some ids were not tombstoned on the producer")
            kv, raw, fl = summary(kv_all), summary(raw_all), summary(floor_all)
            per[plane] = {
                "kvtier_latency_s": kv, "raw_rtt_s": raw, "floor_s": fl,
                "floor_over_raw": fl["median"] / raw["median"], "kvtier_over_floor": kv["median"] / fl["median"],
                "ratio": {"median": summary(batch_ratios)["median"], "min": min(batch_ratios),
                          "max": max(batch_ratios), "n": len(batch_ratios), "over": "batches (ratio of batch medians)"},
                "failed_with_reaped": f"{n_reaped}/{len(reasons)}",
                "producer_tombstoned": f"{sum(s == 'tombstoned' for s in states_after)}/{len(states_after)}",
                "samples": {"kvtier_us": [x * 1e6 for x in kv_all], "raw_us": [x * 1e6 for x in raw_all]},
                "p99_ratio": kv.get("p99", math.nan) / raw.get("p99", math.nan) if "p99" in kv else None,
            }
    finally:
        noise = meter.stop()
    z = per["zmq"]
    n_ok = sum(int(p["failed_with_reaped"].split("/")[0]) for p in per.values())
    n_all = sum(int(p["failed_with_reaped"].split("/")[1]) for p in per.values())
    targets = [target("<=", 3.0, z["ratio"]["median"], "≤ 3× a raw round trip")]
    for plane, p in per.items():
        targets.append(target("<=", 2.0, p["ratio"]["median"], f"{plane}: ≤ 2× a raw round trip"))
    return {
        "P3": {
            "id": "P3",
            "title": "Late-fetch rejection latency vs a raw request/reply round trip",
            "status": "ok" if not problems else "problems",
            "kvtier": {"label": "submit_load → failed JobResult (median, zmq)",
                       "value": z["kvtier_latency_s"]["median"] * 1e6, "unit": "µs"},
            "baseline": {"label": "raw DEALER→ROUTER RTT (median)", "value": z["raw_rtt_s"]["median"] * 1e6,
                         "unit": "µs"},
            "ratio": z["ratio"],
            "targets": targets,
            "kvtier_latency_s": z["kvtier_latency_s"],
            "raw_rtt_s": z["raw_rtt_s"],
            "p99_ratio": z["p99_ratio"],
            "failed_with_reaped": f"{n_ok}/{n_all}",
            "producer_tombstoned": z["producer_tombstoned"],
            "samples": z["samples"],
            "planes": per,
            "profiles": profiles or None,
            "problems": problems,
            "noise": noise,
            "wall_s": round(time.monotonic() - t_start, 1),
            "method": (
                f"per data plane ({', '.join(per)}): producer parks {per_batch} ids x {batches} batches with "
                f"unbound_store_timeout_s={reap_s}; its background poll thread reaps them (checked: all "
                "tombstoned); the consumer then loads each id (submit_load → JobResult(success=False, "
                "reason='reaped')), does one raw round trip on a DEALER/ROUTER pair between the same two "
                "processes, and one refused fetch of the Python floor (bench/floor.py: the least any tier in "
                "Python pays: a real fetch encoded and sent, decoded by a thread sleeping in a poller, looked up "
                "in a dict of tombstones, a transfer_done encoded, sent back and decoded), back to back, rotating "
                "the order."
            ),
        }
    }
