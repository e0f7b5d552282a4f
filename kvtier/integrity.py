"""Block digests: what makes "the consumer has the parked bytes" checkable end to end.

The producer takes a 64-bit digest of every block when the engine parks it (``submit_store``),
before any data plane could touch it; the digests travel with the transfer (``block_data``) and
the consumer checks every block as it lands.  A block whose bytes changed in between — the engine
reused it while a send still read it (scenarios B26/B32, docs/scenarios.md), a plane wrote the wrong slot, a
link corrupted it — fails the load with reason ``corrupt`` instead of being reported as a
success.  Decision I2: success means the consumer has the parked bytes.

The digest is XXH3-64 from the maintained ``xxhash`` package: not cryptographic (it detects
accidents, not a forging producer — an authenticated peer is trusted with the bytes it sends, see
docs/security.md) but as fast as memory can be read (docs/decisions.md I13: on this 2-vCPU host one thread
reads DRAM at ~20 GB/s and XXH3 keeps up with it; BLAKE3, CRC32C, MurmurHash3, BLAKE2b and SHA-256
were measured slower per core).  ``"none"`` turns the check off; both peers must agree, it is part
of the handshake.

Two ways to take digests:

* the serial functions :func:`digest`, :func:`block_digests`, :func:`check_blocks`, on the
  calling thread;
* a :class:`DigestPool`: a request's blocks split over a few threads, so that neither the
  engine's thread nor one core carries the bytes.  ``xxhash`` (>= 4.0) releases the GIL while it
  hashes a buffer larger than :data:`GIL_RELEASE_BYTES`, so threads hashing blocks above that
  size run in parallel; at or below it every call holds the GIL, so such a request is hashed by
  one thread that yields the GIL every :data:`YIELD_BYTES` (a thread hashing small blocks back to
  back otherwise keeps every other Python thread — the engine's — waiting for a whole 5 ms
  switch interval: measured, a sleeping thread woke 5.3 ms late instead of 0.13 ms).
"""

from __future__ import annotations

import atexit
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Final, TypeVar

import numpy as np
import xxhash

from kvtier.errors import KvTierError

__all__ = [
    "ALGORITHMS",
    "DigestPool",
    "DigestPoolClosed",
    "GIL_RELEASE_BYTES",
    "MAX_DEFAULT_THREADS",
    "MIN_PART_BYTES",
    "YIELD_BYTES",
    "block_digests",
    "check_blocks",
    "default_threads",
    "digest",
    "land_blocks",
    "usable_cpus",
]

ALGORITHMS: Final = ("xxh3_64", "none")
"""Digest algorithms a config may name (``integrity`` key); the handshake compares them."""

GIL_RELEASE_BYTES: Final = 64 << 10
"""``xxhash`` releases the GIL only for an input *longer* than this (its ``XXHASH_GIL_MINSIZE``)."""

MIN_PART_BYTES: Final = 1 << 20
"""A pool splits a request into parts of at least this many bytes: handing a part to a thread
costs tens of µs, as long as hashing ~1 MiB."""

YIELD_BYTES: Final = 256 << 10
"""A part of GIL-holding (small) blocks gives the GIL up after each this many bytes."""

MAX_DEFAULT_THREADS: Final = 8
"""The default pool size never exceeds this: 8 cores of XXH3 read 80+ GB/s, past any NIC's rate."""

_xxh3 = xxhash.xxh3_64_intdigest


def _copy(dst: Buffer, src: Buffer) -> None:
    # numpy's copy releases the GIL (a memoryview slice assignment holds it: measured, another
    # Python thread ran at 0.6x its speed during one, at full speed during this)
    np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))

# Gives the GIL up for a moment (CPython releases it around the syscall).  Not time.sleep(0):
# Linux's timer slack makes that ~50 µs, which cut a pool's rate over 64 KiB blocks from 17 to
# 2.7 GB/s here; sched_yield costs ~1 µs.
_yield_gil: Callable[[], Any] = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))

Buffer = Any
"""Anything with the C-contiguous buffer protocol: ``memoryview``, ``bytes``, ``bytearray``, numpy."""


def digest(buf: Buffer) -> int:
    """XXH3-64 of one block's bytes, as an unsigned int in [0, 2**64)."""
    return _xxh3(buf)


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown digest algorithm {algorithm!r}; expected one of {ALGORITHMS}")


