"""Consumer (decode-side) machine: the life of one ``kv_request_id`` load.

Theory of operation: the engine announces a request that names a remote producer; a load job
names the keys to fetch and the destination slots.  The fetch waits for the session handshake if
needed (``queued``), is sent (``in_flight``), and blocks land in the slots only while the load is
``in_flight``: each ``block_data`` is landed by the shell and checked against the digests the
producer took when it parked the blocks (``blocks_landed``).  The load succeeds only when every
block landed intact; then a ``receipt`` tells the producer it may report its store jobs done.

A load's slots are handed back to the engine (its job result) only when no write into them can
still land: on a receiver-applied plane (zmq) that is as soon as the load leaves ``in_flight``; on
a one-sided plane (NIXL) the producer may be writing until its *terminal answer* for the round
(``transfer_done`` or ``abort_ack``, sent only once its writes completed) or until the data plane
has revoked the producer's access (``revoking`` → ``access_revoked``).  So every way out that does
not get a terminal answer — session death, an abort nobody answers — goes through ``revoking``.
A failed id makes later lookups MISS so the engine recomputes locally.

What each slot holds is a typed state per fetch position (:mod:`kvtier.lifecycle.blockstates`:
empty, unchecked, verified, failed), never a flag read as a truth value: a failed load reports
as ``successful_keys`` only the *verified prefix* of its fetch (decision I21), and no result —
success or failure — is reported while a landing it started has not answered (``settling``,
decision I26): on zmq that landing is a copy into the slots, and the engine may reuse the slots
the moment it has the result.

All decisions come from ``_table.CONSUMER_TABLE``; this module supplies guards and effects only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from kvtier.lifecycle._machine import Record, TableMachine
from kvtier.lifecycle.blockstates import BlockState, BlockStates
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
    Reason,
)
from kvtier.lifecycle.effects import Effect, Ignored, JobDone, LandBlocks, RevokeAccess, Send, SlotsHeld
from kvtier.lifecycle.inputs import Dial, LoadSubmitted
from kvtier.lifecycle.notes import GiveUp, Notes
from kvtier.lifecycle.session import SessionMachine
from kvtier.wire import messages as wm


class MessageInput(msgspec.Struct, frozen=True, gc=False):
    """A producer message about ``kv_request_id``: block_data (``first``/``count``, with the
    ``digests`` it carries and its ``payloads``), transfer_done (``ok``/``reason``) or abort_ack;
    or the shell's ``blocks_landed`` report (``first``/``count``, ``ok`` False when a block did
    not match its digest; its ``reason`` is None, so a load that ends on it keeps the reason it
    ended with)."""

    kv_request_id: str
    round: int
    first: int = 0
    count: int = 0
    ok: bool = True
    reason: Reason | None = None
    digests: tuple[int, ...] = ()
    payloads: tuple[Any, ...] = ()
    life: str = ""
    final: bool = True
    """transfer_done: False for the producer's notice that it gave the transfer up (decision I19)."""


class ConsumerRecord(Record):
    __slots__ = ("kv_request_id", "peer", "job_id", "keys", "slots", "round", "landed", "digests",
                 "fetched", "engine_finished", "life", "notice", "redialled", "due")

    def __init__(self, key: Any, kv_request_id: str | None = None) -> None:
        super().__init__(key, CONSUMER_INITIAL)
        # the id our messages carry: the key itself for a PD load; a symmetric round's load is
        # keyed (kv_request_id, round) (kvtier.lifecycle.probe.RoundLoads)
        self.kv_request_id: str = key if kv_request_id is None else kv_request_id
        self.peer: str = ""
        self.job_id: int | None = None
        self.keys: tuple[bytes, ...] = ()
        self.slots: tuple[int, ...] = ()
        self.round = -1
        self.landed = BlockStates()  # per fetch position: what its slot holds (decision I21)
        self.digests: list[int] = []  # per key: the digest its block_data carried (partial loads)
        self.fetched = False
        self.engine_finished = False
        self.life = ""  # the pairing's life (decision I20)
        self.notice: Reason | None = None  # the reason of the producer's notice (decision I19)
        self.redialled = False  # dialled its producer again (decision N25): a refusal for now gets one retry
        self.due = 0.0  # the load's own deadline (load_timeout_s from its submission)

    @property
    def n_landed(self) -> int:
        """Blocks of the fetch that landed and matched their digests."""
        return self.landed.verified


