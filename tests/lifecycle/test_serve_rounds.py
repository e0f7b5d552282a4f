"""The serve machine (the producer side of a symmetric round) effect by effect, on one core driven
by hand: what a probe asks of the engine, what the reply says, every budget exactly at its bound
and one past it, who is refused and why, and every way a round's pins are released — exactly once,
with the outcome and reason the engine is told (properties ``pin_released_once``,
``no_hit_without_pin``).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.lifecycle import Reason, ServeState, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.effects import (
    CancelTransfer,
    CloseLookup,
    Ignored,
    LookUpBlocks,
    ReleasePins,
    Send,
    SendBlocks,
    SessionEnded,
)
from kvtier.lifecycle.serve import transfer_key
from kvtier.lifecycle.session import HelloInput
from kvtier.wire import messages as wm
from tools.coreview import CoreView

LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="serve", hash_seed="", instance="me")
DURATIONS = {k: 10.0 for k in TIMER_KEYS} | {"heartbeat_interval_s": 1000.0, "peer_timeout_s": 1000.0,
                                           "serve_lookup_timeout_s": 0.5, "offer_timeout_s": 5.0,
                                           "transfer_timeout_s": 3.0}
C = "c1"
K1, K2, K3, K4 = (bytes([i]) * 8 for i in range(1, 5))


def producer(**kw: Any) -> TierCore:
    settings: dict[str, Any] = {"serve_external": True, "serve_max_rounds_per_peer": 2, "serve_max_probes_per_round": 2,
                                "serve_max_pinned_blocks_per_peer": 3} | kw
    p = TierCore(CoreSettings(durations=DURATIONS, **settings), LOCAL)
    connect(p, C, 1)
    return p


def connect(p: TierCore, peer: str, gen: int, principal: str | None = None) -> None:
    hello = wm.Hello(gen=gen, version=wm.PROTOCOL_VERSION, instance=peer, block_bytes=16, layout="serve", hash_seed="")
    p.handle(ix.Received(peer, hello, principal=principal), 0.0)
    p.handle(ix.PeerAttached(peer, gen), 0.0)


def probe(p: TierCore, keys: list[bytes], rnd: int = 0, now: float = 0.0, peer: str = C, gen: int = 1) -> list[Any]:
    return p.handle(ix.Received(peer, wm.Probe(gen=gen, kv_request_id="s", round=rnd, keys=keys)), now)


def done(rnd: int, reason: str, ok: bool = False, gen: int = 1) -> Send:
    return Send(C, wm.TransferDone(gen=gen, kv_request_id="s", round=rnd, ok=ok, reason=reason))


def reply(rnd: int, keys: list[bytes], hits: list[bool]) -> Send:
    return Send(C, wm.ProbeReply(gen=1, kv_request_id="s", round=rnd, keys=keys, hits=hits))


def offered(p: TierCore, rnd: int = 0, pin: int = 7, now: float = 0.0) -> None:
    """Round ``rnd`` offers K1 (block 20, pin ``pin``); K2 is missing."""
    probe(p, [K1, K2], rnd, now)
    p.handle(ix.LookupAnswered(C, "s", rnd, found=(K1,), blocks=(20,), pin=pin, missing=(K2,)), now)
    assert CoreView(p).serve_state(C, "s", rnd) is ServeState.OFFERED


def state(p: TierCore, rnd: int = 0) -> ServeState:
    return CoreView(p).serve_state(C, "s", rnd)


# -- looking up and answering ----------------------------------------------------------------------

def test_a_probe_asks_the_engine_for_its_keys_and_the_reply_says_hit_only_for_pinned_ones() -> None:
    p = producer()
    assert probe(p, [K1, K2]) == [LookUpBlocks(C, "s", 0, (K1, K2))]
    out = p.handle(ix.LookupAnswered(C, "s", 0, found=(K1,), blocks=(20,), pin=7, missing=(K2,)), 0.1)
    assert out == [reply(0, [K1, K2], [True, False]), CloseLookup(C, "s", 0)]
    assert state(p) is ServeState.OFFERED and CoreView(p).pins_held() == frozenset({7})
    assert p.snapshot().serve_pinned_blocks == 1


def test_a_round_with_nothing_found_ends_at_once_after_its_reply() -> None:
    p = producer()
    probe(p, [K1, K2])
    out = p.handle(ix.LookupAnswered(C, "s", 0, missing=(K1, K2)), 0.1)
    assert out == [reply(0, [K1, K2], [False, False]), CloseLookup(C, "s", 0)]
    assert state(p) is ServeState.ABSENT


def test_pending_keys_are_looked_up_again_and_answered_at_the_lookup_deadline() -> None:
    p = producer()
    probe(p, [K1, K2])
    out = p.handle(ix.LookupAnswered(C, "s", 0, found=(K1,), blocks=(20,), pin=7, pending=(K2,)), 0.1)
    assert out == [LookUpBlocks(C, "s", 0, (K2,))]
    assert state(p) is ServeState.LOOKING_UP
    out = p.fire(0.5)  # serve_lookup_timeout_s from the probe: K2 is answered miss
    assert out == [reply(0, [K1, K2], [True, False]), CloseLookup(C, "s", 0)]
    assert state(p) is ServeState.OFFERED


def test_a_second_probe_of_the_round_asks_only_for_its_new_keys_and_the_reply_only_answers_them() -> None:
    p = producer()
    offered(p)
    assert probe(p, [K1, K3], now=0.2) == [LookUpBlocks(C, "s", 0, (K3,))]
    out = p.handle(ix.LookupAnswered(C, "s", 0, found=(K3,), blocks=(22,), pin=8), 0.3)
    assert out == [reply(0, [K3], [True]), CloseLookup(C, "s", 0)]
    assert CoreView(p).pins_held() == frozenset({7, 8}) and p.snapshot().serve_pinned_blocks == 2


def test_a_lookup_result_after_its_round_ended_is_released_at_once() -> None:
    p = producer()
    offered(p)
    p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=0, fetched=False, offered=True)), 0.1)
    out = p.handle(ix.LookupAnswered(C, "s", 0, found=(K3,), blocks=(22,), pin=9), 0.2)
    assert out == [ReleasePins((9,), True, None)]
    assert p.handle(ix.LookupAnswered(C, "s", 0, missing=(K3,)), 0.2) == []  # nothing pinned: nothing to release


# -- who is refused --------------------------------------------------------------------------------

def test_a_peer_is_refused_when_serving_is_off_or_its_principal_is_not_allowed() -> None:
    off = producer(serve_external=False)
    assert probe(off, [K1]) == [done(0, "not_serving")]
    p = TierCore(CoreSettings(durations=DURATIONS, serve_external=True, serve_allowed_principals=frozenset({"alice"})),
                 LOCAL)
    connect(p, C, 1, principal="mallory")
    connect(p, "c2", 2, principal="alice")
    assert probe(p, [K1]) == [done(0, "not_serving")]
    assert probe(p, [K1], peer="c2", gen=2) == [LookUpBlocks("c2", "s", 0, (K1,))]


def test_a_probe_after_shutdown_began_is_refused() -> None:
    p = producer()
    p.handle(ix.ShutdownStarted(), 0.0)
    assert probe(p, [K1]) == [done(0, "shutdown")]


def test_a_peer_may_hold_exactly_max_rounds_per_peer() -> None:
    p = producer()  # serve_max_rounds_per_peer 2
    probe(p, [K1], 0)
    probe(p, [K2], 1)
    assert probe(p, [K3], 2) == [done(2, "serve_busy")]
    assert state(p, 2) is ServeState.ABSENT
    probe(p, [K1], 0)  # a round it already holds is no new round
    assert state(p, 0) is ServeState.LOOKING_UP


def test_a_round_may_be_probed_exactly_max_probes_per_round_times() -> None:
    p = producer()  # serve_max_probes_per_round 2
    offered(p)
    probe(p, [K3], now=0.1)
    out = probe(p, [K4], now=0.2)  # the third probe of the round
    assert out == [ReleasePins((7,), False, Reason.SERVE_BUSY), done(0, "serve_busy"), CloseLookup(C, "s", 0)]
    assert state(p) is ServeState.ABSENT and CoreView(p).pins_held() == frozenset()


@pytest.mark.parametrize("limit", ["per_peer", "total"])
def test_pinned_blocks_may_reach_exactly_their_bound(limit: str) -> None:
    """Y23: what a lookup may pin is read when the window performs it: new blocks up to the room
    left, blocks already pinned at no cost; a probe naming more keys than that is taken."""
    kw = {"serve_max_pinned_blocks_per_peer": 3} if limit == "per_peer" else {
        "serve_max_pinned_blocks_per_peer": 100, "serve_max_pinned_blocks": 3}
    p = producer(serve_max_rounds_per_peer=3, **kw)
    probe(p, [K1, K2])
    room = p.serve_room(C, "s", 0)
    assert room.reach == 3 and room.fits((20, 21, 22, 23)) == 3
    p.handle(ix.LookupAnswered(C, "s", 0, found=(K1, K2), blocks=(20, 21), pin=7), 0.1)
    assert probe(p, [K3, K4], 1) == [LookUpBlocks(C, "s", 1, (K3, K4))]
    room = p.serve_room(C, "s", 1)
    assert room.fits((22, 23)) == 1 and room.fits((20, 21, 22, 23)) == 3  # 20 and 21 are pinned already
    p.handle(ix.LookupAnswered(C, "s", 1, found=(K3,), blocks=(22,), pin=8, missing=(K4,)), 0.1)
    assert p.snapshot().serve_pinned_blocks == 3  # exactly the bound: no new block fits
    assert probe(p, [K4], 2, 0.2) == [LookUpBlocks(C, "s", 2, (K4,))]
    assert p.serve_room(C, "s", 2).fits((23,)) == 0 and p.serve_room(C, "s", 2).fits((21,)) == 1
    p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=1, fetched=False, offered=True)), 0.3)
    assert p.serve_room(C, "s", 2).fits((23,)) == 1  # released: room again


def test_no_room_at_all_refuses_a_probe_serve_busy() -> None:
    p = producer(serve_max_pinned_blocks=0)  # a pool too small for its serve_max_pinned_fraction
    assert probe(p, [K1]) == [done(0, "serve_busy")]


def test_a_probe_naming_more_keys_than_the_budget_gets_the_blocks_the_budget_holds() -> None:
    """A long prompt's probe names every chunk it has (vLLM's scan goes on past RETRY): a peer
    whose budget is smaller than the prompt still offers the blocks it holds, up to the budget."""
    p = producer()  # serve_max_pinned_blocks_per_peer 3
    keys = [bytes([i]) * 8 for i in range(1, 41)]
    assert probe(p, keys) == [LookUpBlocks(C, "s", 0, tuple(keys))]
    assert p.serve_room(C, "s", 0).reach == 3
    p.handle(ix.LookupAnswered(C, "s", 0, found=tuple(keys[:3]), blocks=(20, 21, 22), pin=7,
                               missing=tuple(keys[3:])), 0.1)
    assert state(p) is ServeState.OFFERED and p.snapshot().serve_pinned_blocks == 3


def test_a_probe_naming_more_keys_than_the_lookup_budget_is_refused_and_one_at_it_is_looked_up() -> None:
    """Y25: the lookup budget is the larger of the pin reach (3 here) and 4,096 keys (one probe
    message of our consumer's); a probe naming more is refused at once, before any per-key work."""
    p = producer()
    assert p.serve_lookup_budget == 4096
    keys = [i.to_bytes(8, "big") for i in range(4097)]
    assert probe(p, keys) == [done(0, "serve_busy")]
    assert probe(p, keys[:4096], rnd=1) == [LookUpBlocks(C, "s", 1, tuple(keys[:4096]))]


def test_a_block_several_rounds_pin_takes_its_room_once() -> None:
    """A shared prefix probed by several requests at once: every round pins the same engine block,
    which holds one block of the pool, so the budget counts it once (Y23)."""
    p = producer(serve_max_rounds_per_peer=4)  # serve_max_pinned_blocks_per_peer 3
    for rnd in range(3):
        probe(p, [K1, K2, K3], rnd)
        assert p.serve_room(C, "s", rnd).fits((20, 21, 22)) == 3  # held already, or room for them
        p.handle(ix.LookupAnswered(C, "s", rnd, found=(K1, K2, K3), blocks=(20, 21, 22), pin=7 + rnd), 0.1)
        assert state(p, rnd) is ServeState.OFFERED
    assert p.snapshot().serve_pinned_blocks == 3
    p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=0, fetched=False, offered=True)), 0.2)
    assert p.snapshot().serve_pinned_blocks == 3  # rounds 1 and 2 still pin every block
    for rnd in (1, 2):
        p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=rnd, fetched=False, offered=True)), 0.3)
    assert p.snapshot().serve_pinned_blocks == 0


