"""What the producer tells its consumer and its engine, word for word, on the ways a transfer
ends badly or late: a given-up transfer's notice, cancellation and terminal answer (decision
I19), an abort answered only once the plane let go, a duplicated fetch counted and dropped, a
late store after the id was done, a binding a store of another life replaces (decision I20), a
consumer named after the first store, and the plane's reports for rounds the id is not bound to.

Every figure follows from :class:`~tests.lifecycle.scenario_pair.Pair`'s settings (transfer
timeout 30 s) and the scenario's own ids, rounds and lives.
"""

from __future__ import annotations

import pytest

from kvtier.lifecycle import ProducerState, Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import CancelTransfer, Ignored, JobDone, SendBlocks
from kvtier.lifecycle.producer import ProducerEvent
from kvtier.wire import messages as wm
from tests.lifecycle.scenario_pair import Pair, done_fail, keys, of, sent
from tools.coreview import CoreView


def _fetch(s: Pair, kid: str, n: int, t: float, *, life: str = "", rnd: int | None = None) -> tuple[int, list]:
    rnd = s.fresh_round() if rnd is None else rnd
    msg = wm.Fetch(gen=s.gen, kv_request_id=kid, round=rnd, keys=list(keys(kid, n)), life=life)
    return rnd, s.to_p(msg, t)


def _serving(life: str = "") -> tuple[Pair, int, int]:
    """A's two blocks parked by one store job (of ``life``) and handed to the plane at t=1."""
    s = Pair()
    job, _ = s.store("A", 2, 0.0, life=life)
    rnd, out = _fetch(s, "A", 2, 1.0, life=life)
    assert of(out, SendBlocks) and s.p.producer_state("A") is ProducerState.SERVING
    return s, job, rnd


def _answer(s: Pair, kid: str, rnd: int, reason: str = "", life: str = "", final: bool = True) -> wm.TransferDone:
    """The transfer_done the producer sends ``kid``'s round ``rnd``: ok when ``reason`` is empty."""
    return wm.TransferDone(gen=s.gen, kv_request_id=kid, round=rnd, ok=not reason, reason=reason, life=life,
                           final=final)


def _dropped(s: Pair, kid: str, rnd: int, t: float, state: str, life: str = "") -> None:
    """Round ``rnd`` was answered: its fetch, duplicated by the network, is dropped unanswered
    (decision I11) and leaves ``kid`` in ``state``."""
    _, out = _fetch(s, kid, 2, t, life=life, rnd=rnd)
    assert out == [Ignored("producer", kid, state, "other_round", Reason.STALE)]


def test_a_timed_out_transfer_is_cancelled_noticed_and_answered_once_the_plane_lets_go() -> None:
    s, job, rnd = _serving(life="L1")
    out = s.p.fire(31.0)  # transfer_timeout_s after the transfer started
    assert s.p.producer_state("A") is ProducerState.CANCELLING
    assert of(out, CancelTransfer) == [CancelTransfer("A", rnd)]
    # the notice names the round, the reason and the pairing's life; it is not the terminal answer
    assert sent(out, wm.TransferDone) == [_answer(s, "A", rnd, "transfer_timeout", "L1", final=False)]
    assert of(out, JobDone) == []  # the plane may still read the blocks
    out = s.p.handle(ix.TransferReleased("A", rnd), 32.0)
    assert sent(out, wm.TransferDone) == [_answer(s, "A", rnd, "transfer_timeout", "L1")]
    assert of(out, JobDone) == [JobDone(job, False, Reason.TRANSFER_TIMEOUT)]
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    _dropped(s, "A", rnd, 33.0, "tombstoned", "L1")  # the round got its terminal answer


def test_an_abort_of_a_transfer_in_flight_is_acknowledged_only_once_the_plane_lets_go() -> None:
    s, job, rnd = _serving(life="L1")
    out = s.to_p(wm.AbortFetch(gen=s.gen, kv_request_id="A", round=rnd, fetched=True, life="L1"), 2.0)
    assert of(out, CancelTransfer) == [CancelTransfer("A", rnd)]
    assert sent(out, wm.AbortAck) == [] and of(out, JobDone) == []
    assert s.p.producer_state("A") is ProducerState.CANCELLING
    out = s.p.handle(ix.TransferReleased("A", rnd), 3.0)
    (ack,) = [e for e in out if isinstance(getattr(e, "msg", None), wm.AbortAck)]
    assert ack.peer == "decode-1"
    assert ack.msg == wm.AbortAck(gen=s.gen, kv_request_id="A", round=rnd, life="L1")
    assert of(out, JobDone) == [JobDone(job, False, Reason.ABORTED)]
    assert sent(out, wm.TransferDone) == []
    _dropped(s, "A", rnd, 4.0, "tombstoned", "L1")


