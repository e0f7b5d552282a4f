"""What the producer's prune order costs, as the snapshot's ``deadline_entries`` counts it: an id
that leaves retention out of order (a store of a new life parks over its tombstone, decision I20)
leaves one stale entry behind, and the stale entries are dropped all at once only when an
out-of-order exit finds more of them than 64 plus twice the ids still retained (amortised O(1):
the copy frees at least as many entries as it keeps), or one by one as they reach the front.
Ordinary hand-offs (a store, a fetch) never pay for that clean-up.

Every figure follows from :class:`~tests.lifecycle.scenario_pair.Pair`'s settings (retention and
reap 60 s) and the scenario's own ids.
"""

from __future__ import annotations

import pytest

from kvtier.lifecycle import ProducerState
from tests.lifecycle.scenario_pair import Pair


def _tombstone(s: Pair, kids: list[str], t: float) -> None:
    """Each id's tombstone is retained from ``t`` (its reap deadline leaves the queue at once)."""
    for kid in kids:
        s.store(kid, 1, t, life="L1")
        s.abort(kid, t)


def _new_life(s: Pair, kid: str, t: float) -> None:
    """``kid`` leaves retention before its prune: a store of a new life parks over its tombstone."""
    s.store(kid, 1, t, owner=f"req-{kid}-2", life="L2")
    assert s.p.producer_state(kid) is ProducerState.PARKED


def _prune_entries(s: Pair, others: int) -> int:
    """The prune order's entries: the snapshot's deadline entries less every parked id's reap
    deadline and the ``others`` (the session's) counted before the scenario."""
    snap = s.p.snapshot()
    return snap.deadline_entries - len(snap.parked) - others


@pytest.mark.parametrize("n", [100, 101])
def test_stale_prune_entries_are_dropped_once_they_exceed_64_plus_twice_the_retained_ids(n: int) -> None:
    s = Pair()
    kids = [f"R{i:03d}" for i in range(n)]
    _tombstone(s, kids, 0.0)
    others = s.p.snapshot().deadline_entries - n
    assert _prune_entries(s, others) == n  # one entry per retained id
    repack = (n + 64) // 2 + 1  # the first exit after which n entries exceed 64 + 2 * (n - exits)
    for exits, kid in enumerate(reversed(kids), start=1):  # from the back: never the front entry
        _new_life(s, kid, 1.0)
        retained = n - exits
        assert len(s.p.records().retained) == retained
        if exits < repack:
            assert _prune_entries(s, others) == n, exits  # stale entries wait (no O(n) copy per exit)
        else:
            assert _prune_entries(s, others) == retained, exits  # re-packed: only the retained ones
        if exits == repack:
            break
    # the ids left keep their prune time
    s.p.fire(59.9)
    assert len(s.p.records().retained) == n - repack
    s.p.fire(60.0)
    assert s.p.records().retained == frozenset() and _prune_entries(s, others) == 0


def test_a_store_of_another_id_leaves_the_stale_prune_entries_to_the_next_out_of_order_exit() -> None:
    s = Pair()
    early = [f"E{i}" for i in range(10)]  # pruned at t=60
    late = [f"L{i:03d}" for i in range(91)]  # pruned at t=61
    _tombstone(s, early, 0.0)
    _tombstone(s, late, 1.0)
    others = s.p.snapshot().deadline_entries - 101
    for kid in reversed(late[9:]):  # 82 leave from the back: 101 entries stay (101 <= 64 + 2 * 19)
        _new_life(s, kid, 2.0)
    assert len(s.p.records().retained) == 19 and _prune_entries(s, others) == 101
    s.p.fire(60.0)  # the early ten are pruned from the front; L000 (t=61) heads the order now
    assert s.p.records().retained == frozenset(late[:9]) and _prune_entries(s, others) == 91
    # a store of another id is a move between live states: it leaves the order alone
    s.store("A", 1, 60.5)
    assert s.p.producer_state("A") is ProducerState.PARKED and _prune_entries(s, others) == 91
    # the next id to leave out of order finds 91 entries for 8 retained ids (91 > 64 + 16): re-packed
    _new_life(s, late[4], 60.5)
    assert _prune_entries(s, others) == 8
    s.p.fire(60.9)
    assert len(s.p.records().retained) == 8
    s.p.fire(61.0)
    assert s.p.records().retained == frozenset() and _prune_entries(s, others) == 0