def test_a_block_another_peer_pins_costs_only_this_peers_own_budget() -> None:
    p = producer(serve_max_pinned_blocks=3)  # serve_max_pinned_blocks_per_peer 3 too
    offered(p, 0, pin=7)  # C pins block 20
    connect(p, "c2", 1)
    probe(p, [K1, K2], 0, peer="c2")
    room = p.serve_room("c2", "s", 0)
    assert room.fits((20, 21, 22)) == 3 and room.fits((21, 22, 23)) == 2  # 20 is in the pool's count already


# -- a round's fetch and its pins ---------------------------------------------------------------------

def test_a_fetch_of_offered_blocks_sends_them_and_the_receipt_after_the_release_frees_the_pins() -> None:
    p = producer()
    offered(p)
    out = p.handle(ix.Received(C, wm.Fetch(gen=1, kv_request_id="s", round=0, keys=[K1], offered=True)), 0.1)
    (sb,) = [e for e in out if isinstance(e, SendBlocks)]
    assert (sb.peer, sb.kv_request_id, sb.round, sb.blocks, sb.transfer) == (C, "s", 0, (20,), transfer_key(C, "s"))
    assert out[-1] == CloseLookup(C, "s", 0) and state(p) is ServeState.SERVING
    dup = p.handle(ix.Received(C, wm.Fetch(gen=1, kv_request_id="s", round=0, keys=[K1], offered=True)), 0.15)
    assert dup == [Ignored("serve", "s", ServeState.SERVING, "duplicate", Reason.STALE)]
    assert p.handle(ix.TransferReleased(transfer_key(C, "s"), 0), 0.2) == []
    assert state(p) is ServeState.DELIVERING
    out = p.handle(ix.Received(C, wm.Receipt(gen=1, kv_request_id="s", round=0)), 0.3)
    assert out == [ReleasePins((7,), True, None)] and state(p) is ServeState.ABSENT


