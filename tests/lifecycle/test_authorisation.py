"""Who may touch an id (issue 10): a named consumer, first-come binding, capacity refusals and
idle-session eviction, against the real core with explicit ``now``.

The attacks are the ones issue 10 lists: a stranger who knows a ``kv_request_id`` fetches it, or
destroys it with an empty fetch, an ``abort_fetch`` or a fetch with made-up keys; 200 hellos fill
``max_peers``; the consumer is told ``handshake_mismatch`` instead of a capacity reason.
"""

from __future__ import annotations

from typing import Any

from kvtier.lifecycle import ProducerState, TierCore
from kvtier.lifecycle.consumer import LoadInput
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.effects import JobDone, PeerDown, SendAbortAck, SendBlocks, SendTransferDone
from kvtier.lifecycle.producer import FetchInput, StoreInput
from kvtier.lifecycle.session import HelloInput

LOCAL = HelloInput(version=2, block_bytes=16, layout="authz", hash_seed="")
DURATIONS = {k: 10.0 for k in TIMER_KEYS}


def of(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def producer(**kw: Any) -> TierCore:
    return TierCore(CoreSettings(durations=DURATIONS, **kw), LOCAL)


def connect(p: TierCore, peer: str, principal: str, gen: int, now: float = 0.0) -> list[Any]:
    """An inbound session from ``peer`` authenticated as ``principal``."""
    return p.hello(peer, HelloInput(2, 16, "authz", "", gen=gen, principal=principal, instance=peer), now)


def fetch(p: TierCore, peer: str, gen: int, kid: str, keys: tuple[bytes, ...], now: float = 1.0,
          rnd: int = 0) -> list[Any]:
    return p.fetch(peer, gen, FetchInput(peer, kid, rnd, keys), now)


def refused(effects: list[Any], peer: str, reason: str) -> bool:
    return any(isinstance(e, SendTransferDone) and not e.ok and e.peer == peer and e.reason == reason
               for e in effects)


def test_a_named_consumer_is_the_only_peer_that_can_touch_the_id() -> None:
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0", b"k1")
    p.store(StoreInput("A", "r1", 1, keys, (0, 1), consumer="decode-1"), 0.5)
    before = p.producer.records["A"]
    deadline = p.producer.deadline_of("A")
    # the stranger's fetch (real keys), empty fetch, made-up keys and abort: refused, nothing changes
    assert refused(fetch(p, "evil", 2, "A", keys), "evil", "not_authorised")
    assert refused(fetch(p, "evil", 2, "A", ()), "evil", "not_authorised")
    assert refused(fetch(p, "evil", 2, "A", (b"made-up",)), "evil", "not_authorised")
    out = p.abort_fetch("evil", 2, FetchInput("evil", "A", 7, fetched=False), 1.0)
    assert of(out, SendAbortAck) and not of(out, JobDone)
    assert p.producer.state_of("A") is ProducerState.PARKED
    assert p.producer.records["A"] is before and p.producer.deadline_of("A") == deadline
    assert before.peer is None and before.jobs == [1]
    # the named consumer is served
    out = fetch(p, "good", 1, "A", keys, now=2.0)
    assert of(out, SendBlocks) and p.producer.state_of("A") is ProducerState.SERVING
    # and a stranger still cannot disturb the bound transfer
    assert refused(fetch(p, "evil", 2, "A", keys, now=2.1), "evil", "not_authorised")
    assert p.producer.state_of("A") is ProducerState.SERVING


def test_a_named_id_refuses_strangers_before_its_first_store() -> None:
    """Fetch-before-store: the producer request named its consumer when it was announced, so the
    stranger cannot bind the id while it has no record."""
    p = producer()
    connect(p, "evil", "mallory", gen=2)
    p.producer_announce("A", "decode-1")
    assert refused(fetch(p, "evil", 2, "A", (b"k0",)), "evil", "not_authorised")
    assert p.producer.state_of("A") is ProducerState.ABSENT


def test_a_stranger_that_bound_first_is_unbound_when_the_store_names_the_consumer() -> None:
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0",)
    fetch(p, "evil", 2, "A", keys, now=0.1)  # nothing named yet: first come, it binds
    assert p.producer.state_of("A") is ProducerState.AWAITING
    out = p.store(StoreInput("A", "r1", 1, keys, (0,), consumer="decode-1"), 0.5)
    assert refused(out, "evil", "not_authorised") and not of(out, SendBlocks)
    assert p.producer.state_of("A") is ProducerState.PARKED  # its blocks wait for the named consumer
    out = fetch(p, "good", 1, "A", keys, now=1.0)
    assert of(out, SendBlocks) and of(out, SendBlocks)[0].peer == "good"


def test_an_unnamed_id_is_first_come_and_only_its_binding_can_end_it() -> None:
    p = producer()
    connect(p, "good", "decode-1", gen=1)
    connect(p, "evil", "mallory", gen=2)
    keys = (b"k0",)
    p.store(StoreInput("A", "r1", 1, keys, (0,)), 0.5)
    fetch(p, "good", 1, "A", keys, now=1.0)
    assert p.producer.state_of("A") is ProducerState.SERVING
    # another peer can neither fetch nor abort the bound id
    assert refused(fetch(p, "evil", 2, "A", keys, now=1.1), "evil", "duplicate_fetch")
    out = p.abort_fetch("evil", 2, FetchInput("evil", "A", 0, fetched=True), 1.2)
    assert of(out, SendAbortAck) and p.producer.state_of("A") is ProducerState.SERVING


def test_a_capacity_refusal_fails_the_load_with_too_many_peers() -> None:
    c = TierCore(CoreSettings(durations=DURATIONS), LOCAL, gen_base=100)
    c.announce("A", "prod:1", 0.0)
    c.transport_up("prod:1", 0.0)
    out = c.submit_load(LoadInput("A", 9, (b"k0",), (3,)), 0.0)
    gen = c.session_gen("prod:1")
    out = c.hello_reject("prod:1", gen, 0.1, "too_many_peers")
    assert of(out, JobDone) == [JobDone(9, False, "too_many_peers")]
    assert of(out, PeerDown) == [PeerDown("prod:1", "too_many_peers")]


def test_idle_inbound_sessions_are_evicted_to_admit_a_new_peer_at_max_peers() -> None:
    # B22: session GC never takes a session that still has work bound to it
    p = producer(max_peers=2)
    connect(p, "idle", "idle", gen=1, now=0.0)
    connect(p, "busy", "busy", gen=2, now=0.0)
    p.store(StoreInput("B", "r1", 1, (b"k",), (0,)), 0.0)
    fetch(p, "busy", 2, "B", (b"k", b"missing"), now=0.0)  # binds B: busy has work
    # too early: every session saw work within handshake_timeout_s -> the newcomer is refused
    out = connect(p, "new1", "new1", gen=3, now=5.0)
    assert any(getattr(e, "reason", "") == "too_many_peers" for e in out) and "new1" not in p.sessions.records
    # later the idle one (nothing bound, only pings) is evicted; the bound one is kept
    p.ping("idle", 1, 8.0)
    out = connect(p, "new2", "new2", gen=4, now=10.5)
    assert PeerDown("idle", "idle_evicted") in out
    assert p.session_ready("new2") and p.session_ready("busy") and "idle" not in p.sessions.records
