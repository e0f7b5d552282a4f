"""A fake network between in-memory :class:`~kvtier.lifecycle.TierCore` instances.

The lifecycle core returns effects and never performs I/O.  :class:`FakeNetwork` is the smallest
"shell" that lets several cores talk: it turns their ``Send*`` effects into :class:`Envelope`
messages held in **per-direction in-flight queues** and, when a test says so, delivers one of them
into the receiving core by calling the matching core method.  Nothing is delivered on its own:

* :meth:`FakeNetwork.deliver` pops index ``i % len(queue)``, so any order can be produced and a
  shrinking test (Hypothesis) reduces ``i`` to 0, i.e. to FIFO;
* :meth:`FakeNetwork.drop` loses a message, :meth:`FakeNetwork.duplicate` queues a copy of one;
* delay is simply not delivering yet.

It also plays the data plane and the consumer's shell: a ``SendBlocks`` effect queues one
``block_data`` message and records a :class:`Transfer` that the test finishes with
:meth:`FakeNetwork.finish_transfer` (``transfer_released`` or ``transfer_failed``); a
``LandBlocks`` effect is answered at once with ``blocks_landed`` (ok, unless the test marked the
round corrupt in :attr:`FakeNetwork.corrupt`); a ``RevokeAccess`` is answered at once with
``access_revoked`` unless ``revoke_later`` is set (then :meth:`FakeNetwork.finish_revoke` does it).

Endpoints are named; the name of an endpoint is the ``peer`` string the other cores use for it
(a consumer announces a request with ``peer=<producer name>``; the producer sees the consumer by
its name).  Every message carries the sender's session generation for the receiver, as the wire
protocol does, so messages of a dead session are dropped by the receiver's generation gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from kvtier.lifecycle.consumer import MessageInput
from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.effects import (
    CancelTransfer,
    Effect,
    LandBlocks,
    OpenConnection,
    RevokeAccess,
    SendAbortAck,
    SendAbortFetch,
    SendBlocks,
    SendDisconnect,
    SendFetch,
    SendHello,
    SendHelloAck,
    SendHelloReject,
    SendReceipt,
    SendTransferDone,
)
from kvtier.lifecycle.producer import FetchInput

__all__ = ["Envelope", "FakeNetwork", "Transfer", "to_envelope"]

_NETWORK_EFFECTS = (
    SendFetch,
    SendReceipt,
    LandBlocks,
    RevokeAccess,
    SendTransferDone,
    SendAbortAck,
    SendAbortFetch,
    SendBlocks,
    CancelTransfer,
    OpenConnection,
    SendHello,
    SendHelloAck,
    SendHelloReject,
    SendDisconnect,
)


@attrs.frozen(slots=True)
class Envelope:
    """One control or data message in flight from ``src`` to ``dst``."""

    src: str
    dst: str
    kind: str
    """fetch | abort_fetch | receipt | block_data | transfer_done | abort_ack | hello | hello_ack |
    hello_reject | disconnect | ping"""
    gen: int
    """The sender's session generation for this peer (the wire header's ``gen``)."""
    kv_request_id: str = ""
    round: int = 0
    keys: tuple[bytes, ...] = ()
    first: int = 0
    count: int = 0
    blocks: tuple[int, ...] = ()
    """block_data: the producer pool blocks the payload frames were taken from."""
    ok: bool = True
    reason: str | None = None
    hello: Any = None
    """hello: the sender's :class:`~kvtier.lifecycle.HelloInput` (with ``gen``)."""
    fetched: bool = True
    """abort_fetch: whether the aborted round sent a fetch."""
    instance: str = ""
    """hello_ack: the sender's instance name (its core's local hello ``instance``, else its name)."""

    def __str__(self) -> str:
        bits = [f"{self.kind}"]
        if self.kv_request_id:
            bits.append(f"{self.kv_request_id} r{self.round}")
        if self.kind == "fetch":
            bits.append(f"keys={len(self.keys)}")
        if self.kind == "block_data":
            bits.append(f"[{self.first}:{self.first + self.count}]")
        if self.kind == "transfer_done":
            bits.append("ok" if self.ok else f"fail {self.reason}")
        if self.kind == "disconnect":
            bits.append(str(self.reason))
        return f"{self.src}->{self.dst} {' '.join(bits)} g{self.gen}"


