"""Deterministic block contents, so a reader can check what landed without asking the writer.

:func:`block_pattern` is what the recorded scenarios, the peer processes and the NIXL peers of the
tests write into pool slots; the side that checks computes the same bytes (or their sha256,
:func:`pattern_digest`) itself.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["block_pattern", "pattern_digest", "slot_digest"]


def block_pattern(seed: int, index: int, block_bytes: int) -> bytes:
    """``block_bytes`` pseudo-random bytes determined by ``(seed, index)``.

    Different seeds or indexes give different blocks (with overwhelming probability), so a block
    that lands in the wrong slot, or a slot that is never written, is caught by a checksum.
    """
    import numpy as np

    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(index) & 0xFFFFFFFF, 0x6B76])
    return rng.integers(0, 256, size=block_bytes, dtype=np.uint8).tobytes()


def pattern_digest(seed: int, index: int, block_bytes: int) -> str:
    """sha256 hex of :func:`block_pattern`."""
    return hashlib.sha256(block_pattern(seed, index, block_bytes)).hexdigest()


def slot_digest(pool: Any, slot: int) -> str:
    """sha256 hex of one slot of a :class:`~kvtier.memory.BlockPool`."""
    return hashlib.sha256(pool.buffer(slot)).hexdigest()
