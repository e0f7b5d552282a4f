"""How the core answers what a peer sends that it cannot take (decision C10) and what passes the
session gate: a hello of another protocol version is refused naming the version; a message that
did not decode but names a ``kv_request_id`` always gets an ``error`` (its sender fails that
request at once); anything else gets one at most once per (peer, reason) per
``error_reply_interval_s``, from a bounded table; a reason code outside the shared vocabulary
reads as ``peer_error``; a message of another generation never reaches a record.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.lifecycle import Reason, SessionState, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.effects import (
    AttachPeer,
    CancelTransfer,
    CloseConnection,
    DetachPeer,
    Ignored,
    JobDone,
    LandBlocks,
    Send,
    SendBlocks,
    SessionEnded,
)
from kvtier.lifecycle.session import HelloInput
from kvtier.wire import messages as wm
from kvtier.wire.codec import WireReason
from tests.lifecycle.scenario_pair import P as scenario_P
from tests.lifecycle.scenario_pair import Pair
from tools.coreview import CoreView

LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="rx", hash_seed="", instance="me")
DURATIONS = {k: 10.0 for k in TIMER_KEYS} | {"heartbeat_interval_s": 1000.0, "peer_timeout_s": 1000.0}
P = "prefill:1"


def core(**kw: Any) -> TierCore:
    return TierCore(CoreSettings(durations=DURATIONS, error_reply_interval_s=5.0, **kw), LOCAL, gen_base=300)


def error(peer: str, reason: str, detail: str = "", kid: str = "", gen: int = 0) -> Send:
    return Send(peer, wm.Error(gen=gen, reason=reason, detail=detail, kv_request_id=kid), ends_session=False)


def dialled(c: TierCore, peer: str = P) -> int:
    (opened,) = c.handle(ix.Dial(peer), 0.0)
    c.handle(ix.ConnectionUp(peer), 0.0)
    c.handle(ix.Received(peer, wm.HelloAck(gen=opened.gen, instance="prod")), 0.0)
    c.handle(ix.PeerAttached(peer, opened.gen), 0.0)
    return opened.gen


# -- what did not decode ---------------------------------------------------------------------------

@pytest.mark.parametrize(("theirs", "shown"), [("7", "7"), (None, "?")])
def test_a_hello_of_another_protocol_version_is_refused_naming_both_versions(theirs: str | None, shown: str) -> None:
    p = core()
    out = p.handle(ix.Malformed("c1", WireReason.VERSION_MISMATCH, "version 7", msg_type="hello", gen=12,
                                theirs=theirs), 0.0)
    assert out == [Send("c1", wm.HelloReject(gen=12, reason="handshake_mismatch", field="version",
                                             ours=str(wm.PROTOCOL_VERSION), theirs=shown), ends_session=False)]
    assert CoreView(p).sessions() == []


@pytest.mark.parametrize(("msg_type", "gen"), [("fetch", 12), ("hello", None)])
def test_a_version_mismatch_that_is_not_a_readable_hello_gets_an_error(msg_type: str, gen: int | None) -> None:
    p = core()
    out = p.handle(ix.Malformed("c1", WireReason.VERSION_MISMATCH, "v7", msg_type=msg_type, gen=gen), 0.0)
    assert out == [error("c1", "version_mismatch", "v7")]


def test_an_undecodable_message_naming_an_id_is_always_answered_with_the_sessions_generation() -> None:
    c = core()
    gen = dialled(c)
    for t in (1.0, 1.1, 1.2):  # never rate-limited: its sender fails that request at once
        out = c.handle(ix.Malformed(P, WireReason.BAD_FIELD, "round: expected int", kv_request_id="A"), t)
        assert out == [error(P, "bad_field", "round: expected int", "A", gen)]


def test_an_errors_detail_is_cut_to_4096_characters() -> None:
    p = core()
    out = p.handle(ix.Malformed("c1", WireReason.MALFORMED, "x" * 5000, kv_request_id="A"), 0.0)
    assert out == [error("c1", "malformed", "x" * 4096, "A")]


def test_anonymous_errors_go_once_per_peer_and_reason_per_interval() -> None:
    p = core()  # error_reply_interval_s 5.0
    bad = ix.Malformed("c1", WireReason.MALFORMED, "not msgpack")
    assert p.handle(bad, 10.0) == [error("c1", "malformed", "not msgpack")]
    assert p.handle(bad, 14.9) == []  # within the interval: dropped
    assert p.handle(ix.Malformed("c1", WireReason.OVERSIZE, "big"), 14.9) == [error("c1", "oversize", "big")]
    assert p.handle(ix.Malformed("c2", WireReason.MALFORMED, "x"), 14.9) == [error("c2", "malformed", "x")]
    assert p.handle(bad, 15.0) == [error("c1", "malformed", "not msgpack")]  # exactly one interval later
    assert p.handle(bad, 19.9) == []  # the interval counts from the last answer


def test_the_table_of_anonymous_error_replies_is_bounded_and_starts_afresh_when_full() -> None:
    p = core()
    for i in range(4095):
        p.handle(ix.Malformed(f"c{i}", WireReason.MALFORMED, ""), 0.0)
    assert p.handle(ix.Malformed("c0", WireReason.MALFORMED, ""), 1.0) == []  # remembered
    p.handle(ix.Malformed("c4095", WireReason.MALFORMED, ""), 1.0)  # the 4096th: the table is full
    assert p.handle(ix.Malformed("c0", WireReason.MALFORMED, ""), 1.0) == []  # still remembered
    p.handle(ix.Malformed("c4096", WireReason.MALFORMED, ""), 1.0)  # one more: the table starts afresh
    assert p.handle(ix.Malformed("c0", WireReason.MALFORMED, ""), 1.0) == [error("c0", "malformed", "")]


# -- what passes the gate ------------------------------------------------------------------------------

@pytest.mark.parametrize(("said", "reason"), [("bogus_reason", Reason.PEER_ERROR), ("", Reason.TRANSFER_FAILED),
                                              ("aborted", Reason.ABORTED)])
def test_a_failed_transfer_done_is_read_in_the_shared_vocabulary(said: str, reason: Reason) -> None:
    c = core()
    gen = dialled(c)
    c.handle(ix.LoadAnnounced("A", P), 1.0)
    c.handle(ix.LoadSubmitted("A", 4, (b"k",), (3,)), 1.0)
    out = c.handle(ix.Received(P, wm.TransferDone(gen=gen, kv_request_id="A", round=0, ok=False, reason=said)), 1.5)
    assert [(j.job_id, j.ok, j.reason) for j in out if isinstance(j, JobDone)] == [(4, False, reason)]


def test_a_message_of_another_generation_never_reaches_a_record() -> None:
    c = core()
    gen = dialled(c)
    c.handle(ix.LoadAnnounced("A", P), 1.0)
    c.handle(ix.LoadSubmitted("A", 4, (b"k",), (3,)), 1.0)
    out = c.handle(ix.Received(P, wm.TransferDone(gen=gen + 1, kv_request_id="A", round=0, ok=False,
                                                  reason="aborted")), 1.5)
    assert out == [Ignored("session", P, SessionState.READY, "message", Reason.STALE)]
    assert CoreView(c).session(P).heard == 0.0  # not even heard


# -- a peer's error ------------------------------------------------------------------------------------

def _loading(c: TierCore, kid: str, job: int, peer: str = P) -> None:
    c.handle(ix.LoadAnnounced(kid, peer), 1.0)
    c.handle(ix.LoadSubmitted(kid, job, (b"k",), (3,)), 1.0)


def test_a_peers_error_naming_one_of_our_loads_fails_that_load_at_once_with_peer_error() -> None:
    c = core()
    gen = dialled(c)
    _loading(c, "A", 4)
    _loading(c, "B", 5)
    out = c.handle(ix.Received(P, wm.Error(gen=gen, reason="bad_field", detail="round", kv_request_id="A")), 2.0)
    assert [(j.job_id, j.ok, j.reason) for j in out if isinstance(j, JobDone)] == [(4, False, Reason.PEER_ERROR)]
    assert c.consumer_state("B").value == "in_flight"  # the other load is unaffected
    assert CoreView(c).session(P).heard == 2.0


def test_an_undecodable_message_about_a_load_of_ours_from_its_producer_fails_that_load_at_once() -> None:
    """Decision I36: a block_data that did not decode fails the load as corrupt, any other message
    type as the peer's error; the error reply still goes out; only the load's own producer, on its
    session's generation, can end it this way."""
    c = core()
    gen = dialled(c)
    qgen = dialled(c, "prefill:2")
    for kid, job in (("A", 4), ("B", 5), ("C", 6)):
        _loading(c, kid, job)
    ignored = [ix.Malformed("prefill:2", WireReason.BAD_PAYLOAD, "", "block_data", "A", qgen),  # another peer
               ix.Malformed(P, WireReason.BAD_PAYLOAD, "", "block_data", "A", gen + 1),  # another generation
               ix.Malformed(P, WireReason.BAD_PAYLOAD, "", "block_data", "A", None),  # no generation read
               ix.Malformed(P, WireReason.BAD_FIELD, "", "block_data", "Z", gen)]  # no load of ours
    for bad in ignored:
        out = c.handle(bad, 2.0)
        assert not [e for e in out if isinstance(e, JobDone)] and [e for e in out if isinstance(e, Send)], bad
    out = c.handle(ix.Malformed(P, WireReason.BAD_PAYLOAD, "payload 0 is 10 bytes", "block_data", "A", gen), 2.0)
    assert out[0] == error(P, "bad_payload", "payload 0 is 10 bytes", "A", gen)
    assert [(j.job_id, j.ok, j.reason) for j in out if isinstance(j, JobDone)] == [(4, False, Reason.CORRUPT)]
    out = c.handle(ix.Malformed(P, WireReason.BAD_FIELD, "ok: expected bool", "transfer_done", "B", gen), 2.0)
    assert [(j.job_id, j.ok, j.reason) for j in out if isinstance(j, JobDone)] == [(5, False, Reason.PEER_ERROR)]
    assert c.consumer_state("C").value == "in_flight"  # the other load is unaffected


