"""``TierCore``: the sans-I/O heart of kvtier — producer, consumer, session, probe and serve machines
composed.

Theory of operation
-------------------
The I/O shell (``kvtier.shell``) turns every engine call, decoded wire message, transport event
and data-plane report into an input record (:mod:`kvtier.lifecycle.inputs`) and hands each to
:meth:`TierCore.handle` with ``now`` (seconds on the shell's clock), which returns the effects to
perform, in order (:mod:`kvtier.lifecycle.effects`).  The core decides everything about the life
of a ``kv_request_id``: when to send blocks, when to refuse, when a job is done or failed, when a
session is dead, when to ping, whether a malformed message gets an answer.  It never touches a
socket, a tensor or a clock, and it never raises because of what a *peer* sent: peer inputs are
applied, answered or ignored according to the spec.  :class:`~kvtier.lifecycle.errors.InvalidTransition`
and ``ValueError`` are raised only for misuse by the local caller.

The symmetric path (``remote_kv_source``, decisions Y1-Y16) adds two machines: **probe** (the
consumer's probing of one peer for one request; its rounds' loads are consumer lives of their own,
:class:`~kvtier.lifecycle.probe.RoundLoads`, keyed ``(kv_request_id, round)``) and **serve** (the
producer's answer to one round of one peer from its engine's own tiers, keyed ``(peer,
kv_request_id, round)``).  Messages are routed by what they name: ``fetch``/``abort_fetch`` with
``offered`` go to serve, others to the producer; a consumer-bound message for ``(kv_request_id,
round)`` goes to that round's load if there is one, else to the id's probe, else to the PD
consumer.

Three tables, no switchboards:

* ``_APPLY``: input type → the method that applies it;
* ``_RECEIVE``: wire message type → the method that turns it into a machine event (the session
  gate first: a message from a peer with no ready session, or tagged with another generation,
  never reaches the producer or consumer records);
* ``_ROUTE``: note type → what one machine's note means for another (a record that gives up on
  its peer ends the session; a session that ends tells every record bound to it; a session that
  becomes ready lets its queued loads fetch).  Notes are routed after the transition that made
  them, so no machine ever re-enters another mid-transition.

The input-before-deadline contract (spec property ``input_before_deadline``, decision I3) is
stated once, in :func:`kvtier.lifecycle.driver.drive`: inputs are applied (and what their effects
report applied right after) in arrival order, and only then do deadlines fire, up to the time the
shell last saw its inbound queue empty — so a deadline never beats a message that was already
waiting when it fell due.  The shell, the model checker and the stateful suite all drive the core
through that one function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from kvtier.lifecycle._table import (
    ConsumerEvent,
    ConsumerState,
    ProbeEvent,
    ProbeState,
    ProducerEvent,
    ProducerState,
    Reason,
    ServeEvent,
    ServeState,
    SessionEvent,
    SessionState,
)
from kvtier.lifecycle._machine import TableMachine
from kvtier.lifecycle.consumer import ConsumerMachine, MessageInput, RoundCounter
from kvtier.lifecycle.effects import Effect, Ignored, Send
from kvtier.lifecycle.inputs import (
    AccessRevoked,
    AttachRefused,
    BlocksLanded,
    ConnectFailed,
    ConnectionClosed,
    ConnectionUp,
    ConsumerNamed,
    Dial,
    DrainStarted,
    GraceEnded,
    Input,
    KeyLookedUp,
    LoadAnnounced,
    LoadSubmitted,
    LookupAnswered,
    Malformed,
    PeerAttached,
    PlaneFaulted,
    ProbeAnnounced,
    Received,
    RequestFinished,
    ScheduleEnded,
    SendFailed,
    ShutdownStarted,
    StoreSubmitted,
    TransferReleased,
)
from kvtier.lifecycle.notes import GiveUp, LoadRound, Notes, PeerLost, RoundLoadEnded, SessionReady
from kvtier.lifecycle.probe import Answer, ProbeMachine, ReplyInput, RoundLoads
from kvtier.lifecycle.producer import RETAINED, FetchInput, ProducerMachine
from kvtier.lifecycle.serve import ServeLimits, ServeMachine, is_transfer_key
from kvtier.lifecycle.session import HelloInput, SessionMachine
from kvtier.lifecycle.views import (
    ConsumerView,
    CoreSnapshot,
    DeadlineView,
    ProbeView,
    ProducerView,
    ServeView,
    SessionView,
)
from kvtier.wire import messages as wm

__all__ = ["CoreSettings", "TIMER_KEYS", "TierCore"]

TIMER_KEYS = (
    "unbound_store_timeout_s",
    "fetch_supply_timeout_s",
    "transfer_timeout_s",
    "tombstone_retention_s",
    "load_timeout_s",
    "abort_ack_timeout_s",
    "revoke_timeout_s",
    "handshake_timeout_s",
    "heartbeat_interval_s",
    "peer_timeout_s",
    "probe_timeout_s",
    "serve_lookup_timeout_s",
    "offer_timeout_s",
)
#: the symmetric path's timers, defaulted for callers that build durations by hand (config: Y6)
SYMMETRIC_TIMER_DEFAULTS = {"probe_timeout_s": 1.0, "serve_lookup_timeout_s": 0.25, "offer_timeout_s": 10.0}

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
_REASONS = frozenset(r.value for r in Reason)


class _Why(msgspec.Struct, frozen=True, gc=False):
    """The reason an input carries into a machine (a session's end, a peer's goodbye)."""

    reason: Reason | None


class CoreSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the core needs from the config (durations in seconds, keyed by config key)."""

    durations: Mapping[str, float]
    park_clock: str = "last_store"
    tombstone_max: int = 65536
    max_pending_fetches_per_peer: int = 1024
    max_peers: int = 128
    one_sided: bool = False
    """The data plane writes into the consumer's slots (fetches name them)."""
    revoke_bounded: bool = True
    """The data plane withdraws a producer's access by itself within ``revoke_timeout_s``
    (zmq; NIXL over a shared-memory pool), so a load in ``revoking`` is answered at its revoke
    deadline at the latest."""
    error_reply_interval_s: float = 10.0
    """At most one unsolicited ``error`` answer per (peer, reason) per this many seconds (a malformed message
    that names no ``kv_request_id``): a flood of garbage gets a bounded echo."""
    integrity: bool = True
    """Blocks carry digests checked as they land (config ``integrity`` is not ``none``): only then does a
    failed load report the blocks that landed (``successful_keys``)."""
    serve_external: bool = False
    """Serve peers' probes from the engine's tiers (the symmetric path's producer side)."""
    serve_allowed_principals: frozenset[str] | None = None
    """Principals allowed to probe (None: any peer with a ready session)."""
    serve_max_rounds_per_peer: int = 256
    serve_max_probes_per_round: int = 8
    serve_max_pinned_blocks_per_peer: int = 16384
    serve_max_pinned_blocks: int = 1 << 62
    """All peers together (the pool's ``serve_max_pinned_fraction``)."""

    @classmethod
    def from_config(cls, config: object, *, one_sided: bool = False, revoke_bounded: bool = True,
                    pool_blocks: int | None = None) -> CoreSettings:
        """Build from any object with the TierConfig attribute names (``pool_blocks``: the block
        pool's size, which ``serve_max_pinned_fraction`` is a fraction of)."""
        c: Any = config
        principals = tuple(getattr(c, "serve_allowed_principals", ("*",)))
        total = 1 << 62
        if pool_blocks is not None:
            total = max(1, int(pool_blocks * float(getattr(c, "serve_max_pinned_fraction", 0.5))))
        return cls(
            durations={**{k: float(getattr(c, k, SYMMETRIC_TIMER_DEFAULTS.get(k, 0.0))) for k in TIMER_KEYS},
                       "shutdown_grace_s": float(getattr(c, "shutdown_grace_s", 3.0))},
            park_clock=c.park_clock,
            tombstone_max=c.tombstone_max,
            max_pending_fetches_per_peer=c.max_pending_fetches_per_peer,
            max_peers=c.max_peers,
            one_sided=one_sided,
            revoke_bounded=revoke_bounded,
            integrity=getattr(c, "integrity", "xxh3_64") != "none",
            serve_external=bool(getattr(c, "serve_external", False)),
            serve_allowed_principals=None if "*" in principals else frozenset(principals),
            serve_max_rounds_per_peer=int(getattr(c, "serve_max_rounds_per_peer", 256)),
            serve_max_probes_per_round=int(getattr(c, "serve_max_probes_per_round", 8)),
            serve_max_pinned_blocks_per_peer=int(getattr(c, "serve_max_pinned_blocks_per_peer", 16384)),
            serve_max_pinned_blocks=total,
        )


