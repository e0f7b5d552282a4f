"""Lookups of consumer ids answer from what the I/O loop published (decision C19); the failed
loads there are kept up to date per id, not by looking at every id in use again (decision C25).
These tests pin what that must not change: a failed load's id answers MISS (decision L11) while
every other id in use keeps answering HIT, and an id reused by a new request once the core forgot
its failed load answers HIT again (never a stale MISS)."""

from __future__ import annotations

import pytest
from mgr_helpers import job, keys_for
from virtual_helpers import BB, SCEN, outcome, store

from kvtier.api import LookupResult

pytestmark = pytest.mark.timeout(60)


def _tombstone(v, kv: str, job_id: int) -> None:
    """Park ``kv`` and let the consumer reject it before fetching: the producer tombstones it."""
    store(v, kv, job_id, [0], seed=job_id)
    r = v.creq("c-pre-" + kv, kv)
    v.C.on_new_request(r)
    v.step()
    v.C.on_request_finished(r)
    v.step()
    assert v.P.core.producer_state(kv).value == "tombstoned"


def test_only_the_failed_id_misses_and_a_reused_id_hits_again(pairs):
    v = pairs(SCEN, block_bytes=BB)
    C = v.C
    _tombstone(v, "A", 1)
    v.advance_to(1.0)
    others = [v.creq(f"c-{kv}", kv) for kv in ("B", "C", "D")]
    for r in others:
        C.on_new_request(r)
    ra = v.creq("c-A", "A")
    C.on_new_request(ra)
    v.step()
    assert C.lookup(keys_for("A", 1)[0], ra) is LookupResult.HIT  # nothing failed yet
    C.submit_load(job(10, keys_for("A", 1), [1], ra))  # refused: the producer tombstoned it
    v.step()
    assert outcome(v.cjobs, 10) == (False, "aborted")
    assert C.lookup(keys_for("A", 1)[0], ra) is LookupResult.MISS  # the engine recomputes (L11)
    for r, kv in zip(others, ("B", "C", "D")):
        assert C.lookup(keys_for(kv, 1)[0], r) is LookupResult.HIT
    C.on_request_finished(ra)
    v.advance_to(2.0)
    v.step()
    assert C.core.consumer_state("A").value == "absent"  # the core forgot the failed load
    again = v.creq("c-A-again", "A")
    C.on_new_request(again)  # a new request reuses the id
    v.step()
    assert C.lookup(keys_for("A", 1)[0], again) is LookupResult.HIT
    C.submit_load(job(11, keys_for("A", 1), [2], again))
    v.step()
    assert outcome(v.cjobs, 11) == (False, "aborted")
    assert C.lookup(keys_for("A", 1)[0], again) is LookupResult.MISS


def test_once_an_id_was_loaded_the_keys_its_load_did_not_name_miss(pairs):
    """An id is fetched once (decision L8): the producer releases every block with the fetch. So once
    a load of the id was submitted, a key it did not name answers MISS (the engine recomputes it:
    an engine whose primary tier had room for only part of the prompt loaded the rest again, the
    load failed ``one_fetch_per_id`` and the lookups said HIT for ever); the keys it named answer
    HIT while it is out, and MISS once it loaded (an engine that evicted them, e.g. a preempted
    request resumed, recomputes them instead of a load that must fail); after a second load
    (refused) every key answers MISS."""
    v = pairs(SCEN, block_bytes=BB)
    C = v.C
    keys = keys_for("A", 3)
    store(v, "A", 1, [0, 1, 2], seed=1)
    ra = v.creq("c-A", "A")
    C.on_new_request(ra)
    v.step()
    assert [C.lookup(k, ra) for k in keys] == [LookupResult.HIT] * 3
    C.submit_load(job(10, keys[:2], [1, 2], ra))  # room for two
    assert [C.lookup(k, ra) for k in keys] == [LookupResult.HIT, LookupResult.HIT, LookupResult.MISS]
    v.step()
    assert outcome(v.cjobs, 10) == (True, None)
    assert [C.lookup(k, ra) for k in keys] == [LookupResult.MISS] * 3  # loaded: nothing more to fetch
    C.submit_load(job(11, keys[1:], [3, 4], ra))  # loaded again all the same: refused at once
    v.step()
    assert outcome(v.cjobs, 11) == (False, "one_fetch_per_id")
    assert [C.lookup(k, ra) for k in keys] == [LookupResult.MISS] * 3
    C.on_request_finished(ra)


def test_a_failed_result_the_engine_took_is_never_followed_by_a_hit(make_manager, monkeypatch):
    """The loop on its own thread queues a failed load's result during a pass and publishes its
    answers at the pass's end: the engine may take the result in between.  Its lookups must answer
    MISS from the moment the result can be taken, or the engine loads the id again (L8, L11).  The
    pass's publishing is held here until the engine has looked up, to open that window wide."""
    import threading

    from mgr_helpers import consumer_req, producer_req, pump_until

    from kvtier.shell.published import Published

    held, release = threading.Event(), threading.Event()
    update = Published.update

    def slow_update(self, loop):  # the consumer's loop thread, once its result is queued
        if threading.current_thread() is not threading.main_thread() and loop.jobs.ready and not release.is_set():
            held.set()
            release.wait(10)
        update(self, loop)

    monkeypatch.setattr(Published, "update", slow_update)
    p = make_manager({"unbound_store_timeout_s": 0.05})
    c = make_manager({"background_poll": True})
    try:
        req = producer_req("p-late", "kv-late")
        p.on_new_request(req)
        keys = keys_for("kv-late", 1)
        p.submit_store(job(1, keys, [0], req))
        assert pump_until(lambda: any(r.job_id == 1 for r in p.get_finished_jobs()), managers=[p])  # reaped
        creq = consumer_req("d-late", "kv-late", "127.0.0.1", p.port)
        c.on_new_request(creq)
        c.submit_load(job(11, keys, [1], creq))
        assert pump_until(held.is_set, managers=[p])
        [r] = c.get_finished_jobs(poll=False)
        assert (r.job_id, r.success) == (11, False), r
        assert c.lookup(keys[0], creq) is LookupResult.MISS  # before the pass published
    finally:
        release.set()
