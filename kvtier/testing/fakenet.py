"""A fake network between in-memory :class:`~kvtier.lifecycle.TierCore` instances.

The lifecycle core returns effects and never performs I/O.  :class:`FakeNetwork` is the smallest
"shell" that lets several cores talk: it puts the wire message of every ``Send`` effect in an
:class:`Envelope` held in **per-direction in-flight queues** and, when a test says so, delivers
one of them into the receiving core (``TierCore.handle(Received(...))``).  Nothing is delivered
on its own:

* :meth:`FakeNetwork.deliver` pops index ``i % len(queue)``, so any order can be produced and a
  shrinking test (Hypothesis) reduces ``i`` to 0, i.e. to FIFO;
* :meth:`FakeNetwork.drop` loses a message, :meth:`FakeNetwork.duplicate` queues a copy of one;
* delay is simply not delivering yet.

It also plays the transport, the data plane and the consumer's shell: a connection comes up at
once (``ConnectionUp``) and a descriptor is always taken (``PeerAttached``); a ``SendBlocks``
effect queues one ``block_data`` message and records a :class:`Transfer` that the test finishes
with :meth:`FakeNetwork.finish_transfer` (``TransferReleased``, failed or not); a ``LandBlocks``
effect is answered at once with ``BlocksLanded`` (ok, unless the test marked the round corrupt in
:attr:`FakeNetwork.corrupt`); a ``RevokeAccess`` is answered at once with ``AccessRevoked`` unless
``revoke_later`` is set (then :meth:`FakeNetwork.finish_revoke` does it).

Endpoints are named; the name of an endpoint is the ``peer`` string the other cores use for it
(a consumer announces a request with ``peer=<producer name>``; the producer sees the consumer by
its name).  Messages carry the generation the sending core put in them, as on the wire, so
messages of a dead session are dropped by the receiver's generation gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from kvtier.lifecycle import Reason, TierCore
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Effect
from kvtier.wire import messages as wm

__all__ = ["Envelope", "FakeNetwork", "Transfer"]


@attrs.frozen(slots=True)
class Envelope:
    """One control or data message ``msg`` (a :mod:`kvtier.wire.messages` record) in flight
    from ``src`` to ``dst``; ``blocks``: for a ``block_data``, the producer pool blocks its
    payload would be taken from."""

    src: str
    dst: str
    msg: Any
    blocks: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        """The message's wire tag (``fetch``, ``block_data``, ``transfer_done``, ``hello`` …)."""
        return self.msg.TYPE

    @property
    def gen(self) -> int:
        return self.msg.gen

    @property
    def kv_request_id(self) -> str:
        return getattr(self.msg, "kv_request_id", "")

    @property
    def round(self) -> int:
        return getattr(self.msg, "round", 0)

    @property
    def keys(self) -> tuple[bytes, ...]:
        return tuple(getattr(self.msg, "keys", ()))

    @property
    def ok(self) -> bool:
        return getattr(self.msg, "ok", True)

    @property
    def reason(self) -> str:
        return getattr(self.msg, "reason", "")

    @property
    def fetched(self) -> bool:
        return getattr(self.msg, "fetched", True)

    def __str__(self) -> str:
        bits = [self.kind]
        if self.kv_request_id:
            bits.append(f"{self.kv_request_id} r{self.round}")
        m = self.msg
        if isinstance(m, wm.Fetch):
            bits.append(f"keys={len(m.keys)}")
        elif isinstance(m, wm.BlockData):
            bits.append(f"[{m.first}:{m.first + m.count}]")
        elif isinstance(m, wm.TransferDone):
            bits.append("ok" if m.ok else f"fail {m.reason}")
        elif isinstance(m, wm.Disconnect):
            bits.append(m.reason)
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


