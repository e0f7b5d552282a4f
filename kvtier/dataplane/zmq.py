"""The zmq data plane: block payloads travel as frames of ``block_data`` on the control connection.

Producer side: each batch is one multipart message ``[header, block, block, …]`` sent zero-copy
from the pool with a zmq tracker (architecture T3/T4).  A transfer keeps at most a window of its
blocks inside the transport at a time — what its peer's link drains in half the abort timeout,
at most :data:`WINDOW_BYTES` (:mod:`kvtier.dataplane.pace`, decision T23) — and posts the next
batch as earlier ones are released, so a cancelled transfer holds at most one window of
references, and one large transfer cannot fill the connection's queue ahead of the control
messages and other loads behind it.
``Released`` is reported once every posted tracker is done (libzmq no longer references the
frames: they reached the kernel, or the connection carrying them was dropped).

Consumer side: receiver-applied.  :meth:`ZmqPlane.land` copies the payload frames into the
slots and checks each block right after copying it (:mod:`kvtier.dataplane.landing`), and the core
asks for it only while the load is in flight.  A large landing copies on the digest pool's threads;
until it ended, :meth:`ZmqPlane.revoke` of that peer is not true (reported by :meth:`~ZmqPlane.poll`
once the copies are over), so a load's slots are handed back only when nothing copies into them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs

from kvtier.dataplane.base import Batch, PlaneError, Released, Report, Revoked
from kvtier.dataplane.landing import Landings
from kvtier.dataplane.pace import Pace
from kvtier.dataplane.settings import PlaneSettings
from kvtier.integrity import DigestPool
from kvtier.transport import SendHandle, Transport

__all__ = ["RELEASE_WAIT_S", "WINDOW_BYTES", "ZmqPlane"]

WINDOW_BYTES: Final = 32 << 20
"""Most block bytes one transfer may have inside the transport at once (4 batches of 8 MiB), on a
link fast enough (:class:`~kvtier.dataplane.pace.Pace`)."""

RELEASE_WAIT_S: Final = 0.001
"""While posted blocks are still referenced, the plane is polled at least this often (seconds): a
zero-copy send's release wakes no wait, and it both makes room in a transfer's window and ends the
transfer (the store job's result, the slots' return)."""


@attrs.define(slots=True)
class _Xfer:
    peer: str
    batches: Sequence[Batch]
    next: int = 0
    handles: list[tuple[SendHandle, int]] = attrs.Factory(list)
    cancelled: bool = False
    failed: bool = False
    moved: int = 0
    detail: str = ""


class ZmqPlane:
    """Inline payload frames over a :class:`~kvtier.transport.Transport`.

    Args:
        transport: the control transport (its per-peer FIFO keeps ``block_data`` ordered before a
            later ``transfer_done``).
        pool: the block pool (``buffer(i)`` gives a block's bytes, ``block_bytes`` its size).
        settings: what the plane takes from the config (``integrity``: the digest checked as
            blocks land).
        digest_pool: where large landings copy and check; ``None``: on the caller's thread.
        clock: seconds, for the peers' drain rates (tests pass their own).
    """

    name = "zmq"
    one_sided = False
    max_header_bytes = None
    revocation_bounded = True  # receiver-applied: nothing lands outside in_flight
    unrevoked: tuple[str, ...] = ()

    def __init__(self, *, transport: Transport, pool: Any, settings: PlaneSettings = PlaneSettings(),
                 digest_pool: DigestPool | None = None, clock: Callable[[], float] = time.monotonic,
                 **_: Any) -> None:
        self._transport = transport
        self._pool = pool
        self._block_bytes = pool.block_bytes
        self._landings = Landings(pool, settings.integrity, digest_pool)
        self._revoking: set[str] = set()
        self._xfers: dict[tuple[str, int], _Xfer] = {}
        self._pace = Pace(settings.abort_ack_timeout_s / 2)
        self._clock = clock  # wall time (seconds) for the link's rate: never a virtual clock
        self.posts = 0
        """block_data messages handed to the transport since start (tests, benchmarks)."""

    # -- handshake -----------------------------------------------------------------------------
    def descriptor(self) -> bytes:
        return b""

    def session_descriptor(self, peer: str, gen: int) -> bytes:
        return b""

    def add_peer(self, peer: str, descriptor: bytes, *, accepted: bool = False, gen: int = 0) -> bool:
        if descriptor:
            raise PlaneError(f"the zmq data plane takes no descriptor; {peer} sent {len(descriptor)} bytes")
        return True

    def remove_peer(self, peer: str) -> None:
        """Forget the peer's measured rate (the transport owns the connection)."""
        self._pace.forget(peer)

    # -- producer ------------------------------------------------------------------------------
    def post(self, peer: str, kv_request_id: str, round: int, batches: Sequence[Batch]) -> None:
        x = _Xfer(peer, batches)
        self._xfers[(kv_request_id, round)] = x
        self._pump(x)

    def _pump(self, x: _Xfer) -> None:
        pool, bb, pace = self._pool, self._block_bytes, self._pace
        inside = sum(n for _, n in x.handles)
        window = pace.window(x.peer, WINDOW_BYTES)
        while x.next < len(x.batches) and not (x.cancelled or x.failed):
            b = x.batches[x.next]
            n = len(b.blocks) * bb
            if x.handles and inside + n > window:
                return
            frames = [b.header, *(pool.buffer(i) for i in b.blocks)]
            h = self._transport.send(x.peer, frames, track=True)
            x.next += 1
            self.posts += 1
            if h.failed:
                x.failed, x.detail = True, h.error
                return
            x.handles.append((h, n))
            pace.posted(x.peer, n, self._clock())
            inside += n

    def cancel(self, kv_request_id: str, round: int) -> None:
        x = self._xfers.get((kv_request_id, round))
        if x is not None:
            x.cancelled = True

    def poll(self) -> list[Report]:
        out: list[Report] = list(self._landings.poll())
        if self._revoking:
            for peer in [p for p in self._revoking if not self._landings.pending(p)]:
                self._revoking.discard(peer)
                out.append(Revoked(peer))
        for key, x in list(self._xfers.items()):
            if x.handles:
                left = []
                for h, n in x.handles:
                    if not h.done:
                        left.append((h, n))
                        continue
                    self._pace.released(x.peer, n, self._clock())
                    if h.failed:
                        x.failed, x.detail = True, h.error
                    else:
                        x.moved += n
                x.handles = left
                self._pump(x)
            if not x.handles and (x.cancelled or x.failed or x.next == len(x.batches)):
                del self._xfers[key]
                out.append(Released(key[0], key[1], x.failed, x.moved, x.detail))
        return out

    def referenced(self) -> int:
        return sum(1 for x in self._xfers.values() if x.handles)

    def max_wait_s(self, receiving: bool = True) -> float | None:
        # payloads move on libzmq's threads, whose input wakes the transport's wait, and an I/O
        # loop's digest pool wakes it when a landing ends; a tracker turning done wakes nothing
        if self.referenced():
            return RELEASE_WAIT_S  # the same 1 ms as a landing's wait without a notifying pool
        return self._landings.max_wait_s()

    # -- consumer ------------------------------------------------------------------------------
    def land(self, peer: str, key: Any, slots: Sequence[int], payloads: Sequence[Any],
             digests: Sequence[int]) -> int | None:
        if len(payloads) != len(slots):
            raise PlaneError(f"block_data carries {len(payloads)} payload frames for {len(slots)} blocks")
        try:
            return self._landings.land(peer, key, slots, payloads, digests)
        except ValueError as exc:
            raise PlaneError(f"block_data: {exc}") from None

    def finish_landings(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the landings running on the digest pool (see
        :meth:`DataPlane.finish_landings <kvtier.dataplane.base.DataPlane.finish_landings>`)."""
        return self._landings.wait(timeout_s)

    def revoke(self, peer: str) -> bool:
        # receiver-applied: nothing lands unless the core lets it, once the copies it let start ended
        if not self._landings.pending(peer):
            return True
        self._revoking.add(peer)
        return False

    def close(self, wait_s: float | None = None) -> list[Report]:
        """Called after the transport was closed, so libzmq has dropped every frame: report every
        transfer still known as released (failed unless all of it had been moved).  ``wait_s``
        bounds the moment given to pyzmq's trackers (at least 5 ms, at most 0.5 s)."""
        for x in self._xfers.values():
            x.cancelled = True
        # pyzmq marks trackers done on its own thread once libzmq freed the frames; give it a
        # moment (it is microseconds), then report: nothing in this process reads them any more
        deadline = time.monotonic() + (0.5 if wait_s is None else min(0.5, max(0.005, wait_s)))
        while any(not h.done for x in self._xfers.values() for h, _ in x.handles) and time.monotonic() < deadline:
            time.sleep(0.001)
        out: list[Report] = self.poll()
        out += [Released(k, r, True, x.moved, "closed") for (k, r), x in self._xfers.items()]
        out += self._landings.close()
        out += [Revoked(p) for p in sorted(self._revoking)]
        self._revoking.clear()
        self._xfers.clear()
        self._pool = None  # nothing reads the pool after close: the engine may unmap it
        return out
