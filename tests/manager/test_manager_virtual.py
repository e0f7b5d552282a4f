"""The real manager pair on an in-memory network, driven by a virtual clock: deterministic, no
sockets, no sleeps.  Expected values come from /work/shared/reference/bug-scenarios.md (B01,
B02, B03, B05, B09, B10, B16, B17), using the scenario parameters (T_park = 60 s, T_tomb = 60 s,
T_load = 30 s) unless a test says otherwise.
"""

from __future__ import annotations

import time

import msgspec
import pytest

from kvtier.api import LookupResult, UnknownRequest
from kvtier.lifecycle.errors import InvalidTransition
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.testing.inproc import InprocNetwork, InprocTransport
from kvtier.transport import SendFailure, SendHandle
from kvtier.wire import messages as wm
from kvtier.wire.codec import encode_frames
from mgr_helpers import (
    Jobs,
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

pytestmark = pytest.mark.timeout(60)

SCEN = {"unbound_store_timeout_s": 60.0, "tombstone_retention_s": 60.0}
BB = 64


@pytest.fixture
def pairs():
    made: list[VirtualPair] = []

    def _make(*a, **kw) -> VirtualPair:
        v = VirtualPair(*a, **kw)
        made.append(v)
        return v

    try:
        yield _make
    finally:
        for v in made:
            v.close()


def _outcome(jobs: Jobs, job_id: int) -> tuple[bool, str | None]:
    r = jobs.one(job_id)
    return r.success, r.reason


def _store(v: VirtualPair, kv: str, job_id: int, slots, seed: int, *, keys=None, req_id=None):
    req = producer_req(req_id or f"p-{kv}", kv)
    v.P.on_new_request(req)
    d = fill_pattern(v.P.pool, slots, seed)
    v.P.submit_store(job(job_id, keys or keys_for(kv, len(slots)), slots, req))
    return req, d


def _no_refs(m: KvTierManager, kv: str) -> None:
    assert not m.core.tracks(kv)
    assert not m.jobs_in_flight(kv)


# -- B01 -----------------------------------------------------------------------------------------


def test_b01_late_fetch_refused_in_one_rtt_with_zero_data(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    _store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.advance_to(59.75)
    assert not v.pjobs.has(1) and P.core.producer_state("A").value == "parked"
    v.advance_to(60.0)
    assert _outcome(v.pjobs, 1) == (False, "reaped")
    assert P.core.producer_state("A").value == "tombstoned"

    v.advance_to(61.0)  # B reuses the 4 slots A's store job released
    _, dig_b = _store(v, "B", 2, [0, 1, 2, 3], seed=2)

    v.advance_to(62.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 4), [4, 5, 6, 7], ca))
    v.step()  # one round trip, no time passes
    assert v.now == 62.0
    assert _outcome(v.cjobs, 10) == (False, "reaped")
    assert C.lookup(keys_for("A", 1)[0], ca) is LookupResult.MISS
    assert metric(P, "kvtier_block_bytes_sent_total") == 0
    assert metric(C, "kvtier_block_bytes_landed_total") == 0
    assert metric(P, "kvtier_fetches_refused_total", reason="reaped") == 1
    assert digests(C.pool, [4, 5, 6, 7]) == [sentinel_digest(BB)] * 4
    assert digests(P.pool, [0, 1, 2, 3]) == dig_b  # B's blocks untouched
    assert not v.pjobs.has(2)

    v.advance_to(119.75)
    assert P.core.producer_state("A").value == "tombstoned"
    v.advance_to(120.0)
    assert P.core.producer_state("A").value == "absent"  # pruned
    _no_refs(P, "A")

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
    assert _outcome(v.cjobs, 11) == (False, "supply_timeout")
    assert metric(P, "kvtier_block_bytes_sent_total") == 0
    assert digests(C.pool, [4, 5, 6, 7]) == [sentinel_digest(BB)] * 4
    assert _outcome(v.pjobs, 2) == (False, "reaped")  # B, parked at 61, reaped at 121


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
    assert [_outcome(v.pjobs, 100 + i) for i in range(12)] == [(False, "reaped")] * 12
    v.advance_to(65.0)
    v.C.submit_load(job(1, keys, list(range(12)), creq))
    v.step()
    assert v.now == 65.0
    assert _outcome(v.cjobs, 1) == (False, "reaped")  # at t=65, not t=95
    assert metric(v.P, "kvtier_block_bytes_sent_total") == 0