class FakeNetwork:
    """Named :class:`TierCore` endpoints joined by lossy, reorderable in-flight queues.

    Args:
        auto_transport_up: answer an ``OpenConnection`` effect at once with ``ConnectionUp``
            (the connection "comes up" instantly); with False the test feeds
            ``ConnectionUp`` itself and passes the effects to :meth:`route`.

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
        self.revokes: list[tuple[str, str]] = []  # (core name, producer peer) awaiting finish_revoke
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
        """Queue the network effects ``src``'s core returned and answer the shell's synchronous
        ones; return the others (job results, writes, session ends, ignored inputs …) in order,
        for the test to check."""
        local: list[Effect] = []
        core = self.cores.get(src)
        for eff in effects:
            t = type(eff)
            if t is fx.Send:
                self._queue(Envelope(src, eff.peer, eff.msg))
            elif t is fx.SendBlocks:
                self.transfers.append(Transfer(src, eff.peer, eff.kv_request_id, eff.round, eff.blocks))
                if eff.blocks:
                    msg = wm.BlockData(gen=eff.gen, kv_request_id=eff.kv_request_id, round=eff.round, first=0,
                                       count=len(eff.blocks), digests=list(eff.digests))
                    self._queue(Envelope(src, eff.peer, msg, eff.blocks))
            elif t is fx.CancelTransfer:
                for tr in self.transfers:
                    if (tr.src, tr.kv_request_id, tr.round) == (src, eff.kv_request_id, eff.round):
                        tr.cancelled = True
            elif t is fx.OpenConnection:
                if self.auto_transport_up and core is not None:
                    local.extend(self._answer(src, core, ix.ConnectionUp(eff.peer), now))
            elif t is fx.AttachPeer:
                if core is not None:
                    local.extend(self._answer(src, core, ix.PeerAttached(eff.peer, eff.gen), now))
            elif t is fx.LandBlocks:
                local.append(eff)
                if core is not None:
                    ok = (eff.kv_request_id, eff.round) not in self.corrupt
                    landed = ix.BlocksLanded(eff.peer, eff.kv_request_id, eff.round, eff.first, len(eff.slots), ok,
                                             None if ok else Reason.CORRUPT)
                    local.extend(self._answer(src, core, landed, now))
            elif t is fx.RevokeAccess:
                local.append(eff)
                if self.revoke_later:
                    self.revokes.append((src, eff.peer))
                elif core is not None:
                    local.extend(self._answer(src, core, ix.AccessRevoked(eff.peer), now))
            elif t in (fx.CloseConnection, fx.DetachPeer):
                pass
            else:
                local.append(eff)
        return local

    def _answer(self, src: str, core: TierCore, inp: ix.Input, now: float) -> list[Effect]:
        answer = core.handle(inp, now)
        self._answers.extend(answer)
        return self.route(src, answer, now)

    def _queue(self, env: Envelope) -> None:
        self.queues.setdefault((env.src, env.dst), []).append(env)

    def send(self, env: Envelope) -> None:
        """Put a hand-made message in flight (e.g. a forged or stale one)."""
        self._queue(env)

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
        the effects of the shell's synchronous answers (``BlocksLanded``, ``AccessRevoked``,
        ``PeerAttached``).  A message to a detached name is dropped and counted in
        ``undeliverable``.
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
        return core.handle(ix.Received(env.src, env.msg), now)

    # -- the data plane ------------------------------------------------------------------------
    def finish_transfer(self, i: int, now: float, *, ok: bool = True) -> tuple[Transfer, list[Effect]]:
        """The data plane is done with transfer ``i % len`` and references none of its blocks:
        feed ``TransferReleased`` (failed unless ``ok`` or cancelled); route the effects."""
        if not self.transfers:
            raise IndexError("no transfer in progress")
        t = self.transfers.pop(i % len(self.transfers))
        core = self.cores.get(t.src)
        if core is None:
            return t, []
        failed = not (ok or t.cancelled)
        effects = core.handle(ix.TransferReleased(t.kv_request_id, t.round, failed), now)
        self.log.append(f"transfer {'failed' if failed else 'released'} {t.kv_request_id} r{t.round}")
        self.route(t.src, effects, now)
        return t, effects

    def finish_revoke(self, i: int, now: float) -> list[Effect]:
        """A one-sided plane confirms revocation ``i % len`` (see ``revoke_later``)."""
        src, peer = self.revokes.pop(i % len(self.revokes))
        core = self.cores.get(src)
        if core is None:
            return []
        effects = core.handle(ix.AccessRevoked(peer), now)
        self.route(src, effects, now)
        return effects

    def connect(self, consumer: str, producer: str, now: float) -> list[Effect]:
        """Complete a handshake between two attached cores at once (dial, hello, hello_ack),
        delivering only the handshake messages. Returns every effect produced."""
        c = self.cores[consumer]
        out: list[Effect] = []
        if c.session(producer) is None:
            first = c.handle(ix.Dial(producer), now)
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