def test_a_fetch_repeated_by_the_network_is_counted_as_a_duplicate_and_nothing_else() -> None:
    s = Pair()
    rnd, out = _fetch(s, "A", 2, 0.0)  # before any store: the fetch binds and waits
    assert s.p.producer_state("A") is ProducerState.AWAITING
    _, out = _fetch(s, "A", 2, 0.5, rnd=rnd)
    assert out == [Ignored("producer", "A", "awaiting", "duplicate", Reason.STALE)]
    assert s.p.producer_state("A") is ProducerState.AWAITING


def test_a_fetch_that_needs_nothing_is_answered_ok_once() -> None:
    s = Pair()
    job, _ = s.store("A", 2, 0.0, life="L1")
    rnd, out = _fetch(s, "A", 0, 1.0, life="L1")  # the consumer needs none of A's blocks
    assert sent(out, wm.TransferDone) == [_answer(s, "A", rnd, life="L1")]
    assert of(out, JobDone) == [JobDone(job, True, Reason.NOT_NEEDED)]
    assert s.p.producer_state("A") is ProducerState.DONE
    _dropped(s, "A", rnd, 1.5, "done", "L1")
    # so is an empty fetch that came before any store
    rnd, out = _fetch(s, "B", 0, 2.0, life="L2")
    assert sent(out, wm.TransferDone) == [_answer(s, "B", rnd, life="L2")]
    _dropped(s, "B", rnd, 2.5, "done", "L2")


def test_a_store_after_a_fetch_that_needed_nothing_succeeds_as_not_needed() -> None:
    s = Pair()
    out = s.fetch("A", (), 0.0)  # the consumer needs none of A's blocks
    assert s.p.producer_state("A") is ProducerState.DONE
    job, out = s.store("A", 2, 1.0)
    assert of(out, JobDone) == [JobDone(job, True, Reason.NOT_NEEDED, at_submission=True)]
    assert s.p.producer_state("A") is ProducerState.DONE


def test_a_store_after_a_completed_hand_off_fails_as_round_finished() -> None:
    s = Pair()
    job, _ = s.store("A", 2, 0.0)
    rnd, _ = _fetch(s, "A", 2, 1.0)
    out = s.complete("A", rnd, 2.0)
    assert of(out, JobDone) == [JobDone(job, True, None)]
    late, out = s.store("A", 2, 3.0)
    assert of(out, JobDone) == [JobDone(late, False, Reason.ROUND_FINISHED, at_submission=True)]


def test_a_store_of_another_life_unbinds_the_waiting_fetch_and_takes_the_id_for_its_own_life() -> None:
    s = Pair()
    rnd, _ = _fetch(s, "A", 2, 0.0, life="L1")  # bound before any store
    assert s.p.producer_state("A") is ProducerState.AWAITING
    job, out = s.store("A", 2, 1.0, life="L2")
    assert done_fail(out, "A") == _answer(s, "A", rnd, "id_in_use", "L1")
    assert of(out, JobDone) == []  # the store is parked for its own consumer
    assert s.p.producer_state("A") is ProducerState.PARKED
    view = CoreView(s.p).producer("A")
    assert (view.round, view.gen, view.demand) == (-1, 0, ())  # no binding left
    # the id now belongs to L2: the old life's fetch is refused, the new life's is served
    old, out = _fetch(s, "A", 2, 2.0, life="L1")
    assert done_fail(out, "A") == _answer(s, "A", old, "id_in_use", "L1")
    _, out = _fetch(s, "A", 2, 3.0, life="L2")
    assert of(out, SendBlocks) and s.p.producer_state("A") is ProducerState.SERVING


