"""Host block pool: one contiguous uint8 region cut into fixed-size blocks.

Block layout contract
---------------------
A **block** is ``block_bytes`` contiguous bytes; block ``i`` (a **slot**) occupies bytes
``[i * block_bytes, (i + 1) * block_bytes)`` of one C-contiguous ``torch.uint8`` tensor of shape
``(num_blocks, block_bytes)``. The pool never interprets the bytes. What a block holds is agreed
between producer and consumer by the handshake's ``block_bytes`` and ``layout`` fields, not here.
One example: the KV cache of one block of tokens as a ``[layers, 2, heads, tokens, head_dim]``
tensor of bf16, flattened to bytes (for Llama-3-8B with 16-token blocks: 32 * 2 * 8 * 16 * 128 * 2
bytes = 2 MiB per block).

Memory
------
The region is **pinned** (page-locked, so device copies can be asynchronous) only when
``torch.accelerator.is_available()``. Otherwise it is ordinary pageable memory: on a CPU-only
torch build, ``pin_memory=True`` raises. Pageable memory is a shared ``memfd``
(:mod:`kvtier.memory.shared`), so that a one-sided data plane can give each peer a window of
its own onto the pool and withdraw it (:attr:`BlockPool.backing`, decision N14); a pinned
region is torch's, and has no backing. The pool says which one it got, through :attr:`pinned`
and one log line on ``kvtier.memory``. It never fails because pinning was unavailable. An owned
region is **pre-faulted** (written once with zeros) at construction, because receiving into
never-touched pages runs several times slower than into faulted-in ones (first-touch page faults).

Slots and references
--------------------
:meth:`alloc` hands out free slots with refcount 1. :meth:`incref` / :meth:`decref` move the
count, and a slot returns to the free list when it reaches 0. Allocation never blocks; it raises
:class:`PoolExhausted`. Views (:meth:`view`, :meth:`buffer`) are bounds-checked but not
allocation-checked, because a wrapped engine region (:meth:`wrap`) is allocated by the engine,
not by us.

The pool is not thread-safe. It belongs to the single manager loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from kvtier.errors import KvTierError
from kvtier.memory import shared

__all__ = ["BlockPool", "PoolExhausted"]

log = logging.getLogger("kvtier.memory")


class PoolExhausted(KvTierError):
    """``alloc(n)`` asked for more slots than are free. The pool is left unchanged.

    Attributes:
        requested: slots asked for.
        free: slots free at the time of the call.
    """

    def __init__(self, requested: int, free: int) -> None:
        super().__init__(f"pool exhausted: requested {requested} slots, {free} free")
        self.requested = requested
        self.free = free


def _check_count(name: str, value: object, *, minimum: int) -> int:
    # bool is an int subclass. True would quietly mean 1 block, so it is refused.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


class BlockPool:
    """A fixed array of ``num_blocks`` blocks of ``block_bytes`` bytes each.

    Args:
        num_blocks: number of slots, >= 1.
        block_bytes: bytes per block, >= 1.
        pin: ``None`` (default) pins iff ``torch.accelerator.is_available()``. ``True`` asks
            for pinned memory and falls back to pageable, with a warning, when no accelerator
            exists. ``False`` always uses pageable memory.

    Raises:
        ValueError: ``num_blocks`` or ``block_bytes`` is not an int >= 1 (bool refused).
        RuntimeError / MemoryError: from torch, if the host cannot allocate the region.
    """

    __slots__ = ("_tensor", "_array", "_num_blocks", "_block_bytes", "_pinned", "_refs", "_free", "_backing")

    def __init__(self, num_blocks: int, block_bytes: int, *, pin: bool | None = None) -> None:
        num_blocks = _check_count("num_blocks", num_blocks, minimum=1)
        block_bytes = _check_count("block_bytes", block_bytes, minimum=1)
        if pin is not None and not isinstance(pin, bool):
            raise ValueError(f"pin must be None, True or False, got {pin!r}")
        tensor, pinned, why, backing, degraded = _allocate(num_blocks, block_bytes, pin)
        # Pre-fault: zero_() writes every page now, so the first receive into a slot does not
        # pay the page-fault cost (torch.zeros may use calloc and leave pages untouched).
        tensor.zero_()
        # WARNING when we did not get what was asked for (pin=True) or what the machine should
        # give (an accelerator exists but pinning failed), INFO otherwise.
        level = logging.WARNING if degraded else logging.INFO
        log.log(
            level,
            "kvtier block pool: %d blocks x %d bytes (%d MiB), %s (%s)",
            num_blocks,
            block_bytes,
            (num_blocks * block_bytes) >> 20,
            "pinned" if pinned else "pageable",
            why,
        )
        self._init_from(tensor, pinned)
        self._backing = backing

    def _init_from(self, tensor: torch.Tensor, pinned: bool) -> None:
        self._backing: shared.Backing | None | bool = False  # False: not looked up yet
        self._tensor = tensor
        # One numpy alias of the whole region: buffer() then costs a slice, not a .numpy() call.
        self._array = tensor.numpy()
        self._num_blocks = int(tensor.shape[0])
        self._block_bytes = int(tensor.shape[1])
        self._pinned = pinned
        self._refs = [0] * self._num_blocks
        # A stack whose top is slot 0, so a fresh pool hands out 0, 1, 2, ... (readable tests),
        # and a freed slot is reused first, while it is still warm in cache.
        self._free = list(range(self._num_blocks - 1, -1, -1))

    @classmethod
    def wrap(cls, buffer: memoryview | torch.Tensor) -> BlockPool:
        """Adopt an existing ``(num_blocks, block_bytes)`` byte region without copying it.

        Writes through the returned pool are visible in ``buffer`` and vice versa. The region
        is neither zeroed nor pre-faulted (it holds the caller's data). All slots start free.
        ``pinned`` reports ``tensor.is_pinned()`` of the region.

        Args:
            buffer: either a writable, C-contiguous, 2-D ``memoryview`` of format ``'B'`` or
                ``'b'`` and shape ``(num_blocks, block_bytes)`` (what vLLM's offloading hands
                out), or a 2-D C-contiguous CPU ``torch.Tensor`` of dtype ``uint8`` or ``int8``.

        Returns:
            A pool whose :attr:`tensor` aliases ``buffer``.

        Raises:
            ValueError: wrong dimensionality, format/dtype, contiguity, device, a read-only
                buffer, or an empty dimension.
            TypeError: ``buffer`` is neither a memoryview nor a tensor.
        """
        if isinstance(buffer, memoryview):
            tensor = _tensor_from_memoryview(buffer)
        elif isinstance(buffer, torch.Tensor):
            tensor = _tensor_from_tensor(buffer)
        else:
            raise TypeError(
                f"BlockPool.wrap() takes a memoryview or a torch.Tensor, got {type(buffer).__name__}"
            )
        self = cls.__new__(cls)
        self._init_from(tensor, bool(tensor.is_pinned()))
        log.info(
            "kvtier block pool: wrapped %d blocks x %d bytes, %s",
            self._num_blocks,
            self._block_bytes,
            "pinned" if self._pinned else "pageable",
        )
        return self

    # -- properties ----------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Number of slots (int)."""
        return self._num_blocks

    @property
    def block_bytes(self) -> int:
        """Bytes per block (int)."""
        return self._block_bytes

    @property
    def pinned(self) -> bool:
        """True iff the region is page-locked host memory."""
        return self._pinned

    @property
    def backing(self) -> shared.Backing | None:
        """The shared file the region lives in (:class:`kvtier.memory.shared.Backing`), or None
        for private memory.  An owned pageable pool is a ``memfd``; a wrapped region is looked
        up once in ``/proc/self/maps`` (vLLM's ``/dev/shm`` region has one)."""
        if self._backing is False:
            self._backing = shared.find_backing(self._tensor.data_ptr(), self._num_blocks * self._block_bytes)
        return self._backing  # type: ignore[return-value]

    @property
    def tensor(self) -> torch.Tensor:
        """The whole region: ``torch.uint8``, shape ``(num_blocks, block_bytes)``, C-contiguous."""
        return self._tensor

    @property
    def num_free(self) -> int:
        """Slots with refcount 0."""
        return len(self._free)

    # -- slot allocation -----------------------------------------------------------------------

    def alloc(self, n: int) -> list[int]:
        """Take ``n`` free slots, each with refcount 1. Never blocks.

        Returns:
            ``n`` distinct slot indexes. ``alloc(0)`` returns ``[]``.

        Raises:
            PoolExhausted: fewer than ``n`` slots are free (nothing is allocated).
            ValueError: ``n`` is not an int >= 0.
        """
        n = _check_count("n", n, minimum=0)
        if n > len(self._free):
            raise PoolExhausted(n, len(self._free))
        slots = [self._free.pop() for _ in range(n)]
        for s in slots:
            self._refs[s] = 1
        return slots

    def refcount(self, slot: int) -> int:
        """Current reference count of ``slot`` (0 means free).

        Raises:
            IndexError / ValueError: see :meth:`view`.
        """
        return self._refs[self._check_slot(slot)]

    def incref(self, slot: int) -> None:
        """Add one reference to an allocated slot.

        Raises:
            ValueError: the slot is free (refcount 0). Only allocated slots can be shared.
            IndexError / ValueError: bad index, see :meth:`view`.
        """
        slot = self._check_slot(slot)
        if self._refs[slot] == 0:
            raise ValueError(f"incref of free slot {slot}")
        self._refs[slot] += 1

    def decref(self, slot: int) -> None:
        """Drop one reference. At 0 the slot returns to the free list.

        Raises:
            ValueError: the slot holds no reference (never allocated, or a double free).
            IndexError / ValueError: bad index, see :meth:`view`.
        """
        slot = self._check_slot(slot)
        if self._refs[slot] == 0:
            raise ValueError(f"decref of free slot {slot}: it holds no reference (never allocated, or freed already)")
        self._release(slot)

    def free(self, slots: Iterable[int]) -> None:
        """Drop one reference from each slot in ``slots`` (a slot listed twice drops two).

        Everything is checked before anything changes, so a bad entry leaves the pool unchanged.

        Raises:
            ValueError: a slot would drop below refcount 0 (never allocated, or a double free).
            IndexError / ValueError: bad index, see :meth:`view`.
        """
        wanted: dict[int, int] = {}
        for s in slots:
            s = self._check_slot(s)
            wanted[s] = wanted.get(s, 0) + 1
        for s, k in wanted.items():
            if k > self._refs[s]:
                raise ValueError(f"free of slot {s} x{k} but its refcount is {self._refs[s]} (never allocated, or "
                                 "freed already: a double free)")
        for s, k in wanted.items():
            for _ in range(k):
                self._release(s)

    def _release(self, slot: int) -> None:
        self._refs[slot] -= 1
        if self._refs[slot] == 0:
            self._free.append(slot)

    # -- byte access ---------------------------------------------------------------------------

    def view(self, slot: int) -> torch.Tensor:
        """Zero-copy view of one block.

        Returns:
            ``torch.uint8`` tensor of shape ``(block_bytes,)`` aliasing the pool.
            Reinterpret it with ``.view(dtype)``.

        Raises:
            IndexError: ``slot`` is negative or >= ``num_blocks``. Negative indexes are refused,
                not wrapped around.
            ValueError: ``slot`` is not an int (bool included).
        """
        return self._tensor[self._check_slot(slot)]

    def buffer(self, slot: int) -> memoryview:
        """Zero-copy writable byte view of one block, for zmq sends and ``recv_into``.

        Returns:
            1-D ``memoryview`` of format ``'B'`` and length ``block_bytes``. It keeps the pool's
            memory alive.

        Raises:
            IndexError / ValueError: see :meth:`view`.
        """
        return memoryview(self._array[self._check_slot(slot)])

    def write(self, slot: int, data: Any) -> None:
        """Copy exactly ``block_bytes`` bytes into ``slot`` (one memcpy).

        Args:
            slot: destination slot.
            data: a C-contiguous bytes-like object (bytes, bytearray, memoryview, numpy array,
                zmq ``Frame.buffer``) or a contiguous CPU tensor of any dtype, of exactly
                ``block_bytes`` bytes.

        Raises:
            ValueError: the size is not ``block_bytes``, or the data is not contiguous or not on
                the CPU.
            TypeError: ``data`` is not bytes-like.
            IndexError / ValueError: bad slot, see :meth:`view`.
        """
        slot = self._check_slot(slot)
        if isinstance(data, torch.Tensor):
            if data.device.type != "cpu" or not data.is_contiguous():
                raise ValueError("write() needs a contiguous CPU tensor")
            src = data.detach().reshape(-1).view(torch.uint8)
            if src.numel() != self._block_bytes:
                raise ValueError(
                    f"write() to slot {slot}: got {src.numel()} bytes, block_bytes is "
                    f"{self._block_bytes}"
                )
            self._tensor[slot].copy_(src)
            return
        mv = memoryview(data)
        if mv.nbytes != self._block_bytes:
            raise ValueError(
                f"write() to slot {slot}: got {mv.nbytes} bytes, block_bytes is {self._block_bytes}"
            )
        if not mv.c_contiguous:
            raise ValueError("write() needs C-contiguous data")
        # memoryview slice assignment is a plain memcpy once both sides are flat unsigned bytes.
        memoryview(self._array[slot])[:] = mv.cast("B") if (mv.format != "B" or mv.ndim != 1) else mv

    def _check_slot(self, slot: object) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int):
            raise ValueError(
                f"slot must be an int in [0, {self._num_blocks}), got {type(slot).__name__} "
                f"{slot!r}"
            )
        if not 0 <= slot < self._num_blocks:
            raise IndexError(f"slot {slot} out of range [0, {self._num_blocks})")
        return slot

    def __repr__(self) -> str:
        return (
            f"BlockPool(num_blocks={self._num_blocks}, block_bytes={self._block_bytes}, "
            f"pinned={self._pinned}, free={len(self._free)})"
        )


