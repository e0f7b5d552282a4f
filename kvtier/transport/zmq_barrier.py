"""A round trip through each of libzmq's I/O threads, repeated until libzmq has read what the
kernel had received for our connections: proof that what had arrived is in the sockets' queues
(decision T17).

libzmq's I/O threads, not the caller, read the TCP connections: a message that reached the kernel
is in a socket's queue only once an I/O thread has run.  Normally that is microseconds, so a read
pass that finds every socket empty has seen everything that arrived before it began.  After the
whole process was stopped (SIGSTOP, a VM pause) every thread resumes at once and the loop's thread
may read before an I/O thread did: the sockets look empty while a peer's answer waits in the
kernel, and a deadline that fell due during the stop would beat it.

:meth:`IoBarrier.cross` sends one empty message per I/O thread over a private PUSH/PULL pair pinned
to that thread (``ZMQ_AFFINITY``, an abstract ``ipc://`` address: no file, no port) and waits for
it: it arrives only after the thread finished the ``epoll`` round it was in and ran another.  One
round reads at most one buffer per connection, so a crossing alone proves nothing about a large
backlog (a multipart ``block_data`` of several MiB is delivered only once all of it was read).
:meth:`IoBarrier.settle` therefore asks the kernel, for each connection that holds unread bytes
(``FIONREAD``), how many bytes it had received then (``TCP_INFO``'s ``tcpi_bytes_received``), and
crosses until a check found that libzmq has read at least that many (received less unread): every
byte that had arrived was read, by a round the crossing after that check saw finished — also while
a peer keeps streaming.  It gives up when a crossing moved none of the backlog (libzmq stops reading
a connection whose queue is full: the owner must read first) or its time is out.  Not proven either
way: bytes libzmq read into a connection's decoder while that connection's queue was full (the
kernel then shows none unread).

A crossing that cannot be made (no fd left, no affinity bit for a 65th I/O thread) or whose message
does not come back in time closes the pairs (a late arrival must not answer a later crossing) and
*rests* the barrier: for :data:`RETRY_S`, doubling up to :data:`MAX_RETRY_S` while it keeps
failing, it answers False at once, and the first failure of a streak is logged.
"""
from __future__ import annotations

import fcntl
import logging
import os
import secrets
import stat
import termios
import time
from collections.abc import Callable

import zmq

from kvtier.transport.zmq_progress import tcp_bytes_received

__all__ = ["IoBarrier", "MAX_RETRY_S", "RETRY_S", "tcp_backlog", "unread_bytes"]

log = logging.getLogger("kvtier.transport")

RETRY_S = 1.0
"""How long a barrier rests after a crossing that failed (seconds)."""
MAX_RETRY_S = 60.0
"""The longest rest, after failures in a row (seconds)."""


