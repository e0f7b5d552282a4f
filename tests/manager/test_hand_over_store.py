"""``KvTierManager.hand_over_store`` (decision C29): a store whose keys and slots are checked on the
I/O loop.  What needs no pass over the blocks still raises at once; a malformed job gets its one
result, failed ``bad_job``, with an error log naming what was wrong; a good one is parked and
fetched exactly as one from ``submit_store``."""

from __future__ import annotations

import logging

import pytest

from kvtier.api import DuplicateJob, RequestContext, UnknownRequest
from kvtier.memory import BlockPool
from kvtier.manager import KvTierManager
from mgr_helpers import VirtualPair, consumer_req, digests, fill_pattern, job, keys_for, producer_req, pump_until
from kvtier.testing.pair import Jobs
from tools.coreview import CoreView


def test_a_handed_over_store_is_parked_and_fetched_like_a_submitted_one() -> None:
    v = VirtualPair(block_bytes=64)
    try:
        preq = producer_req("p", "A")
        v.P.on_new_request(preq)
        want = fill_pattern(v.P.pool, [0, 1, 2], seed=5)
        v.P.hand_over_store(1, preq, tuple(keys_for("A", 3)), [0, 1, 2])  # slots: a list, as vLLM's tolist()
        v.P.on_request_finished(preq)  # queued behind the store: applied after it, in order
        creq = v.creq("c", "A")
        v.C.on_new_request(creq)
        v.C.submit_load(job(2, keys_for("A", 3), [5, 6, 7], creq))
        v.step()
        assert v.cjobs.one(2).success
        assert digests(v.C.pool, [5, 6, 7]) == want
        assert v.pjobs.one(1).success
    finally:
        v.close()


@pytest.mark.parametrize(("keys", "slots", "named"), [
    ((b"k0", b"k1"), [0, 0], "duplicate slots"),
    ((b"k0", b"k0"), [0, 1], "duplicate keys"),
    ((b"k0",), [16], "outside the pool"),
    ((b"k0", b"k1"), [0], "2 keys but 1 slots"),
    (("k0",), [0], "keys must be 1..256 bytes"),
    ((b"k0",), [True], "slot True is a bool"),
    ((b"k0", b"k1"), [0, [1]], "slot [1] is a list"),
])
def test_a_malformed_handed_over_store_fails_bad_job_on_the_loop(keys, slots, named, caplog) -> None:
    v = VirtualPair(block_bytes=64)
    try:
        preq = producer_req("p", "A")
        v.P.on_new_request(preq)
        with caplog.at_level(logging.ERROR, logger="kvtier"):
            v.P.hand_over_store(1, preq, keys, slots)  # no exception: the loop checks it
            v.step()
        r = v.pjobs.one(1)
        assert (r.success, r.reason) == (False, "bad_job")
        assert any(named in m and "store refused: job 1:" in m for m in (rec.getMessage() for rec in caplog.records)), \
            [rec.getMessage() for rec in caplog.records]
        assert not CoreView(v.P.core).tracks("A")  # the core never saw the store
        # the id is free again once its result was collected, and a good store of it parks
        v.P.hand_over_store(1, preq, (b"k0",), [3])
        v.step()
        assert CoreView(v.P.core).tracks("A")
        assert v.P.is_outstanding(1)
    finally:
        v.close()


def test_what_needs_no_pass_over_the_blocks_still_raises_at_once() -> None:
    v = VirtualPair(block_bytes=64)
    try:
        preq = producer_req("p", "A")
        with pytest.raises(UnknownRequest, match="never announced"):
            v.P.hand_over_store(1, preq, (b"k",), [0])
        v.P.on_new_request(preq)
        with pytest.raises(ValueError, match="job_id"):
            v.P.hand_over_store(-1, preq, (b"k",), [0])
        with pytest.raises(TypeError, match="RequestContext"):
            v.P.hand_over_store(1, "p", (b"k",), [0])  # type: ignore[arg-type]
        v.P.hand_over_store(1, preq, (b"k",), [0])
        with pytest.raises(DuplicateJob):
            v.P.hand_over_store(1, preq, (b"j",), [1])
        with pytest.raises(TypeError, match="slots must be a list or tuple of ints, got NoneType"):
            v.P.hand_over_store(4, preq, (b"k",), None)  # type: ignore[arg-type]
        assert not v.P.is_outstanding(4)
        local = RequestContext(req_id="local")
        v.P.on_new_request(local)
        v.P.hand_over_store(2, local, (b"x",), [9])  # a local-only request: done, nothing parked
        v.P.hand_over_store(5, local, (b"x", b"y"), [9, 9])  # ... but checked like any other
        v.step()
        assert (v.pjobs.one(2).success, v.pjobs.one(2).reason) == (True, None)
        assert (v.pjobs.one(5).success, v.pjobs.one(5).reason) == (False, "bad_job")
        assert not v.pjobs.by_id.get(1)  # parked, waiting for its consumer
        v.P.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            v.P.hand_over_store(3, preq, (b"k",), [2])
    finally:
        v.close()


