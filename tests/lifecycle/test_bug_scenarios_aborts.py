"""Regression tests for the bug scenarios of cancels, aborts and failures: the consumer cancels or
aborts, completions arrive after a cancel, a silent producer, a failed or partial transfer, a lost
abort.  Conventions as in ``test_bug_scenarios.py`` (scenario parameters, "within one RTT"; the
harness is :mod:`tests.lifecycle.scenario_pair`).
"""

from __future__ import annotations

import pytest

from kvtier.lifecycle import ConsumerState, ProducerState, Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import CancelTransfer, Ignored, JobDone, LandBlocks, RevokeAccess, Send
from kvtier.wire import messages as wm
from tests.lifecycle.scenario_pair import C, P, Pair, done_fail, ended, keys, of, sent
from tools.coreview import CoreView


def test_b05_consumer_cancels_before_fetching_and_the_producer_releases_at_once() -> None:
    """B05: the consumer engine finishes an announced request before loading it; the consumer core
    sends abort_fetch (a fresh round) and the producer frees the 4 blocks one RTT later, tombstoning
    A with reason ``aborted``; later stores fail and later fetches are refused."""
    s = Pair()
    job, _ = s.store("A", 4, 0.0)
    s.c.handle(ix.LoadAnnounced("A", P), 0.5)
    out = s.c.handle(ix.RequestFinished("A", producer=False), 1.0)
    (abort,) = sent(out, wm.AbortFetch)
    assert s.c.consumer_state("A") is ConsumerState.ABSENT  # finished: nothing to wait for
    out = s.to_p(abort, 1.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.ABORTED)]
    assert of(out, Send) == [Send(C, wm.AbortAck(gen=s.gen, kv_request_id="A", round=abort.round))]
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    job2, out = s.store("A", 4, 2.0, start=4)
    assert of(out, JobDone) == [JobDone(job2, False, Reason.ABORTED, at_submission=True)]
    assert done_fail(s.fetch("A", keys("A", 4), 3.0, rnd=abort.round + 1), "A").reason == "aborted"


def test_b05_abort_before_the_first_store() -> None:
    """B05 ordering variant: the abort arrives before the first store; the store is rejected."""
    s = Pair()
    out = s.abort("A", 0.0)
    assert sent(out, wm.AbortAck) and s.p.producer_state("A") is ProducerState.TOMBSTONED
    job, out = s.store("A", 4, 1.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.ABORTED, at_submission=True)]
    assert CoreView(s.p).producer("A").parked == ()


def test_b05_without_an_abort_t_park_is_the_only_bound() -> None:
    """B05: if the request never reaches the consumer, nothing can abort it; the reap deadline
    (T_park) is the bound."""
    s = Pair()
    job, _ = s.store("A", 4, 0.0)
    assert s.p.fire(59.9) == []
    assert of(s.p.fire(60.0), JobDone) == [JobDone(job, False, Reason.REAPED)]


def test_b06_abort_propagation_frees_capacity_and_the_rest_are_reaped() -> None:
    """B06: 100 ids x 10 blocks parked over t=0..10; 60 are cancelled on the consumer at t=2 (60
    aborts); by t=2 their 600 blocks are released; a new store at t=3 parks; the 40 others are
    reaped by t=70.  Not expressible in the core: pool capacity — a store that finds the pool full
    fails fast in the shell (``BlockPool.alloc`` raises ``PoolExhausted``), the core never sees it;
    the ``parked_pinned_bytes`` gauge."""
    s = Pair()
    jobs = {}
    for i in range(100):
        jobs[i], _ = s.store(f"R{i}", 10, i / 10.0, start=0, blocks=tuple(range(10 * i, 10 * i + 10)))
    freed = []
    for i in range(60):
        out = s.abort(f"R{i}", 2.0)
        freed += of(out, JobDone)
    assert freed == [JobDone(jobs[i], False, Reason.ABORTED) for i in range(60)]  # 600 blocks free
    parked = [v for v in s.p.records().producers if v.state is ProducerState.PARKED]
    assert len(parked) == 40 and sum(len(v.parked) for v in parked) == 400
    assert s.p.snapshot().pinned_blocks == {"parked": 400}
    zjob, out = s.store("Z", 10, 3.0)
    assert out == [] and s.p.producer_state("Z") is ProducerState.PARKED
    reaped = of(s.p.fire(70.0), JobDone)
    assert {j.job_id for j in reaped} == {jobs[i] for i in range(60, 100)} | {zjob}
    assert all(j.reason == "reaped" for j in reaped)


