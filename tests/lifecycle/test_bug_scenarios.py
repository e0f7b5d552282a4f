"""Regression tests for the bug scenarios (B-numbers; each test's docstring says what its scenario is).

Each test replays one scenario against :class:`~kvtier.lifecycle.TierCore` with explicit ``now``
values and checks the *expected* outcome the scenario states.  Scenario parameters: ``T_park`` =
``unbound_store_timeout_s`` = 60, ``T_tomb`` = ``tombstone_retention_s`` = 60, ``T_load`` =
``load_timeout_s`` = 30 (overridden where the scenario says so).  "Within one RTT" means: in the
effects of the very call that receives the message.

What the core cannot express (memory pools, metrics, retries, id validation on the wire) is named
in each test's docstring; those parts belong to the shell (``kvtier.manager``), the block pool or
the wire codec.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kvtier.lifecycle import ConsumerState, ProducerState, Reason, TierCore, snapshot
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import CoreSettings
from kvtier.lifecycle.effects import (
    CancelTransfer,
    Ignored,
    JobDone,
    LandBlocks,
    RevokeAccess,
    Send,
    SendBlocks,
    SessionEnded,
)
from kvtier.lifecycle.session import HelloInput
from kvtier.wire import messages as wm

LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="scenarios", hash_seed="", instance="scen")
BASE = {
    "unbound_store_timeout_s": 60.0,  # T_park
    "tombstone_retention_s": 60.0,  # T_tomb
    "load_timeout_s": 30.0,  # T_load
    "fetch_supply_timeout_s": 10.0,  # T_orphan (B15)
    "transfer_timeout_s": 30.0,
    "abort_ack_timeout_s": 5.0,
    "handshake_timeout_s": 5.0,
    "revoke_timeout_s": 1.0,
    "heartbeat_interval_s": 1000.0,  # a live peer is heard; scenarios that kill a peer ping and lower the timeout
    "peer_timeout_s": 1000.0,
}
C = "decode-1"  # the consumer as the producer sees it
P = "prefill:5710"  # the producer as the consumer dials it


def of(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def sent(effects: list[Any], kind: type) -> list[Any]:
    """The wire messages of type ``kind`` the effects send."""
    return [e.msg for e in effects if isinstance(e, Send) and isinstance(e.msg, kind)]


def ended(effects: list[Any]) -> list[tuple[str, str]]:
    """(peer, reason) of every session the effects say ended."""
    return [(e.peer, e.reason) for e in of(effects, SessionEnded)]


def keys(kid: str, n: int, start: int = 0) -> tuple[bytes, ...]:
    return tuple(f"{kid}:{i}".encode() for i in range(start, start + n))


def entry(core: TierCore, kid: str) -> snapshot.ProducerEntry:
    """The producer record of ``kid`` as the core exports it (owner and block map included)."""
    return next(e for e in snapshot.export(core).producer if e.kv_request_id == kid)


class Pair:
    """A producer core and a consumer core with a ready session (handshake at t=0)."""

    def __init__(self, *, park_clock: str = "last_store", tombstone_max: int = 65536, max_pending: int = 1024,
                 **durations: float) -> None:
        settings = CoreSettings(
            durations={**BASE, **durations}, park_clock=park_clock, tombstone_max=tombstone_max,
            max_pending_fetches_per_peer=max_pending,
        )
        self.p = TierCore(settings, LOCAL, gen_base=0)
        self.c = TierCore(settings, msgspec.structs.replace(LOCAL, instance="cons"), gen_base=100)
        self.c.handle(ix.LoadAnnounced("__warmup__", P), 0.0)  # dials
        (hello,) = sent(self.c.handle(ix.ConnectionUp(P), 0.0), wm.Hello)
        self.gen = self.c.session_gen(P)
        assert hello.gen == self.gen
        self.p.handle(ix.Received(C, hello), 0.0)
        (ack,) = sent(self.p.handle(ix.PeerAttached(C, self.gen), 0.0), wm.HelloAck)
        self.c.handle(ix.Received(P, ack), 0.0)
        self.c.handle(ix.PeerAttached(P, self.gen), 0.0)
        assert self.c.session_ready(P) and self.p.session_ready(C)
        self.c.handle(ix.RequestFinished("__warmup__", producer=False), 0.0)
        self.job = 0

    rounds = -1  # the last round fresh_round handed out

    def next_job(self) -> int:
        self.job += 1
        return self.job

    # producer side
    def store(self, kid: str, n: int, t: float, *, owner: str | None = None, start: int = 0,
              blocks: tuple[int, ...] | None = None) -> tuple[int, list[Any]]:
        job = self.next_job()
        b = blocks if blocks is not None else tuple(range(start, start + n))
        return job, self.p.handle(ix.StoreSubmitted(kid, owner or f"req-{kid}", job, keys(kid, n, start), b), t)

    def to_p(self, msg: Any, t: float) -> list[Any]:
        """``msg`` from the consumer reaches the producer at ``t``."""
        return self.p.handle(ix.Received(C, msg), t)

    def to_c(self, msg: Any, t: float) -> list[Any]:
        """``msg`` from the producer reaches the consumer at ``t``."""
        return self.c.handle(ix.Received(P, msg), t)

    def fresh_round(self) -> int:
        """A round this session has not used: a consumer numbers its rounds once per manager, and
        a producer drops a round it already answered (decision I11)."""
        self.rounds += 1
        return self.rounds

    def fetch(self, kid: str, ks: tuple[bytes, ...], t: float, rnd: int | None = None) -> list[Any]:
        """A fetch of round ``rnd`` (default: the first fetch round 0, later ones fresh rounds)."""
        rnd = self.fresh_round() if rnd is None else rnd
        return self.to_p(wm.Fetch(gen=self.gen, kv_request_id=kid, round=rnd, keys=list(ks)), t)

    def abort(self, kid: str, t: float, rnd: int | None = None, *, fetched: bool = False) -> list[Any]:
        rnd = self.fresh_round() if rnd is None else rnd
        return self.to_p(wm.AbortFetch(gen=self.gen, kv_request_id=kid, round=rnd, fetched=fetched), t)

    def receipt(self, kid: str, rnd: int, t: float) -> list[Any]:
        return self.to_p(wm.Receipt(gen=self.gen, kv_request_id=kid, round=rnd), t)

    def done(self, kid: str, rnd: int, t: float, *, ok: bool = True, reason: str = "") -> list[Any]:
        """The producer's ``transfer_done`` for round ``rnd`` reaches the consumer."""
        return self.to_c(wm.TransferDone(gen=self.gen, kv_request_id=kid, round=rnd, ok=ok, reason=reason), t)

    def revoked(self, out: list[Any], t: float) -> list[Any]:
        """The consumer's zmq plane confirms the ``RevokeAccess`` in ``out`` at once (it is
        receiver-applied); returns ``out`` plus what the confirmations caused."""
        more: list[Any] = []
        for peer in dict.fromkeys(e.peer for e in of(out, RevokeAccess)):
            more += self.c.handle(ix.AccessRevoked(peer), t)
        return out + more

    def complete(self, kid: str, rnd: int, t: float) -> list[Any]:
        """The data plane released the transfer and the consumer's receipt arrived."""
        out = self.p.handle(ix.TransferReleased(kid, rnd), t)
        return out + self.receipt(kid, rnd, t)

    # consumer side
    def load(self, kid: str, n: int, t: float) -> tuple[int, int, list[Any]]:
        job = self.next_job()
        out = self.c.handle(ix.LoadAnnounced(kid, P), t)
        out += self.c.handle(ix.LoadSubmitted(kid, job, keys(kid, n), tuple(range(100, 100 + n))), t)
        fetches = sent(out, wm.Fetch)
        rnd = fetches[0].round if fetches else -1
        return job, rnd, out

    def forward_fetch(self, out: list[Any], t: float) -> list[Any]:
        """The consumer's fetch in ``out`` reaches the producer."""
        (f,) = sent(out, wm.Fetch)
        return self.to_p(f, t)


