"""Session machine: one generation of the control session with one peer.

Theory of operation: a consumer *dials* a producer (``connecting`` → ``handshaking``: our hello
carries protocol version, block size, layout fingerprint, hash seed, data plane, digest and a
generation number); the producer answers ``hello_ack`` or ``hello_reject`` naming the mismatching
field and both values.  A producer learns of a consumer from its hello.  Once the fields match,
the data plane is given the peer's descriptor (``attaching``); only when the plane took it is the
session ``ready`` — so accepting a handshake is the core's decision, reported to the plane as an
effect (``AttachPeer(accepted=...)``), never something the shell infers.

While ``ready``, every message notes when the peer was last heard; the ``heartbeat`` timer fires
every ``heartbeat_interval_s``: the dialled side pings, and either side ends a session silent for
``peer_timeout_s`` (so a silent peer is declared lost within ``peer_timeout_s +
heartbeat_interval_s``).  A disconnect, a closed connection, a send failure or a restart also end
the session (``dead``), and every record bound to the peer is told ``peer_lost``.  A reconnect is
a new record with a new generation; messages tagged with another generation are dropped.

Sessions to one producer *instance* share fate, but only on **proof** that the instance is gone
(decision I23): a dial its address refused (nothing listens there), or a hello_ack at its address
naming another instance (it restarted).  An instance is known by the name its hello_ack gave and
the host it was dialled at (:func:`fate`: a name is only a claim).  Then the instance is *gone*,
and new loads to any session of it fail fast (``instance_down``) until one of them is heard from
again (decision I7).  A disconnect, a reset connection, silence, a failed send or our own give-up
proves nothing — the producer may be alive and answer the next dial — so none of them condemns the
instance.  A fresh dial does not inherit the fate either: its load waits for the dial, which a dead
address refuses in a millisecond and a restarted producer answers (decision I30).  The instance an
address last answered for is remembered (bounded): a refused dial condemns it, a hello_ack naming
another proves it restarted.

What crosses machines is not called but queued: ``peer_down`` queues :class:`PeerLost` and
``flush_queued`` queues :class:`SessionReady` on the core's note queue, which the core routes
after this transition finished.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from kvtier.config import DEFAULTS
from kvtier.lifecycle._machine import Due, Record, TableMachine
from kvtier.lifecycle._table import (
    SESSION_FINAL,
    SESSION_INITIAL,
    SESSION_STATE_TIMER,
    SESSION_TABLE,
    SESSION_TIMERS,
    Reason,
    SessionEffect,
    SessionGuard,
    SessionState,
)
from kvtier.lifecycle.effects import AttachPeer, CloseConnection, DetachPeer, Effect, OpenConnection, Send, SessionEnded
from kvtier.lifecycle.inputs import SELF, STILL_HELD, AttachRefused, ConnectionClosed
from kvtier.lifecycle.notes import Notes, PeerLost, SessionReady
from kvtier.wire import messages as wm

#: the reasons a peer's goodbye may give that the session then ends with (spec peer_gave_reason)
GIVEN_REASONS = frozenset(
    {Reason.TRANSFER_STALLED, Reason.ABORT_UNACKNOWLEDGED, Reason.PEER_TIMEOUT, Reason.IDLE_EVICTED,
     Reason.PEER_RESTARTED, Reason.PLANE_FAULT}
)
#: session endings that prove the peer's instance gone: its address refused our dial, so nothing
#: listens there any more (decision I23).  A disconnect, a reset, silence, a failed send, a dial
#: that timed out or our own give-up proves nothing: a live producer may answer the next dial.
#: (The other proof, a restart, is a hello_ack naming a new instance: ``note_instance``.)
GONE = frozenset({Reason.CONNECT_REFUSED})


class HelloInput(msgspec.Struct, frozen=True):
    """What a hello announces. Ours is built from the config, the block pool and the data
    plane; the peer's arrives on the wire.  ``gen`` is the dialling side's session generation;
    ``instance`` names the peer's manager instance (sessions to one instance share fate) and is
    not compared, nor is ``descriptor`` (the data plane's, checked by the plane)."""

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
    descriptor: bytes = b""
    replaces: int = 0
    """The generation of the peer's previous session to us, which this one replaces (0: none)."""

    def first_mismatch(self, other: HelloInput) -> tuple[str, str, str] | None:
        """(field, ours, theirs) of the first differing field, in handshake check order."""
        for name in ("version", "block_bytes", "layout", "hash_seed", "data_plane", "digest"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                return name, str(a), str(b)
        return None


class RoundLedger:
    """What a producer knows of one session's rounds (decision I11): the consumer's low
    watermark (the lowest round it still has open, the highest such value any of its fetches or
    aborts named) and the rounds at or above it that already got a terminal answer.  A fetch of a
    round below the watermark or already answered is a duplicate or was overtaken: it must never
    bind (on a one-sided plane it would WRITE into slots the consumer already reused)."""

    __slots__ = ("low", "answered")

    #: answered rounds remembered above the watermark at most (oldest forgotten first)
    CAP = 65536

    def __init__(self) -> None:
        self.low = 0
        self.answered: set[int] = set()

    def note_low(self, low: int) -> None:
        if low > self.low:
            self.low = low
            if self.answered:
                self.answered = {r for r in self.answered if r >= low}

    def stale(self, round: int) -> bool:
        return round < self.low or round in self.answered

    def answer(self, round: int) -> None:
        if round >= self.low:
            self.answered.add(round)
            if len(self.answered) > self.CAP:
                self.answered.discard(min(self.answered))


class SessionRecord(Record):
    __slots__ = ("gen", "dialled", "instance", "principal", "heard", "active", "rounds")

    def __init__(self, key: str) -> None:
        super().__init__(key, SESSION_INITIAL)
        self.gen = 0
        self.dialled = False
        self.instance = ""
        self.principal: str | None = None
        self.heard = 0.0  # when the peer was last heard (any message)
        self.active = 0.0  # when the peer last did work (anything but pings)
        self.rounds = RoundLedger()  # inbound sessions: the consumer's rounds (decision I11)


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
    DUE_INPUT = True  # the heartbeat asks when it fell due (guard ``silent``)

    #: instances remembered as suspect at most (oldest forgotten first): bounded bookkeeping
    MAX_SUSPECT = 4096
    #: addresses whose last instance and last session generation are remembered at most
    MAX_REMEMBERED = 4096

    def __init__(
        self, durations: Mapping[str, float], local: HelloInput, notes: Notes, *, gen_base: int,
        max_peers: int = DEFAULTS["max_peers"], goodbye_linger_s: float = DEFAULTS["shutdown_grace_s"],
    ) -> None:
        """``durations``: seconds per config key (the session's timers and ``peer_timeout_s``);
        ``local``: our hello (``instance`` and ``descriptor`` included); ``notes``: the core's
        queue for what this machine tells the others."""
        super().__init__(durations)
        self.peer_timeout_s = float(durations["peer_timeout_s"])
        #: how long a goodbye that names why may take to leave before its connection is cut
        #: (config ``shutdown_grace_s``, the bound a goodbye has at shutdown too: decision A2)
        self.goodbye_linger_s = float(goodbye_linger_s)
        self.max_peers = max_peers
        self.local = local
        self._notes = notes
        self._next_gen = gen_base
        # insertion-ordered sets of instances proven gone (decision I23); ``suspect`` maps each to
        # the address whose refusal proved it ("" for a restart proof, or an instance a test marks
        # suspect by hand: a ready session to one answers instance_down)
        self.suspect: dict[str, str | None] = {}
        self.gone: dict[str, None] = {}
        # instance -> addresses whose refusal it outlived (a sibling was heard after it): another
        # refusal there proves nothing new about the instance (decision I37)
        self.survived: dict[str, frozenset[str]] = {}
        # dialled address -> the instance its last hello_ack named (a refused dial condemns it)
        self.last_instance: dict[str, str] = {}
        # dialled address -> the generation of our last session to it (the next hello replaces it)
        self.last_gen: dict[str, int] = {}

    def new_record(self, key: str) -> SessionRecord:
        return SessionRecord(key)

    def new_gen(self) -> int:
        self._next_gen = (self._next_gen + 1) % (1 << 63)
        return self._next_gen

    # -- reads (the consumer machine and the core ask) -------------------------------------
    def ready(self, peer: str) -> bool:
        rec = self.records.get(peer)
        return rec is not None and rec.state is SessionState.READY

    def heard_since(self, peer: str, t: float) -> bool:
        """The ready session to ``peer`` heard from it (any message, a pong included) at ``t`` or later."""
        rec = self.records.get(peer)
        return rec is not None and rec.state is SessionState.READY and rec.heard >= t

    def active_since(self, peer: str, t: float) -> bool:
        """The ready session to ``peer`` got work from it (a message other than a ping or pong, or
        part of one) at ``t`` or later."""
        rec = self.records.get(peer)
        return rec is not None and rec.state is SessionState.READY and rec.active >= t

    def gen(self, peer: str) -> int:
        """The generation our messages to ``peer`` carry (0 when there is no session)."""
        rec = self.records.get(peer)
        return rec.gen if rec is not None else 0

    def instance_down(self, peer: str) -> bool:
        """The ready session to ``peer`` belongs to an instance proven gone and not heard from
        since (decisions I7, I23).  A dial is never down before its outcome, even to an address
        whose last instance is gone: it is refused in a millisecond, or answered by whatever
        listens there now — a restarted producer (decision I30)."""
        if not self.suspect:  # nearly always: every load asks
            return False
        rec = self.records.get(peer)
        return (rec is not None and rec.state is SessionState.READY and bool(rec.instance)
                and fate(rec.key, rec.instance) in self.suspect)

    # -- guards --------------------------------------------------------------------------------
    def guard_hello_compatible(self, rec: SessionRecord, inp: HelloInput, now: float) -> bool:
        return self.local.first_mismatch(inp) is None

    def guard_too_many_peers(self, rec: SessionRecord, inp, now: float) -> bool:
        return len(self.records) >= self.max_peers

    def guard_same_gen(self, rec: SessionRecord, inp: HelloInput, now: float) -> bool:
        return inp.gen == rec.gen

    def guard_peer_shutting_down(self, rec: SessionRecord, inp, now: float) -> bool:
        return getattr(inp, "reason", None) is Reason.SHUTDOWN

    def guard_peer_gave_reason(self, rec: SessionRecord, inp, now: float) -> bool:
        return getattr(inp, "reason", None) in GIVEN_REASONS

    def guard_capacity_refusal(self, rec: SessionRecord, inp, now: float) -> bool:
        return getattr(inp, "reason", None) is Reason.TOO_MANY_PEERS

    def guard_is_self(self, rec: SessionRecord, inp, now: float) -> bool:
        return getattr(inp, "reason", None) is Reason.SELF_FETCH or getattr(inp, "detail", "") == SELF

    def guard_still_held(self, rec: SessionRecord, inp, now: float) -> bool:
        return getattr(inp, "reason", None) is Reason.SESSION_STILL_HELD or getattr(inp, "detail", "") == STILL_HELD

    def guard_dialled(self, rec: SessionRecord, inp, now: float) -> bool:
        return rec.dialled

    def guard_silent(self, rec: SessionRecord, inp, now: float) -> bool:
        # judged at the time the heartbeat fell due: one that fires late because this side stalled
        # (a long pass, a stopped process) must not count the silence our stall made — answers
        # still unread, or pings never sent (bug scenario B24, decision I35)
        at = inp.when if type(inp) is Due else now
        return at - rec.heard >= self.peer_timeout_s

    def guard_connect_timed_out(self, rec: SessionRecord, inp, now: float) -> bool:
        return bool(getattr(inp, "timed_out", False))

    def guard_connect_not_allowed(self, rec: SessionRecord, inp, now: float) -> bool:
        return bool(getattr(inp, "not_allowed", False))

    def guard_connect_unresolved(self, rec: SessionRecord, inp, now: float) -> bool:
        return bool(getattr(inp, "unresolved", False))

    def guard_connect_auth_failed(self, rec: SessionRecord, inp, now: float) -> bool:
        return bool(getattr(inp, "auth_failed", False))

    # -- effects -------------------------------------------------------------------------------
    def effect_open_connection(self, rec: SessionRecord, inp, reason, now, out) -> None:
        rec.gen = self.new_gen()
        rec.dialled = True
        rec.instance = self.last_instance.get(rec.key, "")
        out.append(OpenConnection(rec.key, rec.gen))

    def effect_send_hello(self, rec: SessionRecord, inp, reason, now, out) -> None:
        h = self.local
        # a plane with per-session descriptors (NIXL windows) gave this session's with the connection
        descriptor = getattr(inp, "descriptor", b"") or h.descriptor
        out.append(Send(rec.key, wm.Hello(
            gen=rec.gen, version=h.version, instance=h.instance, block_bytes=h.block_bytes, layout=h.layout,
            hash_seed=h.hash_seed, data_plane=h.data_plane, digest=h.digest, descriptor=descriptor,
            replaces=self.last_gen.get(rec.key, 0))))

    def effect_note_peer(self, rec: SessionRecord, inp: HelloInput, reason, now, out) -> None:
        rec.gen = inp.gen
        rec.instance = inp.instance
        rec.principal = inp.principal

    def effect_note_instance(self, rec: SessionRecord, inp, reason, now, out) -> None:
        before = self.last_instance.get(rec.key, "")
        if before and inp.instance and before != inp.instance:
            # the address answers for another instance now: the one it answered for restarted,
            # and every session still believed to reach it is proven stale (decision I23)
            self._condemn(fate(rec.key, before), now, out)
        rec.instance = inp.instance
        self._heard(fate(rec.key, inp.instance), rec.key)
        _remember(self.last_instance, rec.key, inp.instance, self.MAX_REMEMBERED)

    def _heard(self, instance: str, address: str) -> None:
        """``instance`` (a :func:`fate` key) was heard from at ``address``: it is not gone.  Heard
        from another address than the one whose refusal condemned it, it outlived that rank."""
        refused = self.suspect.pop(instance, None)
        self.gone.pop(instance, None)
        before = self.survived.get(instance, frozenset())
        outlived = before - {address}  # a rank that answers again: its next refusal is news
        if refused and refused != address:
            outlived |= {refused}
        if outlived:
            if outlived != before:
                _remember(self.survived, instance, outlived, self.MAX_SUSPECT)
        elif before:
            del self.survived[instance]

    def _condemn(self, instance: str, now: float, out: list[Effect], refused: str = "") -> None:
        """``instance`` (a :func:`fate` key) is proven gone (``refused``: by that address refusing
        our dial): new loads to it fail ``instance_down`` until it is heard — unless it already
        outlived that address's refusal (decision I37).  Its ready sessions are pinged at once: a
        live rank's pong lifts it within a round trip, not at its next heartbeat."""
        if refused and refused in self.survived.get(instance, ()):
            return
        for r in self.records.values():
            if r.state is SessionState.READY and r.dialled and r.instance and fate(r.key, r.instance) == instance:
                out.append(Send(r.key, wm.Ping(gen=r.gen, t=now), ends_session=False))
        self.suspect[instance] = refused
        if len(self.suspect) > self.MAX_SUSPECT:
            del self.suspect[next(iter(self.suspect))]
        _remember(self.gone, instance, None, self.MAX_SUSPECT)

    def effect_attach_peer(self, rec: SessionRecord, inp, reason, now, out) -> None:
        out.append(AttachPeer(rec.key, rec.gen, inp.descriptor, rec.dialled))

    def effect_send_hello_ack(self, rec: SessionRecord, inp, reason, now, out) -> None:
        out.append(Send(rec.key, wm.HelloAck(gen=rec.gen, instance=self.local.instance, descriptor=self.local.descriptor)))

    def effect_send_hello_reject(self, rec: SessionRecord, inp, reason, now, out) -> None:
        if isinstance(inp, AttachRefused):  # ours names a refusal for now or of ourselves, never the detail
            gen, field, ours, theirs = inp.gen, "descriptor", inp.detail if inp.detail in (STILL_HELD, SELF) else "", ""
        elif reason is Reason.TOO_MANY_PEERS:
            gen, field, ours, theirs = inp.gen, "max_peers", str(self.max_peers), str(len(self.records) + 1)
        else:
            gen = inp.gen
            field, ours, theirs = self.local.first_mismatch(inp) or ("", "", "")
            if field == "hash_seed":
                # The hash seed keys every block hash: a stranger must not learn it by guessing wrong,
                # and no log may show it (docs/compatibility.md): the refusal names the field only.
                ours = theirs = ""
        why = (reason or Reason.HANDSHAKE_MISMATCH).value
        out.append(Send(rec.key, wm.HelloReject(gen=gen, reason=why, field=field, ours=ours, theirs=theirs),
                        ends_session=False))

    def effect_flush_queued(self, rec: SessionRecord, inp, reason, now, out) -> None:
        self._notes.append(SessionReady(rec.key))

    def effect_reply_unknown_session(self, rec: SessionRecord, inp, reason, now, out) -> None:
        out.append(Send(rec.key, wm.Disconnect(gen=getattr(inp, "gen", 0), reason=Reason.PEER_DISCONNECTED.value),
                        ends_session=False))

    def effect_note_heard(self, rec: SessionRecord, inp, reason, now, out) -> None:
        rec.heard = now
        if self.suspect and rec.instance:
            self._heard(fate(rec.key, rec.instance), rec.key)

    def effect_note_active(self, rec: SessionRecord, inp, reason, now, out) -> None:
        rec.active = now

    def effect_send_ping(self, rec: SessionRecord, inp, reason, now, out) -> None:
        out.append(Send(rec.key, wm.Ping(gen=rec.gen, t=now), ends_session=False))

    def effect_send_pong(self, rec: SessionRecord, inp: wm.Ping, reason, now, out) -> None:
        out.append(Send(rec.key, wm.Pong(gen=inp.gen, t=inp.t), ends_session=False))

    def effect_send_disconnect(self, rec: SessionRecord, inp, reason, now, out) -> None:
        out.append(Send(rec.key, wm.Disconnect(gen=rec.gen, reason=(reason or Reason.SHUTDOWN).value), ends_session=False))

    def effect_close_after_goodbye(self, rec: SessionRecord, inp, reason, now, out) -> None:
        # the goodbye names why (transfer_stalled, abort_unacknowledged, plane_fault...): a peer
        # that is slow, not gone, still reads it — after the data queued before it (decision I28)
        out.append(CloseConnection(rec.key, self.goodbye_linger_s))

    def effect_close_connection(self, rec: SessionRecord, inp, reason, now, out) -> None:
        # inbound connections too: the transport shuts them down, so a peer that stopped reading
        # cannot keep zero-copy frames (and the producer's blocks) referenced forever
        out.append(CloseConnection(rec.key))

    def effect_peer_down(self, rec: SessionRecord, inp, reason, now, out) -> None:
        why = reason or Reason.PEER_LOST
        if rec.instance and why in GONE:
            self._condemn(fate(rec.key, rec.instance), now, out, rec.key)
        if rec.dialled:
            _remember(self.last_gen, rec.key, rec.gen, self.MAX_REMEMBERED)
        out.append(SessionEnded(rec.key, why, rec.dialled, rec.instance, type(inp) is ConnectionClosed))
        out.append(DetachPeer(rec.key))
        self._notes.append(PeerLost(rec.key, why))


def fate(address: str, instance: str) -> str:
    """The key sessions share fate by: the instance a hello_ack named *and* the host it was
    dialled at (``instance@host``).  A sibling rank of one producer process answers on the same
    host; an instance name is only a claim, so a peer elsewhere claiming it (or a name reused by
    another deployment) can neither condemn nor be condemned with it (decision I33)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return f"{instance}@{host}"


def _remember(table: dict, key: str, value: object, cap: int) -> None:
    """``table[key] = value`` as the newest entry; the oldest is forgotten beyond ``cap``."""
    table.pop(key, None)
    table[key] = value
    if len(table) > cap:
        del table[next(iter(table))]
