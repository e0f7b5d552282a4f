"""Work that grows with bytes, off the thread that holds the manager's lock — and the order of the
inputs that wait for it.

Two things cost per byte: the producer's digest of every block it parks (``submit_store``) and
the consumer's landing of every batch (copy, then check against the parked digest; the plane does
it, :mod:`kvtier.dataplane.landing`).  Large ones run on the manager's
:class:`~kvtier.integrity.DigestPool`; their results reach the core as inputs, in an order that
keeps every guarantee the synchronous design gave (decision I14):

* **Stores.**  A store reaches the core (``StoreSubmitted``, with its digests) only once its
  digests are taken; until then it is held here, and so is every later engine input about the
  same id (another store, the consumer its request names, the request's end), so the core sees
  them in the order the engine made them.  Nothing can read the blocks before the core has the
  store (only the core starts a transfer) and no job result can come before it.  An engine input
  about everything (drain, shutdown) first waits for every digest in progress.
* **Landings.**  While a peer's landing runs on the pool, what else arrives from that peer — its
  ``transfer_done``, an ``abort_ack``, a ``hello``, the connection's end, anything but a further
  ``block_data`` — is held behind it, so the core sees each peer's messages in wire order relative
  to the blocks it landed (:func:`kvtier.lifecycle.driver.drive`'s contract: a ``block_data`` is
  landed and checked before what followed it on the wire is looked at).  Further ``block_data``
  are landed alongside, so their checks overlap.  Deadlines fire no later than the arrival of the
  oldest input still held (:meth:`ByteWork.floor`): a landing still running counts as input not
  yet read (decision I3), so a deadline cannot beat blocks that arrived before it.

Small work (a store of at most :data:`INLINE_STORE_BYTES`, a landing of at most
:data:`~kvtier.dataplane.landing.INLINE_LAND_BYTES`) is done on the caller's thread, at once.
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Final

import msgspec

from kvtier.integrity import DigestPool, block_digests
from kvtier.lifecycle import Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle._table import WIRE
from kvtier.wire import messages as wm

__all__ = ["ByteWork", "INLINE_STORE_BYTES", "is_block_data"]

log = logging.getLogger("kvtier.manager")

INLINE_STORE_BYTES: Final = 64 << 10
"""A store of at most this many bytes is hashed on the I/O loop's thread: handing it to the pool
costs the loop about as much (a future, a queue put: ~5-10 µs) as hashing it
(64 KiB: ~3 µs), and its digests are in the core at once."""

_GLOBAL = (ix.DrainStarted, ix.ShutdownStarted, ix.GraceEnded)
_NO_BOUND = float("inf")
_UNSTAMPED = float("-inf")


class _Item:
    """One entry of a queue: a store waiting for its digests (``future``), a landing waiting for
    its result (``key``, ``bad``), or an input held behind one of those (``inp``)."""

    __slots__ = ("seq", "inp", "future", "buffers", "key", "bad", "after")

    def __init__(self, seq: int, inp: Any = None, *, future: Future[Any] | None = None, buffers: Any = None,
                 key: Any = None, after: float = _NO_BOUND) -> None:
        self.seq = seq
        self.inp = inp
        self.future = future
        self.buffers = buffers
        self.key = key
        self.bad: int | None = None
        self.after = after  # peer queues: the input's arrival was after this time (manager clock)

    @property
    def landing(self) -> bool:
        return self.key is not None

    def ready(self) -> bool:
        if self.key is not None:
            return self.bad is not None
        return self.future is None or self.future.done()


def _peer_of(inp: Any) -> str | None:
    """The peer whose wire order ``inp`` is part of (messages and the connection's end)."""
    t = type(inp)
    if t is ix.Received or t is ix.Malformed or t is ix.ConnectionClosed:
        return inp.peer
    return None


#: The message structs whose landing may run on the pool (``lands`` in the spec's routing table).
_LANDS = frozenset(getattr(wm, w.struct) for w in WIRE.values() if w.lands)


def is_block_data(inp: Any) -> bool:
    """Whether ``inp`` is a received ``block_data`` (its landing may run on the pool)."""
    return type(inp) is ix.Received and type(inp.msg) in _LANDS


class ByteWork:
    """The per-byte work of one manager and what waits for it (under the manager's lock).

    Args:
        algorithm: the ``integrity`` digest algorithm (``"none"``: stores need no digests).
        digest_pool: the manager's pool, or ``None`` (``digest_threads=0``: everything on the
            caller's thread).
        block_bytes: the pool's block size (for the landed-bytes counter).
        metrics, logs: counters and rate-limited lines.
    """

    def __init__(self, *, algorithm: str, digest_pool: DigestPool | None, block_bytes: int, metrics: Any,
                 logs: Any) -> None:
        self.algorithm = algorithm
        self.digest_pool = digest_pool
        self._block_bytes = block_bytes
        self._metrics = metrics
        self._logs = logs
        self._seq = itertools.count()
        self._stores: dict[str, deque[_Item]] = {}  # kv_request_id -> held engine inputs
        self._peers: dict[str, deque[_Item]] = {}  # peer -> landings and the inputs held behind them
        self._lands: dict[tuple[str, Any], _Item] = {}  # (peer, key) -> its landing entry
        self._front: str | None = None  # the peer whose queue's head is being applied
        self._after = _NO_BOUND  # the arrival bound of the input being applied
        self._landing_blocks: dict[tuple[str, int], int] = {}  # (kv_request_id, round) -> blocks landing
        pooling = algorithm != "none" and digest_pool is not None
        self.pool_from = INLINE_STORE_BYTES // block_bytes + 1 if pooling else sys.maxsize
        """The fewest blocks a store has for its digests to be taken on the pool, not inline (an
        attribute, not a method: the engine's thread reads it per store, decision C25)."""
        self.settle = False
        """A load's last blocks started landing in this tick while some of its landings run on the
        pool: the loop waits for them before the tick ends (:meth:`last`)."""

    # -- producer: stores ----------------------------------------------------------------------
    def store(self, inp: ix.StoreSubmitted, buffers: Sequence[Any]) -> ix.StoreSubmitted | None:
        """The store ``inp`` (without digests) of blocks ``buffers``: returns it with its digests
        when it may be applied now, or ``None`` when it is held (digests in progress, or an
        earlier input of the same id still held).

        The buffers must stay unchanged until the store's job result (the engine's contract)."""
        held = self._stores.get(inp.kv_request_id)
        if self.algorithm == "none" or not buffers:
            ready: ix.StoreSubmitted | None = inp
        elif len(buffers) < self.pool_from:  # one rule with the loop's wake-up (C34)
            ready = msgspec.structs.replace(inp, digests=block_digests(buffers, self.algorithm))
        else:
            fut = self.digest_pool.submit_digests(buffers, self.algorithm)
            item = _Item(next(self._seq), inp, future=fut, buffers=buffers)
            self._stores.setdefault(inp.kv_request_id, deque()).append(item)
            return None
        if held:
            held.append(_Item(next(self._seq), ready))
            return None
        return ready

    def holds(self, inp: Any) -> bool:
        """Hold engine input ``inp`` if an earlier input about its id is held (True: do not apply
        it now; it comes out of :meth:`inputs` in its turn)."""
        t = type(inp)
        if t is ix.ConsumerNamed or (t is ix.RequestFinished and inp.producer):
            q = self._stores.get(inp.kv_request_id)
            if q:
                q.append(_Item(next(self._seq), inp))
                return True
        return False

    def flush(self) -> list[ix.Input]:
        """Wait for every digest in progress; every held engine input, in the order the engine
        made them (for an engine input about everything: drain, shutdown)."""
        items = sorted((i for q in self._stores.values() for i in q), key=lambda i: i.seq)
        self._stores.clear()
        return [self._engine_input(i) for i in items]

    def _engine_input(self, item: _Item) -> Any:
        if item.future is None:
            return item.inp
        try:
            digests = item.future.result()  # waits, for a flush
        except Exception as exc:  # noqa: BLE001 - cannot happen for pool buffers; never lose the store
            log.error("kvtier: digests of store job %d failed in the pool (%s); taking them here",
                      item.inp.job_id, exc)
            digests = block_digests(item.buffers, self.algorithm)
        item.buffers = None
        # its park age starts as it is applied, not as it was held: a scrape meanwhile forgets
        # ages of ids the core does not show parked
        self._metrics.parked(item.inp.kv_request_id)
        return msgspec.structs.replace(item.inp, digests=digests)

    # -- consumer: landings --------------------------------------------------------------------
    def landing(self, peer: str, key: Any) -> None:
        """A landing of ``peer`` runs on the pool (the plane reports it as ``Landed`` with ``key``):
        what arrives from ``peer`` after it waits for it."""
        item = _Item(next(self._seq), key=key, after=self._after)
        q = self._peers.setdefault(peer, deque())
        if self._front == peer:
            q.appendleft(item)  # it came from the queue's head: it precedes what the queue still holds
        else:
            q.append(item)
        self._lands[(peer, key)] = item
        load = (key[0], key[1])
        self._landing_blocks[load] = self._landing_blocks.get(load, 0) + key[3]

    def last(self, key: Any, landed: int, blocks: int) -> bool:
        """Whether landing ``key`` = ``(kv_request_id, round, first, count)`` is a load's last:
        ``landed`` of its ``blocks`` blocks landed already and the others land now (on the pool
        or in this call)."""
        return landed + self._landing_blocks.get((key[0], key[1]), 0) + key[3] >= blocks

    def landed(self, peer: str, key: Any, bad: int) -> None:
        """The plane reports the landing ``key`` of ``peer`` ended (``bad``: first mismatch, -1)."""
        item = self._lands.pop((peer, key), None)
        if item is None:  # pragma: no cover - every pool landing was registered by landing()
            log.error("kvtier: a landing nobody waits for was reported (%s %r)", peer, key)
            return
        item.bad = bad
        load = (key[0], key[1])
        n = self._landing_blocks.get(load, 0) - key[3]
        if n > 0:
            self._landing_blocks[load] = n
        else:
            self._landing_blocks.pop(load, None)

    def results(self, peer: str, key: Any, bad: int) -> list[ix.BlocksLanded]:
        """The ``blocks_landed`` inputs for landing ``key`` = ``(kv_request_id, round, first,
        count)`` of ``peer`` (``bad``: index of the first mismatching block, -1: all matched).  The
        blocks before a mismatch were checked and hold their parked bytes: they are reported
        landed, so a failed load still names them as its successful keys, whatever the batching."""
        kid, rnd, first, count = key
        good = count if bad < 0 else bad
        out = []
        if good:
            self._metrics.landed(good * self._block_bytes)
            out.append(ix.BlocksLanded(peer, kid, rnd, first, good, True))
        if bad >= 0:
            self._logs(peer, "corrupt",
                       "kvtier: block %d of %s round %d from %s does not match the digest its producer sent "
                       "(taken when it parked it, or as its serve began; none sent counts as a mismatch); "
                       "the load fails",
                       first + bad, kid, rnd, self._logs.who(peer))
            out.append(ix.BlocksLanded(peer, kid, rnd, first + bad, count - bad, False, Reason.CORRUPT))
        return out

    # -- the inputs of one tick ----------------------------------------------------------------
    def inputs(self, batch: Iterable[ix.Input], after: float | None = None) -> Iterator[ix.Input]:
        """What the core applies this pass, lazily (each input is decided on after the previous
        one's effects were performed): the stores whose digests are done and what was held behind
        them; the landings that ended and what was held behind them; then ``batch`` (inputs read
        this pass, each stamped with when it arrived after: its ``after``, or this call's
        ``after`` for an input that carries no stamp), of which a peer's input is held if an
        earlier landing or input of that peer still waits (a ``block_data`` only behind a held
        input)."""
        default = _UNSTAMPED if after is None else after
        ready = sorted((i.seq, kid) for kid, q in self._stores.items() for i in self._ready_prefix(q))
        for _, kid in ready:
            q = self._stores[kid]
            item = q.popleft()
            if not q:
                del self._stores[kid]
            yield self._engine_input(item)
        for peer in list(self._peers):
            q = self._peers[peer]
            while q and q[0].ready():
                item = q.popleft()
                if item.landing:
                    yield from self.results(peer, item.key, item.bad)  # type: ignore[arg-type]
                    continue
                self._front, self._after = peer, item.after
                try:
                    yield item.inp
                finally:
                    self._front, self._after = None, _NO_BOUND
            if not q:
                del self._peers[peer]
        for inp in batch:
            peer = _peer_of(inp)
            if peer is not None:
                stamp = inp.after if inp.after != _UNSTAMPED else default
                q = self._peers.get(peer)
                if q and not (is_block_data(inp) and all(i.landing for i in q)):
                    q.append(_Item(next(self._seq), inp, after=stamp))
                    continue
                self._after = stamp
                try:
                    yield inp
                finally:
                    self._after = _NO_BOUND
            else:
                yield inp

    @staticmethod
    def _ready_prefix(q: deque[_Item]) -> Iterator[_Item]:
        for item in q:
            if not item.ready():
                return
            yield item

    # -- what the loop asks ----------------------------------------------------------------------
    def ready(self) -> bool:
        """True when :meth:`inputs` would release something held."""
        return any(q and q[0].ready() for q in self._stores.values()) or any(
            q and q[0].ready() for q in self._peers.values())

    def floor(self) -> float:
        """Deadlines may fire up to this time at most: the earliest arrival bound of a landing or
        input still held (``inf`` when nothing is held)."""
        if not self._peers:
            return _NO_BOUND
        return min(i.after for q in self._peers.values() for i in q)

    def held(self) -> int:
        """Entries held (stores, landings and the inputs behind them)."""
        return sum(len(q) for q in self._stores.values()) + sum(len(q) for q in self._peers.values())

    def drain(self) -> Iterator[ix.Input]:
        """For the end of the manager (after the plane's close reported every landing): every
        held input, in order."""
        return self.inputs(())