def test_a_peers_error_about_no_load_of_its_own_changes_nothing() -> None:
    c = core()
    gen = dialled(c)
    qgen = dialled(c, "prefill:2")
    _loading(c, "A", 4)
    for peer, msg in (("prefill:2", wm.Error(gen=qgen, reason="bad_field", detail="", kv_request_id="A")),
                      (P, wm.Error(gen=gen, reason="bad_field", detail="", kv_request_id="")),
                      (P, wm.Error(gen=gen, reason="bad_field", detail="", kv_request_id="nobody"))):
        assert c.handle(ix.Received(peer, msg), 2.0) == []
    assert c.consumer_state("A").value == "in_flight"
    out = c.handle(ix.Received(P, wm.Error(gen=gen + 1, reason="bad_field", detail="", kv_request_id="A")), 2.0)
    assert out == [Ignored("session", P, SessionState.READY, "message", Reason.STALE)]


# -- evicting an idle inbound session at max_peers (scenario B22) ---------------------------------------

def _inbound(p: TierCore, peer: str, gen: int, now: float) -> None:
    hello = wm.Hello(gen=gen, version=wm.PROTOCOL_VERSION, instance=peer, block_bytes=16, layout="rx", hash_seed="")
    p.handle(ix.Received(peer, hello), now)
    p.handle(ix.PeerAttached(peer, gen), now)


