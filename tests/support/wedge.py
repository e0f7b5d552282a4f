"""Wedged and slow processes, made with SIGSTOP / SIGCONT.

A SIGSTOPped process stops *everything*, its libzmq I/O threads included: it reads nothing from
its sockets, so whatever a peer sends piles up in the kernel's socket buffers (a few MiB) and then
in the peer's own zmq queues, where zero-copy frames stay referenced.  That is the wedged
consumer of bug-scenarios B21/B32 — alive (its TCP connection stays up, nothing is reset) but
making no progress.  :class:`Throttle` alternates short runs and stops: a consumer that still
receives, slowly (B26's long transfer, made long by a slow consumer rather than by long real
time).

Both always leave the process running (SIGCONT) on exit, also when the body raised.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Throttle", "cont", "stop", "stopped"]


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` (no-op if it is gone)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass


def cont(pid: int) -> None:
    """SIGCONT ``pid`` (no-op if it is gone)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """``pid`` is stopped inside the block and continued after it."""
    stop(pid)
    try:
        yield
    finally:
        cont(pid)


class Throttle:
    """Let ``pid`` run ``run_s`` seconds out of every ``run_s + stop_s`` (a slow process).

    A daemon thread sends SIGCONT/SIGSTOP; :meth:`close` (or leaving the ``with`` block) stops the
    thread and leaves the process running.  Durations are only what is asked of the scheduler:
    on a loaded machine the process may run less.
    """

    def __init__(self, pid: int, *, run_s: float = 0.003, stop_s: float = 0.05) -> None:
        if run_s <= 0 or stop_s <= 0:
            raise ValueError(f"run_s and stop_s must be > 0, got {run_s}, {stop_s}")
        self.pid, self.run_s, self.stop_s = pid, run_s, stop_s
        self.cycles = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"throttle-{pid}", daemon=True)

    def _loop(self) -> None:
        try:
            while not self._done.is_set():
                stop(self.pid)
                if self._done.wait(self.stop_s):
                    break
                cont(self.pid)
                self.cycles += 1
                self._done.wait(self.run_s)
        finally:
            cont(self.pid)

    def start(self) -> Throttle:
        self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        cont(self.pid)

    def __enter__(self) -> Throttle:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