def test_a_receipt_before_the_release_waits_for_it() -> None:
    p = producer()
    offered(p)
    p.handle(ix.Received(C, wm.Fetch(gen=1, kv_request_id="s", round=0, keys=[K1], offered=True)), 0.1)
    assert p.handle(ix.Received(C, wm.Receipt(gen=1, kv_request_id="s", round=0)), 0.2) == []
    assert state(p) is ServeState.CONFIRMED
    assert p.handle(ix.TransferReleased(transfer_key(C, "s"), 0), 0.3) == [ReleasePins((7,), True, None)]


@pytest.mark.parametrize(("fetch", "pins", "answer"), [
    ([], ReleasePins((7,), True, None), done(0, "", ok=True)),
    ([K1, K2], ReleasePins((7,), False, Reason.NOT_OFFERED), done(0, "not_offered")),
])
def test_an_empty_fetch_releases_the_round_and_one_naming_a_key_not_offered_fails_it(
        fetch: list[bytes], pins: ReleasePins, answer: Send) -> None:
    p = producer()
    offered(p)
    out = p.handle(ix.Received(C, wm.Fetch(gen=1, kv_request_id="s", round=0, keys=fetch, offered=True)), 0.1)
    assert out == [pins, answer, CloseLookup(C, "s", 0)]