def test_a_consumer_named_after_the_first_store_guards_the_id_after_its_request_ends() -> None:
    s = Pair()
    s.store("A", 2, 0.0)  # the store names no consumer
    s.p.handle(ix.ConsumerNamed("A", "someone-else"), 0.1)
    s.p.handle(ix.RequestFinished("A", producer=True), 0.2)  # the request's own naming is forgotten
    assert CoreView(s.p).producer("A").consumer == "someone-else"
    rnd, out = _fetch(s, "A", 2, 1.0)  # the pair's consumer is not the one named
    assert done_fail(out, "A").reason == "not_authorised"
    assert s.p.producer_state("A") is ProducerState.PARKED
    _dropped(s, "A", rnd, 1.5, "parked")  # the refusal answered the round


def test_a_finished_requests_naming_does_not_outlive_it() -> None:
    s = Pair()
    s.p.handle(ix.ConsumerNamed("A", "someone-else"), 0.0)
    s.p.handle(ix.RequestFinished("A", producer=True), 0.5)  # nothing stored: tombstoned, then pruned
    s.p.fire(61.0)
    assert s.p.producer_state("A") is ProducerState.ABSENT
    # a later request that reuses the id names nobody: the pair's consumer may bind it
    _, out = _fetch(s, "A", 2, 62.0)
    assert sent(out, wm.TransferDone) == [] and s.p.producer_state("A") is ProducerState.AWAITING


def test_a_request_that_stored_nothing_tombstones_its_own_life_only() -> None:
    s = Pair()
    s.p.handle(ix.RequestFinished("A", producer=True, life="L1"), 0.0)
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    job, out = s.store("A", 1, 1.0, life="L1")  # a late store of the same life meets the tombstone
    assert of(out, JobDone) == [JobDone(job, False, Reason.NOTHING_STORED, at_submission=True)]
    job, out = s.store("A", 1, 2.0, owner="req-A2", life="L2")  # another life parks over it
    assert of(out, JobDone) == [] and s.p.producer_state("A") is ProducerState.PARKED


def test_the_consumer_a_store_named_is_not_replaced_by_a_later_naming() -> None:
    s = Pair()
    s.store("A", 2, 0.0, consumer="cons")  # the pair's consumer (its hello's instance)
    s.p.handle(ix.ConsumerNamed("A", "someone-else"), 0.1)
    s.p.handle(ix.RequestFinished("A", producer=True), 0.2)
    assert CoreView(s.p).producer("A").consumer == "cons"
    _, out = _fetch(s, "A", 2, 1.0)
    assert of(out, SendBlocks) and s.p.producer_state("A") is ProducerState.SERVING


def test_the_planes_report_of_a_round_the_id_is_not_bound_to_is_stale() -> None:
    s, job, rnd = _serving()
    out = s.p.handle(ix.TransferReleased("A", rnd + 7), 2.0)
    assert out == [Ignored("producer", "A", ProducerState.SERVING, ProducerEvent.TRANSFER_RELEASED, Reason.STALE)]
    assert s.p.producer_state("A") is ProducerState.SERVING
    out = s.p.handle(ix.TransferReleased("B", 0, failed=True), 2.0)  # an id with no record
    assert out == [Ignored("producer", "B", ProducerState.ABSENT, ProducerEvent.TRANSFER_FAILED, Reason.STALE)]
    s.store("P", 1, 2.0)  # parked, never bound: round -1 is no binding
    out = s.p.handle(ix.TransferReleased("P", -1), 2.0)
    assert out == [Ignored("producer", "P", ProducerState.PARKED, ProducerEvent.TRANSFER_RELEASED, Reason.STALE)]
    assert s.p.producer_state("P") is ProducerState.PARKED
    # the bound round's own report still moves the transfer on
    s.p.handle(ix.TransferReleased("A", rnd), 3.0)
    assert s.p.producer_state("A") is ProducerState.DELIVERING


def test_a_receipt_that_retains_one_id_too_many_evicts_the_oldest_in_its_own_step() -> None:
    s = Pair(tombstone_max=1)
    s.abort("Z", 0.0)  # Z is tombstoned: the one retained id allowed
    assert s.p.producer_state("Z") is ProducerState.TOMBSTONED
    job, _ = s.store("A", 1, 0.0)
    rnd, _ = _fetch(s, "A", 1, 1.0)
    s.p.handle(ix.TransferReleased("A", rnd), 1.5)
    out = s.receipt("A", rnd, 2.0)
    assert of(out, JobDone) == [JobDone(job, True, None)]
    assert s.p.producer_state("A") is ProducerState.DONE
    assert s.p.producer_state("Z") is ProducerState.ABSENT  # evicted, not left for a later tick
    assert s.p.snapshot().evicted == 1 and s.p.records().retained == frozenset({"A"})


