"""A round trip through each of libzmq's I/O threads, repeated until the kernel holds nothing
unread for our connections: proof that what had arrived is in the sockets' queues (decision T17).

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
:meth:`IoBarrier.settle` therefore asks the kernel (``FIONREAD``) how many bytes each connection
still holds, crosses, and repeats until a check found none: every byte that had arrived by then was
read by a round the crossing after it saw finished.  It gives up when a crossing moved none of the
backlog (libzmq stops reading a connection whose queue is full: the owner must read first) or its
time is out.
"""
from __future__ import annotations

import fcntl
import os
import secrets
import termios
import time
from collections.abc import Callable

import zmq

__all__ = ["IoBarrier", "MAX_RETRY_S", "RETRY_S", "unread_bytes"]

RETRY_S = 1.0
"""How long a barrier rests after its first crossing that failed (seconds)."""
MAX_RETRY_S = 60.0
"""The longest rest after failures in a row (seconds)."""


def unread_bytes(fd: int) -> int:
    """Bytes the kernel holds unread on socket ``fd`` (``FIONREAD``); 0 for an fd that is closed
    or not a socket."""
    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), "little", signed=True)
    except OSError:
        return 0


class IoBarrier:
    """The barrier of one context with ``io_threads`` I/O threads; its sockets are made on the
    first :meth:`cross` (most processes never need one) and closed by :meth:`close`."""

    def __init__(self, ctx: zmq.Context, io_threads: int) -> None:
        self._ctx = ctx
        self._threads = io_threads
        self._pairs: list[tuple[zmq.Socket, zmq.Socket]] = []
        self._poller: zmq.Poller | None = None
        self._owed: dict[zmq.Socket, int] = {}  # crossings sent through a pair, not back yet
        self._retry_at = 0.0  # a barrier that could not be made, or timed out, rests until then
        self._rest_s = RETRY_S

    def _open(self) -> None:
        base = f"ipc://@kvtier-barrier-{os.getpid()}-{secrets.token_hex(6)}"
        poller = zmq.Poller()
        try:
            for i in range(self._threads):
                pull, push = self._ctx.socket(zmq.PULL), self._ctx.socket(zmq.PUSH)
                self._pairs.append((pull, push))
                self._owed[pull] = 0
                for s in (pull, push):
                    s.setsockopt(zmq.LINGER, 0)
                    s.setsockopt(zmq.AFFINITY, 1 << i)  # this I/O thread carries both ends
                pull.bind(f"{base}-{i}")
                push.connect(f"{base}-{i}")
                poller.register(pull, zmq.POLLIN)
        except (zmq.ZMQError, OverflowError):
            self.close()
            raise
        self._poller = poller

    def cross(self, timeout_s: float) -> bool:
        """Send through every I/O thread and wait up to ``timeout_s`` seconds for all of it to
        come back.  True: each thread ran since the call began, so a read pass now finds what
        the kernel held then.  False: not within ``timeout_s`` (a starved I/O thread), or the
        barrier could not be set up — the caller goes on as without one."""
        now = time.monotonic()
        if now < self._retry_at:
            return False
        if self._poller is None:
            try:
                self._open()
            except (zmq.ZMQError, OverflowError):  # OverflowError: a 64th thread has no affinity bit
                return self._rest(now)
        assert self._poller is not None
        end = now + timeout_s
        owed, sent = self._owed, True
        for pull, push in self._pairs:
            try:
                push.send(b"", zmq.NOBLOCK)
                owed[pull] += 1
            except zmq.ZMQError:  # its pipe is full of earlier crossings still on their way
                sent = False
        # every crossing sent so far must be back, a late one of an earlier call included: a stale
        # arrival proves nothing about this call's start
        while any(owed.values()):
            left = end - time.monotonic()
            if left <= 0:
                return self._rest(time.monotonic())
            for sock, _ in self._poller.poll(max(1, int(left * 1000))):
                while owed[sock] and sock.get(zmq.EVENTS) & zmq.POLLIN:
                    sock.recv(zmq.NOBLOCK)
                    owed[sock] -= 1
        self._rest_s = RETRY_S
        return sent

    def _rest(self, now: float) -> bool:
        """A crossing that could not be made or did not come back (no fds left, a starved or
        broken pipe): the next ones answer False at once for a while (doubling, at most
        :data:`MAX_RETRY_S`), so a caller that crosses on every late pass does not wait each time."""
        self._retry_at = now + self._rest_s
        self._rest_s = min(2 * self._rest_s, MAX_RETRY_S)
        return False

    def settle(self, timeout_s: float, unread: Callable[[], dict[int, int]]) -> bool:
        """Cross until a check of ``unread()`` (bytes held in the kernel, per connection fd, only
        those above 0) made before a crossing found nothing; at most ``timeout_s`` seconds.  True:
        what had arrived when the call began is in the sockets' queues.  False: a crossing failed,
        the time ran out, or a crossing moved none of the backlog (a full queue)."""
        end = time.monotonic() + timeout_s
        last: dict[int, int] | None = None
        while True:
            pending = unread()
            if not self.cross(end - time.monotonic()):
                return False
            if not pending:
                return True
            if pending == last:
                return False
            last = pending

    def close(self) -> None:
        """Close the barrier's sockets (before the context is terminated).  Idempotent."""
        for pull, push in self._pairs:
            pull.close(0)
            push.close(0)
        self._pairs = []
        self._owed = {}
        self._poller = None
