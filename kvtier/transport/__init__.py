"""kvtier transport: multipart frames in, multipart frames out. No lifecycle decisions.

This package defines what every transport shares: the :class:`Transport` protocol,
:class:`SendHandle` and :class:`TransportError`. It also exports the real implementation,
:class:`ZmqTransport`. The in-memory double used by virtual-clock tests is
``kvtier.testing.inproc.InprocTransport``.

Peer ids are strings:
- ``"host:port"`` for a producer we dialled with :meth:`Transport.connect`.
- ``"in:<hex routing id>"`` (opaque) for a peer that dialled us.

Error policy: a send to a peer that is unknown, gone or closed never raises. It returns a handle
with ``failed=True`` and an ``error`` from :class:`SendFailure`. Exceptions are kept for local
bugs (bad arguments, ``ValueError``/``TypeError``) and for setup failures such as a port already
in use or ``connect()`` after ``close()`` (:class:`TransportError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Protocol, runtime_checkable

import attrs

from kvtier.errors import KvTierError

__all__ = [
    "Transport",
    "TransportEvent",
    "PeerClosed",
    "PeerInfo",
    "CloseReason",
    "SendHandle",
    "SendFailure",
    "TransportError",
    "DialNotAllowed",
    "NoServerKey",
    "NameNotResolved",
    "ZmqTransport",
]


class TransportError(KvTierError):
    """A transport could not be set up or used: bind failed (port in use), a bad endpoint, or
    ``connect()`` on a closed transport. Never raised for a peer that merely went away."""


class DialNotAllowed(TransportError):
    """``connect(..., vet=...)``: the name resolved to an address the caller's policy refuses;
    nothing was dialled."""


class NoServerKey(TransportError):
    """``connect()`` with CURVE: no certificate in ``auth_allowed_keys_dir`` names the endpoint,
    so the producer's key is unknown; nothing was dialled (an authentication setting, not a
    producer that is down)."""


class NameNotResolved(TransportError):
    """``connect()`` or ``lookup()``: the producer's host name did not resolve (no such name, or
    no DNS answer); nothing was dialled (a name or resolver setting, not a producer that is down)."""


class SendFailure:
    """Why a :class:`SendHandle` failed (``handle.error``). Plain strings."""

    UNKNOWN_PEER: Final = "unknown_peer"
    """The peer id was never connected, is malformed, or was disconnected before the send."""
    UNREACHABLE: Final = "unreachable"
    """The peer that dialled us is no longer connected (zmq ``EHOSTUNREACH``)."""
    DISCONNECTED: Final = "disconnected"
    """A queued send was dropped because :meth:`Transport.disconnect` was called for its peer."""
    CLOSED: Final = "closed"
    """The transport was closed before the frames could be sent."""
    ERROR: Final = "error"
    """Any other socket error. The handle's ``detail`` has the text."""


class SendHandle:
    """The fate of one ``send()``: queued, sent, failed, and whether its memory is free.

    The caller must not modify the frames' memory until :attr:`done` is True.

    Attributes:
        peer: the destination peer id.
    """

    __slots__ = ("peer", "_trackers", "_sent", "_error", "_detail", "_held")

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self._trackers: Sequence[Any] = ()
        self._sent = False
        self._error = ""
        self._detail = ""
        self._held = False

    @property
    def sent(self) -> bool:
        """True once the frames were handed to the socket (not necessarily delivered)."""
        return self._sent

    @property
    def failed(self) -> bool:
        """True if the frames will never be sent. See :attr:`error`."""
        return bool(self._error)

    @property
    def error(self) -> str:
        """``""`` or one of :class:`SendFailure`."""
        return self._error

    @property
    def detail(self) -> str:
        """Free text for logs when ``failed``."""
        return self._detail

    @property
    def done(self) -> bool:
        """True once the frames' memory may be reused.

        That is: the send failed (nothing references the frames any more), or the frames were
        sent and every zero-copy tracker has been released. It stays False while the send sits
        in the outbound queue.
        """
        if self._error:
            return True
        if not self._sent or self._held:
            return False
        return all(t.done for t in self._trackers)

    # -- for transport implementations only --

    def _mark_sent(self, trackers: Sequence[Any] = ()) -> None:
        self._sent = True
        self._trackers = trackers

    def _mark_failed(self, error: str, detail: str = "") -> None:
        self._error = error
        self._detail = detail

    def __repr__(self) -> str:
        state = f"failed={self._error}" if self._error else ("sent" if self._sent else "queued")
        return f"<SendHandle peer={self.peer!r} {state} done={self.done}>"


