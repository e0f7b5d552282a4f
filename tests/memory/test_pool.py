"""BlockPool: allocation, refcounts, bounds, zero-copy views and wrap()."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from kvtier.errors import KvTierError
from kvtier.memory import BlockPool, PoolExhausted

pytestmark = pytest.mark.timeout(30)

HAS_ACCEL = torch.accelerator.is_available()


@pytest.fixture
def pool() -> BlockPool:
    return BlockPool(8, 64, pin=False)


# -- construction and pinning ---------------------------------------------------------------------


def test_shape_dtype_and_prefault() -> None:
    p = BlockPool(4, 1024)
    assert (p.num_blocks, p.block_bytes) == (4, 1024)
    assert p.tensor.dtype == torch.uint8
    assert tuple(p.tensor.shape) == (4, 1024)
    assert p.tensor.is_contiguous()
    assert int(p.tensor.sum()) == 0  # zero-filled (pre-faulted)
    assert p.num_free == 4


@pytest.mark.skipif(HAS_ACCEL, reason="CPU-only behaviour")
def test_pageable_without_accelerator(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kvtier.memory"):
        p = BlockPool(2, 16)
    assert p.pinned is False
    assert not p.tensor.is_pinned()
    lines = [r for r in caplog.records if r.name == "kvtier.memory"]
    assert len(lines) == 1 and "pageable" in lines[0].getMessage()


@pytest.mark.skipif(HAS_ACCEL, reason="CPU-only behaviour")
def test_pin_true_falls_back_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kvtier.memory"):
        p = BlockPool(2, 16, pin=True)
    assert p.pinned is False
    lines = [r for r in caplog.records if r.name == "kvtier.memory"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.WARNING
    assert "pin=True ignored" in lines[0].getMessage()


@pytest.mark.skipif(not HAS_ACCEL, reason="needs an accelerator")
def test_pinned_with_accelerator() -> None:
    p = BlockPool(2, 4096)
    assert p.pinned is True and p.tensor.is_pinned()
    assert BlockPool(2, 4096, pin=False).pinned is False


@pytest.mark.parametrize(
    "args",
    [(0, 16), (4, 0), (-1, 16), (True, 16), (4, 1.5), ("4", 16)],
)
def test_bad_construction_args(args: tuple) -> None:
    with pytest.raises(ValueError):
        BlockPool(*args)


def test_bad_pin_arg() -> None:
    with pytest.raises(ValueError):
        BlockPool(1, 1, pin="yes")  # type: ignore[arg-type]


# -- allocation and refcounts ---------------------------------------------------------------------


def test_alloc_is_deterministic_and_distinct(pool: BlockPool) -> None:
    assert pool.alloc(3) == [0, 1, 2]
    assert pool.alloc(0) == []
    assert pool.num_free == 5
    assert all(pool.refcount(s) == 1 for s in (0, 1, 2))


def test_exhausted_raises_and_leaves_pool_unchanged(pool: BlockPool) -> None:
    pool.alloc(6)
    with pytest.raises(PoolExhausted) as ei:
        pool.alloc(3)
    assert (ei.value.requested, ei.value.free) == (3, 2)
    assert isinstance(ei.value, KvTierError)
    assert pool.num_free == 2
    assert len(pool.alloc(2)) == 2


def test_refcounts(pool: BlockPool) -> None:
    [s] = pool.alloc(1)
    pool.incref(s)
    pool.incref(s)
    assert pool.refcount(s) == 3
    pool.decref(s)
    pool.decref(s)
    assert pool.num_free == 7  # still held once
    pool.decref(s)
    assert pool.refcount(s) == 0 and pool.num_free == 8
    with pytest.raises(ValueError, match=r"holds no reference \(never allocated, or freed already\)"):
        pool.decref(s)
    with pytest.raises(ValueError, match="free slot"):
        pool.incref(s)


def test_freed_slot_is_reused(pool: BlockPool) -> None:
    a = pool.alloc(2)
    pool.free([a[1]])
    assert pool.alloc(1) == [a[1]]


def test_free_is_all_or_nothing(pool: BlockPool) -> None:
    never = pool.num_blocks - 1  # a slot never allocated is not called only a double free
    with pytest.raises(ValueError, match=f"free of slot {never} x1 but its refcount is 0 \\(never allocated, or"):
        pool.free([never])
    a, b = pool.alloc(2)
    with pytest.raises(ValueError, match="double free"):
        pool.free([a, b, b])  # b has refcount 1, freed twice
    assert pool.refcount(a) == 1 and pool.refcount(b) == 1
    with pytest.raises(IndexError):
        pool.free([a, 99])
    assert pool.refcount(a) == 1
    pool.incref(b)
    pool.free([a, b, b])
    assert pool.num_free == 8


# -- bounds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["view", "buffer", "refcount", "incref", "decref"])
@pytest.mark.parametrize("slot", [-1, 8, 10**6])
def test_out_of_range_slot(pool: BlockPool, method: str, slot: int) -> None:
    with pytest.raises(IndexError, match=rf"slot {slot} out of range \[0, 8\)"):
        getattr(pool, method)(slot)


@pytest.mark.parametrize("method", ["view", "buffer", "refcount", "incref", "decref"])
@pytest.mark.parametrize("slot", [True, False, 1.0, "1", None, np.int64(1)])
def test_non_int_slot(pool: BlockPool, method: str, slot: object) -> None:
    with pytest.raises(ValueError, match=r"slot must be an int in \[0, 8\)"):
        getattr(pool, method)(slot)


def test_write_bounds_and_size(pool: BlockPool) -> None:
    with pytest.raises(IndexError):
        pool.write(-1, bytes(64))
    with pytest.raises(ValueError, match="got 63 bytes, block_bytes is 64"):
        pool.write(0, bytes(63))
    with pytest.raises(ValueError):
        pool.write(0, bytes(65))
    with pytest.raises(ValueError, match="contiguous"):
        pool.write(0, np.zeros(128, dtype=np.uint8)[::2])
    with pytest.raises(TypeError):
        pool.write(0, 12345)


def test_alloc_bad_n(pool: BlockPool) -> None:
    for n in (-1, True, 1.0):
        with pytest.raises(ValueError):
            pool.alloc(n)  # type: ignore[arg-type]


# -- byte access ----------------------------------------------------------------------------------


def test_view_and_buffer_are_zero_copy(pool: BlockPool) -> None:
    v = pool.view(3)
    assert v.dtype == torch.uint8 and tuple(v.shape) == (64,)
    assert v.data_ptr() == pool.tensor.data_ptr() + 3 * 64
    v.fill_(7)
    buf = pool.buffer(3)
    assert isinstance(buf, memoryview) and not buf.readonly
    assert buf.format == "B" and buf.nbytes == 64
    assert bytes(buf) == b"\x07" * 64
    buf[0] = 9
    assert int(pool.tensor[3, 0]) == 9
    assert int(pool.tensor[2].sum()) == 0 and int(pool.tensor[4].sum()) == 0


def test_view_reinterprets_as_any_dtype(pool: BlockPool) -> None:
    src = torch.arange(32, dtype=torch.bfloat16)  # 64 bytes, and no numpy dtype exists for bf16
    pool.write(1, src)
    assert torch.equal(pool.view(1).view(torch.bfloat16), src)
    # A KV-shaped block, [layers=2, 2, heads=2, tokens=2, head_dim=2] fp32 = 128 B, as one example.
    p = BlockPool(2, 128)
    kv = torch.randn(2, 2, 2, 2, 2)
    p.write(0, kv)
    assert torch.equal(p.view(0).view(torch.float32).view(2, 2, 2, 2, 2), kv)


def test_write_from_various_buffers(pool: BlockPool) -> None:
    pool.write(0, b"a" * 64)
    pool.write(1, bytearray(b"b" * 64))
    pool.write(2, memoryview(b"c" * 64))
    pool.write(3, np.full(16, 0x64646464, dtype=np.uint32))  # 64 bytes, format 'I'
    pool.write(4, memoryview(bytearray(b"e" * 64)).cast("B", (8, 8)))  # 2-D
    pool.write(5, np.frombuffer(b"f" * 64, dtype=np.uint8))  # read-only source is fine
    for slot, ch in enumerate(b"abcdef"):
        assert bytes(pool.buffer(slot)) == bytes([ch]) * 64


def test_write_into_buffer_like_recv_into(pool: BlockPool) -> None:
    # What a zmq recv_into would do: fill the slot through its memoryview.
    buf = pool.buffer(6)
    buf[:] = bytes(range(64))
    assert bytes(pool.view(6).numpy()) == bytes(range(64))


# -- wrap -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["B", "b"])
def test_wrap_memoryview_is_zero_copy(fmt: str) -> None:
    raw = bytearray(4 * 32)
    mv = memoryview(raw).cast(fmt, (4, 32))
    p = BlockPool.wrap(mv)
    assert (p.num_blocks, p.block_bytes) == (4, 32)
    assert p.num_free == 4 and p.pinned is False
    p.write(2, b"\xab" * 32)
    assert raw[64:96] == b"\xab" * 32  # the write landed in the caller's memory
    raw[0] = 0x11
    assert int(p.view(0)[0]) == 0x11  # and the caller's writes show through the pool
    p.buffer(3)[5] = 0xFE
    assert raw[3 * 32 + 5] == 0xFE


def test_wrap_does_not_zero_existing_data() -> None:
    raw = bytearray(b"\x05" * 64)
    p = BlockPool.wrap(memoryview(raw).cast("B", (2, 32)))
    assert bytes(p.buffer(1)) == b"\x05" * 32


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
def test_wrap_tensor_is_zero_copy(dtype: torch.dtype) -> None:
    t = torch.zeros(3, 16, dtype=dtype)
    p = BlockPool.wrap(t)
    assert p.tensor.dtype == torch.uint8
    assert p.tensor.data_ptr() == t.data_ptr()
    p.write(1, b"\x01" * 16)
    assert int(t[1].sum()) == 16


def test_wrap_numpy_backed_memoryview() -> None:
    arr = np.zeros((5, 8), dtype=np.uint8)
    p = BlockPool.wrap(memoryview(arr))
    p.write(4, bytes(range(8)))
    assert arr[4].tolist() == list(range(8))


@pytest.mark.parametrize(
    "bad, exc",
    [
        (memoryview(bytearray(16)), ValueError),  # 1-D
        (memoryview(bytes(16)).cast("B", (2, 8)), ValueError),  # read-only
        (memoryview(bytearray(16)).cast("H", (2, 4)), ValueError),  # format
        (memoryview(np.zeros((4, 8), dtype=np.uint8))[::2], ValueError),  # non-contiguous
        (memoryview(np.zeros((0, 8), dtype=np.uint8)), ValueError),  # empty
        (torch.zeros(2, 8, dtype=torch.float32), ValueError),  # dtype
        (torch.zeros(16, dtype=torch.uint8), ValueError),  # 1-D
        (torch.zeros(8, 2, dtype=torch.uint8).t(), ValueError),  # non-contiguous
        (bytearray(16), TypeError),
        (np.zeros((2, 8), dtype=np.uint8), TypeError),
    ],
)
def test_wrap_rejects(bad: object, exc: type) -> None:
    with pytest.raises(exc):
        BlockPool.wrap(bad)  # type: ignore[arg-type]
