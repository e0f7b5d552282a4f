"""matplotlib figures (Agg backend, PNG) for each benchmark result. One function per id; each
returns the file name it wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

KiB, MiB = 1 << 10, 1 << 20


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _size(n: float) -> str:
    if n >= MiB:
        return f"{n / MiB:g} MiB"
    if n >= KiB:
        return f"{n / KiB:g} KiB"
    return f"{n:g} B"


def _save(fig: Any, out: Path, name: str, suffix: str) -> str:
    fname = f"{name}{suffix}.png"
    fig.tight_layout()
    fig.savefig(out / fname, dpi=110)
    _plt().close(fig)
    return fname


def _heatmap(ax: Any, rows: list[dict[str, Any]], key: str, title: str, good: float | None, cmap: str) -> None:
    sizes = sorted({r["block_bytes"] for r in rows})
    counts = sorted({r["blocks"] for r in rows})
    import math

    grid = [[math.nan] * len(counts) for _ in sizes]
    for r in rows:
        grid[sizes.index(r["block_bytes"])][counts.index(r["blocks"])] = r[key]["median"]
    vals = [v for row in grid for v in row if not math.isnan(v)]
    im = ax.imshow(grid, cmap=cmap, aspect="auto", vmin=0, vmax=max(1.0, max(vals)) if good else max(vals))
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if not math.isnan(v):
                mark = "" if good is None else (" ✓" if v >= good else " ✗")
                ax.text(j, i, f"{v:.2f}{mark}", ha="center", va="center", fontsize=9,
                        color="black" if v > 0.5 * max(vals) else "white")
    ax.set_xticks(range(len(counts)), [str(c) for c in counts])
    ax.set_yticks(range(len(sizes)), [_size(s) for s in sizes])
    ax.set_xlabel("blocks per request")
    ax.set_ylabel("block size")
    ax.set_title(title)
    ax.figure.colorbar(im, ax=ax, shrink=0.8)


def plot_p0(r: dict[str, Any], out: Path, suffix: str) -> str:
    """Hand-off time per request size for every system and limit (left); the engine thread's CPU
    per ``submit_store`` (right)."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    names = {"seed": "vLLM p2p (NIXL)", "kvtier_nixl": "kvtier nixl", "kvtier_zmq": "kvtier zmq",
             "raw_nixl": "raw NIXL WRITE", "copy": "torch copy_"}
    styles = {"raw_nixl": ":", "copy": ":"}
    systems = [s for s in names if any(x["system"] == s for x in r["rows"])]
    for s in systems:
        rs = sorted((x for x in r["rows"] if x["system"] == s), key=lambda x: x["mib"])
        xs = [x["mib"] for x in rs]
        a.errorbar(xs, [x["load_s"]["median"] * 1e3 for x in rs],
                   yerr=[[(x["load_s"]["median"] - x["load_s"]["min"]) * 1e3 for x in rs],
                         [(x["load_s"]["max"] - x["load_s"]["median"]) * 1e3 for x in rs]],
                   marker="o", ls=styles.get(s, "-"), label=names[s], capsize=2)
        if "submit_store_cpu_s" in (rs[0] if rs else {}):
            b.plot(xs, [x["submit_store_cpu_s"]["median"] * 1e6 for x in rs], marker="o", label=names[s])
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("MiB per request (1 MiB blocks)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a.set_ylabel("consumer submit_load → result, ms (median, min–max)")
    a.set_title("P0 hand-off through vLLM's TieringOffloadingManager")
    b.set_ylabel("engine thread CPU in tier.submit_store, µs (median)")
    b.set_title("P0 the engine's thread per submit_store")
    return _save(fig, out, "p0_seed", suffix)


def plot_p1(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    rows = r["rows"]
    sizes = sorted({x["block_bytes"] for x in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, bs in enumerate(sizes):
        rs = sorted((x for x in rows if x["block_bytes"] == bs), key=lambda x: x["request_bytes"])
        xs = [x["request_bytes"] / MiB for x in rs]
        c = colors[i % len(colors)]
        a.errorbar(xs, [x["kvtier_gbps"]["median"] for x in rs],
                   yerr=[[x["kvtier_gbps"]["median"] - x["kvtier_gbps"]["min"] for x in rs],
                         [x["kvtier_gbps"]["max"] - x["kvtier_gbps"]["median"] for x in rs]],
                   color=c, marker="o", label=f"kvtier, {_size(bs)} blocks", capsize=2)
        a.plot(xs, [x["raw_zmq_gbps"]["median"] for x in rs], color=c, ls="--", marker="x",
               label=f"raw pyzmq, {_size(bs)}")
        if rs and "kvtier_nixl_gbps" in rs[0]:
            a.plot(xs, [x["kvtier_nixl_gbps"]["median"] for x in rs], color=c, ls=":", marker="s",
                   label=f"kvtier nixl, {_size(bs)}")
    a.set_xscale("log")
    a.set_xlabel("bytes per request (MiB)")
    a.set_ylabel("GB/s landed in consumer slots (median, min–max)")
    a.set_title("P1 cross-process throughput (127.0.0.1)")
    a.legend(fontsize=7, ncol=2)
    a.grid(alpha=0.3)
    _heatmap(b, rows, "ratio_vs_raw", "kvtier / raw pyzmq (target ≥ 0.8)", 0.8, "viridis")
    return _save(fig, out, "p1_throughput", suffix)


def plot_p2(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    rows = r["rows"]
    labels = [f"{_size(x['block_bytes'])}×{x['blocks']}" for x in rows]
    xs = range(len(rows))
    nixl = bool(rows) and "kvtier_nixl_gbps" in rows[0]
    w = 0.27 if nixl else 0.4
    a.bar([x - w for x in xs], [x["kvtier_gbps"]["median"] for x in rows], w, label="kvtier zmq plane")
    if nixl:
        a.bar(list(xs), [x["kvtier_nixl_gbps"]["median"] for x in rows], w, label="kvtier nixl plane")
    a.bar([x + w for x in xs], [x["copy_gbps"]["median"] for x in rows], w, label="torch copy_ (1 thread)")
    a.set_xticks(list(xs), labels, rotation=60, fontsize=8)
    a.set_ylabel("GB/s (median)")
    a.set_yscale("log")
    a.set_title("P2 kvtier vs torch copy_ of the same bytes")
    a.legend()
    a.grid(alpha=0.3, axis="y")
    if nixl:
        _heatmap(b, rows, "nixl_vs_copy", "kvtier nixl / copy_ (target ≥ 0.6 for ≥ 8 MiB)", 0.6, "magma")
    else:
        _heatmap(b, rows, "ratio_vs_copy", "kvtier / copy_ (no target)", None, "magma")
    return _save(fig, out, "p2_vs_copy", suffix)


def plot_p3(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    import numpy as np

    fig, ax = plt.subplots(figsize=(9, 4.5))
    kv, raw = r["samples"]["kvtier_us"], r["samples"]["raw_us"]
    hi = max(max(kv), max(raw))
    bins = np.logspace(np.log10(max(1.0, min(min(kv), min(raw)) * 0.8)), np.log10(hi * 1.2), 60)
    ax.hist(raw, bins=bins, alpha=0.6, label=f"raw DEALER/ROUTER RTT (median {r['baseline']['value']:.0f} µs)")
    ax.hist(kv, bins=bins, alpha=0.6,
            label=f"kvtier zmq: late fetch → failed JobResult (median {r['kvtier']['value']:.0f} µs)")
    nx = (r.get("planes") or {}).get("nixl")
    if nx:
        ax.hist(nx["samples"]["kvtier_us"], bins=bins, alpha=0.5,
                label=f"kvtier nixl (median {nx['kvtier_latency_s']['median'] * 1e6:.0f} µs)")
    ax.axvline(3 * r["baseline"]["value"], color="red", ls=":", label="target: 3× raw median")
    ax.set_xscale("log")
    ax.set_xlabel("µs")
    ax.set_ylabel("samples")
    ax.set_title(f"P3 late-fetch rejection: {r['ratio']['median']:.2f}× a raw round trip")
    ax.legend(fontsize=8)
    return _save(fig, out, "p3_late_fetch", suffix)


def plot_p4(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    items = [
        ("generated core\n(ProducerMachine)", r["core_us_per_event"]),
        ("transitions\n(triggers only)", r["transitions_triggers_only_us_per_event"]),
        ("transitions\n(model per id)", r["transitions_us_per_event"]),
    ]
    meds = [s["median"] for _, s in items]
    ax.bar(range(3), meds, yerr=[[m - s["min"] for m, (_, s) in zip(meds, items)],
                                 [s["max"] - m for m, (_, s) in zip(meds, items)]], capsize=4,
           color=["tab:green", "tab:orange", "tab:red"])
    for i, m in enumerate(meds):
        ax.text(i, m * 1.1, f"{m:.2f} µs", ha="center")
    ax.axhline(1.0, color="black", ls=":", label="target ≤ 1 µs/event")
    ax.set_xticks(range(3), [n for n, _ in items])
    ax.set_yscale("log")
    ax.set_ylabel("µs per event (median, min–max)")
    ax.set_title(f"P4 lifecycle events: core is {r['ratio']['median']:.1f}× transitions "
                 f"({r['ratio_triggers_only']['median']:.1f}× triggers only)")
    ax.legend()
    return _save(fig, out, "p4_core_events", suffix)


def plot_p5(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    rows = r["rows"]
    ns = [x["n"] for x in rows]
    for key, label, style in (
        ("core_tick_idle_us", "TierCore.tick, nothing due", "o-"),
        ("core_tick_idle_first_us", "TierCore.tick, nothing due, first after other work", "o:"),
        ("core_tick_few_due_us", f"TierCore.tick, {rows[0]['due_per_tick']:g} due", "s-"),
        ("manager_poll_zmq_us", "KvTierManager.poll(), idle zmq", "^-"),
        ("manager_poll_inproc_us", "KvTierManager.poll(), InprocTransport", "v-"),
        ("seed_scan_us", "p2p-style O(n) scan (baseline)", "x--"),
    ):
        ax.plot(ns, [x[key]["median"] for x in rows], style, label=label)
    ax.axhline(20, color="red", ls=":", label="target ≤ 20 µs")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (tombstones) + N (parked ids)")
    ax.set_ylabel("µs per tick (median)")
    ax.set_title("P5 poll tick cost vs N")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, out, "p5_tick", suffix)


def plot_p6(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    b = r["bytes_per_id"]
    items = [
        ("core parked\n(1 block)", b["core_parked_1_block"], "tab:green"),
        ("core parked\n(16 blocks)", b["core_parked_16_blocks"], "tab:olive"),
        ("core\ntombstoned", b["core_tombstoned"], "tab:green"),
        ("transitions\nparked", b["transitions_parked"], "tab:red"),
        ("transitions\ntombstoned", b["transitions_tombstoned"], "tab:red"),
    ]
    ax.bar(range(len(items)), [v for _, v, _ in items], color=[c for _, _, c in items])
    for i, (_, v, _) in enumerate(items):
        ax.text(i, v * 1.08, f"{v:,.0f} B", ha="center")
    ax.axhline(300, color="black", ls=":", label="target ≤ 300 B")
    ax.set_xticks(range(len(items)), [n for n, _, _ in items])
    ax.set_yscale("log")
    ax.set_ylabel("bytes per tracked id (tracemalloc)")
    ax.set_title("P6 bookkeeping memory per id")
    ax.legend()
    return _save(fig, out, "p6_memory", suffix)


def plot_p7(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    rows = r["rows"]
    ls = [x["prompt_tokens"] for x in rows]

    def band(ax: Any, key: str, label: str, style: str) -> None:
        med = [x[key]["median"] * 1e3 for x in rows]
        ax.plot(ls, med, style, label=label)
        ax.fill_between(ls, [x[key]["min"] * 1e3 for x in rows], [x[key]["max"] * 1e3 for x in rows], alpha=0.2)

    band(a, "recompute_s", "recompute locally (prefill + 1 decode step)", "s-")
    band(a, "fetched_s", "fetched via kvtier (load + rebuild + 1 decode step)", "o-")
    a.plot(ls, [x["fetched_load_s"]["median"] * 1e3 for x in rows], "o:", label="  of which kvtier load")
    a.plot(ls, [x["fetched_rebuild_s"]["median"] * 1e3 for x in rows], "o:", label="  of which DynamicCache rebuild")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("prompt tokens")
    a.set_ylabel("decode TTFT (ms, median, min–max)")
    a.set_title("P7 SmolLM2-135M, 1 thread per process")
    a.legend(fontsize=8)
    a.grid(alpha=0.3, which="both")
    b.plot(ls, [x["ratio"]["median"] for x in rows], "o-")
    b.axhline(1.0, color="red", ls=":", label="break-even")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("prompt tokens")
    b.set_ylabel("fetched / recompute (median of pairs)")
    wins = r.get("fetch_wins_from_tokens")
    b.set_title(f"fetch wins from {wins} tokens" if wins else "fetch does not win")
    b.legend()
    b.grid(alpha=0.3, which="both")
    return _save(fig, out, "p7_pd_ttft", suffix)


def plot_p8(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    res = r["result"]
    tl = res["timeline"]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    ts = [x["t"] for x in tl]
    a.plot(ts, [x["heap"] for x in tl], lw=3, alpha=0.5, label="deadline heap entries")
    a.plot(ts, [x["records"] for x in tl], "--", label="producer records (parked + tombstoned)")
    a.plot(ts, [x["retained"] for x in tl], label="retained (tombstones)")
    a.set_ylabel("count")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    a.set_title(f"P8 {res['ids']:,} ids at 10k ids per virtual second: {res['ids_per_s']:,.0f} ids/s wall")
    b.plot(ts, [x["rss_mib"] for x in tl], "k-", label="RSS")
    b.axhline(res["rss_baseline_mib"], color="gray", ls=":", label="RSS before")
    trim = res.get("rss_after_malloc_trim_mib")
    if trim:
        b.axhline(trim, color="tab:green", ls="--", label="RSS after malloc_trim(0)")
    b.set_xlabel("virtual seconds")
    b.set_ylabel("MiB")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    return _save(fig, out, "p8_scale", suffix)


def plot_p9(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    rows = r["probe_rtt"]
    ks = [x["keys"] for x in rows]
    for key, label, style in (("probe_us", "probe round (lookup → HIT)", "o-"), ("raw_us", "raw pyzmq round trip", "s--")):
        a.plot(ks, [x[key]["median"] for x in rows], style, label=label)
        a.fill_between(ks, [x[key]["min"] for x in rows], [x[key]["max"] for x in rows], alpha=0.2)
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("keys per probe")
    a.set_ylabel("µs (median, min–max)")
    a.set_title("P9 probe round trip vs raw")
    a.legend(fontsize=8)
    a.grid(alpha=0.3, which="both")
    shared = r.get("shared_prefix") or []
    if shared:
        ls = [x["shared_tokens"] for x in shared]
        for key, label, style in (("recompute_ms", "compute the whole prompt", "s-"),
                                  ("fetched_ms", "fetch the shared prefix from a peer", "o-")):
            b.plot(ls, [x[key]["median"] for x in shared], style, label=label)
            b.fill_between(ls, [x[key]["min"] for x in shared], [x[key]["max"] for x in shared], alpha=0.2)
        b.set_xlabel("shared system prompt (tokens)")
        b.set_ylabel("TTFT ms (median, min–max)")
        b.legend(fontsize=8)
        b.grid(alpha=0.3)
    b.set_title("P9 shared-prefix TTFT, SmolLM2-135M" if shared else "P9 shared prefix: model not installed")
    return _save(fig, out, "p9_symmetric", suffix)


def plot_p10(r: dict[str, Any], out: Path, suffix: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    calls = list(r["calls"])
    xs = range(len(calls))
    for i, (key, label) in enumerate((("median", "p50"), ("p99", "p99"), ("max", "max"))):
        ax.bar([x + (i - 1) * 0.27 for x in xs],
               [r["calls"][c]["wall_s"].get(key, r["calls"][c]["wall_s"]["max"]) * 1e6 for c in calls], 0.27, label=label)
    ax.axhline(500, color="k", ls="--", lw=1, label="p99 target (0.5 ms)")
    ax.set_xticks(list(xs), calls, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("wall µs on the engine thread")
    ax.set_title("P10 engine-call latency under load (256 MiB transfer, 100 idle sessions)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both", axis="y")
    return _save(fig, out, "p10_engine_calls", suffix)


def plot_summary(results: dict[str, dict[str, Any]], out: Path, suffix: str) -> str:
    """One bar per target: achieved / target, oriented so that ≥ 1 means met."""
    plt = _plt()
    labels, vals, colors = [], [], []
    for bid, r in results.items():
        for t in r.get("targets") or ([r["target"]] if r.get("target") else []):
            if not t or t.get("op") not in (">=", "<=") or t.get("achieved") is None:
                continue
            a, v = t["achieved"], t["value"]
            score = a / v if t["op"] == ">=" else (v / a if a else float("inf"))
            labels.append(f"{bid}: {t['text']}")
            vals.append(score)
            colors.append("tab:green" if score >= 1 else "tab:red")
    fig, ax = plt.subplots(figsize=(10, 0.45 * max(4, len(vals)) + 1))
    ax.barh(range(len(vals)), vals, color=colors)
    ax.axvline(1.0, color="black", ls=":")
    ax.set_yticks(range(len(vals)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("achieved / target (≥ 1: met)")
    ax.set_title("kvtier benchmark targets")
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    return _save(fig, out, "summary", suffix)


PLOTS: dict[str, Callable[[dict[str, Any], Path, str], str]] = {
    "P0": plot_p0, "P1": plot_p1, "P2": plot_p2, "P3": plot_p3, "P4": plot_p4,
    "P5": plot_p5, "P6": plot_p6, "P7": plot_p7, "P8": plot_p8, "P9": plot_p9, "P10": plot_p10,
}
