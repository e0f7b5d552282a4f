"""ZeroMQ transport: one ROUTER we listen on, plus one DEALER per producer we dial.

Why this shape (more in docs/protocol.md):
- A consumer dials each producer once, with a DEALER. The producer's ROUTER answers on that same
  TCP connection, so there is one connection per consumer→producer pair. The producer never dials
  an address a client gave it.
- ``ROUTER_MANDATORY=1``: a send to a peer that has gone raises ``EHOSTUNREACH``, which we report
  as a failed :class:`SendHandle`, instead of libzmq dropping it silently.
- Each DEALER sets a random ``ROUTING_ID``; the ROUTER keeps ``ROUTER_HANDOVER=0``: a routing id
  speaks for one TCP connection only (decision T10).  A consumer never reconnects a session's
  DEALER (its first ``DISCONNECTED`` ends the session and closes the DEALER; the next session
  dials a new one), so a second connection claiming a live routing id is refused by libzmq.
- ZMTP heartbeats find a frozen or vanished peer (TCP keepalive is off by default). The reconnect
  interval backs off up to ``reconnect_ivl_max_s``. ``LINGER=0`` everywhere, so ``close()``
  never hangs.

Sends never block: every send uses ``NOBLOCK``. On ``zmq.Again`` (high-water mark reached) the
message joins a per-peer FIFO that :meth:`ZmqTransport.flush`, :meth:`~ZmqTransport.recv` and
:meth:`~ZmqTransport.wait` drain in order. With ``track=True``, frames of at least
``zero_copy_threshold`` bytes go out zero-copy with a ``zmq.MessageTracker``. The handle's ``done``
turns True when libzmq releases them. (pyzmq finishes trackers on its own process-wide
"garbage collector" thread, started on the first zero-copy send. It is not ours and outlives
every transport.)

Connection events (:meth:`ZmqTransport.events`): every socket has a libzmq *socket monitor*
(an inproc PAIR we read). For the ROUTER, the monitor reports ``ACCEPTED``/``DISCONNECTED`` with
the connection's file descriptor, and every received message carries the fd it came in on
(``zmq.SRCFD``); joining the two maps a TCP connection to the routing id (peer id) it speaks
for. (``ZMQ_ROUTER_NOTIFY`` would do this directly but is a draft option this libzmq lacks.)
``SRCFD`` is an fd *number*, and a ROUTER keeps a closed connection's unread messages: they may
be read after the number was taken by a newer connection (a reader that fell behind: a stall,
SIGSTOP, a long engine step).  So records are made only from ``EVENT_ACCEPTED``, never from a
message, and a routing id binds to a connection **once**, by the first message ever read from
it: a message from a routing id that was bound before (its connection closed, or it is bound to
another fd) is a leftover of that connection — delivered, but it changes no record.  A first
message from a connection that closed before anything of it was read is delivered followed by
its ``PeerClosed`` (a leftover ``hello`` must not open a session nothing will ever end).
Residual, accepted: the *first* message of an old connection read after its fd number was
reused and before the new connection's first message binds the new record to the old id; the
record is then marked ambiguous and never shut down on anyone's behalf (decision T10).

:meth:`ZmqTransport.drop_peer` cuts one peer that dialled us: ``shutdown(SHUT_RDWR)`` on a
``dup`` of its fd (a ROUTER has no per-peer close). The dup pins the open socket, and its
``getpeername()`` is compared with the one recorded at accept time first, so a number that
libzmq closed and reused meanwhile is never shut down. Residual race, accepted: if the peer's
connection closed and *the same remote ip:port* reconnected onto the *same fd number* between
our last monitor drain and the dup, the new connection of that same remote endpoint is cut.

Not thread-safe: one transport belongs to one I/O loop thread.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import secrets
import socket
import struct
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from kvtier.transport import (
    CloseReason,
    PeerClosed,
    PeerInfo,
    SendFailure,
    SendHandle,
    DialNotAllowed,
    TransportError,
    TransportEvent,
)
from kvtier.transport.curve import ZAP_DOMAIN, CurveSettings, PrincipalAuthenticator


__all__ = ["ZmqTransport", "parse_address"]

_IN_PREFIX = "in:"
_MAX_HEARTBEAT_TTL_MS = 6_553_500


def parse_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` (or ``"[v6]:port"``) into ``(host, port)``.

    Raises:
        ValueError: not ``host:port`` with a port in 1..65535.
    """
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"address must be 'host:port', got {address!r}")
    host, _, port_s = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise ValueError(f"address must be 'host:port' with port 1..65535, got {address!r}")
    return host, int(port_s)


def _endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _seconds_to_ms(name: str, value: float, *, maximum_ms: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or value * 1000 > maximum_ms:
        raise ValueError(f"{name} must be in [0, {maximum_ms / 1000}] s, got {value}")
    return int(round(value * 1000))


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


_ROUTER_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
# CONNECTED and CLOSED: a CLOSED before the dial's first CONNECTED is a connect attempt that
# failed (refused, unreachable, or ZMQ_CONNECT_TIMEOUT); reported only for fail_fast dials.
_DEALER_EVENTS = (zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED | zmq.EVENT_CLOSED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
# What a failed handshake to a producer most likely means, for the operator (the session itself
# ends as peer_disconnected on the DISCONNECTED that follows).  libzmq reports a key problem as
# AUTH or NO_DETAIL depending on timing, so both get the one text naming both places to check.
_KEY_PROBLEM = ("the CURVE handshake failed: either it does not accept our key (is our public certificate in its "
                "auth_allowed_keys_dir?) or the key we hold for it (the certificate in our auth_allowed_keys_dir that "
                "names this endpoint) is not its key, or it does not run auth='curve'")
_HANDSHAKE_FAILED = {
    int(zmq.EVENT_HANDSHAKE_FAILED_AUTH): _KEY_PROBLEM,
    int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL): _KEY_PROBLEM,
    int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL): "it does not speak our ZMTP/CURVE (a plain-TCP or other service?)",
}
log = logging.getLogger("kvtier.transport")
_CURVE_OVERHEAD = 256  # bytes a CURVE MESSAGE command adds to a frame (libzmq: 33), with room
_MAX_EVENTS = 65536  # undrained events beyond this drop the oldest (an owner that never reads)
_MON_HEADER = struct.Struct("=HI")  # libzmq monitor frame 0: event id (u16), value (u32)
# Plain ints for the per-message socket calls: pyzmq turns an enum member into its option/flag
# enum on every call (~0.6 µs each; a request makes dozens of them on each side).
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