def _evicted(out: list[Any]) -> list[str]:
    return [e.peer for e in out if type(e).__name__ == "SessionEnded" and e.reason is Reason.IDLE_EVICTED]


def test_the_session_idle_longest_is_evicted_ties_by_peer_id() -> None:
    p = core(max_peers=3)
    _inbound(p, "c1", 1, 2.0)  # did work last at 2.0
    _inbound(p, "c2", 2, 0.0)  # idle longest
    _inbound(p, "c3", 3, 1.0)
    hello = wm.Hello(gen=9, version=wm.PROTOCOL_VERSION, instance="n", block_bytes=16, layout="rx", hash_seed="")
    assert _evicted(p.handle(ix.Received("new", hello), 12.0)) == ["c2"]
    q = core(max_peers=2)
    _inbound(q, "b", 1, 0.0)
    _inbound(q, "a", 2, 0.0)  # the same idle time: the lower peer id goes
    assert _evicted(q.handle(ix.Received("new", hello), 12.0)) == ["a"]


@pytest.mark.parametrize(("active", "now", "evicted"), [(0.0, 10.0, True), (0.0, 9.99, False), (6.0, 11.0, False)])
def test_a_session_is_idle_once_it_did_no_work_for_handshake_timeout(active: float, now: float,
                                                                     evicted: bool) -> None:
    p = core(max_peers=1)  # handshake_timeout_s 10.0
    _inbound(p, "c1", 1, 0.0)
    if active:
        p.handle(ix.Received("c1", wm.AbortFetch(gen=1, kv_request_id="X", round=0, fetched=False)), active)
    hello = wm.Hello(gen=9, version=wm.PROTOCOL_VERSION, instance="n", block_bytes=16, layout="rx", hash_seed="")
    out = p.handle(ix.Received("new", hello), now)
    assert _evicted(out) == (["c1"] if evicted else [])
    assert CoreView(p).session("new") is not None if evicted else CoreView(p).session("new") is None


