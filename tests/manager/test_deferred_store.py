"""A producer's store that no fetch awaits costs the engine's thread no wake-up (decision C34).

With the loop on its own thread, ``submit_store``, ``hand_over_store``, a producer request's naming
and its finish only queue their command unless a peer's fetch already awaits the id; the loop
takes them on its next pass — the next message or deadline, a ``get_finished_jobs`` call, at the
latest ``MAX_WAIT_S``.  What must not happen: a fetch that awaits the id waiting for any of those
(the store would be late by up to ``MAX_WAIT_S``), or a store lost between the engine's check and
the loop's sleep.  ``MAX_WAIT_S`` and the heartbeat are stretched here so that only the rule under
test can wake the loop in time.
"""

from __future__ import annotations

import threading
import time

import pytest

import kvtier.shell.loop as loop_module
from kvtier.lifecycle import ProducerState
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from tests.manager.mgr_helpers import (Jobs, asleep, consumer_req, digests, fill_pattern, job, keys_for, producer_req,
                                      pump_until)

#: No pass in these tests may come from the loop's longest wait or a heartbeat.
_QUIET = {"host": "127.0.0.1", "port": 0, "background_poll": True, "heartbeat_interval_s": 600.0,
          "peer_timeout_s": 1800.0, "fetch_supply_timeout_s": 600.0, "load_timeout_s": 1200.0}


