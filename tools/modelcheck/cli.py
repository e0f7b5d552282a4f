"""``python -m tools check`` / ``python -m tools.modelcheck``: the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs

from tools.modelcheck.bounds import PROFILES, Bounds
from tools.modelcheck.result import Result, format_result
from tools.modelcheck.search import check, check_profiles

__all__ = ["main"]

# option -> Bounds field, for the options that change one bound
_INT = ("ids", "consumers", "depth", "faults", "chunks", "loads_per_id", "lives", "crashes", "tombstone_max",
        "max_pending", "max_states", "sym_keys")
_CHOICE = {"park_clock": ("last_store", "first_store"), "routing": ("fixed", "any"),
           "fault_scope": ("per_peer", "total")}
_ON = ("drain", "shutdown", "reorder", "one_sided", "pings", "attach_later")
_OFF = {"no_transfer_failures": "transfer_failures", "no_prune_timers": "prune_timers", "no_abandon": "abandon",
        "no_reduce": "reduce", "no_batching": "batching", "no_corruption": "corruption", "unconnected": "connected"}
_HELP = {
    "faults": "lost, duplicated or corrupt messages (per connection)",
    "lives": "lives per id: store and load it again after its tombstone is pruned",
    "crashes": "session deaths (disconnect, connection close, a heartbeat finding the peer silent)",
    "pings": "heartbeats without silence: the consumer pings, the producer answers",
    "attach_later": "the data planes take or refuse descriptors in a later step (sessions wait in attaching)",
    "unconnected": "no session before the search: the first load dials and the handshake is explored",
    "reorder": "deliver any queued message, not only the oldest",
    "one_sided": "a one-sided data plane: revocations complete later",
    "no_reduce": "no partial-order reduction",
    "no_batching": "apply each message as it arrives (no unread messages in sockets)",
    "no_corruption": "no corrupt landings among the faults",
    "sym_keys": "keys of the symmetric profile's request (1 or 2)",
}


def main(argv: list[str] | None = None) -> int:
    """``python -m tools check``: 0 when every property holds, 1 on a violation (trace printed), 2 on a
    usage error, 3 when the state space exceeded ``--max-states``.

    Without bound options it explores every profile of :data:`~.bounds.PROFILES` in turn (``--profile
    NAME``: that one); a bound option explores one configuration, the profile (default ``core``) with
    that change."""
    ap = argparse.ArgumentParser(
        prog="python -m tools check",
        description="Bounded exhaustive model check of the lifecycle.  Without options: every profile "
        f"({', '.join(PROFILES)}), each explored to exhaustion.",
    )
    ap.add_argument("--bug", default=None, help="run against a planted bug variant (tools.planted)")
    ap.add_argument("--list-bugs", action="store_true", help="list planted bug variants and exit")
    ap.add_argument("--profile", choices=tuple(PROFILES), default=None,
                    help="explore one profile (with bound options: the base they change; default core)")
    ap.add_argument("--chart", type=Path, default=None, metavar="DIR",
                    help="on a violation, also draw the counterexample as a sequence chart: DIR/<bug>.dot and .svg")
    for name in _INT:
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=_HELP.get(name))
    for name, choices in _CHOICE.items():
        ap.add_argument(f"--{name.replace('_', '-')}", choices=choices, default=None)
    for name in (*_ON, *_OFF):
        ap.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=_HELP.get(name))
    args = ap.parse_args(argv)
    if args.list_bugs:
        from tools.planted import PLANTED

        for name, fn in sorted(PLANTED.items()):
            print(f"{name}: {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    changes: dict[str, object] = {n: getattr(args, n) for n in (*_INT, *_CHOICE) if getattr(args, n) is not None}
    changes.update({n: True for n in _ON if getattr(args, n)})
    changes.update({field: False for opt, field in _OFF.items() if getattr(args, opt)})
    try:
        if changes or args.profile:
            base = args.profile or "core"
            bounds = attrs.evolve(PROFILES[base], **changes)
            problem = _invalid(bounds)
            if problem:
                print(f"python -m tools check: {problem}", file=sys.stderr)
                return 2
            results = [check(bounds, bug=args.bug, progress=True, profile=base if not changes else None)]
        else:
            results = check_profiles(bug=args.bug, progress=True)
    except KeyError as exc:
        print(f"python -m tools check: {exc.args[0]}", file=sys.stderr)
        return 2
    print("\n\n".join(format_result(r) for r in results))
    bad = next((r for r in results if r.violation is not None), None)
    if bad is not None and args.chart is not None:
        _chart(bad, args.chart)
    if bad is not None:
        return 1
    return 3 if any(r.truncated for r in results) else 0


def _invalid(b: Bounds) -> str | None:
    """What is wrong with ``b``, or None."""
    if min(b.ids, b.consumers, b.chunks, b.lives) < 1 or b.depth < 0 or b.faults < 0 or b.crashes < 0:
        return "--ids, --consumers, --chunks and --lives must be >= 1; --depth, --faults, --crashes >= 0"
    if max(b.ids, b.consumers, b.chunks, b.lives) > 10:
        return "--ids, --consumers, --chunks and --lives must be <= 10 (job ids encode them in decimal digits)"
    if b.symmetric and (b.ids != 1 or b.consumers != 1 or not 1 <= b.sym_keys <= 2):
        return "the symmetric profile explores one request (--ids 1 --consumers 1) of 1 or 2 keys (--sym-keys)"
    return None


def _chart(r: Result, directory: Path) -> None:
    from tools.modelcheck.chart import write_chart

    try:
        paths = write_chart(r, directory)
    except FileNotFoundError as exc:  # no Graphviz: the text trace above is the counterexample
        print(f"python -m tools check: no chart: {exc}", file=sys.stderr)
        return
    print(f"chart: {' '.join(str(p) for p in paths)}")
