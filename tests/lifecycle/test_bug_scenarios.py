"""Regression tests for the bug scenarios of the producer's park clock: a late fetch, reap, prune,
fetches for blocks never stored, a second owner, unknown ids, empty and partial fetches
(B-numbers; each test's docstring says what its scenario is; cancels, aborts and failures are in
``test_bug_scenarios_aborts.py``; the harness is :mod:`tests.lifecycle.scenario_pair`).

Each test replays one scenario against :class:`~kvtier.lifecycle.TierCore` with explicit ``now``
values and checks the *expected* outcome the scenario states.  Scenario parameters: ``T_park`` =
``unbound_store_timeout_s`` = 60, ``T_tomb`` = ``tombstone_retention_s`` = 60, ``T_load`` =
``load_timeout_s`` = 30 (overridden where the scenario says so).  "Within one RTT" means: in the
effects of the very call that receives the message.

What the core cannot express (memory pools, metrics, retries, id validation on the wire) is named
in each test's docstring; those parts belong to the shell (``kvtier.manager``), the block pool or
the wire codec.
"""

from __future__ import annotations

import pytest

from kvtier.lifecycle import ProducerState, Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Ignored, JobDone, Send, SendBlocks
from kvtier.wire import messages as wm
from tests.lifecycle.scenario_pair import C, P, Pair, done_fail, entry, keys, of, sent
from tools import snapshot
from tools.coreview import CoreView

# ------------------------------------------------------------------------------------------------


def test_b01_late_fetch_after_reap_is_refused_in_one_rtt_and_sends_no_bytes() -> None:
    """B01. Not expressible in the core: the ``kvtier_fetches_refused_total`` counter (the shell counts
    refusals it sends) and the consumer's local prefill fallback."""
    s = Pair()
    job_a, out = s.store("A", 4, 0.0, blocks=(0, 1, 2, 3))
    assert out == [] and s.p.producer_state("A") is ProducerState.PARKED
    out = s.p.fire(60.0)
    assert of(out, JobDone) == [JobDone(job_a, False, Reason.REAPED)]  # the 4 blocks are released
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    assert CoreView(s.p).producer("A").parked == ()
    job_b, out = s.store("B", 4, 61.0, blocks=(0, 1, 2, 3))  # B reuses the same pool blocks
    b_before = entry(s.p, "B").blocks
    out = s.fetch("A", keys("A", 4), 62.0)
    assert done_fail(out, "A").reason == "reaped"
    assert of(out, SendBlocks) == [] and of(out, JobDone) == []
    assert entry(s.p, "B").blocks == b_before
    assert s.p.producer_state("B") is ProducerState.PARKED
    s.p.fire(119.9)
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    s.p.fire(120.0)
    assert s.p.producer_state("A") is ProducerState.ABSENT  # pruned at t=120
    # t=125: handled as an unknown id (B15), never as data
    out = s.fetch("A", keys("A", 4), 125.0)
    assert of(out, SendBlocks) == [] and s.p.producer_state("A") is ProducerState.AWAITING
    out = s.p.fire(135.0)
    assert done_fail(out, "A").reason == "supply_timeout"
    assert of(out, SendBlocks) == []


@pytest.mark.parametrize("park_clock", ["first_store", "last_store"])
def test_b02_park_clock_for_a_chunked_prefill(park_clock: str) -> None:
    """B02 with T_park=60: 12 chunks stored from t=0 to t=13, the consumer's fetch arrives at
    t=65.  ``first_store`` (vLLM p2p behaviour) reaps at t=60 and refuses the fetch at once with
    ``reaped``; ``last_store`` (kvtier's default) counts from the last chunk (t=13), so the fetch at
    t=65 is served.  Not expressible: the ``park_age_at_bind`` / ``reaped_unbound`` metrics."""
    s = Pair(park_clock=park_clock)
    jobs = []
    for i in range(12):
        t = 0.0 if i == 0 else (13.0 if i == 11 else 1.0 + i)
        job, out = s.store("A", 1, t, start=i)
        jobs.append(job)
        assert out == []
    assert CoreView(s.p).producer("A").deadline == (60.0 if park_clock == "first_store" else 73.0)
    out = s.p.fire(60.0)
    out += s.fetch("A", keys("A", 12), 65.0)
    if park_clock == "first_store":
        assert of(out, JobDone) == [JobDone(j, False, Reason.REAPED) for j in jobs]
        assert done_fail(out, "A").reason == "reaped"  # at t=65, not t=95
        assert of(out, SendBlocks) == []
    else:
        assert of(out, JobDone) == []
        (send,) = of(out, SendBlocks)
        assert len(send.blocks) == 12
        out = s.complete("A", 0, 66.0)
        assert of(out, JobDone) == [JobDone(j, True, None) for j in jobs]  # 12 chunks released
        assert sent(out, wm.TransferDone) == []  # the consumer's receipt ended it: nothing to answer