# -- helpers --------------------------------------------------------------------------------------


def _allocate(
    num_blocks: int, block_bytes: int, pin: bool | None
) -> tuple[torch.Tensor, bool, str, shared.Backing | None, bool]:
    """Allocate the region. Returns (tensor, pinned, why for the log line, backing, degraded)."""
    shape = (num_blocks, block_bytes)
    if pin is False:
        return *_pageable(shape, "pin=False"), False
    if not _accelerator_available():
        if pin:
            return *_pageable(shape, "no accelerator; pin=True ignored"), True
        return *_pageable(shape, "no accelerator"), False
    try:
        t = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as exc:  # e.g. the pinned allocator ran out of locked memory
        return *_pageable(shape, f"pinning failed: {exc}"), True
    pinned = bool(t.is_pinned())
    return t, pinned, "accelerator available", None, not pinned


def _pageable(shape: tuple[int, int], why: str) -> tuple[torch.Tensor, bool, str, shared.Backing | None]:
    """Pageable memory: a shared memfd when the host has one, else torch's (no backing).
    Returns (tensor, pinned=False, why, backing)."""
    try:
        mm, backing = shared.allocate(shape[0] * shape[1])
    except (OSError, AttributeError):  # no memfd_create here: private memory
        return torch.empty(shape, dtype=torch.uint8), False, why, None
    # the tensor holds the mmap's buffer: the mapping lives exactly as long as the tensor
    return torch.frombuffer(mm, dtype=torch.uint8).view(shape), False, why, backing