def unread_bytes(fd: int) -> int:
    """Bytes the kernel holds unread on socket ``fd`` (``FIONREAD``); 0 for an fd that is closed
    or not a socket (a number libzmq closed may have been reused by a file or a pipe)."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return 0
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), "little", signed=True)
    except OSError:
        return 0


def tcp_backlog(fd: int) -> tuple[int, int] | None:
    """``(unread, received)``: bytes the kernel holds unread on TCP socket ``fd`` and bytes it has
    received on it in all (``TCP_INFO``, Linux 4.1+); None for an fd that is not a TCP socket or
    holds nothing unread."""
    unread = unread_bytes(fd)
    if unread <= 0:
        return None
    received = tcp_bytes_received(fd)
    return None if received is None else (unread, received)


def _affinity(thread: int) -> int:
    """``ZMQ_AFFINITY`` for one I/O thread: a 64-bit mask that pyzmq takes as a signed int."""
    if thread > 63:
        raise OverflowError(f"libzmq's affinity mask has no bit for I/O thread {thread}")
    return -(1 << 63) if thread == 63 else 1 << thread


class IoBarrier:
    """The barrier of one context with ``io_threads`` I/O threads; its sockets are made on the
    first :meth:`cross` (most processes never need one) and closed by :meth:`close`.  ``clock``:
    seconds, monotonic (tests give their own)."""

    def __init__(self, ctx: zmq.Context, io_threads: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ctx = ctx
        self._threads = io_threads
        self._clock = clock
        self._pairs: list[tuple[zmq.Socket, zmq.Socket]] = []
        self._poller: zmq.Poller | None = None
        self._retry_at = float("-inf")  # resting until then
        self._rest_s = RETRY_S

    def _open(self) -> None:
        base = f"ipc://@kvtier-barrier-{os.getpid()}-{secrets.token_hex(6)}"
        poller = zmq.Poller()
        try:
            for i in range(self._threads):
                pull, push = self._ctx.socket(zmq.PULL), self._ctx.socket(zmq.PUSH)
                self._pairs.append((pull, push))
                for s in (pull, push):
                    s.setsockopt(zmq.LINGER, 0)
                    s.setsockopt(zmq.AFFINITY, _affinity(i))  # this I/O thread carries both ends
                pull.bind(f"{base}-{i}")
                push.connect(f"{base}-{i}")
                poller.register(pull, zmq.POLLIN)
        except (zmq.ZMQError, OverflowError):
            self.close()
            raise
        self._poller = poller

    def cross(self, timeout_s: float, *, rest: bool = True) -> bool:
        """Send through every I/O thread and wait up to ``timeout_s`` seconds for it to come
        back.  True: each thread ran since the call began, so a read pass now finds what the
        kernel held then (one buffer's worth per connection: see :meth:`settle`).  False at once
        while the barrier rests; False when it cannot be made or its messages did not come back
        in time (then it rests, unless ``rest`` is False: a caller whose own budget ran out)."""
        now = self._clock()
        if now < self._retry_at:
            return False
        if self._poller is None:
            try:
                self._open()
            except (zmq.ZMQError, OverflowError) as exc:
                return self._rest(now, f"it could not be made ({exc})")
        assert self._poller is not None
        try:
            for _, push in self._pairs:
                push.send(b"", zmq.NOBLOCK)  # its queue is empty: a pair that failed was closed
        except zmq.ZMQError as exc:
            self.close()
            return self._rest(now, f"a crossing could not be sent ({exc})")
        waiting = {pull for pull, _ in self._pairs}
        end = now + timeout_s
        while waiting:
            left = end - self._clock()
            if left <= 0 or not self._poller.poll(max(1, int(left * 1000))):
                self.close()  # a late arrival must not answer a later crossing
                return self._rest(self._clock(), f"a crossing did not come back in {timeout_s:g} s") if rest else False
            for pull in list(waiting):
                if pull.poll(0):
                    pull.recv(zmq.NOBLOCK)
                    waiting.discard(pull)
        self._rest_s = RETRY_S
        return True

    def _rest(self, now: float, why: str) -> bool:
        if self._rest_s == RETRY_S:  # the first failure of a streak
            log.warning("kvtier: the transport barrier is resting %g s: %s; a loop pass that runs late "
                        "meanwhile fires its deadlines without it (decision T17)", self._rest_s, why)
        self._retry_at = now + self._rest_s
        self._rest_s = min(2 * self._rest_s, MAX_RETRY_S)
        return False

    def settle(self, timeout_s: float, backlog: Callable[[], dict[int, tuple[int, int]]]) -> bool:
        """Cross until a check of ``backlog()`` (per connection fd holding unread bytes: unread and
        received in all, :func:`tcp_backlog`) made before a crossing found that every byte received
        by the first check of its fd was read; at most ``timeout_s`` seconds.  True: what had
        arrived when the call began is in the sockets' queues.  False: the barrier rests or a
        crossing failed, the time ran out while the backlog still moved (no rest then), or a
        crossing moved none of it (a full queue: read first)."""
        end = self._clock() + timeout_s
        targets: dict[int, int] = {}  # fd -> bytes it had received when first seen holding some
        last: dict[int, int] | None = None
        first = True
        while True:
            left = end - self._clock()
            if not first and left <= 0:
                return False
            behind = {}  # fd -> bytes libzmq has read of it, short of its target
            for fd, (unread, received) in backlog().items():
                read = received - unread
                if read < targets.setdefault(fd, received):
                    behind[fd] = read
            if not self.cross(left, rest=first):
                return False
            if not behind:
                return True
            if behind == last:
                return False
            last, first = behind, False

    def close(self) -> None:
        """Close the barrier's sockets (before the context is terminated).  Idempotent."""
        for pull, push in self._pairs:
            pull.close(0)
            push.close(0)
        self._pairs = []
        self._poller = None