def test_b02_variant_t_park_180_serves_the_fetch_at_65() -> None:
    """B02 variant cfg(T_park=180), first-store clock: no reap at t=60; the fetch at t=65 binds,
    the transfer completes and the 12 chunks are released."""
    s = Pair(park_clock="first_store", unbound_store_timeout_s=180.0)
    jobs = [s.store("A", 1, float(i), start=i)[0] for i in range(12)]
    assert s.p.fire(60.0) == []
    out = s.fetch("A", keys("A", 12), 65.0)
    assert len(of(out, SendBlocks)[0].blocks) == 12
    out = s.complete("A", 0, 65.5)
    assert of(out, JobDone) == [JobDone(j, True, None) for j in jobs]
    assert sent(out, wm.TransferDone) == []


def test_b03_store_after_reap_fails_at_once_and_pins_nothing() -> None:
    """B03: a late chunk of a reaped id fails immediately, is not parked, does not extend the
    retention; a late fetch is refused in one RTT; the tombstone is pruned at t=120."""
    s = Pair()
    s.store("A", 1, 0.0)
    s.p.fire(60.0)
    prune_at = CoreView(s.p).producer("A").deadline
    assert prune_at == 120.0
    job2, out = s.store("A", 1, 61.0, start=1)
    assert of(out, JobDone) == [JobDone(job2, False, Reason.REAPED, at_submission=True)]
    v = CoreView(s.p).producer("A")
    assert v.state is ProducerState.TOMBSTONED and v.parked == () and v.jobs == ()
    assert CoreView(s.p).producer("A").deadline == prune_at  # retention not extended
    assert done_fail(s.fetch("A", keys("A", 2), 62.0), "A").reason == "reaped"
    s.p.fire(120.0)
    assert s.p.producer_state("A") is ProducerState.ABSENT


def test_b12_fetch_for_blocks_that_will_never_come_is_answered_promptly() -> None:
    """B12: the producer holds k1,k2,k4 of A (k3 never stored, the parked blocks are pinned so
    they cannot be evicted: kvtier's analogue of "P evicts k3").  Once the prefill has finished,
    the fetch for k1..k4 is refused in one RTT (``incomplete``); while it may still store, the
    fetch waits at most fetch_supply_timeout_s (t=12, well inside T_load)."""
    s = Pair()
    ks = keys("A", 4)
    for i in (0, 1, 3):
        s.p.handle(ix.StoreSubmitted("A", "req-A", 10 + i, (ks[i],), (i,)), 0.0)
    s.p.handle(ix.RequestFinished("A", producer=True), 0.5)
    out = s.fetch("A", ks, 2.0)
    assert done_fail(out, "A").reason == "incomplete" and of(out, SendBlocks) == []
    assert sorted(j.job_id for j in of(out, JobDone)) == [10, 11, 13]
    s = Pair()
    for i in (0, 1, 3):
        s.p.handle(ix.StoreSubmitted("A", "req-A", 10 + i, (ks[i],), (i,)), 0.0)
    out = s.fetch("A", ks, 2.0)
    assert out == [] and s.p.producer_state("A") is ProducerState.AWAITING
    assert done_fail(s.p.fire(12.0), "A").reason == "supply_timeout"


def test_a_fetch_waiting_for_blocks_the_request_never_stored_is_told_nothing_stored() -> None:
    """A fetch that arrived first (awaiting) for an id whose producer request then finished having
    stored nothing (its engine could not: a full CPU tier) is answered ``nothing_stored``, as a
    fetch after that finish is, not ``incomplete``, whose advice points at prompts that differ (an
    outside tester); a request that stored part of what the fetch named is still ``incomplete``."""
    for stored, reason in (((), "nothing_stored"), ((0,), "incomplete")):
        s = Pair()
        ks = keys("A", 2)
        assert s.fetch("A", ks, 0.5) == [] and s.p.producer_state("A") is ProducerState.AWAITING
        for i in stored:
            s.p.handle(ix.StoreSubmitted("A", "req-A", 10 + i, (ks[i],), (i,)), 0.6)
        out = s.p.handle(ix.RequestFinished("A", producer=True), 1.0)
        assert done_fail(out, "A").reason == reason and s.p.producer_state("A") is ProducerState.TOMBSTONED
        assert sorted(j.job_id for j in of(out, JobDone)) == [10 + i for i in stored]
        late = Pair()  # the same request finished before the fetch came: the same answer
        for i in stored:
            late.p.handle(ix.StoreSubmitted("A", "req-A", 10 + i, (ks[i],), (i,)), 0.6)
        late.p.handle(ix.RequestFinished("A", producer=True), 1.0)
        assert done_fail(late.fetch("A", ks, 1.5), "A").reason == reason