def test_an_unprobed_round_refuses_its_fetch_and_acknowledges_its_abort() -> None:
    p = producer()
    out = p.handle(ix.Received(C, wm.Fetch(gen=1, kv_request_id="s", round=4, keys=[K1], offered=True)), 0.1)
    assert out == [done(4, "not_offered")]
    out = p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=4, fetched=False, offered=True)), 0.1)
    assert out == [Send(C, wm.AbortAck(gen=1, kv_request_id="s", round=4))]


@pytest.mark.parametrize(("end", "reason"), [("offer_deadline", "offer_expired"), ("drain", "drained"),
                                             ("serve_busy", "serve_busy")])
def test_a_fetch_that_crossed_the_withdrawal_of_its_round_is_told_the_withdrawals_reason(end: str, reason: str) -> None:
    """The offer expired (or was drained, or a probe over budget ended the round) as the consumer's
    lookups said HIT and its engine submitted the load: its fetch crosses the notice on the wire.
    Both sides name the same event — the notice's reason, not ``not_offered`` (an adapter bug's
    reason).  A round never withdrawn still meets ``not_offered``; a new session of the peer
    starts with nothing remembered."""
    p = producer()
    offered(p)
    if end == "offer_deadline":
        p.fire(5.0)
    elif end == "drain":
        p.handle(ix.DrainStarted(), 1.0)
    else:
        probe(p, [K3], now=0.1)
        probe(p, [K4], now=0.2)  # the third probe of the round: over serve_max_probes_per_round
    assert state(p) is ServeState.ABSENT
    fetch = wm.Fetch(gen=1, kv_request_id="s", round=0, keys=[K1], offered=True)
    assert p.handle(ix.Received(C, fetch), 6.0) == [done(0, reason)]
    assert p.handle(ix.Received(C, fetch), 6.1) == [done(0, reason)]  # a duplicate is told the same
    other = wm.Fetch(gen=1, kv_request_id="s", round=3, keys=[K1], offered=True)
    assert p.handle(ix.Received(C, other), 6.2) == [done(3, "not_offered")]
    p.handle(ix.ConnectionClosed(C), 6.3)
    connect(p, C, 2)
    again = wm.Fetch(gen=2, kv_request_id="s", round=0, keys=[K1], offered=True)
    assert p.handle(ix.Received(C, again), 6.4) == [done(0, "not_offered", gen=2)]


