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
:attr:`FakeNetwork.corrupt`, or one of its positions in :attr:`FakeNetwork.corrupt_blocks`) — or,
with ``land_later``, waits in :attr:`FakeNetwork.landings` until :meth:`FakeNetwork.finish_landing`
(a landing still copying on the digest pool); a ``RevokeAccess`` is answered at once with
``AccessRevoked`` unless ``revoke_later`` is set (then :meth:`FakeNetwork.finish_revoke` does it).
With ``split_batches`` a transfer's blocks travel one ``block_data`` each (a load can end partly
landed); :meth:`FakeNetwork.plane_fault` breaks a plane's path to a peer (its transfers then fail
at their post, as a NIXL agent's do after a remote disconnect) and reports it to the core.

Like the real shell it drives every core through :func:`kvtier.lifecycle.driver.drive` and
:func:`~kvtier.lifecycle.driver.settle`: a core's effects are performed in order and what the
performers report (a connection up, a descriptor taken, blocks landed, access revoked) is applied
after them, before anything else.  Receive batching is there too: :meth:`FakeNetwork.arrive`
moves a message into the receiver's socket, where it waits unread, and :meth:`FakeNetwork.tick`
is one pass of the receiver's loop: every unread message, then the deadlines due at the time
its socket was last seen empty (the ``input_before_deadline`` contract).

Endpoints are named; the name of an endpoint is the ``peer`` string the other cores use for it
(a consumer announces a request with ``peer=<producer name>``; the producer sees the consumer by
its name).  Messages carry the generation the sending core put in them, as on the wire, so
messages of a dead session are dropped by the receiver's generation gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from kvtier.lifecycle import Reason, TierCore, driver
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Effect
from kvtier.wire import messages as wm
from tools.coreview import CoreView

