"""When the deadline queue drops its stale entries, as the snapshot's ``deadline_entries`` counts
them (kvtier.lifecycle.deadlines): all at once when the entries reported stale are more than
half of the queue and more than ``STALE_FLOOR``, or at the end of a tick once the queue holds
more than ``STALE_FLOOR`` plus four entries per live record (the backstop); otherwise one by one
as they surface at their lane's head.  A timer that fired leaves no stale entry (it was popped),
and neither does a record that left its timer for a state without one, so firing many timers, or
releasing many quarantined ids, never counts as many stale entries.

The producer's reap deadline is the lane used (``unbound_store_timeout_s``); every figure
follows from the scenario's ids and :class:`~tests.lifecycle.scenario_pair.Pair`'s settings.
"""

from __future__ import annotations

from kvtier.lifecycle import ProducerState
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.deadlines import STALE_FLOOR
from tests.lifecycle.scenario_pair import Pair, keys


def _park(s: Pair, kids: list[str], t: float) -> None:
    for kid in kids:
        s.store(kid, 1, t)


def test_firing_many_timers_counts_no_stale_entry_so_a_lone_stale_one_waits_for_its_lanes_head() -> None:
    s = Pair()
    fired = [f"F{i:04d}" for i in range(STALE_FLOOR + 4)]
    _park(s, fired, 0.0)  # reaped at t=60
    _park(s, ["A"], 1.0)  # reaped at t=61
    _park(s, ["S"], 2.0)
    s.abort("S", 2.0)  # S's reap entry goes stale behind A's: the only stale entry
    before = s.p.snapshot().deadline_entries  # every reap entry, S's stale one included, and S's prune
    s.p.fire(60.0)
    assert all(s.p.producer_state(k) is ProducerState.TOMBSTONED for k in (fired[0], fired[-1]))
    # the fired entries left the queue and their prunes entered the prune order; S's stale entry is
    # one of two left in the queue: not more than half, so no compaction drops it
    assert s.p.snapshot().deadline_entries == before
    s.p.fire(61.0)  # A reaped: S's stale entry surfaces at the lane's head and goes with it
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    assert s.p.snapshot().deadline_entries == before - 2 + 1  # A's reap and S's stale entry out, A's prune in


def test_stale_entries_of_ids_that_are_gone_are_dropped_at_the_next_tick() -> None:
    # retention 1 id: an aborted id is evicted at once, so the records go while their stale
    # reap entries stay in the queue (reported, but never more than half of it)
    s = Pair(tombstone_max=1, unbound_store_timeout_s=1000.0)
    n = STALE_FLOOR + 104
    others = s.p.snapshot().deadline_entries
    _park(s, [f"Y{i:04d}" for i in range(n)], 0.0)  # reaped at t=1000: they keep the stale below half
    _park(s, ["X"], 0.5)  # reaped at t=1000.5: heads the lane once the Ys fired
    gone = [f"Z{i:04d}" for i in range(n)]
    _park(s, gone, 0.6)
    for kid in gone:
        s.abort(kid, 0.6)
    assert s.p.snapshot().deadline_entries == others + 2 * n + 1 + 1  # reap entries (n stale) and one prune
    s.p.fire(1000.0)  # the Ys are reaped (and evicted): X's entry, then the n stale ones, are left
    assert s.p.producer_state("X") is ProducerState.PARKED and len(s.p.records().retained) == 1
    s.p.fire(1000.1)  # nothing due; n + 1 entries for 2 records: the backstop drops the stale ones
    assert s.p.snapshot().deadline_entries == others + 1 + 1  # X's reap and the retained id's prune
    s.p.fire(1000.5)
    assert s.p.producer_state("X") is ProducerState.TOMBSTONED


def test_ids_released_from_quarantine_count_no_stale_entry_so_a_lone_stale_one_waits_for_its_lanes_head() -> None:
    s = Pair()
    quarantined = [f"Q{i:04d}" for i in range(STALE_FLOOR + 4)]
    rounds = {}
    for kid in quarantined:  # served at t=0: given up at t=30, quarantined at t=60 (transfer_timeout_s)
        s.store(kid, 1, 0.0)
        rounds[kid] = s.fresh_round()
        s.fetch(kid, keys(kid, 1), 0.0, rounds[kid])
    _park(s, ["A"], 1.0)  # reaped at t=61
    _park(s, ["S"], 2.0)
    s.abort("S", 2.0)  # S's reap entry goes stale behind A's: the only stale entry
    s.p.fire(30.0)
    s.p.fire(60.0)
    assert all(s.p.producer_state(k) is ProducerState.QUARANTINED for k in (quarantined[0], quarantined[-1]))
    before = s.p.snapshot().deadline_entries
    for kid in quarantined:  # the plane lets go at last: each id is retained (its prune enters the order)
        s.p.handle(ix.TransferReleased(kid, rounds[kid]), 60.5)
    assert s.p.producer_state(quarantined[-1]) is ProducerState.TOMBSTONED  # no receipt came
    assert s.p.snapshot().deadline_entries == before + len(quarantined)  # S's stale entry still waits
    s.p.fire(61.0)  # A reaped: S's stale entry surfaces at the lane's head and goes with it
    assert s.p.snapshot().deadline_entries == before + len(quarantined) - 2 + 1