@pytest.mark.parametrize(("event", "pins", "more"), [
    ("abort", ReleasePins((7,), True, None), [Send(C, wm.AbortAck(gen=1, kv_request_id="s", round=0)),
                                              CloseLookup(C, "s", 0)]),
    ("offer_deadline", ReleasePins((7,), False, Reason.OFFER_EXPIRED), [done(0, "offer_expired")]),
    ("drain", ReleasePins((7,), False, Reason.DRAINED), [done(0, "drained"), CloseLookup(C, "s", 0)]),
    ("shutdown", ReleasePins((7,), False, Reason.SHUTDOWN), [done(0, "shutdown"), CloseLookup(C, "s", 0)]),
    ("peer_lost", ReleasePins((7,), False, Reason.PEER_LOST), [CloseLookup(C, "s", 0)]),
])
def test_every_way_out_of_an_offer_releases_its_pins_once_with_its_reason(event: str, pins: ReleasePins,
                                                                          more: list[Any]) -> None:
    p = producer()
    offered(p)
    inp: dict[str, Any] = {
        "abort": ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=0, fetched=False, offered=True)),
        "drain": ix.DrainStarted(), "shutdown": ix.ShutdownStarted(), "peer_lost": ix.ConnectionClosed(C)}
    out = p.fire(5.0) if event == "offer_deadline" else p.handle(inp[event], 1.0)
    assert [e for e in out if isinstance(e, (ReleasePins, Send, CloseLookup))] == [pins, *more]
    assert state(p) is ServeState.ABSENT and p.snapshot().serve_pinned_blocks == 0


@pytest.mark.parametrize(("how", "answer"), [
    ("abort", Send(C, wm.AbortAck(gen=1, kv_request_id="s", round=0))),
    ("timeout", done(0, "transfer_timeout")),
])
def test_a_cancelled_transfer_releases_its_pins_failed_only_once_the_plane_lets_go(how: str, answer: Send) -> None:
    p = producer()
    offered(p)
    p.handle(ix.Received(C, wm.Fetch(gen=1, kv_request_id="s", round=0, keys=[K1], offered=True)), 0.1)
    if how == "abort":
        out = p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=0, fetched=True,
                                                    offered=True)), 0.2)
    else:
        out = p.fire(0.1 + 3.0)  # transfer_timeout_s
    assert out == [CancelTransfer(transfer_key(C, "s"), 0)] and state(p) is ServeState.CANCELLING
    reason = Reason.ABORTED if how == "abort" else Reason.TRANSFER_TIMEOUT
    assert p.handle(ix.TransferReleased(transfer_key(C, "s"), 0), 3.5) == [ReleasePins((7,), False, reason), answer]


def test_a_release_for_no_served_round_is_dropped_as_stale() -> None:
    p = producer()
    assert p.handle(ix.TransferReleased(transfer_key(C, "s"), 0), 0.0) == [
        Ignored("serve", transfer_key(C, "s"), ServeState.ABSENT, "transfer_released", Reason.STALE)]
    offered(p)  # an offered round references no blocks of the plane's yet
    assert p.handle(ix.TransferReleased(transfer_key(C, "s"), 0, failed=True), 0.0) == [
        Ignored("serve", transfer_key(C, "s"), ServeState.ABSENT, "transfer_failed", Reason.STALE)]


