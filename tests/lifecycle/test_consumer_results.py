"""A load's result, word for word, on the consumer side: what a load that lands every block
reports and sends, what a second or empty load of an id gets, which messages are counted stale
(and why), and when a failed load may report at all — never while a landing it started has not
answered (decision I26), never ok with a block missing, with the producer's own reason when it
gave the transfer up (decision I19), and with its slots held (and said so) while a one-sided
plane cannot prove the producer's access withdrawn.

The producer side is played by hand (its ``block_data`` and ``transfer_done``), so each message
reaches the consumer exactly when the test says; times are :class:`~tests.lifecycle.scenario_pair.Pair`'s
(load timeout 30 s, abort-ack timeout 5 s, revoke timeout 1 s).
"""

from __future__ import annotations

import pytest

from kvtier.lifecycle import ConsumerState, Reason
from kvtier.lifecycle.consumer import ConsumerEvent
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Ignored, JobDone, LandBlocks, OpenConnection, RevokeAccess, SlotsHeld
from kvtier.wire import messages as wm
from tests.lifecycle.scenario_pair import P, Pair, keys, of, sent


def _load(s: Pair, kid: str, n: int, t: float, *, life: str = "") -> tuple[int, int]:
    """``kid``'s load of ``n`` blocks (slots 100..) is announced and submitted at ``t``: its fetch
    is sent at once (the session is ready).  Returns the job and the round."""
    job = s.next_job()
    s.c.handle(ix.LoadAnnounced(kid, P, life=life), t)
    (fetch,) = sent(s.c.handle(ix.LoadSubmitted(kid, job, keys(kid, n), tuple(range(100, 100 + n))), t), wm.Fetch)
    assert s.c.consumer_state(kid) is ConsumerState.IN_FLIGHT
    return job, fetch.round


def _blocks(s: Pair, kid: str, rnd: int, first: int, count: int, t: float, *, life: str = "") -> list:
    """The producer's block_data for positions ``first..first+count-1`` reaches the consumer."""
    msg = wm.BlockData(gen=s.gen, kv_request_id=kid, round=rnd, first=first, count=count,
                       digests=[7] * count, life=life)
    return s.to_c(msg, t)


def _landed(s: Pair, kid: str, rnd: int, first: int, count: int, t: float, ok: bool = True) -> list:
    """The shell's answer for the landing of positions ``first..first+count-1``."""
    return s.c.handle(ix.BlocksLanded(P, kid, rnd, first, count, ok), t)


def test_a_load_that_lands_every_block_reports_ok_and_sends_its_receipt_for_its_life() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0, life="L1")
    out = _blocks(s, "A", rnd, 0, 2, 0.1, life="L1")
    assert of(out, LandBlocks) == [LandBlocks(P, "A", rnd, 0, (100, 101), (7, 7), ())]
    out = _landed(s, "A", rnd, 0, 2, 0.2)
    assert of(out, JobDone) == [JobDone(job, True, None)]
    assert sent(out, wm.Receipt) == [wm.Receipt(gen=s.gen, kv_request_id="A", round=rnd, life="L1")]
    assert s.c.consumer_state("A") is ConsumerState.LOADED


def test_a_transfer_done_ok_with_a_block_missing_fails_the_load() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0)
    _blocks(s, "A", rnd, 0, 1, 0.1)
    _landed(s, "A", rnd, 0, 1, 0.2)  # one of two landed
    out = s.done("A", rnd, 0.3)
    assert of(out, JobDone) == [JobDone(job, False, Reason.INCOMPLETE_DATA, (keys("A", 1)[0],))]
    assert s.c.consumer_state("A") is ConsumerState.FAILED and s.c.load_ended("A")


def test_a_second_load_of_an_id_gets_its_own_refusal_and_an_empty_one_after_it_loaded_succeeds() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 1, 0.0)
    late = s.next_job()
    out = s.c.handle(ix.LoadSubmitted("A", late, keys("A", 1), (200,)), 0.1)
    assert out == [JobDone(late, False, Reason.DUPLICATE_LOAD)]
    _blocks(s, "A", rnd, 0, 1, 0.2)
    _landed(s, "A", rnd, 0, 1, 0.3)
    assert s.c.consumer_state("A") is ConsumerState.LOADED
    again = s.next_job()
    out = s.c.handle(ix.LoadSubmitted("A", again, keys("A", 1), (200,)), 0.4)
    assert out == [JobDone(again, False, Reason.ONE_FETCH_PER_ID)]
    empty = s.next_job()
    out = s.c.handle(ix.LoadSubmitted("A", empty, (), ()), 0.5)
    assert out == [JobDone(empty, True, None)]


