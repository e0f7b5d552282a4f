"""The real manager pair on an in-memory network, driven by a virtual clock (no sockets, no
sleeps): every failure reaches the consumer exactly once -- a cancel or reject before the fetch,
a silent producer, load and abort-ack timeouts, liveness, a handshake never acknowledged, a
block send that fails, a producer restart.  Expected values come from
docs/scenarios.md (B05, B09, B10, B17) with its parameters
(T_park = 60 s, T_tomb = 60 s, T_load = 30 s) unless a test says otherwise.
"""

from __future__ import annotations

import msgspec
import pytest

from kvtier.api import LookupResult
from kvtier.testing.inproc import InprocTransport
from kvtier.transport import SendFailure, SendHandle
from kvtier.wire import messages as wm
from kvtier.wire.codec import encode_frames
from mgr_helpers import digests, job, keys_for, metric, sentinel_digest
from virtual_helpers import BB, SCEN, outcome, store
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)


# -- B05 -----------------------------------------------------------------------------------------


def test_b05_consumer_rejects_before_fetching_producer_frees_blocks_in_one_rtt(pairs):
    v = pairs(SCEN, block_bytes=BB)
    store(v, "A", 1, [0, 1, 2, 3], seed=1)
    ca = v.creq("c-A", "A")
    v.C.on_new_request(ca)  # the decode side knows the request (and dials the producer)
    v.step()
    v.advance_to(1.0)
    v.C.on_request_finished(ca)  # rejected before it was ever scheduled: no load, no fetch
    v.step()
    assert v.P.core.producer_state("A").value == "tombstoned"
    assert outcome(v.pjobs, 1) == (False, "aborted")


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
    assert outcome(v.cjobs, 10) == (False, "cancelled")
    assert P.core.producer_state("A").value == "tombstoned"
    assert CoreView(P.core).producer("A").reason == "aborted"
    v.advance_to(2.0)
    store(v, "A", 1, [0, 1, 2, 3], seed=1)
    v.step()
    assert outcome(v.pjobs, 1) == (False, "aborted")
    # a later fetch for A is refused at once as well
    v.advance_to(3.0)
    ca2 = v.creq("c-A2", "A")
    C.on_new_request(ca2)
    C.submit_load(job(11, keys_for("A", 4), [4, 5, 6, 7], ca2))
    v.step()
    assert outcome(v.cjobs, 11) == (False, "aborted")
    assert metric(P, "kvtier_block_sent_bytes_total") == 0


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
        assert outcome(v.cjobs, jid) == (False, "peer_timeout")
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
    assert outcome(v.cjobs, 10) == (False, "load_timeout")
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
    store(v, "A", 1, [0, 1, 2, 3], seed=1)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    v.step()
    assert CoreView(C.core).session_ready(v.P_ADDR)
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
    assert outcome(v.cjobs, 10) == (False, "load_timeout")
    assert metric(C, "kvtier_ignored_inputs_total", machine="consumer", reason="late_data") >= 1
    assert metric(C, "kvtier_block_landed_bytes_total") == 0
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
    assert outcome(v.cjobs, 10) == (False, "peer_timeout")
    assert metric(C, "kvtier_session_ends_total", reason="peer_timeout") == 1
    assert metric(P, "kvtier_session_ends_total", reason="peer_timeout") == 1
    assert P.core.producer_state("A").value == "tombstoned"
    assert CoreView(P.core).producer("A").reason == "peer_lost"

    v.net.heal(v.P_ADDR, v.C_ADDR)
    _, dig = store(v, "B", 1, [5, 6], seed=9)
    # silence is not death: a load on the fresh dial waits for it (a producer that was only
    # partitioned answers; a fresh dial waits for its own outcome, decision I30)
    cb = v.creq("c-B", "B")
    C.on_new_request(cb)
    C.submit_load(job(11, keys_for("B", 2), [2, 3], cb))
    v.step()
    assert outcome(v.cjobs, 11) == (True, None)
    assert digests(C.pool, [2, 3]) == dig
    assert outcome(v.pjobs, 1) == (True, None)


# -- B24 (the dialling side stalls) -------------------------------------------------------------

_HB_C = {"heartbeat_interval_s": 0.2, "peer_timeout_s": 0.6}
_HB_P = {"heartbeat_interval_s": 0.2, "peer_timeout_s": 30.0}  # the producer never gives up here


def test_b24_a_consumer_whose_own_loop_stalled_does_not_condemn_a_live_producer(pairs):
    """An idle session (only the consumer pings; the producer only answers): the consumer's
    process makes no pass for 2 s (a stopped process, a long step), more than its peer_timeout_s,
    so nothing was heard — nothing was asked.  Its first heartbeat after the stall fires late: the
    producer gets one more interval to answer before its silence counts, and the session stays."""
    v = pairs({**SCEN, **_HB_P}, {**SCEN, **_HB_C}, block_bytes=BB)
    C = v.C
    preq, dig = store(v, "A", 1, [3, 4], seed=5)
    v.P.on_request_finished(preq)
    r = v.creq("c-A", "A")
    C.on_new_request(r)
    C.submit_load(job(10, keys_for("A", 2), [0, 1], r))
    v.advance_to(1.0)
    assert outcome(v.cjobs, 10) == (True, None)
    v.frozen.add("C")
    v.advance_to(3.0)
    v.frozen.discard("C")
    v.advance_to(4.0)
    assert metric(C, "kvtier_session_ends_total", reason="peer_timeout") == 0
    preq, dig = store(v, "B", 2, [5, 6], seed=6)
    v.P.on_request_finished(preq)
    r = v.creq("c-B", "B")
    C.on_new_request(r)
    C.submit_load(job(11, keys_for("B", 2), [0, 1], r))
    v.step()
    assert outcome(v.cjobs, 11) == (True, None) and digests(C.pool, [0, 1]) == dig
    assert metric(C, "kvtier_session_ends_total") == 0 and metric(v.P, "kvtier_session_ends_total") == 0


