"""ZeroMQ transport: one ROUTER we listen on, plus one DEALER per producer we dial.

Why this shape (more in docs/protocol.md):
- A consumer dials each producer once, with a DEALER. The producer's ROUTER answers on that same
  TCP connection, so there is one connection per consumer→producer pair. The producer never dials
  an address a client gave it.
- ``ROUTER_MANDATORY=1``: a send to a peer that has gone raises ``EHOSTUNREACH``, which we report
  as a failed :class:`SendHandle`, instead of libzmq dropping it silently.
- Each DEALER sets a random ``ROUTING_ID`` and the ROUTER sets ``ROUTER_HANDOVER=1``. A DEALER
  that reconnects after a network blip keeps its peer id, and its new connection replaces the
  half-dead old one.
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

Not thread-safe: one transport belongs to one I/O loop thread.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from kvtier.transport import SendFailure, SendHandle, TransportError

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
        max_frame_bytes: a peer sending a frame larger than this is disconnected by libzmq
            (``ZMQ_MAXMSGSIZE``, per frame). ``None`` means no limit.
        io_threads: libzmq I/O threads for this transport's context.

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
        io_threads: int = 1,
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
        }
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
        self._in_addr: dict[str, str] = {}  # inbound peer id -> its IP (for log lines)
        try:
            self._router = self._socket(zmq.ROUTER, ipv6=self._ipv6)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            self._router.bind(_endpoint(bind_host, port or "*"))
            endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException as exc:
            # Never leak a context (and its threads) from a failed constructor.
            self._ctx.destroy(linger=0)
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

    def connect(self, address: str) -> str:
        """Dial a producer. zmq reconnects by itself if the producer restarts on the same port.

        Connecting is asynchronous: sends made before the TCP handshake completes wait in the
        DEALER's pipe (up to ``sndhwm``) and then in our queue.

        Args:
            address: ``"host:port"`` (``"[v6]:port"`` for IPv6).

        Returns:
            The peer id, equal to ``address``. Calling it again for the same address returns the
            same id and opens nothing new.

        Raises:
            ValueError: ``address`` is not ``host:port``.
            TransportError: the transport is closed, or zmq refused the endpoint.
        """
        if self._closed:
            raise TransportError("connect() on a closed transport")
        if address in self._dealers:
            return address
        host, port = parse_address(address)
        try:
            sock = self._socket(zmq.DEALER, ipv6=":" in host)
            # Random, stable identity: the producer keeps seeing the same peer id across our
            # reconnects. A leading 0 byte is reserved by libzmq for generated ids.
            sock.setsockopt(zmq.ROUTING_ID, b"k" + secrets.token_bytes(15))
            try:
                sock.connect(_endpoint(host, port))
            except BaseException:
                sock.close(linger=0)
                raise
        except zmq.ZMQError as exc:
            raise TransportError(f"cannot connect to {address}: {exc}") from exc
        self._dealers[address] = sock
        self._poller = None
        return address

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
                    if not sock.get(zmq.EVENTS) & zmq.POLLIN:
                        active.remove(entry)
                        continue
                    parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.ZMQError:  # Again (raced), or a socket error: skip it this round
                    active.remove(entry)
                    continue
                if peer is None:
                    peer = _IN_PREFIX + parts[0].bytes.hex()
                    parts = parts[1:]
                    if not parts:
                        continue
                    if peer not in self._in_addr:
                        self._remember_address(peer, parts[0])
                out.append(
                    (peer, [p.bytes if len(p) < threshold else p.buffer for p in parts])
                )
                if len(out) >= max_messages:
                    break
        return out

    def wait(self, timeout_s: float) -> bool:
        """Block until a message is readable or ``timeout_s`` passes. Flushes queued sends as
        their sockets become writable.

        Args:
            timeout_s: seconds, finite. Values <= 0 just poll.

        Returns:
            True if at least one socket is readable (call :meth:`recv`), else False.

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
        out_socks = self._sockets_with_pending()
        while True:
            poller = self._build_poller(out_socks)
            remaining_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
            try:
                events = poller.poll(remaining_ms)
            except zmq.ZMQError:
                return False
            if any(ev & zmq.POLLIN for _, ev in events):
                return True
            if events:  # only POLLOUT: room opened up below some HWM
                if not self._flush_all():
                    # POLLOUT on a ROUTER means "some pipe has room", maybe not the pipe we
                    # need. Stop watching it for this call instead of spinning.
                    out_socks = set()
                else:
                    out_socks = self._sockets_with_pending()
                continue
            if time.monotonic() >= deadline:
                return False

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
        if not out_socks:
            self._poller = poller
        return poller

    # -- teardown ------------------------------------------------------------------------------

    def _remember_address(self, peer: str, frame: zmq.Frame) -> None:
        try:
            addr = frame.get("Peer-Address")
        except (zmq.ZMQError, AttributeError):  # a transport without the property (e.g. ipc)
            addr = ""
        if len(self._in_addr) >= 4096:  # bounded: forget the oldest
            del self._in_addr[next(iter(self._in_addr))]
        self._in_addr[peer] = addr or ""

    def peer_address(self, peer: str) -> str:
        """Where ``peer`` is: ``host:port`` for a producer we dialled, the remote IP for a peer
        that dialled us (zmq's ``Peer-Address``; ``""`` if unknown). For log lines only."""
        if peer.startswith(_IN_PREFIX):
            return self._in_addr.get(peer, "")
        return peer

    def disconnect(self, peer: str) -> None:
        """Forget ``peer`` and fail its queued sends with ``disconnected``.

        For a dialled producer this closes its DEALER (``linger=0``, in-flight messages are
        dropped). A peer that dialled us cannot be cut off individually (libzmq's ROUTER has no
        per-peer close), so only its queue is dropped. Unknown peers are ignored.
        """
        self._fail_queue(peer, SendFailure.DISCONNECTED)
        sock = self._dealers.pop(peer, None)
        if sock is not None:
            sock.close(linger=0)
            self._poller = None

    def close(self) -> None:
        """Close every socket with ``linger=0`` and terminate the context. Idempotent and
        never blocks: queued sends fail with ``closed``."""
        if self._closed:
            return
        self._closed = True
        for peer in list(self._queues):
            self._fail_queue(peer, SendFailure.CLOSED)
        for sock in self._dealers.values():
            sock.close(linger=0)
        self._dealers.clear()
        self._router.close(linger=0)
        self._poller = None
        # Every socket is closed, so term() returns at once and joins libzmq's threads.
        self._ctx.destroy(linger=0)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

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
