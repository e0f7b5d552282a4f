"""Shared-memory backing of a block region, and second mappings ("windows") of it.

Why: a one-sided data plane lets a peer WRITE into our pool, and nothing a NIXL target does stops
a peer's WRITE that is already posted (docs/nixl.md).  What a target *can* do is withdraw the
address a peer writes to: when the pool lives in shared memory (a ``memfd`` or a ``/dev/shm``
file), each peer is given its own second mapping of the same pages (a **window**); to withdraw
it, fresh anonymous pages are mapped over the window's addresses (``MAP_FIXED``).  The range
stays valid — a late WRITE lands in those anonymous pages (the *sink*), never in the pool — and
the engine's own mapping of the pool is untouched (decision N14).

* :func:`allocate` makes an owned ``memfd`` region (what :class:`~kvtier.memory.BlockPool` uses
  for pageable memory).
* :func:`find_backing` finds the shared file behind an existing mapping (vLLM's
  ``/dev/shm/vllm_offload_*.mmap`` region) from ``/proc/self/maps``.
* :class:`Backing` maps windows (:meth:`Backing.map_window`), :func:`withdraw` turns a window
  into a sink, :func:`unmap` gives a sink's addresses back once nothing can write there.

Linux only (``/proc``, ``memfd_create``, ``mmap`` through libc); elsewhere :func:`find_backing`
returns ``None`` and a pool simply has no backing.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
from typing import Any

__all__ = ["Backing", "allocate", "find_backing", "release_pages", "unmap", "withdraw"]

_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FIXED = 0x10
_MADV_DONTNEED = 4  # Linux

try:
    _libc: Any = ctypes.CDLL(None, use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.c_long]
    _libc.munmap.restype = ctypes.c_int
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _libc.madvise.restype = ctypes.c_int
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except (OSError, AttributeError):  # pragma: no cover - not a libc platform
    _libc = None

_MAP_FAILED = ctypes.c_void_p(-1).value


def _mmap(addr: int | None, size: int, flags: int, fd: int, offset: int) -> int:
    if _libc is None:  # pragma: no cover
        raise OSError("mmap through libc is not available here")
    p = _libc.mmap(addr, size, _PROT_RW, flags, fd, offset)
    if p is None or p == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
    return int(p)


class Backing:
    """Where a region's pages live: ``size`` bytes at ``offset`` of the shared file ``fd``.

    The object owns ``fd`` (closed when it is collected).  A window is a second mapping of the
    same pages at a new address: writes through it are writes into the region."""

    __slots__ = ("fd", "offset", "size", "source")

    def __init__(self, fd: int, offset: int, size: int, source: str) -> None:
        self.fd = fd
        self.offset = offset
        self.size = size
        self.source = source
        """For log lines: ``memfd`` or the file's path."""

    def map_window(self) -> int:
        """Map the region once more (``MAP_SHARED``); returns the window's address.

        Raises:
            OSError: the kernel refused the mapping."""
        return _mmap(None, self.size, mmap.MAP_SHARED, self.fd, self.offset)

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"Backing({self.source}, offset={self.offset}, size={self.size})"


def allocate(size: int, name: str = "kvtier-pool") -> tuple[mmap.mmap, Backing]:
    """An owned shared-memory region of ``size`` bytes (an anonymous ``memfd``).

    Returns the engine's mapping (an ``mmap`` object: a writable buffer, unmapped when the last
    buffer over it goes) and its :class:`Backing`.

    Raises:
        OSError: ``memfd_create`` or the mapping failed (no such call here, out of memory)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, _PROT_RW)
    except BaseException:
        os.close(fd)
        raise
    return mm, Backing(fd, 0, size, "memfd")


_MAPS_LINE = re.compile(r"([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) \S+ (\d+)\s*(.*)")


def find_backing(addr: int, size: int) -> Backing | None:
    """The shared file behind ``[addr, addr + size)`` of this process, or None.

    The range must lie in one ``MAP_SHARED`` mapping of a file (``/proc/self/maps`` flags
    ``rw?s``).  The file is opened by its path when it still exists and is the mapped inode (a
    ``/dev/shm`` file), else through ``/proc/self/map_files`` (a ``memfd``; needs
    ``CAP_SYS_ADMIN`` on most kernels).  Private memory (``torch.empty``, ``malloc``) has none."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.readlines()
    except OSError:
        return None
    for line in lines:
        m = _MAPS_LINE.match(line)
        if m is None:
            continue
        start, end = int(m[1], 16), int(m[2], 16)
        if not start <= addr < end:
            continue
        if addr + size > end or m[3][3] != "s" or m[3][1] != "w" or int(m[5]) == 0:
            return None
        offset = int(m[4], 16) + (addr - start)
        path = m[6].strip()
        fd = _open_mapped(path, int(m[5]), start, end)
        return Backing(fd, offset, size, path) if fd is not None else None
    return None


def _open_mapped(path: str, inode: int, start: int, end: int) -> int | None:
    if path.startswith("/") and not path.endswith("(deleted)"):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            fd = None
        if fd is not None:
            if os.fstat(fd).st_ino == inode:
                return fd
            os.close(fd)
    try:
        return os.open(f"/proc/self/map_files/{start:x}-{end:x}", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None


def withdraw(addr: int, size: int) -> None:
    """Map fresh anonymous pages over ``[addr, addr + size)`` (a window becomes a sink).

    The addresses stay mapped, so a late write through them lands in the sink (costing memory
    only for the pages it touches) instead of faulting or reaching a later mapping.

    Raises:
        OSError: the kernel refused (the range is left as it was)."""
    _mmap(addr, size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)


def release_pages(addr: int, size: int) -> None:
    """Give back the pages of the sink ``[addr, addr + size)`` that writes touched (private
    anonymous pages: ``MADV_DONTNEED`` frees them, and the next write there gets a fresh zero
    page).  Only for a sink (:func:`withdraw`): on a window it would not free the shared pages."""
    if _libc is not None:
        _libc.madvise(addr, size, _MADV_DONTNEED)


def unmap(addr: int, size: int) -> None:
    """Give ``[addr, addr + size)`` back (only once nothing can write there any more)."""
    if _libc is not None:
        _libc.munmap(addr, size)
