"""Producer (prefill-side) machine: the life of one ``kv_request_id`` whose blocks we park.

Theory of operation: the engine stores blocks (``store``); they stay pinned by the engine until
the store job's result.  A consumer's ``fetch`` binds the id to one (peer, round) and, once every
demanded block is stored, the blocks are sent.  Every way out — success, reap, abort, failure,
timeout, peer death, drain, shutdown — reports every store job exactly once, and every way that
ends without a transfer leaves a *tombstone* carrying the reason, so a late fetch or store is
refused in the step that receives it.  Done and tombstoned ids are retained for
``tombstone_retention_s`` and at most ``tombstone_max`` of them (oldest evicted first).

All decisions come from the generated table (``_table.PRODUCER_TABLE``); this module only
supplies guard predicates and effect builders.  It knows nothing of sockets, torch or clocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvtier.lifecycle._machine import Record, TableMachine
from kvtier.lifecycle._table import (
    PRODUCER_FINAL,
    PRODUCER_INITIAL,
    PRODUCER_STATE_TIMER,
    PRODUCER_TABLE,
    PRODUCER_TIMERS,
    ProducerEffect,
    ProducerEvent,
    ProducerGuard,
    ProducerState,
)
from kvtier.lifecycle.effects import (
    CancelTransfer,
    Effect,
    Ignored,
    JobDone,
    SendAbortAck,
    SendBlocks,
    SendTransferDone,
)

_BOUND = frozenset({ProducerState.AWAITING, ProducerState.SERVING, ProducerState.CANCELLING})
_RETAINED = frozenset({ProducerState.DONE, ProducerState.TOMBSTONED})


@attrs.frozen(slots=True)
class StoreInput:
    """A store job: ``keys[i]`` is stored in pool block ``blocks[i]``; ``owner`` is the engine's
    request id (two requests may not park under one kv_request_id, bug-scenarios B13)."""

    kv_request_id: str
    owner: str
    job_id: int
    keys: tuple[bytes, ...]
    blocks: tuple[int, ...]


@attrs.frozen(slots=True)
class FetchInput:
    """A consumer's fetch (or abort) for ``kv_request_id`` from ``peer`` in ``round``."""

    peer: str
    kv_request_id: str
    round: int
    keys: tuple[bytes, ...] = ()


class ProducerRecord(Record):
    __slots__ = ("owner", "blocks", "jobs", "peer", "round", "demand", "supply_complete")

    def __init__(self, key: str) -> None:
        super().__init__(key, PRODUCER_INITIAL)
        self.owner: str | None = None
        self.blocks: dict[bytes, int] = {}
        self.jobs: list[int] = []
        self.peer: str | None = None
        self.round = -1
        self.demand: tuple[bytes, ...] = ()
        self.supply_complete = False


