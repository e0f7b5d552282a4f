"""The core's read API: everything the shell, metrics, tools and tests ask a :class:`~kvtier.lifecycle.TierCore`
(decision C8: nothing outside ``kvtier.lifecycle`` reads a machine's records).  Frozen views
(:mod:`kvtier.lifecycle.views`), states, counts, quarantine, deadlines and the symmetric path's
answers; O(1) unless a method says otherwise.  A mixin of :class:`~kvtier.lifecycle.TierCore`: it
reads the machines the core built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.lifecycle._table import ConsumerState, ProbeState, ProducerState, ServeState, SessionState
from kvtier.lifecycle.consumer import ConsumerMachine
from kvtier.lifecycle.probe import Answer
from kvtier.lifecycle.producer_records import RETAINED
from kvtier.lifecycle.session import HelloInput
from kvtier.lifecycle.views import (
    ConsumerView,
    CoreSnapshot,
    ProbeAnswers,
    ProbeView,
    ProducerView,
    ServeView,
    SessionView,
)

__all__ = ["CoreReads"]

_P_IN_FLIGHT = frozenset(
    {ProducerState.SERVING, ProducerState.DELIVERING, ProducerState.CONFIRMED, ProducerState.CANCELLING,
     ProducerState.QUARANTINED}
)
_P_AWAITING_RECEIPT = frozenset({ProducerState.SERVING, ProducerState.DELIVERING})
_C_IN_FLIGHT = frozenset(
    {ConsumerState.IN_FLIGHT, ConsumerState.ABORTING, ConsumerState.CANCELLING, ConsumerState.REVOKING,
     ConsumerState.GIVEN_UP, ConsumerState.SETTLING}
)
_S_IN_FLIGHT = frozenset({ServeState.SERVING, ServeState.DELIVERING, ServeState.CONFIRMED, ServeState.CANCELLING,
                          ServeState.QUARANTINED})


class CoreReads:
    """The read API of :class:`~kvtier.lifecycle.TierCore` (mixin; the core owns the machines)."""

    _producer: Any
    _consumer: Any
    _sessions: Any
    _probe: Any
    _rounds: Any
    _serve: Any

    def session(self, peer: str) -> SessionView | None:
        """The live session with ``peer``, or None."""
        rec = self._sessions.records.get(peer)
        if rec is None:
            return None
        return SessionView(rec.key, rec.state, rec.gen, rec.dialled, rec.instance, rec.principal, rec.heard)

    def session_gen(self, peer: str) -> int | None:
        """The generation of the live session with ``peer`` (None when there is none)."""
        rec = self._sessions.records.get(peer)
        return rec.gen if rec is not None else None

    def suspect_instances(self) -> frozenset[str]:
        """Producer instances whose sessions are suspect (one died abnormally, none heard from
        since): new loads to any of their sessions fail fast (decision I7)."""
        return frozenset(self._sessions.suspect)

    def session_ready(self, peer: str) -> bool:
        """True when the session with ``peer`` is ready."""
        return self._sessions.ready(peer)

    def sessions(self) -> list[SessionView]:
        """Every live session (peer order)."""
        return [v for p in sorted(self._sessions.records) if (v := self.session(p)) is not None]

    def producer_state(self, kv_request_id: str) -> ProducerState:
        """The producer state of ``kv_request_id`` (``absent`` when there is no record)."""
        return self._producer.state_of(kv_request_id)

    def consumer_state(self, kv_request_id: str) -> ConsumerState:
        """The consumer state of ``kv_request_id`` (``absent`` when there is no record)."""
        return self._consumer.state_of(kv_request_id)

    def session_state(self, peer: str) -> SessionState:
        """The session state with ``peer`` (``absent`` when there is no record)."""
        rec = self._sessions.records.get(peer)
        return rec.state if rec is not None else SessionState.ABSENT

    def producer(self, kv_request_id: str) -> ProducerView | None:
        """A snapshot of the producer record of ``kv_request_id``, or None."""
        r = self._producer.records.get(kv_request_id)
        if r is None:
            return None
        return ProducerView(
            r.key, r.state, r.reason, tuple(r.jobs), r.peer, r.gen, r.round, tuple(r.demand), r.consumer,
            tuple(r.blocks), r.receipt, self._producer.deadline_of(r.key),
        )

    def consumer(self, kv_request_id: str) -> ConsumerView | None:
        """A snapshot of the (PD) consumer record of ``kv_request_id``, or None (a symmetric
        round's load: :meth:`round_loads`)."""
        r = self._consumer.records.get(kv_request_id)
        if r is None:
            return None
        return self._consumer_view(r, self._consumer)

    def producer_ids(self) -> list[str]:
        """Every id the producer keeps a record of (live or retained), sorted."""
        return sorted(self._producer.records)

    def consumer_ids(self) -> list[str]:
        """Every id the consumer keeps a record of, sorted."""
        return sorted(self._consumer.records)

    def tracks(self, kv_request_id: str) -> bool:
        """True while the producer keeps anything about ``kv_request_id``: a record, a retained
        entry, a per-peer index entry or a live deadline (a pruned id leaves nothing behind)."""
        p = self._producer
        return (
            kv_request_id in p.records
            or kv_request_id in p.retained
            or any(kv_request_id in ids for ids in p.by_peer.values())
            or p.deadline_of(kv_request_id) is not None
        )

    def producer_count(self) -> int:
        """Producer records (live and retained)."""
        return len(self._producer.records)

    def retained(self) -> int:
        """Done or tombstoned ids retained (bounded by ``tombstone_max``)."""
        return len(self._producer.retained)

    def evicted(self) -> int:
        """Retained ids evicted early by the ``tombstone_max`` cap since start."""
        return self._producer.count_evicted

    def quarantined(self) -> frozenset[str]:
        """Producer ids in ``quarantined``: the data plane never confirmed their release, so
        their store jobs stay outstanding (decision I1). O(1) to ask whether there are any."""
        return frozenset(self._producer.quarantined)

    def quarantined_count(self) -> int:
        """How many producer ids are quarantined (O(1): the shell asks every tick)."""
        return len(self._producer.quarantined)

    def quarantined_blocks(self) -> int:
        """Pool blocks held by quarantined producer ids."""
        recs = self._producer.records
        return sum(len(recs[k].blocks) for k in self._producer.quarantined)

    def quarantined_jobs(self) -> tuple[int, ...]:
        """The store jobs of the quarantined ids."""
        recs = self._producer.records
        return tuple(j for k in sorted(self._producer.quarantined) for j in recs[k].jobs)

    def revoking_slots(self) -> int:
        """Consumer slots held in ``revoking`` (no write may land, not yet proven), PD loads and
        symmetric rounds' loads."""
        return sum(len(r.slots) for m in (self._consumer, self._rounds) for r in m.records.values()
                   if r.state is ConsumerState.REVOKING)

    def awaiting_receipt_jobs(self) -> int:
        """Store jobs whose blocks were handed over and that wait for the consumer's receipt."""
        return sum(len(r.jobs) for r in self._producer.records.values() if r.state in _P_AWAITING_RECEIPT)

    def loading(self) -> bool:
        """True while any load of ours is outstanding (a peer may be writing into our pool)."""
        return bool(self._consumer.by_peer) or bool(self._rounds.by_peer)

    def snapshot(self) -> CoreSnapshot:
        """Counts for the metrics endpoint (O(records): computed at scrape time, not per tick)."""
        live: dict[str, int] = {}
        pinned: dict[str, int] = {}
        retained: dict[tuple[str, str], int] = {}
        parked: list[str] = []
        for kid, r in self._producer.records.items():
            st = r.state.value
            if r.state in RETAINED:
                key = (st, r.reason.value if r.reason is not None else "")
                retained[key] = retained.get(key, 0) + 1
                continue
            live[st] = live.get(st, 0) + 1
            pinned[st] = pinned.get(st, 0) + len(r.blocks)
            if r.state is ProducerState.PARKED:
                parked.append(kid)

        def count(records: Mapping) -> dict[str, int]:
            c: dict[str, int] = {}
            for r in records.values():
                c[r.state.value] = c.get(r.state.value, 0) + 1
            return c

        consumer = count(self._consumer.records)
        for st, n in count(self._rounds.records).items():
            consumer[st] = consumer.get(st, 0) + n
        return CoreSnapshot(
            producer=live, pinned_blocks=pinned, retained=retained, parked=tuple(parked),
            consumer=consumer, sessions=count(self._sessions.records),
            awaiting_receipt_jobs=self.awaiting_receipt_jobs(), quarantined_blocks=self.quarantined_blocks(),
            revoking_slots=self.revoking_slots(), probe=count(self._probe.records), serve=count(self._serve.records),
            serve_pinned_blocks=self._serve.pinned_total,
        )

    def load_failed(self, kv_request_id: str) -> bool:
        """True when lookups for this id must MISS (the engine should recompute)."""
        return self._consumer.state_of(kv_request_id) is ConsumerState.FAILED

    def busy(self) -> bool:
        """True while a transfer or a load is in flight (what shutdown's grace waits for)."""
        return (any(r.state in _P_IN_FLIGHT for r in self._producer.records.values())
                or any(r.state in _C_IN_FLIGHT for m in (self._consumer, self._rounds) for r in m.records.values())
                or any(r.state in _S_IN_FLIGHT for r in self._serve.records.values()))

    def pending_jobs(self) -> int:
        """Jobs handed to the core that have no result yet."""
        return self._producer.pending_jobs() + self._consumer.pending_jobs() + self._rounds.pending_jobs()

    def outstanding_jobs(self) -> frozenset[int]:
        """The ids of the jobs handed to the core that have no result yet."""
        jobs = {j for r in self._producer.records.values() for j in r.jobs}
        for m in (self._consumer, self._rounds):
            jobs.update(r.job_id for r in m.records.values() if r.job_id is not None)
        return frozenset(jobs)

    # -- the symmetric path ----------------------------------------------------------------------
    def probe_state(self, kv_request_id: str) -> ProbeState:
        """The probe state of symmetric request ``kv_request_id`` (``absent``: no record)."""
        return self._probe.state_of(kv_request_id)

    def probe_answer(self, kv_request_id: str, key: bytes) -> Answer:
        """What a lookup of ``key`` for symmetric request ``kv_request_id`` answers now: RETRY
        while its round waits for the peer (bounded by ``probe_timeout_s``), HIT for a key the
        peer pins for us (or a load of ours is fetching), MISS otherwise."""
        return self._probe.answer(kv_request_id, key)

    def probe_answers(self, kv_request_id: str) -> ProbeAnswers:
        """Every key's answer for symmetric request ``kv_request_id`` at once (the rule of
        :meth:`probe_answer`, as sets: for the shell to publish to the engine's thread)."""
        r = self._probe.records.get(kv_request_id)
        if r is None or r.state is ProbeState.FAILED:
            return ProbeAnswers()
        retry = (frozenset(r.unsent) | frozenset(r.waiting)
                 if r.state in (ProbeState.COLLECTING, ProbeState.PROBING) else frozenset())
        return ProbeAnswers(False, frozenset(r.offered) | frozenset(r.loading), retry, frozenset(r.miss))

    def probe(self, kv_request_id: str) -> ProbeView | None:
        """A snapshot of the probe record of ``kv_request_id``, or None."""
        r = self._probe.records.get(kv_request_id)
        if r is None:
            return None
        loads = tuple(v for rec in self._rounds.of_request(kv_request_id) if (v := self._consumer_view(rec, self._rounds)))
        return ProbeView(r.key, r.state, r.reason, r.peer, r.round, r.sent, tuple(r.unsent), tuple(r.waiting),
                         frozenset(r.offered), frozenset(r.miss), dict(r.loading), loads,
                         self._probe.deadline_of(r.key))

    def probe_ids(self) -> list[str]:
        """Every symmetric request with a probe record, sorted."""
        return sorted(self._probe.records)

    def serve_state(self, peer: str, kv_request_id: str, round: int) -> ServeState:
        """The serve state of ``peer``'s round ``round`` of ``kv_request_id`` (``absent``: none)."""
        return self._serve.state_of((peer, kv_request_id, round))

    def serve(self, peer: str, kv_request_id: str, round: int) -> ServeView | None:
        """A snapshot of one serve record, or None."""
        r = self._serve.records.get((peer, kv_request_id, round))
        if r is None:
            return None
        return ServeView(r.peer, r.kv_request_id, r.round, r.state, r.reason, tuple(r.keys), dict(r.found),
                         frozenset(r.missing), frozenset(r.todo), tuple(r.pins), r.demand, r.receipt,
                         self._serve.deadline_of(r.key))

    def serve_ids(self) -> list[tuple[str, str, int]]:
        """Every live serve record's ``(peer, kv_request_id, round)``, sorted."""
        return sorted(self._serve.records)

    def serve_wants(self, peer: str, kv_request_id: str, round: int) -> bool:
        """True while the round still waits for lookups in the engine's tiers (``looking_up``): a
        serve window skips a queued lookup the core no longer wants."""
        return self._serve.state_of((peer, kv_request_id, round)) is ServeState.LOOKING_UP

    def pins_held(self) -> frozenset[int]:
        """Engine pins the serve records hold (each is released exactly once)."""
        return frozenset(self._serve.pins_held())

    def serve_pinned_blocks(self) -> int:
        """Blocks those pins hold."""
        return self._serve.pinned_total

    def symmetric_work(self) -> bool:
        """True while a probe round waits (RETRY), a serve record lives or a round's load is out:
        the engine must keep stepping (``has_pending_work``)."""
        return bool(self._probe.collecting) or any(
            r.state in (ProbeState.PROBING, ProbeState.OFFERED) for r in self._probe.records.values()
        ) or bool(self._serve.records) or bool(self._rounds.records)

    def round_loads(self, kv_request_id: str | None = None) -> list[ConsumerView]:
        """The loads of symmetric rounds (all, or those of ``kv_request_id``), as consumer views
        (their ``kv_request_id`` is the request's; ``round`` tells them apart)."""
        recs = (self._rounds.of_request(kv_request_id) if kv_request_id is not None
                else [self._rounds.records[k] for k in sorted(self._rounds.records)])
        return [self._consumer_view(r, self._rounds) for r in recs]

    def _consumer_view(self, r: Any, m: ConsumerMachine) -> ConsumerView:
        return ConsumerView(r.kv_request_id, r.state, r.reason, r.peer, r.job_id, r.round, tuple(r.keys),
                            tuple(r.slots), r.n_landed, m.deadline_of(r.key))

    def set_local(self, local: HelloInput) -> None:
        """Replace our hello (e.g. the hash seed became known); established sessions keep the
        one they were checked with, every later handshake uses this one."""
        self._sessions.local = local

    @property
    def local(self) -> HelloInput:
        return self._sessions.local