def test_b02_long_park_timeout_serves_the_late_fetch(pairs):
    v = pairs({**SCEN, "unbound_store_timeout_s": 180.0, "park_clock": "first_store"}, block_bytes=BB)
    keys, dig, creq = _chunked_prefill(v)
    v.advance_to(65.0)
    assert not any(v.pjobs.has(100 + i) for i in range(12))
    v.C.submit_load(job(1, keys, list(range(12)), creq))
    v.step()
    assert _outcome(v.cjobs, 1) == (True, None)
    assert digests(v.C.pool, range(12)) == dig
    assert [_outcome(v.pjobs, 100 + i) for i in range(12)] == [(True, None)] * 12  # all 12 released


def test_b02_default_last_store_park_clock_counts_from_the_last_chunk(pairs):
    v = pairs(SCEN, block_bytes=BB)  # park_clock defaults to last_store
    _chunked_prefill(v)
    v.advance_to(72.75)
    assert not any(v.pjobs.has(100 + i) for i in range(12))
    v.advance_to(73.0)  # 13 + 60
    assert [_outcome(v.pjobs, 100 + i) for i in range(12)] == [(False, "reaped")] * 12


# -- B03 -----------------------------------------------------------------------------------------


def test_b03_store_after_reap_fails_at_once_and_never_reparks(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P = v.P
    req, _ = _store(v, "A", 1, [0], seed=1, keys=[b"b1"])
    v.advance_to(60.0)
    assert _outcome(v.pjobs, 1) == (False, "reaped")
    v.advance_to(61.0)
    fill_pattern(P.pool, [1], seed=2)
    P.submit_store(job(2, [b"b2"], [1], req))  # a late chunk of the same prefill
    assert not P.jobs_in_flight() and P.outstanding_jobs() == {2}  # answered in the call, not collected
    v.step()
    assert _outcome(v.pjobs, 2) == (False, "reaped")
    rec = P.core.producer("A")
    assert rec.state.value == "tombstoned" and rec.parked == () and not rec.jobs
    assert not P.outstanding_jobs()  # nothing pinned for A

    v.advance_to(62.0)
    ca = v.creq("c-A", "A")
    v.C.on_new_request(ca)
    v.C.submit_load(job(10, [b"b1", b"b2"], [0, 1], ca))
    v.step()
    assert _outcome(v.cjobs, 10) == (False, "reaped")
    v.advance_to(119.75)
    assert P.core.producer_state("A").value == "tombstoned"
    v.advance_to(120.0)  # retention counted from the reap, not extended by the store at 61
    assert P.core.producer_state("A").value == "absent"
    _no_refs(P, "A")
    assert metric(P, "kvtier_block_bytes_sent_total") == 0


# -- B05 -----------------------------------------------------------------------------------------


def test_b05_consumer_rejects_before_fetching_producer_frees_blocks_in_one_rtt(pairs):
    v = pairs(SCEN, block_bytes=BB)
    _store(v, "A", 1, [0, 1, 2, 3], seed=1)
    ca = v.creq("c-A", "A")
    v.C.on_new_request(ca)  # the decode side knows the request (and dials the producer)
    v.step()
    v.advance_to(1.0)
    v.C.on_request_finished(ca)  # rejected before it was ever scheduled: no load, no fetch
    v.step()
    assert v.P.core.producer_state("A").value == "tombstoned"
    assert _outcome(v.pjobs, 1) == (False, "aborted")


def test_b05_cancel_during_load_before_store_tombstones_and_refuses_the_later_store(pairs):
    """Ordering variant: the abort reaches the producer before the first store (the load was
    in flight and the engine dropped the request)."""
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 4), [0, 1, 2, 3], ca))
    v.step()
    assert P.core.producer_state("A").value == "awaiting"
    v.advance_to(1.0)
    C.on_request_finished(ca)
    v.step()
    assert _outcome(v.cjobs, 10) == (False, "cancelled")
    assert P.core.producer_state("A").value == "tombstoned"
    assert P.core.producer("A").reason == "aborted"
    v.advance_to(2.0)
    _store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.step()
    assert _outcome(v.pjobs, 1) == (False, "aborted")
    # a later fetch for A is refused at once as well
    v.advance_to(3.0)
    ca2 = v.creq("c-A2", "A")
    C.on_new_request(ca2)
    C.submit_load(job(11, keys_for("A", 4), [4, 5, 6, 7], ca2))
    v.step()
    assert _outcome(v.cjobs, 11) == (False, "aborted")
    assert metric(P, "kvtier_block_bytes_sent_total") == 0


