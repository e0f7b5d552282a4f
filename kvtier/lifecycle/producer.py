"""Producer (prefill-side) machine: the life of one ``kv_request_id`` whose blocks we park.

Theory of operation: the engine stores blocks (``store``) with the digest of each block taken
when it was parked; they stay pinned by the engine until the store job's result.  A consumer's
``fetch`` binds the id to one (peer, generation, round) and, once every demanded block is stored,
the blocks are handed to the data plane (``serving``).  Two facts end a transfer well: the data
plane *released* every block (it references none of them any more) and the consumer sent a
*receipt* (every block landed and matched its digest).  Only then do the store jobs succeed
(``done``); a job's result is never reported while the plane may still read its blocks (rule 11 of
decision I1, scenarios B26/B32).  A transfer that is given up (deadline, abort, peer
death, shutdown) waits in ``cancelling`` for the release; if the plane does not release in time the
session with the peer is ended to force it and the id waits in ``quarantined`` — its jobs stay
outstanding rather than be reported early.  The terminal answer to the consumer is sent only when
no write can land any more, so a one-sided plane's consumer may reuse its slots on receiving it.

Every way out reports every store job exactly once, and every way that ends without a confirmed
transfer leaves a *tombstone* carrying the reason, so a late fetch or store is refused in the step
that receives it.  Done and tombstoned ids are retained for ``tombstone_retention_s`` and at most
``tombstone_max`` of them (oldest evicted first); a retained record keeps only its state, reason and
timer (no keys, no blocks), so its size does not depend on the fetch.

All decisions come from the generated table (``_table.PRODUCER_TABLE``); this module only
supplies guard predicates and effect builders.  It knows nothing of sockets, torch or clocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from kvtier.config import DEFAULTS
from kvtier.lifecycle._machine import TableMachine
from kvtier.lifecycle._table import (PRODUCER_FINAL, PRODUCER_INITIAL, PRODUCER_STATE_TIMER, PRODUCER_TABLE,
                                     PRODUCER_TIMERS, ProducerEffect, ProducerEvent, ProducerGuard, ProducerState,
                                     Reason)
from kvtier.lifecycle.batches import Batcher
from kvtier.lifecycle.effects import CancelTransfer, Effect, Ignored, JobDone, Send
from kvtier.lifecycle.inputs import StoreSubmitted
from kvtier.lifecycle.notes import GiveUp, Notes
from kvtier.lifecycle.producer_records import (_NO_BLOCKS, REFERENCED, RETAINED, FetchInput, ProducerRecord,
                                               RetainedRecord)
from kvtier.wire import messages as wm

_BOUND = frozenset({ProducerState.AWAITING, ProducerState.SERVING, ProducerState.DELIVERING, ProducerState.CONFIRMED,
                    ProducerState.CANCELLING, ProducerState.QUARANTINED})
PENDING_KEYS_PER_FETCH = 256
"""A peer's awaiting fetches may name at most this many keys per ``max_pending_fetches_per_peer``
(256 × 1024 = 262,144 by default, ~26 MiB of bookkeeping): a fetch's keys are kept while it waits
for its blocks, so a bound on fetches alone let one peer pin ~2.6 MiB per fetch of 28,000 keys
(decision I34)."""


def _other(held: str | None, named: str | None) -> bool:
    """Whether a retained id answers ``held``, a principal other than the consumer a producer
    request names (``named``): then the request starts the id afresh (decision L17)."""
    return held is not None and named is not None and held != named


class ProducerMachine(TableMachine):
    """All producer records of one manager. Inputs take ``now`` (seconds) and append effects."""

    batcher: Batcher = Batcher(0, None, True)
    """Builds transfers and their headers (the core installs one sized for its pool)."""
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
        park_clock: str = DEFAULTS["park_clock"],
        tombstone_max: int = DEFAULTS["tombstone_max"],
        max_pending_fetches_per_peer: int = DEFAULTS["max_pending_fetches_per_peer"],
        notes: Notes | None = None,
    ) -> None:
        """``notes``: the core's queue; ``force_release`` asks through it to end the session with
        the bound peer once the current input is applied."""
        super().__init__(durations)
        if park_clock not in ("last_store", "first_store"):
            raise ValueError(f"park_clock must be 'last_store' or 'first_store', got {park_clock!r}")
        self.park_clock_last = park_clock == "last_store"
        self.tombstone_max = tombstone_max
        self.max_pending = max_pending_fetches_per_peer
        # the keys one peer's awaiting fetches may name at once (decision I34): ~100 B each kept
        self.max_pending_keys = PENDING_KEYS_PER_FETCH * max_pending_fetches_per_peer
        self.awaiting_keys: dict[str, int] = {}  # peer -> keys its awaiting fetches name
        self.awaiting_n: dict[str, int] = {}  # awaiting id -> the keys counted for it
        self.awaiting_version = 0  # moves as ids enter or leave it (C34)
        self.by_peer: dict[str, set[str]] = {}
        self.awaiting_per_peer: dict[str, int] = {}
        # ids in quarantined: the shell asks every poll, so an index, not a scan of every record
        self.quarantined: set[str] = set()
        # retained id -> when its prune deadline falls (seconds); insertion-ordered, so oldest
        # first: the retention period is one constant, so with a monotonic ``now`` this is also
        # deadline order and the prune timer needs no heap entry of its own
        self.retained: dict[str, float] = {}
        # the same ids in the same order; popping the front of a dict is O(size) in CPython, of a
        # deque O(1).  Ids leave retention from the front (prune deadline, tombstone_max); a
        # store, fetch or abort of a new life (decision I20), close() or a test firing one id's
        # prune takes one out of order, leaving a stale entry here that is skipped when it
        # reaches the front, or dropped with the others by a re-pack (_unretain)
        self._prune_order: deque[str] = deque()
        # the ids whose stale entry is still in the prune order (at most one each): should one be
        # retained again, that entry would stand for the new life and hold the ids behind it back
        # until the new life's prune, so the order is re-packed first (rare: an id's new life
        # ending before its old life's prune time)
        self._left_early: set[str] = set()
        self._prune_at = (float("nan"), float("nan"))  # (now, now + retention): one float per batch
        self.count_evicted = 0
        self.closing = False  # shutdown() began: new fetches for unknown ids are refused
        # consumers named by producer requests whose id has no record yet (fetch-before-store):
        # one entry per live producer request, dropped when it finishes
        self.named: dict[str, str] = {}
        self._notes: Notes = notes if notes is not None else Notes()

    def new_record(self, key: str) -> ProducerRecord:
        return ProducerRecord(key)

    # -- inputs --------------------------------------------------------------------------------
    def store(self, inp: StoreSubmitted, now: float, out: list[Effect]) -> None:
        if len(inp.keys) != len(inp.blocks):
            raise ValueError(f"store job {inp.job_id}: {len(inp.keys)} keys but {len(inp.blocks)} blocks")
        if inp.digests and len(inp.digests) != len(inp.keys):
            raise ValueError(f"store job {inp.job_id}: {len(inp.keys)} keys but {len(inp.digests)} digests")
        rec = self._life_record(inp.kv_request_id, inp.life, now, out, inp.consumer)
        self.apply(rec, ProducerEvent.STORE, inp, now, out)
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)

    def fetch(self, inp: FetchInput, now: float, out: list[Effect]) -> None:
        self.apply(self._life_record(inp.kv_request_id, inp.life, now, out), ProducerEvent.FETCH, inp, now, out)
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)

    def _life_record(self, kv_request_id: str, life: str, now: float, out: list[Effect],
                     consumer: str | None = None) -> Any:
        """The record an input naming ``life`` (a store: and ``consumer``) meets: a retained
        record of another life of the id (decision I20), or one ended by or for another consumer
        than the store names (L17), is pruned first (``new_life``), so the input meets a fresh one."""
        rec = self.records.get(kv_request_id)
        if rec is None:
            return self.new_record(kv_request_id)
        if rec.state in RETAINED and ((life and rec.life and life != rec.life)
                                      or _other(rec.consumer or rec.ender, consumer)):
            self.apply(rec, ProducerEvent.NEW_LIFE, None, now, out)
            return self.new_record(kv_request_id)
        return rec

    def announce(self, kv_request_id: str, consumer: str, now: float, out: list[Effect]) -> None:
        """A producer request names ``consumer`` as the only principal allowed to touch the id.
        An id already ended for another principal (a fetch or abort before any store, L17) is
        pruned: the request starts it afresh."""
        self.named[kv_request_id] = consumer
        rec = self.records.get(kv_request_id)
        if rec is None:
            return
        if rec.state in RETAINED and _other(rec.consumer or rec.ender, consumer):
            self.apply(rec, ProducerEvent.NEW_LIFE, None, now, out)
        elif rec.state is ProducerState.AWAITING and rec.consumer is None and _other(rec.principal, consumer):
            self.apply(rec, ProducerEvent.NAMED_OTHER, None, now, out)  # another's early binding: refused
        elif rec.consumer is None and not _other(rec.principal, consumer):
            # unbound, or bound by the named consumer itself: the record takes the name (L17)
            rec.consumer = consumer

    def forget(self, kv_request_id: str) -> None:
        """The producer request finished: its stores (if any) carried the name onto the record."""
        self.named.pop(kv_request_id, None)

    def abort_fetch(self, inp: FetchInput, now: float, out: list[Effect]) -> None:
        self.apply(self._life_record(inp.kv_request_id, inp.life, now, out), ProducerEvent.ABORT_FETCH, inp, now, out)
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)

    def receipt(self, inp: FetchInput, now: float, out: list[Effect]) -> None:
        self.apply(self.record(inp.kv_request_id), ProducerEvent.RECEIPT, inp, now, out)
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)

    def event(self, kv_request_id: str, event: ProducerEvent, now: float, out: list[Effect], inp: Any = None) -> None:
        """Apply an input that carries no payload (request_finished, …)."""
        self.apply(self.record(kv_request_id), event, inp, now, out)
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)

    def transfer_event(
        self, kv_request_id: str, round: int, event: ProducerEvent, now: float, out: list[Effect]
    ) -> None:
        """transfer_released / transfer_failed for a given round; a report for a round the id is
        no longer bound to is stale and dropped."""
        rec = self.records.get(kv_request_id)
        if rec is None or rec.round != round or rec.state not in _BOUND:
            state = rec.state if rec is not None else ProducerState.ABSENT
            out.append(Ignored(self.NAME, kv_request_id, state, event, Reason.STALE))
            return
        self.apply(rec, event, None, now, out)
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)

    def peer_lost(self, peer: str, now: float, out: list[Effect]) -> None:
        for key in sorted(self.by_peer.get(peer, ())):
            rec = self.records.get(key)
            if rec is not None and rec.peer == peer:
                self.apply(rec, ProducerEvent.PEER_LOST, None, now, out)
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)

    def broadcast(self, event: ProducerEvent, now: float, out: list[Effect]) -> None:
        """drain / shutdown / close: apply to every live record (in key order, deterministically)."""
        if event is ProducerEvent.SHUTDOWN:
            self.closing = True
        for key in sorted(self.records):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, event, None, now, out)
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)

    def tick(self, now: float, out: list[Effect]) -> int:
        fired = super().tick(now, out)  # reap, supply, transfer and cancel deadlines (the heap)
        retained, order = self.retained, self._prune_order
        while order:
            key = order[0]
            when = retained.get(key)
            if when is None:
                order.popleft()  # stale: the id left retention out of order
                self._left_early.discard(key)
            elif when > now:
                break
            else:
                self.apply(self.records[key], ProducerEvent.PRUNE_DEADLINE, None, now, out)
                fired += 1
        if len(self.retained) > self.tombstone_max:
            self._enforce_cap(now, out)
        return fired

    def next_deadline(self) -> float | None:
        """Earliest pending deadline (seconds, caller's clock) or None: the heap's or the oldest
        retained id's prune."""
        heap = super().next_deadline()
        retained, order = self.retained, self._prune_order
        while order and order[0] not in retained:
            self._left_early.discard(order.popleft())
        prune = retained[order[0]] if order else None
        if heap is None or (prune is not None and prune < heap):
            return prune
        return heap

    def timer_token(self, key: Any) -> Any:
        return self.retained.get(key) or super().timer_token(key)

    def deadline_entries(self) -> int:
        """The queue's entries plus the prune order's: one per retained id and one per id that
        left retention out of order whose entry is not dropped yet (O(1))."""
        return super().deadline_entries() + len(self._prune_order)

    def deadline_of(self, key: Any) -> float | None:
        if key in self.retained:
            return self.retained[key]
        return super().deadline_of(key)

    def retime_op(self, old: Any, new: Any):
        if not (new in RETAINED and old not in RETAINED):
            return super().retime_op(old, new)
        timer = self.STATE_TIMER[new]

        def retain(rec: Any, now: float) -> None:
            # the prune timer lives in ``retained`` (oldest first), not the heap; entries the
            # heap still holds for this id (reap, transfer) go stale with tseq 0
            if rec.tseq:
                rec.tseq = 0
                self._deadlines.retire(self._is_live, rec.timer)
            rec.timer = timer
            if self._prune_at[0] != now:
                self._prune_at = (now, now + self._durations[timer])
            if rec.key in self._left_early:  # its stale entry would stand for this life
                self._repack()
            self.retained[rec.key] = self._prune_at[1]
            self._prune_order.append(rec.key)

        return retain

    def _enforce_cap(self, now: float, out: list[Effect]) -> None:
        retained, order = self.retained, self._prune_order
        while len(retained) > self.tombstone_max:
            key = order[0]
            if key not in retained:
                order.popleft()
                self._left_early.discard(key)
                continue
            self.count_evicted += 1
            self.apply(self.records[key], ProducerEvent.PRUNE_DEADLINE, None, now, out)

    # -- introspection -------------------------------------------------------------------------
    def state_of(self, kv_request_id: str) -> ProducerState:
        rec = self.records.get(kv_request_id)
        return rec.state if rec is not None else ProducerState.ABSENT

    def pending_jobs(self) -> int:
        return sum(len(r.jobs) for r in self.records.values())

    def referenced(self) -> list[ProducerRecord]:
        """Records whose blocks the data plane may still reference (serving, confirmed,
        cancelling, quarantined)."""
        return [r for r in self.records.values() if r.state in REFERENCED]

    # -- indexes -------------------------------------------------------------------------------
    def index_ops(self, old: Any, new: Any) -> tuple:
        S = ProducerState
        ops: list = []
        if old is S.AWAITING:
            ops.append(self._awaiting_dec)
        if new is S.AWAITING:
            ops.append(self._awaiting_inc)
        if old in _BOUND and new not in _BOUND:
            ops.append(self._unbind_peer)
        if new in _BOUND and old not in _BOUND:
            ops.append(self._bind_peer)
        if new is S.QUARANTINED:
            ops.append(lambda rec: self.quarantined.add(rec.key))
        elif old is S.QUARANTINED:
            ops.append(lambda rec: self.quarantined.discard(rec.key))
        if old in RETAINED and new not in RETAINED:
            ops.append(self._unretain)
        ops.extend(super().index_ops(old, new))
        if new in RETAINED and old not in RETAINED:
            ops.append(self._swap_retained)
        return tuple(ops)

    def _awaiting_dec(self, rec: ProducerRecord) -> None:
        per, keys = self.awaiting_per_peer, self.awaiting_keys
        per[rec.peer] -= 1
        keys[rec.peer] -= self.awaiting_n.pop(rec.key, 0)
        self.awaiting_version += 1
        if not per[rec.peer]:
            del per[rec.peer], keys[rec.peer]

    def _awaiting_inc(self, rec: ProducerRecord) -> None:
        per, keys = self.awaiting_per_peer, self.awaiting_keys
        per[rec.peer] = per.get(rec.peer, 0) + 1
        n = self.awaiting_n[rec.key] = len(rec.demand)
        keys[rec.peer] = keys.get(rec.peer, 0) + n
        self.awaiting_version += 1

    def _unbind_peer(self, rec: ProducerRecord) -> None:
        peers = self.by_peer.get(rec.peer)
        if peers is not None:
            peers.discard(rec.key)
            if not peers:
                del self.by_peer[rec.peer]

    def _bind_peer(self, rec: ProducerRecord) -> None:
        self.by_peer.setdefault(rec.peer, set()).add(rec.key)

    def _unretain(self, rec: Any) -> None:
        self.retained.pop(rec.key, None)
        order = self._prune_order
        if order and order[0] == rec.key:
            order.popleft()
        elif len(order) > 64 + 2 * len(self.retained):
            self._repack()
        else:
            self._left_early.add(rec.key)

    def _repack(self) -> None:
        """Drop every stale entry of the prune order (O(retained + stale))."""
        self._prune_order = deque(k for k in self._prune_order if k in self.retained)
        self._left_early.clear()

    def _swap_retained(self, rec: Any) -> None:
        # from here on the id is answered from its state, reason and named consumer alone
        if rec.key in self.records:
            self.records[rec.key] = RetainedRecord(rec)

    # -- guards (names match spec/lifecycle.toml) ----------------------------------------------
    def guard_store_empty(self, rec: ProducerRecord, inp: StoreSubmitted, now: float) -> bool:
        return not inp.keys

    def guard_other_owner(self, rec: ProducerRecord, inp: StoreSubmitted, now: float) -> bool:
        return rec.owner is not None and inp.owner != rec.owner

    def guard_park_clock_last(self, rec: ProducerRecord, inp: StoreSubmitted, now: float) -> bool:
        return self.park_clock_last

    def guard_fetch_empty(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        return not inp.keys

    def guard_nothing_parked(self, rec: ProducerRecord, inp: object, now: float) -> bool:
        return not rec.blocks

    def guard_demand_met(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        return all(map(rec.blocks.__contains__, inp.keys))

    def guard_store_meets_demand(self, rec: ProducerRecord, inp: StoreSubmitted, now: float) -> bool:
        blocks = rec.blocks
        new = set(inp.keys)
        return all(k in blocks or k in new for k in rec.demand)

    def guard_peer_busy(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        waiting = self.awaiting_per_peer.get(inp.peer, 0)  # a peer's first fetch always waits (I34)
        return waiting >= self.max_pending or (
            waiting > 0 and self.awaiting_keys[inp.peer] + len(inp.keys) > self.max_pending_keys)

    def guard_same_round(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        return inp.peer == rec.peer and inp.round == rec.round and inp.gen == rec.gen

    def guard_not_authorised(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        named = rec.consumer or self.named.get(rec.key)
        return named is not None and inp.principal != named

    def guard_binding_unauthorised(self, rec: ProducerRecord, inp: StoreSubmitted, now: float) -> bool:
        return inp.consumer is not None and rec.principal != inp.consumer

    def guard_fetched_round(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        return inp.fetched

    def guard_supply_complete(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        return rec.supply_complete

    def guard_shutting_down(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        return self.closing

    def guard_receipt_seen(self, rec: ProducerRecord, inp: object, now: float) -> bool:
        return rec.receipt

    def guard_stale_round(self, rec: ProducerRecord, inp: FetchInput, now: float) -> bool:
        return inp.rounds is not None and inp.rounds.stale(inp.round)

    def guard_other_life(self, rec: ProducerRecord, inp: Any, now: float) -> bool:
        life = inp.life
        return bool(life) and bool(rec.life) and life != rec.life

    def guard_needed_nothing(self, rec: ProducerRecord, inp: object, now: float) -> bool:
        return rec.reason is Reason.NOT_NEEDED

    # -- effects (names match spec/lifecycle.toml) ---------------------------------------------
    def effect_park_blocks(self, rec: ProducerRecord, inp: StoreSubmitted, reason, now, out) -> None:
        if rec.owner is None:
            rec.owner = inp.owner
        if inp.life and not rec.life:
            rec.life = inp.life
        if rec.consumer is None:
            rec.consumer = inp.consumer or self.named.get(rec.key)
        digests = inp.digests or (0,) * len(inp.keys)
        if rec.blocks is _NO_BLOCKS:
            # the first store: nothing parked yet (a later store never replaces a parked key)
            rec.blocks = dict(zip(inp.keys, zip(inp.blocks, digests)))
        else:
            blocks = rec.blocks
            for k, b, d in zip(inp.keys, inp.blocks, digests):
                blocks.setdefault(k, (b, d))
        rec.jobs.append(inp.job_id)

    def effect_report_store_ok(self, rec, inp: StoreSubmitted, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, True, None, at_submission=True))

    def effect_fail_store_job(self, rec, inp: StoreSubmitted, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, False, reason, at_submission=True))

    def effect_bind(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        rec.peer = inp.peer
        rec.principal = inp.principal
        rec.gen = inp.gen
        rec.round = inp.round
        rec.demand = inp.keys
        rec.slots = inp.slots
        rec.rounds = inp.rounds
        if not rec.life:
            rec.life = inp.life

    def effect_note_preemptor(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        if rec.consumer is None and inp.principal is not None:
            rec.ender = inp.principal

    def effect_note_life(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        life = getattr(inp, "life", "")
        if life and not rec.life:
            rec.life = life

    def effect_start_transfer(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        # every demanded key is parked (the guard said so): (block, digest) pairs in fetch order
        blocks, digests = zip(*map(rec.blocks.__getitem__, rec.demand))
        out.append(self.batcher.send_blocks(rec.peer, rec.key, rec.round, blocks, rec.gen, digests, rec.slots))

    def effect_cancel_transfer(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        out.append(CancelTransfer(rec.key, rec.round))

    def effect_send_notice(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        # not an answer: the round stays open in the RoundLedger until the terminal one
        out.append(Send(rec.peer, _done(rec.gen, rec.key, rec.round, False, reason, rec.life, final=False)))

    def effect_force_release(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        self._notes.append(GiveUp(rec.peer, Reason.TRANSFER_STALLED))

    def effect_complete_jobs(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        for job in rec.jobs:
            out.append(JobDone(job, True, None))
        rec.jobs = []
        rec.blocks = _NO_BLOCKS

    def effect_release_unneeded(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        for job in rec.jobs:
            out.append(JobDone(job, True, Reason.NOT_NEEDED))
        rec.jobs = []
        rec.blocks = _NO_BLOCKS

    def effect_report_store_unneeded(self, rec, inp: StoreSubmitted, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, True, Reason.NOT_NEEDED, at_submission=True))

    def effect_fail_jobs(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        for job in rec.jobs:
            out.append(JobDone(job, False, reason))
        rec.jobs = []
        rec.blocks = _NO_BLOCKS

    # Every terminal answer names the round it ends in the session's RoundLedger: a duplicate
    # or overtaken fetch of that round can then never bind (decision I11).
    def effect_reply_done_ok(self, rec: ProducerRecord, inp: FetchInput | None, reason, now, out) -> None:
        if inp is not None:
            _answered(inp.rounds, inp.round)
            out.append(Send(inp.peer, _done(inp.gen, rec.key, inp.round, True, None, inp.life)))
        else:
            _answered(rec.rounds, rec.round)
            out.append(Send(rec.peer, _done(rec.gen, rec.key, rec.round, True, None, rec.life)))

    def effect_reply_done_fail(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        _answered(rec.rounds, rec.round)
        out.append(Send(rec.peer, _done(rec.gen, rec.key, rec.round, False, reason, rec.life)))

    def effect_reply_terminal(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        _answered(rec.rounds, rec.round)
        if reason is Reason.ABORTED:
            out.append(Send(rec.peer, wm.AbortAck(gen=rec.gen, kv_request_id=rec.key, round=rec.round, life=rec.life)))
        else:
            out.append(Send(rec.peer, _done(rec.gen, rec.key, rec.round, False, reason, rec.life)))

    def effect_reply_fetch_failed(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        _answered(inp.rounds, inp.round)
        if reason is Reason.PEER_LOST:  # the id's bound consumer was lost; this fetch came on a live session (I40)
            reason = Reason.CONSUMER_LOST
        out.append(Send(inp.peer, _done(inp.gen, rec.key, inp.round, False, reason, inp.life)))

    def effect_reply_abort_ack(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        _answered(inp.rounds, inp.round)
        out.append(Send(inp.peer, wm.AbortAck(gen=inp.gen, kv_request_id=rec.key, round=inp.round, life=inp.life)))

    def effect_note_supply_complete(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        rec.supply_complete = True

    def effect_note_duplicate(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        out.append(Ignored(self.NAME, rec.key, rec.state.value, "duplicate", Reason.STALE))

    def effect_note_stale(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        out.append(Ignored(self.NAME, rec.key, rec.state.value, "other_round", Reason.STALE))

    def effect_note_receipt(self, rec: ProducerRecord, inp: FetchInput, reason, now, out) -> None:
        rec.receipt = True

    def effect_unbind(self, rec: ProducerRecord, inp, reason, now, out) -> None:
        # the peer stays until the index update after this step (it keys the per-peer indexes)
        rec.principal, rec.gen, rec.round, rec.demand, rec.slots, rec.rounds = None, 0, -1, (), (), None
        life = getattr(inp, "life", "")
        if life:  # a store of the producer's own life replaces the binding's (other_life)
            rec.life = life


def _done(gen: int, kv_request_id: str, round: int, ok: bool, reason: Reason | None, life: str = "",
          final: bool = True) -> wm.TransferDone:
    return wm.TransferDone(gen=gen, kv_request_id=kv_request_id, round=round, ok=ok,
                           reason=reason.value if reason is not None else "", life=life, final=final)


def _answered(rounds: Any, round: int) -> None:
    if rounds is not None:
        rounds.answer(round)