@pytest.mark.parametrize("work", ["serve", "load", "probe"])
def test_a_session_with_work_bound_to_it_is_never_evicted(work: str) -> None:
    # c1 did its last work first, so it would be the victim if its work did not count
    p = core(max_peers=2, serve_external=True)
    _inbound(p, "c1", 1, 0.0)
    _inbound(p, "c2", 2, 1.0)
    if work == "serve":  # c1 probes our engine's blocks: a serve round of its
        p.handle(ix.Received("c1", wm.Probe(gen=1, kv_request_id="s", round=0, keys=[b"k"])), 0.0)
    elif work == "load":  # we load from c1 over its session
        _loading(p, "L", 7, "c1")
    else:  # we probe c1 over its session
        p.handle(ix.ProbeAnnounced("K", "c1"), 0.0)
    hello = wm.Hello(gen=9, version=wm.PROTOCOL_VERSION, instance="n", block_bytes=16, layout="rx", hash_seed="")
    assert _evicted(p.handle(ix.Received("new", hello), 12.0)) == ["c2"]


# -- handshake answers and goodbyes of another generation ----------------------------------------------

def test_handshake_answers_and_goodbyes_for_another_generation_are_dropped_as_stale() -> None:
    c = core()
    (opened,) = c.handle(ix.Dial(P), 0.0)
    c.handle(ix.ConnectionUp(P), 0.0)
    gen = opened.gen
    other = gen + 1
    reject = wm.HelloReject(gen=other, reason="handshake_mismatch", field="layout", ours="a", theirs="b")
    for peer, msg, st, event in (
            (P, wm.HelloAck(gen=other, instance="prod"), SessionState.HANDSHAKING, "hello_ack"),
            ("nobody", wm.HelloAck(gen=gen, instance="prod"), SessionState.ABSENT, "hello_ack"),
            (P, reject, SessionState.HANDSHAKING, "hello_reject"),
            ("nobody", reject, SessionState.ABSENT, "hello_reject"),
            (P, wm.Disconnect(gen=other, reason="shutdown"), SessionState.HANDSHAKING, "disconnect"),
            (P, wm.Disconnect(gen=1, reason="shutdown"), SessionState.HANDSHAKING, "disconnect"),
            ("nobody", wm.Disconnect(gen=0, reason="shutdown"), SessionState.ABSENT, "disconnect")):
        assert c.handle(ix.Received(peer, msg), 0.5) == [Ignored("session", peer, st, event, Reason.STALE)]
    assert CoreView(c).session_state(P) is SessionState.HANDSHAKING
    for late in (ix.PeerAttached(P, other), ix.PlaneFaulted(P, other)):
        assert len(c.handle(late, 0.5)) == 1 and CoreView(c).session_state(P) is SessionState.HANDSHAKING


