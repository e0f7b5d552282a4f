"""In-memory transport for deterministic, virtual-clock tests. No threads, no sockets, no sleeps.

``InprocNetwork`` is a hub of named endpoints. ``InprocTransport(network, address)`` behaves
like ``ZmqTransport`` as far as the manager can tell:
- ``connect(address)`` returns the peer id ``address``. The listener sees the dialler as
  ``"in:<dialler address>"``.
- ``send()`` copies the frames to ``bytes`` (as a wire would) and puts them straight into the
  receiver's inbox. FIFO per sender→receiver pair, with one global delivery order. ``recv()``
  returns what is there.
- Sends to a dialled address with nobody listening, or to a receiver whose inbox holds
  ``rcvhwm`` messages, wait in the sender's per-peer queue. ``flush()``/``recv()`` deliver them
  once the address is listening again or has room, just as a zmq DEALER reconnects to a
  restarted producer.
- A send to a ``"in:..."`` peer that is no longer connected fails (``unreachable``), like a
  ROUTER with ``ROUTER_MANDATORY``.
- ``wait(timeout_s)`` never sleeps. It only reports whether the inbox holds anything; the test
  advances its VirtualClock instead.

Fault helpers: :meth:`InprocNetwork.partition` / :meth:`~InprocNetwork.heal` silently drop
traffic between two addresses. :meth:`InprocNetwork.kill` makes an endpoint vanish as if its
process died. A new ``InprocTransport`` at the same address is a restart.
``hold_completion=True`` keeps ``SendHandle.done`` False until :meth:`InprocTransport.complete`,
to test "don't reuse a slot before its send is done".  ``io_lag = True`` on a transport models a
stopped process's transport threads: what arrives waits "in its kernel", where the first
``service`` after the stop does not see it (the order the real threads may take after a resume),
until :meth:`InprocTransport.barrier`, a ``wait``, or that first ``service`` (then the threads ran).
The model's kernel is unbounded and connection events are not held back with it.

Connection events, as ``ZmqTransport`` reports them: :meth:`InprocNetwork.close_connection`
(a reset), :meth:`InprocNetwork.kill` and :meth:`InprocTransport.close` report
``PeerClosed(..., "disconnected")`` on the other end(s) of every connection; ``drop_peer``
reports ``dropped`` locally and ``disconnected`` remotely, and releases held handles to that
peer. ``principal=`` names an endpoint's authenticated identity for ``peer_info``.
"""

from __future__ import annotations

import select
from collections import deque
from collections.abc import Sequence
from typing import Any

from kvtier.transport import (
    CloseReason,
    PeerClosed,
    PeerInfo,
    SendFailure,
    SendHandle,
    TransportError,
    TransportEvent,
)

__all__ = ["InprocNetwork", "InprocTransport"]

_IN_PREFIX = "in:"