def _accelerator_available() -> bool:
    try:
        return bool(torch.accelerator.is_available())
    except Exception:  # a broken driver must not stop a CPU-side pool from working
        return False


def _tensor_from_memoryview(mv: memoryview) -> torch.Tensor:
    if mv.ndim != 2:
        raise ValueError(f"wrap() needs a 2-D memoryview (num_blocks, block_bytes), got ndim={mv.ndim}")
    if mv.format not in ("B", "b"):
        raise ValueError(f"wrap() needs memoryview format 'B' or 'b', got {mv.format!r}")
    if mv.readonly:
        raise ValueError("wrap() needs a writable memoryview")
    if not mv.c_contiguous:
        raise ValueError("wrap() needs a C-contiguous memoryview")
    if 0 in mv.shape:
        raise ValueError(f"wrap() needs a non-empty region, got shape {mv.shape}")
    # np.asarray aliases the memoryview (keeping it alive through .base) and from_numpy aliases
    # the array, so the tensor is the caller's memory. No copy is made.
    arr = np.asarray(mv)
    if arr.dtype != np.uint8:
        arr = arr.view(np.uint8)
    return torch.from_numpy(arr)


def _tensor_from_tensor(t: torch.Tensor) -> torch.Tensor:
    if t.dim() != 2:
        raise ValueError(f"wrap() needs a 2-D tensor (num_blocks, block_bytes), got shape {tuple(t.shape)}")
    if t.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"wrap() needs dtype uint8 or int8, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"wrap() needs a CPU tensor, got device {t.device}")
    if not t.is_contiguous():
        raise ValueError("wrap() needs a C-contiguous tensor")
    if 0 in t.shape:
        raise ValueError(f"wrap() needs a non-empty region, got shape {tuple(t.shape)}")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)