def test_the_cap_skips_ids_that_left_retention_out_of_order_and_evicts_the_oldest_retained() -> None:
    s = Pair(tombstone_max=2)
    for kid in ("W", "X"):  # W then X tombstoned (life L1): retained oldest first
        s.store(kid, 1, 0.0, life="L1")
        s.abort(kid, 0.5)
    # X leaves retention out of order (a store of a new life parks over it), then W (in order)
    s.store("X", 1, 1.0, owner="req-X2", life="L2")
    s.store("W", 1, 1.0, owner="req-W2", life="L2")
    assert s.p.records().retained == frozenset()
    for i, kid in enumerate(("A", "B", "C")):
        s.abort(kid, 2.0 + i)
    # C made three: the oldest retained (A) goes, not the id that left before it
    assert s.p.producer_state("A") is ProducerState.ABSENT
    assert s.p.records().retained == frozenset({"B", "C"}) and s.p.snapshot().evicted == 1
    assert s.p.producer_state("X") is ProducerState.PARKED and s.p.producer_state("W") is ProducerState.PARKED


def _retire(s: Pair, kids: list[str], t: float) -> None:
    """Each id leaves retention before its prune: a store of a new life parks over its tombstone."""
    for kid in kids:
        s.store(kid, 1, t, owner=f"req-{kid}-2", life="L2")
        assert s.p.producer_state(kid) is ProducerState.PARKED


def _tombstone(s: Pair, kids: list[str], t: float) -> None:
    for kid in kids:
        s.store(kid, 1, t, life="L1")
        s.abort(kid, t)


def test_ids_that_leave_retention_out_of_order_leave_the_others_pruned_on_time() -> None:
    s = Pair()
    _tombstone(s, ["W", "X", "Y", "Z"], 0.0)  # retained until t=60
    _retire(s, ["X"], 1.0)  # from the middle
    _retire(s, ["W"], 2.0)  # from the front: X's entry is next, and stale
    _retire(s, ["Y"], 3.0)  # behind the stale entry
    assert s.p.records().retained == frozenset({"Z"})
    assert s.p.next_deadline() == 60.0  # Z's prune; every other id now has its reap deadline (+60 s)
    s.p.fire(59.9)
    assert s.p.producer_state("Z") is ProducerState.TOMBSTONED
    s.p.fire(60.0)
    assert s.p.producer_state("Z") is ProducerState.ABSENT and s.p.records().retained == frozenset()


def test_the_last_retained_id_may_leave_behind_a_stale_entry() -> None:
    s = Pair()
    _tombstone(s, ["W", "X", "Y"], 0.0)
    _retire(s, ["X", "W", "Y"], 1.0)  # Y, the last, leaves behind X's stale entry
    assert s.p.records().retained == frozenset()
    _tombstone(s, ["V"], 5.0)  # retention works on as before
    assert s.p.next_deadline() == 61.0  # W's, X's and Y's reap (parked at 1.0)
    s.p.fire(65.0)
    assert s.p.producer_state("V") is ProducerState.ABSENT


def test_many_ids_leaving_retention_from_the_back_leave_the_rest_pruned_on_time() -> None:
    s = Pair()
    kids = [f"R{i:03d}" for i in range(100)]
    _tombstone(s, kids[:10], 0.0)  # pruned at t=60
    _tombstone(s, kids[10:], 10.0)  # at t=70
    _retire(s, kids[:16:-1], 20.0)  # 83 leave from the back: their entries in the prune order go stale
    left = frozenset(kids[:17])
    assert s.p.records().retained == left
    assert s.p.next_deadline() == 60.0
    s.p.fire(59.9)
    assert s.p.records().retained == left
    s.p.fire(60.0)
    assert s.p.records().retained == frozenset(kids[10:17])
    assert s.p.next_deadline() == 70.0
    s.p.fire(70.0)
    assert s.p.records().retained == frozenset()
    assert all(s.p.producer_state(k) is ProducerState.ABSENT for k in left)


