"""How the core cuts a transfer into ``block_data`` messages: the batch plan and every header.

The core builds every message it sends (decision C15), the ``block_data`` headers of a transfer
included: :class:`Batcher` turns a transfer's blocks and digests into a :class:`~kvtier.lifecycle.effects.SendBlocks`
whose ``headers`` are the wire messages themselves.  The shell encodes them and hands them to the
data plane with the blocks each one names; it decides nothing about them.

The plan: batches of at most :data:`MAX_BATCH_BYTES` (and no more blocks than a header the data
plane can carry names: a NIXL notification is at most 4 KiB), tapering to :data:`TAIL_BYTES` at
the end — the consumer checks each batch while the next one travels, so what is left to check
once the last bytes arrived is small (decision I16).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from kvtier.lifecycle.effects import SendBlocks
from kvtier.wire import messages as wm

__all__ = ["Batcher", "MAX_BATCH_BYTES", "TAIL_BYTES", "plan_batches"]

MAX_BATCH_BYTES = 8 << 20
"""Largest ``block_data`` message (bytes of payload); keep zmq messages ≤ 16 MiB (decision T4)."""

TAIL_BYTES = 1 << 20
"""The last batch of a transfer holds at most this many bytes (at least one block), the one before
it twice as many, and so on up to :data:`MAX_BATCH_BYTES` (decision I16)."""

_ENCODER = msgspec.msgpack.Encoder()


def plan_batches(n: int, per: int, tail: int) -> list[int]:
    """Batch sizes (in blocks) for a transfer of ``n`` blocks: batches of ``per`` blocks, ending
    in a taper that halves down to two of ``tail`` (``n=256, per=8, tail=1``: 31 × 8, 4, 2, 1,
    1); a transfer of at most ``tail`` blocks is one batch.  Sizes sum to ``n``, none is empty.

    Raises:
        ValueError: ``per`` or ``tail`` is not positive.
    """
    if per < 1 or tail < 1:
        raise ValueError(f"per and tail must be positive, got {per} and {tail}")
    tail = min(tail, per)
    if n <= tail:
        return [n] if n > 0 else []
    sizes: list[int] = []
    size, second = tail, False
    while n > 0:  # built from the end
        take = min(size, n)
        sizes.append(take)
        n -= take
        if second:
            size = min(per, size * 2)
        second = True
    sizes.reverse()
    return sizes


class Batcher:
    """Builds transfers for one core.

    Args:
        block_bytes: the pool's block size (0: one block per batch).
        max_header_bytes: the largest header the data plane carries, or None.
        integrity: whether headers carry digests (a served round's are taken by the shell).
    """

    def __init__(self, block_bytes: int, max_header_bytes: int | None, integrity: bool) -> None:
        self._per = max(1, MAX_BATCH_BYTES // block_bytes) if block_bytes > 0 else 1
        self._tail = max(1, TAIL_BYTES // block_bytes) if block_bytes > 0 else 1
        self._max_header = max_header_bytes
        self._integrity = integrity
        # batches of at most this many blocks fit any header (the longest kv_request_id, the largest
        # numbers): only a plan of larger batches needs the exact fit of this transfer's header
        self._fit_any = self._fits(2**63 - 1, "x" * wm.MAX_ID_CHARS, 2**63 - 1, 2**63 - 1) \
            if max_header_bytes is not None else 0

    def send_blocks(self, peer: str, kv_request_id: str, round: int, blocks: Sequence[int], gen: int,
                    digests: Sequence[int], slots: Sequence[int], transfer: str = "",
                    take_digests: bool = False) -> SendBlocks:
        """The transfer of ``blocks`` (with their parked ``digests``; ``take_digests``: none yet,
        the shell takes them as it hands the transfer to the plane and fills them into these
        headers — decision Y9) to ``peer``, its ``block_data`` headers built here."""
        blocks, digests, slots = tuple(blocks), tuple(digests), tuple(slots)
        per = self._per
        with_digests = bool(digests) or (take_digests and self._integrity)
        if self._max_header is not None and with_digests and per > self._fit_any:
            per = min(per, self._fits(gen, kv_request_id, round, len(blocks)))
        n = len(blocks)
        headers = []
        first = 0
        # one batch (a small transfer, the usual case) needs no plan
        for count in ((n,) if 0 < n <= per and n <= self._tail else plan_batches(n, per, self._tail)):
            end = first + count
            headers.append(wm.BuiltBlockData(gen=gen, kv_request_id=kv_request_id, round=round, first=first,
                                             count=count, digests=list(digests[first:end])))
            first = end
        return SendBlocks(peer, kv_request_id, round, blocks, gen, digests, slots, transfer, take_digests,
                          tuple(headers))

    def _fits(self, gen: int, kv_request_id: str, round: int, n: int) -> int:
        """Blocks per batch whose header fits ``max_header_bytes``."""
        one = len(_ENCODER.encode(wm.BlockData(gen=gen, kv_request_id=kv_request_id, round=round, first=n, count=1,
                                               digests=[2**64 - 1])))
        # each further digest takes at most 9 bytes (a msgpack uint64); 4 more for a longer count
        # and the digest array's longer length prefix
        return max(1, 1 + ((self._max_header or 0) - one - 4) // 9)