def done_fail(effects: list[Any], kid: str) -> wm.TransferDone:
    fails = [m for m in sent(effects, wm.TransferDone) if m.kv_request_id == kid and not m.ok]
    assert len(fails) == 1, effects
    return fails[0]


# ------------------------------------------------------------------------------------------------


def test_b01_late_fetch_after_reap_is_refused_in_one_rtt_and_sends_no_bytes() -> None:
    """B01. Not expressible in the core: the ``kvtier_fetches_refused_total`` counter (the shell counts
    refusals it sends) and the consumer's local prefill fallback."""
    s = Pair()
    job_a, out = s.store("A", 4, 0.0, blocks=(0, 1, 2, 3))
    assert out == [] and s.p.producer_state("A") is ProducerState.PARKED
    out = s.p.fire(60.0)
    assert of(out, JobDone) == [JobDone(job_a, False, Reason.REAPED)]  # the 4 blocks are released
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    assert s.p.producer("A").parked == ()
    job_b, out = s.store("B", 4, 61.0, blocks=(0, 1, 2, 3))  # B reuses the same pool blocks
    b_before = entry(s.p, "B").blocks
    out = s.fetch("A", keys("A", 4), 62.0)
    assert done_fail(out, "A").reason == "reaped"
    assert of(out, SendBlocks) == [] and of(out, JobDone) == []
    assert entry(s.p, "B").blocks == b_before
    assert s.p.producer_state("B") is ProducerState.PARKED
    s.p.fire(119.9)
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    s.p.fire(120.0)
    assert s.p.producer_state("A") is ProducerState.ABSENT  # pruned at t=120
    # t=125: handled as an unknown id (B15), never as data
    out = s.fetch("A", keys("A", 4), 125.0)
    assert of(out, SendBlocks) == [] and s.p.producer_state("A") is ProducerState.AWAITING
    out = s.p.fire(135.0)
    assert done_fail(out, "A").reason == "supply_timeout"
    assert of(out, SendBlocks) == []