# -- B09 and liveness ----------------------------------------------------------------------------


def test_b09_silent_producer_all_loads_fail_once_by_peer_timeout(pairs):
    """Default peer_timeout_s (5 s): the producer loses power at t=0.5 (no RST, no Done); the
    session's liveness deadline fails every load on that peer, long before T_load."""
    v = pairs(SCEN, block_bytes=BB)
    C = v.C
    loads = {}
    for jid, kv, slots in ((10, "A", [0, 1, 2, 3]), (11, "B", [4])):
        r = v.creq("c-" + kv, kv)
        C.on_new_request(r)
        C.submit_load(job(jid, keys_for(kv, len(slots)), slots, r))
        loads[jid] = (kv, r, slots)
    v.step()
    assert v.P.core.producer_state("A").value == "awaiting"  # the prefill is still running
    v.advance_to(0.5)
    v.net.partition(v.P_ADDR, v.C_ADDR)  # power lost: nothing more arrives, not even a FIN/RST
    v.advance_to(0.5 + 5.0 + 1.0)
    for jid, (kv, r, slots) in loads.items():
        assert _outcome(v.cjobs, jid) == (False, "peer_timeout")
        assert C.lookup(keys_for(kv, 1)[0], r) is LookupResult.MISS
        assert digests(C.pool, slots) == [sentinel_digest(BB)] * len(slots)
    assert metric(C, "kvtier_session_ends_total", reason="peer_timeout") == 1
    v.advance_to(40.0)
    assert v.cjobs.total() == 2


def test_b09_load_timeout_then_abort_ack_timeout_when_liveness_is_slower(pairs):
    """With a peer timeout longer than T_load, the load deadline is the backstop: at T_load the
    load stops accepting data and aborts; the result (``load_timeout``) comes once the abort is
    acknowledged or abort_ack_timeout_s passes -- never before T_load, never twice."""
    cfg = {**SCEN, "peer_timeout_s": 120.0}
    v = pairs(cfg, cfg, block_bytes=BB)
    C = v.C
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 4), [0, 1, 2, 3], ca))
    v.step()
    v.advance_to(0.5)
    v.net.partition(v.P_ADDR, v.C_ADDR)  # power lost: no FIN/RST, only silence
    v.advance_to(29.75)
    assert not v.cjobs.has(10)
    v.advance_to(30.0)
    assert C.core.consumer_state("A").value in ("aborting", "failed")
    v.advance_to(30.0 + 5.0)  # abort_ack_timeout_s = 5
    assert _outcome(v.cjobs, 10) == (False, "load_timeout")
    assert digests(C.pool, [0, 1, 2, 3]) == [sentinel_digest(BB)] * 4
    v.advance_to(60.0)
    assert v.cjobs.total() == 1