def test_a_load_of_an_id_that_failed_is_refused_with_the_reason_it_failed() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 1, 0.0)
    out = s.done("A", rnd, 0.1, ok=False, reason="reaped")
    assert of(out, JobDone) == [JobDone(job, False, Reason.REAPED)]
    late = s.next_job()
    out = s.c.handle(ix.LoadSubmitted("A", late, keys("A", 1), (200,)), 0.2)
    assert out == [JobDone(late, False, Reason.REAPED)]


def test_block_data_of_another_round_or_past_the_fetch_is_counted_stale_with_its_reason() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0)
    out = _blocks(s, "A", rnd + 5, 0, 1, 0.1)
    assert out == [Ignored("consumer", "A", ConsumerState.IN_FLIGHT, "message", Reason.STALE)]
    out = _blocks(s, "A", rnd, 1, 2, 0.2)  # positions 1 and 2 of a fetch of two
    assert out == [Ignored("consumer", "A", ConsumerState.IN_FLIGHT, "message", Reason.INCOMPLETE_DATA)]
    assert s.c.consumer_state("A") is ConsumerState.IN_FLIGHT


def test_a_failed_transfer_waits_for_the_landing_in_progress_before_reporting() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0)
    _blocks(s, "A", rnd, 0, 1, 0.1)  # one block landing, not answered yet
    out = s.done("A", rnd, 0.2, ok=False, reason="transfer_failed")
    assert of(out, JobDone) == [] and s.c.consumer_state("A") is ConsumerState.SETTLING
    out = _landed(s, "A", rnd, 0, 1, 0.3)
    assert of(out, JobDone) == [JobDone(job, False, Reason.TRANSFER_FAILED, (keys("A", 1)[0],))]
    assert s.c.consumer_state("A") is ConsumerState.FAILED and s.c.load_ended("A")


def test_the_result_waits_for_every_landing_whatever_order_they_answer_in() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 3, 0.0)
    _blocks(s, "A", rnd, 0, 1, 0.1)
    _blocks(s, "A", rnd, 1, 1, 0.1)
    s.done("A", rnd, 0.2, ok=False, reason="transfer_failed")
    assert s.c.consumer_state("A") is ConsumerState.SETTLING
    out = _landed(s, "A", rnd, 1, 1, 0.3)  # the second landing answers first
    assert of(out, JobDone) == [] and s.c.consumer_state("A") is ConsumerState.SETTLING
    out = _landed(s, "A", rnd, 0, 1, 0.4)
    assert of(out, JobDone) == [JobDone(job, False, Reason.TRANSFER_FAILED, keys("A", 2))]


def test_a_request_finished_while_its_load_settles_ends_the_record_with_the_result() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0)
    _blocks(s, "A", rnd, 0, 1, 0.1)
    s.done("A", rnd, 0.2, ok=False, reason="transfer_failed")
    assert s.c.handle(ix.RequestFinished("A", producer=False), 0.3) == []
    out = _landed(s, "A", rnd, 0, 1, 0.4)
    assert of(out, JobDone) == [JobDone(job, False, Reason.TRANSFER_FAILED, (keys("A", 1)[0],))]
    assert s.c.consumer_state("A") is ConsumerState.ABSENT and not s.c.load_ended("A")


def test_a_load_given_up_by_its_producer_reports_the_producers_reason_when_the_session_dies() -> None:
    s = Pair(options={"one_sided": True})
    job, rnd = _load(s, "A", 2, 0.0)
    notice = wm.TransferDone(gen=s.gen, kv_request_id="A", round=rnd, ok=False, reason="transfer_timeout",
                             final=False)
    assert of(s.to_c(notice, 0.1), JobDone) == []  # the producer may still be writing
    assert s.c.consumer_state("A") is ConsumerState.GIVEN_UP
    out = s.c.handle(ix.ConnectionClosed(P), 0.2)  # the terminal answer never comes
    assert of(out, RevokeAccess) == [RevokeAccess(P)] and of(out, JobDone) == []
    out = s.c.handle(ix.AccessRevoked(P), 0.3)
    assert of(out, JobDone) == [JobDone(job, False, Reason.TRANSFER_TIMEOUT)]