def _resolve_vetted(host: str, port: int, vet: Any) -> str:
    """``host`` itself if it is an IP literal; else the first address it resolves to, once
    ``vet`` accepted every one (see :meth:`ZmqTransport.connect`)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return host if (why := vet(host, port, host)) is None else _refuse(why)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise TransportError(f"cannot resolve {host}: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for ip in addresses:
        why = vet(host, port, ip)
        if why is not None:
            _refuse(why)
    if not addresses:
        raise TransportError(f"{host} resolves to no address")
    return addresses[0]


def _refuse(why: str) -> str:
    raise DialNotAllowed(why)


def _peername(fd: int) -> str:
    """``ip:port`` of the remote end of socket ``fd`` ("" if it is not a connected socket)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return ""
    try:
        return _fmt_sockaddr(s.getpeername())
    except OSError:
        return ""
    finally:
        s.close()


def _fmt_sockaddr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr)


class _Conn:
    """One TCP connection accepted by the ROUTER, keyed by its fd."""

    __slots__ = ("fd", "peername", "accepted", "rid", "principal", "dropped", "ambiguous")

    def __init__(self, fd: int, peername: str, accepted: float) -> None:
        self.fd = fd
        self.peername = peername
        self.accepted = accepted
        self.rid: bytes | None = None
        self.principal: str | None = None
        self.dropped = False
        self.ambiguous = False  # two never-seen routing ids spoke first on this fd number


#: Routing ids whose connection closed, remembered (oldest forgotten first) so that their
#: leftover messages never bind a newer connection that reused the fd number.
_MAX_SPENT = 65536


class _Pending:
    """One queued multipart message waiting for room below the high-water mark."""

    __slots__ = ("frames", "track", "handle")

    def __init__(self, frames: list[Any], track: bool, handle: SendHandle) -> None:
        self.frames = frames
        self.track = track
        self.handle = handle