def _serving(p: TierCore) -> None:
    offered(p)
    p.handle(ix.Received(C, wm.Fetch(gen=1, kv_request_id="s", round=0, keys=[K1], offered=True)), 0.1)
    assert state(p) is ServeState.SERVING


def test_a_transfer_the_plane_failed_releases_its_pins_failed_and_says_so() -> None:
    p = producer()
    _serving(p)
    out = p.handle(ix.TransferReleased(transfer_key(C, "s"), 0, failed=True), 0.2)
    assert out == [ReleasePins((7,), False, Reason.TRANSFER_FAILED), done(0, "transfer_failed")]


@pytest.mark.parametrize(("how", "answer"), [("timeout", done(0, "transfer_timeout")), ("close", done(0, "shutdown"))])
def test_a_delivered_transfer_without_its_receipt_ends_failed(how: str, answer: Send) -> None:
    p = producer()
    _serving(p)
    p.handle(ix.TransferReleased(transfer_key(C, "s"), 0), 0.2)  # delivering: the receipt is due
    out = p.fire(0.1 + 3.0) if how == "timeout" else p.handle(ix.GraceEnded(), 0.5)
    reason = Reason.TRANSFER_TIMEOUT if how == "timeout" else Reason.SHUTDOWN
    assert [e for e in out if isinstance(e, ReleasePins) or (isinstance(e, Send) and e.peer == C
                                                              and isinstance(e.msg, wm.TransferDone))] == [
        ReleasePins((7,), False, reason), answer]


def test_a_second_receipt_of_a_confirmed_round_is_dropped_as_stale() -> None:
    p = producer()
    _serving(p)
    p.handle(ix.Received(C, wm.Receipt(gen=1, kv_request_id="s", round=0)), 0.2)
    out = p.handle(ix.Received(C, wm.Receipt(gen=1, kv_request_id="s", round=0)), 0.3)
    assert out == [Ignored("serve", "s", ServeState.CONFIRMED, "stale", Reason.STALE)]


def test_a_transfer_the_plane_never_releases_quarantines_the_round_and_ends_the_session() -> None:
    # cancel_deadline: the session is ended (transfer_stalled) to force the plane to let go
    p = producer(shutdown_grace_s=2.0)
    _serving(p)
    p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=0, fetched=True, offered=True)), 0.2)
    out = p.fire(0.2 + 10.0)  # transfer_timeout's cancel deadline: the plane still holds the blocks
    assert state(p) is ServeState.QUARANTINED
    assert [e for e in out if isinstance(e, (Send, SessionEnded))] == [
        Send(C, wm.Disconnect(gen=1, reason="transfer_stalled"), ends_session=False),
        SessionEnded(C, Reason.TRANSFER_STALLED, False, C)]
    assert CoreView(p).pins_held() == frozenset({7})  # still referenced: the pins wait for the release
    out = p.handle(ix.TransferReleased(transfer_key(C, "s"), 0), 11.0)  # no receipt came: the pins fail
    assert out == [ReleasePins((7,), False, Reason.ABORTED), Send(C, wm.AbortAck(gen=1, kv_request_id="s", round=0))]


def test_a_round_whose_lookup_ends_with_nothing_new_keeps_its_earlier_offer() -> None:
    p = producer()
    probe(p, [K1, K2])
    p.handle(ix.LookupAnswered(C, "s", 0, found=(K1,), blocks=(20,), pin=7, pending=(K2,)), 0.1)
    out = p.handle(ix.LookupAnswered(C, "s", 0, missing=(K2,)), 0.2)
    assert out == [reply(0, [K1, K2], [True, False]), CloseLookup(C, "s", 0)]
    assert state(p) is ServeState.OFFERED and CoreView(p).pins_held() == frozenset({7})


def test_the_blocks_pinned_count_falls_back_to_zero_when_a_round_of_two_pins_ends() -> None:
    p = producer()
    offered(p)
    probe(p, [K3], now=0.2)
    p.handle(ix.LookupAnswered(C, "s", 0, found=(K3,), blocks=(22,), pin=8), 0.3)
    assert p.snapshot().serve_pinned_blocks == 2
    out = p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=0, fetched=False, offered=True)), 0.4)
    assert out[0] == ReleasePins((7, 8), True, None)
    assert p.snapshot().serve_pinned_blocks == 0
    assert probe(p, [K1, K2, K3], 1, 0.5) == [LookUpBlocks(C, "s", 1, (K1, K2, K3))]  # the whole budget again


