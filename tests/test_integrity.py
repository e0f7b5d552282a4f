"""Block digests: the serial functions and the DigestPool that splits a request over threads.

No timings: what is asserted is that the pool's answers are exactly the serial ones, whichever
thread hashed which block, that a changed byte anywhere is found (first mismatch first), and that
the pool's threads start on the first submit and are gone after ``close()``.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import KvTierError
from kvtier.integrity import (
    ALGORITHMS,
    GIL_RELEASE_BYTES,
    MAX_DEFAULT_THREADS,
    MIN_PART_BYTES,
    DigestPool,
    DigestPoolClosed,
    _plan,
    block_digests,
    check_blocks,
    default_threads,
    digest,
    land_blocks,
    usable_cpus,
)

MiB = 1 << 20


def blocks(n: int, size: int, seed: int = 0) -> list[memoryview]:
    """``n`` distinct blocks of ``size`` bytes, views into one arena (like pool slots)."""
    arena = bytearray(random.Random(seed).randbytes(n * size))
    mv = memoryview(arena)
    return [mv[i * size : (i + 1) * size] for i in range(n)]


def workers(pool: DigestPool) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(pool._name + "-")]


@pytest.fixture
def pool():
    p = DigestPool(3, name=f"test-digest-{random.getrandbits(32):08x}")
    yield p
    p.close()


# -- serial functions ---------------------------------------------------------------------------


def test_serial_functions() -> None:
    bufs = blocks(5, 4096)
    ds = block_digests(bufs, "xxh3_64")
    assert ds == tuple(digest(b) for b in bufs) and len(set(ds)) == 5
    assert all(0 <= d < 2**64 for d in ds)
    assert digest(b"") == digest(memoryview(b"")) and digest(b"a") != digest(b"b")
    assert check_blocks(bufs, ds, "xxh3_64") == -1
    assert check_blocks(bufs, ds[:4] + (ds[4] ^ 1,), "xxh3_64") == 4
    assert check_blocks(bufs, ds[:4], "xxh3_64") == 0  # one digest per block or it is a mismatch
    assert block_digests(bufs, "none") == () and check_blocks(bufs, (), "none") == -1
    assert ALGORITHMS == ("xxh3_64", "none")
    for fn in (lambda: block_digests(bufs, "xxh3_128"), lambda: check_blocks(bufs, ds, "sha256")):
        with pytest.raises(ValueError, match="unknown digest algorithm"):
            fn()


# -- the split ----------------------------------------------------------------------------------


@settings(max_examples=300)
@given(sizes=st.lists(st.integers(0, 10), min_size=1, max_size=40), parts=st.integers(1, 12))
def test_plan_cuts_contiguous_nonempty_ranges(sizes: list[int], parts: int) -> None:
    ranges = _plan(sizes, parts)
    assert 1 <= len(ranges) <= min(parts, len(sizes))
    assert ranges[0][0] == 0 and ranges[-1][1] == len(sizes)
    for (a, b), (c, _) in zip(ranges, ranges[1:]):
        assert b == c
    assert all(a < b for a, b in ranges)


def test_plan_balances_equal_blocks() -> None:
    assert _plan([1] * 8, 2) == [(0, 4), (4, 8)]
    assert _plan([1] * 10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert _plan([1, 1], 4) == [(0, 1), (1, 2)]


# -- the pool: answers ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 4096, GIL_RELEASE_BYTES, GIL_RELEASE_BYTES + 1, MIN_PART_BYTES]),
                   min_size=0, max_size=12),
    threads=st.integers(1, 4),
)
def test_pool_digests_equal_the_serial_function(sizes: list[int], threads: int) -> None:
    rng = random.Random(len(sizes) * 31 + threads)
    bufs = [memoryview(bytearray(rng.randbytes(s))) for s in sizes]
    with DigestPool(threads) as p:
        want = block_digests(bufs, "xxh3_64")
        assert p.submit_digests(bufs).result(timeout=30) == want
        assert p.submit_check(bufs, want).result(timeout=30) == -1


@pytest.mark.parametrize("size", [4096, GIL_RELEASE_BYTES + 4096])
def test_a_changed_byte_is_caught_in_every_part(pool: DigestPool, size: int) -> None:
    # 12 blocks over 3 threads: every block position (so every part) gets a flipped byte once
    n = 12 if size > GIL_RELEASE_BYTES else 40
    bufs = blocks(n, size, seed=size)
    want = pool.submit_digests(bufs).result(timeout=30)
    assert want == block_digests(bufs, "xxh3_64")
    for i in range(n):
        at = (i * 7919) % size
        bufs[i][at] ^= 0x01
        assert pool.submit_check(bufs, want).result(timeout=30) == i, i
        bufs[i][at] ^= 0x01
    assert pool.submit_check(bufs, want).result(timeout=30) == -1


def test_check_reports_the_first_mismatch_whatever_part_finds_one_first(pool: DigestPool) -> None:
    bufs = blocks(9, MIN_PART_BYTES)
    want = list(block_digests(bufs, "xxh3_64"))
    for bad in ([8, 2], [3, 4, 5], [0, 8], [6]):
        wrong = [d ^ 1 if i in bad else d for i, d in enumerate(want)]
        assert pool.submit_check(bufs, wrong).result(timeout=30) == min(bad)


def test_empty_inputs_and_none(pool: DigestPool) -> None:
    one = blocks(1, 4096)
    assert pool.submit_digests([]).result(timeout=5) == ()
    assert pool.submit_check([], []).result(timeout=5) == -1
    assert pool.submit_check(one, []).result(timeout=5) == 0  # wrong length: mismatch at 0
    assert pool.submit_check([], [1]).result(timeout=5) == 0
    assert pool.submit_digests(one, "none").result(timeout=5) == ()
    assert pool.submit_check(one, [], "none").result(timeout=5) == -1
    assert not workers(pool), "answers known without hashing must not start the threads"
    assert pool.submit_digests([b""]).result(timeout=5) == (digest(b""),)  # an empty block is hashed


def test_bad_input_is_refused_or_raised_by_the_future(pool: DigestPool) -> None:
    with pytest.raises(ValueError, match="unknown digest algorithm 'crc32'"):
        pool.submit_digests(blocks(1, 16), "crc32")
    with pytest.raises(ValueError, match="unknown digest algorithm"):
        pool.submit_check(blocks(1, 16), [0], "xxh3_128")
    fut = pool.submit_digests([b"ok", "not a buffer"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        fut.result(timeout=5)
    # the pool still works after a failed request
    assert pool.submit_digests([b"ok"]).result(timeout=5) == (digest(b"ok"),)
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="threads must be a positive int"):
            DigestPool(bad)  # type: ignore[arg-type]


def test_several_submitting_threads(pool: DigestPool) -> None:
    bufs = blocks(16, 2 * GIL_RELEASE_BYTES, seed=7)
    small = blocks(32, 2048, seed=8)
    want, want_small = block_digests(bufs, "xxh3_64"), block_digests(small, "xxh3_64")
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def client(k: int) -> None:
        try:
            start.wait(timeout=10)
            for j in range(25):
                lo = (k + j) % 8
                sub = bufs[lo : lo + 8]
                got = pool.submit_digests(sub).result(timeout=30)
                assert got == want[lo : lo + 8]
                assert pool.submit_check(sub, got).result(timeout=30) == -1
                assert pool.submit_digests(small).result(timeout=30) == want_small
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    ts = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errors, errors
    assert len(workers(pool)) == pool.threads


# -- the pool: threads and close ------------------------------------------------------------------


def test_threads_start_on_first_submit_and_close_joins_them() -> None:
    p = DigestPool(2, name="test-digest-lifecycle")
    assert not workers(p) and "idle" in repr(p)
    bufs = blocks(8, MIN_PART_BYTES)
    assert p.submit_digests(bufs).result(timeout=30) == block_digests(bufs, "xxh3_64")
    live = workers(p)
    assert len(live) == 2 and all(t.is_alive() for t in live)
    p.close()
    assert not any(t.is_alive() for t in live) and not workers(p)
    assert p.closed and "closed" in repr(p)
    p.close()  # idempotent
    with pytest.raises(DigestPoolClosed, match="closed") as e:
        p.submit_digests(bufs)
    assert isinstance(e.value, KvTierError) and isinstance(e.value, RuntimeError)
    with pytest.raises(DigestPoolClosed):
        p.submit_check(bufs, [0] * 8)


def test_close_lets_submitted_requests_finish() -> None:
    p = DigestPool(2, name="test-digest-drain")
    bufs = blocks(32, MIN_PART_BYTES, seed=3)
    futs = [p.submit_digests(bufs[i : i + 8]) for i in range(0, 32, 8)]
    p.close()
    want = block_digests(bufs, "xxh3_64")
    assert [f.result(timeout=0) for f in futs] == [want[i : i + 8] for i in range(0, 32, 8)]


def test_close_from_a_done_callback_does_not_deadlock() -> None:
    p = DigestPool(2, name="test-digest-cb")
    done = threading.Event()

    def cb(f: Future) -> None:
        p.close()
        done.set()

    p.submit_digests(blocks(4, MIN_PART_BYTES)).add_done_callback(cb)
    assert done.wait(timeout=30)
    assert p.closed
    for t in workers(p):
        t.join(timeout=10)
    assert not workers(p)


def test_futures_cannot_be_cancelled_once_submitted(pool: DigestPool) -> None:
    # a request whose future could be cancelled would leave its buffers in use with nobody
    # waiting for the end: a submitted request always runs to its end
    fut = pool.submit_digests(blocks(4, MIN_PART_BYTES))
    assert not fut.cancel()
    assert len(fut.result(timeout=30)) == 4


def test_default_size_follows_the_machine() -> None:
    n = default_threads()
    assert 1 <= n <= MAX_DEFAULT_THREADS and n == min(usable_cpus(), MAX_DEFAULT_THREADS)
    p = DigestPool()
    try:
        assert p.threads == n
    finally:
        p.close()


# -- landing: copy then check --------------------------------------------------------------------


@pytest.mark.parametrize("size", [4096, GIL_RELEASE_BYTES + 1, 2 * MiB])
def test_land_copies_and_checks_block_by_block_serial_and_pooled(pool: DigestPool, size: int) -> None:
    src = blocks(6, size, seed=3)
    want = [digest(b) for b in src]
    for run in ("serial", "pool"):
        dst = blocks(6, size, seed=99)
        bad = land_blocks(dst, src, want, "xxh3_64") if run == "serial" else pool.submit_land(dst, src, want).result()
        assert bad == -1 and [bytes(d) for d in dst] == [bytes(b) for b in src], run
    wrong = list(want)
    wrong[4] ^= 1
    wrong[2] ^= 1
    dst = blocks(6, size, seed=98)
    assert pool.submit_land(dst, src, wrong).result() == 2
    assert [bytes(d) for d in dst] == [bytes(b) for b in src]  # the pool copies every block
    dst = blocks(6, size, seed=97)
    assert land_blocks(dst, src, wrong, "xxh3_64") == 2
    assert bytes(dst[2]) == bytes(src[2]) and bytes(dst[3]) != bytes(src[3])  # stops after the first
    assert land_blocks(blocks(6, size), src, [], "none") == -1
    assert land_blocks(blocks(6, size), src, want[:3], "xxh3_64") == 0  # a short digest list


def test_land_refuses_a_size_mismatch_before_copying(pool: DigestPool) -> None:
    src, dst = blocks(2, 4096), blocks(2, 8192)
    with pytest.raises(ValueError, match="block 0 has 4096 bytes"):
        pool.submit_land(dst, src, [0, 0])
    with pytest.raises(ValueError, match="block 0 has 4096 bytes"):
        land_blocks(dst, src, [0, 0], "xxh3_64")
