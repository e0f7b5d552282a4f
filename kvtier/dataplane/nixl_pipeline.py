"""The producer's WRITE pipeline on the NIXL plane: a transfer's batches become as few WRITEs as a
notification allows, posted the moment the window has room, and every outcome is taken as soon as
the agent reports it (decisions N8, I15, N18, N19).

A transfer's ``block_data`` batches (the core's plan, :mod:`kvtier.lifecycle.batches`: 8 MiB,
tapering to 1 MiB) are *packed*: consecutive batches of the transfer's largest size share one WRITE of at most
:data:`WRITE_BYTES`, whose notification carries each batch's header (:func:`pack_headers`, at most
:data:`~kvtier.dataplane.nixl_types.MAX_NOTIF_BYTES` in all), so the consumer still checks batch by
batch; the taper's smaller batches go alone, so what is left to check after the last bytes stays
small.  Only a consumer whose descriptor says it reads packed notifications gets them
(``_Hello.packed``); to any other every batch is its own WRITE, as before.

Over CMA a WRITE's copy runs inside its post, so :meth:`WritePipeline.drive` posts, takes the
outcome (which is what makes NIXL send the notification) and posts the next in one loop until the
window is full, the transfer is done or the call has run :data:`DRIVE_S`; over UCX tcp or RDMA
the WRITEs in flight keep the link busy while the next poll takes their outcomes — at most what
the peer's link drains in half the abort timeout, at most :data:`WINDOW_BYTES`, and one piece of
:data:`SLOW_START_BYTES` at a time until the first WRITE's end shows its rate; a batch larger than
the window goes in pieces, its header on the last (:mod:`kvtier.dataplane.pace`, decision T23: a
cancel or a give-up leaves no more to drain before its answer).  A call cut by its budget leaves
:attr:`WritePipeline.backlog` set: the loop then reads its sockets and comes back at once, without
waiting out a progress interval (decision N22).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import msgspec

from kvtier.dataplane.base import Batch, Released
from kvtier.dataplane.nixl_types import MAX_NOTIF_BYTES, NixlError, XferResult
from kvtier.dataplane.pace import Pace

__all__ = ["DRIVE_S", "PACKED", "SLOW_START_BYTES", "WINDOW_BYTES", "WRITE_BYTES", "WritePipeline", "pack_headers",
           "unpack_notification"]

WINDOW_BYTES: Final = 64 << 20
"""Most block bytes one transfer may have in posted, unfinished WRITEs at once, on a link fast
enough: what a cancelled or given-up transfer may still move (decisions N8, T23)."""

WRITE_BYTES: Final = 16 << 20
"""Largest WRITE a packed transfer posts (decision N18: measured as fast as one WRITE of the whole
transfer, where 8 MiB WRITEs posted back to back reached 0.86-0.88 of it)."""

SLOW_START_BYTES: Final = 1 << 20
"""Before a WRITE to a peer ended (its link's rate unknown), a transfer posts pieces of at most
this many bytes (a block at least), one at a time (decision T23)."""

DRIVE_S: Final = 0.002
"""Longest one :meth:`WritePipeline.drive` keeps posting (seconds; it finishes the WRITE it is in:
over CMA one 16 MiB WRITE's copy runs ~5 ms inside its post): the loop's other inputs — a late
consumer's fetch, an abort, a heartbeat — are read between calls, not after a whole transfer
(decision N22)."""

PACKED: Final = b"\xc1"
"""First byte of a notification carrying several headers: ``0xc1`` is the one byte msgpack never
uses, so no single encoded header starts with it."""

_LIST: Final = msgspec.msgpack.Decoder(list[bytes])


def pack_headers(headers: Sequence[bytes]) -> bytes:
    """One notification for ``headers`` (a single header is sent as it is)."""
    if len(headers) == 1:
        return headers[0]
    return PACKED + msgspec.msgpack.encode(list(headers))


def unpack_notification(message: bytes) -> tuple[bytes, ...]:
    """The headers a notification carries, in batch order.  A malformed packed notification is
    returned whole: the shell's decoder then refuses it as any malformed message (a peer's bad
    message never raises here)."""
    if message[:1] != PACKED:
        return (message,)
    try:
        headers = _LIST.decode(message[1:])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return (message,)
    return tuple(headers) if headers else (message,)


@attrs.define(slots=True, eq=False)
class _Xfer:
    key: tuple[str, int]
    peer: str
    batches: Sequence[Batch]
    packed: bool = False
    full: int = 0  # blocks in the transfer's largest batch: only batches of this size are packed
    next: int = 0
    inflight: dict[int, tuple[int, int]] = attrs.Factory(dict)  # WRITE id -> (first batch index, bytes)
    inside: int = 0  # bytes in posted, unfinished WRITEs
    piece: int = 0  # blocks of batch ``next`` already posted as header-less pieces
    pieces: set[int] = attrs.Factory(set)  # those pieces' WRITE ids still in flight
    cancelled: bool = False
    failed: bool = False
    moved: int = 0
    detail: str = ""

    def fail(self, detail: str) -> None:
        if not self.failed:
            self.failed, self.detail = True, detail

    @property
    def over(self) -> bool:
        return not self.inflight and (self.cancelled or self.failed or self.next == len(self.batches))


class WritePipeline:
    """The transfers a producer's plane has posted (see the module docstring).

    Args:
        agent: the plane's :class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent`.
        block_bytes: the pool's block size.
        other: called with every agent outcome that is not one of these WRITEs (a peer's fault,
            a warm-up READ's result): the plane's.
        horizon_s: a transfer commits what its peer's link drains in this long (seconds).
        clock: seconds, for the links' rates.
    """

    def __init__(self, agent: Any, block_bytes: int, other: Callable[[Any], None], *, horizon_s: float = 2.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._agent = agent
        self._block_bytes = block_bytes
        self._other = other
        self._pace = Pace(horizon_s)
        self._clock = clock
        self._xfers: dict[tuple[str, int], _Xfer] = {}
        self._by_write: dict[int, _Xfer] = {}
        self.posts = 0
        """WRITEs posted since start (tests and benchmarks count them)."""
        self.backlog = False
        """The last :meth:`drive` stopped at its budget (:data:`DRIVE_S`) with a WRITE it could
        post at once: the loop must come back without waiting (decision N22)."""

    def __bool__(self) -> bool:
        return bool(self._xfers)

    def start(self, key: tuple[str, int], peer: str, batches: Sequence[Batch], *, known: bool,
              packed: bool) -> None:
        """Post ``batches`` to ``peer`` (``known``: the plane has its descriptor, else the
        transfer fails unposted; ``packed``: it reads packed notifications)."""
        x = _Xfer(key, peer, batches, packed, max((len(b.blocks) for b in batches), default=0))
        self._xfers[key] = x
        if not known:
            x.fail(f"no NIXL descriptor from {peer}")
            return
        self.drive((x,), budget_s=0.0)  # its first WRITE now; the rest in the loop's passes

    def drive(self, xs: Sequence[_Xfer] | None = None, budget_s: float | None = None) -> None:
        """Post the next WRITE of each transfer (``xs``; default all) whose window has room and
        take finished WRITEs right after each post, until neither posts nor finishes anything:
        a WRITE's outcome is taken — and so its notification sent — as soon as the agent has it,
        and the next one posted in the same call (over CMA most end inside their post).  Takes
        the agent's outcomes at least once, also with no transfer; stops posting once it has run
        ``budget_s`` (:data:`DRIVE_S`; checked after each post) — :attr:`backlog` then says so; a
        call for some transfers (``xs``) only ever sets it, the next call for all renews it."""
        if xs is None:
            xs = list(self._xfers.values())
            self.backlog = False
        until = time.monotonic() + (DRIVE_S if budget_s is None else budget_s)
        while True:  # at least one reap: the agent's other outcomes (a warm-up READ) come this way
            posted = over = False
            for x in xs:
                if self._post_next(x):
                    posted = True
                    if time.monotonic() >= until:
                        over = True
                        break
            reaped = self._reap()
            xs = [x for x in xs if x.key in self._xfers and not x.over]
            if over or (xs and time.monotonic() >= until):  # the rest after the loop's inputs
                self.backlog = self.backlog or any(self._could_post(x) for x in xs)
                return
            if not reaped and not posted:
                return

    def _could_post(self, x: _Xfer) -> bool:
        """Whether :meth:`_post_next` would post ``x``'s next WRITE now."""
        return self._plan(x) is not None

    def _window(self, peer: str) -> int:
        return self._pace.window(peer, WINDOW_BYTES)

    def _plan(self, x: _Xfer) -> int | None:
        """What ``x`` may post now: 0 — its next batch whole (packed with the ones after it where
        they fit), or a number of blocks of it — a piece: the batch's last piece carries its header
        and waits for its other pieces to end, so the notification comes after every byte of the
        batch (decision T23).  A batch goes in pieces when the link's rate is unknown (pieces of
        :data:`SLOW_START_BYTES`, one at a time) or the batch is larger than the whole window (pieces
        of what the window has room for).  None: nothing now."""
        if x.next >= len(x.batches) or x.cancelled or x.failed:
            return None
        bb = self._block_bytes
        left = len(x.batches[x.next].blocks) - x.piece
        known = self._pace.rate(x.peer) is not None
        window = self._window(x.peer)
        if not x.piece and known and left * bb <= window:  # a batch the window holds: whole, as before
            return 0 if not x.inflight or x.inside + left * bb <= window else None
        room = (window - x.inside) if known else (0 if x.inflight else SLOW_START_BYTES)
        if not x.inflight:
            room = max(room, bb)
        if left * bb <= room:
            return None if x.pieces else (0 if not x.piece else left)  # the last piece: after the others
        return min(left - 1, max(0, room) // bb) or None  # the window may be over-full: no piece then

    def _post_next(self, x: _Xfer) -> bool:
        """Post ``x``'s next WRITE if its window has room; whether one was posted."""
        n = self._plan(x)
        if n is None:
            return False
        batches, bb, i = x.batches, self._block_bytes, x.next
        first = batches[i]
        if len(first.slots) != len(first.blocks):
            x.fail(f"batch {i}: {len(first.blocks)} blocks but {len(first.slots)} slots")
            return False
        if n:  # a piece of batch i: its blocks [piece, piece + n); the last one carries the header
            last = x.piece + n == len(first.blocks)
            return self._post(x, i, list(first.blocks[x.piece:x.piece + n]), list(first.slots[x.piece:x.piece + n]),
                              first.header if last else None, piece=not last, advance=1 if last else 0)
        size = len(first.blocks) * bb
        room = max(size, min(WRITE_BYTES, self._window(x.peer) - x.inside))
        j, total, headers = i + 1, size, [first.header]
        pack = x.packed and len(first.blocks) == x.full
        while pack and j < len(batches) and len(batches[j].blocks) == x.full and total + size <= room:
            if len(pack_headers([*headers, batches[j].header])) > MAX_NOTIF_BYTES:
                break
            headers.append(batches[j].header)
            total += size
            j += 1
        blocks: list[int] = []
        slots: list[int] = []
        for k in range(i, j):
            b = batches[k]
            if len(b.slots) != len(b.blocks):
                x.fail(f"batch {k}: {len(b.blocks)} blocks but {len(b.slots)} slots")
                return False
            blocks.extend(b.blocks)
            slots.extend(b.slots)
        # the headers travel as the WRITE's notification, which NIXL delivers after its bytes
        return self._post(x, i, blocks, slots, pack_headers(headers), piece=False, advance=j - i)

    def _post(self, x: _Xfer, i: int, blocks: list[int], slots: list[int], notif: bytes | None, *, piece: bool,
              advance: int) -> bool:
        """Post one WRITE of ``x`` from batch ``i`` on; ``advance``: batches it ends."""
        try:
            wid = self._agent.post_write(x.peer, blocks, slots, notif=notif)
        except (ValueError, TypeError, NixlError) as exc:  # a bad slot, an unknown peer, a header too long
            x.fail(f"batch {i} not posted: {exc}")
            return False
        total = len(blocks) * self._block_bytes
        self.posts += 1
        if piece:
            x.piece += len(blocks)
            x.pieces.add(wid)
        else:
            x.next, x.piece = i + advance, 0
        x.inflight[wid] = (i, total)
        x.inside += total
        self._by_write[wid] = x
        self._pace.posted(x.peer, total, self._clock())
        return True

    def _reap(self) -> bool:
        """Take the agent's outcomes; whether there were any.  (Taking a WRITE's outcome is what
        makes NIXL send its notification.)"""
        events = self._agent.poll()
        for ev in events:
            x = self._by_write.pop(ev.xfer_id, None) if isinstance(ev, XferResult) else None
            if x is None:  # a peer's fault, a warm-up READ (decision N15): the plane's
                self._other(ev)
                continue
            i, n = x.inflight.pop(ev.xfer_id)
            x.pieces.discard(ev.xfer_id)
            x.inside -= n
            self._pace.released(x.peer, n, self._clock())
            if ev.status != "done":
                x.fail(f"batch {i}: WRITE failed: {ev.detail}")
            else:
                x.moved += n
        return bool(events)

    def forget(self, peer: str) -> None:
        """``peer``'s session ended: a later one measures its link afresh."""
        self._pace.forget(peer)

    def cancel(self, key: tuple[str, int]) -> None:
        x = self._xfers.get(key)
        if x is not None:
            x.cancelled = True

    def referenced(self) -> int:
        return sum(1 for x in self._xfers.values() if x.inflight)

    def released(self) -> list[Released]:
        """The transfers whose every posted WRITE is terminal and that post nothing more."""
        out = []
        for key, x in list(self._xfers.items()):
            if x.over:
                del self._xfers[key]
                out.append(Released(key[0], key[1], x.failed, x.moved, x.detail))
        return out

    def close(self, events: Sequence[Any]) -> list[Released]:
        """The agent closed with ``events`` its last outcomes: every transfer is released, failed
        unless all of it had moved (no notification goes out any more)."""
        for x in self._xfers.values():
            x.cancelled = True
        for ev in events:
            x = self._by_write.pop(ev.xfer_id, None) if isinstance(ev, XferResult) else None
            if x is not None:
                x.inflight.pop(ev.xfer_id, None)
                x.fail("closed" if ev.status == "done" else f"WRITE failed: {ev.detail}")
        out = [Released(kid, rnd, x.failed or x.next < len(x.batches), x.moved, x.detail or "closed")
               for (kid, rnd), x in self._xfers.items()]
        self._xfers.clear()
        self._by_write.clear()
        return out
