"""The real manager pair on an in-memory network, driven by a virtual clock (no sockets, no
sleeps): the producer's park clock -- a late fetch refused in one round trip, reap and prune, a
store after the reap, a fetch for blocks never stored, empty and partial fetches, fetches that
wait in the socket during a stall.  Expected values come from
docs/scenarios.md (B01, B02, B03, B12, B16, B20, B24, B29) with its
parameters (T_park = 60 s, T_tomb = 60 s, T_load = 30 s) unless a test says otherwise.
"""

from __future__ import annotations

import time

import pytest

from kvtier.api import LookupResult
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.testing.inproc import InprocNetwork, InprocTransport
from mgr_helpers import (
    VirtualPair,
    block_pattern,
    digests,
    fill_pattern,
    job,
    keys_for,
    metric,
    metric_sum,
    pattern_digest,
    producer_req,
    sentinel_digest,
)
from virtual_helpers import BB, SCEN, no_refs, outcome, store
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)


# -- B01 -----------------------------------------------------------------------------------------


def test_b01_late_fetch_refused_in_one_rtt_with_zero_data(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.advance_to(59.75)
    assert not v.pjobs.has(1) and P.core.producer_state("A").value == "parked"
    v.advance_to(60.0)
    assert outcome(v.pjobs, 1) == (False, "reaped")
    assert P.core.producer_state("A").value == "tombstoned"

    v.advance_to(61.0)  # B reuses the 4 slots A's store job released
    _, dig_b = store(v, "B", 2, [0, 1, 2, 3], seed=2)

    v.advance_to(62.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 4), [4, 5, 6, 7], ca))
    v.step()  # one round trip, no time passes
    assert v.now == 62.0
    assert outcome(v.cjobs, 10) == (False, "reaped")
    assert C.lookup(keys_for("A", 1)[0], ca) is LookupResult.MISS
    assert metric(P, "kvtier_block_sent_bytes_total") == 0
    assert metric(C, "kvtier_block_landed_bytes_total") == 0
    assert metric(P, "kvtier_fetches_refused_total", reason="reaped") == 1
    assert digests(C.pool, [4, 5, 6, 7]) == [sentinel_digest(BB)] * 4
    assert digests(P.pool, [0, 1, 2, 3]) == dig_b  # B's blocks untouched
    assert not v.pjobs.has(2)

    v.advance_to(119.75)
    assert P.core.producer_state("A").value == "tombstoned"
    v.advance_to(120.0)
    assert P.core.producer_state("A").value == "absent"  # pruned
    no_refs(P, "A")

    # t=125: a fetch(A) is now an unknown id: it waits for blocks (B15), never gets data
    C.on_request_finished(ca)
    v.advance_to(125.0)
    ca2 = v.creq("c-A2", "A")
    C.on_new_request(ca2)
    C.submit_load(job(11, keys_for("A", 4), [4, 5, 6, 7], ca2))
    v.step()
    assert P.core.producer_state("A").value == "awaiting"
    v.advance_to(134.75)
    assert not v.cjobs.has(11)
    v.advance_to(135.0)  # fetch_supply_timeout_s = 10
    assert outcome(v.cjobs, 11) == (False, "supply_timeout")
    assert metric(P, "kvtier_block_sent_bytes_total") == 0
    assert digests(C.pool, [4, 5, 6, 7]) == [sentinel_digest(BB)] * 4
    assert outcome(v.pjobs, 2) == (False, "reaped")  # B, parked at 61, reaped at 121


# -- B02 -----------------------------------------------------------------------------------------

CHUNK_TIMES = [float(t) for t in range(11)] + [13.0]  # 12 chunks, the last at t=13


def _chunked_prefill(v: VirtualPair):
    req = producer_req("p-A", "A")
    v.P.on_new_request(req)
    keys = keys_for("A", 12)
    dig = []
    for i, t in enumerate(CHUNK_TIMES):
        v.advance_to(t)
        pool = v.P.pool
        pool.write(i, block_pattern(7, i, BB))
        dig.append(pattern_digest(7, i, BB))
        v.P.submit_store(job(100 + i, [keys[i]], [i], req))
    v.advance_to(20.0)  # the consumer admits the request; it waits in its queue
    creq = v.creq("c-A", "A")
    v.C.on_new_request(creq)
    return keys, dig, creq


def test_b02_first_store_park_clock_reaps_from_first_chunk(pairs):
    v = pairs({**SCEN, "park_clock": "first_store"}, block_bytes=BB)
    keys, _, creq = _chunked_prefill(v)
    v.advance_to(59.75)
    assert not any(v.pjobs.has(100 + i) for i in range(12))
    v.advance_to(60.0)
    assert [outcome(v.pjobs, 100 + i) for i in range(12)] == [(False, "reaped")] * 12
    v.advance_to(65.0)
    v.C.submit_load(job(1, keys, list(range(12)), creq))
    v.step()
    assert v.now == 65.0
    assert outcome(v.cjobs, 1) == (False, "reaped")  # at t=65, not t=95
    assert metric(v.P, "kvtier_block_sent_bytes_total") == 0


