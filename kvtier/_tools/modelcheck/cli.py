"""``kvtier check`` / ``python -m kvtier._tools.modelcheck``: the command line."""

from __future__ import annotations

import argparse
import sys

from kvtier._tools.modelcheck.bounds import Bounds
from kvtier._tools.modelcheck.result import format_result
from kvtier._tools.modelcheck.search import check

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``kvtier check``: 0 when every property holds, 1 on a violation (trace printed), 2 on a
    usage error, 3 when the state space exceeded ``--max-states``."""
    ap = argparse.ArgumentParser(prog="kvtier check", description="Bounded exhaustive model check of the lifecycle.")
    d = Bounds()
    ap.add_argument("--bug", default=None, help="run against a planted bug variant (kvtier.testing.planted)")
    ap.add_argument("--list-bugs", action="store_true", help="list planted bug variants and exit")
    ap.add_argument("--ids", type=int, default=d.ids)
    ap.add_argument("--consumers", type=int, default=d.consumers)
    ap.add_argument("--depth", type=int, default=d.depth)
    ap.add_argument("--faults", type=int, default=d.faults, help="lost or duplicated messages")
    ap.add_argument("--chunks", type=int, default=d.chunks)
    ap.add_argument("--loads-per-id", type=int, default=d.loads_per_id)
    ap.add_argument("--crashes", type=int, default=d.crashes)
    ap.add_argument("--tombstone-max", type=int, default=d.tombstone_max)
    ap.add_argument("--max-pending", type=int, default=d.max_pending)
    ap.add_argument("--park-clock", choices=("last_store", "first_store"), default=d.park_clock)
    ap.add_argument("--no-transfer-failures", action="store_true")
    ap.add_argument("--drain", action="store_true")
    ap.add_argument("--shutdown", action="store_true")
    ap.add_argument("--reorder", action="store_true", help="deliver any queued message, not only the oldest")
    ap.add_argument("--routing", choices=("fixed", "any"), default=d.routing)
    ap.add_argument("--fault-scope", choices=("per_peer", "total"), default=d.fault_scope)
    ap.add_argument("--no-prune-timers", action="store_true")
    ap.add_argument("--no-abandon", action="store_true")
    ap.add_argument("--no-reduce", action="store_true", help="no partial-order reduction")
    ap.add_argument("--max-states", type=int, default=d.max_states)
    args = ap.parse_args(argv)
    if args.list_bugs:
        from kvtier.testing.planted import PLANTED

        for name, fn in sorted(PLANTED.items()):
            print(f"{name}: {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    if min(args.ids, args.consumers) < 1 or args.depth < 0 or args.faults < 0 or args.chunks < 1:
        print("kvtier check: --ids, --consumers and --chunks must be >= 1; --depth, --faults >= 0", file=sys.stderr)
        return 2
    bounds = Bounds(
        ids=args.ids,
        consumers=args.consumers,
        depth=args.depth,
        faults=args.faults,
        chunks=args.chunks,
        loads_per_id=args.loads_per_id,
        crashes=args.crashes,
        tombstone_max=args.tombstone_max,
        max_pending=args.max_pending,
        park_clock=args.park_clock,
        transfer_failures=not args.no_transfer_failures,
        drain=args.drain,
        shutdown=args.shutdown,
        reorder=args.reorder,
        routing=args.routing,
        fault_scope=args.fault_scope,
        prune_timers=not args.no_prune_timers,
        abandon=not args.no_abandon,
        reduce=not args.no_reduce,
        max_states=args.max_states,
    )
    try:
        r = check(bounds, bug=args.bug, progress=True)
    except KeyError as exc:
        print(f"kvtier check: {exc.args[0]}", file=sys.stderr)
        return 2
    print(format_result(r))
    if r.truncated:
        return 3
    return 0 if r.ok else 1