@pytest.mark.parametrize("park_clock", ["first_store", "last_store"])
def test_b02_park_clock_for_a_chunked_prefill(park_clock: str) -> None:
    """B02 with T_park=60: 12 chunks stored from t=0 to t=13, the consumer's fetch arrives at
    t=65.  ``first_store`` (vLLM p2p behaviour) reaps at t=60 and refuses the fetch at once with
    ``reaped``; ``last_store`` (kvtier's default) counts from the last chunk (t=13), so the fetch at
    t=65 is served.  Not expressible: the ``park_age_at_bind`` / ``reaped_unbound`` metrics."""
    s = Pair(park_clock=park_clock)
    jobs = []
    for i in range(12):
        t = 0.0 if i == 0 else (13.0 if i == 11 else 1.0 + i)
        job, out = s.store("A", 1, t, start=i)
        jobs.append(job)
        assert out == []
    assert s.p.producer("A").deadline == (60.0 if park_clock == "first_store" else 73.0)
    out = s.p.fire(60.0)
    out += s.fetch("A", keys("A", 12), 65.0)
    if park_clock == "first_store":
        assert of(out, JobDone) == [JobDone(j, False, Reason.REAPED) for j in jobs]
        assert done_fail(out, "A").reason == "reaped"  # at t=65, not t=95
        assert of(out, SendBlocks) == []
    else:
        assert of(out, JobDone) == []
        (send,) = of(out, SendBlocks)
        assert len(send.blocks) == 12
        out = s.complete("A", 0, 66.0)
        assert of(out, JobDone) == [JobDone(j, True, None) for j in jobs]  # 12 chunks released
        assert sent(out, wm.TransferDone) == []  # the consumer's receipt ended it: nothing to answer


def test_b02_variant_t_park_180_serves_the_fetch_at_65() -> None:
    """B02 variant cfg(T_park=180), first-store clock: no reap at t=60; the fetch at t=65 binds,
    the transfer completes and the 12 chunks are released."""
    s = Pair(park_clock="first_store", unbound_store_timeout_s=180.0)
    jobs = [s.store("A", 1, float(i), start=i)[0] for i in range(12)]
    assert s.p.fire(60.0) == []
    out = s.fetch("A", keys("A", 12), 65.0)
    assert len(of(out, SendBlocks)[0].blocks) == 12
    out = s.complete("A", 0, 65.5)
    assert of(out, JobDone) == [JobDone(j, True, None) for j in jobs]
    assert sent(out, wm.TransferDone) == []


def test_b03_store_after_reap_fails_at_once_and_pins_nothing() -> None:
    """B03: a late chunk of a reaped id fails immediately, is not parked, does not extend the
    retention; a late fetch is refused in one RTT; the tombstone is pruned at t=120."""
    s = Pair()
    s.store("A", 1, 0.0)
    s.p.fire(60.0)
    prune_at = s.p.producer("A").deadline
    assert prune_at == 120.0
    job2, out = s.store("A", 1, 61.0, start=1)
    assert of(out, JobDone) == [JobDone(job2, False, Reason.REAPED)]
    v = s.p.producer("A")
    assert v.state is ProducerState.TOMBSTONED and v.parked == () and v.jobs == ()
    assert s.p.producer("A").deadline == prune_at  # retention not extended
    assert done_fail(s.fetch("A", keys("A", 2), 62.0), "A").reason == "reaped"
    s.p.fire(120.0)
    assert s.p.producer_state("A") is ProducerState.ABSENT


