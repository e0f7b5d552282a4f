"""The zmq plane's producer side asks to be polled for its zero-copy releases (no wait can see a
tracker turn done): every ``RELEASE_WAIT_S`` while posted blocks are still referenced — the next
batch of a transfer larger than its window is posted on the poll that sees room — and not at all
once every transfer was reported ``Released`` (decision C35: the cadence is the plane's, not the
loop's).  The window is what the peer's link drains in half ``abort_ack_timeout_s``, at most
``WINDOW_BYTES``, one batch at a time until a release shows the rate (decision T23).  A
fake transport whose send handles turn done when the test says so, and a clock the test moves."""

from __future__ import annotations

from kvtier.dataplane import Released, ZmqPlane
from kvtier.dataplane.base import Batch
from kvtier.dataplane.settings import PlaneSettings
from kvtier.dataplane.zmq import RELEASE_WAIT_S, WINDOW_BYTES
from kvtier.memory import BlockPool

BB = 1 << 20
BATCH = 8  # blocks per batch: 8 MiB


class Handle:
    def __init__(self) -> None:
        self.done = False
        self.failed = False
        self.error = ""


class HeldTransport:
    """Every send succeeds; its handle turns done only when the test releases it."""

    def __init__(self) -> None:
        self.handles: list[Handle] = []

    def send(self, peer: str, frames: list, *, track: bool = False) -> Handle:
        h = Handle()
        self.handles.append(h)
        return h

    def release(self, n: int | None = None) -> None:
        for h in [h for h in self.handles if not h.done][:n]:
            h.done = True


def _batches(n: int) -> list[Batch]:
    return [Batch(first=i * BATCH, blocks=tuple(range(BATCH)), slots=(), header=b"h") for i in range(n)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _plane(warm: bool = True, abort_ack_timeout_s: float = 5.0) -> tuple[ZmqPlane, HeldTransport, Clock]:
    """A plane over a held transport; ``warm``: one batch already went to ``cons`` at 8 GB/s."""
    t, clock = HeldTransport(), Clock()
    plane = ZmqPlane(transport=t, pool=BlockPool(BATCH, BB, pin=False), clock=clock,
                     settings=PlaneSettings(abort_ack_timeout_s=abort_ack_timeout_s))
    if warm:
        plane.post("cons", "kv-warm", 1, _batches(1))
        clock.now += BATCH * BB / 8e9
        t.release()
        assert plane.poll() == [Released("kv-warm", 1, False, BATCH * BB)]
        t.handles.clear()
    return plane, t, clock


def test_a_transfer_inside_its_window_is_polled_until_released() -> None:
    plane, t, _ = _plane()
    assert plane.max_wait_s() is None
    plane.post("cons", "kv-a", 1, _batches(2))
    assert len(t.handles) == 2  # 16 MiB: inside the window, all posted at once
    assert plane.max_wait_s() == RELEASE_WAIT_S
    assert plane.poll() == [] and plane.max_wait_s() == RELEASE_WAIT_S
    t.release()
    assert plane.poll() == [Released("kv-a", 1, False, 2 * BATCH * BB)]
    assert plane.max_wait_s() is None


def test_a_batch_waiting_for_window_room_is_posted_on_the_poll_that_sees_room() -> None:
    plane, t, _ = _plane()
    n = WINDOW_BYTES // (BATCH * BB) + 2  # two batches more than the window holds
    plane.post("cons", "kv-b", 1, _batches(n))
    assert len(t.handles) == n - 2
    assert plane.max_wait_s() == RELEASE_WAIT_S
    t.release(1)
    assert plane.poll() == [] and len(t.handles) == n - 1  # the released batch's room: one more posted
    assert plane.max_wait_s() == RELEASE_WAIT_S
    t.release(1)
    assert plane.poll() == [] and len(t.handles) == n  # the last one is posted: nothing waits for room
    assert plane.max_wait_s() == RELEASE_WAIT_S
    plane.cancel("kv-b", 1)
    t.release()
    assert plane.poll() == [Released("kv-b", 1, False, n * BATCH * BB)]
    assert plane.max_wait_s() is None


def test_a_cancelled_transfer_posts_nothing_more_and_is_released_once_its_sends_are() -> None:
    plane, t, _ = _plane()
    n = WINDOW_BYTES // (BATCH * BB) + 1
    plane.post("cons", "kv-c", 1, _batches(n))
    assert plane.max_wait_s() == RELEASE_WAIT_S
    plane.cancel("kv-c", 1)
    assert plane.max_wait_s() == RELEASE_WAIT_S  # its posted batches are still referenced
    t.release()
    [r] = plane.poll()
    assert r.kv_request_id == "kv-c" and r.nbytes == (n - 1) * BATCH * BB and len(t.handles) == n - 1


def test_a_transfer_commits_what_its_link_drains_in_half_the_abort_timeout() -> None:
    """Decision T23: before any release to a peer one batch is in flight at a time (slow start);
    a release shows the link's rate, and from then on a transfer commits what the link
    drains in half ``abort_ack_timeout_s`` — one batch on a 4 MB/s link (its cancel leaves at
    most that queued ahead of the abort's answer and other loads), the whole window on a fast one."""
    plane, t, clock = _plane(warm=False, abort_ack_timeout_s=2.0)
    plane.post("cons", "kv-s", 1, _batches(6))
    assert len(t.handles) == 1  # the rate is unknown: one batch
    assert plane.poll() == [] and len(t.handles) == 1
    clock.now += BATCH * BB / 4e6  # 8 MiB took ~2 s: 4 MB/s
    t.release()
    assert plane.poll() == [] and len(t.handles) == 2  # 1 s of it is 4 MB: still one batch at a time
    plane.cancel("kv-s", 1)
    clock.now += 2.0
    t.release()
    [r] = plane.poll()
    assert r.nbytes == 2 * BATCH * BB and len(t.handles) == 2  # the cancel found one batch committed
    fast, t2, clock2 = _plane(warm=False, abort_ack_timeout_s=2.0)
    fast.post("cons", "kv-f", 1, _batches(6))
    clock2.now += 0.002  # 8 MiB in 2 ms: 4 GB/s, far past 32 MiB a second
    t2.release()
    assert fast.poll() == [] and len(t2.handles) == 1 + WINDOW_BYTES // (BATCH * BB)
