"""``python -m bench`` (``make bench``): kvtier against its peers and the machine's limits, as ratios from one run.

Every headline figure is a ratio of two things measured side by side, interleaved (A B A B …),
in the same run; medians with min–max.  The suite:

* **P0** vLLM 0.33.0's own ``p2p`` tier vs kvtier's adapter (both planes), driven
  through vLLM's ``TieringOffloadingManager`` in two processes, with a raw NIXL WRITE and torch
  ``copy_`` as the limits: hand-off time, late-fetch refusal, CPU per GB (per thread), the engine
  thread's time per ``submit_store`` (``bench/seed.py``).
* **P1** cross-process throughput: two KvTierManagers (one per process, ZeroMQ on 127.0.0.1) vs
  raw pyzmq ROUTER/DEALER moving the same frames into the same pool slots (``recv_into``).
* **P2** the same kvtier transfers vs torch ``copy_`` of the same bytes.
* **P3** late-fetch rejection latency vs a raw request/reply round trip.
* **P4** lifecycle core events/s vs a ``transitions`` machine built from the same spec.
* **P5** poll tick cost with N tombstones + N parked ids vs vLLM p2p's O(n) scan; full
  ``KvTierManager.poll()``.
* **P6** bookkeeping bytes per tracked id vs a ``transitions`` model per id.
* **P7** PD on SmolLM2-135M: decode TTFT with fetched KV vs local recompute, over prompt lengths.
* **P8** 1,000,000 ids through park → reap → tombstone → prune on a virtual clock.
* **P9** symmetric P2P (``remote_kv_source``): a probe round vs a raw round trip; shared-prefix
  TTFT on SmolLM2-135M, fetched from a peer vs recomputed (vLLM's own ``p2p`` tier beside kvtier's
  in real vLLM schedulers: ``python -m bench.vllm_symmetric``).
* **P10** engine-call latency: p50/p99/max wall and CPU of ``submit_store``, ``submit_load``,
  ``lookup`` and ``get_finished_jobs`` on the engine's thread while a 256 MiB transfer and 100 idle
  sessions run (``bench/engine_calls.py``).

P1 and P3 also write a py-spy profile (all threads of both processes; ``bench/_profile.py``) of
their 1-block cell and late-fetch run into ``OUT/profiles/``, raw collapsed stacks with a summary.

Usage, from a checkout (the suite is not part of the kvtier wheel): ``python -m bench [--quick |
--smoke] [--only P1,P3] [--out DIR] [--json PATH]``; ``python -m bench --summary`` rewrites ``summary.md``
(and docs/benchmarks.md's generated run and targets) from the results already written.  Writes ``results.json`` (``results-quick.json`` with
``--quick``), ``summary.md`` and one PNG per benchmark into ``--out`` (default the checkout's
``docs/benchmarks``; ``docs/benchmarks/quick`` with ``--quick``, so a smoke run never overwrites
the committed full results), and prints the headline table.  ``--smoke`` is the test suite's shape
(tests/bench): smaller than ``--quick`` where a benchmark's sizes, repeats or ids can shrink, every
benchmark's code still run and every file written (``-smoke`` names, ``docs/benchmarks/smoke``);
its figures say nothing (decision V9).
Exit status: 0 when every benchmark ran (targets missed are reported, not errors), 1 if one
crashed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["BENCHMARKS", "groups", "main"]

BENCHMARKS: dict[str, str] = {
    "P0": "vLLM's p2p tier vs kvtier through vLLM",
    "P1": "cross-process throughput vs raw pyzmq",
    "P2": "cross-process throughput vs torch copy_",
    "P3": "late-fetch rejection latency vs a raw round trip",
    "P4": "lifecycle core events/s vs transitions",
    "P5": "poll tick cost vs N",
    "P6": "bookkeeping bytes per id vs transitions",
    "P7": "PD on SmolLM2-135M: fetched KV vs recompute",
    "P8": "scale: 1M ids on a virtual clock",
    "P9": "symmetric P2P: probe RTT and shared-prefix TTFT",
    "P10": "engine-call latency under load",
}

SHAPES = ("full", "quick", "smoke")
"""A run's shape, largest first: ``quick`` and ``smoke`` are both quick runs (``quick=True`` in each
benchmark); a benchmark with a smaller ``smoke`` shape takes ``smoke=True`` too."""

Runner = Callable[[str, Callable[[str], None], set[str]], dict[str, dict[str, Any]]]


def _groups() -> list[tuple[set[str], Runner]]:
    """Benchmarks that share a setup run together (P1-P3: one pair of processes)."""
    from bench import corebench, corememory, engine_calls, pd, seed, symmetric, xproc

    def single(fn: Callable[..., dict[str, dict[str, Any]]], smoke: bool = False) -> Runner:
        """``fn(quick, log)``, or ``fn(quick, log, smoke=...)`` for a benchmark with a smoke shape."""
        def run(shape: str, log: Callable[[str], None], which: set[str]) -> dict[str, dict[str, Any]]:
            return fn(shape != "full", log, **({"smoke": shape == "smoke"} if smoke else {}))
        return run

    return [
        ({"P0"}, single(seed.run_p0, smoke=True)),
        ({"P4"}, single(corebench.run_p4)),
        ({"P5"}, single(corebench.run_p5)),
        ({"P6"}, single(corememory.run_p6, smoke=True)),
        ({"P8"}, single(corememory.run_p8)),
        ({"P1", "P2", "P3"}, lambda shape, log, which: xproc.run(shape != "full", log, which, smoke=shape == "smoke")),
        ({"P7"}, single(pd.run_p7)),
        ({"P9"}, single(symmetric.run_p9, smoke=True)),
        ({"P10"}, single(engine_calls.run_p10, smoke=True)),
    ]


def groups() -> list[list[str]]:
    """The benchmark ids of each group that runs together (``--only`` takes any of them), in the
    suite's order."""
    order = list(BENCHMARKS)
    return [sorted(ids, key=order.index) for ids, _ in _groups()]


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="quick run: small grids, few repeats (seconds)")
    size.add_argument("--smoke", action="store_true",
                      help="the test suite's run: the smallest grids and repeats that run every benchmark's code")
    p.add_argument("--only", default="", help="comma-separated benchmark ids, e.g. P1,P3 (default: all)")
    p.add_argument("--out", default=None, help="output directory for JSON, summary.md and PNG plots "
                   "(default docs/benchmarks, or docs/benchmarks/quick or /smoke with --quick or --smoke)")
    p.add_argument("--json", default=None, help="path of the JSON results (default OUT/results.json)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-profiles", action="store_true", help="skip the py-spy profiles of P1's 1-block cell and P3")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--summary", action="store_true",
                   help="run nothing: write OUT/summary.md (and, for the committed results, docs/benchmarks.md's "
                        "generated blocks) from the results JSON already there (--json)")
    args = p.parse_args(argv)
    ids = [x.strip().upper() for x in args.only.split(",") if x.strip()] or list(BENCHMARKS)
    bad = [x for x in ids if x not in BENCHMARKS]
    if bad:
        p.error(f"unknown benchmark id(s) {bad}; choose from {','.join(BENCHMARKS)}")
    args.ids = [x for x in BENCHMARKS if x in ids]
    args.shape = "smoke" if args.smoke else "quick" if args.quick else "full"
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the suite; see the module docstring. Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rich.console import Console

    from bench import _plots, _profile, _report
    from bench._util import machine_info

    console = Console(width=200, stderr=False)
    if args.out is None:
        from tools.checkout import NotACheckout, root

        try:
            docs = root() / "docs"
        except NotACheckout as exc:
            console.print(f"[red]python -m bench: {exc} (or name the output directory with --out)[/]")
            return 2
        out = docs / "benchmarks" / args.shape if args.shape != "full" else docs / "benchmarks"
    else:
        out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _profile.configure(None if args.no_profiles else out / "profiles")
    suffix = f"-{args.shape}" if args.shape != "full" else ""
    json_path = Path(args.json) if args.json else out / f"results{suffix}.json"
    if args.summary:
        doc = json.loads(json_path.read_text())
        _write_summaries(out, suffix, doc["benchmarks"], doc["meta"], console)
        return 0
    started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    t0 = time.monotonic()

    def log(msg: str) -> None:
        if not args.quiet:
            console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/] {msg}", highlight=False)

    meta: dict[str, Any] = {
        "command": "python -m bench " + " ".join(argv),
        "quick": args.shape != "full",
        "shape": args.shape,
        "started": started,
        "machine": machine_info(),
    }
    results: dict[str, dict[str, Any]] = {}
    rc = 0
    wanted = set(args.ids)
    for ids, runner in _groups():
        todo = ids & wanted
        if not todo:
            continue
        log(f"running {', '.join(sorted(todo))} …")
        t1 = time.monotonic()
        try:
            got = runner(args.shape, log, todo)
        except Exception:  # noqa: BLE001 - one crashed benchmark must not lose the others
            rc = 1
            tb = traceback.format_exc()
            console.print(f"[red]benchmark {sorted(todo)} failed:[/]\n{tb}")
            got = {i: {"id": i, "title": BENCHMARKS[i], "status": "error", "error": tb} for i in todo}
        for i in todo:
            r = got[i]
            r.setdefault("command", f"python -m bench{'' if args.shape == 'full' else ' --' + args.shape} --only {i}")
            results[i] = r
        log(f"… done in {time.monotonic() - t1:.1f} s")
    results = {i: results[i] for i in BENCHMARKS if i in results}
    meta["wall_s"] = time.monotonic() - t0
    plots: dict[str, str] = {}
    if not args.no_plots:
        for i, r in results.items():
            if r.get("status") in ("error", "skipped"):
                continue
            try:
                plots[i] = _plots.PLOTS[i](r, out, suffix)
            except Exception:  # noqa: BLE001
                rc = 1
                console.print(f"[red]plot for {i} failed:[/]\n{traceback.format_exc()}")
        try:
            plots["summary"] = _plots.plot_summary(results, out, suffix)
        except Exception:  # noqa: BLE001
            rc = 1
            console.print(f"[red]summary plot failed:[/]\n{traceback.format_exc()}")
    meta["plots"] = plots
    doc = {"meta": meta, "benchmarks": results}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    _write_summaries(out, suffix, results, meta, console)
    _report.print_table(results, console)
    misses = [f"{i}: {t['text']} (achieved {t['achieved']:.3g})" for i, r in results.items()
              for t in (r.get("targets") or [r.get("target") or {}]) if t.get("met") is False]
    if misses:
        console.print("[yellow]targets missed:[/] " + "; ".join(misses))
    console.print(f"wrote {json_path}, {out / f'summary{suffix}.md'} and {len(plots)} plots into {out} "
                  f"({meta['wall_s']:.0f} s)")
    return rc


def _write_summaries(out: Path, suffix: str, results: dict[str, dict[str, Any]], meta: dict[str, Any],
                     console: Any) -> None:
    """``summary.md`` beside the results, and — when they are the checkout's committed full results
    (``docs/benchmarks``) — docs/benchmarks.md's generated blocks (run, one line per target)."""
    from bench import _report

    (out / f"summary{suffix}.md").write_text(_report.markdown(results, meta))
    page = out.parent / "benchmarks.md"
    if not suffix and out.name == "benchmarks" and page.is_file():
        text = page.read_text(encoding="utf-8")
        fresh = _report.render_doc(text, results, meta)
        if fresh != text:
            page.write_text(fresh, encoding="utf-8")
            console.print(f"wrote {page}")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