def test_b05_consumer_cancels_before_fetching_and_the_producer_releases_at_once() -> None:
    """B05: the consumer engine finishes an announced request before loading it; the consumer core
    sends abort_fetch (a fresh round) and the producer frees the 4 blocks one RTT later, tombstoning
    A with reason ``aborted``; later stores fail and later fetches are refused."""
    s = Pair()
    job, _ = s.store("A", 4, 0.0)
    s.c.handle(ix.LoadAnnounced("A", P), 0.5)
    out = s.c.handle(ix.RequestFinished("A", producer=False), 1.0)
    (abort,) = sent(out, wm.AbortFetch)
    assert s.c.consumer_state("A") is ConsumerState.ABSENT  # finished: nothing to wait for
    out = s.to_p(abort, 1.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.ABORTED)]
    assert of(out, Send) == [Send(C, wm.AbortAck(gen=s.gen, kv_request_id="A", round=abort.round))]
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    job2, out = s.store("A", 4, 2.0, start=4)
    assert of(out, JobDone) == [JobDone(job2, False, Reason.ABORTED)]
    assert done_fail(s.fetch("A", keys("A", 4), 3.0, rnd=abort.round + 1), "A").reason == "aborted"


def test_b05_abort_before_the_first_store() -> None:
    """B05 ordering variant: the abort arrives before the first store; the store is rejected."""
    s = Pair()
    out = s.abort("A", 0.0)
    assert sent(out, wm.AbortAck) and s.p.producer_state("A") is ProducerState.TOMBSTONED
    job, out = s.store("A", 4, 1.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.ABORTED)]
    assert s.p.producer("A").parked == ()


def test_b05_without_an_abort_t_park_is_the_only_bound() -> None:
    """B05: if the request never reaches the consumer, nothing can abort it; the reap deadline
    (T_park) is the bound."""
    s = Pair()
    job, _ = s.store("A", 4, 0.0)
    assert s.p.fire(59.9) == []
    assert of(s.p.fire(60.0), JobDone) == [JobDone(job, False, Reason.REAPED)]


def test_b06_abort_propagation_frees_capacity_and_the_rest_are_reaped() -> None:
    """B06: 100 ids x 10 blocks parked over t=0..10; 60 are cancelled on the consumer at t=2 (60
    aborts); by t=2 their 600 blocks are released; a new store at t=3 parks; the 40 others are
    reaped by t=70.  Not expressible in the core: pool capacity — a store that finds the pool full
    fails fast in the shell (``BlockPool.alloc`` raises ``PoolExhausted``), the core never sees it;
    the ``parked_pinned_bytes`` gauge."""
    s = Pair()
    jobs = {}
    for i in range(100):
        jobs[i], _ = s.store(f"R{i}", 10, i / 10.0, start=0, blocks=tuple(range(10 * i, 10 * i + 10)))
    freed = []
    for i in range(60):
        out = s.abort(f"R{i}", 2.0)
        freed += of(out, JobDone)
    assert freed == [JobDone(jobs[i], False, Reason.ABORTED) for i in range(60)]  # 600 blocks free
    parked = [v for k in s.p.producer_ids() if (v := s.p.producer(k)).state is ProducerState.PARKED]
    assert len(parked) == 40 and sum(len(v.parked) for v in parked) == 400
    assert s.p.snapshot().pinned_blocks == {"parked": 400}
    zjob, out = s.store("Z", 10, 3.0)
    assert out == [] and s.p.producer_state("Z") is ProducerState.PARKED
    reaped = of(s.p.fire(70.0), JobDone)
    assert {j.job_id for j in reaped} == {jobs[i] for i in range(60, 100)} | {zjob}
    assert all(j.reason == "reaped" for j in reaped)


def test_b08_completion_after_the_consumer_cancelled_is_reported_once() -> None:
    """B08: the consumer cancels at t=1 while the fetch is in flight; the producer's Done(ok) at
    t=2 ends the load: exactly one completion (a failure, ``cancelled``) reaches the engine, and
    only now — a write could still land before.  A later abort_ack is ignored."""
    s = Pair()
    s.store("A", 4, 0.0)
    job, rnd, out = s.load("A", 4, 0.0)
    assert sent(out, wm.Fetch)
    out = s.c.handle(ix.RequestFinished("A", producer=False), 1.0)
    assert of(out, JobDone) == [] and sent(out, wm.AbortFetch)
    assert s.c.consumer_state("A") is ConsumerState.CANCELLING
    out = s.done("A", rnd, 2.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.CANCELLED)]
    assert s.c.consumer_state("A") is ConsumerState.ABSENT
    out = s.to_c(wm.AbortAck(gen=s.gen, kv_request_id="A", round=rnd), 2.5)
    assert of(out, JobDone) == [] and of(out, Ignored)
    out = s.done("A", rnd, 3.0)
    assert of(out, JobDone) == []