def test_slots_a_plane_cannot_free_by_itself_are_held_and_said_so_until_it_proves_revocation() -> None:
    s = Pair(options={"one_sided": True, "revoke_bounded": False})
    job, rnd = _load(s, "A", 2, 0.0)
    out = s.c.handle(ix.ConnectionClosed(P), 1.0)
    assert of(out, RevokeAccess) == [RevokeAccess(P)] and s.c.consumer_state("A") is ConsumerState.REVOKING
    dials = []
    for t in (2.0, 3.0):  # every revoke_timeout_s: still held, and said so
        out = s.c.fire(t)
        assert of(out, SlotsHeld) == [SlotsHeld(P, "A", 2)] and of(out, JobDone) == []
        dials.append([e.peer for e in of(out, OpenConnection)])
    # the first deadline dialled the producer again (a handshake it accepts is the proof, N25); the
    # second found that session still opening and dialled nothing more
    assert dials == [[P], []]
    out = s.c.handle(ix.AccessRevoked(P), 3.5)
    assert [(j.job_id, j.ok) for j in of(out, JobDone)] == [(job, False)]


def test_a_load_whose_keys_and_slots_disagree_is_refused_by_name() -> None:
    s = Pair()
    s.c.handle(ix.LoadAnnounced("A", P), 0.0)
    with pytest.raises(ValueError, match=r"^load job 9: 2 keys but 1 slots$"):
        s.c.handle(ix.LoadSubmitted("A", 9, keys("A", 2), (100,)), 0.0)
    assert s.c.consumer_state("A") is ConsumerState.ANNOUNCED


def test_a_one_sided_partial_load_reports_each_verified_slot_with_the_digest_its_block_data_carried() -> None:
    s = Pair(options={"one_sided": True})
    job, rnd = _load(s, "A", 4, 0.0)
    for first, digests in ((2, [33]), (0, [11, 22])):  # out of order: the later block_data comes first
        msg = wm.BlockData(gen=s.gen, kv_request_id="A", round=rnd, first=first, count=len(digests), digests=digests)
        s.to_c(msg, 0.1)
        _landed(s, "A", rnd, first, len(digests), 0.2)
    out = s.done("A", rnd, 0.3, ok=False, reason="transfer_failed")
    assert of(out, JobDone) == [JobDone(job, False, Reason.TRANSFER_FAILED, keys("A", 3),
                                        ((100, 11), (101, 22), (102, 33)))]


def test_shutdown_fails_a_load_still_waiting_for_its_session_and_ends_every_idle_record() -> None:
    s = Pair()
    s.c.handle(ix.LoadAnnounced("Q", "other:1"), 0.0)  # dials a peer whose session is not ready
    queued = s.next_job()
    s.c.handle(ix.LoadSubmitted("Q", queued, keys("Q", 1), (100,)), 0.0)
    assert s.c.consumer_state("Q") is ConsumerState.QUEUED
    s.c.handle(ix.LoadAnnounced("N", P), 0.0)  # announced, no load yet
    out = s.c.handle(ix.ShutdownStarted(), 1.0)
    assert of(out, JobDone) == [JobDone(queued, False, Reason.SHUTDOWN)]
    assert s.c.consumer_state("Q") is ConsumerState.ABSENT and s.c.consumer_state("N") is ConsumerState.ABSENT


def test_the_end_of_the_grace_revokes_a_load_in_flight_and_answers_it_by_the_revoke_deadline() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 1, 0.0)
    out = s.c.handle(ix.GraceEnded(), 2.0)
    assert sent(out, wm.AbortFetch) and of(out, RevokeAccess) == [RevokeAccess(P)]
    assert of(out, JobDone) == [] and s.c.consumer_state("A") is ConsumerState.REVOKING
    assert s.c.next_deadline() == 3.0  # revoke_timeout_s after the close
    out = s.c.fire(3.0)
    assert [(j.job_id, j.ok) for j in of(out, JobDone)] == [(job, False)]


