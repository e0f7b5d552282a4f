"""P0: vLLM 0.33.0's own ``p2p`` secondary tier as a benchmark peer.

Producer and consumer are two spawned processes on one host.  Each builds, the way vLLM builds
them, one ``TieringOffloadingManager`` per system under test (``TieringOffloadingSpec(...)
.get_manager()``: a real CPU primary tier over ``/dev/shm``, the tier loaded by vLLM's
``SecondaryTierFactory``), and drives it in the order vLLM's offloading connector does, holding
the manager's lock, with vLLM's ``vllm_offload_tier_poll`` thread (1 ms) as the only poller of the
system being measured (the others' poll threads are stopped meanwhile and their heartbeats kept by
one poll every 0.25 s):

* ``seed``: ``{"type": "p2p"}`` — the p2p tier with its NIXL data plane and ZeroMQ control;
* ``kvtier_nixl`` / ``kvtier_zmq``: ``{"type": "KvTierSecondaryTier", "module_path":
  "kvtier.integrations.vllm", "data_plane": ...}``;

plus the limits, between the same two processes: a raw NIXL WRITE pair (two
:class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent`: post → ``DONE``) and torch ``copy_`` of the
same blocks (one thread, into a pre-faulted destination).

Per request of 1 block and of 8, 64, 256 MiB (1 MiB blocks; ``--quick``: 1 and 8 MiB), repeated
A/B interleaved (the order of the systems rotates every round), every hand-off checked
byte-exact in the consumer's primary rows:

* ``load``: the consumer's ``submit_load`` (inside ``on_schedule_end``) → the tier reporting the
  job's result (``get_finished_jobs``, called by vLLM's poll thread), median;
* ``submit_store``: the producer engine thread's time inside ``tier.submit_store`` (wall and that
  thread's CPU), median;
* ``cpu``: CPU seconds per GB moved in each process (``getrusage``, all threads, from just before
  the store to the end of the hand-off), and the same split by thread (the engine's main thread,
  vLLM's tier poll thread, kvtier's digest pool, libzmq's I/O threads, the rest: UCX, torch), from
  ``/proc/self/task`` — where the time goes;
* ``late``: a fetch for an id the producer reaped (``unbound_store_timeout_s`` passed): the
  consumer's ``submit_load`` → the failed result.

vLLM's p2p tier imports ``nixl`` while ``nixl-cu12`` installs ``nixl_cu12``: the child processes alias
one to the other in ``sys.modules`` (NIXL's meta package does the same); kvtier never does.

In the suite: ``python -m bench --only P0`` (part of ``make bench``).  Alone, with more knobs:
``python -m bench.seed [--quick] [--rounds N] [--systems a,b] [--two-hosts] [--json PATH]`` prints
the markdown tables; ``--two-hosts`` runs producer and consumer in two network namespaces joined by
a veth pair (root), NIXL with UCX over TCP on it.  The two children are
:class:`tools.child.Child` processes running :class:`Side`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bench.p0_raw import phase_table, raw_zmq
from bench.seed_side import QUICK_SIZES_MIB, ROW, SIZES_MIB, SYSTEMS, TITLE, UNBOUND_S, MiB
from kvtier.lifecycle.batches import MAX_BATCH_BYTES

# -- the parent --------------------------------------------------------------------------------------


def _remove_shm(tag: str) -> None:
    """Remove primaries a killed child left in /dev/shm (vLLM unlinks them on a clean shutdown)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        if f"kvtier-p0-{tag}-" in name:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run(quick: bool = False, log: Callable[[str], None] = print, rounds: int | None = None,
        late_rounds: int | None = None, systems: Sequence[str] = SYSTEMS, two_hosts: bool = False,
        sizes: Sequence[int] | None = None, batch_bytes: int | None = None,
        tail_bytes: int | None = None, window_bytes: int | None = None,
        tier_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run P0; returns a result record (``rows`` per size and system, ``late``, ``machine``).

    ``two_hosts``: producer and consumer in two network namespaces joined by a veth pair
    (:class:`tests.support.netns.TwoHosts`; root), NIXL with UCX over TCP on it.  ``sizes``: MiB
    per request (default 1, 8, 64, 256; quick 1, 8).  ``batch_bytes``/``tail_bytes``: kvtier's
    batch plan and the NIXL plane's window in the children (measuring them; default the shipped
    constants).  ``tier_config``: keys set in every kvtier tier's config (measuring what one costs,
    e.g. ``{"integrity": "none"}``)."""
    plan = {"batch_bytes": batch_bytes, "tail_bytes": tail_bytes, "window_bytes": window_bytes,
            "tier_config": tier_config}
    if two_hosts:
        from tests.support.netns import TwoHosts, unavailable_reason

        why = unavailable_reason()
        if why:
            raise RuntimeError(f"two hosts: {why}")
        with TwoHosts() as h:
            def ucx(dev: str) -> dict[str, str]:
                return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": dev, "UCX_TCP_USER_TIMEOUT": "2s"}

            sides = ({"host": h.addr_a, "netns": h.a, "env": ucx(h.dev_a), **plan},
                     {"host": h.addr_b, "netns": h.b, "env": ucx(h.dev_b), **plan})
            res = _run(quick, log, rounds, late_rounds, systems, sides, sizes)
        res["two_hosts"] = True
        return res
    return _run(quick, log, rounds, late_rounds, systems, (plan, plan), sizes)


SETTLE_S = 0.05
"""After a frozen pair is thawed, this long before it is measured (heartbeats, deadlines due)."""


def _run(quick: bool, log: Callable[[str], None], rounds: int | None, late_rounds: int | None,
         systems: Sequence[str], sides: tuple[dict[str, Any], dict[str, Any]],
         sizes: Sequence[int] | None = None) -> dict[str, Any]:
    """Every system, and the limits, in a pair of processes of its own; only the pair being
    measured runs, the others are frozen (SIGSTOP): vLLM p2p's NIXL agent runs its progress
    thread, which keeps a core busy even when idle, and would otherwise run beside every other
    system's hand-offs."""
    import signal
    from concurrent.futures import ThreadPoolExecutor

    from bench._util import CpuMeter, machine_info, summary
    from tools.child import Child, preload_vllm

    preload_vllm()  # every child here drives vLLM (decision V11)

    sizes = tuple(sizes or (QUICK_SIZES_MIB if quick else SIZES_MIB))
    rounds = rounds or (3 if quick else 9)
    late_rounds = (1 if quick else 3) if late_rounds is None else late_rounds  # 0: none
    max_blocks = max(sizes)
    t_start = time.monotonic()
    machine = machine_info()  # before the children start: its load average is the one at the start
    meter = CpuMeter()
    names = [*systems, "limits"]
    log(f"P0: starting a producer and a consumer for each of {', '.join(names)} ({max_blocks} MiB primaries)")
    tag = uuid.uuid4().hex[:8]
    children: list[Child] = []
    for name in names:
        for role, side in zip(("producer", "consumer"), sides):
            kw = {"role": role, "systems": [] if name == "limits" else [name], "max_blocks": max_blocks,
                  "tag": tag, "limits": name == "limits", **side}
            children.append(Child("bench.seed_side", "Side", kw, name=f"p0-{name}-{role}", call_timeout_s=300))
    pairs = {name: (children[2 * i], children[2 * i + 1]) for i, name in enumerate(names)}
    frozen: set[str] = set()

    def freeze(name: str) -> None:
        for c in pairs[name]:
            os.kill(c.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        frozen.add(name)

    try:  # each pair is frozen once it is ready: a busy progress thread must not slow the others' start
        for c in children:
            c.start()
        for name in names:
            for c in pairs[name]:
                c.wait_ready(600)
            freeze(name)
    except BaseException:
        for c in reversed(children):
            if c.pid is not None:
                try:
                    os.kill(c.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            c.close()
        _remove_shm(tag)
        raise

    def thaw(name: str) -> None:
        if name in frozen:
            for c in pairs[name]:
                try:
                    os.kill(c.pid, signal.SIGCONT)  # type: ignore[arg-type]
                except ProcessLookupError:  # it died (its caller reports why)
                    pass
            frozen.discard(name)
            time.sleep(SETTLE_S)

    def only(name: str) -> tuple[Child, Child]:
        for other in names:
            if other != name and other not in frozen:
                freeze(other)
        thaw(name)
        return pairs[name]

    samples: dict[tuple[int, str], dict[str, list[float]]] = {}
    late: dict[str, list[float]] = {s: [] for s in systems}
    try:
        lp, lc = only("limits")
        lp.call("raw_peer", descriptor=lc.hello["descriptor"])
        lc.call("raw_peer", descriptor=lp.hello["descriptor"])
        seq = iter(range(10**9))

        def hand_off(system: str, n: int) -> dict[str, float]:
            prod, cons = only(system)
            kid = f"p0-{system}-{n}-{next(seq)}"
            host, port = prod.hello["addresses"][system].rsplit(":", 1)
            c0p, c0c = prod.call("cpu"), cons.call("cpu")
            t0p, t0c = prod.call("threads"), cons.call("threads")
            st = prod.call("store", system=system, kid=kid, n=n)
            ld = cons.call("load", system=system, kid=kid, n=n, host=host, port=int(port))
            if not prod.call("stored", system=system, job=st["job"]):
                raise RuntimeError(f"{system}: the producer's store job failed after a successful load")
            c1p, c1c = prod.call("cpu"), cons.call("cpu")
            t1p, t1c = prod.call("threads"), cons.call("threads")
            out = {"load_s": ld["load_s"], "submit_store_s": st["submit_store_s"],
                   "submit_store_cpu_s": st["submit_store_cpu_s"], "complete_store_s": st["complete_store_s"],
                   "cpu_prod_s": c1p - c0p, "cpu_cons_s": c1c - c0c}
            for side, a, b in (("prod", t0p, t1p), ("cons", t0c, t1c)):
                for group in set(a) | set(b):
                    out[f"thr_{side}_{group}"] = b.get(group, 0.0) - a.get(group, 0.0)
            out.update(_hops(ld, prod.call("trace")))
            return out

        def raw_write(kid: str, n: int) -> dict[str, float]:
            prod, cons = only("limits")
            cons.send("raw_recv", kid=kid, n=n)
            w = prod.call("raw_write", kid=kid, n=n)
            got = cons.result()
            if not got["exact"]:
                raise RuntimeError("raw NIXL WRITE: the consumer's bytes differ")
            return {"done_s": w["done_s"], "notified_s": got["notified"] - w["posted"]}

        log("P0: warm-up (handshakes, first touch)")
        for system in systems:
            for c in only(system):
                c.call("activate", system=system)
            hand_off(system, min(8, max_blocks))
            hand_off(system, max_blocks)
        raw_write("warm", max_blocks)
        lc.call("zraw_connect", address=lp.call("zraw_bind"))
        per_msg = max(1, MAX_BATCH_BYTES // ROW)
        raw_zmq(*only("limits"), "warm", max_blocks, per_msg)
        only("limits")[1].call("copy", n=max_blocks)

        for r in range(rounds):
            order = list(systems[r % len(systems):]) + list(systems[: r % len(systems)])
            for mib in sizes:
                n = mib
                for system in order:
                    got = hand_off(system, n)
                    d = samples.setdefault((mib, system), {})
                    for k, v in got.items():
                        d.setdefault(k, []).append(v)
                kid = f"raw-{r}-{mib}"
                raw = raw_write(kid, n)
                d = samples.setdefault((mib, "raw_nixl"), {})
                d.setdefault("load_s", []).append(raw["done_s"])
                d.setdefault("notified_s", []).append(raw["notified_s"])
                for k, v in raw_zmq(*only("limits"), f"zraw-{r}-{mib}", n, per_msg).items():
                    samples.setdefault((mib, "raw_zmq"), {}).setdefault(k, []).append(v)
                samples.setdefault((mib, "copy"), {}).setdefault("load_s", []).append(
                    only("limits")[1].call("copy", n=n))
            log(f"P0: round {r + 1}/{rounds} done ({time.monotonic() - t_start:.0f} s)")

        log("P0: late fetches (reaped ids)")
        for r in range(late_rounds):
            for system in systems:
                prod, cons = only(system)
                host, port = prod.hello["addresses"][system].rsplit(":", 1)
                kid = f"late-{system}-{r}"
                st = prod.call("store", system=system, kid=kid, n=1)
                time.sleep(UNBOUND_S + 0.5)
                ld = cons.call("load", system=system, kid=kid, n=1, host=host, port=int(port), expect_ok=False)
                late[system].append(ld["load_s"])
                prod.call("stored", system=system, job=st["job"])
    finally:
        for name in list(frozen):
            thaw(name)
        # consumers first (their producers see a clean disconnect), each side's pairs at once: a
        # side's managers shut down in seconds each, and the pairs are independent
        with ThreadPoolExecutor(len(names)) as pool:
            for side in (1, 0):
                list(pool.map(Child.close, [pair[side] for pair in pairs.values()]))
        _remove_shm(tag)

    rows = []
    for mib in sizes:
        for system in (*systems, "raw_nixl", "raw_zmq", "copy"):
            d = samples.get((mib, system))
            if not d:
                continue
            row: dict[str, Any] = {"mib": mib, "system": system, "load_s": summary(d["load_s"])}
            for k in ("submit_store_s", "submit_store_cpu_s", "complete_store_s", "notified_s", "first_s", "done_s"):
                if k in d:
                    row[k] = summary(d[k])
            if "cpu_prod_s" in d:
                gb = mib * MiB / 1e9
                row["cpu_s_per_gb"] = {"producer": _median(d["cpu_prod_s"]) / gb,
                                       "consumer": _median(d["cpu_cons_s"]) / gb}
                hops = {k: summary(d[k]) for k, _ in HOPS if d.get(k)}
                if hops:
                    row["hops_s"] = hops
                row["thread_cpu_s_per_gb"] = {  # mean over the rounds: per hand-off it is noise
                    side: {k.split("_", 2)[2]: sum(v) / len(v) / gb for k, v in sorted(d.items())
                           if k.startswith(f"thr_{tag}_") and sum(v) > 0}
                    for side, tag in (("producer", "prod"), ("consumer", "cons"))}
            rows.append(row)
    noise = meter.stop()
    targets = _targets(samples, sizes, systems)
    ratio, kv, base = _headline(samples, sizes, systems)
    return {"id": "P0", "title": TITLE,
            "status": "ok", "quick": quick, "rounds": rounds, "block_bytes": ROW, "rows": rows,
            "late_s": {s: summary(v) for s, v in late.items() if v}, "ratio": ratio, "kvtier": kv,
            "baseline": base, "targets": targets, "noise": noise, "machine": machine,
            "wall_s": time.monotonic() - t_start}


HOPS = (
    ("hop_fetch", "submit_load → the producer's plane posts (fetch, producer tick)"),
    ("hop_write", "post → the producer's plane released every block (WRITEs / sends done)"),
    ("hop_first", "post → the consumer's first landing starts (first batch written / sent)"),
    ("hop_stream", "first → last landing started (the other batches)"),
    ("hop_check", "last landing started → every landing checked"),
    ("hop_result", "every landing checked → the job's result reaches vLLM"),
)


def _hops(load: dict[str, Any], producer: list[tuple[str, float]]) -> dict[str, float]:
    """Where a kvtier hand-off's time went (seconds per hop, see :data:`HOPS`), from the two
    planes' traces; empty for vLLM p2p (whose plane is not traced)."""
    cons = load.get("trace") or []
    posts = [t for e, t in producer if e == "post"]
    lands = [t for e, t in cons if e == "land"]
    landed = [t for e, t in cons if e == "Landed"]
    if not (posts and lands and landed):
        return {}
    released = [t for e, t in producer if e == "Released"]
    out = {"hop_write": released[-1] - posts[0]} if released else {}
    return out | {"hop_fetch": posts[0] - load["t_submit"], "hop_first": lands[0] - posts[0],
            "hop_stream": lands[-1] - lands[0], "hop_check": max(landed) - lands[-1],
            "hop_result": load["t_done"] - max(landed)}


def _paired(samples: dict, mib: int, a: str, b: str, key: str = "load_s") -> list[float]:
    """Per-round ratios a/b (the two measured in the same round, back to back)."""
    xa, xb = samples.get((mib, a), {}).get(key, []), samples.get((mib, b), {}).get(key, [])
    return [x / y for x, y in zip(xa, xb) if y > 0]


def _headline(samples: dict, sizes: Sequence[int], systems: Sequence[str]) -> tuple[dict, dict, dict]:
    """The suite's headline: kvtier nixl's hand-off time over vLLM p2p's at the largest size."""
    from bench._util import summary

    mib = max(sizes)
    a = "kvtier_nixl" if "kvtier_nixl" in systems else systems[-1]
    b = "seed" if "seed" in systems else systems[0]
    pr = _paired(samples, mib, a, b)
    ratio = summary(pr) if pr else {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    kv = {"what": f"{a} hand-off, {mib} MiB", "value": _median(samples[(mib, a)]["load_s"]), "unit": "s"}
    base = {"what": f"{b} hand-off, {mib} MiB", "value": _median(samples[(mib, b)]["load_s"]), "unit": "s"}
    return ratio, kv, base


def _targets(samples: dict, sizes: Sequence[int], systems: Sequence[str]) -> list[dict[str, Any]]:
    """The targets of the issue that P0 measures, each from the per-round paired ratios' median."""
    from bench._util import target

    out: list[dict[str, Any]] = []

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    if {"seed", "kvtier_nixl"} <= set(systems):
        for mib in sizes:
            out.append(target("<=", 0.5, med(_paired(samples, mib, "kvtier_nixl", "seed")),
                              f"kvtier nixl hand-off ≤ 0.5× vLLM p2p's, {mib} MiB"))
            # the limit measured the same way (same rounds, bytes and host): a raw NIXL WRITE of the
            # bytes alone, no request path; where it is above 0.5 no tier over NIXL meets the target here
            out.append({"text": f"limit here: a raw NIXL WRITE's time ÷ vLLM p2p's hand-off, {mib} MiB (reported)",
                        "op": None, "value": None, "met": None,
                        "achieved": med(_paired(samples, mib, "raw_nixl", "seed"))})
    if "kvtier_nixl" in systems:
        for mib in sizes:
            # throughput ratio = raw time / kvtier time
            r = med([1 / x for x in _paired(samples, mib, "kvtier_nixl", "raw_nixl")])
            if mib == 1:
                t = med(_paired(samples, mib, "kvtier_nixl", "raw_nixl"))
                out.append(target("<=", 3.0, t, "kvtier nixl 1-block hand-off ≤ 3× a raw NIXL WRITE's time"))
            elif mib >= 64:
                out.append(target(">=", 0.85, r, f"kvtier nixl ≥ 0.85× a raw NIXL WRITE's throughput, {mib} MiB"))
            elif mib >= 8:
                out.append(target(">=", 0.6, r, f"kvtier nixl ≥ 0.6× a raw NIXL WRITE's throughput, {mib} MiB"))
    if "seed" in systems:
        for s in systems:
            if s == "seed":
                continue
            for mib in sizes:
                out.append(target("<=", 1.0, med(_paired(samples, mib, s, "seed", "submit_store_cpu_s")),
                                  f"{s}: engine-thread CPU per submit_store ≤ vLLM p2p's, {mib} MiB"))
                for side in ("prod", "cons"):
                    out.append(target("<=", 1.0, med(_paired(samples, mib, s, "seed", f"cpu_{side}_s")),
                                      f"{s}: {'producer' if side == 'prod' else 'consumer'} CPU s/GB "
                                      f"≤ vLLM p2p's, {mib} MiB"))
    return out


def render(res: dict[str, Any]) -> str:
    """The result as markdown: hand-off time, engine time per submit_store, CPU s/GB, late fetch."""
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in res["rows"])]
    cols = [c for c in (*systems, "raw_nixl", "raw_zmq", "copy") if any(r["system"] == c for r in res["rows"])]
    names = {"seed": "vLLM p2p (NIXL)", "kvtier_nixl": "kvtier nixl", "kvtier_zmq": "kvtier zmq",
             "raw_nixl": "raw NIXL WRITE", "raw_zmq": "raw pyzmq", "copy": "`copy_`"}
    by = {(r["mib"], r["system"]): r for r in res["rows"]}
    sizes = sorted({r["mib"] for r in res["rows"]})

    def ms(x: float) -> str:
        return f"{x * 1e3:.2f} ms" if x < 0.1 else f"{x * 1e3:.1f} ms"

    def us(x: float) -> str:
        return f"{x * 1e6:.0f} µs"

    where = "two network namespaces, UCX over tcp on a veth" if res.get("two_hosts") else "one host"
    lines = [f"P0 ({'quick' if res['quick'] else 'full'}, {where}, {res['rounds']} interleaved rounds, 1 MiB blocks; "
             f"median (min–max))", "",
             "| consumer `submit_load` → result | " + " | ".join(names[c] for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for mib in sizes:
        cells = []
        for c in cols:
            r = by.get((mib, c))
            cells.append("—" if r is None else f"{ms(r['load_s']['median'])} ({ms(r['load_s']['min'])}–{ms(r['load_s']['max'])})")
        lines.append(f"| {mib} MiB | " + " | ".join(cells) + " |")
    notes = [f"{mib} MiB {ms(by[(mib, 'raw_nixl')]['notified_s']['median'])}" for mib in sizes
             if "notified_s" in by.get((mib, "raw_nixl"), {})]
    if notes:
        lines += ["", "raw NIXL WRITE is the producer's post → `DONE`; its notification reached the consumer "
                  "(post → `get_new_notifs`, median): " + ", ".join(notes) + "."]
    lines += ["", "| engine thread in `tier.submit_store`: wall / CPU | " + " | ".join(names[s] for s in systems) + " |",
              "|---|" + "---|" * len(systems)]
    for mib in sizes:
        lines.append(f"| {mib} MiB | " + " | ".join(
            f"{us(by[(mib, s)]['submit_store_s']['median'])} / {us(by[(mib, s)]['submit_store_cpu_s']['median'])}"
            for s in systems) + " |")
    lines += ["", "| CPU s per GB: producer / consumer | " + " | ".join(names[s] for s in systems) + " |",
              "|---|" + "---|" * len(systems)]
    for mib in sizes:
        lines.append(f"| {mib} MiB | " + " | ".join(
            f"{by[(mib, s)]['cpu_s_per_gb']['producer']:.2f} / {by[(mib, s)]['cpu_s_per_gb']['consumer']:.2f}"
            for s in systems) + " |")
    hop_systems = [s for s in systems if any("hops_s" in by.get((m, s), {}) for m in sizes)]
    if hop_systems:
        lines += ["", "| where kvtier's hand-off time goes, median ms (" + ", ".join(
            f"{names[s]}" for s in hop_systems) + ") | " + " | ".join(f"{m} MiB" for m in sizes) + " |",
            "|---|" + "---|" * len(sizes)]
        for s in hop_systems:
            for k, text in HOPS:
                lines.append(f"| {names[s]}: {text} | " + " | ".join(
                    f"{by[(m, s)]['hops_s'][k]['median'] * 1e3:.2f}" if k in by.get((m, s), {}).get("hops_s", {})
                    else "—" for m in sizes) + " |")
    lines += phase_table(by, sizes, names)
    big = max(sizes)
    thr = {s: by[(big, s)].get("thread_cpu_s_per_gb") for s in systems if by.get((big, s))}
    if any(thr.values()):
        lines += ["", f"| CPU s per GB by thread, {big} MiB (producer; consumer) | " + " | ".join(
            names[s] for s in systems) + " |", "|---|" + "---|" * len(systems)]
        for side in ("producer", "consumer"):
            groups = sorted({g for s in systems for g in (thr.get(s) or {}).get(side, {})})
            for g in groups:
                lines.append(f"| {side}: {g} | " + " | ".join(
                    f"{(thr.get(s) or {}).get(side, {}).get(g, 0.0):.3f}" for s in systems) + " |")
    if res.get("late_s"):
        lines += ["", "| late fetch (reaped id): `submit_load` → failed result | " + " | ".join(
            names[s] for s in systems if s in res["late_s"]) + " |", "|---|" + "---|" * len(res["late_s"])]
        lines.append("| median (min–max) | " + " | ".join(
            f"{ms(v['median'])} ({ms(v['min'])}–{ms(v['max'])})" for s, v in res["late_s"].items()) + " |")
    if res.get("targets"):
        lines += ["", "| target (median of per-round paired ratios) | achieved | met |", "|---|---|---|"]
        for t in res["targets"]:
            a = t["achieved"]
            lines.append(f"| {t['text']} | {'—' if a is None else f'{a:.2f}'} | "
                         f"{'—' if t['met'] is None else ('yes' if t['met'] else 'no')} |")
    m = res["machine"]
    nz = res.get("noise", {})
    lines += ["", f"other processes kept {nz.get('others_cores', float('nan')):.2f} cores busy on average during the run."]
    lines += ["", f"{m.get('affinity')} CPUs ({m.get('cpu_model')}), load average at start "
                  f"{m.get('loadavg_at_start')}; wall {res['wall_s']:.0f} s. The machine is shared: figures move "
                  "with other developers' load."]
    return "\n".join(lines)


def unavailable() -> str | None:
    """Why P0 cannot run here (NIXL or vLLM 0.33.0's p2p tier missing), or None."""
    try:
        import importlib

        importlib.import_module("nixl_cu12")
    except ImportError as exc:
        return f"NIXL (nixl-cu12) is not installed: {exc}"
    try:
        from vllm.v1.kv_offload.tiering.p2p.manager import P2PSecondaryTierManager  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a half-installed stack raises TypeError and the like
        return f"vLLM 0.33.0's p2p tier is not importable: {exc!r}"
    return None


def run_p0(quick: bool, log: Callable[[str], None], smoke: bool = False) -> dict[str, dict[str, Any]]:
    """The suite's entry (``python -m bench --only P0``): one host, every system; skipped with
    the reason when NIXL or vLLM's p2p tier is missing.  ``smoke``: quick's sizes, one round."""
    why = unavailable()
    if why is not None:
        return {"P0": {"id": "P0", "title": TITLE, "status": "skipped", "reason": why}}
    res = run(quick, log, rounds=1 if smoke else None)
    res["method"] = render(res)
    return {"P0": res}


def config_settings(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as config keys: each value parsed as JSON (numbers, true/false), else
    kept as a string.  Raises ``SystemExit`` naming a pair without ``=``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.seed", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 and 8 MiB only, 3 rounds, 1 late round")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 9; quick 3)")
    ap.add_argument("--late-rounds", type=int, default=None, help="late-fetch rounds (default 3; quick 1)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--json", default=None, help="also write the result record here")
    ap.add_argument("--two-hosts", action="store_true",
                    help="producer and consumer in two network namespaces, NIXL over UCX tcp (root)")
    ap.add_argument("--sizes", default=None, help="comma-separated MiB per request (default 1,8,64,256)")
    ap.add_argument("--batch-mib", type=float, default=None, help="kvtier's largest batch (measuring it)")
    ap.add_argument("--tail-mib", type=float, default=None, help="kvtier's last batch (measuring it)")
    ap.add_argument("--window-mib", type=float, default=None, help="the NIXL plane's window (measuring it)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config key of every kvtier tier (repeatable; the value as JSON, else a string): "
                         "measuring what it costs, e.g. --set integrity=none")
    a = ap.parse_args(argv)
    mib = (lambda x: None if x is None else int(x * MiB))
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        ap.error(f"unknown systems {bad}; choose from {','.join(SYSTEMS)}")
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else None
    res = run(a.quick, lambda m: print(m, file=sys.stderr, flush=True), a.rounds, a.late_rounds, systems,
              two_hosts=a.two_hosts, sizes=sizes, batch_bytes=mib(a.batch_mib), tail_bytes=mib(a.tail_mib),
              window_bytes=mib(a.window_mib), tier_config=config_settings(a.set))
    res["plan"] = {"batch_mib": a.batch_mib, "tail_mib": a.tail_mib, "window_mib": a.window_mib,
                   "tier_config": config_settings(a.set)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