def test_b09_silent_producer_loads_end_by_the_consumers_own_deadlines() -> None:
    """B09: the producer loses power at t=0.5.  With heartbeats (every second, peer_timeout_s=5)
    the session is declared dead at t=5 and every load to that peer fails at once (with the
    session's reason, ``peer_timeout``).  If the peer stays connected but silent about the load,
    T_load fires at t=30: the fetch is aborted and the load fails when no write can land any more
    — on abort_ack, or abort_ack_timeout_s later (t=35).  Not expressible: releasing the slots and
    the local-recompute fallback (the shell, on the JobDone)."""
    s = Pair(peer_timeout_s=5.0, heartbeat_interval_s=1.0)
    s.store("A", 4, 0.0)
    s.store("B", 4, 0.0)
    j1, _, _ = s.load("A", 4, 0.0)
    j2, _, _ = s.load("B", 4, 0.0)
    out = s.c.fire(4.0)  # heard at 0: the heartbeats ping, nothing ends yet
    assert sent(out, wm.Ping) and ended(out) == [] and of(out, JobDone) == []
    out = s.c.fire(5.0)  # silent for peer_timeout_s: the session dies; the loads fail once no write can land
    assert ended(out) == [(P, "peer_timeout")]
    assert of(out, JobDone) == [] and len(of(out, RevokeAccess)) == 2
    out = s.revoked(out, 5.0)
    assert sorted(of(out, JobDone), key=lambda j: j.job_id) == [JobDone(j1, False, Reason.PEER_TIMEOUT),
                                                                 JobDone(j2, False, Reason.PEER_TIMEOUT)]
    s2 = Pair()
    job, rnd, _ = s2.load("A", 4, 0.0)
    out = s2.c.fire(30.0)
    assert sent(out, wm.AbortFetch) and of(out, JobDone) == []
    assert s2.c.consumer_state("A") is ConsumerState.ABORTING
    out = s2.revoked(s2.c.fire(35.0), 35.0)  # unanswered: session given up, access revoked
    assert of(out, JobDone) == [JobDone(job, False, Reason.LOAD_TIMEOUT)]


def test_b12_fetch_for_blocks_that_will_never_come_is_answered_promptly() -> None:
    """B12: the producer holds k1,k2,k4 of A (k3 never stored, the parked blocks are pinned so
    they cannot be evicted: kvtier's analogue of "P evicts k3").  Once the prefill has finished,
    the fetch for k1..k4 is refused in one RTT (``incomplete``); while it may still store, the
    fetch waits at most fetch_supply_timeout_s (t=12, well inside T_load)."""
    s = Pair()
    ks = keys("A", 4)
    for i in (0, 1, 3):
        s.p.handle(ix.StoreSubmitted("A", "req-A", 10 + i, (ks[i],), (i,)), 0.0)
    s.p.handle(ix.RequestFinished("A", producer=True), 0.5)
    out = s.fetch("A", ks, 2.0)
    assert done_fail(out, "A").reason == "incomplete" and of(out, SendBlocks) == []
    assert sorted(j.job_id for j in of(out, JobDone)) == [10, 11, 13]
    s = Pair()
    for i in (0, 1, 3):
        s.p.handle(ix.StoreSubmitted("A", "req-A", 10 + i, (ks[i],), (i,)), 0.0)
    out = s.fetch("A", ks, 2.0)
    assert out == [] and s.p.producer_state("A") is ProducerState.AWAITING
    assert done_fail(s.p.fire(12.0), "A").reason == "supply_timeout"


def test_b12_second_round_for_a_live_id_is_refused_and_the_first_is_untouched() -> None:
    """B12 (one fetch per id): a second round while the first is live fails only that fetch
    (``duplicate_fetch``); an exact network duplicate of the live round is ignored."""
    s = Pair()
    s.store("A", 2, 0.0)
    assert s.p.producer_state("A") is ProducerState.PARKED
    ks = keys("A", 3)  # one key missing: the round waits in awaiting
    assert s.fetch("A", ks, 1.0, rnd=7) == []
    out = s.fetch("A", ks, 1.5, rnd=8)
    fail = done_fail(out, "A")
    assert (fail.round, fail.reason) == (8, "duplicate_fetch")
    v = s.p.producer("A")
    assert (v.state, v.round, v.peer) == (ProducerState.AWAITING, 7, C)
    out = s.fetch("A", ks, 1.6, rnd=7)  # the network repeated round 7
    assert sent(out, wm.TransferDone) == [] and of(out, Ignored)
    # the first round goes on: the missing block arrives and is sent
    out = s.p.handle(ix.StoreSubmitted("A", "req-A", 99, (ks[2],), (9,)), 2.0)
    assert of(out, SendBlocks)[0].round == 7