def test_a_store_naming_the_consumer_that_bound_the_id_serves_it() -> None:
    s = Pair()
    rnd, _ = _fetch(s, "A", 2, 0.0)  # the pair's consumer (principal "cons") binds first
    job, out = s.store("A", 2, 1.0, consumer="cons")
    assert sent(out, wm.TransferDone) == [] and of(out, SendBlocks)
    assert s.p.producer_state("A") is ProducerState.SERVING


def test_a_fetch_of_a_new_life_binds_afresh_over_the_tombstone_of_the_old_one() -> None:
    s = Pair()
    _tombstone(s, ["A"], 0.0)
    _, out = _fetch(s, "A", 2, 1.0, life="L2")
    assert sent(out, wm.TransferDone) == []
    assert s.p.producer_state("A") is ProducerState.AWAITING and s.p.records().retained == frozenset()


def test_a_fetch_that_retains_one_id_too_many_evicts_the_oldest_in_its_own_step() -> None:
    s = Pair(tombstone_max=1)
    s.abort("Z", 0.0)
    s.fetch("A", (), 1.0)  # needs nothing: A is done and retained
    assert s.p.producer_state("A") is ProducerState.DONE and s.p.producer_state("Z") is ProducerState.ABSENT
    assert s.p.snapshot().evicted == 1


def test_a_peer_may_have_exactly_max_pending_fetches_waiting_for_their_stores() -> None:
    s = Pair(max_pending=1)
    _, out = _fetch(s, "A", 1, 0.0)  # the first waits for its store
    assert sent(out, wm.TransferDone) == [] and s.p.producer_state("A") is ProducerState.AWAITING
    _, out = _fetch(s, "B", 1, 0.1)  # a second would be one too many
    assert done_fail(out, "B").reason == "too_many_pending" and s.p.producer_state("B") is ProducerState.ABSENT
    s = Pair(max_pending=2)
    _fetch(s, "A", 1, 0.0)
    _, out = _fetch(s, "B", 1, 0.1)
    assert sent(out, wm.TransferDone) == [] and s.p.producer_state("B") is ProducerState.AWAITING


def test_a_peers_waiting_fetches_are_bounded_by_the_keys_they_name_too() -> None:
    """A fetch's keys are kept while it waits for its store (~100 B each): a peer's awaiting
    fetches may name at most ``PENDING_KEYS_PER_FETCH`` keys per allowed pending fetch, so one
    peer cannot pin gigabytes with a thousand 28,000-key fetches (decision I34)."""
    from kvtier.lifecycle.producer import PENDING_KEYS_PER_FETCH as PER

    s = Pair(max_pending=2)  # 2 fetches, 2 * PER keys
    rnd_a, out = _fetch(s, "A", PER + 10, 0.0)
    assert sent(out, wm.TransferDone) == [] and s.p.producer_state("A") is ProducerState.AWAITING
    _, out = _fetch(s, "B", PER, 0.1)  # a second fetch is allowed, but not its keys
    assert done_fail(out, "B").reason == "too_many_pending" and s.p.producer_state("B") is ProducerState.ABSENT
    _, out = _fetch(s, "C", PER - 10, 0.2)  # exactly the budget
    assert sent(out, wm.TransferDone) == [] and s.p.producer_state("C") is ProducerState.AWAITING
    s2 = Pair(max_pending=1)  # a peer's first waiting fetch is never refused for its keys alone
    _, out = _fetch(s2, "Z", 4 * PER, 0.0)
    assert sent(out, wm.TransferDone) == [] and s2.p.producer_state("Z") is ProducerState.AWAITING
    s.abort("A", 0.3, rnd_a, fetched=True)  # A's keys are given back with its wait
    assert s.p.producer_state("A") is not ProducerState.AWAITING
    _, out = _fetch(s, "D", PER, 0.4)
    assert sent(out, wm.TransferDone) == [] and s.p.producer_state("D") is ProducerState.AWAITING


def test_an_abort_of_a_new_life_is_remembered_over_the_tombstone_of_the_old_one() -> None:
    s = Pair()
    _tombstone(s, ["A"], 0.0)  # life L1, aborted
    rnd = s.fresh_round()
    out = s.to_p(wm.AbortFetch(gen=s.gen, kv_request_id="A", round=rnd, fetched=False, life="L2"), 1.0)
    assert sent(out, wm.AbortAck) == [wm.AbortAck(gen=s.gen, kv_request_id="A", round=rnd, life="L2")]
    # L2's consumer gave up before L2's store: the store meets L2's own tombstone
    job, out = s.store("A", 1, 2.0, owner="req-A2", life="L2")
    assert of(out, JobDone) == [JobDone(job, False, Reason.ABORTED, at_submission=True)]


