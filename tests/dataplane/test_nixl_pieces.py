"""The NIXL WRITE pipeline on a slow link (decision T23), with a fake agent whose WRITEs end when
the test says so and a clock the test moves: a batch larger than what the link drains in the
horizon goes in pieces, and only its last piece — posted once the others ended — carries the
header, so the consumer's notification still comes after every byte of the batch."""

from __future__ import annotations

import itertools

from kvtier.dataplane.base import Batch, Released
from kvtier.dataplane.nixl_pipeline import SLOW_START_BYTES, WritePipeline
from kvtier.dataplane.nixl_types import XferResult

BB = 1 << 20


class FakeAgent:
    def __init__(self) -> None:
        self.posted: dict[int, tuple[list[int], bytes | None]] = {}
        self.ended: list[XferResult] = []
        self._ids = itertools.count(1)

    def post_write(self, peer: str, blocks: list[int], slots: list[int], notif: bytes | None = None) -> int:
        wid = next(self._ids)
        self.posted[wid] = (list(slots), notif)
        return wid

    def end(self, *wids: int) -> None:
        self.ended += [XferResult(w, "cons", "done") for w in wids]

    def poll(self) -> list[XferResult]:
        out, self.ended = self.ended, []
        return out


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _pipeline(horizon_s: float) -> tuple[WritePipeline, FakeAgent, Clock]:
    agent, clock = FakeAgent(), Clock()
    return WritePipeline(agent, BB, lambda ev: None, horizon_s=horizon_s, clock=clock), agent, clock


def test_a_batch_larger_than_the_window_goes_in_pieces_its_header_on_the_last() -> None:
    pipe, agent, clock = _pipeline(horizon_s=1.0)
    batch = Batch(0, tuple(range(8)), tuple(range(10, 18)), b"hdr0")
    pipe.start(("kv", 0), "cons", [batch], known=True, packed=True)
    # the link's rate is unknown: one piece of SLOW_START_BYTES, header-less
    assert list(agent.posted.values()) == [(list(range(10, 10 + SLOW_START_BYTES // BB)), None)]
    clock.now = 0.5  # it took 0.5 s: 2 MiB/s, so the window is 2 MiB (horizon 1 s)
    agent.end(1)
    pipe.drive()
    assert agent.posted[2] == ([11, 12], None) and len(agent.posted) == 2  # 2 blocks: what the window holds
    clock.now = 1.5
    agent.end(2)
    pipe.drive()
    assert agent.posted[3] == ([13, 14], None) and len(agent.posted) == 3
    clock.now = 2.5
    agent.end(3)
    pipe.drive()
    assert agent.posted[4] == ([15, 16], None)
    clock.now = 3.5
    agent.end(4)
    pipe.drive()
    assert agent.posted[5] == ([17], b"hdr0")  # the last piece carries the header, the others ended
    clock.now = 4.0
    agent.end(5)
    pipe.drive()
    assert pipe.released() == [Released("kv", 0, False, 8 * BB, "")]


def test_the_last_piece_waits_for_the_others_and_a_cancel_posts_nothing_more() -> None:
    pipe, agent, clock = _pipeline(horizon_s=1.0)
    pipe.start(("warm", 0), "cons", [Batch(0, (0,), (0,), b"w")], known=True, packed=True)
    clock.now = 1.0
    agent.end(1)  # 1 MiB in 1 s: a 1 MiB window
    pipe.drive()
    pipe.released()
    batches = [Batch(0, (0, 1, 2), (20, 21, 22), b"h0"), Batch(1, (3,), (23,), b"h1")]
    pipe.start(("kv", 1), "cons", batches, known=True, packed=True)
    assert agent.posted[2] == ([20], None) and len(agent.posted) == 2
    clock.now = 2.0
    agent.end(2)
    pipe.drive()
    assert agent.posted[3] == ([21], None)
    pipe.cancel(("kv", 1))
    clock.now = 3.0
    agent.end(3)
    pipe.drive()
    assert len(agent.posted) == 3  # cancelled: batch 0's last piece and batch 1 are never posted
    assert pipe.released() == [Released("kv", 1, False, 2 * BB, "")]


def test_a_fast_link_posts_whole_packed_batches_once_its_first_piece_ended() -> None:
    pipe, agent, clock = _pipeline(horizon_s=2.5)
    batches = [Batch(i, tuple(range(4 * i, 4 * i + 4)), tuple(range(4 * i, 4 * i + 4)), b"h%d" % i) for i in range(8)]
    pipe.start(("kv", 0), "cons", batches, known=True, packed=True)
    assert agent.posted[1] == ([0], None)
    clock.now = 0.0005  # 1 MiB in 0.5 ms
    agent.end(1)
    pipe.drive()
    assert agent.posted[2] == ([1, 2, 3], b"h0")  # the rest of batch 0, with its header
    clock.now = 0.001
    agent.end(2)
    pipe.drive()
    notifs = [n for _, n in list(agent.posted.values())[2:]]
    assert len(notifs) == 2 and all(n[:1] == b"\xc1" for n in notifs)  # 7 batches packed into 2 WRITEs


def test_no_piece_is_posted_while_the_window_is_over_full() -> None:
    """A window smaller than one block still lets one block go when nothing is in flight; while it
    is, the window is over-full and the next batch waits — it once got a piece of a negative size,
    posted as an empty WRITE that failed the transfer."""
    pipe, agent, clock = _pipeline(horizon_s=0.5)
    pipe.start(("warm", 0), "cons", [Batch(0, (0,), (0,), b"w")], known=True, packed=True)
    clock.now = 1.0
    agent.end(1)  # 1 MiB in 1 s: a 512 KiB window, half a block
    pipe.drive()
    pipe.released()
    pipe.start(("kv", 2), "cons", [Batch(0, (0,), (30,), b"a"), Batch(1, (1, 2, 3), (31, 32, 33), b"b")],
               known=True, packed=True)
    assert list(agent.posted.values())[1:] == [([30], b"a")]  # one block: the window is over-full now
    for wid, want in ((2, ([31], None)), (3, ([32], None))):
        clock.now += 1.0
        agent.end(wid)
        pipe.drive()
        assert agent.posted[wid + 1] == want and len(agent.posted) == wid + 1
    clock.now += 1.0
    agent.end(4)
    pipe.drive()
    assert agent.posted[5] == ([33], b"b")  # the last piece, with the header
    clock.now += 1.0
    agent.end(5)
    pipe.drive()
    assert pipe.released() == [Released("kv", 2, False, 4 * BB, "")]