@pytest.fixture
def quiet_loops(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(loop_module, "MAX_WAIT_S", 60.0)
    made: list[KvTierManager] = []

    def make(blocks: int = 64) -> KvTierManager:
        m = KvTierManager(_QUIET, BlockPool(blocks, 256, pin=False))
        made.append(m)
        return m

    yield make
    for m in made:
        m.shutdown()


def _state(m: KvTierManager, kid: str) -> ProducerState:
    with m.lock:
        return m.core.producer_state(kid)


def test_a_store_no_fetch_awaits_waits_for_the_next_pass(quiet_loops) -> None:
    p = quiet_loops()
    asleep(p)
    req = producer_req("p", "A")
    p.on_new_request(req)
    p.submit_store(job(1, keys_for("A", 2), [0, 1], req))
    p.on_request_finished(req)
    time.sleep(0.3)
    assert _state(p, "A") is ProducerState.ABSENT, "the store woke the loop: no fetch awaits it"
    assert p.has_pending_work(), "a queued store is pending work"
    assert p.get_finished_jobs() == []  # wakes the loop: the store is queued
    assert pump_until(lambda: _state(p, "A") is ProducerState.PARKED, timeout_s=10.0)


def test_a_deferred_store_is_applied_within_the_longest_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing calls ``get_finished_jobs``: the loop's longest wait still bounds the store's wait."""
    monkeypatch.setattr(loop_module, "MAX_WAIT_S", 0.5)
    p = KvTierManager(_QUIET, BlockPool(8, 256, pin=False))
    try:
        asleep(p)
        req = producer_req("p", "B")
        p.on_new_request(req)
        p.hand_over_store(1, req, tuple(keys_for("B", 1)), [0])
        start = time.monotonic()
        assert pump_until(lambda: _state(p, "B") is ProducerState.PARKED, timeout_s=10.0)
        assert time.monotonic() - start < 5.0
    finally:
        p.shutdown()


@pytest.mark.parametrize("how", ["submit_store", "hand_over_store"])
def test_a_store_a_fetch_awaits_wakes_the_loop_at_once(quiet_loops, how: str) -> None:
    """The consumer's fetch arrives first (the producer's record awaits its blocks); then the
    store and the finish.  Nothing else wakes the producer's loop for a minute, and nobody calls
    its ``get_finished_jobs``: the load succeeds only because the store woke it."""
    p, c = quiet_loops(), quiet_loops()
    cjobs = Jobs(c)
    creq = consumer_req("c", "K", p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys_for("K", 3), [4, 5, 6], creq))
    assert pump_until(lambda: _state(p, "K") is ProducerState.AWAITING, timeout_s=10.0)
    asleep(p)
    req = producer_req("p", "K")
    p.on_new_request(req)
    want = fill_pattern(p.pool, [0, 1, 2], seed=3)
    if how == "submit_store":
        p.submit_store(job(1, keys_for("K", 3), [0, 1, 2], req))
    else:
        p.hand_over_store(1, req, tuple(keys_for("K", 3)), [0, 1, 2])
    p.on_request_finished(req)
    assert pump_until(lambda: cjobs.pump() or cjobs.has(2), timeout_s=20.0), \
        "the awaited store did not wake the producer"
    assert cjobs.one(2).success and digests(c.pool, [4, 5, 6]) == want


def test_stores_racing_their_fetches_are_never_lost(quiet_loops) -> None:
    """Fetches and stores of the same ids at once, from two threads, in whatever interleavings the
    scheduler makes: every load ends (a store whose fetch awaits it and that woke nothing would
    wait a minute).  It shows the wake happens; the order of the engine's append and its check
    (C34) is argued in the decision, not caught here."""
    p, c = quiet_loops(), quiet_loops()
    pjobs, cjobs = Jobs(p), Jobs(c)
    n = 24
    reqs = [producer_req(f"p{i}", f"R{i}") for i in range(n)]
    for i, r in enumerate(reqs):
        p.on_new_request(r)
    go = threading.Barrier(2)

    def store() -> None:
        go.wait()
        for i, r in enumerate(reqs):
            p.submit_store(job(100 + i, keys_for(f"R{i}", 1), [i], r))
            p.on_request_finished(r)
            time.sleep(0.0005 * (i % 3))

    t = threading.Thread(target=store)
    t.start()
    go.wait()
    for i in range(n):
        creq = consumer_req(f"c{i}", f"R{i}", p.host, p.port)
        c.on_new_request(creq)
        c.submit_load(job(200 + i, keys_for(f"R{i}", 1), [32 + i], creq))
        time.sleep(0.0005 * (i % 2))
    t.join()
    assert pump_until(lambda: cjobs.pump() or all(cjobs.has(200 + i) for i in range(n)), timeout_s=30.0), \
        f"loads without a result: {[i for i in range(n) if not cjobs.has(200 + i)]}"
    assert all(cjobs.one(200 + i).success for i in range(n))
    assert pump_until(lambda: pjobs.pump() or all(pjobs.has(100 + i) for i in range(n)), timeout_s=30.0)


def test_a_threaded_poll_takes_what_is_queued(quiet_loops) -> None:
    """``poll(timeout)`` on a threaded manager waits for a pass that takes the queued store."""
    p = quiet_loops()
    asleep(p)
    req = producer_req("p", "Q")
    p.on_new_request(req)
    p.submit_store(job(1, keys_for("Q", 1), [0], req))
    assert pump_until(lambda: p.poll(0.5) or _state(p, "Q") is ProducerState.PARKED, timeout_s=10.0)


def test_a_local_only_store_is_answered_without_waiting_for_a_poll(quiet_loops) -> None:
    """No fetch can want a local-only store, but the engine waits for its result to free the rows:
    it wakes the loop, and the first ``get_finished_jobs`` after that pass hands it over."""
    from kvtier.api import RequestContext

    p = quiet_loops()
    asleep(p)
    before = p.passes
    req = RequestContext(req_id="local", kv_transfer_params=None)
    p.on_new_request(req)
    p.hand_over_store(1, req, (b"k0",), [0])
    assert pump_until(lambda: p.passes > before, timeout_s=10.0), "the loop was not woken for a local-only store"
    assert pump_until(lambda: [r.job_id for r in p.get_finished_jobs()] == [1], timeout_s=10.0)


@pytest.mark.parametrize("how", ["submit_store", "hand_over_store"])
def test_a_store_whose_digests_go_to_the_pool_wakes_the_loop_at_once(monkeypatch, how: str) -> None:
    """A large store's digests take milliseconds on the pool: they start at once, so a fetch that
    comes soon after does not wait for all of them (only stores hashed inline are deferred)."""
    monkeypatch.setattr(loop_module, "MAX_WAIT_S", 60.0)
    p = KvTierManager(_QUIET, BlockPool(4, 256 * 1024, pin=False))
    try:
        asleep(p)
        before = p.passes
        req = producer_req("p", "L")
        p.on_new_request(req)
        if how == "submit_store":
            p.submit_store(job(1, keys_for("L", 2), [0, 1], req))
        else:
            p.hand_over_store(1, req, tuple(keys_for("L", 2)), [0, 1])
        assert pump_until(lambda: p.passes > before, timeout_s=10.0), "a pooled store waited for the loop's next pass"
        assert pump_until(lambda: _state(p, "L") is ProducerState.PARKED, timeout_s=10.0)
    finally:
        p.shutdown()
