"""Headline table (rich, for the terminal) and Markdown tables (``summary.md``) from the results."""

from __future__ import annotations

from typing import Any

from bench._util import fmt_bytes, fmt_ratio

KiB, MiB = 1 << 10, 1 << 20

#: The command that renders the suite's generated blocks in docs/benchmarks.md.
SUMMARY_COMMAND = "python -m bench --summary"


def _val(d: dict[str, Any] | None) -> str:
    if not d or d.get("value") is None:
        return "—"
    v, unit = d["value"], d.get("unit", "")
    if unit in ("ids/s", "blocks"):
        s = f"{v:,.0f}"
    elif abs(v) >= 100:
        s = f"{v:,.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.3g}"
    return f"{s} {unit}".strip()


def _met(t: dict[str, Any]) -> str:
    return {True: "yes", False: "NO", None: "—"}[t.get("met")]


def _targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    ts = r.get("targets")
    if ts:
        return ts
    return [r["target"]] if r.get("target") else []


def _ach(t: dict[str, Any]) -> str:
    a = t.get("achieved")
    if a is None:
        return "—"
    return f"{a:.3g}"


def headline_rows(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per benchmark: what kvtier did, the baseline measured beside it, their ratio."""
    rows = []
    for bid, r in results.items():
        if r.get("status") in ("error", "skipped"):
            rows.append([bid, r.get("title", ""), "—", "—", r.get("status", "")])
            continue
        rows.append([
            bid,
            r["title"],
            f"{_val(r.get('kvtier'))} ({r.get('kvtier', {}).get('label', '')})",
            f"{_val(r.get('baseline'))} ({r.get('baseline', {}).get('label', '')})",
            fmt_ratio(r.get("ratio")),
        ])
    return rows


HEAD = ["ID", "benchmark", "kvtier", "baseline (same run)", "ratio median (min–max)"]


def target_rows(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per target of every benchmark, in order: the goal, the figure achieved, met."""
    rows = []
    for bid, r in results.items():
        if r.get("status") in ("error", "skipped"):
            rows.append([bid, "—", r.get("status", ""), "—"])
            continue
        for t in _targets(r):
            rows.append([bid, t["text"], _ach(t), _met(t)])
    return rows


TARGET_HEAD = ["ID", "target", "figure", "met"]


def targets_markdown(results: dict[str, dict[str, Any]]) -> str:
    """The one-line-per-target table (``summary.md``'s first table, and docs/benchmarks.md's)."""
    rows = target_rows(results)
    met = sum(1 for r in rows if r[-1] == "yes")
    missed = sum(1 for r in rows if r[-1] == "NO")
    return (_md_table(TARGET_HEAD, rows)
            + f"\n\n{len(rows)} targets: {met} met, {missed} missed, {len(rows) - met - missed} reported only.")


def _span(xs: list[float]) -> str:
    lo, hi = f"{min(xs):.2f}", f"{max(xs):.2f}"
    return lo if lo == hi else f"{lo}–{hi}"


def run_markdown(meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    """The run in two lines: command, machine, and the load around it (from the results' own
    records: the 1-minute load average at the start, and at the end of each benchmark)."""
    m = meta["machine"]
    start = m.get("loadavg_at_start") or []
    ends = {bid: r["noise"]["loadavg_1m"] for bid, r in results.items() if (r.get("noise") or {}).get("loadavg_1m")}
    others = [r["noise"]["others_cores"] for r in results.values() if r.get("noise")]
    return "\n".join([
        f"Command: `{meta['command']}` — started {meta['started']}, {meta['wall_s']:.0f} s.",
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}{', under a hypervisor' if m.get('hypervisor') else ''}), "
        f"{m['ram_gib']} GiB RAM, Linux {m['kernel']}; Python {m['python']}, torch {m['torch']}, "
        f"pyzmq {m['pyzmq']} (libzmq {m['libzmq']}), transitions {m['transitions']}, msgspec {m['msgspec']}, "
        f"transformers {m['transformers']}.",
        "",
        "Load: 1-minute load average " + (f"{start[0]:.2f} at the start (5 and 15 minutes: {start[1]:.2f}, "
                                          f"{start[2]:.2f})" if len(start) == 3 else "not recorded at the start")
        + ("; at the end of each benchmark " + ", ".join(f"{b} {v:.1f}" for b, v in ends.items())
           + " (the suite's own processes included)" if ends else "")
        + (f"; other processes used {_span(others)} cores while the benchmarks ran." if others else "."),
    ])


