"""The table machine's timers as the core exposes them: a restarted timer's old deadline leaves the
queue at once when it is the oldest of its lane (the deadline queue does not keep one stale entry
per restart), and what :meth:`TableMachine.enter` returns is the record the machine now stores.
"""

from __future__ import annotations

from kvtier.lifecycle import ProducerState
from tests.lifecycle.scenario_pair import Pair
from tools.coreview import CoreView


def test_a_restarted_park_timer_leaves_no_stale_entry_behind() -> None:
    # park_clock last_store: each chunk of a chunked prefill restarts the reap deadline from its store
    s = Pair()
    s.store("A", 2, 0.0)
    before = CoreView(s.p).deadline_entries()
    for t in (1.0, 2.0, 3.0):
        s.store("A", 2, t, start=2 * int(t))
        assert CoreView(s.p).deadline_entries() == before
    (deadline,) = [d for d in CoreView(s.p).deadlines() if d.key == "A"]
    assert (deadline.timer, deadline.when) == ("reap", 3.0 + 60.0)  # unbound_store_timeout_s from the last store


def test_enter_returns_the_record_the_machine_stores_a_smaller_one_for_a_retained_id() -> None:
    s = Pair()
    producer = s.p.machines()["producer"]
    fresh = producer.new_record("T")
    stored = producer.enter(fresh, ProducerState.TOMBSTONED, 1.0)
    assert stored is not fresh and stored is producer.records["T"]
    assert s.p.producer_state("T") is ProducerState.TOMBSTONED
    parked = producer.new_record("P")
    assert producer.enter(parked, ProducerState.PARKED, 1.0) is parked


def test_a_record_moving_to_another_timer_leaves_no_stale_entry_behind() -> None:
    s = Pair()
    s.store("A", 2, 0.0)  # parked: its reap deadline is the producer's first entry
    before = CoreView(s.p).deadline_entries()
    _, _, out = s.load("A", 2, 1.0)
    s.forward_fetch(out, 1.0)  # serving: the reap deadline gives way to the transfer's
    assert CoreView(s.p).deadline_entries() == before
    (deadline,) = [d for d in CoreView(s.p).deadlines() if d.key == "A"]
    assert (deadline.timer, deadline.when) == ("transfer", 1.0 + 30.0)  # transfer_timeout_s
