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
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kvtier.lifecycle._table import (
    ConsumerEvent,
    ConsumerState,
    ProducerEvent,
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

    def __init__(self, settings: CoreSettings, local: HelloInput, *, gen_base: int = 0) -> None:
        self.settings = settings
        self.producer = ProducerMachine(
            settings.durations,
            park_clock=settings.park_clock,
            tombstone_max=settings.tombstone_max,
            max_pending_fetches_per_peer=settings.max_pending_fetches_per_peer,
        )
        self.sessions = SessionMachine(
            settings.durations,
            local,
            gen_base=gen_base,
            on_peer_down=self._peer_down,
            on_ready=self._ready,
            max_peers=settings.max_peers,
        )
        self.consumer = ConsumerMachine(settings.durations, self.session_ready)

    # -- session helpers -----------------------------------------------------------------------
    def session_ready(self, peer: str) -> bool:
        rec = self.sessions.records.get(peer)
        return rec is not None and rec.state is SessionState.READY

    def session_gen(self, peer: str) -> int | None:
        rec = self.sessions.records.get(peer)
        return rec.gen if rec is not None else None

    def _peer_down(self, peer: str, reason: str, now: float, out: list[Effect]) -> None:
        self.producer.peer_lost(peer, now, out)
        self.consumer.peer_event(peer, ConsumerEvent.PEER_LOST, now, out, _Why(str(reason)))

    def _ready(self, peer: str, now: float, out: list[Effect]) -> None:
        self.consumer.peer_event(peer, ConsumerEvent.HANDSHAKE_READY, now, out)

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
        return was_ready

    # -- producer inputs (engine) --------------------------------------------------------------
    def store(self, inp: StoreInput, now: float) -> list[Effect]:
        """The engine submitted a store job. Raises ValueError if keys/blocks lengths differ."""
        out: list[Effect] = []
        self.producer.store(inp, now, out)
        return out

    def producer_finished(self, kv_request_id: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.producer.event(kv_request_id, ProducerEvent.REQUEST_FINISHED, now, out)
        return out

    def transfer_complete(self, kv_request_id: str, round: int, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.producer.transfer_event(kv_request_id, round, ProducerEvent.TRANSFER_COMPLETE, now, out)
        return out

    def transfer_failed(self, kv_request_id: str, round: int, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.producer.transfer_event(kv_request_id, round, ProducerEvent.TRANSFER_FAILED, now, out)
        return out

    def transfer_released(self, kv_request_id: str, round: int, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.producer.transfer_event(kv_request_id, round, ProducerEvent.TRANSFER_RELEASED, now, out)
        return out

    # -- consumer inputs (engine) --------------------------------------------------------------
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
        return out

    def submit_load(self, inp: LoadInput, now: float) -> list[Effect]:
        """Raises InvalidTransition if the id was never announced; ValueError on length mismatch."""
        out: list[Effect] = []
        self.consumer.submit_load(inp, now, out)
        return out

    def consumer_finished(self, kv_request_id: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.consumer.event(kv_request_id, ConsumerEvent.REQUEST_FINISHED, now, out)
        return out

    def load_failed(self, kv_request_id: str) -> bool:
        """True when lookups for this id must MISS (the engine should recompute)."""
        return self.consumer.state_of(kv_request_id) is ConsumerState.FAILED

    # -- session inputs (transport / wire) -----------------------------------------------------
    def transport_up(self, peer: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        self.sessions.apply(self.sessions.record(peer), SessionEvent.TRANSPORT_UP, None, now, out)
        return out

    def hello(self, peer: str, hello: HelloInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is not None and rec.state is SessionState.READY and rec.gen != hello.gen:
            self.sessions.apply(rec, SessionEvent.HELLO, hello, now, out)  # -> dead: peer_restarted
        elif rec is not None:
            self.sessions.apply(rec, SessionEvent.HELLO, hello, now, out)
            return out
        self.sessions.apply(self.sessions.record(peer), SessionEvent.HELLO, hello, now, out)
        return out

    def hello_ack(self, peer: str, gen: int, now: float) -> list[Effect]:
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is None or rec.gen != gen:
            out.append(Ignored("session", peer, rec.state.value if rec else "absent", "hello_ack", "stale"))
            return out
        self.sessions.apply(rec, SessionEvent.HELLO_ACK, None, now, out)
        return out

    def hello_reject(self, peer: str, gen: int, now: float) -> list[Effect]:
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is None or rec.gen != gen:
            out.append(Ignored("session", peer, rec.state.value if rec else "absent", "hello_reject", "stale"))
            return out
        self.sessions.apply(rec, SessionEvent.HELLO_REJECT, None, now, out)
        return out

    def disconnect(self, peer: str, gen: int, now: float) -> list[Effect]:
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is None or (rec.gen != gen and gen != 0):
            out.append(Ignored("session", peer, rec.state.value if rec else "absent", "disconnect", "stale"))
            return out
        self.sessions.apply(rec, SessionEvent.DISCONNECT, None, now, out)
        return out

    def send_failed(self, peer: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        rec = self.sessions.records.get(peer)
        if rec is not None:
            self.sessions.apply(rec, SessionEvent.SEND_FAILED, None, now, out)
        return out

    def ping(self, peer: str, gen: int, now: float) -> list[Effect]:
        """Any liveness-only message (ping/pong)."""
        out: list[Effect] = []
        self._gate(peer, gen, "ping", now, out)
        return out

    # -- producer inputs (wire) ----------------------------------------------------------------
    def fetch(self, peer: str, gen: int, inp: FetchInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._gate(peer, gen, "fetch", now, out):
            self.producer.fetch(inp, now, out)
        return out

    def abort_fetch(self, peer: str, gen: int, inp: FetchInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._gate(peer, gen, "abort_fetch", now, out):
            self.producer.abort_fetch(inp, now, out)
        return out

    # -- consumer inputs (wire) ----------------------------------------------------------------
    def block_data(self, peer: str, gen: int, inp: MessageInput, now: float) -> list[Effect]:
        """Returns a WriteBlocks effect iff the payload may be written (load in flight)."""
        out: list[Effect] = []
        if self._gate(peer, gen, "block_data", now, out):
            self.consumer.message(peer, ConsumerEvent.BLOCK_DATA, inp, now, out)
        return out

    def transfer_done(self, peer: str, gen: int, inp: MessageInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._gate(peer, gen, "transfer_done", now, out):
            self.consumer.message(peer, ConsumerEvent.TRANSFER_DONE, inp, now, out)
        return out

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
        return out

    def abort_ack(self, peer: str, gen: int, inp: MessageInput, now: float) -> list[Effect]:
        out: list[Effect] = []
        if self._gate(peer, gen, "abort_ack", now, out):
            self.consumer.message(peer, ConsumerEvent.ABORT_ACK, inp, now, out)
        return out

    # -- time and global -----------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """Earliest pending deadline (seconds) over all machines, or None."""
        ds = [d for d in (m.next_deadline() for m in (self.sessions, self.producer, self.consumer)) if d is not None]
        return min(ds) if ds else None

    def tick(self, now: float) -> list[Effect]:
        """Fire every due deadline: O(expired) amortised."""
        out: list[Effect] = []
        self.sessions.tick(now, out)
        self.producer.tick(now, out)
        self.consumer.tick(now, out)
        return out

    def drain(self, now: float) -> list[Effect]:
        """End every parked or awaiting id (their jobs fail with reason ``drained``); transfers in
        flight keep going and end by their own events or deadlines."""
        out: list[Effect] = []
        self.producer.broadcast(ProducerEvent.DRAIN, now, out)
        return out

    def shutdown(self, now: float) -> list[Effect]:
        """Every outstanding job fails with reason ``shutdown``; every session ends."""
        out: list[Effect] = []
        self.producer.broadcast(ProducerEvent.SHUTDOWN, now, out)
        self.consumer.broadcast(ConsumerEvent.SHUTDOWN, now, out)
        for peer in sorted(self.sessions.records):
            rec = self.sessions.records.get(peer)
            if rec is not None:
                self.sessions.apply(rec, SessionEvent.SHUTDOWN, None, now, out)
        return out

    def pending_jobs(self) -> int:
        """Jobs handed to the core that have no result yet."""
        return self.producer.pending_jobs() + self.consumer.pending_jobs()
