"""What a job's one result says (kvtier.api.JobResult), on the manager pair over an in-memory
network and a virtual clock: a successful load reports the bytes that landed and the seconds from
submit to result; a store, or a failed load, reports neither; a job id stays taken until its result
was collected, and is free again after.  Exact figures: the clock only moves when the test says."""

from __future__ import annotations

import pytest

from kvtier.api import DuplicateJob
from mgr_helpers import digests, job, keys_for
from virtual_helpers import BB, SCEN, outcome, store

pytestmark = pytest.mark.timeout(60)


def _poll_without_collecting(v, rounds: int = 8) -> None:
    """Deliver and process messages, leaving every result uncollected (VirtualPair.step collects)."""
    for _ in range(rounds):
        v.P.poll(0)
        v.C.poll(0)


def test_a_load_reports_the_bytes_landed_and_the_seconds_from_submit_to_result(pairs):
    v = pairs(SCEN, block_bytes=BB)
    ca = v.creq("c-A", "A")
    v.C.on_new_request(ca)
    v.advance_to(2.0)
    v.C.submit_load(job(10, keys_for("A", 3), [0, 1, 2], ca))  # fetched before anything is stored
    v.advance_to(4.5)
    assert not v.cjobs.has(10)
    store(v, "A", 1, [0, 1, 2], seed=3)  # the producer stores at t=4.5: the waiting fetch is served
    v.step()
    (load,) = v.cjobs.by_id[10]
    assert (load.success, load.reason, load.transfer_bytes) == (True, None, 3 * BB)
    assert load.transfer_time_s == pytest.approx(2.5)
    assert load.successful_keys is None
    (stored,) = v.pjobs.by_id[1]
    assert (stored.success, stored.reason, stored.transfer_bytes, stored.transfer_time_s) == (True, None, None, None)


def test_a_failed_load_reports_its_reason_and_neither_bytes_nor_seconds(pairs):
    v = pairs(SCEN, block_bytes=BB)
    ca = v.creq("c-A", "A")
    v.C.on_new_request(ca)
    v.C.submit_load(job(10, keys_for("A", 2), [0, 1], ca))  # nothing is ever stored for A
    v.advance_to(11.0)  # past fetch_supply_timeout_s (10 s)
    (load,) = v.cjobs.by_id[10]
    assert (load.success, load.reason, load.transfer_bytes, load.transfer_time_s, load.successful_keys) == (
        False, "supply_timeout", None, None, None)


def test_a_job_id_stays_taken_until_its_result_is_collected(pairs):
    v = pairs(SCEN, block_bytes=BB)
    store(v, "A", 1, [0], seed=1)
    ca = v.creq("c-A", "A")
    v.C.on_new_request(ca)
    v.C.submit_load(job(10, keys_for("A", 1), [0], ca))
    assert v.C.is_outstanding(10) and v.C.jobs_in_flight() == frozenset({10})
    with pytest.raises(DuplicateJob, match=r"^job 10 is already outstanding$"):
        v.C.submit_load(job(10, keys_for("A", 1), [1], ca))
    _poll_without_collecting(v)
    # the load ended (no longer in flight) but its result waits: the id is still taken
    assert v.C.jobs_in_flight() == frozenset() and v.C.outstanding_jobs() == frozenset({10})
    assert v.C.is_outstanding(10)
    with pytest.raises(DuplicateJob, match=r"^job 10 is already outstanding \(its result has not been collected yet\)$"):
        v.C.submit_load(job(10, keys_for("A", 1), [1], ca))
    (result,) = v.C.get_finished_jobs(poll=False)
    assert (result.job_id, result.success) == (10, True)
    assert not v.C.is_outstanding(10) and v.C.outstanding_jobs() == frozenset()
    assert v.C.get_finished_jobs(poll=False) == []  # exactly one result
    # collected: the id is free for a new job
    cb = v.creq("c-B", "B")
    v.C.on_new_request(cb)
    v.C.submit_load(job(10, keys_for("B", 1), [1], cb))
    assert v.C.is_outstanding(10)


def test_every_result_is_counted_by_kind_outcome_and_reason_and_only_network_loads_are_timed(pairs):
    """``kvtier_jobs_total{kind,outcome,reason}`` counts each result once; the consumer's transfer
    histograms observe a successful load's bytes and submit-to-result seconds, and nothing else."""
    from kvtier.api import RequestContext
    from mgr_helpers import metric

    v = pairs(SCEN, block_bytes=BB)
    ca = v.creq("c-A", "A")
    v.C.on_new_request(ca)
    v.advance_to(2.0)
    v.C.submit_load(job(10, keys_for("A", 3), [0, 1, 2], ca))
    v.advance_to(4.5)
    store(v, "A", 1, [0, 1, 2], seed=3)
    v.step()
    cb = v.creq("c-B", "B")  # never stored: fails by the supply timeout
    v.C.on_new_request(cb)
    v.C.submit_load(job(11, keys_for("B", 1), [3], cb))
    local = RequestContext(req_id="p-local", kv_transfer_params={})  # no remote decoder: nothing to park
    v.P.on_new_request(local)
    v.P.submit_store(job(2, keys_for("L", 1), [5], local))
    v.advance_to(16.0)
    assert outcome(v.cjobs, 10) == (True, None) and outcome(v.cjobs, 11) == (False, "supply_timeout")
    C, P = v.C, v.P
    assert metric(C, "kvtier_jobs_total", kind="load", outcome="ok", reason="") == 1
    assert metric(C, "kvtier_jobs_total", kind="load", outcome="fail", reason="supply_timeout") == 1
    assert metric(C, "kvtier_transfer_bytes_count", role="consumer") == 1
    assert metric(C, "kvtier_transfer_bytes_sum", role="consumer") == 3 * BB
    assert metric(C, "kvtier_transfer_duration_seconds_sum", role="consumer") == pytest.approx(2.5)
    assert metric(P, "kvtier_jobs_total", kind="store", outcome="ok", reason="") == 1
    assert metric(P, "kvtier_jobs_total", kind="store", outcome="ok", reason="local") == 1
    assert metric(P, "kvtier_transfer_bytes_count", role="consumer") == 0


def test_a_second_load_into_slots_still_being_loaded_is_refused_and_the_first_lands_its_own_bytes(pairs):
    """Decision A9: two loads in flight into one slot would both report success with one id's
    bytes; the second ``submit_load`` raises at once, naming the slot and the job, and changes
    nothing; once the first load's result is in, the slot takes the second load."""
    v = pairs(SCEN, block_bytes=BB)
    _, want_a = store(v, "A", 1, [0, 1], seed=1)
    _, want_b = store(v, "B", 2, [2, 3], seed=2)
    ca, cb = v.creq("c-A", "A"), v.creq("c-B", "B")
    v.C.on_new_request(ca)
    v.C.on_new_request(cb)
    v.C.submit_load(job(10, keys_for("A", 2), [4, 5], ca))
    with pytest.raises(ValueError, match=r"^submit_load job 11: slot 5 is still being loaded by job 10: "):
        v.C.submit_load(job(11, keys_for("B", 2), [5, 6], cb))
    assert v.C.outstanding_jobs() == frozenset({10})
    v.step()
    assert outcome(v.cjobs, 10) == (True, None) and digests(v.C.pool, [4, 5]) == want_a
    v.C.submit_load(job(11, keys_for("B", 2), [5, 6], cb))  # the slot is free again
    v.step()
    assert outcome(v.cjobs, 11) == (True, None) and digests(v.C.pool, [5, 6]) == want_b