class ProducerMachine(TableMachine):
    """All producer records of one manager. Inputs take ``now`` (seconds) and append effects."""

    NAME = "producer"
    TABLE = PRODUCER_TABLE
    STATE_TIMER = PRODUCER_STATE_TIMER
    TIMERS = PRODUCER_TIMERS
    INITIAL = PRODUCER_INITIAL
    FINAL = PRODUCER_FINAL
    GUARD_ENUM = ProducerGuard
    EFFECT_ENUM = ProducerEffect

    def __init__(
        self,
        durations: Mapping[str, float],
        *,
        park_clock: str = "last_store",
        tombstone_max: int = 65536,
        max_pending_fetches_per_peer: int = 1024,
    ) -> None:
        super().__init__(durations)
        if park_clock not in ("last_store", "first_store"):
            raise ValueError(f"park_clock must be 'last_store' or 'first_store', got {park_clock!r}")
        self.park_clock_last = park_clock == "last_store"
        self.tombstone_max = tombstone_max
        self.max_pending = max_pending_fetches_per_peer
        self.by_peer: dict[str, set[str]] = {}
        self.awaiting_per_peer: dict[str, int] = {}
        self.retained: dict[str, None] = {}  # insertion-ordered: oldest first
        self.count_evicted = 0

    def new_record(self, key: str) -> ProducerRecord:
        return ProducerRecord(key)

    # -- inputs --------------------------------------------------------------------------------
    def store(self, inp: StoreInput, now: float, out: list[Effect]) -> None:
        if len(inp.keys) != len(inp.blocks):
            raise ValueError(f"store job {inp.job_id}: {len(inp.keys)} keys but {len(inp.blocks)} blocks")
        self.apply(self.record(inp.kv_request_id), ProducerEvent.STORE, inp, now, out)
        self._enforce_cap(now, out)

    def fetch(self, inp: FetchInput, now: float, out: list[Effect]) -> None:
        self.apply(self.record(inp.kv_request_id), ProducerEvent.FETCH, inp, now, out)
        self._enforce_cap(now, out)

    def abort_fetch(self, inp: FetchInput, now: float, out: list[Effect]) -> None:
        self.apply(self.record(inp.kv_request_id), ProducerEvent.ABORT_FETCH, inp, now, out)
        self._enforce_cap(now, out)

    def event(self, kv_request_id: str, event: ProducerEvent, now: float, out: list[Effect], inp: Any = None) -> None:
        """Apply an input that carries no payload (transfer_complete, request_finished, …)."""
        self.apply(self.record(kv_request_id), event, inp, now, out)
        self._enforce_cap(now, out)

    def transfer_event(
        self, kv_request_id: str, round: int, event: ProducerEvent, now: float, out: list[Effect]
    ) -> None:
        """transfer_complete / transfer_failed / transfer_released for a given round; a report
        for a round the id is no longer bound to is stale and dropped."""
        rec = self.records.get(kv_request_id)
        if rec is None or rec.round != round or rec.state not in _BOUND:
            state = rec.state.value if rec is not None else "absent"
            out.append(Ignored(self.NAME, kv_request_id, state, event.value, "stale"))
            return
        self.apply(rec, event, None, now, out)
        self._enforce_cap(now, out)

    def peer_lost(self, peer: str, now: float, out: list[Effect]) -> None:
        for key in sorted(self.by_peer.get(peer, ())):
            rec = self.records.get(key)
            if rec is not None and rec.peer == peer:
                self.apply(rec, ProducerEvent.PEER_LOST, None, now, out)
        self._enforce_cap(now, out)

    def broadcast(self, event: ProducerEvent, now: float, out: list[Effect]) -> None:
        """drain / shutdown: apply to every live record (in key order, deterministically)."""
        for key in sorted(self.records):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, event, None, now, out)
        self._enforce_cap(now, out)

    def tick(self, now: float, out: list[Effect]) -> int:
        fired = super().tick(now, out)
        self._enforce_cap(now, out)
        return fired

    def _enforce_cap(self, now: float, out: list[Effect]) -> None:
        while len(self.retained) > self.tombstone_max:
            key = next(iter(self.retained))
            self.count_evicted += 1
            self.apply(self.records[key], ProducerEvent.PRUNE_DEADLINE, None, now, out)

    # -- introspection -------------------------------------------------------------------------
    def state_of(self, kv_request_id: str) -> ProducerState:
        rec = self.records.get(kv_request_id)
        return rec.state if rec is not None else ProducerState.ABSENT

    def pending_jobs(self) -> int:
        return sum(len(r.jobs) for r in self.records.values())

    # -- indexes -------------------------------------------------------------------------------
    def on_state_change(self, rec: ProducerRecord, old: ProducerState, new: ProducerState) -> None:
        if old is ProducerState.AWAITING:
            self.awaiting_per_peer[rec.peer] -= 1
            if not self.awaiting_per_peer[rec.peer]:
                del self.awaiting_per_peer[rec.peer]
        if new is ProducerState.AWAITING:
            self.awaiting_per_peer[rec.peer] = self.awaiting_per_peer.get(rec.peer, 0) + 1
        if old in _BOUND and new not in _BOUND:
            peers = self.by_peer.get(rec.peer)
            if peers is not None:
                peers.discard(rec.key)
                if not peers:
                    del self.by_peer[rec.peer]
        if new in _BOUND and old not in _BOUND:
            self.by_peer.setdefault(rec.peer, set()).add(rec.key)
        if new in _RETAINED and old not in _RETAINED:
            self.retained[rec.key] = None
        if old in _RETAINED and new not in _RETAINED:
            self.retained.pop(rec.key, None)

    # -- guards (names match spec/lifecycle.toml) ----------------------------------------------
    def guard_store_empty(self, rec: ProducerRecord, inp: StoreInput) -> bool:
        return not inp.keys

    def guard_other_owner(self, rec: ProducerRecord, inp: StoreInput) -> bool:
        return rec.owner is not None and inp.owner != rec.owner

    def guard_park_clock_last(self, rec: ProducerRecord, inp: StoreInput) -> bool:
        return self.park_clock_last

    def guard_fetch_empty(self, rec: ProducerRecord, inp: FetchInput) -> bool:
        return not inp.keys

    def guard_demand_met(self, rec: ProducerRecord, inp: FetchInput) -> bool:
        blocks = rec.blocks
        return all(k in blocks for k in inp.keys)

    def guard_store_meets_demand(self, rec: ProducerRecord, inp: StoreInput) -> bool:
        blocks = rec.blocks
        new = set(inp.keys)
        return all(k in blocks or k in new for k in rec.demand)

    def guard_peer_busy(self, rec: ProducerRecord, inp: FetchInput) -> bool:
        return self.awaiting_per_peer.get(inp.peer, 0) >= self.max_pending

    def guard_same_round(self, rec: ProducerRecord, inp: FetchInput) -> bool:
        return inp.peer == rec.peer and inp.round == rec.round

    def guard_supply_complete(self, rec: ProducerRecord, inp: FetchInput) -> bool:
        return rec.supply_complete

    # -- effects (names match spec/lifecycle.toml) ---------------------------------------------
    def effect_park_blocks(self, rec: ProducerRecord, inp: StoreInput, reason, now, out) -> None:
        if rec.owner is None:
            rec.owner = inp.owner
        blocks = rec.blocks
        for k, b in zip(inp.keys, inp.blocks):
            blocks.setdefault(k, b)
        rec.jobs.append(inp.job_id)

    def effect_report_store_ok(self, rec, inp: StoreInput, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, True, None))

    def effect_fail_store_job(self, rec, inp: StoreInput, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, False, reason))

    def effect_bind(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        rec.peer = inp.peer
        rec.round = inp.round
        rec.demand = inp.keys

    def effect_start_transfer(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        blocks = rec.blocks
        out.append(SendBlocks(rec.peer, rec.key, rec.round, tuple(blocks[k] for k in rec.demand)))

    def effect_cancel_transfer(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        out.append(CancelTransfer(rec.peer, rec.key, rec.round))

    def effect_complete_jobs(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        for job in rec.jobs:
            out.append(JobDone(job, True, None))
        rec.jobs = []
        rec.blocks = {}

    def effect_fail_jobs(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        for job in rec.jobs:
            out.append(JobDone(job, False, reason))
        rec.jobs = []
        rec.blocks = {}

    def effect_reply_done_ok(self, rec: ProducerRecord, inp: FetchInput | None, reason, now, out) -> None:
        if inp is not None:
            out.append(SendTransferDone(inp.peer, rec.key, inp.round, True, None))
        else:
            out.append(SendTransferDone(rec.peer, rec.key, rec.round, True, None))

    def effect_reply_done_fail(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        out.append(SendTransferDone(rec.peer, rec.key, rec.round, False, reason))

    def effect_reply_fetch_failed(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        out.append(SendTransferDone(inp.peer, rec.key, inp.round, False, reason))

    def effect_reply_abort_ack(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        out.append(SendAbortAck(inp.peer, rec.key, inp.round))

    def effect_note_supply_complete(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        rec.supply_complete = True

    def effect_note_duplicate(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        out.append(Ignored(self.NAME, rec.key, rec.state.value, "fetch", "stale"))
