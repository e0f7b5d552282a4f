"""The zmq plane's landings: small ones copy and check on the caller's thread; large ones run on the
digest pool, are reported by ``poll`` (``Landed``), and until they ended ``revoke`` of their peer
is not true (nothing may still copy into a load's slots when they are handed back); ``close``
waits for them.  A fake pool completes the pool's work when the test says so."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from kvtier.dataplane import Landed, PlaneError, Revoked, ZmqPlane
from kvtier.dataplane.landing import INLINE_LAND_BYTES
from kvtier.integrity import DigestPool, digest, land_blocks
from kvtier.memory import BlockPool

BB = INLINE_LAND_BYTES // 2  # two blocks land inline, four go to the pool


class HeldPool:
    """Runs the landing when the test releases it."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future, tuple]] = []
        self.notify = None  # as DigestPool: called once a request's future resolved (if set)

    def submit_land(self, dsts, srcs, expected, algorithm):
        f: Future = Future()
        self.jobs.append((f, (dsts, srcs, expected, algorithm)))
        return f

    def release(self) -> None:
        for f, args in self.jobs:
            f.set_result(land_blocks(*args))
            if self.notify is not None:
                self.notify()
        self.jobs.clear()


def _plane(digest_pool):
    pool = BlockPool(16, BB, pin=False)
    return ZmqPlane(transport=None, pool=pool, digest_pool=digest_pool), pool


def _frames(n: int, byte0: int = 1) -> list[memoryview]:
    return [memoryview(bytes([byte0 + i]) * BB) for i in range(n)]


def test_a_small_landing_is_copied_and_checked_at_once() -> None:
    plane, pool = _plane(HeldPool())
    frames = _frames(2)
    assert plane.land("P", "k", [3, 4], frames, [digest(f) for f in frames]) == -1
    assert bytes(pool.buffer(3)) == bytes(frames[0]) and bytes(pool.buffer(4)) == bytes(frames[1])
    assert plane.land("P", "k2", [5, 6], frames, [digest(frames[0])] * 2) == 1
    assert plane.revoke("P")


def test_a_large_landing_holds_the_peers_revocation_until_it_ended() -> None:
    held = HeldPool()
    plane, pool = _plane(held)
    frames = _frames(4)
    assert plane.land("P", "key", [0, 1, 2, 3], frames, [digest(f) for f in frames]) is None
    assert plane.revoke("Q")  # another peer: nothing of it is copying
    assert not plane.revoke("P")
    assert plane.poll() == [] and plane.max_wait_s() is not None
    held.release()
    assert plane.poll() == [Landed("P", "key", -1), Revoked("P")]
    assert [bytes(pool.buffer(i)) for i in range(4)] == [bytes(f) for f in frames]
    assert plane.revoke("P") and plane.max_wait_s() is None


def test_a_pool_that_wakes_its_owner_needs_no_polling_while_a_landing_runs() -> None:
    """C35: an I/O loop's pool calls ``notify`` (the loop's wake-up) when a landing ends, so the
    plane asks for no wait bound of its own; without ``notify`` it asks to be polled."""
    held = HeldPool()
    plane, _ = _plane(held)
    woken = []
    held.notify = lambda: woken.append(1)
    frames = _frames(4)
    assert plane.land("P", "key", [0, 1, 2, 3], frames, [digest(f) for f in frames]) is None
    assert plane.max_wait_s() is None
    held.notify = None
    assert plane.max_wait_s() is not None
    held.notify = lambda: woken.append(1)
    held.release()
    assert woken == [1] and plane.poll() == [Landed("P", "key", -1)]


def test_a_payload_of_the_wrong_size_is_refused_before_anything_is_copied() -> None:
    plane, pool = _plane(HeldPool())
    pool.tensor.fill_(9)
    with pytest.raises(PlaneError, match="payload frame 1"):
        plane.land("P", "k", [0, 1], [memoryview(b"x" * BB), memoryview(b"x" * 3)], [0, 0])
    with pytest.raises(PlaneError, match="2 payload frames for 1 blocks"):
        plane.land("P", "k", [0], _frames(2), [0])
    assert bytes(pool.buffer(0)) == b"\x09" * BB


def test_close_waits_for_a_real_pools_landings() -> None:
    with DigestPool(2, name="test-zmq-landing") as dp:
        plane, pool = _plane(dp)
        frames = _frames(8)
        plane.land("P", "key", list(range(8)), frames, [digest(f) for f in frames])
        plane.revoke("P")
        out = plane.close()
        assert Landed("P", "key", -1) in out and Revoked("P") in out
        assert [bytes(pool.buffer(i)) for i in range(8)] == [bytes(f) for f in frames]
