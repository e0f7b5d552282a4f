"""Session machine: one generation of the control session with one peer.

Theory of operation: a consumer *dials* a producer (``connecting`` → ``handshaking``: our hello
carries protocol version, block size, layout fingerprint, hash seed and a generation number);
the producer answers ``hello_ack`` or ``hello_reject`` naming the mismatching field and both
values.  A producer learns of a consumer from its hello.  While ``ready``, every message restarts
the liveness timer (pings every ``heartbeat_interval_s`` keep an idle session alive); silence for
``peer_timeout_s``, a disconnect, a send failure or a restart ends the session (``dead``) and
every record bound to the peer is told ``peer_lost``.  A reconnect is a new record with a new
generation; messages tagged with another generation are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from kvtier.lifecycle._machine import Record, TableMachine
from kvtier.lifecycle._table import (
    SESSION_FINAL,
    SESSION_INITIAL,
    SESSION_STATE_TIMER,
    SESSION_TABLE,
    SESSION_TIMERS,
    SessionEffect,
    SessionGuard,
)
from kvtier.lifecycle.effects import (
    CloseConnection,
    Effect,
    OpenConnection,
    PeerDown,
    SendDisconnect,
    SendHello,
    SendHelloAck,
    SendHelloReject,
)


@attrs.frozen(slots=True)
class HelloInput:
    """What a hello announces. Ours is built from the config and the block pool; the peer's
    arrives on the wire.  ``gen`` is the dialling side's session generation; ``instance`` names
    the peer's manager instance (sessions to one instance share fate, B11) and is not compared."""

    version: int
    block_bytes: int
    layout: str
    hash_seed: str
    gen: int = 0
    data_plane: str = "zmq"
    digest: str = "xxh3_64"
    instance: str = ""
    principal: str | None = None
    """Who the peer is: its CURVE principal, else (unauthenticated) its hello ``instance``."""

    def first_mismatch(self, other: HelloInput) -> tuple[str, str, str] | None:
        """(field, ours, theirs) of the first differing field, in handshake check order."""
        for name in ("version", "block_bytes", "layout", "hash_seed", "data_plane", "digest"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                return name, str(a), str(b)
        return None


class SessionRecord(Record):
    __slots__ = ("gen", "dialled", "instance", "principal", "active")

    def __init__(self, key: str) -> None:
        super().__init__(key, SESSION_INITIAL)
        self.gen = 0
        self.dialled = False
        self.instance = ""
        self.principal: str | None = None
        self.active = 0.0  # when the peer last sent something other than a ping


class SessionMachine(TableMachine):
    """All sessions of one manager, keyed by peer id."""

    NAME = "session"
    TABLE = SESSION_TABLE
    STATE_TIMER = SESSION_STATE_TIMER
    TIMERS = SESSION_TIMERS
    INITIAL = SESSION_INITIAL
    FINAL = SESSION_FINAL
    GUARD_ENUM = SessionGuard
    EFFECT_ENUM = SessionEffect

    def __init__(
        self,
        durations: Mapping[str, float],
        local: HelloInput,
        *,
        gen_base: int,
        on_peer_down: Callable[[str, str, float, list[Effect]], None],
        on_ready: Callable[[str, float, list[Effect]], None],
        max_peers: int = 128,
    ) -> None:
        super().__init__(durations)
        self.max_peers = max_peers
        self.local = local
        self._next_gen = gen_base
        self._on_peer_down = on_peer_down
        self._on_ready = on_ready

    def new_record(self, key: str) -> SessionRecord:
        return SessionRecord(key)

    def new_gen(self) -> int:
        self._next_gen = (self._next_gen + 1) % (1 << 63)
        return self._next_gen

    # -- guards --------------------------------------------------------------------------------
    def guard_hello_compatible(self, rec: SessionRecord, inp: HelloInput) -> bool:
        return self.local.first_mismatch(inp) is None

    def guard_too_many_peers(self, rec: SessionRecord, inp) -> bool:
        return len(self.records) >= self.max_peers

    def guard_same_gen(self, rec: SessionRecord, inp: HelloInput) -> bool:
        return inp.gen == rec.gen

    def guard_peer_shutting_down(self, rec: SessionRecord, inp) -> bool:
        return getattr(inp, "reason", None) == "shutdown"

    def guard_capacity_refusal(self, rec: SessionRecord, inp) -> bool:
        return getattr(inp, "reason", None) == "too_many_peers"

    # -- effects -------------------------------------------------------------------------------
    def effect_open_connection(self, rec: SessionRecord, inp, reason, now, out) -> None:
        rec.gen = self.new_gen()
        rec.dialled = True
        out.append(OpenConnection(rec.key))

    def effect_send_hello(self, rec: SessionRecord, inp, reason, now, out) -> None:
        out.append(SendHello(rec.key, rec.gen))

    def effect_send_hello_ack(self, rec: SessionRecord, inp: HelloInput, reason, now, out) -> None:
        rec.gen = inp.gen
        rec.instance = inp.instance
        rec.principal = inp.principal
        rec.active = now
        out.append(SendHelloAck(rec.key, rec.gen))

    def effect_send_hello_reject(self, rec: SessionRecord, inp: HelloInput, reason, now, out) -> None:
        if reason == "too_many_peers":
            field, ours, theirs = "max_peers", str(self.max_peers), str(len(self.records) + 1)
        else:
            field, ours, theirs = self.local.first_mismatch(inp) or ("", "", "")
            if field == "hash_seed":
                # The seed keys every block hash: a stranger must not learn it by guessing wrong.
                # The refusal names the field; our value stays here.
                ours = ""
        out.append(SendHelloReject(rec.key, inp.gen, reason or "handshake_mismatch", field, ours, theirs))

    def effect_flush_queued(self, rec: SessionRecord, inp, reason, now, out) -> None:
        self._on_ready(rec.key, now, out)

    def effect_reply_unknown_session(self, rec: SessionRecord, inp, reason, now, out) -> None:
        gen = getattr(inp, "gen", 0)
        out.append(SendDisconnect(rec.key, gen, "peer_disconnected"))

    def effect_send_disconnect(self, rec: SessionRecord, inp, reason, now, out) -> None:
        out.append(SendDisconnect(rec.key, rec.gen, reason or "shutdown"))

    def effect_close_connection(self, rec: SessionRecord, inp, reason, now, out) -> None:
        # inbound connections too: the transport shuts them down, so a peer that stopped reading
        # cannot keep zero-copy frames (and the producer's blocks) referenced forever
        out.append(CloseConnection(rec.key))

    def effect_peer_down(self, rec: SessionRecord, inp, reason, now, out) -> None:
        out.append(PeerDown(rec.key, reason or "peer_lost"))
        self._on_peer_down(rec.key, reason or "peer_lost", now, out)
