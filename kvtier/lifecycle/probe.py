"""Probe machine (consumer side of the symmetric path): the probing of one peer for one request.

Theory of operation: a request whose ``kv_transfer_params`` carry ``remote_kv_source`` names a
peer that may hold the request's blocks in its own engine's tiers (decision Y1).  Each ``lookup``
of a key the request has no answer for registers the key in the *open round* and answers RETRY;
at the end of the engine step (``schedule_end``) the registered keys leave in one ``probe`` per
(peer, ``kv_request_id``).  The peer answers ``probe_reply`` with a hit or a miss per key, a hit
meaning "pinned for you until the round ends"; lookups then answer HIT or MISS.  A MISS is kept
for the request's life (decision Y3), so a missing tail block is never probed twice.

A round ends in exactly one of three ways: the engine's load of its HIT keys (``hand_to_load``
gives the job to a consumer life of its own, :class:`RoundLoads`, keyed ``(kv_request_id,
round)``: the consumer machine's table, unchanged, with ``fetch(offered=true)``), its release
(``abort_fetch(fetched=false, offered=true)`` when the request finishes or the deadline hits while
the peer may hold pins), or the peer's ``transfer_done(fail)`` (it refused the probe or withdrew
the offer).  RETRY is bounded: only ``collecting`` and ``probing`` answer it, and both carry the
``probe`` timer, armed at the round's first key, so dialling and the handshake count against
``probe_timeout_s`` (decision Y4; vLLM 0.33.0's ``p2p`` tier bounds a silent peer only by its 30 s
handshake timeout).

All decisions come from ``_table.PROBE_TABLE``; this module supplies guards and effects only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from kvtier.lifecycle._machine import Record, TableMachine
from kvtier.lifecycle._table import (
    PROBE_FINAL,
    PROBE_INITIAL,
    PROBE_STATE_TIMER,
    PROBE_TABLE,
    PROBE_TIMERS,
    ConsumerEvent,
    ConsumerState,
    ProbeEffect,
    ProbeEvent,
    ProbeGuard,
    ProbeState,
    Reason,
)
from kvtier.lifecycle.blockstates import BlockStates
from kvtier.lifecycle.consumer import ConsumerMachine, ConsumerRecord, MessageInput, RoundCounter
from kvtier.lifecycle.effects import Effect, Ignored, JobDone, ProbeFailed, Send
from kvtier.lifecycle.inputs import KeyLookedUp, LoadSubmitted
from kvtier.lifecycle.notes import LoadRound, Notes, RoundLoadEnded
from kvtier.lifecycle.session import SessionMachine
from kvtier.wire import messages as wm

__all__ = ["Answer", "MAX_KEYS_PER_MESSAGE", "ProbeMachine", "ProbeRecord", "ReplyInput", "RoundLoads"]

MAX_KEYS_PER_MESSAGE = 4096
"""Keys per ``probe`` / ``probe_reply`` message at most (~160 KiB of header with 36-byte keys,
well inside the default ``max_message_bytes``); a longer round is sent as several messages."""

#: states in which a lookup of a key the record holds changes nothing (the spec's ``=``, no effect)
_HELD_NOOP = frozenset({ProbeState.COLLECTING, ProbeState.PROBING, ProbeState.OFFERED})


def _holds(rec: ProbeRecord, key: bytes) -> bool:
    """The record knows ``key`` already: answered, offered, loading, or waiting to be sent or answered."""
    return key in rec.miss or key in rec.offered or key in rec.loading or key in rec.unsent or key in rec.waiting


class Answer(enum.StrEnum):
    """What a lookup of a symmetric request answers (the engine maps it to its own type)."""

    RETRY = "retry"
    HIT = "hit"
    MISS = "miss"


class ReplyInput(msgspec.Struct, frozen=True, gc=False):
    """A ``probe_reply`` (``keys``, ``hits``) or the peer's ``transfer_done`` (``ok``, ``reason``)
    for round ``round`` of a probe."""

    kv_request_id: str
    round: int
    keys: tuple[bytes, ...] = ()
    hits: tuple[bool, ...] = ()
    ok: bool = False
    reason: Reason | None = None


class ProbeRecord(Record):
    __slots__ = ("peer", "round", "sent", "unsent", "waiting", "offered", "miss", "loading")

    def __init__(self, key: str) -> None:
        super().__init__(key, PROBE_INITIAL)
        self.peer = ""
        self.round = -1  # the open round (-1: none)
        self.sent = False  # a probe of the open round went out: the peer may hold pins for it
        self.unsent: dict[bytes, None] = {}  # registered in the open round, not sent yet (in order)
        self.waiting: dict[bytes, None] = {}  # sent, no answer yet (in order)
        self.offered: set[bytes] = set()  # answered hit in the open round: pinned on the peer
        self.miss: set[bytes] = set()  # answered miss (or failed to load): kept for the request's life
        self.loading: dict[bytes, int] = {}  # handed to the load of round N, no result yet


class ProbeMachine(TableMachine):
    """All probe records of one manager, keyed by ``kv_request_id``."""

    NAME = "probe"
    TABLE = PROBE_TABLE
    STATE_TIMER = PROBE_STATE_TIMER
    TIMERS = PROBE_TIMERS
    INITIAL = PROBE_INITIAL
    FINAL = PROBE_FINAL
    GUARD_ENUM = ProbeGuard
    EFFECT_ENUM = ProbeEffect

    def __init__(self, durations: Mapping[str, float], sessions: SessionMachine, notes: Notes,
                 rounds: RoundCounter) -> None:
        """``sessions``: read only (is the peer's session ready, its generation, its instance
        suspect); ``notes``: the core's queue (``hand_to_load`` asks through it for the round's
        load); ``rounds``: the manager's one round counter."""
        super().__init__(durations)
        self._sessions = sessions
        self._notes = notes
        self._rounds = rounds
        self.by_peer: dict[str, set[str]] = {}
        self.collecting: set[str] = set()  # ids whose keys wait for the step's end (schedule_end)

    def new_record(self, key: str) -> ProbeRecord:
        return ProbeRecord(key)

    # -- inputs --------------------------------------------------------------------------------
    def announce(self, kv_request_id: str, peer: str, now: float, out: list[Effect]) -> None:
        rec = self.record(kv_request_id)
        if rec.state is ProbeState.ABSENT:
            rec.peer = peer
        self.apply(rec, ProbeEvent.ANNOUNCE, None, now, out)

    def lookup(self, inp: KeyLookedUp, now: float, out: list[Effect]) -> None:
        self.apply(self.record(inp.kv_request_id), ProbeEvent.LOOKUP, inp, now, out)

    def lookups(self, kv_request_id: str, keys: Iterable[bytes], now: float, out: list[Effect]) -> None:
        """One engine step's lookups for ``kv_request_id``, in order: each a ``lookup`` — but a key
        the record holds while it collects, probes or offers is a no-op there (the spec's ``=`` with
        no effect), so it is dropped unapplied: an engine rescans every key of a prompt each step
        while any is RETRY (decision Y26)."""
        rec = self.record(kv_request_id)
        if rec.state in _HELD_NOOP:
            keys = [k for k in keys if not _holds(rec, k)]
        for k in keys:
            self.apply(rec, ProbeEvent.LOOKUP, KeyLookedUp(kv_request_id, k), now, out)

    def submit_load(self, inp: LoadSubmitted, now: float, out: list[Effect]) -> None:
        if len(inp.keys) != len(inp.slots):
            raise ValueError(f"load job {inp.job_id}: {len(inp.keys)} keys but {len(inp.slots)} slots")
        self.apply(self.record(inp.kv_request_id), ProbeEvent.SUBMIT_LOAD, inp, now, out)

    def schedule_end(self, now: float, out: list[Effect]) -> None:
        """The engine step ended: every record whose keys wait for it (``collecting``)."""
        for key in sorted(self.collecting):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, ProbeEvent.SCHEDULE_END, None, now, out)

    def message(self, peer: str, event: ProbeEvent, inp: Any, now: float, out: list[Effect]) -> None:
        """probe_reply / transfer_done from ``peer``, or a round's load result (``load_ended``); a
        message from a peer other than the request's is stale."""
        rec = self.records.get(inp.kv_request_id)
        if rec is not None and rec.peer != peer:
            out.append(Ignored(self.NAME, inp.kv_request_id, rec.state, event, Reason.STALE))
            return
        self.apply(rec if rec is not None else self.new_record(inp.kv_request_id), event, inp, now, out)

    def event(self, kv_request_id: str, event: ProbeEvent, now: float, out: list[Effect], inp: Any = None) -> None:
        self.apply(self.record(kv_request_id), event, inp, now, out)

    def peer_event(self, peer: str, event: ProbeEvent, now: float, out: list[Effect], inp: Any = None) -> None:
        for key in sorted(self.by_peer.get(peer, ())):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, event, inp, now, out)

    def broadcast(self, event: ProbeEvent, now: float, out: list[Effect]) -> None:
        for key in sorted(self.records):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, event, None, now, out)

    # -- reads ---------------------------------------------------------------------------------
    def state_of(self, kv_request_id: str) -> ProbeState:
        rec = self.records.get(kv_request_id)
        return rec.state if rec is not None else ProbeState.ABSENT

    # -- indexes -------------------------------------------------------------------------------
    def index_ops(self, old: Any, new: Any) -> tuple:
        ops: list = []
        if old is ProbeState.ABSENT:
            ops.append(self._by_peer_add)
        if new is ProbeState.FINISHED:
            ops.append(self._by_peer_drop)
        if new is ProbeState.COLLECTING:
            ops.append(self._collecting_add)
        elif old is ProbeState.COLLECTING:
            ops.append(self._collecting_drop)
        return (*ops, *super().index_ops(old, new))

    def _by_peer_add(self, rec: ProbeRecord) -> None:
        self.by_peer.setdefault(rec.peer, set()).add(rec.key)

    def _by_peer_drop(self, rec: ProbeRecord) -> None:
        peers = self.by_peer.get(rec.peer)
        if peers is not None:
            peers.discard(rec.key)
            if not peers:
                del self.by_peer[rec.peer]

    def _collecting_add(self, rec: ProbeRecord) -> None:
        self.collecting.add(rec.key)

    def _collecting_drop(self, rec: ProbeRecord) -> None:
        self.collecting.discard(rec.key)

    # -- guards --------------------------------------------------------------------------------
    def guard_instance_down(self, rec: ProbeRecord, inp: KeyLookedUp, now: float) -> bool:
        return self._sessions.instance_down(rec.peer)

    def guard_new_keys(self, rec: ProbeRecord, inp: KeyLookedUp, now: float) -> bool:
        return not _holds(rec, inp.key)

    def guard_session_ready(self, rec: ProbeRecord, inp: object, now: float) -> bool:
        return self._sessions.ready(rec.peer)

    def guard_other_round(self, rec: ProbeRecord, inp: ReplyInput, now: float) -> bool:
        return inp.round != rec.round

    def _settles(self, rec: ProbeRecord, inp: ReplyInput) -> bool:
        answered = set(inp.keys)
        return not rec.unsent and all(k in answered for k in rec.waiting)

    def guard_settles_with_offers(self, rec: ProbeRecord, inp: ReplyInput, now: float) -> bool:
        if not self._settles(rec, inp):
            return False
        return bool(rec.offered) or any(h and k in rec.waiting for k, h in zip(inp.keys, inp.hits))

    def guard_settles(self, rec: ProbeRecord, inp: ReplyInput, now: float) -> bool:
        return self._settles(rec, inp)

    def guard_load_empty(self, rec: ProbeRecord, inp: LoadSubmitted, now: float) -> bool:
        return not inp.keys

    def guard_load_offered(self, rec: ProbeRecord, inp: LoadSubmitted, now: float) -> bool:
        return bool(inp.keys) and all(k in rec.offered for k in inp.keys)

    def guard_round_open(self, rec: ProbeRecord, inp: object, now: float) -> bool:
        return rec.sent

    # -- effects -------------------------------------------------------------------------------
    def effect_open_round(self, rec: ProbeRecord, inp, reason, now, out) -> None:
        self._fresh_round(rec)

    def _fresh_round(self, rec: ProbeRecord) -> None:
        rec.round = self._rounds.take()
        rec.sent = False
        rec.offered = set()

    def effect_register_keys(self, rec: ProbeRecord, inp: KeyLookedUp, reason, now, out) -> None:
        rec.unsent[inp.key] = None

    def effect_send_probe(self, rec: ProbeRecord, inp, reason, now, out) -> None:
        keys = list(rec.unsent)
        gen = self._sessions.gen(rec.peer)
        for i in range(0, len(keys), MAX_KEYS_PER_MESSAGE):
            out.append(Send(rec.peer, wm.Probe(gen=gen, kv_request_id=rec.key, round=rec.round,
                                               keys=keys[i : i + MAX_KEYS_PER_MESSAGE])))
        rec.waiting.update(rec.unsent)
        rec.unsent = {}
        rec.sent = True

    def effect_note_answers(self, rec: ProbeRecord, inp: ReplyInput, reason, now, out) -> None:
        waiting = rec.waiting
        for k, hit in zip(inp.keys, inp.hits):
            if k in waiting:  # a key we did not ask about (or already answered) is not taken
                del waiting[k]
                (rec.offered if hit else rec.miss).add(k)

    def effect_hand_to_load(self, rec: ProbeRecord, inp: LoadSubmitted, reason, now, out) -> None:
        for k in inp.keys:
            rec.loading[k] = rec.round
        self._notes.append(LoadRound(rec.key, rec.round, rec.peer, inp))
        # the fetch closes the round on the peer: every pin of it is released once the load ends,
        # so offers not in this load are forgotten; keys still unanswered go to a fresh round
        rest = {**rec.waiting, **rec.unsent}
        rec.waiting = {}
        if rest:
            self._fresh_round(rec)
            rec.unsent = rest
        else:
            rec.round, rec.sent, rec.offered, rec.unsent = -1, False, set(), {}

    def effect_release_round(self, rec: ProbeRecord, inp, reason, now, out) -> None:
        out.append(Send(rec.peer, wm.AbortFetch(gen=self._sessions.gen(rec.peer), kv_request_id=rec.key,
                                                round=rec.round, fetched=False, offered=True)))

    def effect_drop_offers(self, rec: ProbeRecord, inp, reason, now, out) -> None:
        rec.round, rec.sent, rec.offered, rec.unsent, rec.waiting = -1, False, set(), {}, {}

    def effect_note_loaded(self, rec: ProbeRecord, inp: RoundLoadEnded, reason, now, out) -> None:
        landed = set(inp.landed)
        for k in inp.keys:
            if rec.loading.get(k) == inp.round:
                del rec.loading[k]
            if k not in landed:
                rec.miss.add(k)  # the engine computes it: a failed key is not probed again

    def effect_fail_new_job(self, rec: ProbeRecord, inp: LoadSubmitted, reason, now, out) -> None:
        # from failed the reason is the record's (why the probing failed); never a reasonless failure
        out.append(JobDone(inp.job_id, False, reason or Reason.NOT_OFFERED))

    def effect_note_failed(self, rec: ProbeRecord, inp, reason, now, out) -> None:
        out.append(ProbeFailed(rec.key, rec.peer, reason or Reason.PEER_LOST))

    def effect_report_new_job_ok(self, rec: ProbeRecord, inp: LoadSubmitted, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, True, None))

    def effect_note_stale(self, rec: ProbeRecord, inp, reason, now, out) -> None:
        out.append(Ignored(self.NAME, rec.key, rec.state, "other_round", Reason.STALE))




