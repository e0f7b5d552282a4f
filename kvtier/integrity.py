"""Block digests: what makes "the consumer has the parked bytes" checkable end to end.

The producer takes a 64-bit digest of every block when the engine parks it (``submit_store``),
before any data plane could touch it; the digests travel with the transfer (``block_data``) and
the consumer checks every block as it lands.  A block whose bytes changed in between — the engine
reused it while a send still read it (scenarios B26/B32, docs/scenarios.md), a plane wrote the wrong slot, a
link corrupted it — fails the load with reason ``corrupt`` instead of being reported as a
success.  Decision I2: success means the consumer has the parked bytes.

The digest is XXH3-64 from the maintained ``xxhash`` package: not cryptographic (it detects
accidents, not a forging producer — an authenticated peer is trusted with the bytes it sends, see
docs/security.md) but about as fast as a memory copy (15-25 GB/s on one core here; P1 in the
benchmarks measures its cost per transfer).  ``"none"`` turns the check off; both peers must agree,
it is part of the handshake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import xxhash

__all__ = ["ALGORITHMS", "block_digests", "check_blocks", "digest"]

ALGORITHMS: Final = ("xxh3_64", "none")
"""Digest algorithms a config may name (``integrity`` key); the handshake compares them."""

_xxh3 = xxhash.xxh3_64_intdigest


def digest(buf: memoryview | bytes) -> int:
    """XXH3-64 of one block's bytes, as an unsigned int in [0, 2**64)."""
    return _xxh3(buf)


def block_digests(buffers: Sequence[memoryview | bytes], algorithm: str) -> tuple[int, ...]:
    """One digest per buffer (``()`` when ``algorithm`` is ``"none"``).

    Raises:
        ValueError: ``algorithm`` is not one of :data:`ALGORITHMS`.
    """
    if algorithm == "none":
        return ()
    if algorithm != "xxh3_64":
        raise ValueError(f"unknown digest algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    return tuple(_xxh3(b) for b in buffers)


def check_blocks(buffers: Sequence[memoryview | bytes], expected: Sequence[int], algorithm: str) -> int:
    """Index of the first buffer whose digest differs from ``expected`` (``-1``: all match).

    With ``algorithm == "none"`` nothing is checked (``-1``).  A digest list of the wrong length
    counts as a mismatch at index 0: a peer that agreed on digests must send one per block.
    """
    if algorithm == "none":
        return -1
    if len(expected) != len(buffers):
        return 0
    for i, (b, d) in enumerate(zip(buffers, expected)):
        if _xxh3(b) != d:
            return i
    return -1