def test_b12_second_round_for_a_live_id_is_refused_and_the_first_is_untouched() -> None:
    """B12 (one fetch per id): a second round while the first is live fails only that fetch
    (``duplicate_fetch``); an exact network duplicate of the live round is ignored."""
    s = Pair()
    s.store("A", 2, 0.0)
    assert s.p.producer_state("A") is ProducerState.PARKED
    ks = keys("A", 3)  # one key missing: the round waits in awaiting
    assert s.fetch("A", ks, 1.0, rnd=7) == []
    out = s.fetch("A", ks, 1.5, rnd=8)
    fail = done_fail(out, "A")
    assert (fail.round, fail.reason) == (8, "duplicate_fetch")
    v = CoreView(s.p).producer("A")
    assert (v.state, v.round, v.peer) == (ProducerState.AWAITING, 7, C)
    out = s.fetch("A", ks, 1.6, rnd=7)  # the network repeated round 7
    assert sent(out, wm.TransferDone) == [] and of(out, Ignored)
    # the first round goes on: the missing block arrives and is sent
    out = s.p.handle(ix.StoreSubmitted("A", "req-A", 99, (ks[2],), (9,)), 2.0)
    assert of(out, SendBlocks)[0].round == 7


def test_b13_a_second_owner_cannot_park_under_a_live_id() -> None:
    """B13: r2's store under r1's live id fails (``id_in_use``) and r1's entry is untouched; after
    Done(A) nothing is pinned for A.  Id validation (non-empty, bounded, charset) is the wire
    codec's job (``kvtier.wire.messages``), not the core's."""
    s = Pair()
    j1, _ = s.store("A", 4, 0.0, owner="r1", blocks=(0, 1, 2, 3))
    before = entry(s.p, "A")
    j2, out = s.store("A", 4, 1.0, owner="r2", blocks=(4, 5, 6, 7))
    assert of(out, JobDone) == [JobDone(j2, False, Reason.ID_IN_USE, at_submission=True)]
    after = entry(s.p, "A")
    assert after == before and after.jobs == (j1,) and after.owner == "r1"
    out = s.fetch("A", keys("A", 4), 2.0)
    assert of(out, SendBlocks)[0].blocks == (0, 1, 2, 3)
    out = s.complete("A", 0, 2.5)
    assert of(out, JobDone) == [JobDone(j1, True, None)]
    v = CoreView(s.p).producer("A")
    assert v.state is ProducerState.DONE and v.parked == () and v.jobs == ()
    assert CoreView(s.p).pending_jobs() == 0


def test_b15_unknown_id_demand_is_bounded_in_time_and_count() -> None:
    """B15: 10 001 fetches for ids never stored: at most max_pending_fetches_per_peer wait (the rest
    are refused at once, ``too_many_pending``), each waits at most fetch_supply_timeout_s (10 s,
    never the consumer's 30 s) before ``Done(fail, supply_timeout)``; a legitimate store+fetch of Y
    meanwhile completes; a fetch for a tombstoned id is refused at once."""
    s = Pair(max_pending=100)
    refused = 0
    for i in range(10_001):
        out = s.fetch(f"X{i}", (b"k",), 0.0)
        refused += sum(1 for m in sent(out, wm.TransferDone) if m.reason == "too_many_pending")
    assert refused == 10_001 - 100
    awaiting_per_peer = snapshot.indexes(s.p)[1]
    assert awaiting_per_peer == ((C, 100),)
    jy, _ = s.store("Y", 2, 0.1)
    out = s.fetch("Y", keys("Y", 2), 0.2)
    (served,) = of(out, SendBlocks)  # a legitimate fetch is not refused by the pending bound
    out = s.complete("Y", served.round, 0.3)
    assert of(out, JobDone) == [JobDone(jy, True, None)]
    assert sent(s.p.fire(9.9), wm.TransferDone) == []
    out = s.p.fire(10.0)
    fails = sent(out, wm.TransferDone)
    assert len(fails) == 100 and {f.reason for f in fails} == {"supply_timeout"}
    assert snapshot.indexes(s.p)[1] == ()
    s.abort("T", 11.0)  # T tombstoned (aborted)
    assert done_fail(s.fetch("T", (b"k",), 11.5), "T").reason == "aborted"


