"""NIXL WRITE throughput and latency between two processes on one host (a measurement, not a test).

    python -m bench.nixl_probe [--tls default|tcp] [--rounds 5] [--reps 10]

Two spawned processes each own a :class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent`; the
producer WRITEs into the consumer's slots (reverse order, as a fetch names them) and times
post → ``DONE`` with a busy poll. Baseline: ``np.copyto`` of the same bytes in the producer
process, timed in the same round, so both see the same machine load.

* Throughput: 8, 16 and 64 MiB requests of 256 KiB blocks. Each round takes the median of
  ``--reps`` timed runs (after 2 warm-ups) for NIXL and for memcpy; the table gives the median
  over rounds and the range of the round medians, and ratio = NIXL GB/s ÷ memcpy GB/s per round.
  Target (P2): ratio >= 0.6 for requests >= 8 MiB, same host.
* Latency: one block of 16 KiB and of 256 KiB, median (and p90) of ``--lat-reps`` runs.

Children use ``UCX_NET_DEVICES=lo``; ``--tls tcp`` sets ``UCX_TLS=tcp`` (the network path: the
target must progress, which the consumer child does between commands every ``--pump-ms``; 0
spins, which on a 2-core box competes with the busy-polling producer). Load is reported as
the 1-minute load average and the cores other processes used meanwhile (``CpuMeter``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from bench._util import CpuMeter, fmt_time, summary
from tests.support.nixl_peer import spawn_nixl_peer

MiB = 1 << 20
KiB = 1 << 10
BLOCK = 256 * KiB
SIZES = (8 * MiB, 16 * MiB, 64 * MiB)


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def _pair(tag: str, tls: str, num_blocks: int, block_bytes: int, pump_s: float) -> tuple[Any, Any]:
    env = {"UCX_TLS": "tcp"} if tls == "tcp" else {}
    prod = spawn_nixl_peer(f"probe-p-{tag}", num_blocks, block_bytes, env=env, pump_s=pump_s)
    cons = spawn_nixl_peer(f"probe-c-{tag}", num_blocks, block_bytes, env=env, pump_s=pump_s)
    prod.call("add_peer", peer="c", descriptor=cons.hello["descriptor"])
    cons.call("add_peer", peer="p", descriptor=prod.hello["descriptor"])
    prod.call("fill", seed=1, blocks=list(range(num_blocks)))
    return prod, cons


def run(
    tls: str = "default", rounds: int = 5, reps: int = 10, lat_reps: int = 200, pump_s: float = 0.001
) -> dict[str, Any]:
    out: dict[str, Any] = {"tls": tls, "pump_s": pump_s, "throughput": [], "latency": []}
    meter = CpuMeter()
    prod, cons = _pair("big", tls, max(SIZES) // BLOCK, BLOCK, pump_s)
    try:
        out["agent_start_s"] = [prod.hello["start_s"], cons.hello["start_s"]]
        for size in SIZES:
            n = size // BLOCK
            nixl_med, mem_med, ratio = [], [], []
            for _ in range(rounds):
                t_n = statistics.median(prod.call("bench_write", peer="c", blocks=n, reps=reps))
                t_m = statistics.median(prod.call("bench_memcpy", nbytes=size, reps=reps))
                nixl_med.append(t_n)
                mem_med.append(t_m)
                ratio.append(t_m / t_n)
            out["throughput"].append(
                {"bytes": size, "blocks": n, "nixl_s": summary(nixl_med), "memcpy_s": summary(mem_med),
                 "ratio": summary(ratio)}
            )
    finally:
        prod.close()
        cons.close()
    for bb in (16 * KiB, 256 * KiB):
        prod, cons = _pair(f"lat{bb // KiB}", tls, 16, bb, pump_s)
        try:
            t = prod.call("bench_write", peer="c", blocks=1, reps=lat_reps, warmup=20)
            out["latency"].append({"bytes": bb, "s": summary(t)})
        finally:
            prod.close()
            cons.close()
    out["load"] = meter.stop()
    return out


def render(r: dict[str, Any]) -> str:
    lines = [f"NIXL WRITE, UCX_TLS={r['tls']}, two processes on one host (UCX_NET_DEVICES=lo), "
             f"consumer calls progress() every {r['pump_s'] * 1e3:g} ms between commands", ""]
    lines.append("| request | NIXL time | NIXL GB/s | memcpy time | memcpy GB/s | NIXL ÷ memcpy |")
    lines.append("|---|---|---|---|---|---|")
    for t in r["throughput"]:
        b = t["bytes"]
        n, m, q = t["nixl_s"], t["memcpy_s"], t["ratio"]
        lines.append(
            f"| {b // MiB} MiB ({t['blocks']} x 256 KiB) "
            f"| {fmt_time(n['median'])} ({fmt_time(n['min'])}–{fmt_time(n['max'])}) "
            f"| {_gbps(b, n['median']):.1f} ({_gbps(b, n['max']):.1f}–{_gbps(b, n['min']):.1f}) "
            f"| {fmt_time(m['median'])} ({fmt_time(m['min'])}–{fmt_time(m['max'])}) "
            f"| {_gbps(b, m['median']):.1f} "
            f"| {q['median']:.2f} ({q['min']:.2f}–{q['max']:.2f}) |"
        )
    lines += ["", "| 1-block WRITE | median | p90 | min | n |", "|---|---|---|---|---|"]
    for t in r["latency"]:
        s = t["s"]
        lines.append(f"| {t['bytes'] // KiB} KiB | {fmt_time(s['median'])} | {fmt_time(s.get('p90', s['max']))} "
                     f"| {fmt_time(s['min'])} | {s['n']} |")
    ld = r["load"]
    lines += ["", f"agent start-up: {', '.join(f'{s:.2f} s' for s in r['agent_start_s'])}; "
              f"load: 1-min loadavg {ld['loadavg_1m']:.2f}, other processes used {ld['others_cores']:.2f} cores, "
              f"we used {ld['our_cores']:.2f} ({'quiet' if ld['quiet'] else 'NOT quiet'})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tls", choices=("default", "tcp"), default="default")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--lat-reps", type=int, default=200)
    ap.add_argument("--pump-ms", type=float, default=1.0,
                    help="how often the consumer calls progress() (0 = spin; a tcp target needs it; "
                         "the pipe wait rounds up to whole milliseconds)")
    a = ap.parse_args(argv)
    print(render(run(a.tls, a.rounds, a.reps, a.lat_reps, a.pump_ms / 1e3)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
