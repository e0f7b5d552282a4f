"""Landings: how a plane puts a ``block_data``'s blocks into their slots and checks them, on the
caller's thread or on the manager's digest pool.

Both planes land through one :class:`Landings`: the zmq plane copies the payload frames into the
slots and checks each block right after copying it (:func:`kvtier.integrity.land_blocks`: one pass
over cache-hot bytes); the NIXL plane only checks (the producer's WRITE put the bytes there).  A
landing of at most :data:`INLINE_LAND_BYTES` is done on the caller's thread and its result returned
at once; a larger one runs on the :class:`~kvtier.integrity.DigestPool`, in parallel over its
threads and off the thread that holds the manager's lock, and :meth:`Landings.poll` reports it
(:class:`~kvtier.dataplane.base.Landed`) once done.  Without a pool (config ``digest_threads=0``)
every landing is done on the caller's thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, wait
from typing import Any, Final

from kvtier.dataplane.base import Landed
from kvtier.integrity import DigestPool, check_blocks, land_blocks

__all__ = ["INLINE_LAND_BYTES", "LANDING_WAIT_S", "Landings"]

log = logging.getLogger("kvtier.dataplane")

INLINE_LAND_BYTES: Final = 1 << 20
"""A landing of at most this many bytes is done on the caller's thread: ~50-100 µs of copy and
hash, against one more tick (up to the poll interval, 1 ms by default) before a pool's result is
read — and a request's last, small batch is the one whose latency shows (decision I14)."""

LANDING_WAIT_S: Final = 0.001
"""While a landing runs on a pool that wakes nobody when its work ends (its ``notify`` unset: a
plane driven without an I/O loop), the longest wait before polling the plane again (seconds).  An
I/O loop's pool wakes the loop as each landing ends, so its loop waits for that instead of
polling (decision C35)."""


class Landings:
    """The landings of one plane.

    Args:
        pool: the block pool (``buffer(slot)``, ``block_bytes``).
        algorithm: the digest algorithm both peers agreed on (``"none"``: copy, check nothing).
        digests: the manager's digest pool, or ``None`` (everything on the caller's thread).

    Not thread-safe: the manager calls it under its lock (the pool's threads only run the
    submitted work).
    """

    def __init__(self, pool: Any, algorithm: str, digests: DigestPool | None) -> None:
        self._pool = pool
        self._block_bytes = int(pool.block_bytes)
        self._algorithm = algorithm
        self._digests = digests
        self._pending: list[tuple[str, Any, Future[int], tuple[Any, ...]]] = []
        self._per_peer: dict[str, int] = {}

    def land(self, peer: str, key: Any, slots: Sequence[int], payloads: Sequence[Any] | None,
             digests: Sequence[int]) -> int | None:
        """Land (``payloads``: copy them in first; ``None``: already written) and check ``slots``.
        Returns the first mismatching index or ``-1`` when done here, else ``None`` (see the
        module docstring).

        Raises:
            ValueError: a payload's size is not the block size (nothing copied).
        """
        pool = self._pool
        dsts = [pool.buffer(s) for s in slots]
        if payloads is not None:
            for i, p in enumerate(payloads):
                n = p.nbytes if isinstance(p, memoryview) else len(p)
                if n != self._block_bytes:
                    raise ValueError(f"payload frame {i} has {n} bytes, the block size is {self._block_bytes}")
        if self._digests is None or len(slots) * self._block_bytes <= INLINE_LAND_BYTES:
            if payloads is None:
                return check_blocks(dsts, digests, self._algorithm)
            return land_blocks(dsts, payloads, digests, self._algorithm)
        if payloads is None:
            fut = self._digests.submit_check(dsts, digests, self._algorithm)
        else:
            fut = self._digests.submit_land(dsts, payloads, digests, self._algorithm)
        # the payload frames stay referenced until the copy ended
        self._pending.append((peer, key, fut, tuple(payloads or ())))
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        return None

    def pending(self, peer: str | None = None) -> int:
        """Landings still running (of ``peer``, or all)."""
        return len(self._pending) if peer is None else self._per_peer.get(peer, 0)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for every landing still running; whether they all
        ended (their reports come from the next :meth:`poll`)."""
        if not self._pending:
            return True
        _, not_done = wait([item[2] for item in self._pending], timeout=timeout_s)
        return not not_done

    def max_wait_s(self) -> float | None:
        """:data:`LANDING_WAIT_S` while a landing runs on a pool whose end wakes nobody, else
        ``None`` (nothing runs, or the pool's ``notify`` ends the owner's wait: C35)."""
        woken = self._digests is None or self._digests.notify is not None
        return LANDING_WAIT_S if self._pending and not woken else None

    def poll(self) -> list[Landed]:
        """The landings that ended since the last call, in the order they were started."""
        if not self._pending:
            return []
        out: list[Landed] = []
        left = []
        for item in self._pending:
            if item[2].done():
                out.append(self._report(item))
            else:
                left.append(item)
        self._pending = left
        return out

    def _report(self, item: tuple[str, Any, Future[int], tuple[Any, ...]]) -> Landed:
        peer, key, fut, _ = item
        n = self._per_peer[peer] - 1
        if n:
            self._per_peer[peer] = n
        else:
            del self._per_peer[peer]
        try:
            bad = fut.result()
        except Exception as exc:  # noqa: BLE001 - a landing that could not run is not a success
            log.error("kvtier: landing %r from %s failed in the digest pool: %s", key, peer, exc)
            bad = 0
        return Landed(peer, key, bad)

    def close(self) -> list[Landed]:
        """Wait for every landing still running and report it (nothing may write into the pool
        once the manager has shut down)."""
        out = [self._report(item) for item in self._pending]  # result() waits for each
        self._pending = []
        self._pool = None
        return out
