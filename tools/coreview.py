"""Point reads of a :class:`~kvtier.lifecycle.TierCore` for tests and tools: one session, one
producer record, the ids of each machine, the deadlines, the jobs still open.

They are not the core's: a running tier never asks them, so the runtime carries only the reads
its shell, metrics endpoint and forensics use (decision W12).  Every answer here is computed from
the core's public surface — :meth:`TierCore.records` (every record as frozen views),
:meth:`TierCore.snapshot` (counts) and :meth:`TierCore.probe_answers` — so it reads exactly what
an operator's introspection would, and nothing here reaches into a machine.

    view = CoreView(core)
    assert view.session_ready("p") and view.producer("A").state is ProducerState.PARKED

Each call reads the core afresh (O(records)): a view stays valid while the core changes.
"""

from __future__ import annotations

from kvtier.lifecycle import (
    Answer,
    CoreRecords,
    DeadlineView,
    ProbeView,
    ProducerView,
    ServeState,
    ServeView,
    SessionState,
    SessionView,
    TierCore,
)

__all__ = ["CoreView"]


class CoreView:
    """Reads of one core (see the module docstring)."""

    def __init__(self, core: TierCore) -> None:
        self.core = core

    def _records(self) -> CoreRecords:
        return self.core.records()

    # -- sessions -----------------------------------------------------------------------------
    def session(self, peer: str) -> SessionView | None:
        """The live session with ``peer``, or None."""
        return next((v for v in self._records().sessions if v.peer == peer), None)

    def sessions(self) -> list[SessionView]:
        """Every live session (peer order)."""
        return list(self._records().sessions)

    def session_gen(self, peer: str) -> int | None:
        """The generation of the live session with ``peer`` (None when there is none)."""
        v = self.session(peer)
        return v.gen if v is not None else None

    def session_state(self, peer: str) -> SessionState:
        """The session state with ``peer`` (``absent`` when there is no record)."""
        v = self.session(peer)
        return v.state if v is not None else SessionState.ABSENT

    def session_ready(self, peer: str) -> bool:
        """True when the session with ``peer`` is ready."""
        return self.session_state(peer) is SessionState.READY

    def suspect_instances(self) -> frozenset[str]:
        """Producer instances (by name) whose sessions are suspect (decision I7); the core keys
        them by name and host (``instance@host``, decision I33): :meth:`suspect_fates`."""
        return frozenset(k.rsplit("@", 1)[0] for k in self._records().suspect)

    def suspect_fates(self) -> frozenset[str]:
        """The suspect instances as the core keys them: ``instance@host`` (decision I33)."""
        return self._records().suspect

    # -- the producer ---------------------------------------------------------------------------
    def producer(self, kv_request_id: str) -> ProducerView | None:
        """The producer record of ``kv_request_id`` (live or retained), or None."""
        return next((v for v in self._records().producers if v.kv_request_id == kv_request_id), None)

    def producer_ids(self) -> list[str]:
        """Every id the producer keeps a record of (live or retained), sorted."""
        return [v.kv_request_id for v in self._records().producers]

    def tracks(self, kv_request_id: str) -> bool:
        """True while the producer keeps anything about ``kv_request_id``: a record, a retained
        entry, a per-peer index entry or a live deadline (a pruned id leaves nothing behind)."""
        r = self._records()
        return (any(v.kv_request_id == kv_request_id for v in r.producers) or kv_request_id in r.retained
                or any(kv_request_id in ids for ids in r.bound.values())
                or any(d.machine == "producer" and d.key == kv_request_id for d in r.deadlines))

    def retained(self) -> int:
        """Done or tombstoned ids retained (bounded by ``tombstone_max``)."""
        return len(self._records().retained)

    def evicted(self) -> int:
        """Retained ids evicted early by the ``tombstone_max`` cap since start."""
        return self.core.snapshot().evicted

    def quarantined(self) -> frozenset[str]:
        """Producer ids in ``quarantined`` (decision I1)."""
        return self._records().quarantined

    def quarantined_jobs(self) -> tuple[int, ...]:
        """The store jobs of the quarantined ids (id order)."""
        r = self._records()
        return tuple(j for v in r.producers if v.kv_request_id in r.quarantined for j in v.jobs)

    # -- consumers and jobs ---------------------------------------------------------------------
    def consumer_ids(self) -> list[str]:
        """Every id the (PD) consumer keeps a record of, sorted."""
        return [v.kv_request_id for v in self._records().consumers]

    def outstanding_jobs(self) -> frozenset[int]:
        """The ids of the jobs handed to the core that have no result yet."""
        r = self._records()
        jobs = {j for v in r.producers for j in v.jobs}
        jobs.update(v.job_id for v in (*r.consumers, *r.round_loads) if v.job_id is not None)
        return frozenset(jobs)

    def pending_jobs(self) -> int:
        """How many jobs handed to the core have no result yet."""
        r = self._records()
        return (sum(len(v.jobs) for v in r.producers)
                + sum(1 for v in (*r.consumers, *r.round_loads) if v.job_id is not None))

    # -- the symmetric path ---------------------------------------------------------------------
    def probe(self, kv_request_id: str) -> ProbeView | None:
        """The probe record of symmetric request ``kv_request_id``, or None."""
        return next((v for v in self._records().probes if v.kv_request_id == kv_request_id), None)

    def probe_answer(self, kv_request_id: str, key: bytes) -> Answer:
        """What a lookup of ``key`` for ``kv_request_id`` answers now (the rule of
        :class:`~kvtier.lifecycle.views.ProbeAnswers`)."""
        a = self.core.probe_answers(kv_request_id)
        if a.dead or key in a.miss:
            return Answer.MISS
        if key in a.hit:
            return Answer.HIT
        return Answer.RETRY if key in a.retry else Answer.MISS

    def serve(self, peer: str, kv_request_id: str, round: int) -> ServeView | None:
        """One serve record, or None."""
        want = (peer, kv_request_id, round)
        return next((v for v in self._records().serves if (v.peer, v.kv_request_id, v.round) == want), None)

    def serve_state(self, peer: str, kv_request_id: str, round: int) -> ServeState:
        """The serve state of ``peer``'s round ``round`` of ``kv_request_id`` (``absent``: none)."""
        v = self.serve(peer, kv_request_id, round)
        return v.state if v is not None else ServeState.ABSENT

    def serve_ids(self) -> list[tuple[str, str, int]]:
        """Every live serve record's ``(peer, kv_request_id, round)``, sorted."""
        return sorted((v.peer, v.kv_request_id, v.round) for v in self._records().serves)

    def pins_held(self) -> frozenset[int]:
        """Engine pins the serve records hold."""
        return self._records().pins

    def serve_pinned_blocks(self) -> int:
        """Blocks those pins hold."""
        return self.core.snapshot().serve_pinned_blocks

    # -- deadlines ------------------------------------------------------------------------------
    def deadlines(self) -> list[DeadlineView]:
        """Every live deadline, earliest first (ties: machine, then key)."""
        return list(self._records().deadlines)

    def deadline_entries(self) -> int:
        """Entries in the machines' deadline queues, stale ones not yet dropped included."""
        return self.core.snapshot().deadline_entries