def test_b02_long_park_timeout_serves_the_late_fetch(pairs):
    v = pairs({**SCEN, "unbound_store_timeout_s": 180.0, "park_clock": "first_store"}, block_bytes=BB)
    keys, dig, creq = _chunked_prefill(v)
    v.advance_to(65.0)
    assert not any(v.pjobs.has(100 + i) for i in range(12))
    v.C.submit_load(job(1, keys, list(range(12)), creq))
    v.step()
    assert outcome(v.cjobs, 1) == (True, None)
    assert digests(v.C.pool, range(12)) == dig
    assert [outcome(v.pjobs, 100 + i) for i in range(12)] == [(True, None)] * 12  # all 12 released


def test_b02_default_last_store_park_clock_counts_from_the_last_chunk(pairs):
    v = pairs(SCEN, block_bytes=BB)  # park_clock defaults to last_store
    _chunked_prefill(v)
    v.advance_to(72.75)
    assert not any(v.pjobs.has(100 + i) for i in range(12))
    v.advance_to(73.0)  # 13 + 60
    assert [outcome(v.pjobs, 100 + i) for i in range(12)] == [(False, "reaped")] * 12


# -- B03 -----------------------------------------------------------------------------------------


def test_b03_store_after_reap_fails_at_once_and_never_reparks(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P = v.P
    req, _ = store(v, "A", 1, [0], seed=1, keys=[b"b1"])
    v.advance_to(60.0)
    assert outcome(v.pjobs, 1) == (False, "reaped")
    v.advance_to(61.0)
    fill_pattern(P.pool, [1], seed=2)
    P.submit_store(job(2, [b"b2"], [1], req))  # a late chunk of the same prefill
    assert not P.jobs_in_flight() and P.outstanding_jobs() == {2}  # answered in the call, not collected
    v.step()
    assert outcome(v.pjobs, 2) == (False, "reaped")
    rec = CoreView(P.core).producer("A")
    assert rec.state.value == "tombstoned" and rec.parked == () and not rec.jobs
    assert not P.outstanding_jobs()  # nothing pinned for A

    v.advance_to(62.0)
    ca = v.creq("c-A", "A")
    v.C.on_new_request(ca)
    v.C.submit_load(job(10, [b"b1", b"b2"], [0, 1], ca))
    v.step()
    assert outcome(v.cjobs, 10) == (False, "reaped")
    v.advance_to(119.75)
    assert P.core.producer_state("A").value == "tombstoned"
    v.advance_to(120.0)  # retention counted from the reap, not extended by the store at 61
    assert P.core.producer_state("A").value == "absent"
    no_refs(P, "A")
    assert metric(P, "kvtier_block_sent_bytes_total") == 0


# -- B16 -----------------------------------------------------------------------------------------


def test_b16_consumer_never_shows_up_reap_then_prune_leaves_no_trace(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P = v.P
    store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.advance_to(59.75)
    assert not v.pjobs.has(1)
    v.advance_to(60.0)
    assert outcome(v.pjobs, 1) == (False, "reaped")
    assert P.core.producer_state("A").value == "tombstoned"
    v.advance_to(120.0)
    no_refs(P, "A")
    assert metric_sum(P, "kvtier_parked_ids") == 0 and metric_sum(P, "kvtier_retained_ids") == 0


def test_b16_reaper_runs_without_any_engine_call():
    """Real clock, background_poll: nothing calls the manager, yet the parked id is reaped
    and pruned by its own poll thread."""
    net = InprocNetwork()
    m = KvTierManager(
        {"unbound_store_timeout_s": 0.2, "tombstone_retention_s": 0.2, "background_poll": True,
         "poll_interval_s": 0.005},
        BlockPool(4, BB, pin=False),
        transport=InprocTransport(net, "prod:9"),
    )
    try:
        req = producer_req("p", "A")
        m.on_new_request(req)
        m.submit_store(job(1, [b"a"], [0], req))
        end = time.monotonic() + 8.0
        while time.monotonic() < end:
            with m.lock:
                gone = CoreView(m.core).producer("A") is None and not m.jobs_in_flight()
            if gone:
                break
            time.sleep(0.02)
        assert gone, "the poll thread never reaped and pruned the parked id"
        assert [(r.job_id, r.success, r.reason) for r in m.get_finished_jobs()] == [(1, False, "reaped")]
    finally:
        m.shutdown()


def test_b12_fetch_for_missing_blocks_after_the_prefill_finished_is_refused_in_one_rtt(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    preq, _ = store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.advance_to(0.5)
    P.on_request_finished(preq)  # every store of the prefill was submitted
    v.advance_to(2.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 5), [0, 1, 2, 3, 4], ca))  # A#4 was never stored
    v.step()
    assert outcome(v.cjobs, 10) == (False, "incomplete")
    assert outcome(v.pjobs, 1) == (False, "incomplete")  # A's blocks released at once
    assert P.core.producer_state("A").value == "tombstoned"
    assert metric(P, "kvtier_block_sent_bytes_total") == 0


def test_b12_fetch_for_missing_blocks_is_answered_by_supply_timeout_not_t_load(pairs):
    """While the prefill may still store more blocks (its request not finished), a fetch for a
    block not stored yet waits at most fetch_supply_timeout_s, then gets a definitive failure
    from the producer -- well before the consumer's T_load."""
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.advance_to(2.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 5), [0, 1, 2, 3, 4], ca))
    v.step()
    assert P.core.producer_state("A").value == "awaiting"
    v.advance_to(12.0)
    assert outcome(v.cjobs, 10) == (False, "supply_timeout")
    assert outcome(v.pjobs, 1) == (False, "supply_timeout")  # A's blocks released
    assert metric(P, "kvtier_block_sent_bytes_total") == 0