def _waiting_load(pairs):
    """A pair whose consumer's load (job 10 of id A) waits on the producer at t = 1 s."""
    v = pairs({**SCEN, **_HB_P}, {**SCEN, **_HB_C}, block_bytes=BB)
    r = v.creq("c-A", "A")
    v.C.on_new_request(r)
    v.C.submit_load(job(10, keys_for("A", 2), [0, 1], r))
    v.step()
    v.advance_to(1.0)
    return v


def test_b24_a_producer_that_died_during_the_consumers_stall_is_still_declared_lost(pairs):
    """The stall does not spare the peer for long: a producer gone silent meanwhile is lost one
    heartbeat after the consumer resumed (the late heartbeat judges at its due time and pings)."""
    v = _waiting_load(pairs)
    C = v.C
    v.frozen.add("C")
    v.net.partition(v.P_ADDR, v.C_ADDR)  # the producer is gone: nothing arrives, no FIN
    v.advance_to(3.0)
    v.frozen.discard("C")
    v.advance_to(3.0 + 0.2 + 0.2 + 0.05)  # the late heartbeat pings; the next condemns
    assert outcome(v.cjobs, 10) == (False, "peer_timeout")
    assert metric(C, "kvtier_session_ends_total", reason="peer_timeout") == 1


def test_a_consumer_polled_slower_than_its_heartbeat_still_finds_a_silent_producer(pairs):
    """A caller-driven consumer polled every 0.45 s (more than two heartbeat intervals, less than
    peer_timeout_s): every heartbeat fires late, yet a producer gone silent is found within
    peer_timeout_s + an interval + the poll period — a late heartbeat judges at its due time, it
    does not spare the peer."""
    v = _waiting_load(pairs)
    C = v.C
    v.net.partition(v.P_ADDR, v.C_ADDR)
    t = 1.0
    while t < 1.0 + 0.6 + 0.2 + 0.45 + 0.05:
        t += 0.45
        v.frozen.add("C")
        v.advance_to(t - 0.001)
        v.frozen.discard("C")
        v.advance_to(t)  # one poll of the consumer
    assert outcome(v.cjobs, 10) == (False, "peer_timeout")
    assert metric(C, "kvtier_session_ends_total", reason="peer_timeout") == 1


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
    assert outcome(v.cjobs, 10) == (False, "handshake_timeout")
    assert metric(C, "kvtier_session_ends_total", reason="handshake_timeout") == 1
    assert C.lookup(keys_for("A", 1)[0], ca) is LookupResult.MISS
    v.advance_to(40.0)
    assert v.cjobs.total() == 1


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
    store(v, "A", 1, [0, 1, 2, 3], seed=1)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    v.advance_to(1.0)
    flaky.fail_blocks = True
    C.submit_load(job(10, keys_for("A", 4), [0, 1, 2, 3], ca))
    v.step()
    assert v.now == 1.0
    assert outcome(v.cjobs, 10) == (False, "transfer_failed")  # the consumer falls back now
    assert outcome(v.pjobs, 1) == (False, "transfer_failed")  # the producer released A's blocks
    assert P.core.producer_state("A").value == "tombstoned"
    assert digests(C.pool, [0, 1, 2, 3]) == [sentinel_digest(BB)] * 4

    # a late duplicate failure and a malformed message for the cleared id are ignored
    gen = CoreView(P.core).session_gen("in:" + v.C_ADDR)
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
    _, dig0 = store(v, "K0", 1, [0], seed=1)
    c0 = v.creq("c-K0", "K0")
    C.on_new_request(c0)
    C.submit_load(job(10, keys_for("K0", 1), [0], c0))
    v.step()
    assert outcome(v.cjobs, 10) == (True, None)
    old_gen = CoreView(C.core).session_gen(v.P_ADDR)

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
        assert outcome(v.cjobs, jid) == (False, "peer_disconnected")
        assert digests(C.pool, [jid - 10]) == [sentinel_digest(BB)]
    assert metric(C, "kvtier_session_ends_total", reason="peer_disconnected") == 1

    # new loads go to the new incarnation over a new session generation
    _, dig3 = store(v, "K3", 2, [3, 4], seed=3)
    c3 = v.creq("c-K3", "K3")
    C.on_new_request(c3)
    v.step()
    new_gen = CoreView(C.core).session_gen(v.P_ADDR)
    assert new_gen is not None and new_gen != old_gen
    assert CoreView(C.core).session_ready(v.P_ADDR)

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
    assert CoreView(C.core).session_ready(v.P_ADDR)
    assert outcome(v.cjobs, 13) == (True, None)
    assert digests(C.pool, [5, 6]) == dig3
    assert outcome(v.pjobs, 2) == (True, None)
    v.advance_to(60.0)
    assert v.cjobs.total() == 4