class InprocNetwork:
    """The hub every :class:`InprocTransport` of one test attaches to.

    Attributes:
        dropped: messages lost to :meth:`partition` or to a killed receiver (a counter).
        delivered: messages placed in some inbox (a counter).
    """

    def __init__(self) -> None:
        self._endpoints: dict[str, InprocTransport] = {}
        self._cuts: set[frozenset[str]] = set()
        self._wire: dict[str, list[tuple[str, list[bytes]]]] = {}  # held destination -> messages on the wire
        self.dropped = 0
        self.delivered = 0

    def endpoint(self, address: str) -> InprocTransport | None:
        """The live transport at ``address``, or None."""
        return self._endpoints.get(address)

    def addresses(self) -> list[str]:
        """Addresses with a live transport, in attach order."""
        return list(self._endpoints)

    def partition(self, a: str, b: str) -> None:
        """Silently drop every message between ``a`` and ``b`` (both directions) until
        :meth:`heal`. Sends still report success, as on a network that loses packets."""
        self._cuts.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        """Undo :meth:`partition` for ``a`` and ``b``. Messages dropped meanwhile stay lost."""
        self._cuts.discard(frozenset((a, b)))

    def hold(self, dest: str) -> None:
        """Messages to ``dest`` stay on the wire from now on: sent (their sends complete), not yet
        arrived, until :meth:`release` — what a receiver has not been delivered cannot be read
        before anything it does next."""
        self._wire.setdefault(dest, [])

    def release(self, dest: str) -> None:
        """The messages held on the wire to ``dest`` arrive, in the order they were sent."""
        arriving = self._wire.pop(dest, [])
        target = self._endpoints.get(dest)
        if target is None or target._closed:
            self.dropped += len(arriving)
            return
        (target._kernel if target.io_lag else target._inbox).extend(arriving)
        self.delivered += len(arriving)

    def is_partitioned(self, a: str, b: str) -> bool:
        """True while traffic between ``a`` and ``b`` is being dropped."""
        return frozenset((a, b)) in self._cuts

    def kill(self, address: str) -> None:
        """The endpoint at ``address`` dies: its inbox and queues are discarded, its handles fail
        with ``closed``, and the peers it dialled forget it. Messages already sent to it are
        lost. No-op if nothing listens there."""
        t = self._endpoints.get(address)
        if t is not None:
            self.dropped += len(t._inbox) + len(t._kernel)
            t.close()

    def close_connection(self, dialler: str, listener: str) -> bool:
        """The TCP connection ``dialler`` → ``listener`` resets: both ends get a
        ``PeerClosed(..., "disconnected")``, the listener forgets the dialler (sends to it fail
        ``unreachable``) and held handles on both sides are released. The dialler keeps its
        dial, as a zmq DEALER reconnects on its own. Returns False if no such connection."""
        d, lis = self._endpoints.get(dialler), self._endpoints.get(listener)
        if d is None or lis is None or listener not in d._dialled or dialler not in lis._inbound:
            return False
        d._connection_gone(listener, CloseReason.DISCONNECTED)
        lis._connection_gone(_IN_PREFIX + dialler, CloseReason.DISCONNECTED)
        return True

    # -- used by InprocTransport ---------------------------------------------------------------

    def _attach(self, t: InprocTransport) -> None:
        if t.address in self._endpoints:
            raise TransportError(f"address {t.address!r} already in use")
        self._endpoints[t.address] = t

    def _detach(self, t: InprocTransport) -> None:
        if self._endpoints.get(t.address) is t:
            del self._endpoints[t.address]
        for other in self._endpoints.values():
            if self.is_partitioned(t.address, other.address):
                continue  # the FIN is lost with everything else: the other end must time out
            if t.address in other._inbound:
                other._connection_gone(_IN_PREFIX + t.address, CloseReason.DISCONNECTED)
            if t.address in other._dialled and other.address in t._inbound:
                other._connection_gone(t.address, CloseReason.DISCONNECTED)