def block_digests(buffers: Sequence[Buffer], algorithm: str) -> tuple[int, ...]:
    """One digest per buffer (``()`` when ``algorithm`` is ``"none"``), on the calling thread.

    Raises:
        ValueError: ``algorithm`` is not one of :data:`ALGORITHMS`.
    """
    if algorithm == "none":
        return ()
    _check_algorithm(algorithm)
    return tuple(_xxh3(b) for b in buffers)


def check_blocks(buffers: Sequence[Buffer], expected: Sequence[int], algorithm: str) -> int:
    """Index of the first buffer whose digest differs from ``expected`` (``-1``: all match).

    With ``algorithm == "none"`` nothing is checked (``-1``).  A digest list of the wrong length
    counts as a mismatch at index 0: a peer that agreed on digests must send one per block.

    Raises:
        ValueError: ``algorithm`` is not one of :data:`ALGORITHMS`.
    """
    if algorithm == "none":
        return -1
    _check_algorithm(algorithm)
    if len(expected) != len(buffers):
        return 0
    for i, (b, d) in enumerate(zip(buffers, expected)):
        if _xxh3(b) != d:
            return i
    return -1


def land_blocks(dsts: Sequence[Buffer], srcs: Sequence[Buffer], expected: Sequence[int], algorithm: str) -> int:
    """Copy ``srcs[i]`` into ``dsts[i]`` and check ``dsts[i]`` against ``expected[i]``, block by
    block: each hash reads the block just written, while its bytes are still in the cache (one
    pass over hot bytes instead of a copy pass and a check pass).  Returns the index of the first
    mismatching block, ``-1`` when all match (``algorithm == "none"``: copies only, ``-1``).  A
    digest list of the wrong length is a mismatch at 0 (nothing copied).  Blocks after the first
    mismatch are not copied.

    Raises:
        ValueError: a source and its destination differ in size (blocks before it were copied), or
            ``algorithm`` is not one of :data:`ALGORITHMS`.
    """
    _check_algorithm(algorithm)
    check = algorithm != "none"
    if check and len(expected) != len(srcs):
        return 0
    if len(dsts) != len(srcs):
        raise ValueError(f"{len(srcs)} blocks for {len(dsts)} destinations")
    for i, (d, s) in enumerate(zip(dsts, srcs)):
        if _nbytes(d) != _nbytes(s):
            raise ValueError(f"block {i} has {_nbytes(s)} bytes, its destination {_nbytes(d)}")
        _copy(d, s)
        if check and _xxh3(d) != expected[i]:
            return i
    return -1


# -- sizing -----------------------------------------------------------------------------------------


def _cgroup_cpus() -> float | None:
    """The cgroup v2 CPU quota of this process in cores (``cpu.max``), ``None`` when unlimited or
    unreadable.  A container limited to 2 cores on a 64-core host shows 64 in its affinity."""
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")), None)
        if rel is None:
            return None
        with open(os.path.join("/sys/fs/cgroup", rel.lstrip("/"), "cpu.max")) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError, IndexError):
        return None
    if quota == "max":
        return None
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 quota (rounded
    up), at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        n = min(n, math.ceil(quota))
    return max(1, n)


def default_threads() -> int:
    """A digest pool's default size: ``min(usable_cpus(), MAX_DEFAULT_THREADS)``."""
    return min(usable_cpus(), MAX_DEFAULT_THREADS)


# -- the pool ---------------------------------------------------------------------------------------


class DigestPoolClosed(KvTierError, RuntimeError):
    """A digest or check was submitted to a :class:`DigestPool` after :meth:`~DigestPool.close`."""


T = TypeVar("T")