def test_a_threaded_hand_over_is_checked_and_answered_by_the_loop() -> None:
    """With the loop on its own thread, the store is checked there: a good one is fetched, a bad
    one's failure arrives through ``get_finished_jobs`` — each job exactly one result."""
    cfg = {"host": "127.0.0.1", "port": 0, "background_poll": True}
    p = KvTierManager(cfg, BlockPool(8, 64, pin=False))
    c = KvTierManager(cfg, BlockPool(8, 64, pin=False))
    try:
        pjobs, cjobs = Jobs(p), Jobs(c)
        preq = producer_req("p", "T")
        p.on_new_request(preq)
        want = fill_pattern(p.pool, [1, 2], seed=9)
        p.hand_over_store(7, preq, tuple(keys_for("T", 2)), [1, 2])
        bad = producer_req("p-bad", "U")
        p.on_new_request(bad)
        p.hand_over_store(8, bad, (b"u0", b"u1"), [3, 3])
        creq = consumer_req("c", "T", p.host, p.port)
        c.on_new_request(creq)
        c.submit_load(job(1, keys_for("T", 2), [4, 5], creq))
        assert pump_until(lambda: cjobs.has(1) and pjobs.has(7, 8), managers=[], jobs=[pjobs, cjobs])
        assert cjobs.one(1).success and digests(c.pool, [4, 5]) == want
        assert pjobs.one(7).success
        assert (pjobs.one(8).success, pjobs.one(8).reason) == (False, "bad_job")
    finally:
        p.shutdown()
        c.shutdown()


class _Unhashable(bytes):
    def __hash__(self) -> int:
        raise RuntimeError("a key whose hash raises")


def test_whatever_the_check_raises_the_job_gets_its_one_result(caplog) -> None:
    """Not only a malformed job: any error while the loop checks a handed-over store settles it
    (counted as an internal error), so a drain or the engine's pending work never waits on it."""
    v = VirtualPair(block_bytes=64)
    try:
        preq = producer_req("p", "A")
        v.P.on_new_request(preq)
        v.P.hand_over_store(1, preq, (_Unhashable(b"k0"), b"k1"), [0, 1])
        v.step()
        assert (v.pjobs.one(1).success, v.pjobs.one(1).reason) == (False, "job_refused")
        assert v.P.stats()["kvtier_internal_errors_total"] == 1
        v.P.drain_jobs(timeout_s=1.0)
        assert not v.P.has_pending_work()
    finally:
        v.close()


def test_a_key_stored_twice_under_one_id_is_served_with_its_first_bytes() -> None:
    """Decision I31, with real bytes: the second job's new key is served from its own slot, the
    repeated key from the first job's, and every job succeeds."""
    v = VirtualPair(block_bytes=64)
    try:
        preq = producer_req("p", "A")
        v.P.on_new_request(preq)
        want = fill_pattern(v.P.pool, [0, 2], seed=1)
        fill_pattern(v.P.pool, [1], seed=2)  # other bytes under the repeated key
        k0, k1 = keys_for("A", 2)
        v.P.submit_store(job(1, (k0,), [0], preq))
        v.P.submit_store(job(2, (k0, k1), [1, 2], preq))
        v.P.on_request_finished(preq)
        creq = v.creq("c", "A")
        v.C.on_new_request(creq)
        v.C.submit_load(job(9, (k0, k1), [5, 6], creq))
        v.step()
        assert v.cjobs.one(9).success
        assert digests(v.C.pool, [5, 6]) == want
        assert v.pjobs.one(1).success and v.pjobs.one(2).success
    finally:
        v.close()


def test_a_job_of_a_finished_request_is_refused_naming_the_finish() -> None:
    """A store or load submitted after ``on_request_finished`` of its request raises
    ``UnknownRequest`` saying the request finished (it had been announced), not that it never was."""
    v = VirtualPair(block_bytes=64)
    try:
        preq, creq = producer_req("p", "A"), v.creq("c", "A")
        for m, req in ((v.P, preq), (v.C, creq)):
            m.on_new_request(req)
            m.on_request_finished(req)
        with pytest.raises(UnknownRequest, match=r"'p' already finished \(on_request_finished\): submit a request's "
                                                 "jobs before finishing it"):
            v.P.submit_store(job(1, [b"k"], [0], preq))
        with pytest.raises(UnknownRequest, match="'p' already finished"):
            v.P.hand_over_store(2, preq, (b"k",), [0])
        with pytest.raises(UnknownRequest, match="'c' already finished"):
            v.C.submit_load(job(3, [b"k"], [0], creq))
        with pytest.raises(UnknownRequest, match="'q' was never announced"):
            v.P.submit_store(job(4, [b"k"], [0], producer_req("q", "B")))
        v.P.on_new_request(preq)  # the same request id announced again is a request like any other
        v.P.submit_store(job(5, [b"k"], [0], preq))
        assert v.P.is_outstanding(5)
        for i in range(4096):  # only the last 4096 finished requests are remembered: 'c' is forgotten
            v.C.on_request_finished(RequestContext(req_id=f"other-{i}"))
        with pytest.raises(UnknownRequest, match="'c' was never announced"):
            v.C.submit_load(job(6, [b"k"], [0], creq))
        with pytest.raises(UnknownRequest, match="'other-0' already finished"):
            v.C.submit_load(job(7, [b"k"], [0], RequestContext(req_id="other-0")))
    finally:
        v.close()