#: states whose round still waits for the producer's terminal answer on the live session: the
#: lowest of them is the low watermark every fetch and abort names (decision I11)
_UNCHECKED = BlockState.UNCHECKED

_OPEN = frozenset({ConsumerState.QUEUED, ConsumerState.IN_FLIGHT, ConsumerState.ABORTING, ConsumerState.CANCELLING,
                   ConsumerState.GIVEN_UP})
#: a session's end before it was ever up: the dial failed (guard dial_failed, decision I39)
DIAL_FAILURES = frozenset({Reason.CONNECT_REFUSED, Reason.CONNECT_TIMEOUT, Reason.UNRESOLVED_HOST, Reason.AUTH_FAILED,
                           Reason.TOO_MANY_PEERS, Reason.HANDSHAKE_TIMEOUT, Reason.HANDSHAKE_MISMATCH,
                           Reason.SELF_FETCH})


class ConsumerMachine(TableMachine):
    """All consumer records of one manager."""

    NAME = "consumer"
    OFFERED = False
    """Whether our fetches and aborts name blocks a probe reply offered (symmetric rounds)."""
    TABLE = CONSUMER_TABLE
    STATE_TIMER = CONSUMER_STATE_TIMER
    TIMERS = CONSUMER_TIMERS
    INITIAL = CONSUMER_INITIAL
    FINAL = CONSUMER_FINAL
    GUARD_ENUM = ConsumerGuard
    EFFECT_ENUM = ConsumerEffect

    def __init__(
        self, durations: Mapping[str, float], sessions: SessionMachine, notes: Notes, *, one_sided: bool = False,
        revoke_bounded: bool = True, rounds: RoundCounter | None = None, integrity: bool = True,
    ) -> None:
        """``sessions``: the session machine, read only (is a producer's session ready, its
        generation, is its instance suspect); ``notes``: the core's queue (``give_up_peer`` asks
        through it to end a session); ``one_sided``: the data plane writes into our slots, so a
        fetch names them; ``revoke_bounded``: the plane withdraws a producer's access by itself
        within ``revoke_timeout_s``; ``rounds``: the manager's one round counter (shared with the symmetric
        path's probes, so a round number is unique per manager); ``integrity``: blocks carry
        digests that are checked as they land (only then may a failed load report the blocks that
        landed as ``successful_keys``)."""
        super().__init__(durations)
        self._sessions = sessions
        self._notes = notes
        self._one_sided = one_sided
        self._revoke_bounded = revoke_bounded
        self.by_peer: dict[str, set[Any]] = {}
        # peer -> the rounds of its loads in an open state, in round order (rounds only grow)
        self._open: dict[str, dict[int, None]] = {}
        self.rounds = rounds if rounds is not None else RoundCounter()
        self.integrity = integrity

    def new_record(self, key: str) -> ConsumerRecord:
        return ConsumerRecord(key)

    @property
    def _next_round(self) -> int:
        """The next round number (the shared counter's; kept for readers of the old attribute)."""
        return self.rounds.next

    @_next_round.setter
    def _next_round(self, value: int) -> None:
        self.rounds.next = value

    # -- inputs --------------------------------------------------------------------------------
    def announce(self, kv_request_id: str, peer: str, now: float, out: list[Effect], life: str = "") -> None:
        rec = self.record(kv_request_id)
        if rec.state is ConsumerState.ABSENT:
            rec.peer = peer
            rec.life = life
        self.apply(rec, ConsumerEvent.ANNOUNCE, None, now, out)

    def submit_load(self, inp: LoadSubmitted, now: float, out: list[Effect]) -> None:
        if len(inp.keys) != len(inp.slots):
            raise ValueError(f"load job {inp.job_id}: {len(inp.keys)} keys but {len(inp.slots)} slots")
        self.apply(self.record(inp.kv_request_id), ConsumerEvent.SUBMIT_LOAD, inp, now, out)

    def message(self, peer: str, event: ConsumerEvent, inp: MessageInput, now: float, out: list[Effect]) -> None:
        """block_data / transfer_done / abort_ack from ``peer``, or the shell's blocks_landed /
        access_revoked about ``peer``. A message from a peer other than the id's producer is
        stale (a peer cannot touch another peer's loads)."""
        rec = self.records.get(inp.kv_request_id)
        if rec is not None and rec.peer != peer:
            out.append(Ignored(self.NAME, inp.kv_request_id, rec.state, event, Reason.STALE))
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

    def index_ops(self, old: Any, new: Any) -> tuple:
        ops: list = []
        if old is ConsumerState.ABSENT:
            ops.append(self._by_peer_add)
        if new in _OPEN and old not in _OPEN:
            ops.append(self._open_add)
        elif old in _OPEN and new not in _OPEN:
            ops.append(self._open_drop)
        if new is ConsumerState.FINISHED:
            ops.append(self._by_peer_drop)
        return (*ops, *super().index_ops(old, new))

    def _open_add(self, rec: ConsumerRecord) -> None:
        self._open.setdefault(rec.peer, {})[rec.round] = None

    def _open_drop(self, rec: ConsumerRecord) -> None:
        rounds = self._open.get(rec.peer)
        if rounds is not None:
            rounds.pop(rec.round, None)
            if not rounds:
                del self._open[rec.peer]
            elif len(rounds) < 8 or not rec.round & 63:
                # a dict keeps a deleted entry's slot until it grows: low()'s first-key read would
                # walk every round closed since, so re-pack now and then (one copy of live rounds)
                self._open[rec.peer] = dict(rounds)

    def _low(self, peer: str, round: int) -> int:
        # a symmetric round's messages name no watermark (0: no news): the producer's round
        # ledger guards parked PD bindings only, and this machine knows only its own rounds
        return 0 if self.OFFERED else self.low(peer, round)

    def low(self, peer: str, round: int) -> int:
        """The lowest round still open with ``peer``, counting ``round`` (being opened now)."""
        rounds = self._open.get(peer)
        first = next(iter(rounds)) if rounds else round
        return min(first, round) if round >= 0 else first

    def _by_peer_add(self, rec: ConsumerRecord) -> None:
        self.by_peer.setdefault(rec.peer, set()).add(rec.key)

    def _by_peer_drop(self, rec: ConsumerRecord) -> None:
        peers = self.by_peer.get(rec.peer)
        if peers is not None:
            peers.discard(rec.key)
            if not peers:
                del self.by_peer[rec.peer]

    # -- guards --------------------------------------------------------------------------------
    def guard_refused_for_now(self, rec: ConsumerRecord, inp, now: float) -> bool:
        return getattr(inp, "reason", None) is Reason.SESSION_STILL_HELD and not rec.redialled

    def guard_dial_failed(self, rec: ConsumerRecord, inp, now: float) -> bool:
        return getattr(inp, "reason", None) in DIAL_FAILURES

    def guard_load_empty(self, rec: ConsumerRecord, inp: LoadSubmitted, now: float) -> bool:
        return not inp.keys

    def guard_empty_on_ready_session(self, rec: ConsumerRecord, inp: LoadSubmitted, now: float) -> bool:
        return not inp.keys and self._sessions.ready(rec.peer)

    def guard_session_ready(self, rec: ConsumerRecord, inp: LoadSubmitted, now: float) -> bool:
        return self._sessions.ready(rec.peer)

    def guard_instance_down(self, rec: ConsumerRecord, inp: LoadSubmitted, now: float) -> bool:
        return self._sessions.instance_down(rec.peer)

    def guard_corrupt(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return not inp.ok

    def guard_engine_finished(self, rec: ConsumerRecord, inp: object, now: float) -> bool:
        return rec.engine_finished

    def guard_other_round(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return inp.round != rec.round or (bool(inp.life) and bool(rec.life) and inp.life != rec.life)

    def guard_blocks_valid(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        first, count = inp.first, inp.count
        if count <= 0 or first < 0 or first + count > len(rec.keys):
            return False
        return rec.landed.untouched(first, count)

    def guard_completes(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return rec.landed.verified + inp.count == len(rec.keys)

    def guard_landing(self, rec: ConsumerRecord, inp: object, now: float) -> bool:
        return rec.landed.unchecked > 0

    def guard_failed_while_landing(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return not inp.ok and rec.landed.unchecked > 0

    def guard_last_landing(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        states = rec.landed
        # the answer settles every unchecked position it names (a stale answer names none)
        return states.unchecked == sum(1 for i in range(inp.first, min(inp.first + inp.count, len(states)))
                                       if states[i] is _UNCHECKED)

    def guard_last_landing_finished(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return rec.engine_finished and self.guard_last_landing(rec, inp, now)

    def guard_needs_nothing(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return not rec.keys

    def guard_done_fail(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return not inp.ok

    def guard_all_received(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return rec.landed.verified == len(rec.keys)

    def guard_notice(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return not inp.final

    def guard_notice_one_sided(self, rec: ConsumerRecord, inp: MessageInput, now: float) -> bool:
        return not inp.final and self._one_sided

    def guard_aborted_corrupt(self, rec: ConsumerRecord, inp: object, now: float) -> bool:
        return rec.reason is Reason.CORRUPT

    def _at_work(self, rec: ConsumerRecord, now: float) -> bool:
        # an abort's answer queues behind what the producer already sends us (L19); a one-sided
        # plane's WRITEs bypass the connection, so there any message shows the producer at work
        since, sessions = now - self._durations["abort_ack"], self._sessions
        sending = sessions.heard_since if self._one_sided else sessions.active_since
        return sending(rec.peer, since)

    def guard_producer_sending(self, rec: ConsumerRecord, inp: object, now: float) -> bool:
        return now < rec.due and self._at_work(rec, now)

    def guard_producer_busy(self, rec: ConsumerRecord, inp: object, now: float) -> bool:
        return not self._one_sided and self._at_work(rec, now)

    def guard_revoke_unbounded(self, rec: ConsumerRecord, inp: object, now: float) -> bool:
        return not self._revoke_bounded

    # -- effects -------------------------------------------------------------------------------
    def _take_job(self, rec: ConsumerRecord, inp: LoadSubmitted) -> None:
        # rounds are unique per manager, so a reused id never matches an old round
        rec.job_id = inp.job_id
        rec.keys = inp.keys
        rec.slots = inp.slots
        rec.round = self.rounds.take()
        rec.landed = BlockStates(len(inp.keys))
        rec.digests = [0] * len(inp.keys)

    def effect_accept_load(self, rec: ConsumerRecord, inp: LoadSubmitted, reason, now, out) -> None:
        self._take_job(rec, inp)
        rec.due = now + self._durations["load"]

    def effect_send_fetch(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        rec.fetched = True
        slots = list(rec.slots) if self._one_sided else []
        msg = wm.Fetch(gen=self._sessions.gen(rec.peer), kv_request_id=rec.kv_request_id, round=rec.round,
                       keys=list(rec.keys), slots=slots, offered=self.OFFERED, life=rec.life,
                       low=self._low(rec.peer, rec.round))
        out.append(Send(rec.peer, msg))

    def effect_land_blocks(self, rec: ConsumerRecord, inp: MessageInput, reason, now, out) -> None:
        first, count = inp.first, inp.count
        # unchecked until blocks_landed: its answer may come in a later step (a landing on the
        # digest pool), and a block_data naming these blocks again meanwhile is not valid
        rec.landed.start(first, count)
        if inp.digests:
            rec.digests[first : first + count] = inp.digests
        out.append(LandBlocks(rec.peer, rec.kv_request_id, rec.round, first, rec.slots[first : first + count],
                              inp.digests, inp.payloads))

    def effect_note_checked(self, rec: ConsumerRecord, inp: MessageInput, reason, now, out) -> None:
        rec.landed.settle(inp.first, inp.count, inp.ok)

    def effect_send_receipt(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        out.append(Send(rec.peer, wm.Receipt(gen=self._sessions.gen(rec.peer), kv_request_id=rec.kv_request_id,
                                             round=rec.round, life=rec.life)))

    def effect_revoke_access(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        out.append(RevokeAccess(rec.peer))

    def effect_give_up_peer(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        self._notes.append(GiveUp(rec.peer, Reason.ABORT_UNACKNOWLEDGED))

    def effect_note_finished(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        rec.engine_finished = True

    def effect_report_load_ok(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        out.append(JobDone(rec.job_id, True, None))
        rec.job_id = None

    def effect_fail_job(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        if rec.job_id is not None:
            keys, verify = self._verified_prefix(rec)
            out.append(JobDone(rec.job_id, False, reason, keys, verify))
            rec.job_id = None

    def _verified_prefix(self, rec: ConsumerRecord) -> tuple[tuple[bytes, ...] | None, tuple[tuple[int, int], ...]]:
        """A failed load's ``successful_keys``: the longest prefix of its fetch whose blocks landed
        and matched their digests (vLLM keeps a prefix and recomputes from the first hole, so a
        verified key after a hole is not reported; decision I21).  Every path to a failed result
        runs only once no write can land in the slots (properties ``no_write_after_terminal``,
        ``result_after_last_write``); on a one-sided plane the peer wrote the slots itself, so
        each key comes with ``(slot, digest)`` for the shell to check once more at reporting
        (property ``partial_keys_verified``).  Without integrity checking nothing was verified:
        None."""
        n = rec.landed.prefix() if self.integrity else 0
        if not n:
            return None, ()
        keys = rec.keys[:n]
        verify = tuple(zip(rec.slots[:n], rec.digests[:n])) if self._one_sided else ()
        return keys, verify

    def effect_fail_new_job(self, rec: ConsumerRecord, inp: LoadSubmitted, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, False, reason))

    def effect_report_new_job_ok(self, rec: ConsumerRecord, inp: LoadSubmitted, reason, now, out) -> None:
        out.append(JobDone(inp.job_id, True, None))

    def effect_send_abort(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        if rec.round < 0:  # nothing fetched yet: a fresh round names this cancellation
            rec.round = self.rounds.take()
        msg = wm.AbortFetch(gen=self._sessions.gen(rec.peer), kv_request_id=rec.kv_request_id, round=rec.round,
                            fetched=rec.fetched, offered=self.OFFERED, life=rec.life,
                            low=self._low(rec.peer, rec.round))
        out.append(Send(rec.peer, msg))

    def effect_note_notice(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        rec.notice = reason

    def effect_recall_notice(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        if rec.notice is not None:
            rec.reason = rec.notice

    def effect_note_held(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        out.append(SlotsHeld(rec.peer, rec.key, len(rec.slots)))

    def effect_redial(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        rec.redialled = True
        self.effect_dial(rec, inp, reason, now, out)

    def effect_dial(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        self._notes.append(Dial(rec.peer))  # routed as the engine's Dial: nothing if a session is open

    def effect_note_stale(self, rec: ConsumerRecord, inp, reason, now, out) -> None:
        out.append(Ignored(self.NAME, str(rec.key), rec.state, "message", reason or Reason.STALE))


class RoundCounter:
    """The manager's one source of round numbers (PD loads, their cancellations, symmetric
    rounds): a round is unique per manager, so a reused id never matches an old round and a
    producer keys a consumer's round by (peer, kv_request_id, round) safely."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 0

    def take(self) -> int:
        n = self.next
        self.next += 1
        return n