def _reason(text: str) -> Reason:
    """A reason code from the wire: one of ours, else ``peer_error`` (a same-version peer names
    only codes of the shared vocabulary; anything else is its fault, not a new meaning)."""
    return Reason(text) if text in _REASONS else Reason.PEER_ERROR


class TierCore:
    """Producer + consumer + session machines of one manager instance.

    Args:
        settings: timers and limits (:class:`CoreSettings`).
        local: our hello: protocol version, block size, layout, hash seed, data plane, digest,
            instance and data-plane descriptor (``gen`` unused).
        gen_base: first session generation minus one (random per process, so a restart never
            reuses a live generation).
    """

    def __init__(self, settings: CoreSettings, local: HelloInput, *, gen_base: int = 0) -> None:
        self.settings = settings
        self._notes: Notes = Notes()
        d = {**SYMMETRIC_TIMER_DEFAULTS, **settings.durations}
        self._producer = ProducerMachine(
            d, park_clock=settings.park_clock, tombstone_max=settings.tombstone_max,
            max_pending_fetches_per_peer=settings.max_pending_fetches_per_peer, notes=self._notes,
        )
        self._sessions = SessionMachine(d, local, self._notes, gen_base=gen_base, max_peers=settings.max_peers)
        rounds = RoundCounter()  # one per manager: PD loads and symmetric rounds share it
        self._consumer = ConsumerMachine(d, self._sessions, self._notes, one_sided=settings.one_sided, rounds=rounds,
                                         integrity=settings.integrity, revoke_bounded=settings.revoke_bounded)
        self._probe = ProbeMachine(d, self._sessions, self._notes, rounds)
        self._rounds = RoundLoads(d, self._sessions, self._notes, one_sided=settings.one_sided, rounds=rounds,
                                  integrity=settings.integrity, revoke_bounded=settings.revoke_bounded)
        self._serve = ServeMachine(d, self._notes, ServeLimits(
            serve_external=settings.serve_external, principals=settings.serve_allowed_principals,
            max_rounds_per_peer=settings.serve_max_rounds_per_peer,
            max_probes_per_round=settings.serve_max_probes_per_round,
            max_pinned_per_peer=settings.serve_max_pinned_blocks_per_peer,
            max_pinned_total=settings.serve_max_pinned_blocks))
        self._machines = (self._sessions, self._producer, self._consumer, self._probe, self._rounds, self._serve)
        self._error_replies: dict[tuple[str, str], float] = {}
        self._APPLY = {
            Received: self._received,
            StoreSubmitted: self._store,
            LoadAnnounced: self._announce,
            Dial: self._dial,
            LoadSubmitted: self._load,
            ConsumerNamed: self._named,
            RequestFinished: self._finished,
            DrainStarted: self._drain,
            ShutdownStarted: self._shutdown,
            GraceEnded: self._close,
            Malformed: self._malformed,
            ConnectionUp: self._connection_up,
            ConnectFailed: self._connect_failed,
            ConnectionClosed: self._connection_closed,
            SendFailed: self._send_failed,
            TransferReleased: self._released,
            AccessRevoked: self._revoked,
            BlocksLanded: self._landed,
            PeerAttached: self._attached,
            AttachRefused: self._attached,
            PlaneFaulted: self._plane_faulted,
            ProbeAnnounced: self._probe_announce,
            KeyLookedUp: self._key_looked_up,
            ScheduleEnded: self._schedule_ended,
            LookupAnswered: self._lookup_answered,
        }
        self._RECEIVE = {
            wm.Fetch: self._rx_fetch,
            wm.AbortFetch: self._rx_abort_fetch,
            wm.Receipt: self._rx_receipt,
            wm.BlockData: self._rx_block_data,
            wm.TransferDone: self._rx_transfer_done,
            wm.AbortAck: self._rx_abort_ack,
            wm.Error: self._rx_error,
            wm.Ping: self._rx_ping,
            wm.Pong: self._rx_pong,
            wm.Hello: self._rx_hello,
            wm.HelloAck: self._rx_hello_ack,
            wm.HelloReject: self._rx_hello_reject,
            wm.Disconnect: self._rx_disconnect,
            wm.Probe: self._rx_probe,
            wm.ProbeReply: self._rx_probe_reply,
        }
        self._ROUTE = {
            GiveUp: self._route_give_up,
            PeerLost: self._route_peer_lost,
            SessionReady: self._route_ready,
            LoadRound: self._route_load_round,
            RoundLoadEnded: self._route_round_load_ended,
        }

    # =========================================================================================
    # The contract with the shell
    # =========================================================================================
    def handle(self, inp: Input, now: float) -> list[Effect]:
        """Apply one input at ``now`` (seconds); return the effects to perform, in order.

        Raises:
            InvalidTransition, ValueError: misuse by the *engine* (the record is unchanged); peer,
            transport and plane inputs never raise.
        """
        out: list[Effect] = []
        self._APPLY[type(inp)](inp, now, out)
        if self._notes:
            self._settle(now, out)
        return out

    def step(self, inputs: Iterable[Input], now: float) -> list[Effect]:
        """Apply ``inputs`` in order (no performing in between); return all their effects."""
        out: list[Effect] = []
        for inp in inputs:
            out.extend(self.handle(inp, now))
        return out

    def fire(self, now: float) -> list[Effect]:
        """Fire every deadline due at ``now``: O(expired) amortised.  The shell calls it through
        :func:`kvtier.lifecycle.driver.drive`, with the time its inbound queue was last seen
        empty, never with a time at which input may still be unread."""
        out: list[Effect] = []
        self._fire(now, out)
        return out

    def next_deadline(self) -> float | None:
        """Earliest pending deadline (seconds) over all machines, or None."""
        best = None
        for m in self._machines:
            d = m.next_deadline()
            if d is not None and (best is None or d < best):
                best = d
        return best

    def machines(self) -> dict[str, TableMachine]:
        """The producer, consumer and session machines, by spec machine name: for machine-level
        checkers only (the reference interpreter shadows every transition, ``tools/reference.py``).
        Everything else asks the read API."""
        return {"producer": self._producer, "consumer": self._consumer, "session": self._sessions}

    def deadlines(self) -> list[DeadlineView]:
        """Every live deadline, earliest first (ties: machine, then key).  O(records): for tests,
        tools and introspection, never a per-tick path."""
        out = []
        for m in (self._sessions, self._producer, self._consumer):
            out.extend(DeadlineView(when, m.NAME, key, lane) for when, _seq, key, lane in m._deadlines.live(m._is_live))
        p = self._producer
        out.extend(DeadlineView(when, p.NAME, key, p.records[key].timer) for key, when in p.retained.items())
        out.sort(key=lambda d: (d.when, d.machine, d.key))
        return out

    def deadline_entries(self) -> int:
        """Entries in the machines' deadline queues, stale ones not yet dropped included (what
        the deadlines cost in memory: for benchmarks; O(1))."""
        return sum(len(m._deadlines) for m in (self._sessions, self._producer, self._consumer))

    def _fire(self, now: float, out: list[Effect]) -> None:
        for m in self._machines:
            m.tick(now, out)
            self._settle(now, out)

    def _settle(self, now: float, out: list[Effect]) -> None:
        """Route the notes the last transitions queued (they may queue more)."""
        notes, route = self._notes, self._ROUTE
        while notes:
            note = notes.popleft()
            route[type(note)](note, now, out)

    # =========================================================================================
    # Read API: everything the shell, metrics and tests ask (nothing outside reads records)
    # =========================================================================================
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

    # =========================================================================================
    # Engine inputs
    # =========================================================================================
    def _store(self, inp: StoreSubmitted, now: float, out: list[Effect]) -> None:
        self._producer.store(inp, now, out)

    def _named(self, inp: ConsumerNamed, now: float, out: list[Effect]) -> None:
        self._producer.announce(inp.kv_request_id, inp.consumer)

    def _dial(self, inp: Dial, now: float, out: list[Effect]) -> None:
        sessions = self._sessions
        if inp.peer not in sessions.records:
            sessions.apply(sessions.new_record(inp.peer), SessionEvent.DIAL, None, now, out)

    def _announce(self, inp: LoadAnnounced, now: float, out: list[Effect]) -> None:
        sessions, peer = self._sessions, inp.peer
        if peer not in sessions.records:
            sessions.apply(sessions.new_record(peer), SessionEvent.DIAL, None, now, out)
        # a refused dial (max_peers) queued PeerLost: routed after this input, it fails the
        # load announced here at once (too_many_peers)
        self._consumer.announce(inp.kv_request_id, peer, now, out, inp.life)

    def _load(self, inp: LoadSubmitted, now: float, out: list[Effect]) -> None:
        if inp.kv_request_id in self._probe.records:
            self._probe.submit_load(inp, now, out)
        else:
            self._consumer.submit_load(inp, now, out)

    def _finished(self, inp: RequestFinished, now: float, out: list[Effect]) -> None:
        kid = inp.kv_request_id
        if inp.producer:
            self._producer.event(kid, ProducerEvent.REQUEST_FINISHED, now, out, inp)
            self._producer.forget(kid)
        elif kid in self._probe.records or kid in self._rounds.by_request:
            self._probe.event(kid, ProbeEvent.REQUEST_FINISHED, now, out)
            for rec in self._rounds.of_request(kid):  # a round's load still out is cancelled
                if rec.key in self._rounds.records:
                    self._rounds.apply(rec, ConsumerEvent.REQUEST_FINISHED, None, now, out)
        else:
            self._consumer.event(kid, ConsumerEvent.REQUEST_FINISHED, now, out)

    def _probe_announce(self, inp: ProbeAnnounced, now: float, out: list[Effect]) -> None:
        sessions, peer = self._sessions, inp.peer
        if peer not in sessions.records:
            sessions.apply(sessions.new_record(peer), SessionEvent.DIAL, None, now, out)
        # a refused dial (max_peers) queued PeerLost: routed after this input, it fails the probe
        self._probe.announce(inp.kv_request_id, peer, now, out)

    def _key_looked_up(self, inp: KeyLookedUp, now: float, out: list[Effect]) -> None:
        self._probe.lookup(inp, now, out)

    def _schedule_ended(self, inp: ScheduleEnded, now: float, out: list[Effect]) -> None:
        self._probe.schedule_end(now, out)

    def _lookup_answered(self, inp: LookupAnswered, now: float, out: list[Effect]) -> None:
        self._serve.lookup_result(inp, now, out)

    def _drain(self, inp: DrainStarted, now: float, out: list[Effect]) -> None:
        self._producer.broadcast(ProducerEvent.DRAIN, now, out)
        self._serve.broadcast(ServeEvent.DRAIN, now, out)

    def _shutdown(self, inp: ShutdownStarted, now: float, out: list[Effect]) -> None:
        self._producer.broadcast(ProducerEvent.SHUTDOWN, now, out)
        self._consumer.broadcast(ConsumerEvent.SHUTDOWN, now, out)
        self._probe.broadcast(ProbeEvent.SHUTDOWN, now, out)
        self._rounds.broadcast(ConsumerEvent.SHUTDOWN, now, out)
        self._serve.broadcast(ServeEvent.SHUTDOWN, now, out)

    def _close(self, inp: GraceEnded, now: float, out: list[Effect]) -> None:
        """Everything still live is given up and every session ends (a goodbye to each peer).
        Records whose blocks the data plane still references wait for its release, which
        closing the plane produces."""
        self._producer.broadcast(ProducerEvent.CLOSE, now, out)
        self._consumer.broadcast(ConsumerEvent.CLOSE, now, out)
        self._probe.broadcast(ProbeEvent.CLOSE, now, out)
        self._rounds.broadcast(ConsumerEvent.CLOSE, now, out)
        self._serve.broadcast(ServeEvent.CLOSE, now, out)
        self._settle(now, out)
        sessions = self._sessions
        for peer in sorted(sessions.records):
            rec = sessions.records.get(peer)
            if rec is not None:
                sessions.apply(rec, SessionEvent.CLOSE, None, now, out)
                self._settle(now, out)

    # =========================================================================================
    # Transport and data-plane inputs
    # =========================================================================================
    def _session_event(self, peer: str, event: SessionEvent, inp: object, now: float, out: list[Effect]) -> None:
        rec = self._sessions.records.get(peer)
        if rec is not None:
            self._sessions.apply(rec, event, inp, now, out)

    def _connection_up(self, inp: ConnectionUp, now: float, out: list[Effect]) -> None:
        self._session_event(inp.peer, SessionEvent.TRANSPORT_UP, inp, now, out)

    def _connect_failed(self, inp: ConnectFailed, now: float, out: list[Effect]) -> None:
        self._session_event(inp.peer, SessionEvent.CONNECT_FAILED, inp, now, out)

    def _send_failed(self, inp: SendFailed, now: float, out: list[Effect]) -> None:
        self._session_event(inp.peer, SessionEvent.SEND_FAILED, None, now, out)

    def _connection_closed(self, inp: ConnectionClosed, now: float, out: list[Effect]) -> None:
        self._session_event(inp.peer, SessionEvent.CONNECTION_CLOSED, None, now, out)

    def _attached(self, inp: PeerAttached | AttachRefused, now: float, out: list[Effect]) -> None:
        rec = self._sessions.records.get(inp.peer)
        event = SessionEvent.PLANE_ATTACHED if type(inp) is PeerAttached else SessionEvent.PLANE_REFUSED
        if rec is None or rec.gen != inp.gen:
            out.append(Ignored("session", inp.peer, rec.state if rec else SessionState.ABSENT, event, Reason.STALE))
            return
        self._sessions.apply(rec, event, inp, now, out)

    def _plane_faulted(self, inp: PlaneFaulted, now: float, out: list[Effect]) -> None:
        """The data plane's path to a peer broke: end that session (only the generation the plane
        took: a fault of an earlier session's entry is stale), so no fetch waits on a dead path
        and the next load dials afresh (decision I25)."""
        rec = self._sessions.records.get(inp.peer)
        if rec is None or rec.gen != inp.gen:
            out.append(Ignored("session", inp.peer, rec.state if rec else SessionState.ABSENT,
                               SessionEvent.PLANE_FAULT, Reason.STALE))
            return
        self._sessions.apply(rec, SessionEvent.PLANE_FAULT, None, now, out)

    def _released(self, inp: TransferReleased, now: float, out: list[Effect]) -> None:
        if is_transfer_key(inp.kv_request_id):
            event = ServeEvent.TRANSFER_FAILED if inp.failed else ServeEvent.TRANSFER_RELEASED
            self._serve.transfer_event(inp.kv_request_id, inp.round, event, now, out)
            return
        event = ProducerEvent.TRANSFER_FAILED if inp.failed else ProducerEvent.TRANSFER_RELEASED
        self._producer.transfer_event(inp.kv_request_id, inp.round, event, now, out)

    def _revoked(self, inp: AccessRevoked, now: float, out: list[Effect]) -> None:
        for consumer in (self._consumer, self._rounds):
            for key in sorted(consumer.by_peer.get(inp.peer, ())):
                rec = consumer.records.get(key)
                if rec is not None and rec.state is ConsumerState.REVOKING:
                    consumer.apply(rec, ConsumerEvent.ACCESS_REVOKED, None, now, out)

    def _landed(self, inp: BlocksLanded, now: float, out: list[Effect]) -> None:
        # no reason: a load that ends on a landing's answer keeps the reason it ended with (the
        # spec's corrupt branch names its own)
        m = MessageInput(inp.kv_request_id, inp.round, inp.first, inp.count, inp.ok)
        self._to_consumer(inp.peer, ConsumerEvent.BLOCKS_LANDED, None, m, now, out)

    def _to_consumer(self, peer: str, event: ConsumerEvent, probe_event: ProbeEvent | None, m: MessageInput,
                     now: float, out: list[Effect]) -> None:
        """A message for a load of ours: the symmetric round's load named by (id, round) if there
        is one; else the id's probe (``probe_event``; None: nothing of a probe, stale); else the
        PD consumer of the id."""
        kid = m.kv_request_id
        if (kid, m.round) in self._rounds.records:
            self._rounds.message(peer, event, m, now, out)
        elif kid in self._probe.records:
            if probe_event is None:
                out.append(Ignored("probe", kid, self._probe.state_of(kid), event, Reason.STALE))
            else:
                self._probe.message(peer, probe_event, ReplyInput(kid, m.round, ok=m.ok, reason=m.reason), now, out)
        else:
            self._consumer.message(peer, event, m, now, out)

    def _malformed(self, inp: Malformed, now: float, out: list[Effect]) -> None:
        """Answer a message that did not decode: a hello of another protocol version gets a
        handshake refusal naming the version; one that names a ``kv_request_id`` gets an
        ``error`` so its sender can fail that request at once; anything else an ``error`` at
        most once per (peer, reason) per ``error_reply_interval_s``."""
        peer = inp.peer
        if inp.reason == "version_mismatch" and inp.msg_type == "hello" and inp.gen is not None:
            out.append(Send(peer, wm.HelloReject(gen=inp.gen, reason=Reason.HANDSHAKE_MISMATCH.value, field="version",
                                                 ours=str(wm.PROTOCOL_VERSION), theirs=inp.theirs or "?")))
            return
        if not inp.kv_request_id:
            key = (peer, inp.reason)
            last = self._error_replies.get(key)
            if last is not None and now - last < self.settings.error_reply_interval_s:
                return
            if len(self._error_replies) >= 4096:  # bounded: peer ids come from connections
                self._error_replies.clear()
            self._error_replies[key] = now
        out.append(Send(peer, wm.Error(gen=self._sessions.gen(peer), reason=str(inp.reason), detail=inp.detail[:4096],
                                       kv_request_id=inp.kv_request_id)))

    # =========================================================================================
    # Peer messages
    # =========================================================================================
    def _received(self, inp: Received, now: float, out: list[Effect]) -> None:
        self._RECEIVE[type(inp.msg)](inp, now, out)

    def _gate(self, peer: str, msg: object, event: SessionEvent, now: float, out: list[Effect]) -> bool:
        """Let a peer message through only on a ready session of the same generation — or, for a
        release (an abort_fetch, an empty fetch: nothing for the data plane), on one still
        attaching (decision I24)."""
        sessions = self._sessions
        rec = sessions.records.get(peer)
        if rec is None:
            sessions.apply(sessions.new_record(peer), event, msg, now, out)
            return False
        if rec.gen != msg.gen:  # type: ignore[attr-defined]
            out.append(Ignored("session", peer, rec.state, event, Reason.STALE))
            return False
        state = rec.state
        open_ = state is SessionState.READY or (state is SessionState.ATTACHING and event is SessionEvent.RELEASE)
        sessions.apply(rec, event, msg, now, out)
        return open_

    def _fetch_input(self, peer: str, msg, *, keys=(), slots=(), fetched=False) -> FetchInput:
        rec = self._sessions.records.get(peer)
        rounds = None
        low = getattr(msg, "low", 0)
        if rec is not None:
            rounds = rec.rounds
            if low:
                rounds.note_low(low)
        return FetchInput(peer, msg.kv_request_id, msg.round, keys, msg.gen, slots, fetched,
                          rec.principal if rec is not None else None, getattr(msg, "life", ""), low, rounds)

    def _rx_fetch(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        event = SessionEvent.MESSAGE if msg.keys else SessionEvent.RELEASE  # an empty fetch only releases
        if self._gate(inp.peer, msg, event, now, out):
            f = self._fetch_input(inp.peer, msg, keys=tuple(msg.keys), slots=tuple(msg.slots))
            if msg.offered:  # blocks a probe reply offered: never a PD id's parked blocks (Y5)
                self._serve.message(ServeEvent.FETCH, f, now, out)
            else:
                self._producer.fetch(f, now, out)

    def _rx_abort_fetch(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.RELEASE, now, out):
            f = self._fetch_input(inp.peer, msg, fetched=msg.fetched)
            if msg.offered:
                self._serve.message(ServeEvent.ABORT_FETCH, f, now, out)
            else:
                self._producer.abort_fetch(f, now, out)

    def _rx_receipt(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.MESSAGE, now, out):
            f = self._fetch_input(inp.peer, msg)
            if (inp.peer, msg.kv_request_id, msg.round) in self._serve.records:
                self._serve.message(ServeEvent.RECEIPT, f, now, out)
            else:
                self._producer.receipt(f, now, out)

    def _rx_probe(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.MESSAGE, now, out):
            self._serve.message(ServeEvent.PROBE, self._fetch_input(inp.peer, msg, keys=tuple(msg.keys)), now, out)

    def _rx_probe_reply(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.MESSAGE, now, out):
            r = ReplyInput(msg.kv_request_id, msg.round, tuple(msg.keys), tuple(msg.hits), ok=True)
            self._probe.message(inp.peer, ProbeEvent.PROBE_REPLY, r, now, out)

    def _rx_block_data(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.MESSAGE, now, out):
            m = MessageInput(msg.kv_request_id, msg.round, msg.first, msg.count, digests=tuple(msg.digests),
                             payloads=inp.payloads, life=msg.life)
            self._to_consumer(inp.peer, ConsumerEvent.BLOCK_DATA, None, m, now, out)

    def _rx_transfer_done(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.MESSAGE, now, out):
            reason = None if msg.ok else _reason(msg.reason or Reason.TRANSFER_FAILED.value)
            m = MessageInput(msg.kv_request_id, msg.round, ok=msg.ok, reason=reason, life=msg.life, final=msg.final)
            self._to_consumer(inp.peer, ConsumerEvent.TRANSFER_DONE, ProbeEvent.TRANSFER_DONE, m, now, out)

    def _rx_abort_ack(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.MESSAGE, now, out):
            # a probe's release needs no answer: an abort_ack for it concerns no record
            self._to_consumer(inp.peer, ConsumerEvent.ABORT_ACK, None, MessageInput(msg.kv_request_id, msg.round,
                                                                                   life=msg.life),
                              now, out)

    def _rx_error(self, inp: Received, now: float, out: list[Effect]) -> None:
        """The peer answered ``error`` (it could not accept our message).  One that names one of
        our live loads fails that load now with ``peer_error`` instead of at its deadline (a
        symmetric request's: its probe's open round and its rounds' loads); anything else about the
        id is unaffected."""
        msg, peer = inp.msg, inp.peer
        probe = self._probe.records.get(msg.kv_request_id) if msg.kv_request_id else None
        if probe is not None and probe.peer == peer:
            if self._gate(peer, msg, SessionEvent.MESSAGE, now, out):
                for r in self._rounds.of_request(msg.kv_request_id):
                    m = MessageInput(msg.kv_request_id, r.round, ok=False, reason=Reason.PEER_ERROR)
                    self._rounds.message(peer, ConsumerEvent.TRANSFER_DONE, m, now, out)
                if probe.round >= 0:
                    r = ReplyInput(msg.kv_request_id, probe.round, ok=False, reason=Reason.PEER_ERROR)
                    self._probe.message(peer, ProbeEvent.TRANSFER_DONE, r, now, out)
            return
        rec = self._consumer.records.get(msg.kv_request_id) if msg.kv_request_id else None
        if rec is None or rec.peer != peer:
            return
        if self._gate(peer, msg, SessionEvent.MESSAGE, now, out):
            m = MessageInput(msg.kv_request_id, rec.round, ok=False, reason=Reason.PEER_ERROR)
            self._consumer.message(peer, ConsumerEvent.TRANSFER_DONE, m, now, out)

    def _rx_ping(self, inp: Received, now: float, out: list[Effect]) -> None:
        self._gate(inp.peer, inp.msg, SessionEvent.PING, now, out)

    def _rx_pong(self, inp: Received, now: float, out: list[Effect]) -> None:
        self._gate(inp.peer, inp.msg, SessionEvent.PONG, now, out)

    def _rx_hello(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg, peer, sessions = inp.msg, inp.peer, self._sessions
        hello = HelloInput(msg.version, msg.block_bytes, msg.layout, msg.hash_seed, msg.gen, msg.data_plane,
                           msg.digest, msg.instance, inp.principal or msg.instance, msg.descriptor, msg.replaces)
        rec = sessions.records.get(peer)
        if rec is not None:
            sessions.apply(rec, SessionEvent.HELLO, hello, now, out)
            self._settle(now, out)
            if not (rec.state is SessionState.DEAD and rec.reason is Reason.PEER_RESTARTED):
                return
        # a new session (or the restarted peer's next generation)
        if hello.replaces:
            self._supersede(peer, hello, now, out)
        if len(sessions.records) >= sessions.max_peers:
            self._evict_idle(now, out)
        sessions.apply(sessions.new_record(peer), SessionEvent.HELLO, hello, now, out)

    def _rx_hello_ack(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg, peer = inp.msg, inp.peer
        rec = self._sessions.records.get(peer)
        if rec is None or rec.gen != msg.gen:
            out.append(Ignored("session", peer, rec.state if rec else SessionState.ABSENT, SessionEvent.HELLO_ACK,
                               Reason.STALE))
            return
        self._sessions.apply(rec, SessionEvent.HELLO_ACK, msg, now, out)

    def _rx_hello_reject(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg, peer = inp.msg, inp.peer
        rec = self._sessions.records.get(peer)
        if rec is None or rec.gen != msg.gen:
            out.append(Ignored("session", peer, rec.state if rec else SessionState.ABSENT, SessionEvent.HELLO_REJECT,
                               Reason.STALE))
            return
        self._sessions.apply(rec, SessionEvent.HELLO_REJECT, _Why(_reason(msg.reason)), now, out)

    def _rx_disconnect(self, inp: Received, now: float, out: list[Effect]) -> None:
        """The peer said goodbye (``shutdown`` makes our loads fail with ``shutdown``), or
        answered that it does not know our session (gen 0 is accepted: it may not know ours)."""
        msg, peer = inp.msg, inp.peer
        rec = self._sessions.records.get(peer)
        if rec is None or (rec.gen != msg.gen and msg.gen != 0):
            out.append(Ignored("session", peer, rec.state if rec else SessionState.ABSENT, SessionEvent.DISCONNECT,
                               Reason.STALE))
            return
        why = _reason(msg.reason) if msg.reason else None
        self._sessions.apply(rec, SessionEvent.DISCONNECT, _Why(why), now, out)

    def _supersede(self, peer: str, hello: HelloInput, now: float, out: list[Effect]) -> None:
        """A consumer's hello names the generation of its previous session to us (``replaces``):
        it opens a new session to an address only once its record of the old one is gone, so an
        inbound session of that generation from the same instance and principal is dead on its
        side, whatever we still believe.  End it now (``peer_restarted``), before the new one is
        admitted: its data-plane entry holds the consumer's agent, which the new session's
        descriptor names again (decision N14)."""
        sessions = self._sessions
        for r in list(sessions.records.values()):
            if (r.key != peer and not r.dialled and r.gen == hello.replaces and r.instance == hello.instance
                    and r.principal == hello.principal):
                sessions.apply(r, SessionEvent.GIVE_UP, _Why(Reason.PEER_RESTARTED), now, out)
                self._settle(now, out)

    def _evict_idle(self, now: float, out: list[Effect]) -> None:
        """At ``max_peers``, end the inbound session that has been idle longest — nothing bound to
        it, nothing but pings for ``handshake_timeout_s`` — so a flood of hellos that never do any
        work cannot lock legitimate consumers out; a busy manager still refuses (too_many_peers)."""
        sessions = self._sessions
        idle_for = sessions.durations_of("handshake")
        busy = (set(self._producer.by_peer) | set(self._consumer.by_peer) | set(self._probe.by_peer)
                | set(self._rounds.by_peer) | set(self._serve.by_peer))
        idle = [
            r for r in sessions.records.values()
            if r.state is SessionState.READY and not r.dialled and r.key not in busy and now - r.active >= idle_for
        ]
        if idle:
            victim = min(idle, key=lambda r: (r.active, r.key))
            sessions.apply(victim, SessionEvent.GIVE_UP, _Why(Reason.IDLE_EVICTED), now, out)
            self._settle(now, out)

    # =========================================================================================
    # Notes between machines
    # =========================================================================================
    def _route_give_up(self, note: GiveUp, now: float, out: list[Effect]) -> None:
        self._session_event(note.peer, SessionEvent.GIVE_UP, _Why(note.reason), now, out)

    def _route_peer_lost(self, note: PeerLost, now: float, out: list[Effect]) -> None:
        why = _Why(note.reason)
        self._producer.peer_lost(note.peer, now, out)
        self._consumer.peer_event(note.peer, ConsumerEvent.PEER_LOST, now, out, why)
        self._rounds.peer_event(note.peer, ConsumerEvent.PEER_LOST, now, out, why)
        self._probe.peer_event(note.peer, ProbeEvent.PEER_LOST, now, out, why)
        self._serve.peer_lost(note.peer, now, out)

    def _route_ready(self, note: SessionReady, now: float, out: list[Effect]) -> None:
        self._consumer.peer_event(note.peer, ConsumerEvent.HANDSHAKE_READY, now, out)
        self._rounds.peer_event(note.peer, ConsumerEvent.HANDSHAKE_READY, now, out)
        self._probe.peer_event(note.peer, ProbeEvent.HANDSHAKE_READY, now, out)

    def _route_load_round(self, note: LoadRound, now: float, out: list[Effect]) -> None:
        self._rounds.start(note, now, out)

    def _route_round_load_ended(self, note: RoundLoadEnded, now: float, out: list[Effect]) -> None:
        """A round's load reported its job: the probe learns which keys landed; a load that is
        done (loaded or failed) has nothing left to do and ends (its probe carries the answers)."""
        if note.kv_request_id in self._probe.records:
            self._probe.event(note.kv_request_id, ProbeEvent.LOAD_ENDED, now, out, note)
        rec = self._rounds.records.get((note.kv_request_id, note.round))
        if rec is not None and rec.state in (ConsumerState.LOADED, ConsumerState.FAILED):
            self._rounds.apply(rec, ConsumerEvent.REQUEST_FINISHED, None, now, out)