def test_load_timeout_abort_is_acknowledged_and_late_data_is_dropped(pairs):
    """The producer is wedged while the load is in flight (its liveness allowance is long).  At
    T_load the consumer aborts and stops accepting data; when the producer wakes up it serves
    the queued fetch, then answers the abort: the blocks arrive late and are dropped, and the
    load fails once with ``load_timeout`` -- without waiting for abort_ack_timeout_s."""
    cfg = {**SCEN, "peer_timeout_s": 120.0}
    v = pairs(cfg, cfg, block_bytes=BB)
    P, C = v.P, v.C
    _store(v, "A", 1, [0, 1, 2, 3], seed=1)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    v.step()
    assert C.core.session_ready(v.P_ADDR)
    v.frozen.add("P")
    v.advance_to(1.0)
    C.submit_load(job(10, keys_for("A", 4), [4, 5, 6, 7], ca))
    v.advance_to(31.0)  # T_load after the submit
    assert C.core.consumer_state("A").value == "aborting"
    assert not v.cjobs.has(10)
    v.advance_to(32.0)
    v.frozen.discard("P")
    v.step()
    assert v.now == 32.0
    assert _outcome(v.cjobs, 10) == (False, "load_timeout")
    assert metric(C, "kvtier_ignored_inputs_total", machine="consumer", reason="late_data") >= 1
    assert metric(C, "kvtier_block_bytes_landed_total") == 0
    assert digests(C.pool, [4, 5, 6, 7]) == [sentinel_digest(BB)] * 4
    v.advance_to(60.0)
    assert v.cjobs.total() == 1
    assert v.pjobs.total() == 1  # the producer's store job ended too (it did send)


def test_liveness_timeout_when_pings_stop_arriving_then_a_new_session_works(pairs):
    """A partition (pings silently dropped both ways): each side declares the other lost after
    peer_timeout_s; bound records fail once (consumer load peer_lost, producer's awaiting fetch
    tombstoned).  After the partition heals, a new request opens a new session and loads."""
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 2), [0, 1], ca))
    v.step()
    assert P.core.producer_state("A").value == "awaiting"
    v.advance_to(1.0)
    v.net.partition(v.P_ADDR, v.C_ADDR)
    v.advance_to(8.0)
    assert _outcome(v.cjobs, 10) == (False, "peer_timeout")
    assert metric(C, "kvtier_session_ends_total", reason="peer_timeout") == 1
    assert metric(P, "kvtier_session_ends_total", reason="peer_timeout") == 1
    assert P.core.producer_state("A").value == "tombstoned"
    assert P.core.producer("A").reason == "peer_lost"

    v.net.heal(v.P_ADDR, v.C_ADDR)
    _, dig = _store(v, "B", 1, [5, 6], seed=9)
    # silence is not death: a load on the fresh dial waits for it (a producer that was only
    # partitioned answers); only a connection-level end fails fresh dials at once (decision I18)
    cb = v.creq("c-B", "B")
    C.on_new_request(cb)
    C.submit_load(job(11, keys_for("B", 2), [2, 3], cb))
    v.step()
    assert _outcome(v.cjobs, 11) == (True, None)
    assert digests(C.pool, [2, 3]) == dig
    assert _outcome(v.pjobs, 1) == (True, None)


# -- B10 -----------------------------------------------------------------------------------------


def test_b10_handshake_never_acknowledged_fails_queued_load_at_handshake_timeout(pairs):
    v = pairs(SCEN, block_bytes=BB)
    v.frozen.add("P")  # connected but wedged: never answers the hello
    C = v.C
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    assert C.lookup(keys_for("A", 1)[0], ca) is LookupResult.HIT
    C.submit_load(job(10, keys_for("A", 2), [0, 1], ca))
    v.step()
    assert C.core.consumer_state("A").value == "queued"
    v.advance_to(4.75)
    assert not v.cjobs.has(10)
    v.advance_to(5.0)  # handshake_timeout_s = 5
    assert _outcome(v.cjobs, 10) == (False, "handshake_timeout")
    assert metric(C, "kvtier_session_ends_total", reason="handshake_timeout") == 1
    assert C.lookup(keys_for("A", 1)[0], ca) is LookupResult.MISS
    v.advance_to(40.0)
    assert v.cjobs.total() == 1


# -- B16 -----------------------------------------------------------------------------------------