def test_b13_a_second_owner_cannot_park_under_a_live_id() -> None:
    """B13: r2's store under r1's live id fails (``id_in_use``) and r1's entry is untouched; after
    Done(A) nothing is pinned for A.  Id validation (non-empty, bounded, charset) is the wire
    codec's job (``kvtier.wire.messages``), not the core's."""
    s = Pair()
    j1, _ = s.store("A", 4, 0.0, owner="r1", blocks=(0, 1, 2, 3))
    before = entry(s.p, "A")
    j2, out = s.store("A", 4, 1.0, owner="r2", blocks=(4, 5, 6, 7))
    assert of(out, JobDone) == [JobDone(j2, False, Reason.ID_IN_USE)]
    after = entry(s.p, "A")
    assert after == before and after.jobs == (j1,) and after.owner == "r1"
    out = s.fetch("A", keys("A", 4), 2.0)
    assert of(out, SendBlocks)[0].blocks == (0, 1, 2, 3)
    out = s.complete("A", 0, 2.5)
    assert of(out, JobDone) == [JobDone(j1, True, None)]
    v = s.p.producer("A")
    assert v.state is ProducerState.DONE and v.parked == () and v.jobs == ()
    assert s.p.pending_jobs() == 0


def test_b15_unknown_id_demand_is_bounded_in_time_and_count() -> None:
    """B15: 10 001 fetches for ids never stored: at most max_pending_fetches_per_peer wait (the rest
    are refused at once, ``too_many_pending``), each waits at most fetch_supply_timeout_s (10 s,
    never the consumer's 30 s) before ``Done(fail, supply_timeout)``; a legitimate store+fetch of Y
    meanwhile completes; a fetch for a tombstoned id is refused at once."""
    s = Pair(max_pending=100)
    refused = 0
    for i in range(10_001):
        out = s.fetch(f"X{i}", (b"k",), 0.0)
        refused += sum(1 for m in sent(out, wm.TransferDone) if m.reason == "too_many_pending")
    assert refused == 10_001 - 100
    awaiting_per_peer = snapshot.indexes(s.p)[1]
    assert awaiting_per_peer == ((C, 100),)
    jy, _ = s.store("Y", 2, 0.1)
    out = s.fetch("Y", keys("Y", 2), 0.2)
    (served,) = of(out, SendBlocks)  # a legitimate fetch is not refused by the pending bound
    out = s.complete("Y", served.round, 0.3)
    assert of(out, JobDone) == [JobDone(jy, True, None)]
    assert sent(s.p.fire(9.9), wm.TransferDone) == []
    out = s.p.fire(10.0)
    fails = sent(out, wm.TransferDone)
    assert len(fails) == 100 and {f.reason for f in fails} == {"supply_timeout"}
    assert snapshot.indexes(s.p)[1] == ()
    s.abort("T", 11.0)  # T tombstoned (aborted)
    assert done_fail(s.fetch("T", (b"k",), 11.5), "T").reason == "aborted"


def test_b15_unknown_id_fetch_fails_after_fetch_supply_timeout_never_30s() -> None:
    s = Pair(fetch_supply_timeout_s=7.0)
    job, rnd, out = s.load("X", 1, 0.0)
    assert s.forward_fetch(out, 0.0) == []
    out = s.p.fire(7.0)
    fail = done_fail(out, "X")
    assert fail.reason == "supply_timeout"
    out = s.to_c(fail, 7.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.SUPPLY_TIMEOUT)]  # at t=7, not t=30


def test_b16_a_consumer_that_never_comes_the_reaper_alone_reclaims() -> None:
    """B16: no fetch, no abort, no other traffic — only ticks.  At t=60 A is reaped (its job
    fails, blocks released, tombstoned); at t=120 pruned and no structure references A."""
    s = Pair()
    job, _ = s.store("A", 4, 0.0)
    out = s.p.fire(60.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.REAPED)]
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    s.p.fire(120.0)
    assert not s.p.tracks("A")  # no record, no retained entry, no per-peer index entry, no deadline
    assert all(d.key != "A" for d in s.p.deadlines())
    assert s.p.pending_jobs() == 0