class ZmqTransport:
    """Transport over ZeroMQ TCP (see module docstring).

    Args:
        bind_host: interface to listen on (``"127.0.0.1"``, ``"0.0.0.0"``, ``"::1"``, ...).
        port: TCP port, or 0 for an ephemeral one (read it back from :attr:`port`).
        sndhwm / rcvhwm: high-water marks, in messages, per peer connection. Past ``sndhwm`` sends
            queue in our per-peer FIFO instead of blocking.
        heartbeat_ivl_s: ZMTP PING interval in seconds. 0 turns heartbeats off.
        heartbeat_timeout_s: seconds without traffic after a PING before the connection is
            dropped (> 0).
        heartbeat_ttl_s: seconds the *remote* side waits for traffic before dropping us
            (resolution 0.1 s; values above 6553.5 s are clamped to it).
        reconnect_ivl_s / reconnect_ivl_max_s: first reconnect delay and exponential-backoff
            ceiling, in seconds, for dialled peers.
        zero_copy_threshold: frames of at least this many bytes are sent zero-copy when
            ``track=True``, and returned as ``memoryview`` (not ``bytes``) by :meth:`recv`.
        max_frame_bytes: a producer we dialled that sends a frame larger than this is
            disconnected by libzmq (``ZMQ_MAXMSGSIZE``, per frame, checked before the frame is
            received). ``None`` means no limit.
        max_accepted_frame_bytes: the same cap for peers that dialled us (the ROUTER). Defaults
            to ``max_frame_bytes``. A producer only receives control messages, so the manager
            sets it to ``max_message_bytes``.
        io_threads: libzmq I/O threads for this transport's context.
        connect_timeout_s: a TCP connect to a producer that gets no answer within this is
            abandoned and retried after the reconnect interval (``ZMQ_CONNECT_TIMEOUT``;
            without it a dropped SYN waits out the kernel's ~2 min). 0 turns it off.
        handshake_ivl_s: a connection must finish the ZMTP (and CURVE) handshake within this
            (``ZMQ_HANDSHAKE_IVL``). 0 turns it off.
        idle_timeout_s: an accepted connection that delivers no message within this many
            seconds is cut (connections that never say hello). ``None`` turns it off.
        curve: CURVE keys (see :mod:`kvtier.transport.curve`); ``None`` means plain TCP.

    Raises:
        TransportError: the bind failed (port in use, bad host).
        ValueError: an argument is out of range.
    """

    def __init__(
        self,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        *,
        sndhwm: int = 1000,
        rcvhwm: int = 1000,
        heartbeat_ivl_s: float = 1.0,
        heartbeat_timeout_s: float = 5.0,
        heartbeat_ttl_s: float = 5.0,
        reconnect_ivl_s: float = 0.1,
        reconnect_ivl_max_s: float = 2.0,
        zero_copy_threshold: int = 65536,
        max_frame_bytes: int | None = None,
        max_accepted_frame_bytes: int | None = None,
        io_threads: int = 1,
        connect_timeout_s: float = 2.0,
        handshake_ivl_s: float = 10.0,
        idle_timeout_s: float | None = None,
        curve: CurveSettings | None = None,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0..65535, got {port!r}")
        if not isinstance(bind_host, str) or not bind_host:
            raise ValueError(f"bind_host must be a non-empty str, got {bind_host!r}")
        self._opts: dict[int, int] = {
            zmq.LINGER: 0,
            zmq.SNDHWM: _positive_int("sndhwm", sndhwm),
            zmq.RCVHWM: _positive_int("rcvhwm", rcvhwm),
            zmq.RECONNECT_IVL: _seconds_to_ms("reconnect_ivl_s", reconnect_ivl_s),
            zmq.RECONNECT_IVL_MAX: _seconds_to_ms("reconnect_ivl_max_s", reconnect_ivl_max_s),
            zmq.MAXMSGSIZE: -1 if max_frame_bytes is None else _positive_int(
                "max_frame_bytes", max_frame_bytes
            ),
            zmq.HANDSHAKE_IVL: _seconds_to_ms("handshake_ivl_s", handshake_ivl_s),
        }
        self._connect_timeout_ms = _seconds_to_ms("connect_timeout_s", connect_timeout_s)
        self._router_maxmsg = self._opts[zmq.MAXMSGSIZE] if max_accepted_frame_bytes is None else (
            _positive_int("max_accepted_frame_bytes", max_accepted_frame_bytes)
        )
        if idle_timeout_s is not None:
            _seconds_to_ms("idle_timeout_s", idle_timeout_s)
            if idle_timeout_s <= 0:
                raise ValueError(f"idle_timeout_s must be > 0 or None, got {idle_timeout_s}")
        self._idle_timeout_s = idle_timeout_s
        if curve is not None and not isinstance(curve, CurveSettings):
            raise ValueError(f"curve must be a CurveSettings or None, got {type(curve).__name__}")
        self._curve = curve
        if curve is not None:
            # libzmq applies ZMQ_MAXMSGSIZE to the encrypted CURVE frame, which is a few dozen
            # bytes longer than the payload: the caps above count payload bytes.
            if self._opts[zmq.MAXMSGSIZE] > 0:
                self._opts[zmq.MAXMSGSIZE] += _CURVE_OVERHEAD
            if self._router_maxmsg > 0:
                self._router_maxmsg += _CURVE_OVERHEAD
        ivl = _seconds_to_ms("heartbeat_ivl_s", heartbeat_ivl_s)
        if ivl:
            timeout_ms = _seconds_to_ms("heartbeat_timeout_s", heartbeat_timeout_s)
            if timeout_ms <= 0:
                raise ValueError(f"heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s}")
            self._opts[zmq.HEARTBEAT_IVL] = ivl
            self._opts[zmq.HEARTBEAT_TIMEOUT] = timeout_ms
            # libzmq carries the TTL in deciseconds in a 16-bit field (at most 6553.5 s). Longer
            # values, e.g. a generous peer_timeout_s from the config, are clamped rather than
            # refused: the TTL is only a hint to the remote side.
            self._opts[zmq.HEARTBEAT_TTL] = min(
                _seconds_to_ms("heartbeat_ttl_s", heartbeat_ttl_s), _MAX_HEARTBEAT_TTL_MS
            )
        self._zc_threshold = _positive_int("zero_copy_threshold", zero_copy_threshold)
        self._ipv6 = ":" in bind_host

        self._ctx = zmq.Context(_positive_int("io_threads", io_threads))
        self._ctx.linger = 0  # default for every socket of this context, belt and braces
        self._closed = False
        self._dealers: dict[str, zmq.Socket] = {}
        self._queues: dict[str, deque[_Pending]] = {}
        self._npending = 0
        self._poller: zmq.Poller | None = None
        self._rr = 0  # round-robin start offset for recv() fairness
        self._events: deque[TransportEvent] = deque(maxlen=_MAX_EVENTS)
        self._conns: dict[int, _Conn] = {}  # ROUTER connections by fd
        self._rid_fd: dict[bytes, int] = {}  # routing id -> fd of its connection (bound once)
        self._spent: dict[bytes, None] = {}  # routing ids whose connection closed (bounded)
        self._unbound: dict[int, _Conn] = {}  # accepted, no message yet (accept order)
        self._dealer_mons: dict[str, zmq.Socket] = {}
        self._dialling: dict[str, float] = {}  # fail_fast dials not connected yet -> when dialled
        self._dealer_peer: dict[zmq.Socket, str] = {}  # DEALER -> the address it dials
        self._mon_peer: dict[zmq.Socket, str] = {}  # a DEALER's monitor -> that address
        self._mon_set: frozenset[zmq.Socket] | None = None
        self._mon_n = 0
        self._auth: PrincipalAuthenticator | None = None
        self.idle_dropped = 0
        """Accepted connections cut by ``idle_timeout_s`` (a counter)."""
        self.handshake_failures: set[tuple[str, int]] = set()
        """``(producer address, libzmq EVENT_HANDSHAKE_FAILED_*)`` seen on our dials (each logged once)."""
        self._router: zmq.Socket | None = None
        self._rmon: zmq.Socket | None = None
        try:
            if curve is not None:
                # The ZAP handler must exist before the first connection is accepted.
                self._auth = PrincipalAuthenticator(self._ctx, curve.allowed, curve.allowed_dir)
                self._auth.start()
            self._router = self._socket(zmq.ROUTER, ipv6=self._ipv6)
            self._router.setsockopt(zmq.MAXMSGSIZE, self._router_maxmsg)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.setsockopt(zmq.ROUTER_HANDOVER, 0)  # one routing id, one connection (T10)
            if curve is not None:
                self._router.curve_server = True
                self._router.curve_secretkey = curve.identity.secret
                self._router.curve_publickey = curve.identity.public
                self._router.zap_domain = ZAP_DOMAIN.encode()
            self._rmon = self._monitor(self._router, _ROUTER_EVENTS)
            self._router.bind(_endpoint(bind_host, port or "*"))
            endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException as exc:
            # Never leak a context (and its threads) from a failed constructor.
            self._teardown()
            self._closed = True
            if isinstance(exc, zmq.ZMQError):
                raise TransportError(f"cannot listen on {bind_host}:{port}: {exc}") from exc
            raise
        self.port: int = int(endpoint.rpartition(":")[2])
        """The TCP port we listen on (the real one when ``port=0`` was asked for)."""
        self.address: str = f"[{bind_host}]:{self.port}" if self._ipv6 else f"{bind_host}:{self.port}"
        """``"host:port"`` we listen on. Give it to consumers as ``remote_host``/``remote_port``."""

    # -- setup ---------------------------------------------------------------------------------

    def _socket(self, kind: int, *, ipv6: bool) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        try:
            for opt, val in self._opts.items():
                sock.setsockopt(opt, val)
            if ipv6:
                sock.setsockopt(zmq.IPV6, 1)
            # Our threshold decides zero-copy, not pyzmq's default (also 64 KiB).
            sock.copy_threshold = self._zc_threshold
        except BaseException:
            sock.close(linger=0)
            raise
        return sock

    def connect(self, address: str, *, fail_fast: bool = False, vet: Any = None) -> str:
        """Dial a producer. zmq reconnects by itself if the producer restarts on the same port.

        Connecting is asynchronous: sends made before the TCP handshake completes wait in the
        DEALER's pipe (up to ``sndhwm``) and then in our queue.

        Args:
            address: ``"host:port"`` (``"[v6]:port"`` for IPv6).
            fail_fast: the first connect attempt that fails is reported: a refused or
                unreachable address at once, as ``PeerClosed(address, "refused")`` (the
                monitor's ``CLOSED`` before any ``CONNECTED``, typically within a millisecond),
                one that does not answer within ``connect_timeout_s`` as ``PeerClosed(address,
                "connect_timeout")``; the caller then closes the dial.  (Not
                ``ZMQ_RECONNECT_STOP``: with it libzmq drops the messages a connection delivered
                but the application had not read yet when that connection closes — a producer's
                goodbye among them.)  Without it a dial made before the producer listens simply
                waits for it.
            vet: ``vet(host, port, ip) -> reason | None``.  With it, a hostname is resolved
                here (``getaddrinfo``, blocking), every address vetted, and the first one dialled,
                so no later resolution can differ from the one vetted.

        Returns:
            The peer id, equal to ``address``. Calling it again for the same address returns the
            same id and opens nothing new.

        Raises:
            ValueError: ``address`` is not ``host:port``.
            TransportError: the transport is closed, zmq refused the endpoint, or the name does
                not resolve.
            DialNotAllowed: ``vet`` refused an address the name resolves to.
        """
        if self._closed:
            raise TransportError("connect() on a closed transport")
        if address in self._dealers:
            return address
        # what happened to an earlier connection to this address is history now: its events must
        # not be read as news about the new one
        self._events = deque((e for e in self._events if e.peer != address), maxlen=_MAX_EVENTS)
        host, port = parse_address(address)
        dial_host = host if vet is None else _resolve_vetted(host, port, vet)
        server_key = None
        if self._curve is not None:
            server_key = self._curve.allowed.server_key_for(host, port)
            if server_key is None:
                # Never dial with a key the network could choose for us.
                raise TransportError(
                    f"cannot connect to {address}: no certificate in auth_allowed_keys_dir names "
                    "this endpoint (metadata endpoints), so the producer's key is unknown"
                )
        sock = mon = None
        try:
            sock = self._socket(zmq.DEALER, ipv6=":" in host)
            # Random, stable identity: the producer keeps seeing the same peer id across our
            # reconnects. A leading 0 byte is reserved by libzmq for generated ids.
            sock.setsockopt(zmq.ROUTING_ID, b"k" + secrets.token_bytes(15))
            if self._connect_timeout_ms:
                sock.setsockopt(zmq.CONNECT_TIMEOUT, self._connect_timeout_ms)
            if self._curve is not None:
                sock.curve_serverkey = server_key
                sock.curve_publickey = self._curve.identity.public
                sock.curve_secretkey = self._curve.identity.secret
            mon = self._monitor(sock, _DEALER_EVENTS)
            sock.connect(_endpoint(dial_host, port))
        except zmq.ZMQError as exc:
            for x in (mon, sock):
                if x is not None:
                    x.close(linger=0)
            raise TransportError(f"cannot connect to {address}: {exc}") from exc
        self._dealers[address] = sock
        self._dealer_mons[address] = mon
        if fail_fast:
            self._dialling[address] = time.monotonic()
        self._dealer_peer[sock] = address
        self._mon_peer[mon] = address
        self._poller = None
        self._mon_set = None
        return address

    def _monitor(self, sock: zmq.Socket, events: int) -> zmq.Socket:
        """A PAIR that receives ``sock``'s monitor events. Unbounded on our side, so a flood of
        connections cannot make libzmq drop (and us miss) a ``DISCONNECTED``."""
        self._mon_n += 1
        addr = f"inproc://kvtier-mon-{id(self):x}-{self._mon_n}"
        sock.monitor(addr, events)
        mon = self._ctx.socket(zmq.PAIR)
        try:
            mon.setsockopt(zmq.LINGER, 0)
            mon.setsockopt(zmq.RCVHWM, 0)
            mon.connect(addr)
        except BaseException:
            mon.close(linger=0)
            raise
        return mon

    # -- send ----------------------------------------------------------------------------------

    def send(self, peer: str, frames: Sequence[Any], *, track: bool = False) -> SendHandle:
        """Send one multipart message to ``peer``. Never blocks and never raises for peer
        conditions.

        Args:
            peer: a peer id from :meth:`connect` or from :meth:`recv`.
            frames: non-empty sequence of buffers (bytes, bytearray, memoryview, numpy array,
                zmq.Frame). Do not modify their memory until the handle is ``done``.
            track: True → frames of at least ``zero_copy_threshold`` bytes are sent zero-copy,
                and ``done`` waits until libzmq releases them. False → every frame is copied
                into zmq when it is sent.

        Returns:
            A :class:`SendHandle`. It is sent, queued (sent later by flush/recv/wait, in FIFO
            order per peer), or failed (unknown or departed peer, transport closed).

        Raises:
            ValueError: ``frames`` is empty or a frame is not a contiguous buffer (a caller bug).
        """
        frames = _check_frames(frames)
        handle = SendHandle(peer)
        if self._closed:
            handle._mark_failed(SendFailure.CLOSED)
            return handle
        target = self._resolve(peer)
        if target is None:
            handle._mark_failed(SendFailure.UNKNOWN_PEER, f"no such peer {peer!r}")
            return handle
        if target[1] is not None and self._is_dropped(target[1]):
            handle._mark_failed(SendFailure.DISCONNECTED, f"{peer!r} was dropped")
            return handle
        queue = self._queues.get(peer)
        if queue:  # keep per-peer FIFO order: never overtake queued messages
            queue.append(_Pending(frames, track, handle))
            self._npending += 1
            self._flush_peer(peer)
            return handle
        if not self._try_send(target, frames, track, handle):
            self._queues.setdefault(peer, deque()).append(_Pending(frames, track, handle))
            self._npending += 1
        return handle

    def _resolve(self, peer: str) -> tuple[zmq.Socket, bytes | None] | None:
        """Socket and ROUTER routing id for a peer id, or None if it cannot exist."""
        sock = self._dealers.get(peer)
        if sock is not None:
            return sock, None
        if isinstance(peer, str) and peer.startswith(_IN_PREFIX):
            try:
                rid = bytes.fromhex(peer[len(_IN_PREFIX) :])
            except ValueError:
                return None
            if 0 < len(rid) <= 255:
                return self._router, rid
        return None

    def _is_dropped(self, rid: bytes) -> bool:
        conn = self._conns.get(self._rid_fd.get(rid, -1))
        return conn is not None and conn.dropped

    def _try_send(
        self,
        target: tuple[zmq.Socket, bytes | None],
        frames: list[Any],
        track: bool,
        handle: SendHandle,
    ) -> bool:
        """One NOBLOCK attempt. Returns False only for zmq.Again before any frame left (queue
        it). Otherwise the handle is marked sent or failed and True is returned."""
        sock, rid = target
        parts = frames if rid is None else [rid, *frames]
        last = len(parts) - 1
        trackers = []
        i = 0
        try:
            for i, part in enumerate(parts):
                flags = zmq.NOBLOCK | (zmq.SNDMORE if i < last else 0)
                if track and (rid is None or i > 0) and memoryview(part).nbytes >= self._zc_threshold:
                    trackers.append(sock.send(part, flags, copy=False, track=True))
                else:
                    sock.send(part, flags, copy=True)
        except zmq.Again:
            if i == 0:
                return False
            # libzmq counts the HWM in whole messages, so this should be impossible. If it
            # happens anyway, the peer got a truncated message that its decoder will reject.
            handle._mark_failed(SendFailure.ERROR, "EAGAIN in the middle of a multipart message")
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                handle._mark_failed(SendFailure.UNREACHABLE, str(exc))
            elif exc.errno in (zmq.ENOTSOCK, zmq.ETERM):
                handle._mark_failed(SendFailure.CLOSED, str(exc))
            else:
                handle._mark_failed(SendFailure.ERROR, str(exc))
        else:
            handle._mark_sent(trackers)
        return True

    def pending_sends(self) -> int:
        """Messages waiting in the per-peer outbound queues."""
        return self._npending

    def flush(self) -> None:
        """Move queued messages to their sockets in FIFO order, until each peer hits its HWM.
        Never blocks."""
        self._flush_all()

    def _flush_all(self) -> int:
        if not self._npending:
            return 0
        moved = 0
        for peer in list(self._queues):
            moved += self._flush_peer(peer)
        return moved

    def _flush_peer(self, peer: str) -> int:
        queue = self._queues.get(peer)
        if not queue:
            self._queues.pop(peer, None)
            return 0
        target = self._resolve(peer)
        moved = 0
        while queue:
            head = queue[0]
            if target is None:
                head.handle._mark_failed(SendFailure.UNKNOWN_PEER, f"no such peer {peer!r}")
            elif not self._try_send(target, head.frames, head.track, head.handle):
                break
            queue.popleft()
            self._npending -= 1
            moved += 1
            if head.handle.failed and head.handle.error == SendFailure.UNREACHABLE:
                # The peer is gone, so everything behind this message would fail the same way.
                self._fail_queue(peer, SendFailure.UNREACHABLE, head.handle.detail)
                return moved
        if not queue:
            del self._queues[peer]
        return moved

    def _fail_queue(self, peer: str, error: str, detail: str = "") -> None:
        queue = self._queues.pop(peer, None)
        if queue:
            for p in queue:
                p.handle._mark_failed(error, detail)
            self._npending -= len(queue)

    # -- receive -------------------------------------------------------------------------------

    def recv(self, max_messages: int = 1000) -> list[tuple[str, list[memoryview | bytes]]]:
        """Drain received messages without blocking. Flushes queued sends first.

        Sockets are served round-robin, one message at a time, so a busy peer cannot starve
        the others.

        Args:
            max_messages: upper bound on messages returned, >= 1.

        Returns:
            ``[(peer, frames), ...]`` in arrival order per peer. Frames shorter than
            ``zero_copy_threshold`` are ``bytes``. Longer ones are read-only ``memoryview``
            objects over zmq's buffer (no copy), which stay valid while referenced. ``[]`` after
            ``close()``.

        Raises:
            ValueError: ``max_messages`` is not an int >= 1.
        """
        max_messages = _positive_int("max_messages", max_messages)
        if self._closed:
            return []
        self._service()
        self._flush_all()
        socks: list[tuple[zmq.Socket, str | None]] = [(self._router, None)]
        socks.extend((s, p) for p, s in self._dealers.items())
        # Rotate the start so that with a small max_messages every socket gets its turn.
        k = self._rr % len(socks)
        self._rr += 1
        active = socks[k:] + socks[:k]
        out: list[tuple[str, list[memoryview | bytes]]] = []
        threshold = self._zc_threshold
        while active and len(out) < max_messages:
            for entry in list(active):
                sock, peer = entry
                try:
                    # ZMQ_EVENTS first: an empty socket costs a flag read, not a raised zmq.Again
                    if not sock.get(_EVENTS) & _POLLIN:
                        active.remove(entry)
                        continue
                    parts = sock.recv_multipart(_NOBLOCK, copy=False)
                except zmq.ZMQError:  # Again (raced), or a socket error: skip it this round
                    active.remove(entry)
                    continue
                if peer is None:
                    rid = parts[0].bytes
                    if not self._from_connection(parts[0], rid) or len(parts) < 2:
                        continue
                    peer = _IN_PREFIX + rid.hex()
                    parts = parts[1:]
                out.append(
                    (peer, [p.bytes if len(p) < threshold else p.buffer for p in parts])
                )
                if len(out) >= max_messages:
                    break
        return out

    def service(self, max_messages: int = 1000) -> tuple[list[tuple[str, list[memoryview | bytes]]], list[TransportEvent], bool]:
        """One non-blocking pass over what the poller reports readable: monitors first (their
        connection events), then the data sockets, round-robin, until each is empty or
        ``max_messages`` were read.  Also flushes queued sends and cuts accepted connections
        whose idle time is up.  Sockets the poller does not report are not touched.

        Returns:
            ``(messages, events, drained)``: messages as :meth:`recv` returns them, events as
            :meth:`events` does, and whether every socket was read to empty in this pass (then
            everything that arrived before the pass began has been returned).
        """
        max_messages = _positive_int("max_messages", max_messages)
        if self._closed:
            return [], [], True
        if self._npending:
            self._flush_all()
        poller = self._poller if self._poller is not None else self._build_poller(set())
        try:
            ready = poller.poll(0)
        except zmq.ZMQError:
            return [], [], True
        data: list[tuple[zmq.Socket, str | None]] = []
        if ready:
            rmon, dmons = self._rmon, self._mon_peer
            for sock, ev in ready:
                if sock is rmon:
                    self._drain_router_monitor()
                elif sock in dmons:
                    self._drain_dealer_monitor(dmons[sock])
                elif ev & _POLLIN:
                    data.append((sock, None if sock is self._router else self._dealer_peer[sock]))
        if self._idle_timeout_s is not None and self._unbound:
            self._cut_idle()
        out: list[tuple[str, list[memoryview | bytes]]] = []
        drained = True
        if data:
            drained = self._read(data, max_messages, out)
        events: list[TransportEvent] = []
        if self._events:
            events = list(self._events)
            self._events.clear()
        return out, events, drained

    def _read(self, active: list[tuple[zmq.Socket, str | None]], max_messages: int,
              out: list[tuple[str, list[memoryview | bytes]]]) -> bool:
        """Read ``active`` sockets round-robin into ``out``; True when every one is empty."""
        threshold = self._zc_threshold
        while active:
            for entry in list(active):
                if len(out) >= max_messages:
                    return False
                sock, peer = entry
                try:
                    parts = sock.recv_multipart(_NOBLOCK, copy=False)
                except zmq.ZMQError:  # Again: empty now (or a socket error: skip it this pass)
                    active.remove(entry)
                    continue
                if peer is None:
                    rid = parts[0].bytes
                    if not self._from_connection(parts[0], rid) or len(parts) < 2:
                        continue
                    peer = _IN_PREFIX + rid.hex()
                    parts = parts[1:]
                out.append((peer, [p.bytes if len(p) < threshold else p.buffer for p in parts]))
        return True

    def _cut_idle(self) -> None:
        cutoff = time.monotonic() - self._idle_timeout_s  # type: ignore[operator]
        for fd, conn in list(self._unbound.items()):
            if conn.accepted > cutoff:
                break  # accept order: the rest are younger
            del self._unbound[fd]
            if self._shutdown_conn(conn):
                conn.dropped = True
                self.idle_dropped += 1

    def _from_connection(self, frame: zmq.Frame, rid: bytes) -> bool:
        """Bind ``rid`` to the connection (fd) ``frame`` came in on, the first time it speaks.
        False: drop the message (it comes from a connection we dropped).  See the module
        docstring for why a routing id binds once and leftovers change nothing."""
        try:
            fd = frame.get(zmq.SRCFD)
        except zmq.ZMQError:  # pragma: no cover - every TCP frame has a source fd
            return True
        conn = self._conns.get(fd)
        if conn is not None and conn.rid == rid:
            return not conn.dropped
        # The monitor may not have told us about this fd (or its reuse) yet; it has by now.
        self._drain_router_monitor()
        conn = self._conns.get(fd)
        if conn is not None and conn.rid == rid:
            return not conn.dropped
        if rid in self._rid_fd or rid in self._spent:
            # a leftover of a connection that closed (or is bound to another fd): deliver it
            # unless that connection was dropped by us; it changes no record
            own = self._conns.get(self._rid_fd.get(rid, -1))
            return not (own is not None and own.dropped)
        if conn is None or conn.rid is not None:
            self._spend(rid)
            if conn is None:
                # its connection closed before anything of it was read: nothing will report
                # that close, so report it after this message
                self._events.append(PeerClosed(_IN_PREFIX + rid.hex(), CloseReason.DISCONNECTED))
            else:
                conn.ambiguous = True  # which of the two ids is the live one is unknown
            return True
        if conn.dropped:
            return False
        conn.rid = rid
        self._unbound.pop(fd, None)
        self._rid_fd[rid] = fd
        if self._curve is not None:
            try:
                conn.principal = frame.get("User-Id")
            except zmq.ZMQError:  # pragma: no cover - libzmq sets it after ZAP
                conn.principal = None
        return True

    def _spend(self, rid: bytes) -> None:
        self._spent[rid] = None
        if len(self._spent) > _MAX_SPENT:
            del self._spent[next(iter(self._spent))]

    # -- connection events ---------------------------------------------------------------------

    def events(self) -> list[TransportEvent]:
        """Connection events since the last call, oldest first. Never blocks.

        Returns:
            :class:`~kvtier.transport.PeerClosed` records: one per connection of a known peer
            that closed or reset (``disconnected``), was cut by :meth:`drop_peer`
            (``dropped``). A connection that never delivered a message has no peer id and is
            reported by nothing (see :attr:`idle_dropped`). ``[]`` after ``close()``.
        """
        if self._closed:
            return []
        self._service()
        out = list(self._events)
        self._events.clear()
        return out

    def _service(self) -> None:
        """Housekeeping on every poll path: read monitor events, cut idle connections, and make
        the ROUTER process its commands (a pipe closed by a shutdown releases its queued
        zero-copy frames only when the socket does)."""
        self._drain_router_monitor()
        for address in list(self._dealer_mons):
            self._drain_dealer_monitor(address)
        if self._idle_timeout_s is not None and self._unbound:
            self._cut_idle()
        try:
            self._router.get(_EVENTS)
        except zmq.ZMQError:  # pragma: no cover
            pass

    @staticmethod
    def _monitor_events(mon: zmq.Socket) -> list[tuple[int, int]]:
        """``(event, value)`` pairs waiting on a monitor PAIR, without blocking."""
        out = []
        while True:
            try:
                if not mon.get(_EVENTS) & _POLLIN:
                    return out
                frames = mon.recv_multipart(_NOBLOCK)
            except zmq.ZMQError:
                return out
            out.append(_MON_HEADER.unpack_from(frames[0]))

    def _drain_router_monitor(self) -> None:
        for event, fd in self._monitor_events(self._rmon):
            if event == zmq.EVENT_ACCEPTED:
                self._conn_closed(fd)  # a missed close of an older connection on this fd
                conn = self._conns[fd] = _Conn(fd, _peername(fd), time.monotonic())
                self._unbound[fd] = conn
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._conn_closed(fd)

    def _conn_closed(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        self._unbound.pop(fd, None)
        if conn is None or conn.rid is None or self._rid_fd.get(conn.rid) != fd:
            return
        del self._rid_fd[conn.rid]
        self._spend(conn.rid)
        peer = _IN_PREFIX + conn.rid.hex()
        self._fail_queue(peer, SendFailure.UNREACHABLE, "connection closed")
        reason = CloseReason.DROPPED if conn.dropped else CloseReason.DISCONNECTED
        self._events.append(PeerClosed(peer, reason))

    def _drain_dealer_monitor(self, address: str) -> None:
        for event, _ in self._monitor_events(self._dealer_mons[address]):
            if event == zmq.EVENT_CONNECTED:
                self._dialling.pop(address, None)
            elif event == zmq.EVENT_CLOSED:
                since = self._dialling.pop(address, None)
                if since is not None:  # a fail_fast dial that never connected: the dial failed
                    timed_out = self._connect_timeout_ms and (
                        time.monotonic() - since) * 1000 >= 0.9 * self._connect_timeout_ms
                    self._events.append(PeerClosed(address, CloseReason.CONNECT_TIMEOUT if timed_out
                                                   else CloseReason.REFUSED))
            elif event == zmq.EVENT_DISCONNECTED:
                self._events.append(PeerClosed(address, CloseReason.DISCONNECTED))
            elif event in _HANDSHAKE_FAILED and (address, event) not in self.handshake_failures:
                # once per producer and text: libzmq retries the connect and fails the same way,
                # and each failed load may dial again (bounded: addresses come from requests)
                if len(self.handshake_failures) >= 4096:
                    self.handshake_failures.clear()
                text = _HANDSHAKE_FAILED[event]
                said = any(_HANDSHAKE_FAILED[e] == text for a, e in self.handshake_failures if a == address)
                self.handshake_failures.add((address, event))
                if not said:
                    log.warning("kvtier: handshake with producer %s failed: %s", address, text)

    def _shutdown_conn(self, conn: _Conn) -> bool:
        """``shutdown(SHUT_RDWR)`` the connection behind ``conn.fd`` if it is still the one we
        recorded (same remote ip:port on a dup of the fd). libzmq then sees the close, ends
        the pipe and frees what was queued to it.  Never for an ambiguous record."""
        if conn.ambiguous:
            return False
        try:
            dup = socket.socket(fileno=os.dup(conn.fd))
        except OSError:
            return False
        try:
            if not conn.peername or _fmt_sockaddr(dup.getpeername()) != conn.peername:
                return False  # the fd was closed (and maybe reused): not our connection any more
            dup.shutdown(socket.SHUT_RDWR)
            return True
        except OSError:
            return False
        finally:
            dup.close()

    def drop_peer(self, peer: str) -> bool:
        """Force the connection to ``peer`` closed, now.

        - A peer that dialled us: its TCP connection is shut down (see the module docstring).
          libzmq then frees everything queued to it, so zero-copy handles become ``done``
          within a poll or two, and messages it still had in flight to us are discarded. A
          :class:`~kvtier.transport.PeerClosed` (``dropped``) follows when libzmq reports the
          close. The peer may dial again; that is a new connection.
        - A producer we dialled: its DEALER is closed (``linger=0``) and a ``PeerClosed``
          (``dropped``) is reported at once. ``connect()`` dials it afresh.

        Our queued sends to ``peer`` fail with ``disconnected``; later sends fail too.

        Returns:
            True if a connection was cut; False if ``peer`` is unknown or already gone.
        """
        if self._closed:
            return False
        self._fail_queue(peer, SendFailure.DISCONNECTED)
        if peer in self._dealers:
            self._close_dealer(peer)
            self._events.append(PeerClosed(peer, CloseReason.DROPPED))
            return True
        target = self._resolve(peer)
        if target is None or target[1] is None:
            return False
        self._drain_router_monitor()
        fd = self._rid_fd.get(target[1])
        if fd is None:
            return False
        conn = self._conns[fd]
        if conn.dropped:
            return True
        if not self._shutdown_conn(conn):
            return False
        conn.dropped = True
        self._service()
        return True

    def peer_info(self, peer: str) -> PeerInfo | None:
        """Remote address and authenticated principal of ``peer`` (see
        :class:`~kvtier.transport.PeerInfo`), or None if no connection is known for it."""
        if peer in self._dealers:
            principal = None
            if self._curve is not None:
                host, port = parse_address(peer)
                key = self._curve.allowed.server_key_for(host, port)
                principal = self._curve.allowed.principal(key) if key else None
            return PeerInfo(peer, principal)
        target = self._resolve(peer)
        if target is None or target[1] is None:
            return None
        fd = self._rid_fd.get(target[1])
        if fd is None:
            return None
        conn = self._conns[fd]
        return PeerInfo(conn.peername, conn.principal)

    def wait(self, timeout_s: float) -> bool:
        """Block until a message or a connection event is ready, or ``timeout_s`` passes.
        Flushes queued sends as their sockets become writable, and cuts idle connections
        when their time is up.

        Args:
            timeout_s: seconds, finite. Values <= 0 just poll.

        Returns:
            True if a message is readable (call :meth:`recv`) or an event is waiting (call
            :meth:`events`), else False.

        Raises:
            ValueError: ``timeout_s`` is NaN or infinite.
        """
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(
            timeout_s
        ):
            raise ValueError(f"timeout_s must be a finite number, got {timeout_s!r}")
        if self._closed:
            return False
        deadline = time.monotonic() + max(0.0, timeout_s)
        # Only events new to this call wake it: a caller that never drains events() must not
        # turn every wait into a busy loop.  Monitors are read only when the poller reports
        # them readable (the loop below), never up front: an idle wait costs one poll.
        seen = len(self._events)
        out_socks = self._sockets_with_pending() if self._queues else set()
        mons = self._monitors()
        while True:
            poller = self._build_poller(out_socks)
            now = time.monotonic()
            until = deadline
            if self._idle_timeout_s is not None and self._unbound:
                until = min(until, next(iter(self._unbound.values())).accepted + self._idle_timeout_s)
            remaining_ms = max(0, math.ceil((until - now) * 1000))
            try:
                events = poller.poll(remaining_ms)
            except zmq.ZMQError:
                return False
            if any(ev & _POLLIN and s not in mons for s, ev in events):
                return True
            if any(s in mons for s, _ in events) or until < deadline:
                self._service()
                if len(self._events) > seen:
                    return True
            if any(ev & zmq.POLLOUT for _, ev in events):  # room opened up below some HWM
                if not self._flush_all():
                    # POLLOUT on a ROUTER means "some pipe has room", maybe not the pipe we
                    # need. Stop watching it for this call instead of spinning.
                    out_socks = set()
                else:
                    out_socks = self._sockets_with_pending()
                continue
            if time.monotonic() >= deadline:
                return False

    def _monitors(self) -> frozenset[zmq.Socket]:
        mons = self._mon_set
        if mons is None:
            mons = self._mon_set = frozenset({self._rmon, *self._dealer_mons.values()})
        return mons

    def _sockets_with_pending(self) -> set[zmq.Socket]:
        socks = set()
        for peer in self._queues:
            target = self._resolve(peer)
            if target is not None:
                socks.add(target[0])
        return socks

    def _build_poller(self, out_socks: set[zmq.Socket]) -> zmq.Poller:
        if not out_socks and self._poller is not None:
            return self._poller
        poller = zmq.Poller()
        for sock in (self._router, *self._dealers.values()):
            poller.register(sock, zmq.POLLIN | (zmq.POLLOUT if sock in out_socks else 0))
        for mon in (self._rmon, *self._dealer_mons.values()):
            poller.register(mon, zmq.POLLIN)
        if not out_socks:
            self._poller = poller
        return poller

    # -- teardown ------------------------------------------------------------------------------

    def peer_address(self, peer: str) -> str:
        """Where ``peer`` is: ``host:port`` for a producer we dialled or a peer that dialled us
        (``""`` if unknown). For log lines only."""
        info = self.peer_info(peer)
        return info.address if info is not None else ""

    def disconnect(self, peer: str) -> None:
        """Forget ``peer`` and fail its queued sends with ``disconnected``.

        For a dialled producer this closes its DEALER (``linger=0``, in-flight messages are
        dropped); no event is reported. For a peer that dialled us only our queue is dropped;
        :meth:`drop_peer` cuts its connection. Unknown peers are ignored.
        """
        self._fail_queue(peer, SendFailure.DISCONNECTED)
        if peer in self._dealers:
            self._close_dealer(peer)

    def _close_dealer(self, address: str) -> None:
        self._dialling.pop(address, None)
        sock = self._dealers.pop(address)
        mon = self._dealer_mons.pop(address)
        self._dealer_peer.pop(sock, None)
        self._mon_peer.pop(mon, None)
        self._mon_set = None
        try:
            sock.disable_monitor()
        except zmq.ZMQError:  # pragma: no cover
            pass
        mon.close(linger=0)
        sock.close(linger=0)
        self._poller = None

    def close(self, linger_s: float = 0.0) -> None:
        """Close every socket and terminate the context. Idempotent.

        Args:
            linger_s: seconds queued sends (ours and libzmq's) get to leave first, e.g. a
                goodbye sent just before. Never blocks longer than that (plus a few ms);
                0 closes at once. What has not left by then is dropped, and our still-queued
                sends fail with ``closed``.

        Raises:
            ValueError: ``linger_s`` is negative, NaN or infinite.
        """
        linger_ms = _seconds_to_ms("linger_s", linger_s)
        if self._closed:
            return
        if linger_ms:
            deadline = time.monotonic() + linger_s
            while self._npending and time.monotonic() < deadline:
                self.wait(min(0.01, max(0.0, deadline - time.monotonic())))
                self._flush_all()
            linger_ms = max(0, int((deadline - time.monotonic()) * 1000))
        self._closed = True
        for peer in list(self._queues):
            self._fail_queue(peer, SendFailure.CLOSED)
        self._teardown(linger_ms)

    def _teardown(self, linger_ms: int = 0) -> None:
        for address in list(self._dealers):
            sock = self._dealers.pop(address)
            self._dealer_mons.pop(address).close(linger=0)
            sock.close(linger=linger_ms)
        if self._rmon is not None:
            self._rmon.close(linger=0)
        if self._router is not None:
            self._router.close(linger=linger_ms)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self._poller = None
        # Every socket is closed, so term() returns once each one's linger is over (at once for
        # 0) and joins libzmq's threads.
        self._ctx.destroy(linger=linger_ms)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def idle_connections(self) -> int:
        """Accepted connections that have not delivered a message yet."""
        return len(self._unbound)

    def peers(self) -> list[str]:
        """Peer ids of the producers we dialled (peers that dialled us are not tracked)."""
        return list(self._dealers)

    def __enter__(self) -> ZmqTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<ZmqTransport {self.address} dialled={len(self._dealers)} "
            f"pending={self._npending}{' closed' if self._closed else ''}>"
        )


def _check_frames(frames: Sequence[Any]) -> list[Any]:
    if isinstance(frames, (bytes, bytearray, memoryview, str)) or not isinstance(
        frames, (list, tuple)
    ):
        raise ValueError(f"frames must be a list of buffers, got {type(frames).__name__}")
    if not frames:
        raise ValueError("frames must not be empty")
    for i, f in enumerate(frames):
        # Checked up front: a bad frame in the middle would otherwise leave half a multipart
        # message in the socket.
        try:
            mv = memoryview(f)
        except TypeError:
            raise ValueError(f"frame {i} is not a buffer: {type(f).__name__}") from None
        if not mv.contiguous:
            raise ValueError(f"frame {i} is not contiguous")
    return list(frames)
