"""Shared plumbing of the benchmark suite: statistics, CPU-noise meter, machine description.
(The benchmarks' child processes are :class:`tools.child.Child` objects.)

Nothing here knows about kvtier itself.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import statistics
import time
from collections.abc import Sequence
from typing import Any

# -- statistics ---------------------------------------------------------------------------------


def summary(xs: Sequence[float]) -> dict[str, float | int]:
    """``{"median", "min", "max", "n"}`` of a non-empty sequence (p90/p99 when n >= 10)."""
    xs = [float(x) for x in xs]
    if not xs:
        raise ValueError("summary() of an empty sequence")
    out: dict[str, float | int] = {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }
    if len(xs) >= 10:
        s = sorted(xs)
        out["p90"] = s[min(len(s) - 1, int(math.ceil(0.90 * len(s))) - 1)]
        out["p99"] = s[min(len(s) - 1, int(math.ceil(0.99 * len(s))) - 1)]
    return out


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> dict[str, float | int]:
    """Summary of ``a[i] / b[i]`` over interleaved pairs (A and B measured back to back)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_ratio needs equal, non-empty lists (got {len(a)} and {len(b)})")
    return summary([x / y for x, y in zip(a, b)])


def fmt_ratio(r: dict[str, Any] | None, digits: int = 2) -> str:
    if not r:
        return "—"
    return f"{r['median']:.{digits}f}× ({r['min']:.{digits}f}–{r['max']:.{digits}f})"


def fmt_si(x: float, unit: str = "", digits: int = 3) -> str:
    """Engineering notation: 1.23 k, 45.6 M …"""
    if x is None or not math.isfinite(x):
        return "—"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g} {prefix}{unit}"
    return f"{x:.{digits}g} {unit}".rstrip()


def fmt_time(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.3g} µs"
    return f"{seconds * 1e9:.3g} ns"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


def target(op: str, value: float, achieved: float | None, text: str) -> dict[str, Any]:
    """A target record: ``achieved op value`` (op one of ``>=``, ``<=``)."""
    if achieved is None or not math.isfinite(achieved):
        met = None
    elif op == ">=":
        met = achieved >= value
    elif op == "<=":
        met = achieved <= value
    else:  # pragma: no cover - programming error
        raise ValueError(op)
    return {"text": text, "op": op, "value": value, "achieved": achieved, "met": met}


# -- CPU noise ----------------------------------------------------------------------------------


def _proc_stat() -> tuple[float, float]:
    """(busy jiffies of all CPUs, steal jiffies) from /proc/stat; (nan, nan) if unreadable."""
    try:
        with open("/proc/stat") as fh:
            parts = fh.readline().split()
    except OSError:
        return math.nan, math.nan
    vals = [float(v) for v in parts[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = vals[:7]
    steal = vals[7] if len(vals) > 7 else 0.0
    return user + nice + system + irq + softirq, steal


def _our_cpu_s() -> float:
    """CPU seconds of this process, its waited-for children and its live descendants (with what
    each of them waited for: a fork server's finished children, tools.child)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                ct = child.cpu_times()
                total += ct.user + ct.system + ct.children_user + ct.children_system
            except psutil.Error:
                pass
    except ImportError:  # pragma: no cover - psutil is a dev dependency
        pass
    return total


class CpuMeter:
    """How many cores *other* processes used while a benchmark ran (from /proc/stat jiffies
    minus our own process tree; about ±0.2 core). ``quiet`` when others used < 0.25 core."""

    def __init__(self) -> None:
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.start()

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._busy0, self._steal0 = _proc_stat()
        self._ours0 = _our_cpu_s()

    def stop(self) -> dict[str, float | bool]:
        wall = max(1e-9, time.monotonic() - self._t0)
        busy, steal = _proc_stat()
        ours = _our_cpu_s() - self._ours0
        all_s = (busy - self._busy0) / self._hz
        others = max(0.0, (all_s - ours) / wall)
        return {
            "wall_s": round(wall, 3),
            "our_cores": round(ours / wall, 3),
            "others_cores": round(others, 3),
            "steal_cores": round((steal - self._steal0) / self._hz / wall, 3),
            "quiet": others < 0.25,
            "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan,
        }


# -- machine description ------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, Any]:
    cpu_model = "unknown"
    flags = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and cpu_model == "unknown":
                    cpu_model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = line
    except OSError:
        pass
    mem_kib = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu_model,
        "hypervisor": "hypervisor" in flags.split(),
        "ram_gib": round(mem_kib / (1 << 20), 1) if mem_kib else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "pyzmq": _version("pyzmq"),
        "transitions": _version("transitions"),
        "msgspec": _version("msgspec"),
        "transformers": _version("transformers"),
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        import zmq

        info["libzmq"] = zmq.zmq_version()
    except ImportError:  # pragma: no cover
        info["libzmq"] = "not installed"
    return info
