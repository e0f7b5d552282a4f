"""``TierCore``: the sans-I/O heart of kvtier — producer, consumer, session, probe and serve machines.

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
round)`` to that round's load if there is one, else the id's probe, else the PD consumer.

Three tables, no switchboards: ``_APPLY`` (input type → the method that applies it); wire message
type → its handler in :class:`~kvtier.lifecycle.receive.Receive` (the spec's ``WIRE`` table, C16,
behind the session gate); ``_ROUTE`` (note type → what one machine's note means for another: a
record that gives up on its peer ends the session; a session that ends tells every record bound to
it; a session that becomes ready lets its queued loads fetch).  Notes are routed after the
transition that made them, so no machine ever re-enters another mid-transition.

The input-before-deadline contract (spec property ``input_before_deadline``, decisions I3, C14)
is stated once, in :func:`kvtier.lifecycle.driver.drive`: inputs are applied (and what their
effects report applied right after) in arrival order, and only then do deadlines fire, up to the
time the shell last saw its inbound queue empty and no later than the arrival stamp of anything
it still holds — so a deadline never beats a message that was already waiting when it fell due.
The shell, the model checker and the stateful suite all drive the core through that one function.

The core builds every message it sends (``block_data`` headers: :mod:`kvtier.lifecycle.batches`), reports
every job's result (a job no machine takes: ``JobSettled``) and owns six machines and two parts: ``Receive``
(peer messages) and :class:`~kvtier.lifecycle.reads.CoreReads` (reads spanning machines, decision W12).
"""

from __future__ import annotations

from kvtier.lifecycle._machine import TableMachine
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
from kvtier.lifecycle.batches import Batcher
from kvtier.lifecycle.consumer import ConsumerMachine, MessageInput, RoundCounter
from kvtier.lifecycle.effects import Effect, Ignored, JobDone
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
    JobSettled,
    KeyLookedUp,
    LoadAnnounced,
    LoadSubmitted,
    LookupAnswered,
    Malformed,
    PeerAttached,
    PeerProgress,
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
from kvtier.lifecycle.probe import ProbeMachine, RoundLoads
from kvtier.lifecycle.producer import ProducerMachine
from kvtier.lifecycle.reads import CoreReads
from kvtier.lifecycle.receive import Receive, Why
from kvtier.lifecycle.serve import ServeLimits, ServeMachine, ServeRoom, is_transfer_key
from kvtier.lifecycle.session import HelloInput, SessionMachine
from kvtier.lifecycle.settings import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.views import ConsumerView, CoreRecords, CoreSnapshot, ProbeAnswers

__all__ = ["CoreSettings", "TIMER_KEYS", "TierCore"]


