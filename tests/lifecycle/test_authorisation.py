"""Who may touch an id: a named consumer, first-come binding, capacity refusals and
idle-session eviction, against the real core with explicit ``now``.

The attacks are the ones docs/security.md lists: a stranger who knows a ``kv_request_id`` fetches it, or
destroys it with an empty fetch, an ``abort_fetch`` or a fetch with made-up keys; 200 hellos fill
``max_peers``; the consumer is told ``handshake_mismatch`` instead of a capacity reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.lifecycle import ProducerState, Reason, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.effects import JobDone, Send, SendBlocks, SessionEnded
from kvtier.lifecycle.session import HelloInput
from kvtier.wire import messages as wm
from tools import snapshot
from tools.coreview import CoreView

LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="authz", hash_seed="", instance="authz")
DURATIONS = {k: 10.0 for k in TIMER_KEYS} | {"heartbeat_interval_s": 1000.0, "peer_timeout_s": 1000.0}


def of(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def sent(effects: list[Any], kind: type) -> list[Any]:
    return [e.msg for e in effects if isinstance(e, Send) and isinstance(e.msg, kind)]


def producer(**kw: Any) -> TierCore:
    return TierCore(CoreSettings(durations=DURATIONS, **kw), LOCAL)


def entry(core: TierCore, kid: str) -> snapshot.ProducerEntry:
    return next(e for e in snapshot.export(core).producer if e.kv_request_id == kid)


def connect(p: TierCore, peer: str, principal: str, gen: int, now: float = 0.0) -> list[Any]:
    """An inbound session from ``peer`` authenticated as ``principal`` (the plane takes its
    descriptor at once)."""
    hello = wm.Hello(gen=gen, version=wm.PROTOCOL_VERSION, instance=peer, block_bytes=16, layout="authz", hash_seed="")
    out = p.handle(ix.Received(peer, hello, principal=principal), now)
    if CoreView(p).session_state(peer).value == "attaching":
        out += p.handle(ix.PeerAttached(peer, gen), now)
    return out


def fetch(p: TierCore, peer: str, gen: int, kid: str, keys: tuple[bytes, ...], now: float = 1.0,
          rnd: int = 0) -> list[Any]:
    return p.handle(ix.Received(peer, wm.Fetch(gen=gen, kv_request_id=kid, round=rnd, keys=list(keys))), now)


def abort(p: TierCore, peer: str, gen: int, kid: str, rnd: int, *, fetched: bool, now: float) -> list[Any]:
    return p.handle(ix.Received(peer, wm.AbortFetch(gen=gen, kv_request_id=kid, round=rnd, fetched=fetched)), now)


def refused(effects: list[Any], peer: str, reason: str) -> bool:
    return any(isinstance(e, Send) and isinstance(e.msg, wm.TransferDone) and not e.msg.ok and e.peer == peer
               and e.msg.reason == reason for e in effects)


def test_a_named_consumer_is_the_only_peer_that_can_touch_the_id() -> None:
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0", b"k1")
    p.handle(ix.StoreSubmitted("A", "r1", 1, keys, (0, 1), consumer="decode-1"), 0.5)
    before = entry(p, "A")
    deadline = CoreView(p).producer("A").deadline
    # the stranger's fetch (real keys), empty fetch, made-up keys and abort: refused, nothing
    # changes (each its own round: a round already answered is dropped unanswered, decision I11)
    assert refused(fetch(p, "evil", 2, "A", keys), "evil", "not_authorised")
    assert refused(fetch(p, "evil", 2, "A", (), rnd=1), "evil", "not_authorised")
    assert refused(fetch(p, "evil", 2, "A", (b"made-up",), rnd=2), "evil", "not_authorised")
    out = abort(p, "evil", 2, "A", 7, fetched=False, now=1.0)
    assert sent(out, wm.AbortAck) and not of(out, JobDone)
    assert p.producer_state("A") is ProducerState.PARKED
    assert entry(p, "A") == before and CoreView(p).producer("A").deadline == deadline
    assert before.peer is None and before.jobs == (1,) and before.consumer == "decode-1"
    # the named consumer is served
    out = fetch(p, "good", 1, "A", keys, now=2.0)
    assert of(out, SendBlocks) and p.producer_state("A") is ProducerState.SERVING
    # and a stranger still cannot disturb the bound transfer
    assert refused(fetch(p, "evil", 2, "A", keys, now=2.1, rnd=8), "evil", "not_authorised")
    assert p.producer_state("A") is ProducerState.SERVING


def test_a_named_id_refuses_strangers_before_its_first_store() -> None:
    """Fetch-before-store: the producer request named its consumer when it was announced, so the
    stranger cannot bind the id while it has no record."""
    p = producer()
    connect(p, "evil", "mallory", gen=2)
    p.handle(ix.ConsumerNamed("A", "decode-1"), 0.0)
    assert refused(fetch(p, "evil", 2, "A", (b"k0",)), "evil", "not_authorised")
    assert p.producer_state("A") is ProducerState.ABSENT


def test_a_stranger_that_bound_first_is_unbound_when_the_store_names_the_consumer() -> None:
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0",)
    fetch(p, "evil", 2, "A", keys, now=0.1)  # nothing named yet: first come, it binds
    assert p.producer_state("A") is ProducerState.AWAITING
    out = p.handle(ix.StoreSubmitted("A", "r1", 1, keys, (0,), consumer="decode-1"), 0.5)
    assert refused(out, "evil", "not_authorised") and not of(out, SendBlocks)
    assert p.producer_state("A") is ProducerState.PARKED  # its blocks wait for the named consumer
    out = fetch(p, "good", 1, "A", keys, now=1.0)
    assert of(out, SendBlocks) and of(out, SendBlocks)[0].peer == "good"


@pytest.mark.parametrize("how", ["empty_fetch", "abort"])
@pytest.mark.parametrize("naming", ["announced", "store"])
def test_a_stranger_cannot_end_an_id_before_its_engine_names_the_consumer(how: str, naming: str) -> None:
    """An empty fetch or an abort before any store ends an unnamed id (L10, L16: a consumer's own
    abort or empty fetch may beat the store).  Done by a principal the producer request then does
    not name, it decided nothing: the request (or its store naming the consumer) starts the id
    afresh, its blocks are parked and the named consumer is served (decision L17)."""
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0", b"k1")
    if how == "empty_fetch":
        fetch(p, "evil", 2, "A", (), now=0.1)
        assert p.producer_state("A") is ProducerState.DONE
    else:
        abort(p, "evil", 2, "A", 0, fetched=False, now=0.1)
        assert p.producer_state("A") is ProducerState.TOMBSTONED
    if naming == "announced":
        p.handle(ix.ConsumerNamed("A", "decode-1"), 0.2)
        assert p.producer_state("A") is ProducerState.ABSENT
    out = p.handle(ix.StoreSubmitted("A", "r1", 1, keys, (0, 1), consumer="decode-1"), 0.5)
    assert not of(out, JobDone)  # parked, not answered from the stranger's ending
    assert p.producer_state("A") is ProducerState.PARKED
    out = fetch(p, "good", 1, "A", keys, now=1.0)
    assert of(out, SendBlocks) and of(out, SendBlocks)[0].peer == "good"


@pytest.mark.parametrize("named_while_bound", [False, True])
@pytest.mark.parametrize("end", ["abort", "peer_lost", "supply_deadline"])
def test_a_stranger_that_bound_first_cannot_end_the_id_for_the_named_consumer(end: str,
                                                                              named_while_bound: bool) -> None:
    """A stranger's fetch that bound the id before its engine named a consumer, ended by the
    stranger (its own abort, its session's end, the supply deadline) before the store: the id's
    end answers only the stranger, and the request naming the consumer starts it afresh (L17).
    Named while the stranger was still bound, the name drops that binding at once (named_other)."""
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0", b"k1")
    fetch(p, "evil", 2, "A", (b"made-up",), now=0.1)
    assert p.producer_state("A") is ProducerState.AWAITING
    if named_while_bound:
        p.handle(ix.ConsumerNamed("A", "decode-1"), 0.2)
    if end == "abort":
        abort(p, "evil", 2, "A", 0, fetched=True, now=0.3)
    elif end == "peer_lost":
        p.handle(ix.ConnectionClosed("evil"), 0.3)
    else:
        p.fire(50.0)  # past fetch_supply_timeout_s
    # named while bound: the name already dropped the stranger's binding (named_other), nothing to end
    assert p.producer_state("A") is (ProducerState.ABSENT if named_while_bound else ProducerState.TOMBSTONED)
    if not named_while_bound:
        p.handle(ix.ConsumerNamed("A", "decode-1"), 51.0)
    out = p.handle(ix.StoreSubmitted("A", "r1", 1, keys, (0, 1), consumer="decode-1"), 51.5)
    assert not of(out, JobDone) and p.producer_state("A") is ProducerState.PARKED
    out = fetch(p, "good", 1, "A", keys, now=52.0)
    assert of(out, SendBlocks) and of(out, SendBlocks)[0].peer == "good"


@pytest.mark.parametrize("end, reason, told", [
    ("abort_before_store", "aborted", "aborted"), ("abort_while_bound", "aborted", "aborted"),
    ("peer_lost_while_bound", "peer_lost", "consumer_lost"),  # the asker's session is alive (I40)
    ("empty_fetch", "already_served", "already_served")])
def test_an_id_ended_before_any_name_answers_another_peer_from_its_state(end: str, reason: str, told: str) -> None:
    """An id no producer request named a consumer for, ended by a peer (its abort or empty fetch
    before the store, or the end of the fetch that bound it): another peer's fetch — a restarted
    decode, another replica — is refused with what happened to the id, not ``not_authorised``: no
    consumer was named, so nobody is unauthorised (decision L17; an outside tester's
    ``not_authorised`` sent operators after a proxy or certificate fault that was not there)."""
    p = producer()
    connect(p, "c1", "decode-1", gen=1)
    connect(p, "c2", "decode-2", gen=2)
    if end == "abort_before_store":
        abort(p, "c1", 1, "A", 0, fetched=False, now=0.1)
    elif end == "empty_fetch":
        fetch(p, "c1", 1, "A", (), now=0.1)
    else:
        fetch(p, "c1", 1, "A", (b"k0",), now=0.1)  # binds the unnamed id
        if end == "abort_while_bound":
            abort(p, "c1", 1, "A", 0, fetched=True, now=0.2)
        else:
            p.handle(ix.ConnectionClosed("c1"), 0.2)
        out = p.handle(ix.StoreSubmitted("A", "r1", 1, (b"k0",), (0,)), 0.5)  # the unnamed store
        assert [(j.ok, j.reason) for j in of(out, JobDone)] == [(False, Reason(reason))]
    assert p.producer_state("A") in (ProducerState.TOMBSTONED, ProducerState.DONE)
    out = fetch(p, "c2", 2, "A", (b"k0",), now=1.0)
    assert refused(out, "c2", told), out
    assert not of(out, SendBlocks)
    # the engine naming another consumer still starts the id afresh (the ender decided nothing for it)
    p.handle(ix.ConsumerNamed("A", "decode-3"), 1.1)
    assert p.producer_state("A") is ProducerState.ABSENT


@pytest.mark.parametrize("stored", [False, True])
@pytest.mark.parametrize("then", ["fetch", "stranger_aborts"])
def test_naming_the_consumer_drops_a_strangers_earlier_binding(stored: bool, then: str) -> None:
    """A stranger's fetch bound the id before the producer request named its consumer; the request
    is announced naming decode before decode fetches.  The stranger's binding is refused at the
    announce (``named_other``), as a store naming decode already refused it, so decode's fetch finds
    the id free — it failed ``duplicate_fetch``, or after the stranger's cancel ``aborted``, and the
    blocks stayed pinned until reaped (an outside tester, CURVE on; decision L17).  Blocks already
    stored for the id stay parked for decode."""
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0", b"k1")
    fetch(p, "evil", 2, "A", keys, now=0.1)
    if stored:
        p.handle(ix.StoreSubmitted("A", "r1", 1, keys[:1], (0,)), 0.15)
    assert p.producer_state("A") is ProducerState.AWAITING
    out = p.handle(ix.ConsumerNamed("A", "decode-1"), 0.2)
    assert refused(out, "evil", "not_authorised") and not of(out, JobDone)
    assert p.producer_state("A") is (ProducerState.PARKED if stored else ProducerState.ABSENT)
    if then == "stranger_aborts":
        out = abort(p, "evil", 2, "A", 0, fetched=True, now=0.25)
        assert sent(out, wm.AbortAck) and not of(out, JobDone)
    out = fetch(p, "good", 1, "A", keys, now=0.3)
    assert not sent(out, wm.TransferDone)
    out += p.handle(ix.StoreSubmitted("A", "r1", 2, keys[1:] if stored else keys, (1,) if stored else (0, 1),
                                      consumer="decode-1"), 0.5)
    assert of(out, SendBlocks) and of(out, SendBlocks)[0].peer == "good"


@pytest.mark.parametrize("how", ["empty_fetch", "abort"])
def test_the_named_consumers_own_early_ending_stands(how: str) -> None:
    """The same early ending by the consumer the request names is its decision (L10, L16): the
    store is answered from it, as before."""
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    if how == "empty_fetch":
        fetch(p, "good", 1, "A", (), now=0.1)
    else:
        abort(p, "good", 1, "A", 0, fetched=False, now=0.1)
    p.handle(ix.ConsumerNamed("A", "decode-1"), 0.2)
    out = p.handle(ix.StoreSubmitted("A", "r1", 1, (b"k0",), (0,), consumer="decode-1"), 0.5)
    (done,) = of(out, JobDone)
    if how == "empty_fetch":
        assert done.ok and p.producer_state("A") is ProducerState.DONE  # not_needed
    else:
        assert not done.ok and done.reason == Reason.ABORTED and p.producer_state("A") is ProducerState.TOMBSTONED


def test_an_unnamed_id_is_first_come_and_only_its_binding_can_end_it() -> None:
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0",)
    p.handle(ix.StoreSubmitted("A", "r1", 1, keys, (0,)), 0.5)
    fetch(p, "good", 1, "A", keys, now=1.0)
    assert p.producer_state("A") is ProducerState.SERVING
    # another peer can neither fetch nor abort the bound id
    assert refused(fetch(p, "evil", 2, "A", keys, now=1.1), "evil", "duplicate_fetch")
    out = abort(p, "evil", 2, "A", 0, fetched=True, now=1.2)
    assert sent(out, wm.AbortAck) and p.producer_state("A") is ProducerState.SERVING


def test_a_capacity_refusal_fails_the_load_with_too_many_peers() -> None:
    c = TierCore(CoreSettings(durations=DURATIONS), LOCAL, gen_base=100)
    c.handle(ix.LoadAnnounced("A", "prod:1"), 0.0)
    c.handle(ix.ConnectionUp("prod:1"), 0.0)
    out = c.handle(ix.LoadSubmitted("A", 9, (b"k0",), (3,)), 0.0)
    gen = CoreView(c).session_gen("prod:1")
    reject = wm.HelloReject(gen=gen, reason="too_many_peers", field="max_peers", ours="128", theirs="129")
    out = c.handle(ix.Received("prod:1", reject), 0.1)
    assert of(out, JobDone) == [JobDone(9, False, Reason.TOO_MANY_PEERS)]
    assert [(e.peer, e.reason) for e in of(out, SessionEnded)] == [("prod:1", "too_many_peers")]


def test_idle_inbound_sessions_are_evicted_to_admit_a_new_peer_at_max_peers() -> None:
    # B22: session GC never takes a session that still has work bound to it
    p = producer(max_peers=2)
    connect(p, "idle", "idle", gen=1, now=0.0)
    connect(p, "busy", "busy", gen=2, now=0.0)
    p.handle(ix.StoreSubmitted("B", "r1", 1, (b"k",), (0,)), 0.0)
    fetch(p, "busy", 2, "B", (b"k", b"missing"), now=0.0)  # binds B: busy has work
    # too early: every session saw work within handshake_timeout_s -> the newcomer is refused
    out = connect(p, "new1", "new1", gen=3, now=5.0)
    assert any(getattr(getattr(e, "msg", None), "reason", "") == "too_many_peers" for e in out)
    assert CoreView(p).session("new1") is None
    # later the idle one (nothing bound, only pings) is evicted; the bound one is kept
    p.handle(ix.Received("idle", wm.Ping(gen=1, t=8.0)), 8.0)
    out = connect(p, "new2", "new2", gen=4, now=10.5)
    assert [(e.peer, e.reason) for e in of(out, SessionEnded)] == [("idle", "idle_evicted")]
    view = CoreView(p)
    assert view.session_ready("new2") and view.session_ready("busy") and view.session("idle") is None


def test_a_named_id_refuses_strangers_after_it_was_reaped_too() -> None:
    """A tombstone answers late fetches from its state, reason and named consumer alone (decision
    I8): the named consumer learns why the id ended, a stranger only that it may not touch it
    — not that the id existed and was reaped."""
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    out = p.handle(ix.StoreSubmitted("A", "r1", 1, (b"k0",), (0,), consumer="decode-1"), 0.5)
    out += p.fire(0.5 + DURATIONS["unbound_store_timeout_s"] + 0.1)
    assert p.producer_state("A") is ProducerState.TOMBSTONED
    assert entry(p, "A").consumer == "decode-1"
    assert refused(fetch(p, "evil", 2, "A", (b"k0",), now=12.0), "evil", "not_authorised")
    late = fetch(p, "good", 1, "A", (b"k0",), now=12.0)
    (answer,) = sent(late, wm.TransferDone)
    assert not answer.ok and answer.reason not in ("not_authorised", "")
    assert p.producer_state("A") is ProducerState.TOMBSTONED