def _plan(sizes: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """Cut ``range(len(sizes))`` into at most ``parts`` contiguous ``(start, end)`` ranges of
    about equal bytes, none empty."""
    n = len(sizes)
    parts = min(parts, n)
    if parts <= 1:
        return [(0, n)]
    total = sum(sizes)
    out: list[tuple[int, int]] = []
    start, acc = 0, 0
    for i, s in enumerate(sizes):
        acc += s
        # close the current range once it holds its share of the bytes, leaving a block for
        # each range still to come
        if len(out) < parts - 1 and acc * parts >= total * (len(out) + 1) and n - (i + 1) >= parts - 1 - len(out):
            out.append((start, i + 1))
            start = i + 1
    out.append((start, n))
    return [r for r in out if r[0] < r[1]]


def _nbytes(b: Buffer) -> int:
    n = getattr(b, "nbytes", None)
    return int(n) if n is not None else len(b)


class _Job:
    """One submitted request: its parts write into ``out`` and the last one resolves ``future``."""

    __slots__ = ("future", "remaining", "lock", "error", "bad")

    def __init__(self, future: Future[Any], parts: int) -> None:
        self.future = future
        self.remaining = parts
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.bad = -1  # smallest mismatching index found so far (checks)

    def part_done(self, result: Callable[[], Any]) -> bool:
        """One part ended; the last one resolves the future (then True)."""
        with self.lock:
            self.remaining -= 1
            last = self.remaining == 0
        if not last:
            return False
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(result())
        return True

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = exc


class DigestPool:
    """Digests and checks of many blocks at once, split over a few threads.

    Each request (one call) is cut into contiguous ranges of its blocks, at most one per thread
    and each of at least :data:`MIN_PART_BYTES` (a request of blocks no larger than
    :data:`GIL_RELEASE_BYTES` is one range: those hashes hold the GIL, so threads would only take
    turns).  A block is never split: its digest is the plain XXH3-64 of its bytes, whatever thread
    took it, identical to :func:`digest`.

    Args:
        threads: worker threads (>= 1); default :func:`default_threads`.
        name: prefix of the worker threads' names.

    Raises:
        ValueError: ``threads`` is not a positive int.

    Threading: every method may be called from any thread.  Workers start on the first submit
    (none exist before), :meth:`close` joins them.  The buffers passed in must stay valid and
    unmodified until the returned future is done — that is the point: a digest taken from bytes
    being rewritten is a digest of neither version.
    """

    def __init__(self, threads: int | None = None, *, name: str = "kvtier-digest") -> None:
        if threads is None:
            threads = default_threads()
        if type(threads) is not int or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        self._threads = threads
        self._name = name
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._closed = False
        self.notify: Callable[[], None] | None = None
        """Called on a worker thread after a request's future resolved (an I/O loop's wake-up, so a
        loop sleeping in its poll learns at once that work it waits for is done)."""
        _LIVE.add(self)

    @property
    def threads(self) -> int:
        """The most worker threads this pool runs."""
        return self._threads

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("started" if self._workers else "idle")
        return f"DigestPool(threads={self._threads}, {state})"

    # -- submitting ------------------------------------------------------------------------------
    def submit_digests(self, buffers: Sequence[Buffer], algorithm: str = "xxh3_64") -> Future[tuple[int, ...]]:
        """Start taking one digest per buffer; the future's result equals
        :func:`block_digests` ``(buffers, algorithm)``.

        ``()`` (already done) for ``algorithm == "none"`` or no buffers.  A buffer the hash cannot
        read (not a contiguous buffer) makes the future raise the hash's ``TypeError``/``ValueError``.

        Raises:
            ValueError: ``algorithm`` is not one of :data:`ALGORITHMS`.
            DigestPoolClosed: the pool is closed.
        """
        _check_algorithm(algorithm)
        self._check_open()
        bufs = list(buffers)
        if algorithm == "none" or not bufs:
            return _done(())
        out: list[int] = [0] * len(bufs)

        def run(start: int, end: int, job: _Job) -> None:
            small = _is_small(bufs, start, end)
            since_yield = 0
            for i in range(start, end):
                out[i] = _xxh3(bufs[i])
                if small:
                    since_yield += _nbytes(bufs[i])
                    if since_yield >= YIELD_BYTES:
                        since_yield = 0
                        _yield_gil()  # see the module docstring

        return self._submit(bufs, run, lambda job: tuple(out))

    def submit_check(
        self, buffers: Sequence[Buffer], expected: Sequence[int], algorithm: str = "xxh3_64"
    ) -> Future[int]:
        """Start checking every buffer against its expected digest; the future's result equals
        :func:`check_blocks` ``(buffers, expected, algorithm)``: the index of the **first**
        mismatching buffer, or ``-1`` when all match (or ``algorithm == "none"``).  A digest list
        of the wrong length is a mismatch at 0 (no hashing).  Ranges stop early once a mismatch
        before them is known.

        Raises:
            ValueError: ``algorithm`` is not one of :data:`ALGORITHMS`.
            DigestPoolClosed: the pool is closed.
        """
        _check_algorithm(algorithm)
        self._check_open()
        bufs = list(buffers)
        if algorithm == "none":
            return _done(-1)
        want = list(expected)
        if len(want) != len(bufs):
            return _done(0)
        if not bufs:
            return _done(-1)

        def run(start: int, end: int, job: _Job) -> None:
            small = _is_small(bufs, start, end)
            since_yield = 0
            for i in range(start, end):
                bad = job.bad
                if 0 <= bad < i:  # an earlier range already found the first mismatch
                    return
                if _xxh3(bufs[i]) != want[i]:
                    with job.lock:
                        if job.bad < 0 or i < job.bad:
                            job.bad = i
                    return
                if small:
                    since_yield += _nbytes(bufs[i])
                    if since_yield >= YIELD_BYTES:
                        since_yield = 0
                        _yield_gil()

        return self._submit(bufs, run, lambda job: job.bad)

    def submit_land(
        self, dsts: Sequence[Buffer], srcs: Sequence[Buffer], expected: Sequence[int], algorithm: str = "xxh3_64"
    ) -> Future[int]:
        """Start :func:`land_blocks` ``(dsts, srcs, expected, algorithm)`` on the pool's threads (each
        range copies and checks its blocks); the future's result is the index of the first
        mismatching block, or ``-1``.  Every block is copied, whatever mismatches (ranges run in
        parallel).  Sizes are checked here, before anything is copied.

        Raises:
            ValueError: the lists differ in length, a source and its destination differ in size,
                or ``algorithm`` is not one of :data:`ALGORITHMS`.
            DigestPoolClosed: the pool is closed.
        """
        _check_algorithm(algorithm)
        self._check_open()
        ds, ss = list(dsts), list(srcs)
        check = algorithm != "none"
        if check and len(expected) != len(ss):
            return _done(0)
        if len(ds) != len(ss):
            raise ValueError(f"{len(ss)} blocks for {len(ds)} destinations")
        for i, (d, s) in enumerate(zip(ds, ss)):
            if _nbytes(d) != _nbytes(s):
                raise ValueError(f"block {i} has {_nbytes(s)} bytes, its destination {_nbytes(d)}")
        if not ds:
            return _done(-1)
        want = list(expected)

        def run(start: int, end: int, job: _Job) -> None:
            for i in range(start, end):
                d = ds[i]
                _copy(d, ss[i])
                if check and _xxh3(d) != want[i]:
                    with job.lock:
                        if job.bad < 0 or i < job.bad:
                            job.bad = i

        return self._submit(ds, run, lambda job: job.bad)

    def _submit(
        self,
        bufs: list[Buffer],
        run: Callable[[int, int, _Job], None],
        result: Callable[[_Job], T],
    ) -> Future[T]:
        sizes = [_nbytes(b) for b in bufs]
        total = sum(sizes)
        if total <= GIL_RELEASE_BYTES * len(bufs):  # small blocks: the GIL serialises them anyway
            parts = 1
        else:
            parts = max(1, min(self._threads, len(bufs), total // MIN_PART_BYTES))
        ranges = _plan(sizes, parts)
        future: Future[T] = Future()
        future.set_running_or_notify_cancel()  # a submitted request always runs to its end
        job = _Job(future, len(ranges))

        def part(start: int, end: int) -> None:
            try:
                run(start, end, job)
            except BaseException as exc:  # noqa: BLE001 - handed to the future's reader
                job.fail(exc)
            if job.part_done(lambda: result(job)):
                notify = self.notify
                if notify is not None:
                    notify()

        with self._lock:
            self._check_open()
            if not self._workers:
                self._start()
            for start, end in ranges:
                self._queue.put(lambda start=start, end=end: part(start, end))
        return future

    def _start(self) -> None:
        # daemon threads, closed by the atexit hook: a pool nobody closed must not hang the exit
        for i in range(self._threads):
            t = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
            t.start()
            self._workers.append(t)

    def _work(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is None:
                return
            item()

    # -- closing ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Let the requests already submitted finish, then join the worker threads.  Idempotent;
        later submits raise :class:`DigestPoolClosed`.  Called from one of the pool's own
        threads (a done-callback), it does not wait for that thread to end."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers, self._workers = self._workers, []
            for _ in workers:
                self._queue.put(None)  # after every part already queued
        me = threading.current_thread()
        for t in workers:
            if t is not me:
                t.join()
        _LIVE.discard(self)

    def __enter__(self) -> DigestPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise DigestPoolClosed("the digest pool is closed; no digest or check can be submitted to it")


_LIVE: weakref.WeakSet[DigestPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE):
        pool.close()


def _is_small(bufs: Sequence[Buffer], start: int, end: int) -> bool:
    """Whether the range's first block holds the GIL while hashed (requests are uniform)."""
    return _nbytes(bufs[start]) <= GIL_RELEASE_BYTES


def _done(value: T) -> Future[T]:
    f: Future[T] = Future()
    f.set_result(value)
    return f