class TierCore:
    """The lifecycle core of one manager: six machines and the parts built on them (module docstring).

    Args:
        settings: timers and limits (:class:`CoreSettings`).
        local: our hello: protocol version, block size, layout, hash seed, data plane, digest,
            instance and data-plane descriptor (``gen`` unused).
        gen_base: first session generation minus one (random per process: a restart never reuses a live one).
    """

    def __init__(self, settings: CoreSettings, local: HelloInput, *, gen_base: int = 0) -> None:
        self.settings = settings
        self._notes: Notes = Notes()
        d = settings.durations
        self._producer = ProducerMachine(
            d, park_clock=settings.park_clock, tombstone_max=settings.tombstone_max,
            max_pending_fetches_per_peer=settings.max_pending_fetches_per_peer, notes=self._notes,
        )
        self._sessions = SessionMachine(d, local, self._notes, gen_base=gen_base, max_peers=settings.max_peers,
                                       goodbye_linger_s=settings.shutdown_grace_s)
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
        self._producer.batcher = self._serve.batcher = Batcher(settings.block_bytes, settings.max_header_bytes,
                                                               settings.integrity)
        self._machines = (self._sessions, self._producer, self._consumer, self._probe, self._rounds, self._serve)
        self._rx = Receive(*self._machines, self._settle, settings.error_reply_interval_s)
        self._reads = CoreReads(*self._machines)
        self._APPLY = {
            Received: self._rx.received,
            StoreSubmitted: self._store,
            LoadAnnounced: self._announce,
            Dial: self._dial,
            LoadSubmitted: self._load,
            ConsumerNamed: self._named,
            RequestFinished: self._finished,
            DrainStarted: self._drain,
            ShutdownStarted: self._shutdown,
            GraceEnded: self._close,
            Malformed: self._rx.malformed,
            ConnectionUp: self._connection_up,
            ConnectFailed: self._connect_failed,
            ConnectionClosed: self._connection_closed,
            SendFailed: self._send_failed,
            TransferReleased: self._released,
            AccessRevoked: self._revoked,
            BlocksLanded: self._landed,
            PeerAttached: self._attached,
            PeerProgress: self._rx.progress,
            AttachRefused: self._attached,
            PlaneFaulted: self._plane_faulted,
            ProbeAnnounced: self._probe_announce,
            KeyLookedUp: self._probe.lookup,
            ScheduleEnded: self._schedule_ended,
            LookupAnswered: self._lookup_answered,
            JobSettled: self._job_settled,
        }
        self._ROUTE = {
            Dial: self._dial,
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
        """The producer, consumer and session machines by spec name: for machine-level checkers only
        (the reference interpreter shadows every transition, ``tools/reference.py``)."""
        return {"producer": self._producer, "consumer": self._consumer, "session": self._sessions}

    # =========================================================================================
    # Reads (O(1) unless said otherwise; decision C8: nothing outside kvtier.lifecycle reads a
    # machine's records)
    # =========================================================================================
    def producer_state(self, kv_request_id: str) -> ProducerState:
        """The producer state of ``kv_request_id`` (``absent`` when there is no record)."""
        return self._producer.state_of(kv_request_id)

    def consumer_state(self, kv_request_id: str) -> ConsumerState:
        """The (PD) consumer state of ``kv_request_id`` (``absent`` when there is no record)."""
        return self._consumer.state_of(kv_request_id)

    def probe_state(self, kv_request_id: str) -> ProbeState:
        """The probe state of symmetric request ``kv_request_id`` (``absent``: no record)."""
        return self._probe.state_of(kv_request_id)

    def consumer(self, kv_request_id: str) -> ConsumerView | None:
        """A snapshot of the (PD) consumer record of ``kv_request_id``, or None."""
        return self._reads.consumer(kv_request_id)

    def load_ended(self, kv_request_id: str) -> bool:
        """True when lookups for this id must MISS: its load failed (recompute) or loaded (once: L8)."""
        return self._consumer.state_of(kv_request_id) in (ConsumerState.FAILED, ConsumerState.LOADED)

    def producer_count(self) -> int:
        """Producer records (live and retained)."""
        return len(self._producer.records)

    def awaiting_ids(self, seen: int) -> tuple[int, frozenset[str] | None]:
        """The producer ids a fetch awaits and their version: None if unchanged since ``seen``
        (O(1); O(awaiting) when it moved).  A store for one of them is urgent (decision C34)."""
        return self._reads.awaiting_ids(seen)

    def quarantined_count(self) -> int:
        """Quarantined producer ids: their release never confirmed, their jobs stay outstanding (I1)."""
        return len(self._producer.quarantined)

    def quarantined_blocks(self) -> int:
        """Pool blocks held by quarantined producer ids (O(quarantined))."""
        return self._reads.quarantined_blocks()

    def loading(self) -> bool:
        """True while any load of ours is outstanding (a peer may be writing into our pool)."""
        return bool(self._consumer.by_peer) or bool(self._rounds.by_peer)

    def busy(self) -> bool:
        """True while a transfer or a load is in flight (what shutdown's grace waits for; O(records))."""
        return self._reads.busy()

    def probe_ids(self) -> list[str]:
        """Every symmetric request with a probe record, sorted."""
        return sorted(self._probe.records)

    def probe_answers(self, kv_request_id: str) -> ProbeAnswers:
        """Every key's answer for symmetric request ``kv_request_id``, as sets the shell publishes: RETRY while
        its round waits (``probe_timeout_s``), HIT for a key the peer pins for us (or a load fetches), else MISS."""
        return self._reads.probe_answers(kv_request_id)

    def round_loads(self, kv_request_id: str | None = None) -> list[ConsumerView]:
        """The loads of symmetric rounds (all, or those of ``kv_request_id``) as consumer views."""
        return self._reads.round_loads(kv_request_id)

    def symmetric_work(self) -> bool:
        """True while a probe round waits, a serve record lives or a round's load is out (``has_pending_work``)."""
        return self._reads.symmetric_work()

    def serve_room(self, peer: str, kv_request_id: str, round: int) -> ServeRoom | None:
        """What a lookup for ``peer``'s round may pin now (Y23); None once it stops looking up (the window skips it)."""
        looking = self._serve.state_of((peer, kv_request_id, round)) is ServeState.LOOKING_UP
        return self._serve.room(peer) if looking else None

    @property
    def serve_lookup_budget(self) -> int:  # keys one serve window may ask the engine about (Y25)
        return self._serve.lookup_budget

    def snapshot(self) -> CoreSnapshot:
        """Counts for the metrics endpoint (O(records): computed at scrape time, not per tick)."""
        return self._reads.snapshot()

    def records(self) -> CoreRecords:
        """Every record as frozen views, with the deadlines and indexes a checker asks about: for
        tests, tools and introspection (O(records), never a per-message path)."""
        return self._reads.records()

    @property
    def local(self) -> HelloInput:
        """Our hello (what every later handshake announces)."""
        return self._sessions.local

    def set_local(self, local: HelloInput) -> None:
        """Replace our hello (e.g. the hash seed became known); established sessions keep the
        one they were checked with, every later handshake uses this one."""
        self._sessions.local = local

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
    # Engine inputs
    # =========================================================================================
    def _store(self, inp: StoreSubmitted, now: float, out: list[Effect]) -> None:
        self._producer.store(inp, now, out)

    def _named(self, inp: ConsumerNamed, now: float, out: list[Effect]) -> None:
        self._producer.announce(inp.kv_request_id, inp.consumer, now, out)

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

    def _schedule_ended(self, inp: ScheduleEnded, now: float, out: list[Effect]) -> None:
        for kv_request_id, keys in inp.keys:  # the step's lookups first (Y26)
            self._probe.lookups(kv_request_id, keys, now, out)
        self._probe.schedule_end(now, out)

    def _lookup_answered(self, inp: LookupAnswered, now: float, out: list[Effect]) -> None:
        self._serve.lookup_result(inp, now, out)

    def _job_settled(self, inp: JobSettled, now: float, out: list[Effect]) -> None:
        out.append(JobDone(inp.job_id, inp.ok, inp.reason))

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
        self._session_event(inp.peer, SessionEvent.CONNECTION_CLOSED, inp, now, out)

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
        self._rx.to_consumer(inp.peer, ConsumerEvent.BLOCKS_LANDED, None, m, now, out)

    # =========================================================================================
    # Notes between machines
    # =========================================================================================
    def _route_give_up(self, note: GiveUp, now: float, out: list[Effect]) -> None:
        self._session_event(note.peer, SessionEvent.GIVE_UP, Why(note.reason), now, out)

    def _route_peer_lost(self, note: PeerLost, now: float, out: list[Effect]) -> None:
        why = Why(note.reason)
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