def test_b16_consumer_never_shows_up_reap_then_prune_leaves_no_trace(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P = v.P
    _store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.advance_to(59.75)
    assert not v.pjobs.has(1)
    v.advance_to(60.0)
    assert _outcome(v.pjobs, 1) == (False, "reaped")
    assert P.core.producer_state("A").value == "tombstoned"
    v.advance_to(120.0)
    _no_refs(P, "A")
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
                gone = m.core.producer("A") is None and not m.jobs_in_flight()
            if gone:
                break
            time.sleep(0.02)
        assert gone, "the poll thread never reaped and pruned the parked id"
        assert [(r.job_id, r.success, r.reason) for r in m.get_finished_jobs()] == [(1, False, "reaped")]
    finally:
        m.shutdown()


# -- B17 -----------------------------------------------------------------------------------------


class FlakyTransport(InprocTransport):
    """An InprocTransport whose NIC 'flaps' for block data: while ``fail_blocks`` is set, every
    block_data send fails (control messages still go through)."""

    fail_blocks = False

    def send(self, peer, frames, *, track=False):
        if self.fail_blocks:
            try:
                header = msgspec.msgpack.decode(bytes(memoryview(frames[0])))
            except msgspec.DecodeError:
                header = None
            if isinstance(header, dict) and header.get("type") == "block_data":
                h = SendHandle(peer)
                h._mark_failed(SendFailure.ERROR, "injected: NIC flap")
                return h
        return super().send(peer, frames, track=track)


def test_b17_transfer_failure_is_told_to_the_consumer_at_once(pairs):
    v = pairs(SCEN, block_bytes=BB, p_transport=FlakyTransport)
    flaky = v.P.transport
    P, C = v.P, v.C
    _store(v, "A", 1, [0, 1, 2, 3], seed=1)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    v.advance_to(1.0)
    flaky.fail_blocks = True
    C.submit_load(job(10, keys_for("A", 4), [0, 1, 2, 3], ca))
    v.step()
    assert v.now == 1.0
    assert _outcome(v.cjobs, 10) == (False, "transfer_failed")  # the consumer falls back now
    assert _outcome(v.pjobs, 1) == (False, "transfer_failed")  # the producer released A's blocks
    assert P.core.producer_state("A").value == "tombstoned"
    assert digests(C.pool, [0, 1, 2, 3]) == [sentinel_digest(BB)] * 4

    # a late duplicate failure and a malformed message for the cleared id are ignored
    gen = P.core.session_gen("in:" + v.C_ADDR)
    rnd = C.core.consumer("A").round
    flaky.send("in:" + v.C_ADDR, encode_frames(wm.TransferDone(gen=gen, kv_request_id="A", round=rnd, ok=False,
                                                               reason="transfer_failed")))
    flaky.send("in:" + v.C_ADDR, [b"\xc1garbage"])
    v.advance_to(40.0)
    assert v.cjobs.total() == 1 and v.pjobs.total() == 1
    assert metric(C, "kvtier_wire_errors_total", reason="malformed") == 1
    assert metric(C, "kvtier_internal_errors_total") == 0


# -- restart -------------------------------------------------------------------------------------


def test_producer_restart_fails_old_loads_once_drops_stale_generation_new_loads_succeed(pairs):
    v = pairs(SCEN, block_bytes=BB)
    C = v.C
    _, dig0 = _store(v, "K0", 1, [0], seed=1)
    c0 = v.creq("c-K0", "K0")
    C.on_new_request(c0)
    C.submit_load(job(10, keys_for("K0", 1), [0], c0))
    v.step()
    assert _outcome(v.cjobs, 10) == (True, None)
    old_gen = C.core.session_gen(v.P_ADDR)

    old = {}
    for jid, kv in ((11, "K1"), (12, "K2")):
        r = v.creq("c-" + kv, kv)
        C.on_new_request(r)
        C.submit_load(job(jid, keys_for(kv, 1), [jid - 10], r))
        old[jid] = r
    v.step()
    assert C.core.consumer_state("K1").value == "in_flight"

    v.crash_producer()
    v.advance_to(0.5)
    P2 = v.restart_producer()
    v.advance_to(3.0)
    for jid in old:
        assert _outcome(v.cjobs, jid) == (False, "peer_disconnected")
        assert digests(C.pool, [jid - 10]) == [sentinel_digest(BB)]
    assert metric(C, "kvtier_session_ends_total", reason="peer_disconnected") == 1

    # new loads go to the new incarnation over a new session generation
    _, dig3 = _store(v, "K3", 2, [3, 4], seed=3)
    c3 = v.creq("c-K3", "K3")
    C.on_new_request(c3)
    v.step()
    new_gen = C.core.session_gen(v.P_ADDR)
    assert new_gen is not None and new_gen != old_gen
    assert C.core.session_ready(v.P_ADDR)

    # stale messages of the old session, in both directions, are dropped by generation
    stale_before = metric(P2, "kvtier_ignored_inputs_total", machine="session", reason="stale")
    C.transport.send(v.P_ADDR, encode_frames(wm.Fetch(gen=old_gen, kv_request_id="K-stale", round=999,
                                                      keys=[b"x"])))
    v.step()
    assert P2.core.producer_state("K-stale").value == "absent"
    assert metric(P2, "kvtier_ignored_inputs_total", machine="session", reason="stale") == stale_before + 1
    c_stale_before = metric(C, "kvtier_ignored_inputs_total", machine="session", reason="stale")
    C.submit_load(job(13, keys_for("K3", 2), [5, 6], c3))
    live_round = C.core.consumer("K3").round
    # an answer of the old session that names the live load's very round: dropped by generation
    P2.transport.send("in:" + v.C_ADDR, encode_frames(wm.TransferDone(
        gen=old_gen, kv_request_id="K3", round=live_round, ok=False, reason="reaped")))
    v.step()
    assert metric(C, "kvtier_ignored_inputs_total", machine="session", reason="stale") == c_stale_before + 1
    assert C.core.session_ready(v.P_ADDR)
    assert _outcome(v.cjobs, 13) == (True, None)
    assert digests(C.pool, [5, 6]) == dig3
    assert _outcome(v.pjobs, 2) == (True, None)
    v.advance_to(60.0)
    assert v.cjobs.total() == 4


# -- one kv_request_id, two consumer requests ----------------------------------------------------


@pytest.mark.parametrize("first_request_state", ["cancelling", "loaded"])
def test_reused_kv_request_id_on_the_consumer_never_leaks_a_job(pairs, first_request_state):
    """A second consumer request for an id whose first load is still winding down is refused at
    on_new_request (ValueError naming the id); no job leaks, and once the first request's record
    is gone the id can be announced again."""
    v = pairs(SCEN, block_bytes=BB)
    C = v.C
    c1 = v.creq("c1", "A")
    C.on_new_request(c1)
    if first_request_state == "loaded":
        _store(v, "A", 1, [0], seed=1)
    C.submit_load(job(1, keys_for("A", 1), [0], c1))
    v.step()
    c2 = v.creq("c2", "A")
    if first_request_state == "cancelling":
        C.on_request_finished(c1)  # abort_fetch on its way; the record is 'cancelling'
    else:
        assert _outcome(v.cjobs, 1) == (True, None)
    with pytest.raises(ValueError, match="still in use"):
        C.on_new_request(c2)
    with pytest.raises(UnknownRequest):
        C.submit_load(job(2, keys_for("A", 1), [1], c2))
    if first_request_state == "loaded":
        C.on_request_finished(c1)
    v.advance(40.0)
    assert C.core.consumer_state("A").value == "absent"
    assert 2 not in C.outstanding_jobs() and not v.cjobs.has(2)
    assert len(v.cjobs.by_id.get(1, [])) == 1
    assert C.on_new_request(c2) == "consumer"  # the id is free again


# -- more scenarios: transfer timeout, B12, B13, B15, B20, B29 -----------------------------------


def test_confirmed_transfer_waits_for_the_release_and_quarantines_past_its_deadline(pairs):
    """The transport keeps the blocks (zmq still holds the frames) although the consumer has every
    block: its load succeeded and its receipt arrived, so the producer is ``confirmed``.  The store
    job's result -- the moment the engine may reuse the blocks -- still waits until the transport
    lets go.  Past the cancel deadline the session is ended to force the release and the id is
    quarantined, its job outstanding; when the transport finally releases, the job succeeds (the
    consumer confirmed every block)."""
    v = pairs(
        {**SCEN, "transfer_timeout_s": 10.0},
        block_bytes=BB,
        p_transport=lambda net, addr: InprocTransport(net, addr, hold_completion=True, hold_after_drop=True),
    )
    P, C = v.P, v.C
    _store(v, "A", 1, [0, 1], seed=1)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    v.advance_to(1.0)
    C.submit_load(job(10, keys_for("A", 2), [0, 1], ca))
    v.step()
    assert _outcome(v.cjobs, 10) == (True, None)  # the last block landed and matched
    assert P.core.producer_state("A").value == "confirmed"  # receipt in, frames still held
    v.advance_to(10.75)
    assert not v.pjobs.has(1)
    v.advance_to(11.0)
    assert P.core.producer_state("A").value == "quarantined"
    assert not v.pjobs.has(1)  # never reported while the transport references the blocks
    assert P.quarantined() == (1, 2)
    assert metric(P, "kvtier_session_ends_total", reason="transfer_stalled") == 1
    assert metric(P, "kvtier_quarantined_blocks", role="producer") == 2
    v.advance_to(15.0)
    P.transport.complete()
    v.step()
    assert _outcome(v.pjobs, 1) == (True, None)
    assert P.core.producer_state("A").value == "done"
    v.advance_to(60.0)
    assert v.cjobs.total() == 1 and v.pjobs.total() == 1


def test_b12_fetch_for_missing_blocks_after_the_prefill_finished_is_refused_in_one_rtt(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    preq, _ = _store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.advance_to(0.5)
    P.on_request_finished(preq)  # every store of the prefill was submitted
    v.advance_to(2.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 5), [0, 1, 2, 3, 4], ca))  # A#4 was never stored
    v.step()
    assert _outcome(v.cjobs, 10) == (False, "incomplete")
    assert _outcome(v.pjobs, 1) == (False, "incomplete")  # A's blocks released at once
    assert P.core.producer_state("A").value == "tombstoned"
    assert metric(P, "kvtier_block_bytes_sent_total") == 0


