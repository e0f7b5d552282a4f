"""A core's indexes, checked against its records (:mod:`tools.snapshot` re-exports both): the
per-peer and per-state indexes every machine keeps beside its records, read as one value
(:func:`indexes`) and compared with what the records imply (:func:`index_problems`), so a restore
or a transition that forgot an index is caught by the model checker and the tests.
"""

from __future__ import annotations

from typing import Any

from kvtier.lifecycle._table import ProbeState, ProducerState
from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.producer_records import RETAINED


def indexes(core: TierCore) -> tuple:
    """The indexes the machines keep beside their records, canonically: the producer's ids per
    bound peer, fetches awaiting blocks per peer, quarantined ids, retained ids (in prune order),
    and the consumer's ids per producer peer."""
    pm, cm = core._producer, core._consumer
    qm, rm, vm = core._probe, core._rounds, core._serve

    def per(index: dict) -> tuple:
        return tuple(sorted((k, tuple(sorted(v))) for k, v in index.items() if v))

    return (
        per(pm.by_peer),
        tuple(sorted(pm.awaiting_per_peer.items())),
        tuple(sorted(pm.quarantined)),
        tuple(pm.retained),
        per(cm.by_peer),
        # the symmetric path's (decision M14)
        per(qm.by_peer),
        tuple(sorted(qm.collecting)),
        per(rm.by_peer),
        per(rm.by_request),
        tuple((peer, tuple(rounds)) for peer, rounds in sorted(rm._open.items()) if rounds),
        per(vm.by_peer),
        tuple(sorted((peer, tuple(sorted(held.items()))) for peer, held in vm.holds_per_peer.items())),
        tuple(sorted(vm.holds.items())),
    )


P_BOUND = frozenset({
    ProducerState.AWAITING, ProducerState.SERVING, ProducerState.DELIVERING, ProducerState.CONFIRMED,
    ProducerState.CANCELLING, ProducerState.QUARANTINED,
})


def index_problems(core: TierCore) -> list[str]:
    """Where an index disagrees with a scan of the records it indexes (empty when none does):
    the shell reads the indexes instead of scanning (quarantine gauge and log every tick, the
    per-peer fan-out of a session's end), so a drifted index is a wrong gauge or a missed end."""
    pm, cm = core._producer, core._consumer
    recs = pm.records.values()
    out = []
    bound: dict[str, set[str]] = {}
    awaiting: dict[str, int] = {}
    awaiting_keys: dict[str, int] = {}
    for r in recs:
        if r.state in P_BOUND:
            bound.setdefault(r.peer, set()).add(r.key)
        if r.state is ProducerState.AWAITING:
            awaiting[r.peer] = awaiting.get(r.peer, 0) + 1
            awaiting_keys[r.peer] = awaiting_keys.get(r.peer, 0) + len(r.demand)
    checks = (
        ("producer ids per bound peer", {p: set(ids) for p, ids in pm.by_peer.items() if ids}, bound),
        ("producer fetches awaiting blocks per peer", dict(pm.awaiting_per_peer), awaiting),
        ("keys of the fetches awaiting blocks per peer", dict(pm.awaiting_keys), awaiting_keys),
        ("quarantined producer ids", set(pm.quarantined), {r.key for r in recs if r.state is ProducerState.QUARANTINED}),
        ("retained producer ids", set(pm.retained), {r.key for r in recs if r.state in RETAINED}),
        ("consumer ids per producer peer", {p: set(ids) for p, ids in cm.by_peer.items() if ids},
         _group((r.peer, r.key) for r in cm.records.values())),
    )
    for what, index, scan in checks:
        if index != scan:
            out.append(f"{what}: index {index} != records {scan}")
    qm, rm, vm = core._probe, core._rounds, core._serve
    sym = (
        ("probe ids per peer", {p: set(ids) for p, ids in qm.by_peer.items() if ids},
         _group((r.peer, r.key) for r in qm.records.values())),
        ("probes collecting", set(qm.collecting),
         {r.key for r in qm.records.values() if r.state is ProbeState.COLLECTING}),
        ("round loads per peer", {p: set(ids) for p, ids in rm.by_peer.items() if ids},
         _group((r.peer, r.key) for r in rm.records.values())),
        ("round loads per request", {k: set(ids) for k, ids in rm.by_request.items() if ids},
         _group((r.kv_request_id, r.key) for r in rm.records.values())),
        ("serve rounds per peer", {p: set(ids) for p, ids in vm.by_peer.items() if ids},
         _group((r.peer, r.key) for r in vm.records.values())),
        ("serve holds per peer and block", vm.holds_per_peer, _holds(vm.records.values(), by_peer=True)),
        ("serve holds per block", vm.holds, _holds(vm.records.values(), by_peer=False)),
    )
    for what, index, scan in sym:
        if index != scan:
            out.append(f"{what}: index {index} != records {scan}")
    missing = [k for k in pm.retained if k not in set(pm._prune_order)]
    if missing:
        out.append(f"retained ids missing from the prune order: {missing}")
    # each id once: a retained one, or one that left retention early (its stale entry)
    order, left = list(pm._prune_order), pm._left_early
    if len(set(order)) != len(order) or set(order) != set(pm.retained) | left or left & pm.retained.keys():
        out.append(f"the prune order {order} is not each retained id {list(pm.retained)} once and each id "
                   f"that left retention early {sorted(left)} once")
    return out


def _group(pairs: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for peer, key in pairs:
        out.setdefault(peer, set()).add(key)
    return out


def _holds(records: Any, *, by_peer: bool) -> dict:
    """The serve machine's pin counts rebuilt from its records: per pool block, or per peer and block."""
    out: dict = {}
    for r in records:
        counts = out.setdefault(r.peer, {}) if by_peer else out
        for b in r.held:
            counts[b] = counts.get(b, 0) + 1
    return {p: c for p, c in out.items() if c} if by_peer else out