def test_b08_completion_after_the_consumer_cancelled_is_reported_once() -> None:
    """B08: the consumer cancels at t=1 while the fetch is in flight; the producer's Done(ok) at
    t=2 ends the load: exactly one completion (a failure, ``cancelled``) reaches the engine, and
    only now — a write could still land before.  A later abort_ack is ignored."""
    s = Pair()
    s.store("A", 4, 0.0)
    job, rnd, out = s.load("A", 4, 0.0)
    assert sent(out, wm.Fetch)
    out = s.c.handle(ix.RequestFinished("A", producer=False), 1.0)
    assert of(out, JobDone) == [] and sent(out, wm.AbortFetch)
    assert s.c.consumer_state("A") is ConsumerState.CANCELLING
    out = s.done("A", rnd, 2.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.CANCELLED)]
    assert s.c.consumer_state("A") is ConsumerState.ABSENT
    out = s.to_c(wm.AbortAck(gen=s.gen, kv_request_id="A", round=rnd), 2.5)
    assert of(out, JobDone) == [] and of(out, Ignored)
    out = s.done("A", rnd, 3.0)
    assert of(out, JobDone) == []


def test_b09_silent_producer_loads_end_by_the_consumers_own_deadlines() -> None:
    """B09: the producer loses power at t=0.5.  With heartbeats (every second, peer_timeout_s=5)
    the session is declared dead at t=5 and every load to that peer fails at once (with the
    session's reason, ``peer_timeout``).  If the peer stays connected but silent about the load,
    T_load fires at t=30: the fetch is aborted and the load fails when no write can land any more
    — on abort_ack, or abort_ack_timeout_s later (t=35).  Not expressible: releasing the slots and
    the local-recompute fallback (the shell, on the JobDone)."""
    s = Pair(peer_timeout_s=5.0, heartbeat_interval_s=1.0)
    s.store("A", 4, 0.0)
    s.store("B", 4, 0.0)
    j1, _, _ = s.load("A", 4, 0.0)
    j2, _, _ = s.load("B", 4, 0.0)
    out = s.c.fire(4.0)  # heard at 0: the heartbeats ping, nothing ends yet
    assert sent(out, wm.Ping) and ended(out) == [] and of(out, JobDone) == []
    out = s.c.fire(5.0)  # silent for peer_timeout_s: the session dies; the loads fail once no write can land
    assert ended(out) == [(P, "peer_timeout")]
    assert of(out, JobDone) == [] and len(of(out, RevokeAccess)) == 2
    out = s.revoked(out, 5.0)
    assert sorted(of(out, JobDone), key=lambda j: j.job_id) == [JobDone(j1, False, Reason.PEER_TIMEOUT),
                                                                 JobDone(j2, False, Reason.PEER_TIMEOUT)]
    s2 = Pair()
    job, rnd, _ = s2.load("A", 4, 0.0)
    out = s2.c.fire(30.0)
    assert sent(out, wm.AbortFetch) and of(out, JobDone) == []
    assert s2.c.consumer_state("A") is ConsumerState.ABORTING
    out = s2.revoked(s2.c.fire(35.0), 35.0)  # unanswered: session given up, access revoked
    assert of(out, JobDone) == [JobDone(job, False, Reason.LOAD_TIMEOUT)]


def test_b17_transfer_failure_is_told_to_the_consumer_at_once() -> None:
    """B17: the transfer fails at t=1.2: Done(A, fail, transfer_failed) goes out in that step and
    A's blocks are released; the consumer falls back at once; a late duplicate failure report is
    ignored; if the Done is lost, the consumer's T_load (t=31) is the backstop."""
    s = Pair()
    job, _ = s.store("A", 4, 0.0)
    cjob, rnd, out = s.load("A", 4, 1.0)
    s.forward_fetch(out, 1.0)
    out = s.p.handle(ix.TransferReleased("A", rnd, failed=True), 1.2)
    assert done_fail(out, "A").reason == "transfer_failed"
    assert of(out, JobDone) == [JobDone(job, False, Reason.TRANSFER_FAILED)]
    out = s.done("A", rnd, 1.2, ok=False, reason="transfer_failed")
    assert of(out, JobDone) == [JobDone(cjob, False, Reason.TRANSFER_FAILED)]
    assert of(s.p.handle(ix.TransferReleased("A", rnd, failed=True), 1.3), Ignored)  # late report: ignored
    # the Done lost: the consumer's own deadline ends the load
    s2 = Pair()
    s2.store("A", 4, 0.0)
    cjob, rnd, out = s2.load("A", 4, 1.0)
    s2.forward_fetch(out, 1.0)
    s2.p.handle(ix.TransferReleased("A", rnd, failed=True), 1.2)  # Done(fail) never arrives
    assert sent(s2.c.fire(30.9), wm.AbortFetch) == []
    assert sent(s2.c.fire(31.0), wm.AbortFetch)
    out = s2.c.fire(36.0)  # no answer to the abort: the session is given up, access revoked
    assert of(out, JobDone) == [] and ended(out) == [(P, "abort_unacknowledged")]
    assert of(s2.revoked(out, 36.0), JobDone) == [JobDone(cjob, False, Reason.LOAD_TIMEOUT)]