def test_a_goodbye_with_generation_0_is_taken_a_peer_that_does_not_know_ours_says_so() -> None:
    c = core()
    dialled(c)
    out = c.handle(ix.Received(P, wm.Disconnect(gen=0, reason="peer_disconnected")), 1.0)
    assert [(e.peer, e.reason) for e in out if type(e).__name__ == "SessionEnded"] == [(P, Reason.PEER_DISCONNECTED)]


# -- a consumer's new session replacing its old one (decision N14) ---------------------------------------

def _hello(gen: int, instance: str = "cons", replaces: int = 0) -> wm.Hello:
    return wm.Hello(gen=gen, version=wm.PROTOCOL_VERSION, instance=instance, block_bytes=16, layout="rx", hash_seed="",
                    replaces=replaces)


def test_a_hello_naming_the_session_it_replaces_ends_that_session_first() -> None:
    p = core(shutdown_grace_s=2.0)
    p.handle(ix.Received("c-old", _hello(5), principal="alice"), 0.0)
    p.handle(ix.PeerAttached("c-old", 5), 0.0)
    out = p.handle(ix.Received("c-new", _hello(6, replaces=5), principal="alice"), 1.0)
    assert out == [
        Send("c-old", wm.Disconnect(gen=5, reason="peer_restarted"), ends_session=False),
        CloseConnection("c-old", 2.0),
        SessionEnded("c-old", Reason.PEER_RESTARTED, False, "cons"),
        DetachPeer("c-old"),
        AttachPeer("c-new", 6, b"", False),
    ]


def test_what_was_bound_to_the_replaced_session_learns_it_is_lost_at_that_moment() -> None:
    p = core()
    p.handle(ix.Received("c-old", _hello(5), principal="alice"), 0.0)
    p.handle(ix.PeerAttached("c-old", 5), 0.0)
    p.handle(ix.Received("c-old", wm.Fetch(gen=5, kv_request_id="A", round=0, keys=[b"k"])), 0.5)  # bound, waits
    p.handle(ix.StoreSubmitted("B", "req-B", 1, (b"b",), (4,)), 0.5)
    p.handle(ix.Received("c-old", wm.Fetch(gen=5, kv_request_id="B", round=1, keys=[b"b"])), 0.5)  # serving
    out = p.handle(ix.Received("c-new", _hello(6, replaces=5), principal="alice"), 1.0)
    view = CoreView(p).producer("A")
    assert (view.state.value, view.reason, view.deadline) == ("tombstoned", Reason.PEER_LOST, 1.0 + 10.0)
    assert CancelTransfer("B", 1) in out  # B's transfer to the old session is cancelled
    assert out[-1] == AttachPeer("c-new", 6, b"", False)


@pytest.mark.parametrize("differs", ["generation", "instance", "principal"])
def test_a_hello_replaces_only_the_session_of_its_generation_instance_and_principal(differs: str) -> None:
    p = core()
    p.handle(ix.Received("c-old", _hello(5), principal="alice"), 0.0)
    p.handle(ix.PeerAttached("c-old", 5), 0.0)
    hello = _hello(6, instance="other" if differs == "instance" else "cons",
                   replaces=4 if differs == "generation" else 5)
    out = p.handle(ix.Received("c-new", hello, principal="bob" if differs == "principal" else "alice"), 1.0)
    assert out == [AttachPeer("c-new", 6, b"", False)]
    assert CoreView(p).session_ready("c-old")


def test_a_hello_never_replaces_a_session_we_dialled() -> None:
    p = core()
    gen = dialled(p, "cons-addr")  # our dial; its hello_ack named instance "prod"
    out = p.handle(ix.Received("c-new", _hello(6, instance="prod", replaces=gen), principal="prod"), 1.0)
    assert out == [AttachPeer("c-new", 6, b"", False)]
    assert CoreView(p).session_ready("cons-addr")