class RoundLoads(ConsumerMachine):
    """The loads of symmetric rounds: consumer lives (the consumer machine's table) keyed
    ``(kv_request_id, round)``, whose fetch and aborts say ``offered=true`` and whose round is the
    probe's (the peer pinned the blocks for exactly that round).  Each reports its job's end to its
    probe (:class:`~kvtier.lifecycle.notes.RoundLoadEnded`)."""

    OFFERED = True

    def __init__(self, durations: Mapping[str, float], sessions: SessionMachine, notes: Notes, *,
                 one_sided: bool = False, rounds: RoundCounter, integrity: bool = True,
                 revoke_bounded: bool = True) -> None:
        super().__init__(durations, sessions, notes, one_sided=one_sided, rounds=rounds, integrity=integrity,
                         revoke_bounded=revoke_bounded)
        self.by_request: dict[str, set[tuple[str, int]]] = {}

    def new_record(self, key: Any) -> ConsumerRecord:
        rec = ConsumerRecord(key, kv_request_id=key[0])
        rec.round = key[1]
        return rec

    def start(self, note: LoadRound, now: float, out: list[Effect]) -> None:
        """Announce the round's life on ``note.peer`` and give it the engine's job."""
        rec = self.record((note.kv_request_id, note.round))
        if rec.state is ConsumerState.ABSENT:
            rec.peer = note.peer
        self.apply(rec, ConsumerEvent.ANNOUNCE, None, now, out)
        self.apply(self.records.get(rec.key, rec), ConsumerEvent.SUBMIT_LOAD, note.job, now, out)

    def message(self, peer: str, event: Any, inp: MessageInput, now: float, out: list[Effect]) -> None:
        key = (inp.kv_request_id, inp.round)
        rec = self.records.get(key)
        if rec is None or rec.peer != peer:
            state = rec.state if rec is not None else ConsumerState.ABSENT
            out.append(Ignored(self.NAME, inp.kv_request_id, state, event, Reason.STALE))
            return
        self.apply(rec, event, inp, now, out)

    def of_request(self, kv_request_id: str) -> list[ConsumerRecord]:
        return [self.records[k] for k in sorted(self.by_request.get(kv_request_id, ())) if k in self.records]

    def index_ops(self, old: Any, new: Any) -> tuple:
        ops: list = []
        if old is ConsumerState.ABSENT:
            ops.append(self._by_request_add)
        if new is ConsumerState.FINISHED:
            ops.append(self._by_request_drop)
        return (*ops, *super().index_ops(old, new))

    def _by_request_add(self, rec: ConsumerRecord) -> None:
        self.by_request.setdefault(rec.kv_request_id, set()).add(rec.key)

    def _by_request_drop(self, rec: ConsumerRecord) -> None:
        keys = self.by_request.get(rec.kv_request_id)
        if keys is not None:
            keys.discard(rec.key)
            if not keys:
                del self.by_request[rec.kv_request_id]

    def _take_job(self, rec: ConsumerRecord, inp: LoadSubmitted) -> None:
        rec.job_id = inp.job_id
        rec.keys = inp.keys
        rec.slots = inp.slots
        rec.round = rec.key[1]  # the probe's round: the peer pinned the blocks for exactly it
        rec.landed = BlockStates(len(inp.keys))
        rec.digests = [0] * len(inp.keys)

    def _ended(self, rec: ConsumerRecord, ok: bool) -> None:
        # a failed load's keys beyond its verified prefix answer MISS from now on (decision I22):
        # a key whose block failed its check must not be probed, offered and loaded again
        landed = rec.keys if ok else (rec.keys[: rec.landed.prefix()] if self.integrity else ())
        self._notes.append(RoundLoadEnded(rec.kv_request_id, rec.round, ok, rec.keys, landed))

    def effect_report_load_ok(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        super().effect_report_load_ok(rec, inp, reason, now, out)
        self._ended(rec, True)

    def effect_fail_job(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        if rec.job_id is not None:
            super().effect_fail_job(rec, inp, reason, now, out)
            self._ended(rec, False)