def test_b12_fetch_for_missing_blocks_is_answered_by_supply_timeout_not_t_load(pairs):
    """While the prefill may still store more blocks (its request not finished), a fetch for a
    block not stored yet waits at most fetch_supply_timeout_s, then gets a definitive failure
    from the producer -- well before the consumer's T_load."""
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    _store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.advance_to(2.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 5), [0, 1, 2, 3, 4], ca))
    v.step()
    assert P.core.producer_state("A").value == "awaiting"
    v.advance_to(12.0)
    assert _outcome(v.cjobs, 10) == (False, "supply_timeout")
    assert _outcome(v.pjobs, 1) == (False, "supply_timeout")  # A's blocks released
    assert metric(P, "kvtier_block_bytes_sent_total") == 0


def test_b13_reused_kv_request_id_on_the_producer_is_refused_and_the_first_owner_served(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    _, dig = _store(v, "A", 1, [0, 1, 2, 3], seed=1, req_id="r1")
    v.advance_to(1.0)
    _store(v, "A", 2, [4, 5, 6, 7], seed=2, req_id="r2")
    v.step()
    assert _outcome(v.pjobs, 2) == (False, "id_in_use")  # its blocks are released at once
    v.advance_to(2.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 4), [0, 1, 2, 3], ca))
    v.step()
    assert _outcome(v.cjobs, 10) == (True, None)
    assert digests(C.pool, [0, 1, 2, 3]) == dig  # r1's blocks, not r2's
    assert _outcome(v.pjobs, 1) == (True, None)
    assert not P.jobs_in_flight() and P.core.producer("A").parked == ()