def test_b19_partial_transfer_failure_releases_the_whole_load() -> None:
    """B19: 8 slots; the first 4 blocks land, sending the rest fails: Done(fail) covers the whole
    load (one load job, all 8 slots released together, the 4 verified keys reported as its
    successful prefix) and the consumer's pending work returns to its baseline.  The result waits
    for the landing's answer (decision I26: the copy may still write into the slots).  Not
    expressible: pool reference counts for keys already present on the consumer (the shell never
    takes a second reference: ``BlockPool.incref`` is its business)."""
    s = Pair()
    s.store("A", 8, 0.0)
    cjob, rnd, out = s.load("A", 8, 0.0)
    s.forward_fetch(out, 0.0)
    out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="A", round=rnd, first=0, count=4), 0.5)
    assert of(out, LandBlocks) == [LandBlocks(P, "A", rnd, 0, (100, 101, 102, 103))]
    out = s.p.handle(ix.TransferReleased("A", rnd, failed=True), 1.0)
    fail = done_fail(out, "A")
    out = s.to_c(fail, 1.0)
    assert of(out, JobDone) == [] and s.c.consumer_state("A").value == "settling"
    out = s.c.handle(ix.BlocksLanded(P, "A", rnd, 0, 4, True), 1.0)
    assert of(out, JobDone) == [JobDone(cjob, False, Reason.TRANSFER_FAILED, keys("A", 4))]
    assert CoreView(s.c).pending_jobs() == 0 and CoreView(s.p).pending_jobs() == 0
    # a straggling block for that load is never written
    out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="A", round=rnd, first=4, count=4), 1.1)
    assert of(out, LandBlocks) == []


@pytest.mark.parametrize("producer_state", ["awaiting", "serving"])
def test_b31_lost_abort_the_producers_own_deadlines_end_it(producer_state: str) -> None:
    """B31: C's T_load fires at t=30 and the abort_fetch is lost.  kvtier does not retry the abort
    (the spec has no retry; not expressible here): the consumer fails the load after
    abort_ack_timeout_s (t=35) and the producer's own deadlines free A — fetch_supply_timeout_s for
    a fetch waiting for blocks, transfer_timeout_s (+ the cancel wait) for a transfer that never
    completes.  Both sides end in a terminal state."""
    s = Pair()
    if producer_state == "serving":
        sjob, _ = s.store("A", 4, 0.0)
    cjob, rnd, out = s.load("A", 4, 0.0)
    s.forward_fetch(out, 0.0)
    assert s.p.producer_state("A").value == producer_state
    out = s.c.fire(30.0)
    assert sent(out, wm.AbortFetch)  # ... and it is lost
    out = s.c.fire(35.0)  # unanswered: the consumer gives the session up and revokes access
    assert of(out, JobDone) == [] and ended(out) == [(P, "abort_unacknowledged")]
    assert of(s.revoked(out, 35.0), JobDone) == [JobDone(cjob, False, Reason.LOAD_TIMEOUT)]
    assert s.c.consumer_state("A") is ConsumerState.FAILED
    if producer_state == "awaiting":
        out = s.p.fire(10.0)
        assert done_fail(out, "A").reason == "supply_timeout"
    else:
        out = s.p.fire(30.0)  # transfer_timeout_s: cancel; the terminal answer waits for the release
        # only a notice says why now (decision I19): the terminal answer still waits
        assert of(out, CancelTransfer) and of(out, JobDone) == []
        assert [(m.ok, m.final, m.reason) for m in sent(out, wm.TransferDone)] == [(False, False, "transfer_timeout")]
        out = s.p.fire(60.0)  # the plane never released: quarantine, the session is ended to force it
        assert of(out, JobDone) == [] and ended(out) == [(C, "transfer_stalled")]
        assert s.p.producer_state("A") is ProducerState.QUARANTINED
        # what the shell's gauge and log read
        assert CoreView(s.p).quarantined() == {"A"} and s.p.quarantined_count() == 1
        assert CoreView(s.p).quarantined_jobs() == (sjob,) and s.p.quarantined_blocks() == 4
        assert CoreView(s.p).pending_jobs() == 1  # the engine cannot reuse blocks a send may still read
        out = s.p.handle(ix.TransferReleased("A", rnd), 60.01)  # the dropped connection released them
        assert of(out, JobDone) == [JobDone(sjob, False, Reason.TRANSFER_TIMEOUT)]
        assert CoreView(s.p).quarantined() == frozenset() and s.p.quarantined_count() == 0
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    assert CoreView(s.p).pending_jobs() == 0 and CoreView(s.c).pending_jobs() == 0