def print_table(results: dict[str, dict[str, Any]], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = console or Console(width=200)
    t = Table(title="kvtier benchmarks — ratios measured side by side in this run", show_lines=False)
    for h in HEAD:
        t.add_column(h, overflow="fold")
    for row in headline_rows(results):
        t.add_row(*row)
    con.print(t)
    t = Table(title="targets", show_lines=False)
    for h in TARGET_HEAD:
        t.add_column(h, overflow="fold")
    for row in target_rows(results):
        met = row[-1]
        t.add_row(*row[:-1], {"yes": "[green]yes[/]", "NO": "[red]NO[/]"}.get(met, met))
    con.print(t)


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


def _mmm(s: dict[str, Any], scale: float = 1.0, fmt: str = "{:.3g}") -> str:
    return f"{fmt.format(s['median'] * scale)} ({fmt.format(s['min'] * scale)}–{fmt.format(s['max'] * scale)})"


def markdown(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    """``summary.md``: the run, one line per target, one line per benchmark, then every table."""
    parts = [
        f"# kvtier benchmark results ({meta.get('shape') or ('quick' if meta['quick'] else 'full')} run)",
        "",
        "Written by the suite from its results (`python -m bench`; `python -m bench --summary` rewrites it "
        "from the committed `results.json`).",
        "",
        run_markdown(meta, results),
        "",
        "## Targets",
        "",
        targets_markdown(results),
        "",
        "## Benchmarks",
        "",
        _md_table(HEAD, headline_rows(results)),
        "",
        "Noise: cores used by *other* processes while each benchmark ran (from /proc/stat; quiet < 0.25):",
        "",
        _md_table(["ID", "others' cores", "our cores", "quiet", "wall s"], [
            [bid, f"{r['noise']['others_cores']:.2f}", f"{r['noise']['our_cores']:.2f}",
             "yes" if r["noise"]["quiet"] else "no", f"{r.get('wall_s', 0):.0f}"]
            for bid, r in results.items() if r.get("noise")
        ]),
    ]
    for bid, r in results.items():
        fn = _DETAIL.get(bid)
        if fn is None or r.get("status") in ("error", "skipped"):
            continue
        method = "" if bid == "P0" else r.get("method", "")  # P0's method is its rendered tables
        parts += ["", f"## {bid}: {r['title']}", "", method, "", fn(r)]
        if r.get("problems"):
            parts += ["", "Problems: " + "; ".join(r["problems"])]
    return "\n".join(parts) + "\n"


def _opt(x: dict[str, Any], key: str, **kw: Any) -> str:
    return _mmm(x[key], **kw) if key in x else "—"


def _p0(r: dict[str, Any]) -> str:
    from bench.seed import render

    return render(r)


def _p1(r: dict[str, Any]) -> str:
    rows = [[fmt_bytes(x["block_bytes"]), str(x["blocks"]), fmt_bytes(x["request_bytes"]),
             str(x["requests_per_sample"]), _mmm(x["kvtier_gbps"]), _opt(x, "kvtier_nixl_gbps"),
             _mmm(x["raw_zmq_gbps"]), _mmm(x["ratio_vs_raw"]), _opt(x, "nixl_vs_raw"),
             f"{x['kvtier_request_s']['median'] * 1e3:.2f}",
             f"{x['nixl_request_s']['median'] * 1e3:.2f}" if "nixl_request_s" in x else "—",
             f"{x['raw_request_s']['median'] * 1e3:.2f}",
             _opt(x, "kvtier_curve_gbps"), _opt(x, "curve_vs_plain"),
             "yes" if x["verified"] else "NO"]
            for x in r["rows"]]
    curve, nixl, one, integ = r.get("curve"), r.get("nixl"), r.get("one_block_vs_raw") or {}, r.get("integrity")
    return _md_table(["block", "blocks", "request", "requests/sample", "zmq GB/s", "nixl GB/s", "raw pyzmq GB/s",
                      "zmq/raw", "nixl/raw", "zmq ms/request", "nixl ms/request", "raw ms/request", "CURVE GB/s",
                      "CURVE/plain", "bytes verified"], rows) + (
        f"\n\nCells meeting ≥ 0.8×: {r['cells_meeting_target']}; over requests ≥ 8 MiB: "
        f"{fmt_ratio(r.get('ratio_large'))}." + (
            f" CURVE on vs off (same run): {fmt_ratio(curve)}." if curve else "") + (
            f" NIXL plane vs raw pyzmq: {fmt_ratio(nixl)}; vs the zmq plane: {fmt_ratio(nixl['vs_plain'])}."
            if nixl else "") + "".join(
            f" 1-block requests, {plane}/raw: {fmt_ratio(v)}." for plane, v in one.items()) + (
            f" Integrity digest on vs off (same run): {fmt_ratio(integ, 3)} of the throughput, i.e. a cost of "
            f"{integ['cost'] * 100:.1f} % (median over cells; worst cell {integ['cost_worst_cell'] * 100:.1f} %); "
            "store-side XXH3-64 rate: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in integ["store_digest_gbps"].items())
            + "." if integ else ""))


def _p2(r: dict[str, Any]) -> str:
    rows = [[fmt_bytes(x["block_bytes"]), str(x["blocks"]), _mmm(x["kvtier_gbps"]), _opt(x, "kvtier_nixl_gbps"),
             _mmm(x["copy_gbps"]), _mmm(x["ratio_vs_copy"], fmt="{:.3f}"), _opt(x, "nixl_vs_copy", fmt="{:.3f}"),
             _opt(x, "nixl_nodigest_vs_copy", fmt="{:.3f}"), _opt(x, "nixl_window_vs_copy", fmt="{:.3f}")]
            for x in r["rows"]]
    tail = ""
    if r.get("ratio_large_nixl"):
        tail = (f"\n\nRequests ≥ 8 MiB: nixl/copy_ {fmt_ratio(r['ratio_large_nixl'])} one request at a time, "
                f"{fmt_ratio(r.get('ratio_large_nixl_window'))} with several in flight, "
                f"{fmt_ratio(r.get('ratio_large_nixl_nodigest'))} without digests (digest cost "
                f"{(r.get('nixl_digest_cost_large') or 0) * 100:.1f} %); "
                f"zmq/copy_ {fmt_ratio(r.get('ratio_large'))}.")
    return _md_table(["block", "blocks", "zmq GB/s", "nixl GB/s", "torch copy_ GB/s", "zmq/copy_", "nixl/copy_",
                      "nixl no digest/copy_", "nixl in flight/copy_"], rows) + tail


def _p3(r: dict[str, Any]) -> str:
    paths = []
    for plane, p in (r.get("planes") or {"zmq": r}).items():
        paths += [(f"{plane}: kvtier late fetch → failed JobResult", p["kvtier_latency_s"]),
                  (f"{plane}: raw DEALER/ROUTER round trip (same batches)", p["raw_rtt_s"])]
        if "floor_s" in p:  # results written before the floor existed have none
            paths.append((f"{plane}: Python floor, a refused fetch (same batches)", p["floor_s"]))
    rows = [[name, f"{s['median'] * 1e6:.0f}", f"{s.get('p90', float('nan')) * 1e6:.0f}",
             f"{s.get('p99', float('nan')) * 1e6:.0f}", f"{s['min'] * 1e6:.0f}", str(s["n"])]
            for name, s in paths]
    floors = "; ".join(
        f"{plane}: floor {p['floor_over_raw']:.2f}× raw, kvtier {p['kvtier_over_floor']:.2f}× the floor"
        for plane, p in (r.get("planes") or {}).items() if "floor_over_raw" in p)
    return _md_table(["path", "median µs", "p90 µs", "p99 µs", "min µs", "n"], rows) + (
        f"\n\nFailed with reason `reaped`: {r['failed_with_reaped']}; producer still tombstoned: "
        f"{r['producer_tombstoned']}." + (
            f" The Python floor (`bench/floor.py`: a real `fetch` encoded, sent, decoded, looked up in a dict of "
            f"tombstones and refused by a thread sleeping in a poller, medians): {floors}." if floors else ""))


def _p4(r: dict[str, Any]) -> str:
    rows = [[name, _mmm(s), f"{1e6 / s['median']:,.0f}"] for name, s in (
        ("generated core (ProducerMachine)", r["core_us_per_event"]),
        ("transitions, triggers only", r["transitions_triggers_only_us_per_event"]),
        ("transitions, one model per id", r["transitions_us_per_event"]),
        ("floor: bare dict[(state, event)] transition", r["dict_floor_us_per_transition"]),
    )]
    return _md_table(["implementation", "µs/event", "events/s"], rows) + (
        f"\n\nSpeed-up (paired): {fmt_ratio(r['ratio'])} vs model-per-id; "
        f"{fmt_ratio(r['ratio_triggers_only'])} vs triggers only. Core / floor: {fmt_ratio(r['core_over_floor'], 1)}; "
        "core scaled to a faster reference machine (its dict floor: 0.063 µs): "
        f"{r['core_us_scaled_to_limits_machine']:.2f} µs/event.")


def _p5(r: dict[str, Any]) -> str:
    rows = [[f"{x['n']:,}", f"{x['records']:,}", _mmm(x["core_tick_idle_us"], fmt="{:.1f}"),
             _mmm(x["core_tick_idle_first_us"], fmt="{:.1f}"), _mmm(x["core_tick_few_due_us"], fmt="{:.1f}"),
             _mmm(x["seed_scan_us"], fmt="{:.0f}"), _mmm(x["manager_poll_zmq_us"], fmt="{:.1f}"),
             _mmm(x["manager_poll_inproc_us"], fmt="{:.1f}")] for x in r["rows"]]
    f = r["flatness"]
    return _md_table(["N", "records", "tick idle µs", "tick idle, first µs", "tick 5 due µs", "seed scan µs",
                      "manager.poll zmq µs", "manager.poll inproc µs"], rows) + (
        f"\n\nFlatness (largest N / smallest N): tick idle {f['tick_idle']:.2f}, tick 5 due "
        f"{f['tick_few_due']:.2f}, manager.poll zmq {f['manager_poll_zmq']:.2f}.")


def _p6(r: dict[str, Any]) -> str:
    b = r["bytes_per_id"]
    rows = [[k.replace("_", " "), f"{v:,.0f}"] for k, v in b.items()]
    return _md_table(["record", "bytes per id"], rows)


def _p7(r: dict[str, Any]) -> str:
    rows = [[str(x["prompt_tokens"]), fmt_bytes(x["kv_bytes"]), _mmm(x["fetched_s"], 1e3, "{:.1f}"),
             f"{x['fetched_load_s']['median'] * 1e3:.1f}", f"{x['fetched_rebuild_s']['median'] * 1e3:.1f}",
             f"{x['fetched_step_s']['median'] * 1e3:.1f}", _mmm(x["recompute_s"], 1e3, "{:.0f}"),
             _mmm(x["ratio"], fmt="{:.3f}"), f"{x['load_gbps']['median']:.2f}"] for x in r["rows"]]
    return _md_table(["prompt tokens", "KV bytes", "fetched TTFT ms", "load ms", "rebuild ms", "step ms",
                      "recompute TTFT ms", "fetched/recompute", "load GB/s"], rows) + (
        f"\n\nFetching wins from {r['fetch_wins_from_tokens']} tokens (smallest length measured: "
        f"{r['smallest_length_measured']}).")


def _p8(r: dict[str, Any]) -> str:
    x = r["result"]
    rows = [
        ["ids", f"{x['ids']:,}"], ["wall s", f"{x['seconds']:.1f}"], ["ids/s", f"{x['ids_per_s']:,.0f}"],
        ["RSS baseline / peak / after / after malloc_trim (MiB)",
         f"{x['rss_baseline_mib']:.0f} / {x['rss_peak_mib']:.0f} / {x['rss_after_mib']:.0f} / "
         f"{x.get('rss_after_malloc_trim_mib') or float('nan'):.0f}"],
        ["python heap blocks before → after", f"{x['py_blocks_baseline']:,} → {x['py_blocks_after']:,} "
         f"({x['py_blocks_delta']:+,})"],
        ["peak records / peak heap entries", f"{x['peak_records']:,} / {x['peak_heap']:,}"],
        ["final state", ", ".join(f"{k}={v}" for k, v in x["final"].items())],
    ]
    return _md_table(["", ""], rows)


def _p9(r: dict[str, Any]) -> str:
    rows = [[str(x["keys"]), _mmm(x["probe_us"], fmt="{:.0f}"), _mmm(x["raw_us"], fmt="{:.0f}"),
             _mmm(x["ratio"], fmt="{:.2f}")] for x in r["probe_rtt"]]
    text = _md_table(["keys per probe", "probe round µs", "raw round trip µs", "probe / raw"], rows)
    shared = r.get("shared_prefix") or []
    if shared:
        text += "\n\n" + _md_table(
            ["shared tokens", "prompt tokens", "blocks HIT", "TTFT fetched ms", "TTFT recomputed ms", "fetched / recomputed"],
            [[str(x["shared_tokens"]), str(x["prompt_tokens"]), ",".join(map(str, x["hit_blocks"])),
              _mmm(x["fetched_ms"], fmt="{:.0f}"), _mmm(x["recompute_ms"], fmt="{:.0f}"),
              _mmm(x["ratio"], fmt="{:.2f}")] for x in shared])
    return text


def _p10(r: dict[str, Any]) -> str:
    rows = [[c, *(f"{v['wall_s'].get(k, v['wall_s']['max']) * 1e6:.0f}" for k in ("median", "p99", "max")),
             f"{v['cpu_s']['median'] * 1e6:.1f}", f"{v['cpu_s'].get('p99', v['cpu_s']['max']) * 1e6:.1f}",
             str(v["wall_s"]["n"])] for c, v in r["calls"].items()]
    load = r.get("loadavg") or []
    return _md_table(["call", "wall p50 µs", "wall p99 µs", "wall max µs", "CPU p50 µs", "CPU p99 µs", "calls"], rows) + (
        f"\n\nLoad average (1, 5, 15 min) before / after: {', '.join(f'{x:.2f}' for x in load[0])} / "
        f"{', '.join(f'{x:.2f}' for x in load[1])}." if load else "")


_DETAIL = {"P0": _p0, "P1": _p1, "P2": _p2, "P3": _p3, "P4": _p4, "P5": _p5, "P6": _p6, "P7": _p7, "P8": _p8, "P9": _p9, "P10": _p10}


def render_doc(text: str, results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    """docs/benchmarks.md's text with its generated blocks (``benchmark run``, ``benchmark
    targets``) rendered from ``results`` (the marker mechanism of :mod:`tools.docgen`)."""
    from tools.docgen import replace_block

    text = replace_block(text, "benchmark run", run_markdown(meta, results), SUMMARY_COMMAND)
    return replace_block(text, "benchmark targets", targets_markdown(results), SUMMARY_COMMAND)
