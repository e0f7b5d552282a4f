"""The reads of :class:`~kvtier.lifecycle.TierCore` that span several machines, as a part the core
owns (decision W12): the metrics counts (:class:`~kvtier.lifecycle.views.CoreSnapshot`), every
record as frozen views (:class:`~kvtier.lifecycle.views.CoreRecords`), and the questions the shell
asks of more than one machine (busy, symmetric work, probe answers, rounds' loads).  It holds the
machines the core built and only reads them (decision C8: nothing outside ``kvtier.lifecycle``
reads a machine's records).  O(1) unless a method says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.lifecycle._table import ConsumerState, ProbeState, ProducerState, ServeState
from kvtier.lifecycle.consumer import ConsumerMachine
from kvtier.lifecycle.probe import ProbeMachine, RoundLoads
from kvtier.lifecycle.producer import ProducerMachine
from kvtier.lifecycle.producer_records import RETAINED
from kvtier.lifecycle.serve import ServeMachine
from kvtier.lifecycle.session import SessionMachine
from kvtier.lifecycle.views import (
    ConsumerView,
    CoreRecords,
    CoreSnapshot,
    DeadlineView,
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


def _count(records: Mapping) -> dict[str, int]:
    c: dict[str, int] = {}
    for r in records.values():
        c[r.state.value] = c.get(r.state.value, 0) + 1
    return c


class CoreReads:
    """Reads over the core's machines (a part of :class:`~kvtier.lifecycle.TierCore`)."""

    def __init__(self, sessions: SessionMachine, producer: ProducerMachine, consumer: ConsumerMachine,
                 probe: ProbeMachine, rounds: RoundLoads, serve: ServeMachine) -> None:
        self._sessions, self._producer, self._consumer = sessions, producer, consumer
        self._probe, self._rounds, self._serve = probe, rounds, serve

    def consumer(self, kv_request_id: str) -> ConsumerView | None:
        r = self._consumer.records.get(kv_request_id)
        return None if r is None else self._consumer_view(r, self._consumer)

    def awaiting_ids(self, seen: int) -> tuple[int, frozenset[str] | None]:
        p = self._producer
        v = p.awaiting_version
        return v, (None if v == seen else frozenset(p.awaiting_n))

    def quarantined_blocks(self) -> int:
        recs = self._producer.records
        return sum(len(recs[k].blocks) for k in self._producer.quarantined)

    def busy(self) -> bool:
        return (any(r.state in _P_IN_FLIGHT for r in self._producer.records.values())
                or any(r.state in _C_IN_FLIGHT for m in (self._consumer, self._rounds) for r in m.records.values())
                or any(r.state in _S_IN_FLIGHT for r in self._serve.records.values()))

    def probe_answers(self, kv_request_id: str) -> ProbeAnswers:
        # RETRY only in the two states that carry the probe timer (property probe_answered_in_bound)
        r = self._probe.records.get(kv_request_id)
        if r is None or r.state is ProbeState.FAILED:
            return ProbeAnswers()
        retry = (frozenset(r.unsent) | frozenset(r.waiting)
                 if r.state in (ProbeState.COLLECTING, ProbeState.PROBING) else frozenset())
        return ProbeAnswers(False, frozenset(r.offered) | frozenset(r.loading), retry, frozenset(r.miss))

    def symmetric_work(self) -> bool:
        return bool(self._probe.collecting) or any(
            r.state in (ProbeState.PROBING, ProbeState.OFFERED) for r in self._probe.records.values()
        ) or bool(self._serve.records) or bool(self._rounds.records)

    def round_loads(self, kv_request_id: str | None = None) -> list[ConsumerView]:
        recs = (self._rounds.of_request(kv_request_id) if kv_request_id is not None
                else [self._rounds.records[k] for k in sorted(self._rounds.records)])
        return [self._consumer_view(r, self._rounds) for r in recs]

    # -- whole-core records (O(records)) ---------------------------------------------------------
    def snapshot(self) -> CoreSnapshot:
        live: dict[str, int] = {}
        pinned: dict[str, int] = {}
        retained: dict[tuple[str, str], int] = {}
        parked: list[str] = []
        awaiting = 0
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
            elif r.state in _P_AWAITING_RECEIPT:
                awaiting += len(r.jobs)
        consumer = _count(self._consumer.records)
        for st, n in _count(self._rounds.records).items():
            consumer[st] = consumer.get(st, 0) + n
        revoking = sum(len(r.slots) for m in (self._consumer, self._rounds) for r in m.records.values()
                       if r.state is ConsumerState.REVOKING)
        return CoreSnapshot(
            producer=live, pinned_blocks=pinned, retained=retained, parked=tuple(parked),
            consumer=consumer, sessions=_count(self._sessions.records), awaiting_receipt_jobs=awaiting,
            quarantined_blocks=self.quarantined_blocks(), revoking_slots=revoking, probe=_count(self._probe.records),
            serve=_count(self._serve.records), serve_pinned_blocks=self._serve.pinned_total,
            evicted=self._producer.count_evicted,
            deadline_entries=sum(m.deadline_entries() for m in (self._sessions, self._producer, self._consumer)),
        )

    def records(self) -> CoreRecords:
        p, s, c, q, rounds, v = (self._producer, self._sessions, self._consumer, self._probe, self._rounds,
                                 self._serve)
        # each machine's live deadlines once (a record's own lookup scans its queue: O(n) each)
        live = {name: m.live_deadlines() for name, m in (("session", s), ("producer", p), ("consumer", c),
                                                         ("probe", q), ("rounds", rounds), ("serve", v))}
        due = {name: {key: when for when, key, _lane in entries} for name, entries in live.items()}
        deadlines = [DeadlineView(when, name, key, lane) for name in ("session", "producer", "consumer")
                     for when, key, lane in live[name]]
        deadlines.extend(DeadlineView(when, p.NAME, key, p.records[key].timer) for key, when in p.retained.items())
        deadlines.sort(key=lambda d: (d.when, d.machine, d.key))
        due["producer"].update(p.retained)  # a retained id's deadline is its prune
        return CoreRecords(
            sessions=tuple(SessionView(r.key, r.state, r.gen, r.dialled, r.instance, r.principal, r.heard)
                           for r in (s.records[k] for k in sorted(s.records))),
            suspect=frozenset(s.suspect),
            producers=tuple(self._producer_view(p.records[k], due["producer"]) for k in sorted(p.records)),
            retained=frozenset(p.retained),
            bound={peer: frozenset(ids) for peer, ids in p.by_peer.items()},
            quarantined=frozenset(p.quarantined),
            consumers=tuple(self._consumer_view(c.records[k], due["consumer"]) for k in sorted(c.records)),
            round_loads=tuple(self._consumer_view(rounds.records[k], due["rounds"]) for k in sorted(rounds.records)),
            probes=tuple(self._probe_view(q.records[k], due) for k in sorted(q.records)),
            serves=tuple(self._serve_view(v.records[k], due["serve"]) for k in sorted(v.records)),
            pins=frozenset(v.pins_held()),
            deadlines=tuple(deadlines),
        )

    def _producer_view(self, r: Any, due: Mapping[Any, float]) -> ProducerView:
        return ProducerView(r.key, r.state, r.reason, tuple(r.jobs), r.peer, r.gen, r.round, tuple(r.demand),
                            r.consumer, tuple(r.blocks), r.receipt, due.get(r.key))

    def _consumer_view(self, r: Any, due: Mapping[Any, float] | ConsumerMachine) -> ConsumerView:
        when = due.deadline_of(r.key) if isinstance(due, ConsumerMachine) else due.get(r.key)
        return ConsumerView(r.kv_request_id, r.state, r.reason, r.peer, r.job_id, r.round, tuple(r.keys),
                            tuple(r.slots), r.n_landed, when)

    def _probe_view(self, r: Any, due: Mapping[str, Mapping[Any, float]]) -> ProbeView:
        loads = tuple(self._consumer_view(rec, due["rounds"]) for rec in self._rounds.of_request(r.key))
        return ProbeView(r.key, r.state, r.reason, r.peer, r.round, r.sent, tuple(r.unsent), tuple(r.waiting),
                         frozenset(r.offered), frozenset(r.miss), dict(r.loading), loads, due["probe"].get(r.key))

    def _serve_view(self, r: Any, due: Mapping[Any, float]) -> ServeView:
        return ServeView(r.peer, r.kv_request_id, r.round, r.state, r.reason, tuple(r.keys), dict(r.found),
                         frozenset(r.missing), frozenset(r.todo), tuple(r.pins), r.demand, r.receipt, due.get(r.key))
