"""The block pool a NIXL agent registers, and the index lists it is given: checked, and turned into
NIXL's descriptor arrays (address, length, device) over whole blocks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from kvtier.dataplane.nixl_types import MAX_BLOCKS

def region_layout(region: object) -> tuple[int, int, int, object]:
    """``(address, num_blocks, block_bytes, keep_alive)`` of a 2-D uint8 CPU region."""
    torch = sys.modules.get("torch")  # a tensor implies torch is loaded; never import it here
    if torch is not None and isinstance(region, torch.Tensor):
        if region.dtype != torch.uint8 or region.dim() != 2:
            raise ValueError(f"region must be a 2-D uint8 tensor, got {region.dtype} with shape {tuple(region.shape)}")
        if region.device.type != "cpu":
            raise ValueError(f"region must be host memory, got a tensor on {region.device}")
        if not region.is_contiguous():
            raise ValueError("region tensor must be C-contiguous")
        rows, cols = region.shape
        addr = region.data_ptr()
    else:
        try:
            mv = memoryview(region)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"region must be a 2-D uint8 torch tensor or a writable 2-D byte buffer, got {type(region).__name__}"
            ) from None
        if mv.ndim != 2 or mv.format != "B":
            raise ValueError(f"region must be 2-D uint8 (num_blocks x block_bytes), got format {mv.format!r} ndim {mv.ndim}")
        if mv.readonly:
            raise ValueError("region must be writable")
        if not mv.c_contiguous:
            raise ValueError("region must be C-contiguous")
        rows, cols = mv.shape  # type: ignore[misc]
        addr = np.asarray(mv).ctypes.data
        region = mv
    if rows < 1 or cols < 1:
        raise ValueError(f"region must have >= 1 block of >= 1 byte, got shape ({rows}, {cols})")
    if rows > MAX_BLOCKS:
        raise ValueError(f"region has {rows} blocks; NIXL indices are int32 (at most {MAX_BLOCKS})")
    return int(addr), int(rows), int(cols), region


WARM_BYTES = 64 * 1024
"""How much of a peer's first slot a warm-up READ reads (bytes; the whole block when smaller).
A warm-up READ only has to complete on the new endpoint (decision N15); a whole block each made
three of them outlast ``handshake_timeout_s`` on a slow link with big blocks."""


def warm_bytes(block_bytes: int) -> int:
    """The length of a warm-up READ for blocks of ``block_bytes`` (bytes)."""
    return min(WARM_BYTES, block_bytes)


def block_descs(base: int, num_blocks: int, block_bytes: int, warm: bool = False) -> np.ndarray:
    """NIXL's Nx3 descriptor array ``(address, length, device id)`` over every block; with
    ``warm``, one more row after them: the first :func:`warm_bytes` of block 0, which a warm-up
    READ reads (its index is ``num_blocks``)."""
    d = np.empty((num_blocks + warm, 3), dtype=np.uint64)
    d[:num_blocks, 0] = np.uint64(base) + np.arange(num_blocks, dtype=np.uint64) * np.uint64(block_bytes)
    d[:num_blocks, 1] = block_bytes
    if warm:
        d[num_blocks] = (base, warm_bytes(block_bytes), 0)
    d[:, 2] = 0
    return d


def indices(what: str, seq: object, bound: int) -> np.ndarray:
    """A 1-D int32 array of indices in ``[0, bound)``; ``ValueError``/``TypeError`` otherwise."""
    if isinstance(seq, np.ndarray):
        if seq.ndim != 1 or seq.dtype.kind not in "iu":
            raise TypeError(f"{what} must be a 1-D integer array, got {seq.dtype} with {seq.ndim} dims")
        arr = seq
    else:
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence):
            raise TypeError(f"{what} must be a sequence of ints, got {type(seq).__name__}")
        for i, x in enumerate(seq):
            if type(x) is not int and not isinstance(x, np.integer):  # bool is refused
                raise TypeError(f"{what}[{i}] must be int, got {type(x).__name__}")
        arr = np.asarray(seq, dtype=np.int64) if len(seq) else np.empty(0, np.int64)
    if arr.size == 0:
        raise ValueError(f"{what} is empty")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= bound:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} has index {bad} outside [0, {bound})")
    return arr.astype(np.int32, copy=False)