def test_b17_transfer_failure_is_told_to_the_consumer_at_once() -> None:
    """B17: the transfer fails at t=1.2: Done(A, fail, transfer_failed) goes out in that step and
    A's blocks are released; the consumer falls back at once; a late duplicate failure report is
    ignored; if the Done is lost, the consumer's T_load (t=31) is the backstop."""
    s = Pair()
    job, _ = s.store("A", 4, 0.0)
    cjob, rnd, out = s.load("A", 4, 1.0)
    s.forward_fetch(out, 1.0)
    out = s.p.handle(ix.TransferReleased("A", rnd, failed=True), 1.2)
    assert done_fail(out, "A").reason == "transfer_failed"
    assert of(out, JobDone) == [JobDone(job, False, Reason.TRANSFER_FAILED)]
    out = s.done("A", rnd, 1.2, ok=False, reason="transfer_failed")
    assert of(out, JobDone) == [JobDone(cjob, False, Reason.TRANSFER_FAILED)]
    assert of(s.p.handle(ix.TransferReleased("A", rnd, failed=True), 1.3), Ignored)  # late report: ignored
    # the Done lost: the consumer's own deadline ends the load
    s2 = Pair()
    s2.store("A", 4, 0.0)
    cjob, rnd, out = s2.load("A", 4, 1.0)
    s2.forward_fetch(out, 1.0)
    s2.p.handle(ix.TransferReleased("A", rnd, failed=True), 1.2)  # Done(fail) never arrives
    assert sent(s2.c.fire(30.9), wm.AbortFetch) == []
    assert sent(s2.c.fire(31.0), wm.AbortFetch)
    out = s2.c.fire(36.0)  # no answer to the abort: the session is given up, access revoked
    assert of(out, JobDone) == [] and ended(out) == [(P, "abort_unacknowledged")]
    assert of(s2.revoked(out, 36.0), JobDone) == [JobDone(cjob, False, Reason.LOAD_TIMEOUT)]


def test_b19_partial_transfer_failure_releases_the_whole_load() -> None:
    """B19: 8 slots; the first 4 blocks land, sending the rest fails: Done(fail) covers the whole
    load (one load job, all 8 slots released together, the 4 verified keys reported as its
    successful prefix) and the consumer's pending work returns to its baseline.  The result waits
    for the landing's answer (decision I26: the copy may still write into the slots).  Not
    expressible: pool reference counts for keys already present on the consumer (the shell never
    takes a second reference: ``BlockPool.incref`` is its business)."""
    s = Pair()
    s.store("A", 8, 0.0)
    cjob, rnd, out = s.load("A", 8, 0.0)
    s.forward_fetch(out, 0.0)
    out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="A", round=rnd, first=0, count=4), 0.5)
    assert of(out, LandBlocks) == [LandBlocks(P, "A", rnd, 0, (100, 101, 102, 103))]
    out = s.p.handle(ix.TransferReleased("A", rnd, failed=True), 1.0)
    fail = done_fail(out, "A")
    out = s.to_c(fail, 1.0)
    assert of(out, JobDone) == [] and s.c.consumer_state("A").value == "settling"
    out = s.c.handle(ix.BlocksLanded(P, "A", rnd, 0, 4, True), 1.0)
    assert of(out, JobDone) == [JobDone(cjob, False, Reason.TRANSFER_FAILED, keys("A", 4))]
    assert s.c.pending_jobs() == 0 and s.p.pending_jobs() == 0
    # a straggling block for that load is never written
    out = s.to_c(wm.BlockData(gen=s.gen, kv_request_id="A", round=rnd, first=4, count=4), 1.1)
    assert of(out, LandBlocks) == []


def test_b20_zero_block_store_and_fetch_complete_immediately() -> None:
    """B20: a zero-block store succeeds at once and pins nothing; a zero-key fetch is answered
    Done(ok) at once with zero data posts; a zero-key load succeeds at once and its (empty) fetch
    releases the producer's parked blocks; an empty final chunk after non-empty ones completes
    with the others."""
    s = Pair()
    job, out = s.store("A", 0, 0.0)
    assert out == [JobDone(job, True, None)] and s.p.producer("A") is None
    out = s.fetch("A", (), 1.0)
    assert of(out, Send) == [Send(C, wm.TransferDone(gen=s.gen, kv_request_id="A", round=0, ok=True, reason=""))]
    assert of(out, SendBlocks) == []
    assert s.p.pending_jobs() == 0
    cjob = s.next_job()
    s.c.handle(ix.LoadAnnounced("E", P), 1.0)
    out = s.c.handle(ix.LoadSubmitted("E", cjob, (), ()), 1.0)
    assert of(out, JobDone) == [JobDone(cjob, True, None)]
    (empty,) = sent(out, wm.Fetch)  # a zero-key fetch tells the producer to release E at once
    assert empty.keys == []
    je, _ = s.store("E", 2, 0.5)
    out = s.to_p(empty, 1.0)
    # the parked blocks were not needed: the store job succeeds saying so (decision L12)
    assert of(out, JobDone) == [JobDone(je, True, Reason.NOT_NEEDED)] and of(out, SendBlocks) == []
    assert sent(out, wm.TransferDone)[0].ok and s.p.producer_state("E") is ProducerState.DONE
    # a final empty chunk after non-empty ones
    j1, _ = s.store("B", 2, 2.0)
    j2, out = s.store("B", 0, 2.5)
    out = s.fetch("B", keys("B", 2), 3.0, rnd=empty.round + 1)  # the consumer's next round
    assert of(out, SendBlocks)
    out = s.complete("B", empty.round + 1, 3.5)
    assert sorted(of(out, JobDone), key=lambda j: j.job_id) == [JobDone(j1, True, None), JobDone(j2, True, None)]