def test_an_abort_answered_while_one_block_lands_waits_for_that_landing() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0)
    _blocks(s, "A", rnd, 0, 1, 0.1)  # one block landing, not answered yet
    out = s.c.fire(30.0)  # the load times out: abort
    assert sent(out, wm.AbortFetch) and s.c.consumer_state("A") is ConsumerState.ABORTING
    out = s.to_c(wm.AbortAck(gen=s.gen, kv_request_id="A", round=rnd), 30.1)
    assert of(out, JobDone) == [] and s.c.consumer_state("A") is ConsumerState.SETTLING
    out = _landed(s, "A", rnd, 0, 1, 30.2)
    assert of(out, JobDone) == [JobDone(job, False, Reason.LOAD_TIMEOUT, (keys("A", 1)[0],))]


def test_a_landing_reported_for_another_peer_cannot_touch_the_load() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 1, 0.0)
    _blocks(s, "A", rnd, 0, 1, 0.1)
    out = s.c.handle(ix.BlocksLanded("other:2", "A", rnd, 0, 1, True), 0.2)
    assert out == [Ignored("consumer", "A", ConsumerState.IN_FLIGHT, ConsumerEvent.BLOCKS_LANDED, Reason.STALE)]
    assert s.c.consumer_state("A") is ConsumerState.IN_FLIGHT
    out = _landed(s, "A", rnd, 0, 1, 0.3)  # the producer's own landing still completes the load
    assert of(out, JobDone) == [JobDone(job, True, None)]


@pytest.mark.parametrize("one_sided", [False, True])
def test_a_fetch_names_its_destination_slots_only_for_a_one_sided_plane(one_sided: bool) -> None:
    s = Pair(options={"one_sided": one_sided})
    s.c.handle(ix.LoadAnnounced("A", P), 0.0)
    (fetch,) = sent(s.c.handle(ix.LoadSubmitted("A", 1, keys("A", 2), (100, 101)), 0.0), wm.Fetch)
    assert fetch.slots == ([100, 101] if one_sided else [])


def test_a_message_of_the_loads_round_but_another_life_is_stale_and_one_naming_none_is_not() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0, life="L1")
    out = _blocks(s, "A", rnd, 0, 1, 0.1, life="L2")
    assert out == [Ignored("consumer", "A", ConsumerState.IN_FLIGHT, "message", Reason.STALE)]
    out = _blocks(s, "A", rnd, 0, 1, 0.2)  # names no life: the load's own
    assert [e.first for e in of(out, LandBlocks)] == [0]


def test_a_block_that_did_not_match_its_digest_aborts_the_load_with_the_abort_ack_deadline_from_then() -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0)
    _blocks(s, "A", rnd, 0, 1, 0.1)
    out = _landed(s, "A", rnd, 0, 1, 2.0, ok=False)
    assert sent(out, wm.AbortFetch) and s.c.consumer_state("A") is ConsumerState.ABORTING
    assert s.c.next_deadline() == 7.0  # abort_ack_timeout_s after the corrupt landing


def test_block_data_for_an_id_with_no_load_is_dropped_as_having_no_record() -> None:
    s = Pair()
    out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="Z", round=3, first=0, count=1, digests=[1]), 0.1)
    assert out == [Ignored("consumer", "Z", ConsumerState.ABSENT, ConsumerEvent.BLOCK_DATA, Reason.NO_RECORD)]
    assert s.c.consumer_state("Z") is ConsumerState.ABSENT


def test_every_fetch_names_the_lowest_round_still_open_with_its_producer_and_its_life() -> None:
    s = Pair()

    def fetch(kid: str, t: float, life: str = "") -> wm.Fetch:
        s.c.handle(ix.LoadAnnounced(kid, P, life=life), t)
        (f,) = sent(s.c.handle(ix.LoadSubmitted(kid, s.next_job(), keys(kid, 1), (100,)), t), wm.Fetch)
        return f

    def land(f: wm.Fetch, t: float) -> None:
        _blocks(s, f.kv_request_id, f.round, 0, 1, t)
        _landed(s, f.kv_request_id, f.round, 0, 1, t)
        assert s.c.consumer_state(f.kv_request_id) is ConsumerState.LOADED

    a, b = fetch("A", 0.0), fetch("B", 0.1)
    c = fetch("C", 0.2, life="L1")
    assert a.round < b.round < c.round  # one counter per manager: every load its own round
    assert (a.low, b.low, c.low, c.life) == (a.round, a.round, a.round, "L1")
    land(b, 0.3)  # a round in the middle closes: A's is still the lowest
    assert fetch("D", 0.4).low == a.round
    land(a, 0.5)  # the lowest closes: C's is next
    e = fetch("E", 0.6)
    assert e.low == c.round