def test_an_abort_that_retains_one_id_too_many_evicts_the_oldest_in_its_own_step() -> None:
    s = Pair(tombstone_max=1)
    s.abort("Z", 0.0)
    s.abort("A", 1.0)
    assert s.p.producer_state("Z") is ProducerState.ABSENT and s.p.producer_state("A") is ProducerState.TOMBSTONED
    assert s.p.snapshot().evicted == 1


def test_a_records_life_is_the_one_its_first_store_named() -> None:
    s = Pair()
    s.store("A", 1, 0.0, owner="req-A", life="L1")
    s.store("A", 1, 0.5, owner="req-A", start=1, life="L2")  # the same request, naming another life
    _, out = _fetch(s, "A", 2, 1.0, life="L2")
    assert done_fail(out, "A").reason == "id_in_use"
    _, out = _fetch(s, "A", 2, 1.5, life="L1")
    assert of(out, SendBlocks) and s.p.producer_state("A") is ProducerState.SERVING


def test_a_store_carries_the_requests_named_consumer_onto_the_record() -> None:
    s = Pair()
    s.p.handle(ix.ConsumerNamed("A", "someone-else"), 0.0)
    s.store("A", 2, 0.1)  # names no consumer itself
    s.p.handle(ix.RequestFinished("A", producer=True), 0.2)
    assert CoreView(s.p).producer("A").consumer == "someone-else"
    _, out = _fetch(s, "A", 2, 1.0)
    assert done_fail(out, "A").reason == "not_authorised"


def test_a_store_whose_keys_blocks_or_digests_disagree_is_refused_by_name() -> None:
    s = Pair()
    with pytest.raises(ValueError, match=r"^store job 7: 2 keys but 1 blocks$"):
        s.p.handle(ix.StoreSubmitted("A", "req-A", 7, keys("A", 2), (0,)), 0.0)
    with pytest.raises(ValueError, match=r"^store job 8: 2 keys but 3 digests$"):
        s.p.handle(ix.StoreSubmitted("A", "req-A", 8, keys("A", 2), (0, 1), digests=(1, 2, 3)), 0.0)
    assert s.p.producer_state("A") is ProducerState.ABSENT


def test_after_shutdown_began_a_fetch_for_an_unknown_id_is_refused() -> None:
    s = Pair()
    s.p.handle(ix.DrainStarted(), 0.0)  # a drain alone still lets a new fetch bind
    _, out = _fetch(s, "A", 1, 0.5)
    assert sent(out, wm.TransferDone) == [] and s.p.producer_state("A") is ProducerState.AWAITING
    s.p.handle(ix.ShutdownStarted(), 1.0)
    _, out = _fetch(s, "B", 1, 1.5)
    assert done_fail(out, "B").reason == "shutdown" and s.p.producer_state("B") is ProducerState.ABSENT


def test_an_id_leaving_its_timer_for_retention_leaves_no_stale_deadline_behind() -> None:
    s = Pair()
    before = s.p.snapshot().deadline_entries
    s.store("A", 1, 0.0)  # parked: its reap deadline
    assert s.p.snapshot().deadline_entries == before + 1
    s.abort("A", 1.0)  # tombstoned: its prune's entry (in the prune order) replaces the reap deadline
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    assert s.p.snapshot().deadline_entries == before + 1


def test_an_id_retained_exactly_one_retention_after_another_is_kept_its_full_retention() -> None:
    s = Pair()
    s.abort("X", 0.0)  # retained until t=60
    s.p.fire(60.0)
    assert s.p.producer_state("X") is ProducerState.ABSENT
    s.abort("Y", 60.0)  # retained at the very time X's retention ended: until t=120
    s.p.fire(60.0)
    assert s.p.producer_state("Y") is ProducerState.TOMBSTONED and s.p.next_deadline() == 120.0
    s.p.fire(119.9)
    assert s.p.producer_state("Y") is ProducerState.TOMBSTONED
    s.p.fire(120.0)
    assert s.p.producer_state("Y") is ProducerState.ABSENT


