"""``TierCore``: the sans-I/O heart of kvtier — producer, consumer and session machines composed.

Theory of operation
-------------------
The I/O shell (``kvtier.manager``) turns every engine call, every decoded wire message and every
clock reading into one method call here, passing ``now`` (seconds on the shell's clock).  Each
method returns the effects to perform, in order (:mod:`kvtier.lifecycle.effects`).  The core
decides everything about the life of a ``kv_request_id``: when to send blocks, when to refuse,
when a job is done or failed, when a session is dead.  It never touches a socket, a tensor or a
clock, and it never raises because of what a *peer* sent: peer inputs are applied, answered or
ignored according to the spec.  :class:`~kvtier.lifecycle.errors.InvalidTransition` and
``ValueError`` are raised only for misuse by the local caller.

Sessions gate the network: a message from a peer with no ready session (or tagged with another
generation) never reaches the producer or consumer records.

Two things cross machines and are settled by this class after each input, in order: a record that
*gives up* on its peer (a transfer the data plane did not release, an abort the producer did not
answer) ends that peer's session (``give_up``), and sessions to one producer *instance* share
fate: when one dies abnormally the instance is suspect, and new loads to any session of that
instance fail fast (``instance_down``) until one of them is heard from again (B11).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kvtier.lifecycle._table import (
    ConsumerEvent,
    ConsumerState,
    ProducerEvent,
    ProducerState,
    SessionEvent,
    SessionState,
)
from kvtier.lifecycle.consumer import ConsumerMachine, LoadInput, MessageInput
from kvtier.lifecycle.effects import Effect, Ignored
from kvtier.lifecycle.producer import FetchInput, ProducerMachine, StoreInput
from kvtier.lifecycle.session import HelloInput, SessionMachine

TIMER_KEYS = (
    "unbound_store_timeout_s",
    "fetch_supply_timeout_s",
    "transfer_timeout_s",
    "tombstone_retention_s",
    "load_timeout_s",
    "abort_ack_timeout_s",
    "handshake_timeout_s",
    "peer_timeout_s",
)


_P_IN_FLIGHT = frozenset(
    {
        ProducerState.SERVING,
        ProducerState.DELIVERING,
        ProducerState.CONFIRMED,
        ProducerState.CANCELLING,
        ProducerState.QUARANTINED,
    }
)
_C_IN_FLIGHT = frozenset(
    {ConsumerState.IN_FLIGHT, ConsumerState.ABORTING, ConsumerState.CANCELLING, ConsumerState.REVOKING}
)


@attrs.frozen(slots=True)
class _Gen:
    gen: int


@attrs.frozen(slots=True)
class _Why:
    """The reason a consumer's session died, handed to its loads' peer_lost."""

    reason: str


@attrs.frozen(kw_only=True)
class CoreSettings:
    """Everything the core needs from the config (durations in seconds)."""

    durations: Mapping[str, float]
    park_clock: str = "last_store"
    tombstone_max: int = 65536
    max_pending_fetches_per_peer: int = 1024
    max_peers: int = 128

    @classmethod
    def from_config(cls, config: object) -> CoreSettings:
        """Build from any object with the TierConfig attribute names."""
        return cls(
            durations={k: float(getattr(config, k)) for k in TIMER_KEYS},
            park_clock=config.park_clock,  # type: ignore[attr-defined]
            tombstone_max=config.tombstone_max,  # type: ignore[attr-defined]
            max_pending_fetches_per_peer=config.max_pending_fetches_per_peer,  # type: ignore[attr-defined]
            max_peers=config.max_peers,  # type: ignore[attr-defined]
        )


class TierCore:
    """Producer + consumer + session machines of one manager instance."""

    #: instances remembered as suspect at most (oldest forgotten first): bounded bookkeeping
    MAX_SUSPECT = 4096
    #: session endings after which the peer's instance is suspect
    _ABNORMAL = frozenset(
        {"peer_timeout", "peer_disconnected", "send_failed", "transfer_stalled", "abort_unacknowledged"}
    )

    def __init__(self, settings: CoreSettings, local: HelloInput, *, gen_base: int = 0) -> None:
        self.settings = settings
        self._give_ups: list[tuple[str, str]] = []
        self.suspect: dict[str, None] = {}  # insertion-ordered set of suspect instances
        self.producer = ProducerMachine(
            settings.durations,
            park_clock=settings.park_clock,
            tombstone_max=settings.tombstone_max,
            max_pending_fetches_per_peer=settings.max_pending_fetches_per_peer,
            give_up=self._note_give_up,
        )
        self.sessions = SessionMachine(
            settings.durations,
            local,
            gen_base=gen_base,
            on_peer_down=self._peer_down,
            on_ready=self._ready,
            max_peers=settings.max_peers,
        )
        self.consumer = ConsumerMachine(
            settings.durations,
            self.session_ready,
            session_gen=lambda peer: self.session_gen(peer) or 0,
            instance_down=self._instance_down,
            give_up=self._note_give_up,
        )

    # -- session helpers -----------------------------------------------------------------------
    def session_ready(self, peer: str) -> bool:
        rec = self.sessions.records.get(peer)
        return rec is not None and rec.state is SessionState.READY

    def session_gen(self, peer: str) -> int | None:
        rec = self.sessions.records.get(peer)
        return rec.gen if rec is not None else None

    def _instance_down(self, peer: str) -> bool:
        rec = self.sessions.records.get(peer)
        return rec is not None and bool(rec.instance) and rec.instance in self.suspect

    def _peer_down(self, peer: str, reason: str, now: float, out: list[Effect]) -> None:
        rec = self.sessions.records.get(peer)
        if rec is not None and rec.instance and reason in self._ABNORMAL:
            self.suspect[rec.instance] = None
            if len(self.suspect) > self.MAX_SUSPECT:
                del self.suspect[next(iter(self.suspect))]
        self.producer.peer_lost(peer, now, out)
        self.consumer.peer_event(peer, ConsumerEvent.PEER_LOST, now, out, _Why(str(reason)))

    def _ready(self, peer: str, now: float, out: list[Effect]) -> None:
        self.consumer.peer_event(peer, ConsumerEvent.HANDSHAKE_READY, now, out)

    def _note_give_up(self, peer: str, reason: str) -> None:
        # deferred: the record that gives up finishes its own transition first
        self._give_ups.append((peer, reason))

    def _settle(self, now: float, out: list[Effect]) -> list[Effect]:
        """End the sessions records gave up on during this input (they may give up on more)."""
        while self._give_ups:
            peer, reason = self._give_ups.pop(0)
            rec = self.sessions.records.get(peer)
            if rec is not None:
                self.sessions.apply(rec, SessionEvent.GIVE_UP, _Why(reason), now, out)
        return out

    def _heard(self, peer: str) -> None:
        if self.suspect:
            rec = self.sessions.records.get(peer)
            if rec is not None:
                self.suspect.pop(rec.instance, None)

    def _gate(self, peer: str, gen: int, event: str, now: float, out: list[Effect]) -> bool:
        """Let a peer message through only on a ready session of the same generation."""
        rec = self.sessions.records.get(peer)
        if rec is None:
            self.sessions.apply(self.sessions.new_record(peer), SessionEvent.MESSAGE, _Gen(gen), now, out)
            return False
        if rec.gen != gen:
            out.append(Ignored("session", peer, rec.state.value, event, "stale"))
            return False
        was_ready = rec.state is SessionState.READY
        self.sessions.apply(rec, SessionEvent.MESSAGE, _Gen(gen), now, out)
        if was_ready:
            self._heard(peer)
            if event != "ping":
                rec.active = now
        return was_ready

    def _principal(self, peer: str) -> str | None:
        rec = self.sessions.records.get(peer)
        return rec.principal if rec is not None else None

    # -- producer inputs (engine) --------------------------------------------------------------
    def store(self, inp: StoreInput, now: float) -> list[Effect]:
        """The engine submitted a store job. Raises ValueError if keys/blocks/digests lengths differ."""
        out: list[Effect] = []
        self.producer.store(inp, now, out)
        return self._settle(now, out)

    def producer_announce(self, kv_request_id: str, consumer: str) -> None:
        """A producer request names ``consumer`` (a principal) as the only peer allowed to fetch,
        abort or otherwise touch ``kv_request_id`` (issue 10; docs/security.md)."""
        self.producer.announce(kv_request_id, consumer)

    def producer_finished(self, kv_request_id: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.producer.event(kv_request_id, ProducerEvent.REQUEST_FINISHED, now, out)
        self.producer.forget(kv_request_id)
        return self._settle(now, out)

    def transfer_released(self, kv_request_id: str, round: int, now: float) -> list[Effect]:
        """The data plane moved (or stopped moving) the transfer and holds no reference to its
        blocks any more."""
        out: list[Effect] = []
        self.producer.transfer_event(kv_request_id, round, ProducerEvent.TRANSFER_RELEASED, now, out)
        return self._settle(now, out)

    def transfer_failed(self, kv_request_id: str, round: int, now: float) -> list[Effect]:
        """The data plane failed the transfer and holds no reference to its blocks any more."""
        out: list[Effect] = []
        self.producer.transfer_event(kv_request_id, round, ProducerEvent.TRANSFER_FAILED, now, out)
        return self._settle(now, out)

    # -- consumer inputs (engine, shell) ---------------------------------------------------------
    def announce(self, kv_request_id: str, peer: str, now: float) -> list[Effect]:
        """The engine announced a request to fetch ``kv_request_id`` from producer ``peer``
        (``host:port``). Dials a session if none is live."""
        out: list[Effect] = []
        if peer not in self.sessions.records:
            self.sessions.apply(self.sessions.new_record(peer), SessionEvent.DIAL, None, now, out)
        self.consumer.announce(kv_request_id, peer, now, out)
        if peer not in self.sessions.records:  # the dial was refused (max_peers): fail fast
            rec = self.consumer.records.get(kv_request_id)
            if rec is not None:
                self.consumer.apply(rec, ConsumerEvent.PEER_LOST, _Why("too_many_peers"), now, out)
        return self._settle(now, out)

    def submit_load(self, inp: LoadInput, now: float) -> list[Effect]:
        """Raises InvalidTransition if the id was never announced; ValueError on length mismatch."""
        out: list[Effect] = []
        self.consumer.submit_load(inp, now, out)
        return self._settle(now, out)

    def consumer_finished(self, kv_request_id: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.consumer.event(kv_request_id, ConsumerEvent.REQUEST_FINISHED, now, out)
        return self._settle(now, out)

    def blocks_landed(self, peer: str, inp: MessageInput, now: float) -> list[Effect]:
        """The shell landed the blocks a ``LandBlocks`` named and checked their digests
        (``inp.ok`` False: at least one did not match)."""
        out: list[Effect] = []
        self.consumer.message(peer, ConsumerEvent.BLOCKS_LANDED, inp, now, out)
        return self._settle(now, out)

    def access_revoked(self, peer: str, kv_request_id: str, round: int, now: float) -> list[Effect]:
        """The data plane made sure ``peer`` can no longer write into this load's slots."""
        out: list[Effect] = []
        self.consumer.message(peer, ConsumerEvent.ACCESS_REVOKED, MessageInput(kv_request_id, round), now, out)
        return self._settle(now, out)

    def load_failed(self, kv_request_id: str) -> bool:
        """True when lookups for this id must MISS (the engine should recompute)."""
        return self.consumer.state_of(kv_request_id) is ConsumerState.FAILED

    # -- session inputs (transport / wire) -----------------------------------------------------
    def transport_up(self, peer: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.sessions.apply(self.sessions.record(peer), SessionEvent.TRANSPORT_UP, None, now, out)
        return self._settle(now, out)

    def hello(self, peer: str, hello: HelloInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is not None:
            self.sessions.apply(rec, SessionEvent.HELLO, hello, now, out)
            if not (rec.state is SessionState.DEAD and rec.reason == "peer_restarted"):
                return self._settle(now, out)
        # a new session (or the restarted peer's next generation)
        if len(self.sessions.records) >= self.sessions.max_peers:
            self._evict_idle(now, out)
        self.sessions.apply(self.sessions.record(peer), SessionEvent.HELLO, hello, now, out)
        if self.session_ready(peer):
            self._heard(peer)
        return self._settle(now, out)

    def hello_ack(self, peer: str, gen: int, now: float, instance: str = "") -> list[Effect]:
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is None or rec.gen != gen:
            out.append(Ignored("session", peer, rec.state.value if rec else "absent", "hello_ack", "stale"))
            return out
        if rec.state is SessionState.HANDSHAKING:
            rec.instance = instance
            self.suspect.pop(instance, None)
        self.sessions.apply(rec, SessionEvent.HELLO_ACK, None, now, out)
        return self._settle(now, out)

    def hello_reject(self, peer: str, gen: int, now: float, reason: str = "handshake_mismatch") -> list[Effect]:
        """The peer refused our hello; ``reason`` is the one it gave (``too_many_peers`` for a
        capacity refusal, so our loads fail with that reason, not a mismatch)."""
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is None or rec.gen != gen:
            out.append(Ignored("session", peer, rec.state.value if rec else "absent", "hello_reject", "stale"))
            return out
        self.sessions.apply(rec, SessionEvent.HELLO_REJECT, _Why(reason), now, out)
        return self._settle(now, out)

    def _evict_idle(self, now: float, out: list[Effect]) -> None:
        """At ``max_peers``, end the inbound session that has been idle longest — nothing bound to
        it, nothing but pings for ``handshake_timeout_s`` — so a flood of hellos that never do any
        work cannot lock legitimate consumers out; a busy manager still refuses (too_many_peers)."""
        idle_for = self.sessions.durations_of("handshake")
        busy = set(self.producer.by_peer) | set(self.consumer.by_peer)
        idle = [
            r for r in self.sessions.records.values()
            if r.state is SessionState.READY and not r.dialled and r.key not in busy and now - r.active >= idle_for
        ]
        if idle:
            victim = min(idle, key=lambda r: (r.active, r.key))
            self.sessions.apply(victim, SessionEvent.GIVE_UP, _Why("idle_evicted"), now, out)

    def disconnect(self, peer: str, gen: int, now: float, reason: str = "") -> list[Effect]:
        """The peer said goodbye (``reason`` from its disconnect: ``shutdown`` makes our loads
        fail with ``shutdown``), or answered that it does not know our session."""
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is None or (rec.gen != gen and gen != 0):
            out.append(Ignored("session", peer, rec.state.value if rec else "absent", "disconnect", "stale"))
            return out
        self.sessions.apply(rec, SessionEvent.DISCONNECT, _Why(reason), now, out)
        return self._settle(now, out)

    def connection_closed(self, peer: str, now: float) -> list[Effect]:
        """The transport saw the peer's connection close or reset: the session is dead at once."""
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is not None:
            self.sessions.apply(rec, SessionEvent.CONNECTION_CLOSED, None, now, out)
        return self._settle(now, out)

    def send_failed(self, peer: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is not None:
            self.sessions.apply(rec, SessionEvent.SEND_FAILED, None, now, out)
        return self._settle(now, out)

    def ping(self, peer: str, gen: int, now: float) -> list[Effect]:
        """Any liveness-only message (ping/pong)."""
        out: list[Effect] = []
        self._gate(peer, gen, "ping", now, out)
        return self._settle(now, out)

    # -- producer inputs (wire) ----------------------------------------------------------------
    def fetch(self, peer: str, gen: int, inp: FetchInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._gate(peer, gen, "fetch", now, out):
            self.producer.fetch(attrs.evolve(inp, gen=gen, principal=self._principal(peer)), now, out)
        return self._settle(now, out)

    def abort_fetch(self, peer: str, gen: int, inp: FetchInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._gate(peer, gen, "abort_fetch", now, out):
            self.producer.abort_fetch(attrs.evolve(inp, gen=gen, principal=self._principal(peer)), now, out)
        return self._settle(now, out)

    def receipt(self, peer: str, gen: int, inp: FetchInput, now: float) -> list[Effect]:
        """The consumer confirmed that every block of its round landed intact."""
        out: list[Effect] = []
        if self._gate(peer, gen, "receipt", now, out):
            self.producer.receipt(attrs.evolve(inp, gen=gen, principal=self._principal(peer)), now, out)
        return self._settle(now, out)

    # -- consumer inputs (wire) ----------------------------------------------------------------
    def block_data(self, peer: str, gen: int, inp: MessageInput, now: float) -> list[Effect]:
        """Returns a LandBlocks effect iff the blocks may land (load in flight, range valid)."""
        out: list[Effect] = []
        if self._gate(peer, gen, "block_data", now, out):
            self.consumer.message(peer, ConsumerEvent.BLOCK_DATA, inp, now, out)
        return self._settle(now, out)

    def transfer_done(self, peer: str, gen: int, inp: MessageInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._gate(peer, gen, "transfer_done", now, out):
            self.consumer.message(peer, ConsumerEvent.TRANSFER_DONE, inp, now, out)
        return self._settle(now, out)

    def peer_error(self, peer: str, gen: int, kv_request_id: str, now: float) -> list[Effect]:
        """The peer answered ``error`` about ``kv_request_id`` (it could not accept our message):
        the id's live load fails now with reason ``peer_error`` instead of waiting for its
        deadline.  Anything else about the id is unaffected."""
        out: list[Effect] = []
        rec = self.consumer.records.get(kv_request_id)
        if rec is None or rec.peer != peer:
            return out
        if self._gate(peer, gen, "error", now, out):
            inp = MessageInput(kv_request_id, rec.round, ok=False, reason="peer_error")
            self.consumer.message(peer, ConsumerEvent.TRANSFER_DONE, inp, now, out)
        return self._settle(now, out)

    def abort_ack(self, peer: str, gen: int, inp: MessageInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._gate(peer, gen, "abort_ack", now, out):
            self.consumer.message(peer, ConsumerEvent.ABORT_ACK, inp, now, out)
        return self._settle(now, out)

    # -- time and global -----------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """Earliest pending deadline (seconds) over all machines, or None."""
        ds = [d for d in (m.next_deadline() for m in (self.sessions, self.producer, self.consumer)) if d is not None]
        return min(ds) if ds else None

    def tick(self, now: float) -> list[Effect]:
        """Fire every deadline due at ``now``: O(expired) amortised.  The shell passes the time its
        inbound queue was last seen empty, so no deadline beats input that arrived before it."""
        out: list[Effect] = []
        self.sessions.tick(now, out)
        self.producer.tick(now, out)
        self.consumer.tick(now, out)
        return self._settle(now, out)

    def drain(self, now: float) -> list[Effect]:
        """End every parked or awaiting id (their jobs fail with reason ``drained``); transfers in
        flight keep going and end by their own events or deadlines."""
        out: list[Effect] = []
        self.producer.broadcast(ProducerEvent.DRAIN, now, out)
        return self._settle(now, out)

    def shutdown(self, now: float) -> list[Effect]:
        """Shutdown begins: parked and awaiting ids end now (jobs fail ``shutdown``; a bound
        consumer is told), queued loads fail, later fetches for unknown ids are refused; transfers
        and loads in flight, and the sessions carrying them, go on until :meth:`close`."""
        out: list[Effect] = []
        self.producer.broadcast(ProducerEvent.SHUTDOWN, now, out)
        self.consumer.broadcast(ConsumerEvent.SHUTDOWN, now, out)
        return self._settle(now, out)

    def close(self, now: float) -> list[Effect]:
        """The grace is over: everything still live is given up and every session ends (a goodbye
        to each peer).  Records whose blocks the data plane still references wait for its
        release, which closing the plane produces."""
        out: list[Effect] = []
        self.producer.broadcast(ProducerEvent.CLOSE, now, out)
        self.consumer.broadcast(ConsumerEvent.CLOSE, now, out)
        for peer in sorted(self.sessions.records):
            rec = self.sessions.records.get(peer)
            if rec is not None:
                self.sessions.apply(rec, SessionEvent.CLOSE, None, now, out)
        return self._settle(now, out)

    def busy(self) -> bool:
        """True while a transfer or a load is in flight (what shutdown's grace waits for)."""
        return any(r.state in _P_IN_FLIGHT for r in self.producer.records.values()) or any(
            r.state in _C_IN_FLIGHT for r in self.consumer.records.values()
        )

    def pending_jobs(self) -> int:
        """Jobs handed to the core that have no result yet."""
        return self.producer.pending_jobs() + self.consumer.pending_jobs()