@pytest.mark.parametrize("heard", [True, False, "pings"], ids=["producer_sending", "producer_silent", "pings_only"])
def test_a_cancelled_loads_answer_queued_behind_the_producers_data_does_not_end_the_session(heard: bool) -> None:
    """L19: the engine finishes request A during its load (abort_fetch sent at t=1); the producer
    answers, but its answer is queued behind B's blocks on the same connection.  While the
    producer is heard (B's blocks keep arriving) and A's own deadline (t=30) is ahead, the
    abort_ack deadline (t=6) waits again instead of ending the session, which would fail B — a
    load nobody gave up on; the answer at t=7 ends A alone.  A silent producer, or one that only
    answers pings, is given up at t=6 as before."""
    s = Pair()
    s.store("A", 4, 0.0)
    s.store("B", 4, 0.0, start=10, blocks=tuple(range(10, 14)))
    ja, ra, out = s.load("A", 4, 0.0)
    s.forward_fetch(out, 0.0)
    jb, rb, out = s.load("B", 4, 0.0)
    s.forward_fetch(out, 0.0)
    assert sent(s.c.handle(ix.RequestFinished("A", producer=False), 1.0), wm.AbortFetch)
    if heard == "pings":  # alive, but sending nothing: a ping is no work, the abort is not waited for
        assert sent(s.to_c(wm.Ping(gen=s.gen, t=5.5), 5.5), wm.Pong)
    elif heard:
        out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="B", round=rb, first=0, count=2), 5.5)
        assert of(out, LandBlocks)
    out = s.c.fire(6.0)
    if heard is not True:
        assert ended(out) == [(P, "abort_unacknowledged")]
        return
    assert ended(out) == [] and of(out, JobDone) == [] and s.c.consumer_state("A") is ConsumerState.CANCELLING
    out = s.to_c(wm.AbortAck(gen=s.gen, kv_request_id="A", round=ra), 7.0)
    assert of(out, JobDone) == [JobDone(ja, False, Reason.CANCELLED)]
    assert s.c.consumer_state("B") is ConsumerState.IN_FLIGHT and CoreView(s.c).session_ready(P)


