"""The sends of a ZmqTransport: never blocking, queued per peer in FIFO order past the high-water
mark, zero-copy when tracked.

Sends never block: every send uses ``NOBLOCK``. On ``zmq.Again`` (high-water mark reached) the
message joins a per-peer FIFO that :meth:`ZmqTransport.flush`, :meth:`~ZmqTransport.recv` and
:meth:`~ZmqTransport.wait` drain in order. With ``track=True``, frames of at least
``zero_copy_threshold`` bytes go out zero-copy with a ``zmq.MessageTracker``. The handle's ``done``
turns True when libzmq releases them. (pyzmq finishes trackers on its own process-wide
"garbage collector" thread, started on the first zero-copy send. It is not ours and outlives
every transport.)

:class:`ZmqSends` is a base of :class:`~kvtier.transport.zmq_transport.ZmqTransport`; the state
it works on is made by ``ZmqTransport.__init__``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from kvtier.transport import SendFailure, SendHandle
from kvtier.transport.zmq_conns import IN_PREFIX


class Pending:
    """One queued multipart message waiting for room below the high-water mark."""

    __slots__ = ("frames", "track", "handle")

    def __init__(self, frames: list[Any], track: bool, handle: SendHandle) -> None:
        self.frames = frames
        self.track = track
        self.handle = handle


class ZmqSends:
    """Sending and the per-peer queues of :class:`~kvtier.transport.zmq_transport.ZmqTransport`."""

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
        frames = _check_frames(frames)
        handle = SendHandle(peer)
        if self._closed:
            handle._mark_failed(SendFailure.CLOSED)
            return handle
        target = self._resolve(peer)
        if target is None:
            handle._mark_failed(SendFailure.UNKNOWN_PEER, f"no such peer {peer!r}")
            return handle
        if (target[1] is not None and self._is_dropped(target[1])) or peer in self._closing:
            handle._mark_failed(SendFailure.DISCONNECTED, f"{peer!r} was dropped")
            return handle
        queue = self._queues.get(peer)
        if queue:  # keep per-peer FIFO order: never overtake queued messages
            queue.append(Pending(frames, track, handle))
            self._npending += 1
            self._flush_peer(peer)
            return handle
        if not self._try_send(target, frames, track, handle):
            self._queues.setdefault(peer, deque()).append(Pending(frames, track, handle))
            self._npending += 1
        return handle

    def _resolve(self, peer: str) -> tuple[zmq.Socket, bytes | None] | None:
        """Socket and ROUTER routing id for a peer id, or None if it cannot exist."""
        sock = self._dealers.get(peer)
        if sock is not None:
            return sock, None
        if isinstance(peer, str) and peer.startswith(IN_PREFIX):
            try:
                rid = bytes.fromhex(peer[len(IN_PREFIX) :])
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
        threshold = self._zc_threshold
        # a tracked message of many small frames (each copied) still gets one tracker, on its last
        # frame: libzmq frees frames in order, so its release means the whole message left, and a
        # caller's window of bytes in flight holds for copied frames too (decision C22)
        sizes = [memoryview(part).nbytes for part in parts] if track else ()
        track_last = track and sum(sizes) >= threshold and max(sizes[1 if rid is not None else 0:]) < threshold
        i = 0
        try:
            for i, part in enumerate(parts):
                flags = zmq.NOBLOCK | (zmq.SNDMORE if i < last else 0)
                if track_last and i == last:  # below the socket's copy threshold: a frame of its own
                    frame = zmq.Frame(part, copy=False, track=True, copy_threshold=0)
                    sock.send(frame, flags, copy=False)
                    trackers.append(frame.tracker)
                elif track and (rid is None or i > 0) and sizes[i] >= threshold:
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