@attrs.define(slots=True)
class Transfer:
    """A ``SendBlocks`` the data plane is working on (until :meth:`FakeNetwork.finish_transfer`)."""

    src: str
    dst: str
    kv_request_id: str
    round: int
    blocks: tuple[int, ...]
    cancelled: bool = False


def to_envelope(src: str, core: TierCore | None, eff: Effect) -> Envelope | None:
    """The message a ``Send*`` effect of ``src``'s core puts on the wire (None: nothing to send,
    e.g. a ``SendBlocks`` of zero blocks, or an effect that is not a message).  ``gen`` is the
    sender's current session generation for the peer, as the wire header carries it."""
    peer = getattr(eff, "peer", "")
    gen = getattr(eff, "gen", 0)  # the generation the core captured when it made the effect
    if isinstance(eff, SendFetch):
        return Envelope(src, peer, "fetch", gen, eff.kv_request_id, eff.round, keys=eff.keys)
    if isinstance(eff, SendAbortFetch):
        return Envelope(src, peer, "abort_fetch", gen, eff.kv_request_id, eff.round, fetched=eff.fetched)
    if isinstance(eff, SendReceipt):
        return Envelope(src, peer, "receipt", gen, eff.kv_request_id, eff.round)
    if isinstance(eff, SendTransferDone):
        return Envelope(src, peer, "transfer_done", gen, eff.kv_request_id, eff.round, ok=eff.ok, reason=eff.reason)
    if isinstance(eff, SendAbortAck):
        return Envelope(src, peer, "abort_ack", gen, eff.kv_request_id, eff.round)
    if isinstance(eff, SendBlocks):
        if not eff.blocks:
            return None
        return Envelope(
            src, peer, "block_data", gen, eff.kv_request_id, eff.round, first=0, count=len(eff.blocks),
            blocks=eff.blocks,
        )
    if isinstance(eff, SendHello):
        local = core.sessions.local if core is not None else None
        hello = attrs.evolve(local, gen=eff.gen) if local is not None else None
        return Envelope(src, peer, "hello", eff.gen, hello=hello)
    if isinstance(eff, SendHelloAck):
        instance = (core.sessions.local.instance if core is not None else "") or src
        return Envelope(src, peer, "hello_ack", eff.gen, instance=instance)
    if isinstance(eff, SendHelloReject):
        return Envelope(src, peer, "hello_reject", eff.gen, reason=eff.reason)
    if isinstance(eff, SendDisconnect):
        return Envelope(src, peer, "disconnect", eff.gen, reason=eff.reason)
    return None