# -- the symmetric path's messages pass the same gate -----------------------------------------------------

def test_probe_messages_from_a_peer_without_a_session_are_answered_that_it_is_unknown() -> None:
    p = core(serve_external=True)
    for msg in (wm.Probe(gen=3, kv_request_id="s", round=0, keys=[b"k"]),
                wm.ProbeReply(gen=3, kv_request_id="s", round=0, keys=[b"k"], hits=[True])):
        out = p.handle(ix.Received("c9", msg), 0.0)
        assert out == [Send("c9", wm.Disconnect(gen=3, reason="peer_disconnected"), ends_session=False)]


def test_a_probe_reply_notes_its_peer_heard() -> None:
    c = core()
    gen = dialled(c)
    c.handle(ix.Received(P, wm.ProbeReply(gen=gen, kv_request_id="s", round=0, keys=[b"k"], hits=[True])), 4.0)
    assert CoreView(c).session(P).heard == 4.0


# -- a producer's answers reach the life they name ----------------------------------------------------------

def test_a_successful_transfer_done_before_every_block_landed_fails_the_load_incomplete() -> None:
    s = Pair()
    job, rnd, _ = s.load("A", 2, 1.0)
    out = s.done("A", rnd, 1.5)  # ok, but no block_data ever arrived
    assert [(j.job_id, j.ok, j.reason) for j in out if isinstance(j, JobDone)] == [
        (job, False, Reason.INCOMPLETE_DATA)]


@pytest.mark.parametrize("answer", ["transfer_done", "abort_ack", "block_data"])
def test_an_answer_naming_another_life_of_the_id_is_dropped_as_stale(answer: str) -> None:
    s = Pair()
    s.c.handle(ix.LoadAnnounced("A", scenario_P, life="life-2"), 1.0)
    (fetch,) = [e.msg for e in s.c.handle(ix.LoadSubmitted("A", 9, (b"k",), (3,)), 1.0) if isinstance(e, Send)]
    if answer == "abort_ack":
        s.c.handle(ix.RequestFinished("A", producer=False), 1.1)  # the load cancels: it waits for the ack
        msg: Any = wm.AbortAck(gen=s.gen, kv_request_id="A", round=fetch.round, life="life-1")
    elif answer == "block_data":
        msg = wm.BlockData(gen=s.gen, kv_request_id="A", round=fetch.round, first=0, count=1, life="life-1")
    else:
        msg = wm.TransferDone(gen=s.gen, kv_request_id="A", round=fetch.round, ok=False, reason="aborted",
                             life="life-1")
    before = s.c.consumer_state("A")
    out = s.to_c(msg, 1.2)
    assert [(e.machine, e.key, e.state) for e in out if isinstance(e, Ignored)] == [("consumer", "A", before)]
    assert not [e for e in out if isinstance(e, (JobDone, LandBlocks))] and s.c.consumer_state("A") is before


def test_while_the_plane_attaches_only_a_release_reaches_the_producer() -> None:
    # decision I24: an abort right behind the hello frees blocks in one round trip; a fetch waits
    p = core()
    p.handle(ix.Received("c1", _hello(5)), 0.0)
    assert CoreView(p).session_state("c1") is SessionState.ATTACHING
    out = p.handle(ix.Received("c1", wm.Fetch(gen=5, kv_request_id="A", round=0, keys=[b"k"])), 0.1)
    assert out == [Ignored("session", "c1", SessionState.ATTACHING, "message", Reason.STALE)]
    assert CoreView(p).producer("A") is None
    out = p.handle(ix.Received("c1", wm.AbortFetch(gen=5, kv_request_id="A", round=0, fetched=True)), 0.2)
    assert out == [Send("c1", wm.AbortAck(gen=5, kv_request_id="A", round=0))]
    out = p.handle(ix.Received("c1", wm.Fetch(gen=5, kv_request_id="B", round=1, keys=[])), 0.3)  # only releases
    assert out == [Send("c1", wm.TransferDone(gen=5, kv_request_id="B", round=1, ok=True, reason=""))]