def test_b15_demand_for_never_stored_ids_is_bounded_and_does_not_block_legit_transfers(pairs):
    cfg = {**SCEN, "max_pending_fetches_per_peer": 2}
    v = pairs(cfg, block_bytes=BB)
    P, C = v.P, v.C
    for jid, kv in ((10, "X1"), (11, "X2"), (12, "X3")):
        r = v.creq("c-" + kv, kv)
        C.on_new_request(r)
        C.submit_load(job(jid, [kv.encode()], [jid - 10], r))
    v.step()
    assert _outcome(v.cjobs, 12) == (False, "too_many_pending")  # excess rejected at once
    assert not v.cjobs.has(10) and not v.cjobs.has(11)
    v.advance_to(0.1)
    _, dig = _store(v, "Y", 1, [0, 1], seed=3)
    v.advance_to(0.2)
    cy = v.creq("c-Y", "Y")
    C.on_new_request(cy)
    C.submit_load(job(20, keys_for("Y", 2), [5, 6], cy))
    v.step()
    assert _outcome(v.cjobs, 20) == (True, None)
    assert digests(C.pool, [5, 6]) == dig
    v.advance_to(10.0)  # T_orphan = fetch_supply_timeout_s
    assert _outcome(v.cjobs, 10) == (False, "supply_timeout")
    assert _outcome(v.cjobs, 11) == (False, "supply_timeout")


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
    assert _outcome(v.pjobs, 1) == (True, None)
    assert _outcome(v.cjobs, 10) == (True, None)
    # nothing pinned; the empty fetch is a terminal request (done, not_needed), retained so that
    # a store that follows it succeeds at once instead of parking until the reap
    view = P.core.producer("A")
    assert (view.state.value, view.reason, view.parked, view.jobs) == ("done", "not_needed", (), ())
    assert metric(P, "kvtier_block_bytes_sent_total") == 0


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
    assert _outcome(v.cjobs, 10) == (True, None)
    assert digests(C.pool, range(6)) == [pattern_digest(4, i, BB) for i in range(1, 7)]
    assert _outcome(v.pjobs, 1) == (True, None) and _outcome(v.pjobs, 2) == (True, None)
    assert not P.jobs_in_flight() and P.core.producer("A").parked == ()
    assert metric(P, "kvtier_block_bytes_sent_total") == 6 * BB