def test_a_round_that_pinned_nothing_leaves_the_peers_budget_whole() -> None:
    p = producer()  # serve_max_pinned_blocks_per_peer 3
    probe(p, [K1])
    p.handle(ix.LookupAnswered(C, "s", 0, missing=(K1,)), 0.1)  # nothing found: the round ends
    assert probe(p, [K1, K2, K3], 1, 0.2) == [LookUpBlocks(C, "s", 1, (K1, K2, K3))]


def test_the_peers_budget_keeps_the_blocks_its_other_rounds_still_pin() -> None:
    p = producer()  # serve_max_pinned_blocks_per_peer 3
    offered(p, 0, pin=7)  # round 0 pins K1
    probe(p, [K3], 1)
    p.handle(ix.LookupAnswered(C, "s", 1, found=(K3,), blocks=(22,), pin=8), 0.1)  # round 1 pins K3
    p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=1, fetched=False, offered=True)), 0.2)
    assert probe(p, [K2, K4, bytes(8)], 2, 0.3) == [LookUpBlocks(C, "s", 2, (K2, K4, bytes(8)))]
    assert p.serve_room(C, "s", 2).fits((21, 23, 24)) == 2  # 1 still pinned


def test_when_a_peers_session_dies_every_round_of_it_still_open_is_released() -> None:
    p = producer()
    offered(p, 0, pin=7)
    offered(p, 1, pin=8)
    p.handle(ix.Received(C, wm.AbortFetch(gen=1, kv_request_id="s", round=0, fetched=False, offered=True)), 0.1)
    out = p.handle(ix.ConnectionClosed(C), 0.2)
    assert [e for e in out if isinstance(e, ReleasePins)] == [ReleasePins((8,), False, Reason.PEER_LOST)]
    assert CoreView(p).pins_held() == frozenset() and CoreView(p).serve_ids() == []


def test_served_blocks_are_digested_as_they_are_sent() -> None:
    # the engine's blocks carry no parked digest: the shell takes each one's at send time
    p = producer()
    offered(p)
    out = p.handle(ix.Received(C, wm.Fetch(gen=1, kv_request_id="s", round=0, keys=[K1], offered=True)), 0.1)
    (sb,) = [e for e in out if isinstance(e, SendBlocks)]
    assert sb.take_digests is True and sb.digests == ()


@pytest.mark.parametrize(("ending", "reason"), [(ix.GraceEnded(), Reason.SHUTDOWN),
                                                (ix.ConnectionClosed(C), Reason.PEER_LOST)],
                         ids=["close", "session_dies"])
def test_an_ending_mid_transfer_cancels_it_and_bounds_its_release(ending, reason) -> None:
    """The manager's close (its grace ended) or the session dying while a round's blocks move."""
    p = producer()
    _serving(p)
    view = CoreView(p).serve(C, "s", 0)
    assert (view.receipt, view.demand, view.pins) == (False, (K1,), (7,))
    out = p.handle(ending, 1.0)
    assert [e for e in out if isinstance(e, CancelTransfer)] == [CancelTransfer(transfer_key(C, "s"), 0)]
    view = CoreView(p).serve(C, "s", 0)
    assert (view.state, view.reason, view.deadline) == (ServeState.CANCELLING, reason, 1.0 + 3.0)


def test_a_late_release_of_an_ended_rounds_transfer_never_reaches_a_new_round_of_the_same_number() -> None:
    # a consumer that restarted numbers its rounds from 0 again: the old transfer's key is forgotten
    p = producer()
    _serving(p)
    p.handle(ix.TransferReleased(transfer_key(C, "s"), 0), 0.2)
    p.handle(ix.Received(C, wm.Receipt(gen=1, kv_request_id="s", round=0)), 0.3)  # the round ended
    offered(p, 0, pin=9, now=1.0)  # round 0 again
    out = p.handle(ix.TransferReleased(transfer_key(C, "s"), 0), 1.1)
    assert out == [Ignored("serve", transfer_key(C, "s"), ServeState.ABSENT, "transfer_released", Reason.STALE)]
    assert state(p) is ServeState.OFFERED and CoreView(p).pins_held() == frozenset({9})