class CloseReason:
    """Why a :class:`PeerClosed` was reported (``event.reason``). Plain strings."""

    DISCONNECTED: Final = "disconnected"
    """The TCP connection closed or was reset (peer exit, network error, ZMTP heartbeat
    timeout, a frame over the size cap): the transport cannot tell these apart."""
    DROPPED: Final = "dropped"
    """We closed it: :meth:`Transport.drop_peer`."""
    IDLE_TIMEOUT: Final = "idle_timeout"
    """An accepted connection delivered no message within ``idle_timeout_s``."""
    REFUSED: Final = "refused"
    """A dial made with ``fail_fast=True`` never connected: the address refused it (nothing
    listens there) or is unreachable.  Reported once, at once; libzmq does not retry it."""
    CONNECT_TIMEOUT: Final = "connect_timeout"
    """A dial made with ``fail_fast=True`` got no answer within ``connect_timeout_s``."""
    AUTH_FAILED: Final = "auth_failed"
    """Our dial's CURVE handshake failed (only one side runs CURVE, or a key is not the one
    expected); ``detail`` says which, for the operator."""
    AUTH_REFUSED: Final = "auth_refused"
    """An inbound connection failed our CURVE handshake. It never had a peer id: ``peer`` is its
    remote ``ip:port`` when the transport could still read it, else ``""`` (for the log only), and
    ``detail`` says what most likely went wrong."""
    ALL: Final = frozenset({DISCONNECTED, DROPPED, IDLE_TIMEOUT, REFUSED, CONNECT_TIMEOUT, AUTH_FAILED, AUTH_REFUSED})
    DIAL_FAILED: Final = frozenset({REFUSED, CONNECT_TIMEOUT})
    """The reasons that mean a dial never connected (the session never had a connection)."""


@attrs.frozen(slots=True)
class PeerClosed:
    """The connection to or from ``peer`` is gone (reported once per connection).

    For a dialled producer, zmq reconnects on its own afterwards; the session above decides
    whether the session survives (it should not: messages in flight may be lost)."""

    peer: str
    reason: str
    """One of :class:`CloseReason`."""
    detail: str = ""
    """What most likely went wrong, for the operator (``auth_failed``, ``auth_refused``)."""


TransportEvent = PeerClosed
"""Everything :meth:`Transport.events` reports (one record type today)."""


@attrs.frozen(slots=True)
class PeerInfo:
    """Who a peer is, for logs and for authorisation.

    Attributes:
        address: the remote ``ip:port`` of a peer that dialled us (``getpeername``), or the
            ``host:port`` we dialled.
        principal: the authenticated name of the peer (CURVE: the name of the allowed
            certificate its key matched, or its z85 public key when no certificate names it);
            ``None`` when authentication is off. For a dialled producer: the name of the
            certificate whose key the producer had to prove it holds.
    """

    address: str
    principal: str | None


