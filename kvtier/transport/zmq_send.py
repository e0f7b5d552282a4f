"""The sends of a ZmqTransport: never blocking, queued per peer in FIFO order past the high-water
mark, zero-copy when tracked.

Sends never block: every send uses ``NOBLOCK``. On ``zmq.Again`` (high-water mark reached) the
message joins a per-peer FIFO that :meth:`ZmqTransport.flush`, :meth:`~ZmqTransport.recv` and
:meth:`~ZmqTransport.wait` drain in order. With ``track=True``, frames of at least
``zero_copy_threshold`` bytes go out zero-copy with a ``zmq.MessageTracker``. The handle's ``done``
turns True when libzmq releases them. (pyzmq finishes trackers on its own process-wide
"garbage collector" thread, started on the first zero-copy send. It is not ours and outlives
every transport.)

:class:`Outbox` is a part of :class:`~kvtier.transport.zmq_transport.ZmqTransport` (decision W12):
it owns the per-peer queues and asks the connections part where a peer's socket is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import zmq

from kvtier.transport import SendFailure, SendHandle

#: where a peer's messages go: its socket and, for a peer that dialled us, its ROUTER routing id
Target = tuple[zmq.Socket, bytes | None]

# plain ints: or-ing pyzmq's flag enums builds an enum member per frame sent (decision C26)
_LAST = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)


class Pending:
    """One queued multipart message waiting for room below the high-water mark."""

    __slots__ = ("frames", "track", "handle")

    def __init__(self, frames: list[Any], track: bool, handle: SendHandle) -> None:
        self.frames = frames
        self.track = track
        self.handle = handle


class Outbox:
    """The per-peer send queues of :class:`~kvtier.transport.zmq_transport.ZmqTransport`.

    Args:
        zero_copy_threshold: frames of at least this many bytes go out zero-copy when tracked.
        resolve: ``resolve(peer)`` -> the peer's :data:`Target`, or None when it cannot exist.
    """

    def __init__(self, zero_copy_threshold: int, resolve: Callable[[str], Target | None]) -> None:
        self._threshold = zero_copy_threshold
        self._resolve = resolve
        self._queues: dict[str, deque[Pending]] = {}
        self.pending = 0
        """Messages waiting in the queues."""

    def submit(self, peer: str, target: Target, frames: list[Any], track: bool, handle: SendHandle) -> None:
        """Send now, or queue behind what waits for ``peer`` (never blocks): the rest of
        :meth:`ZmqTransport.send <kvtier.transport.zmq_transport.ZmqTransport.send>`."""
        queue = self._queues.get(peer)
        if queue:  # keep per-peer FIFO order: never overtake queued messages
            queue.append(Pending(frames, track, handle))
            self.pending += 1
            self.flush_peer(peer)
            return
        if not self._try_send(target, frames, track, handle):
            self._queues.setdefault(peer, deque()).append(Pending(frames, track, handle))
            self.pending += 1

    def queued_peers(self) -> Iterable[str]:
        """The peers with queued messages."""
        return self._queues.keys()

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
        threshold = self._threshold
        # a tracked message of many small frames (each copied) still gets one tracker, on its last
        # frame: libzmq frees frames in order, so its release means the whole message left, and a
        # caller's window of bytes in flight holds for copied frames too (decision C22)
        sizes = [memoryview(part).nbytes for part in parts] if track else ()
        track_last = track and sum(sizes) >= threshold and max(sizes[1 if rid is not None else 0:]) < threshold
        i = 0
        try:
            for i, part in enumerate(parts):
                flags = _MORE if i < last else _LAST
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

    def flush_all(self) -> int:
        """Move queued messages to their sockets in FIFO order, until each peer hits its HWM.
        Never blocks.  Returns how many moved."""
        if not self.pending:
            return 0
        moved = 0
        for peer in list(self._queues):
            moved += self.flush_peer(peer)
        return moved

    def flush_peer(self, peer: str) -> int:
        """:meth:`flush_all` for one peer."""
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
            self.pending -= 1
            moved += 1
            if head.handle.failed and head.handle.error == SendFailure.UNREACHABLE:
                # The peer is gone, so everything behind this message would fail the same way.
                self.fail(peer, SendFailure.UNREACHABLE, head.handle.detail)
                return moved
        if not queue:
            del self._queues[peer]
        return moved

    def fail(self, peer: str, error: str, detail: str = "") -> None:
        """Fail everything queued for ``peer`` with ``error`` (a :class:`SendFailure`)."""
        queue = self._queues.pop(peer, None)
        if queue:
            for p in queue:
                p.handle._mark_failed(error, detail)
            self.pending -= len(queue)

    def fail_all(self, error: str) -> None:
        """Fail everything queued, for every peer."""
        for peer in list(self._queues):
            self.fail(peer, error)


def check_frames(frames: Sequence[Any]) -> list[Any]:
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
