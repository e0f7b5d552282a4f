"""The session machine through the core, effect by effect: what a refused hello names, what our
hello and hello_ack carry, how each failed dial ends, liveness (pings, pongs, silence exactly at
``peer_timeout_s``), goodbyes, and which endings prove a producer instance gone (decisions I7,
I18, I23) — each checked against the exact effects a shell performs.

A consumer (the dialling side) and a producer (the side a hello reaches) are driven by hand, so
each message and transport event arrives exactly when the test says.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kvtier.lifecycle import Reason, SessionState, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.effects import (
    AttachPeer,
    CloseConnection,
    DetachPeer,
    JobDone,
    OpenConnection,
    Send,
    SessionEnded,
)
from kvtier.lifecycle.session import HelloInput, RoundLedger, SessionMachine
from kvtier.wire import messages as wm
from tools.coreview import CoreView

V = wm.PROTOCOL_VERSION
LOCAL = HelloInput(version=V, block_bytes=16, layout="sessions", hash_seed="seed-a", instance="me",
                   descriptor=b"my-window")
DURATIONS = {k: 10.0 for k in TIMER_KEYS} | {"heartbeat_interval_s": 4.0, "peer_timeout_s": 9.0}
P = "prefill:1"


def core(local: HelloInput = LOCAL, *, gen_base: int = 100, **kw: Any) -> TierCore:
    return TierCore(CoreSettings(durations=DURATIONS, **kw), local, gen_base=gen_base)


def of(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def sends(effects: list[Any]) -> list[Send]:
    return of(effects, Send)


def hello(gen: int = 7, **over: Any) -> wm.Hello:
    fields = {"gen": gen, "version": V, "instance": "peer-inst", "block_bytes": 16, "layout": "sessions",
              "hash_seed": "seed-a"}
    return wm.Hello(**(fields | over))


def inbound(p: TierCore, peer: str = "c1", gen: int = 7, now: float = 0.0, **over: Any) -> list[Any]:
    """A compatible hello from ``peer`` and the data plane taking its descriptor."""
    out = p.handle(ix.Received(peer, hello(gen, **over)), now)
    return out + p.handle(ix.PeerAttached(peer, gen), now)


def dial(c: TierCore, peer: str = P, now: float = 0.0, *, instance: str = "prod-1", check: bool = True) -> int:
    """A ready dialled session to ``peer`` whose hello_ack names ``instance``; returns its gen."""
    (opened,) = c.handle(ix.Dial(peer), now)
    c.handle(ix.ConnectionUp(peer), now)
    c.handle(ix.Received(peer, wm.HelloAck(gen=opened.gen, instance=instance)), now)
    c.handle(ix.PeerAttached(peer, opened.gen), now)
    assert not check or CoreView(c).session_ready(peer)
    return opened.gen


def load(c: TierCore, kid: str, job: int, now: float, peer: str = P) -> list[Any]:
    out = c.handle(ix.LoadAnnounced(kid, peer), now)
    return out + c.handle(ix.LoadSubmitted(kid, job, (b"k0",), (5,)), now)


def refused_after_close(c: TierCore, instance: str = "prod-1", peer: str = P) -> None:
    """A ready session to ``peer`` (``instance``) closes, and the redial is refused: proof that
    ``instance`` is gone (decision I23)."""
    dial(c, peer, instance=instance)
    c.handle(ix.ConnectionClosed(peer), 1.0)
    c.handle(ix.Dial(peer), 2.0)
    c.handle(ix.ConnectFailed(peer, "refused"), 2.0)
    assert instance in CoreView(c).suspect_instances()


# -- a hello refused ---------------------------------------------------------------------------

MISMATCHES = [  # (our hello, their hello's fields, the field named, ours, theirs)
    (msgspec.structs.replace(LOCAL, version=V + 1), {"layout": "x"}, "version", str(V + 1), str(V)),
    (LOCAL, {"block_bytes": 32, "layout": "x"}, "block_bytes", "16", "32"),
    (LOCAL, {"layout": "other", "hash_seed": "b"}, "layout", "sessions", "other"),
    (LOCAL, {"hash_seed": "guess", "data_plane": "nixl"}, "hash_seed", "", ""),  # a seed is never echoed
    (LOCAL, {"data_plane": "nixl", "digest": "none"}, "data_plane", "zmq", "nixl"),
    (LOCAL, {"digest": "none"}, "digest", "xxh3_64", "none"),
]


@pytest.mark.parametrize(("local", "theirs", "field", "ours_text", "theirs_text"), MISMATCHES,
                         ids=[m[2] for m in MISMATCHES])
def test_a_hello_that_differs_is_refused_naming_the_first_field_and_both_values(
        local: HelloInput, theirs: dict[str, Any], field: str, ours_text: str, theirs_text: str) -> None:
    # the hash seed keys every block hash: a refusal names that field but never our value
    p = core(local)
    out = p.handle(ix.Received("c1", hello(7, **theirs)), 0.0)
    assert out == [Send("c1", wm.HelloReject(gen=7, reason="handshake_mismatch", field=field, ours=ours_text,
                                             theirs=theirs_text), ends_session=False)]
    assert CoreView(p).session("c1") is None


def test_a_compatible_hello_is_attached_then_acknowledged_with_our_instance_and_descriptor() -> None:
    p = core()
    out = p.handle(ix.Received("c1", hello(7, descriptor=b"their-window"), principal="alice"), 0.0)
    assert out == [AttachPeer("c1", 7, b"their-window", False)]
    out = p.handle(ix.PeerAttached("c1", 7), 0.5)
    assert out == [Send("c1", wm.HelloAck(gen=7, instance="me", descriptor=b"my-window"))]
    v = CoreView(p).session("c1")
    assert (v.state, v.gen, v.dialled, v.instance, v.principal, v.heard) == (
        SessionState.READY, 7, False, "peer-inst", "alice", 0.5)
    # the same hello again (a duplicate) is acknowledged again; the session stays
    out = p.handle(ix.Received("c1", hello(7)), 1.0)
    assert out == [Send("c1", wm.HelloAck(gen=7, instance="me", descriptor=b"my-window"))]


def test_an_unauthenticated_peer_is_known_by_the_instance_its_hello_names() -> None:
    p = core()
    inbound(p, "c1", 7)
    assert CoreView(p).session("c1").principal == "peer-inst"


def test_at_max_peers_a_new_hello_is_refused_naming_the_limit_and_the_count_it_would_make() -> None:
    p = core(max_peers=2)
    inbound(p, "c1", 7)
    inbound(p, "c2", 8)
    out = p.handle(ix.Received("c3", hello(9)), 1.0)  # both worked within handshake_timeout_s: none evicted
    assert out == [Send("c3", wm.HelloReject(gen=9, reason="too_many_peers", field="max_peers", ours="2",
                                             theirs="3"), ends_session=False)]
    assert [v.peer for v in CoreView(p).sessions()] == ["c1", "c2"]


def test_a_descriptor_the_plane_refuses_refuses_the_hello_naming_the_descriptor() -> None:
    p = core()
    p.handle(ix.Received("c1", hello(7)), 0.0)
    out = p.handle(ix.AttachRefused("c1", 7, "not our pool"), 0.5)
    assert out == [
        Send("c1", wm.HelloReject(gen=7, reason="handshake_mismatch", field="descriptor", ours="", theirs=""),
             ends_session=False),
        SessionEnded("c1", Reason.HANDSHAKE_MISMATCH, False, "peer-inst"),
        DetachPeer("c1"),
    ]
    assert CoreView(p).session("c1") is None


@pytest.mark.parametrize("detail, reason", [(ix.STILL_HELD, Reason.SESSION_STILL_HELD), (ix.SELF, Reason.SELF_FETCH)])
def test_a_descriptor_refused_for_a_cause_not_a_mismatch_ends_both_sides_with_that_cause(detail, reason) -> None:
    """The plane refuses a consumer's descriptor because an earlier session of it still holds its
    agent here (session_still_held: an outside tester saw N25's redials counted as mismatches), or
    because it names our own agent (self_fetch: a tier that dialled itself, N26): the refusal says
    so, not handshake_mismatch, and the consumer's session ends with that reason too."""
    p = core()
    p.handle(ix.Received("c1", hello(7)), 0.0)
    out = p.handle(ix.AttachRefused("c1", 7, detail), 0.5)
    reject = wm.HelloReject(gen=7, reason=reason.value, field="descriptor", ours=detail, theirs="")
    assert out == [Send("c1", reject, ends_session=False), SessionEnded("c1", reason, False, "peer-inst"),
                   DetachPeer("c1")]
    c = core()
    (opened,) = c.handle(ix.Dial(P), 0.0)
    c.handle(ix.ConnectionUp(P), 0.0)
    reject = wm.HelloReject(gen=opened.gen, reason=reason.value, field="descriptor", ours=detail, theirs="")
    out = c.handle(ix.Received(P, reject), 0.1)
    assert of(out, SessionEnded) == [SessionEnded(P, reason, True, "")]
    assert CoreView(c).suspect_instances() == frozenset()  # it proves nothing about the producer


def test_a_message_without_a_session_is_answered_that_the_session_is_unknown() -> None:
    p = core()
    out = p.handle(ix.Received("c9", wm.Ping(gen=41, t=3.0)), 0.0)
    assert out == [Send("c9", wm.Disconnect(gen=41, reason="peer_disconnected"), ends_session=False)]
    out = p.handle(ix.Received("c9", wm.Fetch(gen=42, kv_request_id="A", round=0, keys=[b"k"])), 0.0)
    assert out == [Send("c9", wm.Disconnect(gen=42, reason="peer_disconnected"), ends_session=False)]
    assert CoreView(p).sessions() == []


# -- dialling ----------------------------------------------------------------------------------

def test_a_dial_opens_a_connection_and_the_hello_carries_our_fields_and_the_sessions_window() -> None:
    c = core(gen_base=100)
    assert c.handle(ix.Dial(P), 0.0) == [OpenConnection(P, 101)]
    out = c.handle(ix.ConnectionUp(P, descriptor=b"window-101"), 0.0)
    assert out == [Send(P, wm.Hello(gen=101, version=V, instance="me", block_bytes=16, layout="sessions",
                                    hash_seed="seed-a", data_plane="zmq", digest="xxh3_64",
                                    descriptor=b"window-101", replaces=0))]
    out = c.handle(ix.Received(P, wm.HelloAck(gen=101, instance="prod-1", descriptor=b"theirs")), 0.1)
    assert out == [AttachPeer(P, 101, b"theirs", True)]
    assert c.handle(ix.PeerAttached(P, 101), 0.2) == []
    v = CoreView(c).session(P)
    assert (v.state, v.gen, v.dialled, v.instance, v.heard) == (SessionState.READY, 101, True, "prod-1", 0.2)


def test_a_plane_without_per_session_windows_sends_the_pools_descriptor() -> None:
    c = core(msgspec.structs.replace(LOCAL, data_plane="nixl", digest="none"))
    c.handle(ix.Dial(P), 0.0)
    (s,) = sends(c.handle(ix.ConnectionUp(P), 0.0))
    assert (s.msg.descriptor, s.msg.data_plane, s.msg.digest) == (b"my-window", "nixl", "none")


def test_a_redial_names_the_generation_it_replaces_and_takes_a_new_one() -> None:
    c = core(gen_base=100)
    gen = dial(c)
    c.handle(ix.ConnectionClosed(P), 1.0)
    assert c.handle(ix.Dial(P), 2.0) == [OpenConnection(P, gen + 1)]
    (s,) = sends(c.handle(ix.ConnectionUp(P), 2.0))
    assert (s.msg.gen, s.msg.replaces) == (gen + 1, gen)
    # an inbound session's end is not ours to replace: another address starts from nothing
    c.handle(ix.Dial("prefill:2"), 3.0)
    (s,) = sends(c.handle(ix.ConnectionUp("prefill:2"), 3.0))
    assert s.msg.replaces == 0


def test_generations_wrap_within_the_wires_63_bits() -> None:
    c = core(gen_base=(1 << 63) - 2)
    assert c.handle(ix.Dial(P), 0.0) == [OpenConnection(P, (1 << 63) - 1)]
    assert c.handle(ix.Dial("prefill:2"), 0.0) == [OpenConnection("prefill:2", 0)]


@pytest.mark.parametrize(("failure", "reason"), [
    (ix.ConnectFailed(P, "refused"), Reason.CONNECT_REFUSED),
    (ix.ConnectFailed(P, "no answer", timed_out=True), Reason.CONNECT_TIMEOUT),
    (ix.ConnectFailed(P, "not in allowed_peers", not_allowed=True), Reason.PEER_NOT_ALLOWED),
    (ix.ConnectFailed(P, "cannot resolve", unresolved=True), Reason.UNRESOLVED_HOST),
    (ix.ConnectFailed(P, "curve", auth_failed=True), Reason.AUTH_FAILED),
], ids=["refused", "timed_out", "not_allowed", "unresolved", "auth_failed"])
def test_a_failed_dial_ends_the_session_and_its_loads_with_what_went_wrong(failure: Any, reason: Reason) -> None:
    c = core()
    load(c, "A", 1, 0.0)
    out = c.handle(failure, 0.5)
    assert of(out, CloseConnection) == [CloseConnection(P)]
    assert of(out, SessionEnded) == [SessionEnded(P, reason, True, "")]
    assert of(out, DetachPeer) == [DetachPeer(P)]
    assert of(out, JobDone) == [JobDone(1, False, reason)]
    assert CoreView(c).session(P) is None and CoreView(c).suspect_instances() == frozenset()


# -- liveness -----------------------------------------------------------------------------------

def test_the_dialled_side_pings_each_interval_and_ends_a_peer_silent_for_exactly_peer_timeout() -> None:
    c = core()
    gen = dial(c)  # heard at 0.0
    assert sends(c.fire(4.0)) == [Send(P, wm.Ping(gen=gen, t=4.0), ends_session=False)]
    assert sends(c.fire(8.0)) == [Send(P, wm.Ping(gen=gen, t=8.0), ends_session=False)]
    assert c.handle(ix.Received(P, wm.Pong(gen=gen, t=8.0)), 8.5) == []
    assert CoreView(c).session(P).heard == 8.5
    out = c.fire(12.0)  # heard 3.5 s ago
    assert sends(out) == [Send(P, wm.Ping(gen=gen, t=12.0), ends_session=False)]
    assert c.fire(15.9) == []  # the next heartbeat is due at 16.0
    out = c.fire(16.0)
    assert sends(out) == [Send(P, wm.Ping(gen=gen, t=16.0), ends_session=False)]
    out = c.fire(20.0)  # 11.5 s silent: over peer_timeout_s
    assert sends(out) == [Send(P, wm.Disconnect(gen=gen, reason="peer_timeout"), ends_session=False)]
    assert of(out, CloseConnection) == [CloseConnection(P)]
    assert of(out, SessionEnded) == [SessionEnded(P, Reason.PEER_TIMEOUT, True, "prod-1")]


@pytest.mark.parametrize(("heard", "ends"), [(3.0, True), (3.25, False)])
def test_silence_ends_a_session_at_exactly_peer_timeout_and_not_before(heard: float, ends: bool) -> None:
    p = core()
    inbound(p, "c1", 7, now=0.0)  # the heartbeat checks at 4, 8, 12...
    p.handle(ix.Received("c1", wm.Ping(gen=7, t=heard)), heard)
    assert p.fire(8.0) == []
    out = p.fire(12.0)  # 9.0 s (peer_timeout_s) or 8.75 s silent
    assert of(out, SessionEnded) == ([SessionEnded("c1", Reason.PEER_TIMEOUT, False, "peer-inst")] if ends else [])
    assert CoreView(p).session_ready("c1") is not ends


def test_a_ping_is_answered_with_its_own_generation_and_time() -> None:
    p = core()
    inbound(p, "c1", 7)
    out = p.handle(ix.Received("c1", wm.Ping(gen=7, t=123.25)), 1.0)
    assert out == [Send("c1", wm.Pong(gen=7, t=123.25), ends_session=False)]
    assert CoreView(p).session("c1").heard == 1.0


# -- endings ------------------------------------------------------------------------------------

def test_a_plane_fault_says_goodbye_and_lets_it_leave_for_the_shutdown_grace() -> None:
    c = core(shutdown_grace_s=2.5)
    gen = dial(c)
    out = c.handle(ix.PlaneFaulted(P, gen, "remote disconnect"), 1.0)
    assert out == [
        Send(P, wm.Disconnect(gen=gen, reason="plane_fault"), ends_session=False),
        CloseConnection(P, 2.5),
        SessionEnded(P, Reason.PLANE_FAULT, True, "prod-1"),
        DetachPeer(P),
    ]


@pytest.mark.parametrize(("said", "reason"), [
    ("shutdown", Reason.SHUTDOWN),
    ("transfer_stalled", Reason.TRANSFER_STALLED),
    ("abort_unacknowledged", Reason.ABORT_UNACKNOWLEDGED),
    ("peer_timeout", Reason.PEER_TIMEOUT),
    ("idle_evicted", Reason.IDLE_EVICTED),
    ("peer_restarted", Reason.PEER_RESTARTED),
    ("plane_fault", Reason.PLANE_FAULT),
    ("peer_disconnected", Reason.PEER_DISCONNECTED),
    ("load_timeout", Reason.PEER_DISCONNECTED),  # a reason that does not end sessions
    ("", Reason.PEER_DISCONNECTED),
])
def test_a_goodbye_ends_the_session_with_the_reason_it_gives_or_as_a_disconnect(said: str, reason: Reason) -> None:
    c = core()
    gen = dial(c)
    load(c, "A", 1, 0.5)
    out = c.handle(ix.Received(P, wm.Disconnect(gen=gen, reason=said)), 1.0)
    assert of(out, CloseConnection) == [CloseConnection(P)]
    assert of(out, SessionEnded) == [SessionEnded(P, reason, True, "prod-1")]
    # the load fails with that reason once the plane proves the producer can no longer write
    assert of(c.handle(ix.AccessRevoked(P), 1.0), JobDone) == [JobDone(1, False, reason)]


def test_a_goodbye_ends_an_inbound_session_too() -> None:
    p = core()
    inbound(p, "c1", 7)
    out = p.handle(ix.Received("c1", wm.Disconnect(gen=7, reason="shutdown")), 1.0)
    assert of(out, SessionEnded) == [SessionEnded("c1", Reason.SHUTDOWN, False, "peer-inst")]


# -- proof that an instance is gone ---------------------------------------------------------------

def test_a_refused_dial_proves_the_instance_gone_and_fails_new_loads_at_once_until_it_is_heard() -> None:
    c = core()
    dial(c, P, instance="prod-1")
    dial(c, "prefill:2", instance="prod-1")  # a second address of the same instance
    c.handle(ix.ConnectionClosed(P), 1.0)  # proves nothing
    assert CoreView(c).suspect_instances() == frozenset()
    c.handle(ix.Dial(P), 2.0)
    out = c.handle(ix.ConnectFailed(P, "refused"), 2.1)  # nothing listens there: prod-1 is gone
    assert of(out, SessionEnded) == [SessionEnded(P, Reason.CONNECT_REFUSED, True, "prod-1")]
    assert CoreView(c).suspect_instances() == frozenset({"prod-1"})
    # the other session of prod-1 is still up, but a load on it fails at once
    assert of(load(c, "A", 1, 3.0, "prefill:2"), JobDone) == [JobDone(1, False, Reason.INSTANCE_DOWN)]
    # a fresh dial to the refused address does not inherit the fate: its load waits for the dial,
    # and a second refusal fails it (decision I30)
    out = load(c, "B", 2, 3.5)
    assert of(out, JobDone) == [] and of(out, OpenConnection)
    out = c.handle(ix.ConnectFailed(P, "refused"), 3.51)
    assert of(out, JobDone) == [JobDone(2, False, Reason.CONNECT_REFUSED)]
    # prod-1 heard again (a pong on the second address): loads go out again
    gen2 = CoreView(c).session_gen("prefill:2")
    c.handle(ix.Received("prefill:2", wm.Pong(gen=gen2, t=4.0)), 4.0)
    assert CoreView(c).suspect_instances() == frozenset()
    out = load(c, "C", 3, 4.5, "prefill:2")
    assert of(out, JobDone) == [] and [s.msg.kv_request_id for s in sends(out)] == ["C"]


def test_an_instance_name_claimed_at_another_host_shares_no_fate() -> None:
    """An instance name is only a claim: a peer at another host answering with the live producer's
    name, then refusing a redial (it served once and closed), proves nothing about the producer,
    whose loads go out (they failed instance_down until it was heard again, an attacker's to
    repeat at will); a sibling at another port of the producer's own host still shares its fate
    (B11, decision I33)."""
    c = core()
    dial(c, "10.0.0.5:5710", instance="prod")
    dial(c, "10.0.0.66:5710", instance="prod")  # the claim
    c.handle(ix.ConnectionClosed("10.0.0.66:5710"), 1.0)
    c.handle(ix.Dial("10.0.0.66:5710"), 2.0)
    c.handle(ix.ConnectFailed("10.0.0.66:5710", "refused"), 2.1)
    assert CoreView(c).suspect_fates() == frozenset({"prod@10.0.0.66"})
    out = load(c, "A", 1, 3.0, "10.0.0.5:5710")
    assert of(out, JobDone) == [] and [s.msg.kv_request_id for s in sends(out)] == ["A"]
    refused_after_close(c, instance="prod", peer="10.0.0.5:5711")  # a sibling rank of the producer's host
    assert of(load(c, "B", 2, 3.0, "10.0.0.5:5710"), JobDone) == [JobDone(2, False, Reason.INSTANCE_DOWN)]


def test_a_hello_ack_naming_another_instance_proves_the_old_one_restarted() -> None:
    c = core()
    dial(c, P, instance="prod-1")
    dial(c, "prefill:2", instance="prod-1")
    c.handle(ix.ConnectionClosed(P), 1.0)
    assert CoreView(c).suspect_instances() == frozenset()
    dial(c, P, 2.0, instance="prod-2")  # the address answers for another instance now
    assert CoreView(c).suspect_instances() == frozenset({"prod-1"})
    assert of(load(c, "A", 1, 3.0, "prefill:2"), JobDone) == [JobDone(1, False, Reason.INSTANCE_DOWN)]
    out = load(c, "B", 2, 3.0, P)  # the new instance serves
    assert of(out, JobDone) == [] and [s.msg.kv_request_id for s in sends(out)] == ["B"]
    # the same instance answering again proves nothing
    c.handle(ix.ConnectionClosed(P), 4.0)
    dial(c, P, 5.0, instance="prod-2")
    assert CoreView(c).suspect_instances() == frozenset({"prod-1"})


def test_a_disconnect_a_timeout_or_silence_proves_nothing() -> None:
    c = core()
    gen = dial(c, P, instance="prod-1")
    c.handle(ix.Received(P, wm.Disconnect(gen=gen, reason="shutdown")), 1.0)
    c.handle(ix.Dial(P), 2.0)
    c.handle(ix.ConnectFailed(P, "no answer", timed_out=True), 3.0)
    c.handle(ix.Dial(P), 4.0)
    c.fire(14.0)  # the handshake deadline
    assert CoreView(c).suspect_instances() == frozenset()
    out = load(c, "A", 1, 15.0)
    assert of(out, JobDone) == [] and of(out, OpenConnection) == [OpenConnection(P, CoreView(c).session_gen(P))]


def test_a_hello_of_another_generation_on_a_ready_session_is_a_restart() -> None:
    p = core()
    inbound(p, "c1", 7)
    out = p.handle(ix.Received("c1", hello(8, descriptor=b"new-window")), 1.0)
    assert out == [SessionEnded("c1", Reason.PEER_RESTARTED, False, "peer-inst"), DetachPeer("c1"),
                   AttachPeer("c1", 8, b"new-window", False)]
    assert CoreView(p).session("c1").gen == 8


# -- the rounds a consumer closed (decision I11) --------------------------------------------------

def test_a_round_answered_at_the_new_watermark_is_still_refused() -> None:
    # round 5 was answered (its abort overtook its fetch); a later fetch raises the watermark to
    # exactly 5: the overtaken fetch of round 5 arrives last and must not bind
    p = core()
    inbound(p, "c1", 7)
    p.handle(ix.Received("c1", wm.AbortFetch(gen=7, kv_request_id="X", round=5, fetched=True)), 0.1)
    p.handle(ix.Received("c1", wm.Fetch(gen=7, kv_request_id="Y", round=6, keys=[b"y"], low=5)), 0.2)
    p.handle(ix.Received("c1", wm.Fetch(gen=7, kv_request_id="X", round=5, keys=[b"x"], low=5)), 0.3)
    assert CoreView(p).producer("X") is None
    assert CoreView(p).producer("Y") is not None


def test_a_session_remembers_exactly_cap_answered_rounds_above_its_watermark() -> None:
    ledger = RoundLedger()
    for r in range(RoundLedger.CAP):
        ledger.answer(r)
    assert len(ledger.answered) == RoundLedger.CAP and ledger.stale(0)
    ledger.answer(RoundLedger.CAP)  # one more: the oldest is forgotten, the rest stay
    assert len(ledger.answered) == RoundLedger.CAP
    assert not ledger.stale(0) and ledger.stale(1) and ledger.stale(RoundLedger.CAP)


def test_instances_proven_gone_are_remembered_up_to_a_bound_oldest_forgotten_first() -> None:
    # each restart at one address (a hello_ack naming a new instance) proves the previous one gone
    c = core()
    cap = SessionMachine.MAX_SUSPECT
    for i in range(cap + 2):
        dial(c, P, float(i), instance=f"prod-{i}", check=False)
        c.handle(ix.ConnectionClosed(P), float(i))
        if i == cap:  # prod-0 .. prod-(cap-1) condemned: exactly the bound, none forgotten
            assert CoreView(c).suspect_instances() == {f"prod-{j}" for j in range(cap)}
    assert CoreView(c).suspect_instances() == {f"prod-{j}" for j in range(1, cap + 1)}


def test_a_load_on_a_producer_there_is_no_room_to_dial_fails_too_many_peers() -> None:
    c = core(max_peers=1)
    inbound(c, "c1", 7)
    out = load(c, "A", 1, 1.0)
    assert of(out, SessionEnded) == [SessionEnded(P, Reason.TOO_MANY_PEERS, False, "")]
    assert of(out, JobDone) == [JobDone(1, False, Reason.TOO_MANY_PEERS)]
    assert of(out, OpenConnection) == [] and CoreView(c).session(P) is None


def test_a_session_not_yet_heard_reads_as_never_heard_and_a_dialled_one_has_no_principal() -> None:
    c = core()
    c.handle(ix.Dial(P), 0.0)
    v = CoreView(c).session(P)
    assert (v.state, v.heard, v.instance, v.principal) == (SessionState.CONNECTING, 0.0, "", None)
    dial(c, "prefill:2", 1.0)
    assert CoreView(c).session("prefill:2").principal is None


def test_an_undecodable_message_from_a_peer_without_a_session_is_answered_with_generation_0() -> None:
    p = core()
    out = p.handle(ix.Malformed("c9", "bad_payload", "truncated"), 0.0)
    assert out == [Send("c9", wm.Error(gen=0, reason="bad_payload", detail="truncated", kv_request_id=""),
                        ends_session=False)]


def test_an_instance_that_answers_again_is_no_longer_down_while_its_plane_attaches() -> None:
    c = core()
    refused_after_close(c)
    c.handle(ix.Dial(P), 3.0)
    c.handle(ix.ConnectionUp(P), 3.0)
    gen = CoreView(c).session_gen(P)
    c.handle(ix.Received(P, wm.HelloAck(gen=gen, instance="prod-1")), 3.1)  # it answers: not gone
    assert CoreView(c).suspect_instances() == frozenset()
    out = load(c, "A", 1, 3.2)  # queued behind the attach, not failed
    assert of(out, JobDone) == [] and CoreView(c).session_state(P) is SessionState.ATTACHING


@pytest.mark.parametrize("heard", ["hello_ack", "pong"])
def test_an_instance_heard_again_no_longer_takes_room_among_the_gone(heard: str) -> None:
    # A is condemned first, X second; X is then heard again (at another port of its host: a
    # sibling rank shares its fate, decision I33).  cap - 1 more condemnations fill the
    # bookkeeping to exactly its bound: A, the oldest, must still be known gone -- X's entry no
    # longer counts
    c = core()
    cap = SessionMachine.MAX_SUSPECT
    if heard == "pong":  # a session to X at another address, ready before X is condemned
        dial(c, "10.0.0.9:3", instance="X")
    for addr, inst in (("10.0.0.9:1", "A"), ("10.0.0.9:2", "X")):
        dial(c, addr, instance=inst)
        c.handle(ix.ConnectionClosed(addr), 0.0)
        c.handle(ix.Dial(addr), 0.0)
        c.handle(ix.ConnectFailed(addr, "refused"), 0.0)
    assert CoreView(c).suspect_instances() == frozenset({"A", "X"})
    if heard == "hello_ack":  # X answers a redial, then its plane refuses: never ready
        c.handle(ix.Dial("10.0.0.9:2"), 1.0)
        c.handle(ix.ConnectionUp("10.0.0.9:2"), 1.0)
        gen = CoreView(c).session_gen("10.0.0.9:2")
        c.handle(ix.Received("10.0.0.9:2", wm.HelloAck(gen=gen, instance="X")), 1.0)
        c.handle(ix.AttachRefused("10.0.0.9:2", gen), 1.0)
    else:
        c.handle(ix.Received("10.0.0.9:3", wm.Pong(gen=CoreView(c).session_gen("10.0.0.9:3"), t=1.0)), 1.0)
    assert CoreView(c).suspect_instances() == frozenset({"A"})
    for i in range(cap):  # restarts at one address: cap - 1 more instances proven gone
        dial(c, P, 2.0, instance=f"b{i}", check=False)
        c.handle(ix.ConnectionClosed(P), 2.0)
    assert len(CoreView(c).suspect_instances()) == cap
    assert "A" in CoreView(c).suspect_instances()


def test_the_generation_a_redial_replaces_is_remembered_for_the_latest_addresses() -> None:
    c = core()
    cap = SessionMachine.MAX_REMEMBERED

    def session(addr: str) -> tuple[int, int]:
        """Dial ``addr`` and lose the connection: (the session's generation, the one it replaced)."""
        (opened,) = c.handle(ix.Dial(addr), 0.0)
        (s,) = sends(c.handle(ix.ConnectionUp(addr), 0.0))
        c.handle(ix.ConnectionClosed(addr), 0.0)
        return opened.gen, s.msg.replaces

    first, replaced = session("a0")
    assert replaced == 0
    for i in range(1, cap):
        c.handle(ix.Dial(f"a{i}"), 0.0)
        c.handle(ix.ConnectionClosed(f"a{i}"), 0.0)
    # exactly cap addresses remembered: a0 still is (and, dialled again, becomes the newest)
    second, replaced = session("a0")
    assert replaced == first
    c.handle(ix.Dial(f"a{cap}"), 0.0)
    c.handle(ix.ConnectionClosed(f"a{cap}"), 0.0)  # one more: the oldest, a1, is forgotten
    assert session("a1")[1] == 0
    assert session("a0")[1] == second


def test_a_producer_restarted_at_a_refused_address_serves_the_first_load_after_it() -> None:
    """Decision I30: prod-1's address refused a dial (prod-1 is gone); a new instance then listens
    there.  The next load dials and is served by it -- no ``instance_down`` from the old proof."""
    c = core()
    refused_after_close(c)
    out = load(c, "A", 1, 600.0)  # long after: the proof is still held, the dial still waits
    assert of(out, JobDone) == []
    (opened,) = of(out, OpenConnection)
    c.handle(ix.ConnectionUp(P), 600.0)
    c.handle(ix.Received(P, wm.HelloAck(gen=opened.gen, instance="prod-2")), 600.1)
    out = c.handle(ix.PeerAttached(P, opened.gen), 600.1)
    assert [s.msg.kv_request_id for s in sends(out)] == ["A"] and of(out, JobDone) == []
    assert CoreView(c).suspect_instances() == frozenset({"prod-1"})  # the old one stays gone


def test_bytes_of_a_message_still_arriving_are_the_peer_heard() -> None:
    """A producer's large message crosses a slow link for longer than peer_timeout_s and its pongs
    queue behind it: the transport's report that bytes arrived (``PeerProgress``) is the peer
    heard, so the session lives; with nothing arriving it ends at peer_timeout_s (decision T22).
    Progress from a peer with no ready session changes nothing."""
    c = core()
    gen = dial(c)  # heard at 0.0
    for t in (3.0, 6.0, 9.0, 12.0, 15.0, 18.0):
        c.handle(ix.PeerProgress(P), t)
        assert of(c.fire(t + 1.0), SessionEnded) == []
    assert CoreView(c).session(P).heard == 18.0 and CoreView(c).session_ready(P)
    assert of(c.fire(20.0) + c.fire(24.0), SessionEnded) == []  # then nothing at all: pings
    out = c.fire(28.0)  # 10 s silent
    assert of(out, SessionEnded) == [SessionEnded(P, Reason.PEER_TIMEOUT, True, "prod-1")]
    assert sends(out)[-1] == Send(P, wm.Disconnect(gen=gen, reason="peer_timeout"), ends_session=False)
    assert c.handle(ix.PeerProgress("prefill:7"), 29.0) == [] and CoreView(c).session("prefill:7") is None