class InprocTransport:
    """In-memory transport. Same methods as ``ZmqTransport`` (see the module docstring).

    Args:
        network: the shared hub.
        address: this endpoint's address, conventionally ``"host:port"``.
        rcvhwm: inbox capacity in messages. Senders queue past it. ``None`` means unbounded.
        hold_after_drop: with ``hold_completion``, even cutting the connection does not release
            the held handles (a transport that cannot confirm a release, such as a posted
            one-sided WRITE): only :meth:`complete` does.
        hold_completion: if True, handles of sent messages stay not ``done`` until
            :meth:`complete` is called (simulates zmq still reading zero-copy frames).
        principal: this endpoint's authenticated name, as peers' :meth:`peer_info` reports it
            (``None``: authentication off).

    Raises:
        TransportError: ``address`` is already taken on this network.
    """

    def __init__(
        self,
        network: InprocNetwork,
        address: str,
        *,
        rcvhwm: int | None = None,
        hold_completion: bool = False,
        principal: str | None = None,
        hold_after_drop: bool = False,
    ) -> None:
        if not isinstance(address, str) or not address:
            raise ValueError(f"address must be a non-empty str, got {address!r}")
        if rcvhwm is not None and (isinstance(rcvhwm, bool) or not isinstance(rcvhwm, int) or rcvhwm < 1):
            raise ValueError(f"rcvhwm must be None or an int >= 1, got {rcvhwm!r}")
        self.network = network
        self.address = address
        self.rcvhwm = rcvhwm
        self.hold_completion = hold_completion
        self.hold_after_drop = hold_after_drop
        self._inbox: deque[tuple[str, list[bytes]]] = deque()
        self._kernel: list[tuple[str, list[bytes]]] = []  # arrived, not yet taken in (io_lag)
        self.io_lag = False
        """While True, arriving messages wait in the kernel until :meth:`barrier`, :meth:`wait` or
        the end of the next :meth:`service`."""
        self._dialled: list[str] = []  # peers we connected to, in order
        self._inbound: set[str] = set()  # addresses that dialled us
        self._queues: dict[str, deque[tuple[list[bytes], SendHandle]]] = {}
        self._held: list[SendHandle] = []
        self._events: list[TransportEvent] = []
        self.principal = principal
        self._closed = False
        network._attach(self)

    # -- Transport API -------------------------------------------------------------------------

    def needs_lookup(self, address: str) -> bool:
        """Never: in-memory addresses are not names a resolver knows."""
        return False

    def lookup(self, address: str, vet: Any = None) -> tuple[str, ...]:
        """``address`` itself (nothing to look up)."""
        return (address,)

    def connect(self, address: str, *, fail_fast: bool = False, vet: Any = None,
                resolved: Sequence[str] | None = None) -> str:
        """Dial ``address`` (it need not be listening yet). Returns the peer id ``address``.

        ``fail_fast``: nothing listening at ``address`` (and no partition between us) is a
        refused dial: ``PeerClosed(address, "refused")`` is reported, as ``ZmqTransport`` does.

        Raises:
            TransportError: this transport is closed.
            ValueError: ``address`` is empty or our own address.
        """
        if self._closed:
            raise TransportError("connect() on a closed transport")
        if not isinstance(address, str) or not address or address == self.address:
            raise ValueError(f"cannot connect to {address!r}")
        if address not in self._dialled:
            self._dialled.append(address)
            # an earlier connection's close is history, not news about this one (as zmq's)
            self._events = [e for e in self._events if e.peer != address]
        target = self.network._endpoints.get(address)
        if target is not None:
            target._inbound.add(self.address)
        elif fail_fast and not self.network.is_partitioned(self.address, address):
            self._events.append(PeerClosed(address, CloseReason.REFUSED))
        return address

    def send(self, peer: str, frames: Sequence[Any], *, track: bool = False) -> SendHandle:
        """Copy ``frames`` to bytes and deliver (or queue) them. Never raises for peer
        conditions; see :class:`~kvtier.transport.SendHandle`.

        Raises:
            ValueError: ``frames`` is empty or holds a non-buffer (a caller bug).
        """
        if isinstance(frames, (bytes, bytearray, memoryview, str)) or not isinstance(
            frames, (list, tuple)
        ) or not frames:
            raise ValueError("frames must be a non-empty list of buffers")
        try:
            data = [bytes(memoryview(f)) for f in frames]
        except TypeError as exc:
            raise ValueError(f"frames must be buffers: {exc}") from None
        handle = SendHandle(peer)
        if self._closed:
            handle._mark_failed(SendFailure.CLOSED)
            return handle
        if peer in self._dialled:
            queue = self._queues.get(peer)
            if queue:
                queue.append((data, handle))
                self._flush_peer(peer)
            elif not self._deliver(peer, peer, data, handle):
                self._queues.setdefault(peer, deque()).append((data, handle))
            return handle
        if peer.startswith(_IN_PREFIX) and peer[len(_IN_PREFIX) :] in self._inbound:
            dest = peer[len(_IN_PREFIX) :]
            queue = self._queues.get(peer)
            if queue:
                queue.append((data, handle))
                self._flush_peer(peer)
            elif not self._deliver(peer, dest, data, handle):
                self._queues.setdefault(peer, deque()).append((data, handle))
            return handle
        if peer.startswith(_IN_PREFIX):
            handle._mark_failed(SendFailure.UNREACHABLE, f"{peer!r} is not connected")
        else:
            handle._mark_failed(SendFailure.UNKNOWN_PEER, f"no such peer {peer!r}")
        return handle

    def recv(self, max_messages: int = 1000) -> list[tuple[str, list[memoryview | bytes]]]:
        """Pop up to ``max_messages`` messages in delivery order (flushes queued sends first).

        Raises:
            ValueError: ``max_messages`` is not an int >= 1.
        """
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be an int >= 1, got {max_messages!r}")
        if self._closed:
            return []
        self.flush()
        out: list[tuple[str, list[memoryview | bytes]]] = []
        while self._inbox and len(out) < max_messages:
            out.append(self._inbox.popleft())  # type: ignore[arg-type]
        if out:
            self._wake_senders()
        return out

    def service(self, max_messages: int = 1000) -> tuple[list[tuple[str, list[memoryview | bytes]]], list[TransportEvent], bool]:
        """One pass, as ``ZmqTransport.service``: up to ``max_messages`` messages, every event,
        and whether the inbox is now empty.  With ``io_lag``, what waits in the kernel is taken in
        after the pass (the next one sees it): the transport's threads run beside its owner."""
        msgs = self.recv(max_messages)
        out = msgs, self.events(), not self._inbox
        if self.io_lag and not self._closed:
            self._take_in()
        return out

    def set_wake(self, fd: int | None) -> None:
        """The owner's wake-up fd: :meth:`wait` also reports it readable (without reading it)."""
        self._wake = fd

    def barrier(self, timeout_s: float) -> bool:
        """Never sleeps: what waits in the kernel (``io_lag``) is taken in, and the lag ends."""
        if self._closed:
            return False
        self._take_in()
        return True

    def progress(self) -> list[str]:
        """Nothing: messages arrive whole here, so a peer is heard by them alone (decision T22)."""
        return []

    def _take_in(self) -> None:
        self.io_lag = False
        self._inbox.extend(self._kernel)
        self._kernel.clear()

    def wait(self, timeout_s: float) -> bool:
        """Never sleeps. Flushes, then returns True iff the inbox is non-empty (or the wake-up fd
        of :meth:`set_wake` is readable).  A transport's threads run while its owner waits: what
        waits in the kernel (``io_lag``) is taken in first."""
        if self._closed:
            return False
        self._take_in()
        self.flush()
        if self._inbox:
            return True
        wake = getattr(self, "_wake", None)
        return wake is not None and bool(select.select([wake], [], [], 0)[0])

    def pending_sends(self) -> int:
        """Messages waiting in this transport's per-peer queues."""
        return sum(len(q) for q in self._queues.values())

    def flush(self) -> None:
        """Deliver queued messages whose receiver is listening and has room."""
        for peer in list(self._queues):
            self._flush_peer(peer)

    def disconnect(self, peer: str) -> None:
        """Forget ``peer``; its queued sends fail with ``disconnected``. Unknown peers are
        ignored."""
        self._fail_queue(peer, SendFailure.DISCONNECTED)
        if peer in self._dialled:
            self._dialled.remove(peer)
            target = self.network._endpoints.get(peer)
            if target is not None:
                target._inbound.discard(self.address)
        elif peer.startswith(_IN_PREFIX):
            self._inbound.discard(peer[len(_IN_PREFIX) :])

    def events(self) -> list[TransportEvent]:
        """``PeerClosed`` records since the last call, oldest first."""
        out, self._events = self._events, []
        return out

    def drop_peer(self, peer: str, linger_s: float = 0.0) -> bool:
        """Cut the connection to ``peer``: queued sends fail ``disconnected``, held handles to
        it are released, we report ``dropped`` and the other end ``disconnected`` (unless the two
        are partitioned: then the close is lost like everything else). A dialled peer is
        forgotten (``connect`` dials again). False if not connected.  ``linger_s`` changes
        nothing here: a goodbye sent before is already in the other end's queue."""
        if self._closed:
            return False
        self._fail_queue(peer, SendFailure.DISCONNECTED)
        if peer in self._dialled:
            other = self.network._endpoints.get(peer)
            self._dialled.remove(peer)
            self._release_held(peer)
            self._events.append(PeerClosed(peer, CloseReason.DROPPED))
            if (other is not None and self.address in other._inbound
                    and not self.network.is_partitioned(self.address, peer)):
                other._connection_gone(_IN_PREFIX + self.address, CloseReason.DISCONNECTED)
            return True
        if peer.startswith(_IN_PREFIX) and peer[len(_IN_PREFIX) :] in self._inbound:
            dialler = peer[len(_IN_PREFIX) :]
            self._connection_gone(peer, CloseReason.DROPPED)
            other = self.network._endpoints.get(dialler)
            if (other is not None and self.address in other._dialled
                    and not self.network.is_partitioned(self.address, dialler)):
                other._connection_gone(self.address, CloseReason.DISCONNECTED)
            return True
        return False

    def peer_info(self, peer: str) -> PeerInfo | None:
        """The peer's address and its endpoint's ``principal``; None if not connected."""
        if peer in self._dialled:
            other = self.network._endpoints.get(peer)
            return PeerInfo(peer, other.principal if other is not None else None)
        if peer.startswith(_IN_PREFIX) and peer[len(_IN_PREFIX) :] in self._inbound:
            other = self.network._endpoints.get(peer[len(_IN_PREFIX) :])
            return PeerInfo(peer[len(_IN_PREFIX) :], other.principal if other is not None else None)
        return None

    def _connection_gone(self, peer: str, reason: str) -> None:
        """Our connection to ``peer`` ended (see :meth:`InprocNetwork.close_connection`)."""
        if peer.startswith(_IN_PREFIX):
            self._inbound.discard(peer[len(_IN_PREFIX) :])
            self._fail_queue(peer, SendFailure.UNREACHABLE)
        self._release_held(peer)
        self._events.append(PeerClosed(peer, reason))

    def _release_held(self, peer: str) -> None:
        if self.hold_after_drop:
            return
        keep = []
        for h in self._held:
            if h.peer == peer:
                h._held = False
            else:
                keep.append(h)
        self._held = keep

    def close(self, linger_s: float = 0.0) -> None:
        """Detach from the network. With ``linger_s > 0`` queued sends get one last delivery
        attempt first (delivery is instant here); what remains fails with ``closed``.
        Idempotent."""
        if isinstance(linger_s, bool) or not isinstance(linger_s, (int, float)) or not 0 <= linger_s < float("inf"):
            raise ValueError(f"linger_s must be a finite number >= 0, got {linger_s!r}")
        if self._closed:
            return
        if linger_s > 0:
            self.flush()
        self._closed = True
        for peer in list(self._queues):
            self._fail_queue(peer, SendFailure.CLOSED)
        self._inbox.clear()
        self._kernel.clear()
        self.complete()
        self.network._detach(self)

    # -- test controls -------------------------------------------------------------------------

    def complete(self, n: int | None = None) -> int:
        """Release held handles (oldest first) so that they report ``done``. Only matters with
        ``hold_completion=True``. Returns how many were released."""
        k = len(self._held) if n is None else min(n, len(self._held))
        for h in self._held[:k]:
            h._held = False
        del self._held[:k]
        return k

    def inbox_size(self) -> int:
        """Messages delivered to us and not yet received (those still in the kernel included)."""
        return len(self._inbox) + len(self._kernel)

    @property
    def closed(self) -> bool:
        """True after :meth:`close` (or :meth:`InprocNetwork.kill`)."""
        return self._closed

    def peers(self) -> list[str]:
        """Peer ids of the endpoints we dialled."""
        return list(self._dialled)

    # -- internals -----------------------------------------------------------------------------

    def _deliver(self, peer: str, dest: str, data: list[bytes], handle: SendHandle) -> bool:
        """Deliver or drop now (True), or report no room / nobody listening (False)."""
        net = self.network
        target = net._endpoints.get(dest)
        if target is None or target._closed:
            return False
        if target.rcvhwm is not None and len(target._inbox) >= target.rcvhwm:
            return False
        # As with zmq, the receiver learns about a dialler once its connection is up.
        if peer in self._dialled:
            target._inbound.add(self.address)
        if net.is_partitioned(self.address, dest):
            net.dropped += 1
        else:
            # We are the "in:" peer to anyone we dialled. To a peer that dialled us, we are
            # its dialled address.
            sender_id = _IN_PREFIX + self.address if peer in self._dialled else self.address
            wire = net._wire.get(dest)
            if wire is not None:
                wire.append((sender_id, data))
            else:
                (target._kernel if target.io_lag else target._inbox).append((sender_id, data))
                net.delivered += 1
        if self.hold_completion:
            handle._held = True
            self._held.append(handle)
        handle._mark_sent(())
        return True

    def _flush_peer(self, peer: str) -> None:
        queue = self._queues.get(peer)
        while queue:
            dest = peer if peer in self._dialled else peer[len(_IN_PREFIX) :]
            if peer not in self._dialled and dest not in self._inbound:
                self._fail_queue(peer, SendFailure.UNREACHABLE)
                return
            data, handle = queue[0]
            if not self._deliver(peer, dest, data, handle):
                return
            queue.popleft()
        self._queues.pop(peer, None)

    def _fail_queue(self, peer: str, error: str) -> None:
        queue = self._queues.pop(peer, None)
        for _, handle in queue or ():
            handle._mark_failed(error)

    def _wake_senders(self) -> None:
        # Room opened in our inbox: let senders that queued on our HWM move on. Zmq does
        # this in its I/O thread; here it happens synchronously, so tests stay deterministic.
        for other in list(self.network._endpoints.values()):
            if other is not self and other._queues:
                other.flush()

    def __repr__(self) -> str:
        return f"<InprocTransport {self.address} inbox={len(self._inbox)} pending={self.pending_sends()}>"