def test_an_abort_names_its_life_and_the_lowest_round_still_open() -> None:
    s = Pair()
    _, first = _load(s, "A", 1, 0.0)  # stays open
    _, rnd = _load(s, "B", 1, 0.1, life="L1")
    (abort,) = sent(s.c.handle(ix.RequestFinished("B", producer=False), 0.2), wm.AbortFetch)
    assert abort == wm.AbortFetch(gen=s.gen, kv_request_id="B", round=rnd, fetched=True, life="L1", low=first)


def test_a_session_lost_reaches_every_load_left_on_it_after_another_one_finished() -> None:
    s = Pair()
    job_a, rnd_a = _load(s, "A", 1, 0.0)
    _load(s, "B", 1, 0.0)
    _blocks(s, "A", rnd_a, 0, 1, 0.1)
    _landed(s, "A", rnd_a, 0, 1, 0.1)
    s.c.handle(ix.RequestFinished("A", producer=False), 0.2)  # A's record ends; B's is still on the session
    assert s.c.consumer_state("A") is ConsumerState.ABSENT
    out = s.c.handle(ix.ConnectionClosed(P), 0.3)
    assert of(out, RevokeAccess) == [RevokeAccess(P)] and s.c.consumer_state("B") is ConsumerState.REVOKING


def test_an_announced_load_shows_no_job_and_no_round_yet() -> None:
    s = Pair()
    s.c.handle(ix.LoadAnnounced("A", P), 0.0)
    view = s.c.consumer("A")
    assert (view.state, view.peer, view.job_id, view.round, view.keys, view.landed) == (
        ConsumerState.ANNOUNCED, P, None, -1, (), 0)


def test_a_round_being_cancelled_stays_the_lowest_open_one_until_its_abort_is_answered() -> None:
    """A load whose request finished mid-transfer moves from in flight to cancelling: its round is
    still open (the producer may still send under it), so a fetch to the same producer names it
    as the lowest open round until the producer's ``abort_ack`` closes it."""
    s = Pair()
    _, first = _load(s, "A", 1, 0.0)
    (abort,) = sent(s.c.handle(ix.RequestFinished("A", producer=False), 0.1), wm.AbortFetch)
    assert s.c.consumer_state("A") is ConsumerState.CANCELLING and abort.low == first
    _, second = _load(s, "B", 1, 0.2)
    (fetch_c,) = sent(s.c.handle(ix.LoadAnnounced("C", P), 0.3)
                      + s.c.handle(ix.LoadSubmitted("C", s.next_job(), keys("C", 1), (110,)), 0.3), wm.Fetch)
    assert fetch_c.low == first < second < fetch_c.round
    s.to_c(wm.AbortAck(gen=s.gen, kv_request_id="A", round=first), 0.4)
    assert s.c.consumer_state("A") is not ConsumerState.CANCELLING
    (fetch_d,) = sent(s.c.handle(ix.LoadAnnounced("D", P), 0.5)
                      + s.c.handle(ix.LoadSubmitted("D", s.next_job(), keys("D", 1), (111,)), 0.5), wm.Fetch)
    assert fetch_d.low == second  # A's round closed with its answer: B's is the lowest now


@pytest.mark.parametrize(("sent_reason", "reported"), [
    ("reaped", Reason.REAPED), ("id_in_use", Reason.ID_IN_USE), ("transfer_timeout", Reason.TRANSFER_TIMEOUT),
    ("local", Reason.PEER_ERROR), ("not_needed", Reason.PEER_ERROR),  # a success's label on a failure
    ("cancelled", Reason.PEER_ERROR), ("load_timeout", Reason.PEER_ERROR),  # what only the consumer knows
    ("handshake_mismatch", Reason.PEER_ERROR), ("too_many_peers", Reason.PEER_ERROR),  # a dial's, not a session's
    ("no_such_code", Reason.PEER_ERROR),
])
def test_a_failed_answer_keeps_a_producers_reason_and_names_any_other_code_the_producers_fault(
        sent_reason: str, reported: Reason) -> None:
    s = Pair()
    job, rnd = _load(s, "A", 2, 0.0)
    out = s.to_c(wm.TransferDone(gen=s.gen, kv_request_id="A", round=rnd, ok=False, reason=sent_reason), 0.1)
    assert of(out, JobDone) == [JobDone(job, False, reported)]
