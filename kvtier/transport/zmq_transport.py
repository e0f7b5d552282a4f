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

Where the parts live: sends and their per-peer queues in :mod:`~kvtier.transport.zmq_send`;
the connection records, the socket monitors and ``drop_peer`` in
:mod:`~kvtier.transport.zmq_conns` (why a routing id binds to its connection once: that module's
docstring, decision T10); reading and waiting in :mod:`~kvtier.transport.zmq_recv`; addresses and
argument checks in :mod:`~kvtier.transport.zmq_options`.  Each is a base of :class:`ZmqTransport`.

Not thread-safe: one transport belongs to one I/O loop thread.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from typing import Any

import zmq

from kvtier.transport import PeerInfo, SendFailure, TransportError, TransportEvent
from kvtier.transport.curve import ZAP_DOMAIN, CurveSettings, PrincipalAuthenticator
from kvtier.transport.zmq_conns import DEALER_EVENTS, ROUTER_EVENTS, Conn, ZmqConnections
from kvtier.transport.zmq_options import parse_address, positive_int, resolve_vetted, seconds_to_ms, tcp_endpoint
from kvtier.transport.zmq_recv import ZmqReceive
from kvtier.transport.zmq_send import Pending, ZmqSends

__all__ = ["ZmqTransport", "parse_address"]

_Conn = Conn  # the connection record's name before it moved to zmq_conns, still read by tests

_MAX_HEARTBEAT_TTL_MS = 6_553_500
_CURVE_OVERHEAD = 256  # bytes a CURVE MESSAGE command adds to a frame (libzmq: 33), with room
_MAX_EVENTS = 65536  # undrained events beyond this drop the oldest (an owner that never reads)


class ZmqTransport(ZmqReceive, ZmqSends, ZmqConnections):
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
            zmq.SNDHWM: positive_int("sndhwm", sndhwm),
            zmq.RCVHWM: positive_int("rcvhwm", rcvhwm),
            zmq.RECONNECT_IVL: seconds_to_ms("reconnect_ivl_s", reconnect_ivl_s),
            zmq.RECONNECT_IVL_MAX: seconds_to_ms("reconnect_ivl_max_s", reconnect_ivl_max_s),
            zmq.MAXMSGSIZE: -1 if max_frame_bytes is None else positive_int(
                "max_frame_bytes", max_frame_bytes
            ),
            zmq.HANDSHAKE_IVL: seconds_to_ms("handshake_ivl_s", handshake_ivl_s),
        }
        self._connect_timeout_ms = seconds_to_ms("connect_timeout_s", connect_timeout_s)
        self._router_maxmsg = self._opts[zmq.MAXMSGSIZE] if max_accepted_frame_bytes is None else (
            positive_int("max_accepted_frame_bytes", max_accepted_frame_bytes)
        )
        if idle_timeout_s is not None:
            seconds_to_ms("idle_timeout_s", idle_timeout_s)
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
        ivl = seconds_to_ms("heartbeat_ivl_s", heartbeat_ivl_s)
        if ivl:
            timeout_ms = seconds_to_ms("heartbeat_timeout_s", heartbeat_timeout_s)
            if timeout_ms <= 0:
                raise ValueError(f"heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s}")
            self._opts[zmq.HEARTBEAT_IVL] = ivl
            self._opts[zmq.HEARTBEAT_TIMEOUT] = timeout_ms
            # libzmq carries the TTL in deciseconds in a 16-bit field (at most 6553.5 s). Longer
            # values, e.g. a generous peer_timeout_s from the config, are clamped rather than
            # refused: the TTL is only a hint to the remote side.
            self._opts[zmq.HEARTBEAT_TTL] = min(
                seconds_to_ms("heartbeat_ttl_s", heartbeat_ttl_s), _MAX_HEARTBEAT_TTL_MS
            )
        self._zc_threshold = positive_int("zero_copy_threshold", zero_copy_threshold)
        self._ipv6 = ":" in bind_host

        self._ctx = zmq.Context(positive_int("io_threads", io_threads))
        self._ctx.linger = 0  # default for every socket of this context, belt and braces
        self._closed = False
        self._dealers: dict[str, zmq.Socket] = {}
        self._closing: dict[str, float] = {}  # peers that dialled us, cut at this time (a goodbye's linger)
        self._lingering: list[tuple[float, zmq.Socket, zmq.Socket]] = []  # closed dials flushing a goodbye
        self._queues: dict[str, deque[Pending]] = {}
        self._npending = 0
        self._poller: zmq.Poller | None = None
        self._wake: int | None = None  # the owner's wake-up fd, polled with the sockets (set_wake)
        self._rr = 0  # round-robin start offset for recv() fairness
        self._events: deque[TransportEvent] = deque(maxlen=_MAX_EVENTS)
        self._conns: dict[int, Conn] = {}  # ROUTER connections by fd
        self._rid_fd: dict[bytes, int] = {}  # routing id -> fd of its connection (bound once)
        self._spent: dict[bytes, None] = {}  # routing ids whose connection closed (bounded)
        self._unbound: dict[int, Conn] = {}  # accepted, no message yet (accept order)
        self._dealer_mons: dict[str, zmq.Socket] = {}
        self._dialling: dict[str, float] = {}  # fail_fast dials not connected yet -> when dialled
        self._dealer_peer: dict[zmq.Socket, str] = {}  # DEALER -> the address it dials
        self._mon_peer: dict[zmq.Socket, str] = {}  # a DEALER's monitor -> that address
        self._mon_set: frozenset[zmq.Socket] | None = None
        self._mon_n = 0
        self._auth: PrincipalAuthenticator | None = None
        self.idle_dropped = 0
        """Accepted connections cut by ``idle_timeout_s`` (a counter)."""
        self._refusing: tuple[bool, str] | None = None  # the ROUTER's last failed handshake, until its close
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
            self._rmon = self._monitor(self._router, ROUTER_EVENTS)
            self._router.bind(tcp_endpoint(bind_host, port or "*"))
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

    # -- setup ------------------------------------------------------------------------------

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
        dial_host = host if vet is None else resolve_vetted(host, port, vet)
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
            mon = self._monitor(sock, DEALER_EVENTS)
            sock.connect(tcp_endpoint(dial_host, port))
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

    # -- teardown ---------------------------------------------------------------------------

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
        linger_ms = seconds_to_ms("linger_s", linger_s)
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
        for _, sock, mon in self._lingering:
            mon.close(linger=0)
            sock.close(linger=0)
        self._lingering.clear()
        self._closing.clear()
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