def test_b29_fetching_a_subset_releases_every_parked_block() -> None:
    """B29: 10 blocks parked, the consumer fetches 6 (4 already cached locally): at Done(A, ok) the
    store job covering all 10 is released and nothing stays pinned for A; only 6 blocks travel."""
    s = Pair()
    job, _ = s.store("A", 10, 0.0)
    out = s.fetch("A", keys("A", 6), 1.0)
    assert len(of(out, SendBlocks)[0].blocks) == 6
    out = s.complete("A", 0, 1.5)
    assert of(out, JobDone) == [JobDone(job, True, None)]
    assert s.p.producer("A").parked == () and s.p.pending_jobs() == 0


@pytest.mark.parametrize("producer_state", ["awaiting", "serving"])
def test_b31_lost_abort_the_producers_own_deadlines_end_it(producer_state: str) -> None:
    """B31: C's T_load fires at t=30 and the abort_fetch is lost.  kvtier does not retry the abort
    (the spec has no retry; not expressible here): the consumer fails the load after
    abort_ack_timeout_s (t=35) and the producer's own deadlines free A — fetch_supply_timeout_s for
    a fetch waiting for blocks, transfer_timeout_s (+ the cancel wait) for a transfer that never
    completes.  Both sides end in a terminal state."""
    s = Pair()
    if producer_state == "serving":
        sjob, _ = s.store("A", 4, 0.0)
    cjob, rnd, out = s.load("A", 4, 0.0)
    s.forward_fetch(out, 0.0)
    assert s.p.producer_state("A").value == producer_state
    out = s.c.fire(30.0)
    assert sent(out, wm.AbortFetch)  # ... and it is lost
    out = s.c.fire(35.0)  # unanswered: the consumer gives the session up and revokes access
    assert of(out, JobDone) == [] and ended(out) == [(P, "abort_unacknowledged")]
    assert of(s.revoked(out, 35.0), JobDone) == [JobDone(cjob, False, Reason.LOAD_TIMEOUT)]
    assert s.c.consumer_state("A") is ConsumerState.FAILED
    if producer_state == "awaiting":
        out = s.p.fire(10.0)
        assert done_fail(out, "A").reason == "supply_timeout"
    else:
        out = s.p.fire(30.0)  # transfer_timeout_s: cancel; the terminal answer waits for the release
        # only a notice says why now (decision I19): the terminal answer still waits
        assert of(out, CancelTransfer) and of(out, JobDone) == []
        assert [(m.ok, m.final, m.reason) for m in sent(out, wm.TransferDone)] == [(False, False, "transfer_timeout")]
        out = s.p.fire(60.0)  # the plane never released: quarantine, the session is ended to force it
        assert of(out, JobDone) == [] and ended(out) == [(C, "transfer_stalled")]
        assert s.p.producer_state("A") is ProducerState.QUARANTINED
        assert s.p.quarantined() == {"A"} and s.p.quarantined_count() == 1  # what the shell's gauge and log read
        assert s.p.quarantined_jobs() == (sjob,) and s.p.quarantined_blocks() == 4
        assert s.p.pending_jobs() == 1  # the engine cannot reuse blocks a send may still read
        out = s.p.handle(ix.TransferReleased("A", rnd), 60.01)  # the dropped connection released them
        assert of(out, JobDone) == [JobDone(sjob, False, Reason.TRANSFER_TIMEOUT)]
        assert s.p.quarantined() == frozenset() and s.p.quarantined_count() == 0
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    assert s.p.pending_jobs() == 0 and s.c.pending_jobs() == 0