@pytest.mark.parametrize("how", ["cancelled", "timed_out"])
def test_an_unanswered_abort_ends_only_its_load_while_the_producer_streams_other_data(how: str) -> None:
    """L20: on zmq (the consumer lands every byte itself) an abort whose answer is still queued
    behind other loads' data when its own deadline has passed ends that load alone: the producer is
    at work, so the session is not stalled, and nothing of the ended load can land any more.  Load
    A is cancelled at t=1 (or times out at t=30), B's bytes keep arriving every 5 s: A fails with
    its own reason, B stays in flight and completes, and A's late data and late answer change
    nothing.  Before L20 the session ended ``abort_unacknowledged``, failing B."""
    s = Pair()
    s.store("A", 4, 0.0)
    s.store("B", 4, 0.0, start=10, blocks=tuple(range(10, 14)))
    ja, ra, out = s.load("A", 4, 0.0)
    s.forward_fetch(out, 0.0)
    jb, rb, out = s.load("B", 4, 9.0)  # its own deadline at t=39
    s.forward_fetch(out, 9.0)
    if how == "cancelled":
        assert sent(s.c.handle(ix.RequestFinished("A", producer=False), 1.0), wm.AbortFetch)
        last, reason, state = 31.0, Reason.CANCELLED, ConsumerState.CANCELLING
    else:
        last, reason, state = 36.0, Reason.LOAD_TIMEOUT, ConsumerState.ABORTING
    t, first, results = 5.5, 0, []
    while t < last:
        if 9 < t and first < 3:  # B's first three blocks, one every 5 s; A's answer queues behind
            out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="B", round=rb, first=first, count=1), t)
            assert of(out, LandBlocks)
            s.c.handle(ix.BlocksLanded(P, "B", rb, first, 1, True), t)
            first += 1
        else:  # then part of a message: the transport's progress (decision L19)
            s.c.handle(ix.PeerProgress(P), t)
        out = s.revoked(s.c.fire(t + 0.5), t + 0.5)
        assert ended(out) == []
        results += of(out, JobDone)
        if not results:
            assert s.c.consumer_state("A") is (state if t + 0.5 >= 30.0 or how == "cancelled" else
                                               ConsumerState.IN_FLIGHT)
        t += 5.0
    assert results == [JobDone(ja, False, reason)]
    assert CoreView(s.c).session_ready(P) and s.c.consumer_state("B") is ConsumerState.IN_FLIGHT
    # A's data and answer, late: never landed, nothing reported
    out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="A", round=ra, first=0, count=4), last + 1)
    assert of(out, LandBlocks) == [] and of(out, JobDone) == []
    assert of(s.to_c(wm.AbortAck(gen=s.gen, kv_request_id="A", round=ra), last + 1), JobDone) == []
    out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="B", round=rb, first=3, count=1), last + 2)
    assert of(out, LandBlocks)
    out = s.c.handle(ix.BlocksLanded(P, "B", rb, 3, 1, True), last + 2)
    out += s.to_c(wm.TransferDone(gen=s.gen, kv_request_id="B", round=rb, ok=True, reason=""), last + 2)
    assert of(out, JobDone) == [JobDone(jb, True, None)]


def test_on_a_one_sided_plane_any_message_shows_the_producer_at_work_for_an_abort() -> None:
    """L19: a one-sided plane's WRITEs bypass the connection (the producer answers the abort once
    those it posted drained): a pong is all the consumer may see, and it waits again for it."""
    s = Pair(options={"one_sided": True})
    s.store("A", 4, 0.0)
    ja, ra, out = s.load("A", 4, 0.0)
    s.forward_fetch(out, 0.0)
    assert sent(s.c.handle(ix.RequestFinished("A", producer=False), 1.0), wm.AbortFetch)
    s.to_c(wm.Pong(gen=s.gen, t=5.0), 5.5)
    out = s.c.fire(6.0)
    assert ended(out) == [] and s.c.consumer_state("A") is ConsumerState.CANCELLING
    out = s.c.fire(11.0)  # nothing heard since 5.5: given up
    assert ended(out) == [(P, "abort_unacknowledged")]


def test_loads_that_time_out_together_each_report_their_own_deadline() -> None:
    """L19: two loads from one producer time out together (t=30); the first unanswered abort ends
    the session (t=35) while the second still waits for its own answer: both had failed for their
    deadline before the session died, so both report ``load_timeout``, and so does a load whose
    session closes while it waits for its abort's answer (it reported the session's reason)."""
    s = Pair()
    ja, _, out = s.load("A", 4, 0.0)
    s.forward_fetch(out, 0.0)
    jb, _, out = s.load("B", 4, 0.0)
    s.forward_fetch(out, 0.0)
    assert len(sent(s.c.fire(30.0), wm.AbortFetch)) == 2
    out = s.revoked(s.c.fire(35.0), 35.0)
    assert ended(out) == [(P, "abort_unacknowledged")]
    assert sorted(of(out, JobDone), key=lambda j: j.job_id) == [JobDone(ja, False, Reason.LOAD_TIMEOUT),
                                                                JobDone(jb, False, Reason.LOAD_TIMEOUT)]
    # the session dying of anything else while a load waits for its abort's answer: the same
    s = Pair()
    ja, _, out = s.load("A", 4, 0.0)
    s.forward_fetch(out, 0.0)
    assert sent(s.c.fire(30.0), wm.AbortFetch)
    out = s.revoked(s.c.handle(ix.ConnectionClosed(P), 31.0), 31.0)
    assert of(out, JobDone) == [JobDone(ja, False, Reason.LOAD_TIMEOUT)]