class FakeNetwork:
    """Named :class:`TierCore` endpoints joined by lossy, reorderable in-flight queues.

    Args:
        auto_transport_up: answer an ``OpenConnection`` effect at once with ``transport_up``
            (the connection "comes up" instantly); with False the test calls
            ``core.transport_up`` itself and passes the effects to :meth:`route`.

    Attributes:
        queues: ``(src, dst) -> list[Envelope]``, oldest first.
        transfers: data-plane transfers in progress, oldest first.
        corrupt: ``(kv_request_id, round)`` pairs whose blocks land with a digest mismatch.
        revoke_later: when True, ``RevokeAccess`` waits in :attr:`revokes` for
            :meth:`finish_revoke` (a one-sided plane); else it is confirmed at once (zmq).
        log: one line per delivered, dropped or duplicated message (for failure reports).
        undeliverable: messages addressed to a name with no attached core (counted, dropped).
    """

    def __init__(self, *, auto_transport_up: bool = True) -> None:
        self.cores: dict[str, TierCore] = {}
        self.queues: dict[tuple[str, str], list[Envelope]] = {}
        self.transfers: list[Transfer] = []
        self.corrupt: set[tuple[str, int]] = set()
        self.revoke_later = False
        self.revokes: list[tuple[str, RevokeAccess]] = []
        self._answers: list[Effect] = []  # effects of the shell's synchronous answers
        self.auto_transport_up = auto_transport_up
        self.log: list[str] = []
        self.undeliverable = 0

    # -- endpoints ---------------------------------------------------------------------------
    def attach(self, name: str, core: TierCore) -> None:
        """Attach (or replace, e.g. after a restart) the core reachable as ``name``."""
        self.cores[name] = core

    def kill(self, name: str) -> list[Envelope]:
        """``name`` crashed: its core is detached, every message to or from it and every transfer
        it was sending is lost. Returns the lost messages."""
        self.cores.pop(name, None)
        lost: list[Envelope] = []
        for (src, dst), q in self.queues.items():
            if name in (src, dst):
                lost.extend(q)
                q.clear()
        self.transfers = [t for t in self.transfers if t.src != name]
        self.log.append(f"kill {name} ({len(lost)} messages lost)")
        return lost

    # -- effects -> messages -------------------------------------------------------------------
    def route(self, src: str, effects: Iterable[Effect], now: float) -> list[Effect]:
        """Queue the network effects ``src``'s core returned; return the others (job results,
        writes, peer-down notes, ignored inputs …) in order, for the test to check."""
        local: list[Effect] = []
        core = self.cores.get(src)
        for eff in effects:
            if not isinstance(eff, _NETWORK_EFFECTS):
                local.append(eff)
                continue
            if isinstance(eff, OpenConnection):
                if self.auto_transport_up and core is not None:
                    local.extend(self.route(src, core.transport_up(eff.peer, now), now))
                continue
            if isinstance(eff, CancelTransfer):
                for t in self.transfers:
                    if (t.src, t.dst, t.kv_request_id, t.round) == (src, eff.peer, eff.kv_request_id, eff.round):
                        t.cancelled = True
                continue
            if isinstance(eff, LandBlocks):
                local.append(eff)
                if core is not None:
                    ok = (eff.kv_request_id, eff.round) not in self.corrupt
                    inp = MessageInput(eff.kv_request_id, eff.round, eff.first, eff.count, ok=ok,
                                       reason=None if ok else "corrupt")
                    answer = core.blocks_landed(eff.peer, inp, now)
                    self._answers.extend(answer)
                    local.extend(self.route(src, answer, now))
                continue
            if isinstance(eff, RevokeAccess):
                local.append(eff)
                if self.revoke_later:
                    self.revokes.append((src, eff))
                elif core is not None:
                    answer = core.access_revoked(eff.peer, eff.kv_request_id, eff.round, now)
                    self._answers.extend(answer)
                    local.extend(self.route(src, answer, now))
                continue
            self._enqueue(src, core, eff)
        return local

    def _enqueue(self, src: str, core: TierCore | None, eff: Effect) -> None:
        if isinstance(eff, SendBlocks):
            self.transfers.append(Transfer(src, eff.peer, eff.kv_request_id, eff.round, eff.blocks))
        env = to_envelope(src, core, eff)
        if env is not None:
            self.queues.setdefault((env.src, env.dst), []).append(env)

    def send(self, env: Envelope) -> None:
        """Put a hand-made message in flight (e.g. a forged or stale one)."""
        self.queues.setdefault((env.src, env.dst), []).append(env)

    # -- the network's nondeterminism ----------------------------------------------------------
    def directions(self) -> list[tuple[str, str]]:
        """``(src, dst)`` pairs with messages in flight, sorted."""
        return sorted(d for d, q in self.queues.items() if q)

    def in_flight(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def pending(self, src: str, dst: str) -> list[Envelope]:
        return list(self.queues.get((src, dst), ()))

    def _pick(self, src: str, dst: str, i: int) -> tuple[list[Envelope], int]:
        q = self.queues.get((src, dst))
        if not q:
            raise IndexError(f"no message in flight {src}->{dst}")
        return q, i % len(q)

    def drop(self, src: str, dst: str, i: int = 0) -> Envelope:
        """Lose message ``i % len`` of ``src -> dst``."""
        q, j = self._pick(src, dst, i)
        env = q.pop(j)
        self.log.append(f"drop {env}")
        return env

    def duplicate(self, src: str, dst: str, i: int = 0) -> Envelope:
        """Queue a copy of message ``i % len`` of ``src -> dst`` at the end of its queue."""
        q, j = self._pick(src, dst, i)
        env = q[j]
        q.append(env)
        self.log.append(f"duplicate {env}")
        return env

    def deliver(self, src: str, dst: str, i: int, now: float) -> tuple[Envelope, list[Effect]]:
        """Deliver message ``i % len`` of ``src -> dst`` into ``dst``'s core at ``now``.

        Returns the message and the receiving core's effects (network effects already queued:
        the list holds every effect, network ones included, for the test to inspect), followed by
        the effects of the shell's synchronous answers (``blocks_landed``, ``access_revoked``).
        A message to a detached name is dropped and counted in ``undeliverable``.
        """
        q, j = self._pick(src, dst, i)
        env = q.pop(j)
        core = self.cores.get(dst)
        if core is None:
            self.undeliverable += 1
            self.log.append(f"undeliverable {env}")
            return env, []
        effects = self.dispatch(core, env, now)
        self.log.append(f"deliver {env}")
        self._answers = []
        self.route(dst, effects, now)
        answered, self._answers = self._answers, []
        return env, effects + answered

    @staticmethod
    def dispatch(core: TierCore, env: Envelope, now: float) -> list[Effect]:
        """Feed one message into ``core`` (the receiving end of ``env``)."""
        peer, gen, kind = env.src, env.gen, env.kind
        if kind == "fetch":
            return core.fetch(peer, gen, FetchInput(peer, env.kv_request_id, env.round, env.keys), now)
        if kind == "abort_fetch":
            return core.abort_fetch(peer, gen, FetchInput(peer, env.kv_request_id, env.round, fetched=env.fetched), now)
        if kind == "receipt":
            return core.receipt(peer, gen, FetchInput(peer, env.kv_request_id, env.round), now)
        if kind == "block_data":
            return core.block_data(peer, gen, MessageInput(env.kv_request_id, env.round, env.first, env.count), now)
        if kind == "transfer_done":
            inp = MessageInput(env.kv_request_id, env.round, ok=env.ok, reason=env.reason)
            return core.transfer_done(peer, gen, inp, now)
        if kind == "abort_ack":
            return core.abort_ack(peer, gen, MessageInput(env.kv_request_id, env.round), now)
        if kind == "hello":
            return core.hello(peer, env.hello, now)
        if kind == "hello_ack":
            return core.hello_ack(peer, gen, now, env.instance)
        if kind == "hello_reject":
            return core.hello_reject(peer, gen, now)
        if kind == "disconnect":
            return core.disconnect(peer, gen, now, env.reason or "")
        if kind == "ping":
            return core.ping(peer, gen, now)
        raise ValueError(f"unknown message kind {kind!r}")

    # -- the data plane ------------------------------------------------------------------------
    def finish_transfer(self, i: int, now: float, *, ok: bool = True) -> tuple[Transfer, list[Effect]]:
        """The data plane is done with transfer ``i % len`` and references none of its blocks:
        feed ``transfer_released`` (``ok``, or after a cancel) or ``transfer_failed``; route the
        effects."""
        if not self.transfers:
            raise IndexError("no transfer in progress")
        t = self.transfers.pop(i % len(self.transfers))
        core = self.cores.get(t.src)
        if core is None:
            return t, []
        if ok or t.cancelled:
            effects = core.transfer_released(t.kv_request_id, t.round, now)
        else:
            effects = core.transfer_failed(t.kv_request_id, t.round, now)
        self.log.append(f"transfer {'released' if ok or t.cancelled else 'failed'} {t.kv_request_id} r{t.round}")
        self.route(t.src, effects, now)
        return t, effects

    def finish_revoke(self, i: int, now: float) -> list[Effect]:
        """A one-sided plane confirms revocation ``i % len`` (see ``revoke_later``)."""
        src, eff = self.revokes.pop(i % len(self.revokes))
        core = self.cores.get(src)
        if core is None:
            return []
        effects = core.access_revoked(eff.peer, eff.kv_request_id, eff.round, now)
        self.route(src, effects, now)
        return effects

    def connect(self, consumer: str, producer: str, now: float) -> list[Effect]:
        """Complete a handshake between two attached cores at once (dial, hello, hello_ack),
        delivering only the handshake messages. Returns every effect produced."""
        c, p = self.cores[consumer], self.cores[producer]
        out: list[Effect] = []
        if c.session_gen(producer) is None:
            from kvtier.lifecycle._table import SessionEvent

            first: list[Effect] = []
            c.sessions.apply(c.sessions.new_record(producer), SessionEvent.DIAL, None, now, first)
            out += first
            self.route(consumer, first, now)
        for src, dst in ((consumer, producer), (producer, consumer)):
            q = self.queues.get((src, dst), [])
            for env in list(q):
                if env.kind in ("hello", "hello_ack", "hello_reject"):
                    q.remove(env)
                    effects = self.dispatch(self.cores[dst], env, now)
                    out += effects
                    self.route(dst, effects, now)
                    break
        return out
