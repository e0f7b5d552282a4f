"""ZeroMQ transport: one ROUTER we listen on, plus one DEALER per producer we dial.

Why this shape (more in docs/protocol.md):
- A consumer dials each producer once, with a DEALER; the producer's ROUTER answers on that TCP
  connection (one per pair) and never dials an address a client gave it.
- ``ROUTER_MANDATORY=1``: a send to a peer that has gone is a failed :class:`SendHandle`, not a drop.
- Each DEALER sets a random ``ROUTING_ID``; the ROUTER keeps ``ROUTER_HANDOVER=0``: a routing id
  speaks for one TCP connection only (decision T10).  A consumer never reconnects a session's
  DEALER (its first ``DISCONNECTED`` ends the session and closes the DEALER; the next session
  dials a new one), so a second connection claiming a live routing id is refused by libzmq.
- No ZMTP heartbeats by default (decision T18: libzmq 4.3.5 aborts on them after backpressure
  and a reset): the core's own pings find a frozen or vanished peer and cut it (``drop_peer``).
  Reconnects back off up to ``reconnect_ivl_max_s``; ``LINGER=0`` everywhere: ``close()`` never hangs.

Its parts (decision W12): sockets, connections, monitors, events and ``drop_peer``
(:class:`~kvtier.transport.zmq_conns.Connections`, T10); the per-peer send queues
(:class:`~kvtier.transport.zmq_send.Outbox`); reading, polling and waiting
(:class:`~kvtier.transport.zmq_recv.Inbox`); addresses and argument checks
(:mod:`~kvtier.transport.zmq_options`).  This class keeps the options, the context, dialling and
closing, and checks every argument before a part sees it.

Not thread-safe: one transport belongs to one I/O loop thread.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from typing import Any

import zmq

from kvtier.transport import NoServerKey, PeerInfo, SendFailure, SendHandle, TransportError, TransportEvent
from kvtier.transport.curve import ZAP_DOMAIN, CurveSettings, PrincipalAuthenticator
from kvtier.transport.zmq_barrier import IoBarrier, tcp_backlog
from kvtier.transport.zmq_progress import progressed
from kvtier.transport.zmq_conns import DEALER_EVENTS, Conn, Connections
from kvtier.transport.zmq_dial import immediate
from kvtier.transport.zmq_options import is_ip_literal, parse_address, positive_int, resolve_vetted, tcp_endpoint
from kvtier.transport.zmq_options import seconds_to_ms
from kvtier.transport.zmq_recv import Inbox
from kvtier.transport.zmq_send import Outbox, check_frames

__all__ = ["ZmqTransport", "parse_address"]

_Conn = Conn  # the connection record's name before it moved to zmq_conns, still read by tests

_MAX_HEARTBEAT_TTL_MS = 6_553_500
_CURVE_OVERHEAD = 256  # bytes a CURVE MESSAGE command adds to a frame (libzmq: 33), with room


def _admit(host: str, port: int, ip: str) -> None:
    """The vet of a dial that ``allowed_peers`` already admitted by name: every address."""
    return None


class ZmqTransport:
    """Transport over ZeroMQ TCP (see module docstring).

    Args:
        bind_host: interface to listen on (``"127.0.0.1"``, ``"0.0.0.0"``, ``"::1"``, ...).
        port: TCP port, or 0 for an ephemeral one (read it back from :attr:`port`).
        sndhwm / rcvhwm: high-water marks, in messages, per peer connection. Past ``sndhwm`` sends
            queue in our per-peer FIFO instead of blocking.
        heartbeat_ivl_s: ZMTP PING interval in seconds; 0 (the default) turns heartbeats off.
            libzmq 4.3.5's heartbeat timer writes on a connection whose input it stopped (the
            receive pipe full) and that then failed, and aborts the process (``Assertion failed:
            !_io_error``): a peer that floods and resets, or dies mid-transfer while we are busy,
            takes us down.  The manager leaves them off; its own pings carry liveness (decision T18).
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
        heartbeat_ivl_s: float = 0.0,
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
        if bind_host.startswith("[") and bind_host.endswith("]"):  # an IPv6 address as URLs write it
            bind_host = bind_host[1:-1]
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
        timeout_ms = seconds_to_ms("heartbeat_timeout_s", heartbeat_timeout_s)  # checked even when off
        if timeout_ms <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s}")
        ttl_ms = seconds_to_ms("heartbeat_ttl_s", heartbeat_ttl_s)
        if ivl:
            self._opts[zmq.HEARTBEAT_IVL] = ivl
            self._opts[zmq.HEARTBEAT_TIMEOUT] = timeout_ms
            # libzmq carries the TTL in deciseconds in a 16-bit field (at most 6553.5 s). Longer
            # values, e.g. a generous peer_timeout_s from the config, are clamped rather than
            # refused: the TTL is only a hint to the remote side.
            self._opts[zmq.HEARTBEAT_TTL] = min(ttl_ms, _MAX_HEARTBEAT_TTL_MS)
        self._zc_threshold = positive_int("zero_copy_threshold", zero_copy_threshold)
        self._ipv6 = ":" in bind_host

        self._ctx = zmq.Context(positive_int("io_threads", io_threads))
        self._ctx.linger = 0  # default for every socket of this context, belt and braces
        self._barrier = IoBarrier(self._ctx, io_threads)
        self._received: dict[str, int] = {}  # bytes each dial's connection had received (progress)
        self._closed = False
        self._auth: PrincipalAuthenticator | None = None
        # the parts (decision W12): the connections fail a peer's queue through the outbox, the
        # outbox asks the connections where a peer is, the inbox reads the one and moves the other
        conns = self._conns = Connections(self._ctx, curve=curve is not None, idle_timeout_s=idle_timeout_s,
                                          connect_timeout_ms=self._connect_timeout_ms)
        self._out = conns.outbox = Outbox(self._zc_threshold, conns.resolve)
        self._in = Inbox(conns, self._out, self._zc_threshold)
        try:
            if curve is not None:
                # The ZAP handler must exist before the first connection is accepted.
                self._auth = PrincipalAuthenticator(self._ctx, curve.allowed)
                self._auth.start()
            router = self._socket(zmq.ROUTER, ipv6=self._ipv6)
            conns.set_router(router)
            router.setsockopt(zmq.MAXMSGSIZE, self._router_maxmsg)
            router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            router.setsockopt(zmq.ROUTER_HANDOVER, 0)  # one routing id, one connection (T10)
            if curve is not None:
                router.curve_server = True
                router.curve_secretkey = curve.identity.secret
                router.curve_publickey = curve.identity.public
                router.zap_domain = ZAP_DOMAIN.encode()
            router.bind(tcp_endpoint(bind_host, port or "*"))
            endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
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

    def needs_lookup(self, address: str) -> bool:
        """Whether ``address``'s host is a name (:meth:`connect` would block on its lookup)."""
        try:
            host, _ = parse_address(address)
        except ValueError:
            return False  # connect() names what is wrong with it, at once
        return not is_ip_literal(host)

    def lookup(self, address: str, vet: Any = None) -> tuple[str, ...]:
        """The addresses ``address``'s host resolves to, once ``vet`` accepted every one (blocking;
        touches no socket, so any thread may call it).  Raises as ``Transport.lookup`` says."""
        host, port = parse_address(address)
        return resolve_vetted(host, port, vet or _admit)

    def connect(self, address: str, *, fail_fast: bool = False, vet: Any = None,
                resolved: Sequence[str] | None = None) -> str:
        """Dial a producer (zmq reconnects if it restarts on the same port).  Asynchronous: sends
        made before the TCP handshake wait in the DEALER's pipe (up to ``sndhwm``), then our queue.

        Args:
            address: ``"host:port"`` (``"[v6]:port"`` for IPv6).
            fail_fast: the first connect attempt that fails (of the last address) is reported: a
                refused or unreachable address at once, as ``PeerClosed(address, "refused")``
                (the monitor's ``CLOSED`` before any ``CONNECTED``), one that does not answer
                within ``connect_timeout_s`` as ``"connect_timeout"``; the caller closes the dial.  (Not
                ``ZMQ_RECONNECT_STOP``: with it libzmq drops the messages a connection delivered
                but the application had not read yet when that connection closes — a producer's
                goodbye among them.)  Without it a dial made before the producer listens simply
                waits for it.
            vet: ``vet(host, port, ip) -> reason | None``: every address a hostname resolves to
                is vetted.  A hostname is resolved here (``getaddrinfo``, blocking), so no later
                resolution can differ from the one vetted and a name that does not resolve fails
                at once; its addresses are dialled in order (fail_fast: the next after one fails, T20).
            resolved: what :meth:`lookup` returned for ``address`` (off the loop, T19): dialled as is.

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
        if address in self._conns.dealers:
            return address
        # what happened to an earlier connection to this address is history now: its events must
        # not be read as news about the new one
        self._conns.forget_events_of(address)
        host, port = parse_address(address)
        # a name is resolved here even unvetted: one that does not resolve fails the dial now
        # (libzmq would retry it silently until the handshake's deadline)
        dial_hosts = resolve_vetted(host, port, vet or _admit) if resolved is None else tuple(resolved)
        server_key = None
        if self._curve is not None:
            server_key = self._curve.allowed.server_key_for(host, port)
            if server_key is None:
                # Never dial with a key the network could choose for us.
                raise NoServerKey(
                    f"cannot connect to {address}: no certificate in auth_allowed_keys_dir names this endpoint, so "
                    "the producer's key is unknown: copy its NAME.key there (`kvtier keys generate --endpoint HOST`)"
                )
        sock = mon = None
        try:
            sock = self._socket(zmq.DEALER, ipv6=any(":" in h for h in dial_hosts))
            # Random, stable identity: the producer keeps seeing the same peer id across our
            # reconnects. A leading 0 byte is reserved by libzmq for generated ids.
            sock.setsockopt(zmq.ROUTING_ID, b"k" + secrets.token_bytes(15))
            if self._connect_timeout_ms:
                sock.setsockopt(zmq.CONNECT_TIMEOUT, self._connect_timeout_ms)
            if self._curve is not None:
                sock.curve_serverkey = server_key
                sock.curve_publickey = self._curve.identity.public
                sock.curve_secretkey = self._curve.identity.secret
            endpoints = [tcp_endpoint(h, port) for h in dial_hosts]
            sock.setsockopt(zmq.IMMEDIATE, int(immediate(endpoints, fail_fast)))
            mon = self._conns.monitor(sock, DEALER_EVENTS)
            sock.connect(endpoints[0])
        except zmq.ZMQError as exc:
            for x in (mon, sock):
                if x is not None:
                    x.close(linger=0)
            raise TransportError(f"cannot connect to {address}: {exc}") from exc
        self._conns.add_dealer(address, sock, mon, fail_fast=fail_fast, endpoints=endpoints)
        return address

    # -- sending and receiving (the parts do the work) -----------------------------------------

    def send(self, peer: str, frames: Sequence[Any], *, track: bool = False) -> SendHandle:
        """Send one multipart message to ``peer``. Never blocks and never raises for peer
        conditions.

        Args:
            peer: a peer id from :meth:`connect` or from :meth:`recv`.
            frames: non-empty sequence of buffers (bytes, bytearray, memoryview, numpy array,
                zmq.Frame). Do not modify their memory until the handle is ``done``.
            track: True → frames of at least ``zero_copy_threshold`` bytes are sent zero-copy,
                and ``done`` waits until libzmq releases them; a message of smaller frames that
                add up to the threshold has its last frame sent so (``done``: the whole message
                left). False → every frame is copied into zmq when it is sent.

        Returns:
            A :class:`SendHandle`. It is sent, queued (sent later by flush/recv/wait, in FIFO
            order per peer), or failed (unknown or departed peer, transport closed).

        Raises:
            ValueError: ``frames`` is empty or a frame is not a contiguous buffer (a caller bug).
        """
        frames = check_frames(frames)
        handle = SendHandle(peer)
        if self._closed:
            handle._mark_failed(SendFailure.CLOSED)
            return handle
        conns = self._conns
        target = conns.resolve(peer)
        if target is None:
            handle._mark_failed(SendFailure.UNKNOWN_PEER, f"no such peer {peer!r}")
            return handle
        if (target[1] is not None and conns.is_dropped(target[1])) or peer in conns.closing:
            handle._mark_failed(SendFailure.DISCONNECTED, f"{peer!r} was dropped")
            return handle
        if target[1] is not None and conns.is_closed(target[1]):
            handle._mark_failed(SendFailure.UNREACHABLE, "connection closed")
            return handle
        self._out.submit(peer, target, frames, track, handle)
        return handle

    def pending_sends(self) -> int:
        """Messages waiting in the per-peer outbound queues."""
        return self._out.pending

    def flush(self) -> None:
        """Move queued messages to their sockets in FIFO order, until each peer hits its HWM.
        Never blocks."""
        self._out.flush_all()

    def recv(self, max_messages: int = 1000) -> list[tuple[str, list[memoryview | bytes]]]:
        """Drain received messages without blocking. Flushes queued sends first.

        Sockets are served round-robin, one message at a time, so a busy peer cannot starve
        the others.

        Args:
            max_messages: upper bound on messages returned, >= 1.

        Returns:
            ``[(peer, frames), ...]`` in arrival order per peer. Frames shorter than
            ``zero_copy_threshold`` and than ``zmq_recv.VIEW_BYTES`` (4 KiB) are ``bytes``.
            Longer ones are read-only ``memoryview``
            objects over zmq's buffer (no copy), which stay valid while referenced. ``[]`` after
            ``close()``.

        Raises:
            ValueError: ``max_messages`` is not an int >= 1.
        """
        max_messages = positive_int("max_messages", max_messages)
        return [] if self._closed else self._in.recv(max_messages)

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
        max_messages = positive_int("max_messages", max_messages)
        return ([], [], True) if self._closed else self._in.service(max_messages)

    def set_wake(self, fd: int | None) -> None:
        """Watch ``fd`` (an eventfd or pipe the owner writes to wake its loop) in the same poll
        as the sockets: :meth:`wait` returns True as soon as it is readable.  The owner reads it
        (this transport never does); ``None`` stops watching."""
        self._in.set_wake(fd)

    def wait(self, timeout_s: float) -> bool:
        """Block until a message or a connection event is ready, the wake-up fd
        (:meth:`set_wake`) is readable, or ``timeout_s`` passes.
        Flushes queued sends as their sockets become writable, and cuts idle connections
        when their time is up.

        Args:
            timeout_s: seconds, finite. Values <= 0 just poll; values under 1 ms are honoured
                (``Inbox._poll_once``), not rounded up to ``zmq_poll``'s millisecond.

        Returns:
            True if a message is readable (call :meth:`recv`) or an event is waiting (call
            :meth:`events`), else False.

        Raises:
            ValueError: ``timeout_s`` is NaN or infinite.
        """
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s):
            raise ValueError(f"timeout_s must be a finite number, got {timeout_s!r}")
        return False if self._closed else self._in.wait(timeout_s)

    def barrier(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until libzmq's I/O threads have taken in what the
        kernel held for our connections when the call began (:mod:`kvtier.transport.zmq_barrier`,
        decision T17): the next :meth:`service` that drains every socket has then returned it.
        A late loop pass calls it, on the loop's thread (caller-driven: the engine's), and it can
        take all of ``timeout_s`` while a backlog still arrives.

        Returns:
            True when proven; False after :meth:`close`, when not reached within ``timeout_s``,
            when the backlog does not move (a connection whose queue is full: read first), and at
            once while the barrier rests after a failed crossing (1 s, doubling up to 60 s).

        Raises:
            ValueError: ``timeout_s`` is not a finite number >= 0.
        """
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 <= timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a finite number >= 0, got {timeout_s!r}")
        return False if self._closed else self._barrier.settle(timeout_s, self._backlog)

    def _backlog(self) -> dict[int, tuple[int, int]]:
        """``(unread, received)`` per TCP connection holding unread bytes; the monitors are read
        first, so one libzmq accepted or connected during a stop is counted too."""
        conns = self._conns
        for mon in conns.monitors():
            conns.drain_monitor(mon)
        return {fd: b for fd in conns.tcp_fds() if (b := tcp_backlog(fd)) is not None}

    def progress(self) -> list[str]:
        """Dialled peers whose connection received bytes since the last call (T22: alive)."""
        return [] if self._closed else progressed(self._conns.dial_fds(), self._received)

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
        self._conns.service()
        return self._conns.take_events()

    def drop_peer(self, peer: str, linger_s: float = 0.0) -> bool:
        """Force the connection to ``peer`` closed, now — or, with ``linger_s`` > 0, once a
        goodbye just sent (and whatever is queued before it) had up to ``linger_s`` seconds to
        leave: nothing more can be sent to ``peer`` from now on, and the connection is cut at the
        deadline unless the peer closed it first (a goodbye that names why, decision I28).  A
        dialled producer's DEALER is forgotten at once (``connect()`` dials afresh; what it
        receives meanwhile is not read) and closed at the deadline.

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
        return False if self._closed else self._conns.drop_peer(peer, linger_s)

    def peer_info(self, peer: str) -> PeerInfo | None:
        """Remote address and authenticated principal of ``peer`` (see
        :class:`~kvtier.transport.PeerInfo`), or None if no connection is known for it."""
        if peer in self._conns.dealers:
            principal = None
            if self._curve is not None:
                host, port = parse_address(peer)
                key = self._curve.allowed.server_key_for(host, port)
                principal = self._curve.allowed.principal(key) if key else None
            return PeerInfo(peer, principal)
        conn = self._conns.peer_record(peer)
        return None if conn is None else PeerInfo(conn.peername, conn.principal)

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
        self._out.fail(peer, SendFailure.DISCONNECTED)
        if peer in self._conns.dealers:
            self._conns.close_dealer(peer)

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
            while self._out.pending and time.monotonic() < deadline:
                self.wait(min(0.01, max(0.0, deadline - time.monotonic())))
                self._out.flush_all()
            linger_ms = max(0, int((deadline - time.monotonic()) * 1000))
        self._closed = True
        self._out.fail_all(SendFailure.CLOSED)
        self._teardown(linger_ms)

    def _teardown(self, linger_ms: int = 0) -> None:
        self._barrier.close()
        self._conns.teardown(linger_ms)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        # Every socket is closed, so term() returns once each one's linger is over (at once for
        # 0) and joins libzmq's threads.
        self._ctx.destroy(linger=linger_ms)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def idle_connections(self) -> int:
        """Accepted connections that have not delivered a message yet."""
        return self._conns.idle_count()

    @property
    def idle_dropped(self) -> int:
        """Accepted connections cut by ``idle_timeout_s`` (a counter)."""
        return self._conns.idle_dropped

    @property
    def handshake_failures(self) -> set[tuple[str, int]]:
        """``(producer address, libzmq EVENT_HANDSHAKE_FAILED_*)`` seen on our dials (each logged once)."""
        return self._conns.handshake_failures

    def peers(self) -> list[str]:
        """Peer ids of the producers we dialled (peers that dialled us are not tracked)."""
        return list(self._conns.dealers)

    def __enter__(self) -> ZmqTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<ZmqTransport {self.address} dialled={len(self._conns.dealers)} "
            f"pending={self._out.pending}{' closed' if self._closed else ''}>"
        )