__all__ = ["Envelope", "FakeNetwork", "Landing", "Transfer"]


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
class Landing:
    """A ``LandBlocks`` the consumer's plane is still working on (``land_later``)."""

    src: str
    eff: Any
    ok: bool


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
        queues: ``(src, dst) -> list[Envelope]``, oldest first (in the network).
        inbox: ``dst -> [(arrival time, Envelope)]``: arrived in the receiver's socket, unread
            (:meth:`arrive`, :meth:`tick`).
        transfers: data-plane transfers in progress, oldest first.
        corrupt: ``(kv_request_id, round)`` pairs whose blocks land with a digest mismatch.
        corrupt_blocks: ``(kv_request_id, round, position)``: that one block lands corrupt.
        land_later: when True, ``LandBlocks`` waits in :attr:`landings` for :meth:`finish_landing`.
        landings: landings in progress, oldest first.
        verified: ``(core, kv_request_id, round)`` -> the fetch positions whose landing this network
            answered ok (what a core may report as landed).
        split_batches: a transfer's blocks travel one ``block_data`` each.
        faulted: ``(core, peer) -> generation`` whose data-plane path broke (:meth:`plane_fault`).
        revoke_later: when True, ``RevokeAccess`` waits in :attr:`revokes` for
            :meth:`finish_revoke` (a one-sided plane); else it is confirmed at once (zmq).
        log: one line per delivered, dropped or duplicated message (for failure reports).
        undeliverable: messages addressed to a name with no attached core (counted, dropped).
    """

    #: effects the network, the transport or the plane consume (the others are the test's to check)
    NETWORK_EFFECTS = (fx.Send, fx.SendBlocks, fx.CancelTransfer, fx.OpenConnection, fx.AttachPeer,
                       fx.CloseConnection, fx.DetachPeer)

    def __init__(self, *, auto_transport_up: bool = True) -> None:
        self.cores: dict[str, TierCore] = {}
        self.queues: dict[tuple[str, str], list[Envelope]] = {}
        self.inbox: dict[str, list[tuple[float, Envelope]]] = {}
        self.transfers: list[Transfer] = []
        self.corrupt: set[tuple[str, int]] = set()
        self.corrupt_blocks: set[tuple[str, int, int]] = set()
        self.land_later = False
        self.landings: list[Landing] = []
        self.verified: dict[tuple[str, str, int], set[int]] = {}
        self.split_batches = False
        self.faulted: dict[tuple[str, str], int] = {}
        self.revoke_later = False
        self.revokes: list[tuple[str, str]] = []  # (core name, producer peer) awaiting finish_revoke
        self.auto_transport_up = auto_transport_up
        self.log: list[str] = []
        self.undeliverable = 0

    # -- endpoints ---------------------------------------------------------------------------
    def attach(self, name: str, core: TierCore) -> None:
        """Attach (or replace, e.g. after a restart) the core reachable as ``name``."""
        self.cores[name] = core

    def kill(self, name: str) -> list[Envelope]:
        """``name`` crashed: its core is detached, every message to or from it (in the network or
        unread in its socket) and every transfer it was sending is lost. Returns the lost
        messages."""
        self.cores.pop(name, None)
        lost: list[Envelope] = [env for _, env in self.inbox.pop(name, [])]
        for (src, dst), q in self.queues.items():
            if name in (src, dst):
                lost.extend(q)
                q.clear()
        for dst, unread in self.inbox.items():
            lost.extend(env for _, env in unread if env.src == name)
            unread[:] = [(t, env) for t, env in unread if env.src != name]
        self.transfers = [t for t in self.transfers if t.src != name]
        self.revokes = [r for r in self.revokes if r[0] != name]
        self.landings = [x for x in self.landings if x.src != name]
        # what landed in the dead process is gone with it: a new one at that name numbers its
        # rounds afresh, and its loads' verified prefixes start empty
        self.verified = {k: v for k, v in self.verified.items() if k[0] != name}
        self.log.append(f"kill {name} ({len(lost)} messages lost)")
        return lost

    # -- performing effects --------------------------------------------------------------------
    def performer(self, src: str, seen: list[Effect] | None = None) -> driver.Perform:
        """The ``perform`` of ``src``'s shell (for :func:`~kvtier.lifecycle.driver.drive`):
        queue the messages, post the transfers, and return the synchronous answers (connection
        up, descriptor taken, blocks landed, access revoked) as inputs.  Every effect performed is
        appended to ``seen``."""
        core = self.cores.get(src)

        def perform(effects: Iterable[Effect]) -> list[ix.Input]:
            answers: list[ix.Input] = []
            for eff in effects:
                if seen is not None:
                    seen.append(eff)
                t = type(eff)
                if t is fx.Send:
                    self._queue(Envelope(src, eff.peer, eff.msg))
                elif t is fx.SendBlocks:
                    if self.faulted.get((src, eff.peer)) == eff.gen:  # fails at its post: nothing moves
                        answers.append(ix.TransferReleased(eff.transfer or eff.kv_request_id, eff.round, True))
                        continue
                    self.transfers.append(Transfer(src, eff.peer, eff.transfer or eff.kv_request_id, eff.round,
                                                   eff.blocks))
                    self._post(src, eff)
                elif t is fx.CancelTransfer:
                    for tr in self.transfers:
                        if (tr.src, tr.kv_request_id, tr.round) == (src, eff.kv_request_id, eff.round):
                            tr.cancelled = True
                elif t is fx.OpenConnection:
                    if self.auto_transport_up:
                        answers.append(ix.ConnectionUp(eff.peer))
                elif t is fx.AttachPeer:
                    answers.append(ix.PeerAttached(eff.peer, eff.gen))
                elif t is fx.LandBlocks:
                    ok = (eff.kv_request_id, eff.round) not in self.corrupt and not any(
                        (eff.kv_request_id, eff.round, eff.first + i) in self.corrupt_blocks
                        for i in range(len(eff.slots)))
                    if self.land_later:
                        self.landings.append(Landing(src, eff, ok))
                    else:
                        answers.append(self._landed(src, eff, ok))
                elif t is fx.RevokeAccess:
                    if self.revoke_later:
                        self.revokes.append((src, eff.peer))
                    else:
                        answers.append(ix.AccessRevoked(eff.peer))
            return answers if core is not None else []

        return perform

    def _post(self, src: str, eff: fx.SendBlocks) -> None:
        """Queue the ``block_data`` of a transfer: one for all its blocks, or one per block."""
        if not eff.blocks:
            return
        n = len(eff.blocks)
        cuts = [(i, 1) for i in range(n)] if self.split_batches else [(0, n)]
        for first, count in cuts:
            msg = wm.BlockData(gen=eff.gen, kv_request_id=eff.kv_request_id, round=eff.round, first=first,
                               count=count, digests=list(eff.digests[first : first + count]))
            self._queue(Envelope(src, eff.peer, msg, eff.blocks[first : first + count]))

    def _landed(self, src: str, eff: fx.LandBlocks, ok: bool) -> ix.BlocksLanded:
        """The answer to a landing (recorded in :attr:`verified` when ok)."""
        if ok:
            self.verified.setdefault((src, eff.kv_request_id, eff.round), set()).update(
                range(eff.first, eff.first + len(eff.slots)))
        return ix.BlocksLanded(eff.peer, eff.kv_request_id, eff.round, eff.first, len(eff.slots), ok,
                               None if ok else Reason.CORRUPT)

    def route(self, src: str, effects: Iterable[Effect], now: float) -> list[Effect]:
        """Perform the effects ``src``'s core returned (and apply what the performers report,
        :func:`~kvtier.lifecycle.driver.settle`); return the effects that are not the network's
        (job results, landings, revocations, session ends, ignored inputs …), the answers'
        included, in order, for the test to check."""
        seen: list[Effect] = []
        core = self.cores.get(src)
        effects = list(effects)
        if core is None:
            self.performer(src, seen)(effects)
        else:
            driver.settle(core, effects, now, self.performer(src, seen))
        return [e for e in seen if not isinstance(e, self.NETWORK_EFFECTS)]

    def apply(self, name: str, inp: ix.Input, now: float) -> list[Effect]:
        """Apply one input to ``name``'s core and perform everything it leads to; returns every
        effect performed (the input's first, then its answers')."""
        seen: list[Effect] = []
        driver.drive(self.cores[name], (inp,), now, deadlines_at=None, perform=self.performer(name, seen))
        return seen

    def _queue(self, env: Envelope) -> None:
        self.queues.setdefault((env.src, env.dst), []).append(env)

    def send(self, env: Envelope) -> None:
        """Put a hand-made message in flight (e.g. a forged or stale one)."""
        self._queue(env)

    # -- the network's nondeterminism ----------------------------------------------------------
    def directions(self) -> list[tuple[str, str]]:
        """``(src, dst)`` pairs with messages in the network, sorted."""
        return sorted(d for d, q in self.queues.items() if q)

    def in_flight(self) -> int:
        """Messages in the network or unread in a socket."""
        return sum(len(q) for q in self.queues.values()) + sum(len(q) for q in self.inbox.values())

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
        """Deliver message ``i % len`` of ``src -> dst`` into ``dst``'s core at ``now`` (read the
        moment it arrives: one input, no deadlines).

        Returns the message and every effect performed: the receiving core's (network ones
        included), then those of the shell's synchronous answers (``BlocksLanded``,
        ``AccessRevoked``, ``PeerAttached``).  A message to a detached name is dropped and
        counted in ``undeliverable``.
        """
        q, j = self._pick(src, dst, i)
        env = q.pop(j)
        core = self.cores.get(dst)
        if core is None:
            self.undeliverable += 1
            self.log.append(f"undeliverable {env}")
            return env, []
        self.log.append(f"deliver {env}")
        seen: list[Effect] = []
        driver.drive(core, (self.received(env),), now, deadlines_at=None, perform=self.performer(dst, seen))
        return env, seen

    def arrive(self, src: str, dst: str, i: int, now: float) -> Envelope:
        """Message ``i % len`` of ``src -> dst`` arrives in ``dst``'s socket at ``now`` and waits
        there, unread, until ``dst``'s next :meth:`tick` (lost if ``dst`` has no core)."""
        q, j = self._pick(src, dst, i)
        env = q.pop(j)
        if dst not in self.cores:
            self.undeliverable += 1
            self.log.append(f"undeliverable {env}")
            return env
        self.inbox.setdefault(dst, []).append((now, env))
        self.log.append(f"arrive {env}")
        return env

    def unread(self, name: str) -> list[tuple[float, Envelope]]:
        """``(arrival time, message)`` waiting unread in ``name``'s socket, oldest first."""
        return list(self.inbox.get(name, ()))

    def tick(self, name: str, now: float, *, core: Any = None) -> list[Effect]:
        """One pass of ``name``'s loop at ``now``: read every unread message, then fire the
        deadlines due at the time its socket was last seen empty — the first unread message's
        arrival, or ``now`` when there was none (:func:`~kvtier.lifecycle.driver.drive`).
        ``core``: what to drive instead of the attached core (an observing proxy).  Returns every
        effect performed."""
        unread = self.inbox.pop(name, [])
        quiet = unread[0][0] if unread else now
        for _, env in unread:
            self.log.append(f"read {env}")
        seen: list[Effect] = []
        target = core if core is not None else self.cores[name]
        driver.drive(target, [self.received(env) for _, env in unread], now, deadlines_at=quiet,
                     perform=self.performer(name, seen))
        return seen

    @staticmethod
    def received(env: Envelope) -> ix.Received:
        """The input the receiving end of ``env`` is given."""
        return ix.Received(env.src, env.msg)

    @staticmethod
    def dispatch(core: TierCore, env: Envelope, now: float) -> list[Effect]:
        """Feed one message into ``core`` (the receiving end of ``env``) and return its effects
        unperformed."""
        return core.handle(ix.Received(env.src, env.msg), now)

    # -- the data plane ------------------------------------------------------------------------
    def finish_transfer(self, i: int, now: float, *, ok: bool = True) -> tuple[Transfer, list[Effect]]:
        """The data plane is done with transfer ``i % len`` and references none of its blocks:
        feed ``TransferReleased`` (failed unless ``ok`` or cancelled) and perform what follows;
        returns the transfer and every effect performed."""
        if not self.transfers:
            raise IndexError("no transfer in progress")
        t = self.transfers.pop(i % len(self.transfers))
        if t.src not in self.cores:
            return t, []
        failed = not (ok or t.cancelled)
        self.log.append(f"transfer {'failed' if failed else 'released'} {t.kv_request_id} r{t.round}")
        return t, self.apply(t.src, ix.TransferReleased(t.kv_request_id, t.round, failed), now)

    def finish_landing(self, i: int, now: float) -> list[Effect]:
        """Landing ``i % len`` (see ``land_later``) ends: its ``BlocksLanded`` is applied; returns
        every effect performed."""
        if not self.landings:
            raise IndexError("no landing in progress")
        x = self.landings.pop(i % len(self.landings))
        if x.src not in self.cores:
            return []
        self.log.append(f"landed {x.eff.kv_request_id} r{x.eff.round} [{x.eff.first}] {'ok' if x.ok else 'corrupt'}")
        return self.apply(x.src, self._landed(x.src, x.eff, x.ok), now)

    def plane_fault(self, src: str, peer: str, now: float) -> list[Effect]:
        """``src``'s data-plane path to ``peer`` (its current session) breaks: every later transfer
        of that session fails at its post, and the fault is reported to ``src``'s core
        (``PlaneFaulted``).  Returns every effect performed."""
        core = self.cores.get(src)
        gen = CoreView(core).session_gen(peer) if core is not None else None
        if gen is None:
            return []
        self.faulted[(src, peer)] = gen
        self.log.append(f"plane fault {src}->{peer} g{gen}")
        return self.apply(src, ix.PlaneFaulted(peer, gen, "fake plane"), now)

    def finish_revoke(self, i: int, now: float) -> list[Effect]:
        """A one-sided plane confirms revocation ``i % len`` (see ``revoke_later``); returns every
        effect performed."""
        src, peer = self.revokes.pop(i % len(self.revokes))
        if src not in self.cores:
            return []
        return self.apply(src, ix.AccessRevoked(peer), now)

    def connect(self, consumer: str, producer: str, now: float) -> list[Effect]:
        """Complete a handshake between two attached cores at once (dial, hello, hello_ack),
        delivering only the handshake messages. Returns every effect performed."""
        out: list[Effect] = []
        if CoreView(self.cores[consumer]).session(producer) is None:
            out += self.apply(consumer, ix.Dial(producer), now)
        for src, dst in ((consumer, producer), (producer, consumer)):
            q = self.queues.get((src, dst), [])
            for j, env in enumerate(q):
                if env.kind in ("hello", "hello_ack", "hello_reject"):
                    out += self.deliver(src, dst, j, now)[1]
                    break
        return out