def test_a_session_lost_with_an_id_bound_to_it_evicts_the_oldest_retained_in_its_own_step() -> None:
    s = Pair(tombstone_max=1)
    s.abort("Z", 0.0)
    job, _ = s.store("A", 1, 0.0)
    rnd, _ = _fetch(s, "A", 1, 1.0)
    s.p.handle(ix.TransferReleased("A", rnd), 1.5)  # delivering: the receipt never comes
    out = s.p.handle(ix.ConnectionClosed("decode-1"), 2.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.PEER_LOST)]
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED and s.p.producer_state("Z") is ProducerState.ABSENT
    assert s.p.snapshot().evicted == 1


def test_the_producer_counts_every_prune_a_tick_fires() -> None:
    s = Pair()
    for kid in ("A", "B", "C"):
        s.abort(kid, 0.0)
    producer = s.p.machines()["producer"]
    assert producer.tick(59.9, []) == 0
    assert producer.tick(60.0, []) == 3
    assert s.p.records().retained == frozenset()


def test_an_unknown_park_clock_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^park_clock must be 'last_store' or 'first_store', got 'sometimes'$"):
        Pair(park_clock="sometimes")


def test_a_key_parked_again_keeps_its_first_block_and_the_job_s_new_keys_are_parked() -> None:
    """A key names its content (decision I31): a later store naming a parked key, even with another
    digest, neither replaces the block nor fails; its other keys are parked, and both jobs succeed
    with the id's transfer."""
    s = Pair()
    first = s.next_job()
    assert of(s.p.handle(ix.StoreSubmitted("A", "req-A", first, keys("A", 1), (0,), (11,)), 0.0), JobDone) == []
    second = s.next_job()
    out = s.p.handle(ix.StoreSubmitted("A", "req-A", second, keys("A", 2), (1, 2), (99, 12)), 0.5)
    assert of(out, JobDone) == []
    rnd, out = _fetch(s, "A", 2, 1.0)
    (send,) = of(out, SendBlocks)
    assert send.blocks == (0, 2)  # A:0 from the first job, A:1 from the second
    out = s.complete("A", rnd, 2.0)
    assert sorted(of(out, JobDone), key=lambda d: d.job_id) == [JobDone(first, True, None), JobDone(second, True, None)]


def test_a_fetch_of_an_id_its_lost_consumer_had_bound_is_answered_consumer_lost_not_peer_lost() -> None:
    """The consumer whose fetch bound A dies before A's blocks come: the producer tombstones A
    (its store jobs and its record say ``peer_lost``).  A later fetch of A — here the same
    consumer's, after it reconnected — comes on a live session: it is answered ``consumer_lost``
    (decision I40), and that is the load's reason on the consumer's side."""
    from tests.lifecycle.scenario_pair import C, P

    s = Pair()
    _fetch(s, "A", 2, 1.0)  # bound, nothing stored yet
    assert s.p.producer_state("A") is ProducerState.AWAITING
    s.p.handle(ix.ConnectionClosed(C), 2.0)
    s.c.handle(ix.ConnectionClosed(P), 2.0)
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    job, _ = s.store("A", 2, 2.5)  # the prefill's store, refused at once
    s.c.handle(ix.Dial(P), 3.0)  # a new session
    (hello,) = sent(s.c.handle(ix.ConnectionUp(P), 3.0), wm.Hello)
    s.p.handle(ix.Received(C, hello), 3.0)
    (ack,) = sent(s.p.handle(ix.PeerAttached(C, hello.gen), 3.0), wm.HelloAck)
    s.c.handle(ix.Received(P, ack), 3.0)
    s.c.handle(ix.PeerAttached(P, hello.gen), 3.0)
    s.gen = hello.gen
    s.c.handle(ix.LoadAnnounced("A", P), 3.5)
    (fetch,) = sent(s.c.handle(ix.LoadSubmitted("A", 9, keys("A", 2), (10, 11)), 3.5), wm.Fetch)
    (answer,) = sent(s.to_p(fetch, 3.6), wm.TransferDone)
    assert (answer.ok, answer.reason) == (False, "consumer_lost")
    assert of(s.to_c(answer, 3.7), JobDone) == [JobDone(9, False, Reason.CONSUMER_LOST)]