def test_fetch_over_the_producers_header_limit_is_refused_at_submit(pairs):
    """A load whose fetch header would exceed max_message_bytes is refused at the call."""
    n = 6000
    v = pairs(num_blocks=n, block_bytes=BB)  # default configs on both sides
    C = v.C
    keys = [f"A/{i:05d}/".encode().ljust(200, b"k") for i in range(n)]
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    with pytest.raises(ValueError, match="max_message_bytes"):
        C.submit_load(job(10, keys, list(range(n)), ca))
    assert 10 not in C.outstanding_jobs()


def test_fetch_refused_by_a_producer_with_a_smaller_limit_fails_at_once(pairs):
    """The producer's max_blocks_per_fetch is smaller than the consumer's: it answers
    error(oversize) naming the id, and the consumer fails that load at once (peer_error)."""
    n = 40
    v = pairs({"max_blocks_per_fetch": 16}, num_blocks=n, block_bytes=BB)
    C = v.C
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", n), list(range(n)), ca))
    v.step()
    v.step()
    assert _outcome(v.cjobs, 10) == (False, "peer_error")
    assert metric(v.P, "kvtier_wire_errors_total", reason="oversize") == 1



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
        _store(v, f"id{i}", 1 + i, [i], seed=i)
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
    assert all(_outcome(v.cjobs, 10_000 + i) == (True, None) for i in range(n))
    assert all(_outcome(v.pjobs, 1 + i) == (True, None) for i in range(n))
    assert metric(P, "kvtier_session_ends_total", reason="peer_timeout") == 0
