"""What the producer's prune order costs, as the snapshot's ``deadline_entries`` counts it: an id
that leaves retention out of order (a store of a new life parks over its tombstone, decision I20)
leaves one stale entry behind, and the stale entries are dropped all at once only when an
out-of-order exit finds more of them than 64 plus twice the ids still retained (amortised O(1):
the copy frees at least as many entries as it keeps), or when such an id is retained again (its
stale entry must not stand for the new life), or one by one as they reach the front.  Ordinary
hand-offs (a store, a fetch, another id retained) never pay for that clean-up.  Whatever the
order holds, every retained id is pruned exactly at its time, and the order holds each retained
id once and each id that left early once (``tools.snapshot.index_problems``).

Every figure follows from :class:`~tests.lifecycle.scenario_pair.Pair`'s settings (retention and
reap 60 s) and the scenario's own ids.
"""

from __future__ import annotations

import pytest

from kvtier.lifecycle import ProducerState
from tests.lifecycle.scenario_pair import Pair
from tools import snapshot


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
        assert snapshot.index_problems(s.p) == [], exits
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
    # a store of another id is a move between live states: it leaves the order alone, and so
    # does retaining another id
    s.store("A", 1, 60.5)
    assert s.p.producer_state("A") is ProducerState.PARKED and _prune_entries(s, others) == 91
    s.abort("B", 60.5)  # an abort of an id never stored: tombstoned at once
    assert s.p.producer_state("B") is ProducerState.TOMBSTONED and _prune_entries(s, others) == 92
    # the next id to leave out of order finds 92 entries for 9 retained ids (92 > 64 + 18): re-packed
    _new_life(s, late[4], 60.5)
    assert _prune_entries(s, others) == 9 and snapshot.index_problems(s.p) == []
    s.p.fire(60.9)
    assert len(s.p.records().retained) == 9
    s.p.fire(61.0)
    assert s.p.records().retained == frozenset({"B"}) and _prune_entries(s, others) == 1


def test_an_id_retained_again_in_a_new_life_leaves_the_ids_behind_its_old_entry_pruned_on_time() -> None:
    s = Pair()
    _tombstone(s, ["W", "X", "Y", "Z"], 0.0)  # retained until t=60
    _new_life(s, "X", 1.0)  # X leaves from the middle: its entry goes stale
    s.abort("X", 2.0)  # its new life is tombstoned too: retained until t=62, behind Z
    assert s.p.records().retained == frozenset({"W", "X", "Y", "Z"}) and snapshot.index_problems(s.p) == []
    assert s.p.next_deadline() == 60.0
    s.p.fire(59.9)
    assert len(s.p.records().retained) == 4
    s.p.fire(60.0)
    assert s.p.records().retained == frozenset({"X"})  # W, Y and Z at their time, not X's
    assert s.p.next_deadline() == 62.0
    s.p.fire(62.0)
    assert s.p.producer_state("X") is ProducerState.ABSENT and s.p.records().retained == frozenset()


@pytest.mark.parametrize("where", ["tick", "next_deadline", "cap"])
def test_a_stale_entry_dropped_at_the_front_leaves_the_prune_order_consistent(where: str) -> None:
    s = Pair(tombstone_max=2 if where == "cap" else 65536)
    _tombstone(s, ["W", "X"], 0.0)
    _new_life(s, "X", 1.0)  # X's entry goes stale behind W's
    _new_life(s, "W", 1.0)  # W's leaves from the front: X's stale entry heads the order
    assert snapshot.index_problems(s.p) == []
    if where == "tick":
        s.p.fire(1.0)
    elif where == "next_deadline":
        assert s.p.next_deadline() == 61.0  # W's and X's reap (parked at t=1)
    else:
        _tombstone(s, ["A", "B", "C"], 2.0)  # C makes three: the cap skips X's entry, evicts A
        assert s.p.records().retained == frozenset({"B", "C"})
    assert snapshot.index_problems(s.p) == []
    _tombstone(s, ["X"], 3.0)  # X retained again: nothing of its old entry is left to stand for it
    assert snapshot.index_problems(s.p) == []