def test_a_one_sided_fetch_hands_its_slots_to_the_plane() -> None:
    p = core(one_sided=True)
    p.handle(ix.Received("c1", _hello(5)), 0.0)
    p.handle(ix.PeerAttached("c1", 5), 0.0)
    p.handle(ix.StoreSubmitted("A", "req-A", 1, (b"k0", b"k1"), (3, 4)), 0.0)
    fetch = wm.Fetch(gen=5, kv_request_id="A", round=0, keys=[b"k0", b"k1"], slots=[7, 9])
    out = p.handle(ix.Received("c1", fetch), 0.1)
    (sb,) = [e for e in out if isinstance(e, SendBlocks)]
    assert (sb.blocks, sb.slots) == ((3, 4), (7, 9))


def test_a_one_sided_load_noticed_of_a_give_up_waits_abort_ack_timeout_from_the_notice() -> None:
    c = core(one_sided=True)
    gen = dialled(c)
    _loading(c, "A", 4)
    out = c.handle(ix.Received(P, wm.TransferDone(gen=gen, kv_request_id="A", round=0, ok=False, reason="aborted",
                                                  final=False)), 2.0)
    assert not [e for e in out if isinstance(e, JobDone)]
    view = c.consumer("A")
    assert (view.state.value, view.deadline) == ("given_up", 2.0 + 10.0)  # abort_ack_timeout_s


def test_a_message_naming_no_watermark_never_raises_it() -> None:
    # receipts (and probes) carry no low watermark: after one, a fetch of round 0 still binds
    s = Pair()
    s.store("B", 1, 0.0)
    s.fetch("B", (b"B:0",), 0.1, rnd=3)
    s.complete("B", 3, 0.2)  # B's receipt
    s.store("A", 1, 0.3)
    s.fetch("A", (b"A:0",), 0.4, rnd=0)
    assert s.p.producer_state("A").value == "serving"


def test_a_fetch_naming_a_new_life_of_a_served_id_binds_afresh() -> None:
    # the life a fetch names reaches the producer: a new pairing is a fresh id (decision I11's lives)
    s = Pair()
    s.store("A", 1, 0.0, life="life-1")
    s.to_p(wm.Fetch(gen=s.gen, kv_request_id="A", round=0, keys=[b"A:0"], life="life-1"), 0.1)
    s.complete("A", 0, 0.2)
    assert s.p.producer_state("A").value == "done"
    out = s.to_p(wm.Fetch(gen=s.gen, kv_request_id="A", round=1, keys=[b"A:0"], life="life-2"), 0.3)
    assert not [m for m in (e.msg for e in out if isinstance(e, Send)) if isinstance(m, wm.TransferDone)]
    assert s.p.producer_state("A").value == "awaiting"


def test_what_was_bound_to_a_restarted_peers_session_learns_it_is_lost_at_that_moment() -> None:
    p = core()
    p.handle(ix.Received("c1", _hello(5)), 0.0)
    p.handle(ix.PeerAttached("c1", 5), 0.0)
    p.handle(ix.Received("c1", wm.Fetch(gen=5, kv_request_id="A", round=0, keys=[b"k"])), 0.5)  # bound, waits
    p.handle(ix.StoreSubmitted("B", "req-B", 1, (b"b",), (4,)), 0.5)
    p.handle(ix.Received("c1", wm.Fetch(gen=5, kv_request_id="B", round=1, keys=[b"b"])), 0.5)  # serving
    out = p.handle(ix.Received("c1", _hello(6)), 1.0)  # the same peer, a new generation: it restarted
    assert [(e.peer, e.reason) for e in out if isinstance(e, SessionEnded)] == [("c1", Reason.PEER_RESTARTED)]
    view = CoreView(p).producer("A")
    assert (view.state.value, view.reason, view.deadline) == ("tombstoned", Reason.PEER_LOST, 1.0 + 10.0)
    assert CancelTransfer("B", 1) in out
    assert out[-1] == AttachPeer("c1", 6, b"", False)