@runtime_checkable
class Transport(Protocol):
    """What the manager needs from a transport. See docs/design.md §Transport."""

    address: str
    """``"host:port"`` (or the in-memory address) this transport listens on."""

    def connect(self, address: str, *, fail_fast: bool = False, vet: Any = None,
                resolved: Sequence[str] | None = None) -> str:
        """Dial a producer at ``"host:port"``. Returns the peer id (``== address``). Idempotent.

        ``fail_fast``: a dial that never connects (refused, unreachable, no answer within the
        connect timeout) is reported as a :class:`PeerClosed` with a reason in
        :attr:`CloseReason.DIAL_FAILED` instead of being retried.  ``vet(host, port, ip)``: a
        hostname is resolved first and every address it resolves to vetted (a reason string
        refuses it: :class:`DialNotAllowed`); they are dialled in order, a fail_fast dial moving to
        the next when one fails before any connected (decision T20).  ``resolved``: what
        :meth:`lookup` returned for ``address`` (the name is not looked up again)."""
        ...

    def needs_lookup(self, address: str) -> bool:
        """Whether dialling ``address`` would block on a name lookup (its host is a name, not an
        address).  Never blocks."""
        ...

    def lookup(self, address: str, vet: Any = None) -> tuple[str, ...]:
        """The addresses to dial for ``address``, in order (pass them to :meth:`connect` as ``resolved``):
        blocks for the name lookup, touches no socket, safe on any thread.

        Raises:
            ValueError: ``address`` is not ``host:port``.
            TransportError: the name does not resolve.
            DialNotAllowed: ``vet`` refused an address the name resolves to."""
        ...

    def send(self, peer: str, frames: Sequence[Any], *, track: bool = False) -> SendHandle:
        """Send one multipart message. Never blocks; queues past the high-water mark."""
        ...

    def recv(self, max_messages: int = 1000) -> list[tuple[str, list[memoryview | bytes]]]:
        """Drain up to ``max_messages`` received messages without blocking."""
        ...

    def service(self, max_messages: int = 1000) -> tuple[list[tuple[str, list[memoryview | bytes]]], list[TransportEvent], bool]:
        """One non-blocking pass: up to ``max_messages`` received messages, every connection
        event, and whether every socket was read to empty (then everything that arrived before
        the pass began was returned)."""
        ...

    def barrier(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until whatever reads the connections on the
        transport's own threads has taken in what had arrived when the call began (True), so the
        next :meth:`service` that drains every socket returns it; False when that is not known
        within ``timeout_s``, or at once while a barrier that failed rests (decision T17).
        Optional: a transport without it gets no crossing (its late passes fire as before)."""
        ...

    def progress(self) -> list[str]:
        """The dialled peers whose connection received bytes since the last call — part of a
        message still arriving counts (decision T22): the core takes it as the peer heard.
        Optional: a transport without it is heard only by whole messages."""
        ...

    def wait(self, timeout_s: float) -> bool:
        """Block until something is readable, or the fd given to :meth:`set_wake` is (True), or
        ``timeout_s`` passes (False)."""
        ...

    def set_wake(self, fd: int | None) -> None:
        """Poll ``fd`` (the owner's wake-up eventfd) with the sockets in :meth:`wait`; never read
        it.  ``None`` stops."""
        ...

    def pending_sends(self) -> int:
        """Messages sitting in the outbound queues (not yet handed to a socket)."""
        ...

    def flush(self) -> None:
        """Try to move queued messages to their sockets, without blocking."""
        ...

    def disconnect(self, peer: str) -> None:
        """Forget a peer: close its dialled connection and fail its queued sends."""
        ...

    def events(self) -> list[TransportEvent]:
        """Connection events since the last call (oldest first), without blocking."""
        ...

    def drop_peer(self, peer: str, linger_s: float = 0.0) -> bool:
        """Force the connection to ``peer`` closed: everything queued to it is released
        (zero-copy sends complete) and our queued sends to it fail. False if unknown/gone.
        ``linger_s`` > 0: nothing more is sent to ``peer``, but what was sent before (a goodbye)
        gets up to that long to leave before the cut."""
        ...

    def peer_info(self, peer: str) -> PeerInfo | None:
        """Remote address and authenticated principal of ``peer``; None if unknown."""
        ...

    def close(self, linger_s: float = 0.0) -> None:
        """Close everything, first giving queued sends up to ``linger_s`` seconds to leave.
        Idempotent, never blocks longer than ``linger_s`` (plus a few ms)."""
        ...


# Imported last: zmq_transport (and the zmq_* modules it is built from) import the names above
# from this package.
from kvtier.transport.zmq_transport import ZmqTransport  # noqa: E402
