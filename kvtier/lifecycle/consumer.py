"""Consumer (decode-side) machine: the life of one ``kv_request_id`` load.

Theory of operation: the engine announces a request that names a remote producer; a load job
names the keys to fetch and the destination slots.  The fetch waits for the session handshake if
needed (``queued``), is sent (``in_flight``), and block data is written into the slots only while
the load is ``in_flight`` — so once the core reports a load failed, no write into its slots can
land (the data plane is receiver-applied).  Timeouts abort the round and wait (bounded) for the
producer's ``abort_ack`` so the producer releases its blocks promptly.  A failed id makes later
lookups MISS so the engine recomputes locally.

All decisions come from ``_table.CONSUMER_TABLE``; this module supplies guards and effects only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from kvtier.lifecycle._machine import Record, TableMachine
from kvtier.lifecycle._table import (
    CONSUMER_FINAL,
    CONSUMER_INITIAL,
    CONSUMER_STATE_TIMER,
    CONSUMER_TABLE,
    CONSUMER_TIMERS,
    ConsumerEffect,
    ConsumerEvent,
    ConsumerGuard,
    ConsumerState,
)
from kvtier.lifecycle.effects import Effect, Ignored, JobDone, SendAbortFetch, SendFetch, WriteBlocks


@attrs.frozen(slots=True)
class LoadInput:
    """A load job: fetch ``keys`` into pool slots ``slots`` (same length, same order)."""

    kv_request_id: str
    job_id: int
    keys: tuple[bytes, ...]
    slots: tuple[int, ...]


@attrs.frozen(slots=True)
class MessageInput:
    """A producer message about ``kv_request_id``: block_data (``first``/``count``),
    transfer_done (``ok``/``reason``) or abort_ack."""

    kv_request_id: str
    round: int
    first: int = 0
    count: int = 0
    ok: bool = True
    reason: str | None = None


class ConsumerRecord(Record):
    __slots__ = ("peer", "job_id", "keys", "slots", "round", "landed", "n_landed")

    def __init__(self, key: str) -> None:
        super().__init__(key, CONSUMER_INITIAL)
        self.peer: str = ""
        self.job_id: int | None = None
        self.keys: tuple[bytes, ...] = ()
        self.slots: tuple[int, ...] = ()
        self.round = -1
        self.landed: bytearray = bytearray()
        self.n_landed = 0


class ConsumerMachine(TableMachine):
    """All consumer records of one manager."""

    NAME = "consumer"
    TABLE = CONSUMER_TABLE
    STATE_TIMER = CONSUMER_STATE_TIMER
    TIMERS = CONSUMER_TIMERS
    INITIAL = CONSUMER_INITIAL
    FINAL = CONSUMER_FINAL
    GUARD_ENUM = ConsumerGuard
    EFFECT_ENUM = ConsumerEffect

    def __init__(self, durations: Mapping[str, float], session_ready: Callable[[str], bool]) -> None:
        super().__init__(durations)
        self._session_ready = session_ready
        self.by_peer: dict[str, set[str]] = {}
        self._next_round = 0

    def new_record(self, key: str) -> ConsumerRecord:
        return ConsumerRecord(key)

    # -- inputs --------------------------------------------------------------------------------
    def announce(self, kv_request_id: str, peer: str, now: float, out: list[Effect]) -> None:
        rec = self.record(kv_request_id)
        if rec.state is ConsumerState.ABSENT:
            rec.peer = peer
        self.apply(rec, ConsumerEvent.ANNOUNCE, None, now, out)

    def submit_load(self, inp: LoadInput, now: float, out: list[Effect]) -> None:
        if len(inp.keys) != len(inp.slots):
            raise ValueError(f"load job {inp.job_id}: {len(inp.keys)} keys but {len(inp.slots)} slots")
        self.apply(self.record(inp.kv_request_id), ConsumerEvent.SUBMIT_LOAD, inp, now, out)

    def message(self, peer: str, event: ConsumerEvent, inp: MessageInput, now: float, out: list[Effect]) -> None:
        """block_data / transfer_done / abort_ack from ``peer``. A message from a peer other than
        the id's producer is stale (a peer cannot touch another peer's loads)."""
        rec = self.records.get(inp.kv_request_id)
        if rec is not None and rec.peer != peer:
            out.append(Ignored(self.NAME, inp.kv_request_id, rec.state.value, event.value, "stale"))
            return
        self.apply(rec if rec is not None else self.new_record(inp.kv_request_id), event, inp, now, out)

    def event(self, kv_request_id: str, event: ConsumerEvent, now: float, out: list[Effect]) -> None:
        self.apply(self.record(kv_request_id), event, None, now, out)

    def peer_event(self, peer: str, event: ConsumerEvent, now: float, out: list[Effect], inp: object = None) -> None:
        """handshake_ready / peer_lost for every record on ``peer`` (key order); ``inp`` may carry
        the ``reason`` the session died with."""
        for key in sorted(self.by_peer.get(peer, ())):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, event, inp, now, out)

    def broadcast(self, event: ConsumerEvent, now: float, out: list[Effect]) -> None:
        for key in sorted(self.records):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, event, None, now, out)

    # -- introspection -------------------------------------------------------------------------
    def state_of(self, kv_request_id: str) -> ConsumerState:
        rec = self.records.get(kv_request_id)
        return rec.state if rec is not None else ConsumerState.ABSENT

    def pending_jobs(self) -> int:
        return sum(1 for r in self.records.values() if r.job_id is not None)

    def on_state_change(self, rec: ConsumerRecord, old: ConsumerState, new: ConsumerState) -> None:
        if old is ConsumerState.ABSENT:
            self.by_peer.setdefault(rec.peer, set()).add(rec.key)
        if new is ConsumerState.FINISHED:
            peers = self.by_peer.get(rec.peer)
            if peers is not None:
                peers.discard(rec.key)
                if not peers:
                    del self.by_peer[rec.peer]

    # -- guards --------------------------------------------------------------------------------
    def guard_load_empty(self, rec: ConsumerRecord, inp: LoadInput) -> bool:
        return not inp.keys

    def guard_session_ready(self, rec: ConsumerRecord, inp: LoadInput) -> bool:
        return self._session_ready(rec.peer)

    def guard_other_round(self, rec: ConsumerRecord, inp: MessageInput) -> bool:
        return inp.round != rec.round

    def guard_blocks_valid(self, rec: ConsumerRecord, inp: MessageInput) -> bool:
        first, count = inp.first, inp.count
        if count <= 0 or first < 0 or first + count > len(rec.keys):
            return False
        return not any(rec.landed[first : first + count])

    def guard_completes(self, rec: ConsumerRecord, inp: MessageInput) -> bool:
        return self.guard_blocks_valid(rec, inp) and rec.n_landed + inp.count == len(rec.keys)

    def guard_done_fail(self, rec: ConsumerRecord, inp: MessageInput) -> bool:
        return not inp.ok

    def guard_all_received(self, rec: ConsumerRecord, inp: MessageInput) -> bool:
        return rec.n_landed == len(rec.keys)

    # -- effects -------------------------------------------------------------------------------
    def _take_job(self, rec: ConsumerRecord, inp: LoadInput) -> None:
        # rounds are unique per manager, so a reused id never matches an old round
        rec.job_id = inp.job_id
        rec.keys = inp.keys
        rec.slots = inp.slots
        rec.round = self._next_round
        self._next_round += 1
        rec.landed = bytearray(len(inp.keys))
        rec.n_landed = 0

    def effect_accept_load(self, rec: ConsumerRecord, inp: LoadInput, reason, now, out) -> None:
        self._take_job(rec, inp)

    def effect_send_fetch(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        out.append(SendFetch(rec.peer, rec.key, rec.round, rec.keys))

    def effect_write_blocks(self, rec: ConsumerRecord, inp: MessageInput, reason, now, out) -> None:
        first, count = inp.first, inp.count
        rec.landed[first : first + count] = b"\x01" * count
        rec.n_landed += count
        out.append(WriteBlocks(rec.key, rec.slots[first : first + count]))

    def effect_report_load_ok(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        out.append(JobDone(rec.job_id, True, None))
        rec.job_id = None

    def effect_fail_job(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        if rec.job_id is not None:
            out.append(JobDone(rec.job_id, False, reason))
            rec.job_id = None

    def effect_fail_new_job(self, rec: ConsumerRecord, inp: LoadInput, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, False, reason))

    def effect_report_new_job_ok(self, rec: ConsumerRecord, inp: LoadInput, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, True, None))

    def effect_send_abort(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        if rec.round < 0:  # nothing fetched yet: a fresh round names this cancellation
            rec.round = self._next_round
            self._next_round += 1
        out.append(SendAbortFetch(rec.peer, rec.key, rec.round))

    def effect_note_stale(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        out.append(Ignored(self.NAME, rec.key, rec.state.value, "message", reason or "stale"))