def test_b15_unknown_id_fetch_fails_after_fetch_supply_timeout_never_30s() -> None:
    s = Pair(fetch_supply_timeout_s=7.0)
    job, rnd, out = s.load("X", 1, 0.0)
    assert s.forward_fetch(out, 0.0) == []
    out = s.p.fire(7.0)
    fail = done_fail(out, "X")
    assert fail.reason == "supply_timeout"
    out = s.to_c(fail, 7.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.SUPPLY_TIMEOUT)]  # at t=7, not t=30


def test_b16_a_consumer_that_never_comes_the_reaper_alone_reclaims() -> None:
    """B16: no fetch, no abort, no other traffic — only ticks.  At t=60 A is reaped (its job
    fails, blocks released, tombstoned); at t=120 pruned and no structure references A."""
    s = Pair()
    job, _ = s.store("A", 4, 0.0)
    out = s.p.fire(60.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.REAPED)]
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    s.p.fire(120.0)
    assert not CoreView(s.p).tracks("A")  # no record, no retained entry, no per-peer index entry, no deadline
    assert all(d.key != "A" for d in CoreView(s.p).deadlines())
    assert CoreView(s.p).pending_jobs() == 0


def test_b20_zero_block_store_and_fetch_complete_immediately() -> None:
    """B20: a zero-block store succeeds at once and pins nothing; a zero-key fetch is answered
    Done(ok) at once with zero data posts; a zero-key load succeeds at once and its (empty) fetch
    releases the producer's parked blocks; an empty final chunk after non-empty ones completes
    with the others."""
    s = Pair()
    job, out = s.store("A", 0, 0.0)
    assert out == [JobDone(job, True, None, at_submission=True)] and CoreView(s.p).producer("A") is None
    out = s.fetch("A", (), 1.0)
    assert of(out, Send) == [Send(C, wm.TransferDone(gen=s.gen, kv_request_id="A", round=0, ok=True, reason=""))]
    assert of(out, SendBlocks) == []
    assert CoreView(s.p).pending_jobs() == 0
    cjob = s.next_job()
    s.c.handle(ix.LoadAnnounced("E", P), 1.0)
    out = s.c.handle(ix.LoadSubmitted("E", cjob, (), ()), 1.0)
    assert of(out, JobDone) == [JobDone(cjob, True, None)]
    (empty,) = sent(out, wm.Fetch)  # a zero-key fetch tells the producer to release E at once
    assert empty.keys == []
    je, _ = s.store("E", 2, 0.5)
    out = s.to_p(empty, 1.0)
    # the parked blocks were not needed: the store job succeeds saying so (decision L12)
    assert of(out, JobDone) == [JobDone(je, True, Reason.NOT_NEEDED)] and of(out, SendBlocks) == []
    assert sent(out, wm.TransferDone)[0].ok and s.p.producer_state("E") is ProducerState.DONE
    # a final empty chunk after non-empty ones
    j1, _ = s.store("B", 2, 2.0)
    j2, out = s.store("B", 0, 2.5)
    out = s.fetch("B", keys("B", 2), 3.0, rnd=empty.round + 1)  # the consumer's next round
    assert of(out, SendBlocks)
    out = s.complete("B", empty.round + 1, 3.5)
    assert sorted(of(out, JobDone), key=lambda j: j.job_id) == [JobDone(j1, True, None), JobDone(j2, True, None)]


def test_b29_fetching_a_subset_releases_every_parked_block() -> None:
    """B29: 10 blocks parked, the consumer fetches 6 (4 already cached locally): at Done(A, ok) the
    store job covering all 10 is released and nothing stays pinned for A; only 6 blocks travel."""
    s = Pair()
    job, _ = s.store("A", 10, 0.0)
    out = s.fetch("A", keys("A", 6), 1.0)
    assert len(of(out, SendBlocks)[0].blocks) == 6
    out = s.complete("A", 0, 1.5)
    assert of(out, JobDone) == [JobDone(job, True, None)]
    assert CoreView(s.p).producer("A").parked == () and CoreView(s.p).pending_jobs() == 0
