"""The core's own part in a symmetric round's life, on the symmetric harness: one round counter
for prefill/decode loads and probes, the served transfer's headers against the plane's limit, and
a round's load that is out when shutdown begins, when its grace ends, and when a new session to
its peer becomes ready while it still waits for its revocation.

Durations are :data:`tests.symmetric.harness.DURATIONS` (revoke timeout 10 s).
"""

from __future__ import annotations

import msgspec

from kvtier.lifecycle import ConsumerState, ProbeState, Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Ignored, SendBlocks
from kvtier.wire import messages as wm
from tests.symmetric.harness import DURATIONS, SymNet
from tests.symmetric.test_core_symmetric import KEYS, K, announce, deliver_all, finish_transfers, hold, lookup_all, pair
from tools.coreview import CoreView


def offered(**producer_settings) -> SymNet:
    """A pair whose consumer holds the producer's offer of KEYS[:3] (blocks 10-12) for ``K``."""
    net = pair(**producer_settings)
    hold(net, 3, 10)
    announce(net)
    lookup_all(net, KEYS, 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert net.cores["C"].probe_state(K) is ProbeState.OFFERED
    return net


def load_round(net: SymNet, job: int = 7) -> int:
    """``C``'s engine loads the offered prefix; returns the round its load fetches (in flight)."""
    net.engine_input("C", ix.LoadSubmitted(K, job, tuple(KEYS[:3]), (0, 1, 2)), 0.0)
    (load,) = net.cores["C"].round_loads(K)
    assert load.state is ConsumerState.IN_FLIGHT
    return load.round


def pd_load(net: SymNet, kid: str, job: int, now: float) -> int:
    """``P`` parks one block under ``kid``; ``C`` loads it. Returns the round of C's fetch."""
    net.engine_input("P", ix.StoreSubmitted(kid, f"req-{kid}", 100 + job, (kid.encode(),), (20,)), now)
    net.engine_input("C", ix.LoadAnnounced(kid, "P"), now)
    net.engine_input("C", ix.LoadSubmitted(kid, job, (kid.encode(),), (5,)), now)
    return net.cores["C"].consumer(kid).round


def test_prefill_decode_loads_and_symmetric_rounds_take_distinct_rounds_from_one_counter() -> None:
    net = offered()
    probe_round = CoreView(net.cores["C"]).probe(K).round
    first = pd_load(net, "pd-1", 9, 0.0)
    assert first > probe_round  # after the probe's round, not a second count from 0
    announce(net, kid="sym-2")
    lookup_all(net, KEYS[:1], 0.0, kid="sym-2")
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    assert CoreView(net.cores["C"]).probe("sym-2").round > first
    deliver_all(net, 0.0)
    finish_transfers(net, 0.0)
    assert [r.ok for r in net.results[9]] == [True]


def test_a_served_rounds_headers_fit_the_planes_limit_once_their_digests_are_filled_in() -> None:
    """With integrity on, the shell fills each served block's digest into its header (decision Y9):
    the core cuts the transfer so every header still fits ``max_header_bytes``."""
    limit = 100
    net = offered(max_header_bytes=limit, block_bytes=16)
    load_round(net)
    sends = []
    while net.pending("C", "P"):
        _, seen = net.deliver("C", "P", 0, 0.0)
        sends += [e for e in seen if isinstance(e, SendBlocks)]
    (send,) = sends
    assert send.take_digests and send.digests == ()
    assert len(send.headers) > 1 and sum(h.count for h in send.headers) == 3
    for h in send.headers:
        filled = msgspec.structs.replace(h, digests=[2**64 - 1] * h.count)
        assert len(msgspec.msgpack.encode(filled)) <= limit, h


def test_a_rounds_load_in_flight_when_shutdown_begins_finishes_in_the_grace() -> None:
    net = offered()
    rnd = load_round(net)
    out = net.engine_input("C", ix.ShutdownStarted(), 0.5)
    assert Ignored("consumer", str((K, rnd)), ConsumerState.IN_FLIGHT, "shutdown", Reason.IN_GRACE) in out
    deliver_all(net, 0.6)
    finish_transfers(net, 0.6)
    assert [r.ok for r in net.results[7]] == [True]
    assert net.cores["C"].round_loads(K) == []


def test_the_grace_end_revokes_a_rounds_load_in_flight_and_answers_it_shutdown() -> None:
    net = offered()
    net.revoke_later = True  # a one-sided plane: the test confirms the revocation
    rnd = load_round(net)
    net.engine_input("C", ix.GraceEnded(), 1.0)
    (load,) = net.cores["C"].round_loads(K)
    assert (load.state, load.reason, load.deadline) == (
        ConsumerState.REVOKING, Reason.SHUTDOWN, 1.0 + DURATIONS["revoke_timeout_s"])
    aborts = [e.msg for e in net.pending("C", "P") if isinstance(e.msg, wm.AbortFetch)]
    assert [(m.kv_request_id, m.round, m.offered) for m in aborts] == [(K, rnd, True)]
    assert 7 not in net.results  # no result while the producer may still write into the slots
    net.finish_revoke(0, 1.5)
    assert [(r.ok, r.reason) for r in net.results[7]] == [(False, Reason.SHUTDOWN)]
    assert net.cores["C"].round_loads(K) == []


def test_a_new_session_to_the_peer_leaves_a_rounds_load_waiting_for_its_revocation() -> None:
    """A round's load whose session closed waits in ``revoking`` for the plane; a new session to
    the same peer (dialled for another probe) becoming ready is stale for it: no fetch again, and
    the result comes with the revocation."""
    net = offered()
    net.revoke_later = True
    rnd = load_round(net)
    net.engine_input("C", ix.ConnectionClosed("P"), 0.5)
    net.engine_input("P", ix.ConnectionClosed("C"), 0.5)
    (load,) = net.cores["C"].round_loads(K)
    assert load.state is ConsumerState.REVOKING
    net.engine_input("C", ix.ProbeAnnounced("sym-2", "P"), 0.6)  # dials P again
    out = net.connect("C", "P", 0.6)
    assert CoreView(net.cores["C"]).session_ready("P")
    assert Ignored("consumer", str((K, rnd)), ConsumerState.REVOKING, "handshake_ready", Reason.STALE) in out
    (load,) = net.cores["C"].round_loads(K)
    assert load.state is ConsumerState.REVOKING
    assert not [e for e in net.pending("C", "P") if isinstance(e.msg, wm.Fetch) and e.msg.round == rnd
                and e.msg.gen == CoreView(net.cores["C"]).session_gen("P")]
    net.finish_revoke(0, 0.7)
    assert [(r.ok, r.reason) for r in net.results[7]] == [(False, Reason.PEER_DISCONNECTED)]
