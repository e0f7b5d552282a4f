"""How the core takes what a peer sends: one handler per wire message (``_rx_<name>``, routed by
the spec's ``WIRE`` table), behind the session gate — a message from a peer with no ready session,
or tagged with another generation, never reaches a producer, consumer, probe or serve record —
and the answer to a message that did not decode (decision C10).  :class:`Receive` is a part of
:class:`~kvtier.lifecycle.TierCore` (decision W12): it drives the machines the core built and owns
the one state of its own, the rate limit of unsolicited error replies.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from kvtier.lifecycle._table import WIRE, ConsumerEvent, ProbeEvent, Reason, ServeEvent, SessionEvent, SessionState
from kvtier.lifecycle.consumer import DIAL_FAILURES, ConsumerMachine, MessageInput
from kvtier.lifecycle.effects import Effect, Ignored, Send
from kvtier.lifecycle.inputs import Malformed, PeerProgress, Received
from kvtier.lifecycle.probe import ProbeMachine, ReplyInput, RoundLoads
from kvtier.lifecycle.producer import ProducerMachine
from kvtier.lifecycle.producer_records import FetchInput
from kvtier.lifecycle.serve import ServeMachine
from kvtier.lifecycle.session import HelloInput, SessionMachine
from kvtier.wire import messages as wm
from kvtier.wire.codec import WireReason

__all__ = ["Receive", "Why", "wire_reason"]

_REASONS = frozenset(r.value for r in Reason)


class Why(msgspec.Struct, frozen=True, gc=False):
    """The reason an input carries into a machine (a session's end, a peer's goodbye)."""

    reason: Reason | None


def wire_reason(text: str) -> Reason:
    """A reason code from the wire: one of ours, else ``peer_error`` (a same-version peer names
    only codes of the shared vocabulary; anything else is its fault, not a new meaning)."""
    return Reason(text) if text in _REASONS else Reason.PEER_ERROR


#: What no producer can truthfully end a fetch with: a success's label, or what only this side
#: knows — its engine, its own deadlines and checks, its dial (decision I38).  From a producer
#: such a code is its fault: ``peer_error``, not a story about us.
_NOT_A_PRODUCERS = DIAL_FAILURES | {  # a dial's and handshake's own ends: a session that is up never sends these
    Reason.LOCAL, Reason.NOT_NEEDED, Reason.LOAD_TIMEOUT, Reason.CANCELLED, Reason.DUPLICATE_LOAD,
    Reason.ONE_FETCH_PER_ID, Reason.INCOMPLETE_DATA, Reason.CORRUPT, Reason.ABORT_UNACKNOWLEDGED,
    Reason.INSTANCE_DOWN, Reason.PEER_NOT_ALLOWED, Reason.INVALID_PARAMS, Reason.NOT_A_CONSUMER, Reason.BAD_JOB,
    Reason.JOB_REFUSED, Reason.NOT_ANNOUNCED, Reason.NOT_ANNOUNCED_PROBE, Reason.PROBE_TIMEOUT,
    Reason.NO_RECORD, Reason.STALE, Reason.NOT_BOUND, Reason.LATE_DATA, Reason.IN_GRACE, Reason.REFERENCED,
}


def done_reason(text: str) -> Reason:
    """The reason of a producer's failed ``transfer_done``: :func:`wire_reason`, and ``peer_error``
    for a code no producer can truthfully answer with (:data:`_NOT_A_PRODUCERS`)."""
    r = wire_reason(text)
    return Reason.PEER_ERROR if r in _NOT_A_PRODUCERS else r


class Receive:
    """Peer messages into the core's machines (a part of :class:`~kvtier.lifecycle.TierCore`).

    Args:
        machines: the core's session, producer, consumer, probe, rounds' loads and serve machines.
        settle: the core's routing of the notes a transition queued (called where a handler
            must see a transition's consequences before it goes on).
        error_reply_interval_s: an unsolicited ``error`` goes to a (peer, reason) at most once
            per this many seconds.
    """

    def __init__(self, sessions: SessionMachine, producer: ProducerMachine, consumer: ConsumerMachine,
                 probe: ProbeMachine, rounds: RoundLoads, serve: ServeMachine,
                 settle: Callable[[float, list[Effect]], None], error_reply_interval_s: float) -> None:
        self._sessions, self._producer, self._consumer = sessions, producer, consumer
        self._probe, self._rounds, self._serve = probe, rounds, serve
        self._settle = settle
        self._error_interval = error_reply_interval_s
        self.error_replies: dict[tuple[str, str], float] = {}
        """(peer, reason) -> when an unsolicited ``error`` last went to it (seconds)."""
        # wire message -> its handler, from the spec's routing table (the only place that says so)
        self._table = {getattr(wm, w.struct): getattr(self, f"_rx_{w.receive}") for w in WIRE.values()}

    def malformed(self, inp: Malformed, now: float, out: list[Effect]) -> None:
        """Answer a message that did not decode: a hello of another protocol version gets a
        handshake refusal naming the version; one that names a ``kv_request_id`` gets an
        ``error`` so its sender can fail that request at once — and, when it is about a load of
        ours from that peer, fails that load too; anything else an ``error`` at most once per
        (peer, reason) per ``error_reply_interval_s``."""
        peer = inp.peer
        if inp.reason == WireReason.VERSION_MISMATCH and inp.msg_type == "hello" and inp.gen is not None:
            out.append(Send(peer, wm.HelloReject(gen=inp.gen, reason=Reason.HANDSHAKE_MISMATCH.value, field="version",
                                                 ours=str(wm.PROTOCOL_VERSION), theirs=inp.theirs or "?"), ends_session=False))
            return
        if not inp.kv_request_id:
            key = (peer, inp.reason)
            last = self.error_replies.get(key)
            if last is not None and now - last < self._error_interval:
                return
            if len(self.error_replies) >= 4096:  # bounded: peer ids come from connections
                self.error_replies.clear()
            self.error_replies[key] = now
        out.append(Send(peer, wm.Error(gen=self._sessions.gen(peer), reason=str(inp.reason), detail=inp.detail[:4096],
                                       kv_request_id=inp.kv_request_id), ends_session=False))
        # a message about a load of ours from the peer it loads from, on that session, that did not
        # decode: the load cannot complete as sent, so it fails now instead of at load_timeout_s
        # (decision I36): a block_data's blocks as corrupt, anything else as the peer's error
        rec = self._sessions.records.get(peer)
        if (rec is not None and rec.state is SessionState.READY and inp.gen == rec.gen
                and self._loads_from(peer, inp.kv_request_id)):
            reason = Reason.CORRUPT if inp.msg_type == "block_data" else Reason.PEER_ERROR
            self._fail_loads(peer, inp.kv_request_id, reason, now, out)

    # =========================================================================================
    # Peer messages
    # =========================================================================================
    def received(self, inp: Received, now: float, out: list[Effect]) -> None:
        """Apply one decoded peer message at ``now`` (seconds); never raises for what it says."""
        self._table[type(inp.msg)](inp, now, out)

    def to_consumer(self, peer: str, event: ConsumerEvent, probe_event: ProbeEvent | None, m: MessageInput,
                    now: float, out: list[Effect]) -> None:
        """A message (or a landing) for a load of ours: the symmetric round's load named by (id,
        round) if there is one; else the id's probe (``probe_event``; None: nothing of a probe,
        stale); else the PD consumer of the id."""
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

    def progress(self, inp: PeerProgress, now: float, out: list[Effect]) -> None:
        """Part of a message from ``inp.peer`` arrived: on a ready session, the peer was heard
        (the session's ``message`` event, decision T22); nothing else changes."""
        rec = self._sessions.records.get(inp.peer)
        if rec is not None and rec.state is SessionState.READY:
            self._sessions.apply(rec, SessionEvent.MESSAGE, None, now, out)

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
            self.to_consumer(inp.peer, ConsumerEvent.BLOCK_DATA, None, m, now, out)

    def _rx_transfer_done(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.MESSAGE, now, out):
            reason = None if msg.ok else done_reason(msg.reason or Reason.TRANSFER_FAILED.value)
            m = MessageInput(msg.kv_request_id, msg.round, ok=msg.ok, reason=reason, life=msg.life, final=msg.final)
            self.to_consumer(inp.peer, ConsumerEvent.TRANSFER_DONE, ProbeEvent.TRANSFER_DONE, m, now, out)

    def _rx_abort_ack(self, inp: Received, now: float, out: list[Effect]) -> None:
        msg = inp.msg
        if self._gate(inp.peer, msg, SessionEvent.MESSAGE, now, out):
            # a probe's release needs no answer: an abort_ack for it concerns no record
            self.to_consumer(inp.peer, ConsumerEvent.ABORT_ACK, None, MessageInput(msg.kv_request_id, msg.round,
                                                                                   life=msg.life),
                              now, out)

    def _rx_error(self, inp: Received, now: float, out: list[Effect]) -> None:
        """The peer answered ``error`` (it could not accept our message).  One that names one of
        our live loads fails that load now with ``peer_error`` instead of at its deadline (a
        symmetric request's: its probe's open round and its rounds' loads); anything else about the
        id is unaffected."""
        msg, peer = inp.msg, inp.peer
        if self._loads_from(peer, msg.kv_request_id) and self._gate(peer, msg, SessionEvent.MESSAGE, now, out):
            self._fail_loads(peer, msg.kv_request_id, Reason.PEER_ERROR, now, out)

    def _loads_from(self, peer: str, kid: str) -> bool:
        """Whether ``kid`` is a load (a probe, or a PD consumer's) of ours from ``peer``."""
        if not kid:
            return False
        probe, rec = self._probe.records.get(kid), self._consumer.records.get(kid)
        return (probe is not None and probe.peer == peer) or (rec is not None and rec.peer == peer)

    def _fail_loads(self, peer: str, kid: str, reason: Reason, now: float, out: list[Effect]) -> None:
        """Fail our load of ``kid`` from ``peer`` now, with ``reason``: a symmetric request's probe
        (its open round) and its rounds' loads, or the PD consumer's load."""
        probe = self._probe.records.get(kid)
        if probe is not None and probe.peer == peer:
            for r in self._rounds.of_request(kid):
                m = MessageInput(kid, r.round, ok=False, reason=reason)
                self._rounds.message(peer, ConsumerEvent.TRANSFER_DONE, m, now, out)
            if probe.round >= 0:
                reply = ReplyInput(kid, probe.round, ok=False, reason=reason)
                self._probe.message(peer, ProbeEvent.TRANSFER_DONE, reply, now, out)
            return
        rec = self._consumer.records.get(kid)
        if rec is not None and rec.peer == peer:
            self._consumer.message(peer, ConsumerEvent.TRANSFER_DONE,
                                   MessageInput(kid, rec.round, ok=False, reason=reason), now, out)

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
        self._sessions.apply(rec, SessionEvent.HELLO_REJECT, Why(wire_reason(msg.reason)), now, out)

    def _rx_disconnect(self, inp: Received, now: float, out: list[Effect]) -> None:
        """The peer said goodbye (``shutdown`` makes our loads fail with ``shutdown``), or
        answered that it does not know our session (gen 0 is accepted: it may not know ours)."""
        msg, peer = inp.msg, inp.peer
        rec = self._sessions.records.get(peer)
        if rec is None or (rec.gen != msg.gen and msg.gen != 0):
            out.append(Ignored("session", peer, rec.state if rec else SessionState.ABSENT, SessionEvent.DISCONNECT,
                               Reason.STALE))
            return
        why = wire_reason(msg.reason) if msg.reason else None
        self._sessions.apply(rec, SessionEvent.DISCONNECT, Why(why), now, out)

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
                sessions.apply(r, SessionEvent.GIVE_UP, Why(Reason.PEER_RESTARTED), now, out)
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
            sessions.apply(victim, SessionEvent.GIVE_UP, Why(Reason.IDLE_EVICTED), now, out)
            self._settle(now, out)