def test_b20_zero_block_store_and_load_complete_at_once(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    preq = producer_req("p-A", "A")
    P.on_new_request(preq)
    P.submit_store(job(1, [], [], preq))
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, [], [], ca))
    v.step()
    assert outcome(v.pjobs, 1) == (True, None)
    assert outcome(v.cjobs, 10) == (True, None)
    # nothing pinned; the empty fetch is a terminal request (done, not_needed), retained so that
    # a store that follows it succeeds at once instead of parking until the reap
    view = CoreView(P.core).producer("A")
    assert (view.state.value, view.reason, view.parked, view.jobs) == ("done", "not_needed", (), ())
    assert metric(P, "kvtier_block_sent_bytes_total") == 0



@pytest.mark.parametrize("empty_store", [True, False])
def test_b20_an_empty_load_succeeds_after_the_producer_finished_with_nothing(pairs, empty_store):
    """Decision I29: the producer's request finished with nothing parked (an empty store, or none)
    before the consumer's empty fetch arrived, so it is refused ``nothing_stored``; the load
    needed no block, so it succeeds all the same — nothing is sent, no slot is touched."""
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    preq = producer_req("p-A", "A")
    P.on_new_request(preq)
    if empty_store:
        P.submit_store(job(1, [], [], preq))
        v.step()
    P.on_request_finished(preq)
    v.step()
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, [], [], ca))
    v.step()
    assert outcome(v.cjobs, 10) == (True, None)
    if empty_store:
        assert outcome(v.pjobs, 1) == (True, None)
    assert metric(P, "kvtier_fetches_refused_total", reason="nothing_stored") == 1
    assert metric(P, "kvtier_block_sent_bytes_total") == 0

def test_b29_fetching_a_subset_releases_every_parked_block(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    keys = keys_for("A", 10)
    preq = producer_req("p-A", "A")
    P.on_new_request(preq)
    fill_pattern(P.pool, range(10), seed=4)
    P.submit_store(job(1, keys[:5], list(range(5)), preq))
    P.submit_store(job(2, keys[5:], list(range(5, 10)), preq))
    v.advance_to(1.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys[1:7], list(range(6)), ca))  # the rest is cached on the consumer
    v.step()
    assert outcome(v.cjobs, 10) == (True, None)
    assert digests(C.pool, range(6)) == [pattern_digest(4, i, BB) for i in range(1, 7)]
    assert outcome(v.pjobs, 1) == (True, None) and outcome(v.pjobs, 2) == (True, None)
    assert not P.jobs_in_flight() and CoreView(P.core).producer("A").parked == ()
    assert metric(P, "kvtier_block_sent_bytes_total") == 6 * BB


@pytest.mark.parametrize("n", [3, 300])
def test_b24_fetches_waiting_in_the_socket_beat_the_reap_after_a_stall(pairs, n):
    """B24: the producer's loop stalls from 50 s to 70 s while the consumer's fetches for ``n``
    parked ids (reap at 60 s) arrive at 55 s.  On the first poll after the stall the fetches are
    applied before any deadline fires: every id is served, none reaped, and the consumer is not
    declared dead because of the producer's own stall.  300 fetches are more than one read
    batch (RECV_BATCH), so the emptiness rule, not the order within one batch, is what holds."""
    v = pairs({**SCEN, "peer_timeout_s": 120.0}, {**SCEN, "peer_timeout_s": 120.0}, block_bytes=BB, num_blocks=2 * n)
    P, C = v.P, v.C
    for i in range(n):
        store(v, f"id{i}", 1 + i, [i], seed=i)
    reqs = []
    for i in range(n):
        r = v.creq(f"c-{i}", f"id{i}")
        C.on_new_request(r)
        reqs.append(r)
    v.step()
    v.advance_to(50.0)
    v.frozen.add("P")
    v.advance_to(55.0)
    for i, r in enumerate(reqs):
        C.submit_load(job(10_000 + i, keys_for(f"id{i}", 1), [n + i], r))
    v.advance_to(70.0)  # the producer polls nothing meanwhile: its reap deadlines (60 s) pass
    assert P.core.producer_state("id0").value == "parked"
    v.frozen.discard("P")
    v.step()
    assert metric(P, "kvtier_jobs_total", kind="store", outcome="fail", reason="reaped") == 0
    assert all(outcome(v.cjobs, 10_000 + i) == (True, None) for i in range(n))
    assert all(outcome(v.pjobs, 1 + i) == (True, None) for i in range(n))
    assert metric(P, "kvtier_session_ends_total", reason="peer_timeout") == 0
