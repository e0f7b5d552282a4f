"""The order of inputs around per-byte work (kvtier.shell.perbyte.ByteWork), with futures the test
completes by hand, and the batch plan (kvtier.shell.outbound.plan_batches).

* a held store releases, with its digests, before the later engine inputs about its id; other ids
  are not held; ``flush`` waits for every digest and keeps the engine's order;
* a peer's input arriving while one of its landings runs is held until the landing's result, which
  comes first; a further ``block_data`` is not held (its check overlaps), unless an input is
  already held; a landing started by a released input precedes what is still held;
* deadlines may fire no later than the arrival of the oldest thing held.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.lifecycle import inputs as ix
from kvtier.shell.outbound import plan_batches
from kvtier.shell.perbyte import INLINE_STORE_BYTES, ByteWork
from kvtier.wire import messages as wm

BB = INLINE_STORE_BYTES  # one block is small enough to hash inline, four are not


class FakePool:
    def __init__(self) -> None:
        self.futures: list[Future] = []
        self.asked: list[tuple] = []

    def submit_digests(self, buffers, algorithm):
        self.asked.append((list(buffers), algorithm))
        f: Future = Future()
        self.futures.append(f)
        return f


class Counters:
    def __init__(self) -> None:
        self.bytes = 0
        self.aged: list[str] = []  # ids whose held store was released to be applied (its park age starts)

    def landed(self, n: int) -> None:
        self.bytes += n

    def parked(self, kv_request_id: str) -> None:
        self.aged.append(kv_request_id)


class Logs:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, key, reason, fmt, *args, **kw) -> None:
        self.lines.append(fmt % args)

    def who(self, peer: str) -> str:
        return peer

MISMATCH = ("does not match the digest its producer sent (taken when it parked it, or as its serve began; none sent "
            "counts as a mismatch); the load fails")


def _work(pool=None, algorithm: str = "xxh3_64", counters: Counters | None = None) -> ByteWork:
    return ByteWork(algorithm=algorithm, digest_pool=pool, block_bytes=BB, metrics=counters or Counters(), logs=Logs())


def _store(kid: str, job: int, n: int = 4) -> ix.StoreSubmitted:
    return ix.StoreSubmitted(kid, "req-" + kid, job, tuple(b"k%d" % i for i in range(n)), tuple(range(n)))


def _bufs(n: int = 4) -> list[bytes]:
    return [bytes([i]) * BB for i in range(n)]


def _bd(peer: str, kid: str = "kv", first: int = 0, count: int = 1) -> ix.Received:
    return ix.Received(peer, wm.BlockData(gen=1, kv_request_id=kid, round=0, first=first, count=count,
                                          digests=[1] * count))


def _done(peer: str, kid: str = "kv") -> ix.Received:
    return ix.Received(peer, wm.TransferDone(gen=1, kv_request_id=kid, round=0, ok=False, reason="aborted"))


# -- stores ----------------------------------------------------------------------------------------


def test_a_small_store_is_hashed_here_and_applied_at_once() -> None:
    work = _work(FakePool())
    small = _store("kv", 1, n=1)
    ready = work.store(small, [b"x" * BB])
    assert ready is not None and len(ready.digests) == 1 and work.held() == 0


def test_a_held_store_keeps_the_engine_order_of_its_id() -> None:
    pool = FakePool()
    work = _work(pool)
    assert work.store(_store("kv", 1), _bufs()) is None
    named, end = ix.ConsumerNamed("kv", "decoder"), ix.RequestFinished("kv", producer=True)
    assert work.holds(named) and work.holds(end)
    assert not work.holds(ix.RequestFinished("other", producer=True))  # another id: not held
    assert not work.holds(ix.RequestFinished("kv", producer=False))  # the consumer side: not held
    second = work.store(_store("kv", 2, n=1), [b"y" * BB])  # small (hashed here), but behind the first
    assert second is None
    assert not work.ready() and list(work.inputs((), 0.0)) == []
    pool.futures[0].set_result((11, 12, 13, 14))
    assert work.ready()
    out = list(work.inputs((), 0.0))
    assert [type(i).__name__ for i in out] == ["StoreSubmitted", "ConsumerNamed", "RequestFinished",
                                                "StoreSubmitted"]
    assert out[0].digests == (11, 12, 13, 14) and out[0].job_id == 1 and out[3].job_id == 2
    assert work.held() == 0 and not work.holds(ix.RequestFinished("kv", producer=True))


def test_ids_release_independently_in_submission_order() -> None:
    pool, counters = FakePool(), Counters()
    work = _work(pool, counters=counters)
    work.store(_store("a", 1), _bufs())
    work.store(_store("b", 2), _bufs())
    assert counters.aged == []  # held: a park age starts as a store is applied (O17)
    pool.futures[1].set_result((1, 2, 3, 4))  # b's digests first: b goes, a still waits
    assert [i.job_id for i in work.inputs((), 0.0)] == [2]
    pool.futures[0].set_result((5, 6, 7, 8))
    assert [i.job_id for i in work.inputs((), 0.0)] == [1]
    assert counters.aged == ["b", "a"]


def test_flush_waits_for_every_digest_in_the_engines_order() -> None:
    pool = FakePool()
    work = _work(pool)
    work.store(_store("a", 1), _bufs())
    work.holds(ix.RequestFinished("a", producer=True))
    work.store(_store("b", 2), _bufs())
    for f in pool.futures:
        f.set_result((0, 0, 0, 0))
    out = work.flush()
    assert [(type(i).__name__, i.kv_request_id) for i in out] == [
        ("StoreSubmitted", "a"), ("RequestFinished", "a"), ("StoreSubmitted", "b")]
    assert work.held() == 0


def test_without_a_pool_every_store_is_hashed_here() -> None:
    work = _work(None)
    ready = work.store(_store("kv", 1), _bufs())
    assert ready is not None and len(ready.digests) == 4


# -- landings --------------------------------------------------------------------------------------


def test_what_follows_a_landing_from_its_peer_waits_for_it() -> None:
    work = _work()
    work.landing("P", ("kv", 0, 0, 4))
    batch = [_done("P"), _bd("Q"), ix.ConnectionClosed("P"), ix.TransferReleased("x", 1)]
    out = list(work.inputs(batch, after=5.0))
    assert out == [_bd("Q"), ix.TransferReleased("x", 1)]  # another peer's and the plane's go on
    assert work.floor() == 5.0  # what it holds arrived after 5.0
    work.landed("P", ("kv", 0, 0, 4), -1)
    out = list(work.inputs((), after=6.0))
    assert out[0] == ix.BlocksLanded("P", "kv", 0, 0, 4, True)
    assert out[1:] == [_done("P"), ix.ConnectionClosed("P")]
    assert work.held() == 0


def test_a_further_block_data_is_not_held_behind_landings_only() -> None:
    work = _work()
    work.landing("P", ("kv", 0, 0, 4))
    assert list(work.inputs([_bd("P", first=4)], after=1.0)) == [_bd("P", first=4)]
    work.landing("P", ("kv", 0, 4, 1))  # the one it started
    assert list(work.inputs([_done("P"), _bd("P", kid="kv2")], after=2.0)) == []  # behind a held input
    work.landed("P", ("kv", 0, 4, 1), 0)  # the second ends first: still behind the first
    assert list(work.inputs((), after=3.0)) == []
    work.landed("P", ("kv", 0, 0, 4), -1)
    out = list(work.inputs((), after=3.0))
    assert [type(i).__name__ for i in out] == ["BlocksLanded", "BlocksLanded", "Received", "Received"]
    assert out[1].ok is False and out[1].reason == "corrupt"
    assert type(out[2].msg) is wm.TransferDone and type(out[3].msg) is wm.BlockData


def test_a_landing_started_by_a_released_input_precedes_what_is_still_held() -> None:
    work = _work()
    work.landing("P", ("kv", 0, 0, 4))
    list(work.inputs([_done("P", kid="kvA"), _bd("P", kid="kvB"), _done("P", kid="kvB")], after=1.0))
    work.landed("P", ("kv", 0, 0, 4), -1)
    gen = work.inputs((), after=2.0)
    assert next(gen) == ix.BlocksLanded("P", "kv", 0, 0, 4, True)
    assert next(gen) == _done("P", kid="kvA")
    assert next(gen) == _bd("P", kid="kvB")
    work.landing("P", ("kvB", 0, 0, 1))  # what applying that block_data started
    assert list(gen) == []  # kvB's transfer_done waits for it
    work.landed("P", ("kvB", 0, 0, 1), -1)
    assert list(work.inputs((), after=3.0)) == [ix.BlocksLanded("P", "kvB", 0, 0, 1, True), _done("P", kid="kvB")]


def test_deadlines_wait_for_the_oldest_thing_held() -> None:
    work = _work()
    assert work.floor() == float("inf")
    gen = work.inputs([_bd("P")], after=4.0)
    next(gen)
    work.landing("P", ("kv", 0, 0, 1))  # started while applying a block_data read after 4.0
    list(gen)
    list(work.inputs([_done("P")], after=9.0))
    assert work.floor() == 4.0
    work.landed("P", ("kv", 0, 0, 1), -1)
    list(work.inputs((), after=10.0))
    assert work.floor() == float("inf")


# -- the batch plan --------------------------------------------------------------------------------


def test_the_plan_tapers_to_the_tail() -> None:
    assert plan_batches(256, 8, 1) == [8] * 31 + [4, 2, 1, 1]
    assert plan_batches(8, 8, 1) == [4, 2, 1, 1]
    assert plan_batches(1, 8, 1) == [1]
    assert plan_batches(0, 8, 1) == []
    assert plan_batches(64, 64, 8) == [32, 16, 8, 8]
    with pytest.raises(ValueError):
        plan_batches(4, 0, 1)


@given(st.integers(0, 5000), st.integers(1, 600), st.integers(1, 600))
def test_the_plan_covers_every_block_within_the_bounds(n: int, per: int, tail: int) -> None:
    sizes = plan_batches(n, per, tail)
    assert sum(sizes) == n and all(1 <= s <= per for s in sizes)
    if n > min(tail, per):
        assert sizes[-1] == min(tail, per)


# -- a load's last landing, and what the pool's failures leave behind ------------------------------


def test_a_loads_last_landing_counts_the_blocks_still_landing_on_the_pool() -> None:
    """``last``: landed + landing now + this batch >= the load's blocks, exactly at the bound; only
    the same load (id and round) counts, and a landing that ended no longer counts."""
    work = _work()
    assert work.last(("kv", 0, 2, 2), landed=2, blocks=4)  # 2 landed + 2 now = 4: the last
    assert not work.last(("kv", 0, 2, 1), landed=2, blocks=4)  # 3 of 4
    work.landing("P", ("kv", 0, 0, 2))  # two blocks of round 0 land on the pool
    assert work.last(("kv", 0, 2, 2), landed=0, blocks=4)  # 0 + 2 landing + 2 now
    assert not work.last(("kv", 0, 2, 1), landed=0, blocks=4)
    work.landing("P", ("kv", 1, 0, 3))  # another round of the same id: not this load's blocks
    work.landing("Q", ("other", 0, 0, 3))  # another id
    assert not work.last(("kv", 0, 2, 1), landed=0, blocks=4)
    assert work.last(("kv", 1, 3, 1), landed=0, blocks=4)  # round 1: 3 landing + 1 now
    work.landing("P", ("kv", 0, 2, 1))
    assert work.last(("kv", 0, 3, 1), landed=0, blocks=4)  # 2 + 1 landing + 1 now
    work.landed("P", ("kv", 0, 0, 2), -1)  # ended: its blocks count as landed (the caller's), not landing
    assert not work.last(("kv", 0, 3, 1), landed=0, blocks=4)  # 1 landing + 1 now
    assert work.last(("kv", 0, 3, 1), landed=2, blocks=4)
    work.landed("P", ("kv", 0, 2, 1), -1)  # the round's last landing ended: nothing of it is landing
    assert work.last(("kv", 0, 3, 1), landed=3, blocks=4)
    assert not work.last(("kv", 0, 3, 1), landed=2, blocks=4)
    assert work.last(("kv", 1, 3, 1), landed=0, blocks=4)  # round 1 still has its 3 landing


def test_a_landing_reported_twice_or_never_started_is_logged_and_changes_nothing(caplog) -> None:
    work = _work()
    work.landing("P", ("kv", 0, 0, 2))
    work.landed("P", ("kv", 0, 0, 2), -1)
    with caplog.at_level("ERROR", logger="kvtier.manager"):
        work.landed("P", ("kv", 0, 0, 2), -1)  # a second report of the same landing
        work.landed("Q", ("kv", 0, 0, 2), -1)  # another peer's landing that was never started
    assert [r.getMessage() for r in caplog.records] == [
        "kvtier: a landing nobody waits for was reported (P ('kv', 0, 0, 2))",
        "kvtier: a landing nobody waits for was reported (Q ('kv', 0, 0, 2))"]
    assert not work.last(("kv", 0, 2, 1), landed=0, blocks=2)  # no landing counted twice, none below zero
    assert work.last(("kv", 0, 2, 2), landed=0, blocks=2)
    out = list(work.inputs((), 0.0))
    assert [(type(i).__name__, i.first, i.count, i.ok) for i in out] == [("BlocksLanded", 0, 2, True)]
    assert work.held() == 0


def test_a_store_whose_pool_digests_failed_is_hashed_here_and_still_applied(caplog) -> None:
    """The pool's digests cannot fail for pool buffers, but a store is never lost if they do: its
    digests are taken on the caller's thread, exactly those of its blocks, and the failure is logged."""
    from kvtier.integrity import block_digests

    pool = FakePool()
    work = _work(pool)
    bufs = _bufs()
    assert work.store(_store("kv", 7), bufs) is None
    pool.futures[0].set_exception(RuntimeError("pool closed"))
    with caplog.at_level("ERROR", logger="kvtier.manager"):
        (ready,) = list(work.inputs((), 0.0))
    assert ready.job_id == 7 and ready.digests == block_digests(bufs, "xxh3_64")
    assert [r.getMessage() for r in caplog.records] == [
        "kvtier: digests of store job 7 failed in the pool (pool closed); taking them here"]
    assert work.held() == 0


# -- the landing performer (kvtier.shell.outbound): what one block_data's landing reports ---------


class FakePlane:
    """A plane whose ``land`` answers what the test says: an index (first bad block, -1: all
    matched), ``None`` (the landing went to the digest pool) or a ``PlaneError``."""

    one_sided = False
    max_header_bytes = 1 << 16

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls: list[tuple] = []

    def land(self, peer, key, slots, payloads, digests):
        self.calls.append((peer, key, tuple(slots), tuple(payloads), tuple(digests)))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Calls:
    """Metrics that record every call by name."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args, **kw: self.calls.append((name, *args))


def _outbound(answer, landed: int = 0, blocks: int = 4, pool=None, logs=None):
    import time
    from types import SimpleNamespace

    from kvtier.shell.jobs import JobBook
    from kvtier.shell.logs import RateLimitedLog
    from kvtier.shell.outbound import Outbound
    from kvtier.testing.inproc import InprocNetwork, InprocTransport

    metrics = Calls()
    logs = logs or RateLimitedLog(time.monotonic, lambda p: "")
    work = ByteWork(algorithm="xxh3_64", digest_pool=None, block_bytes=BB, metrics=metrics, logs=logs)
    plane = FakePlane(answer)
    view = SimpleNamespace(landed=landed, keys=tuple(range(blocks)))
    out = Outbound(transport=InprocTransport(InprocNetwork(), "c:1"), plane=plane, pool=pool, jobs=JobBook(),
                   metrics=metrics, logs=logs, work=work, clock=time.monotonic,
                   loads=lambda kid: view if kid == "kv" else None)
    return out, work, plane, metrics


def _land(first: int = 2, count: int = 2, kid: str = "kv", peer: str = "P"):
    from kvtier.lifecycle import effects as fx

    return fx.LandBlocks(peer, kid, 3, first, tuple(range(10, 10 + count)), (7,) * count, (b"x",) * count)


def test_a_landing_the_plane_refuses_fails_its_batch_corrupt_and_is_counted(caplog) -> None:
    from kvtier.dataplane import PlaneError
    from kvtier.lifecycle import Reason

    out, work, plane, metrics = _outbound(PlaneError("block_data carries 1 payload frames for 2 blocks"))
    with caplog.at_level("WARNING", logger="kvtier.manager"):
        produced = out.perform([_land()])
    assert produced == [ix.BlocksLanded("P", "kv", 3, 2, 2, False, Reason.CORRUPT)]
    assert plane.calls == [("P", ("kv", 3, 2, 2), (10, 11), (b"x", b"x"), (7, 7))]
    assert metrics.calls == [("wire_error", "bad_payload")]
    assert [r.getMessage() for r in caplog.records] == [
        "kvtier: bad block_data from P: block_data carries 1 payload frames for 2 blocks"]
    assert work.held() == 0 and not work.settle


@pytest.mark.parametrize(("answer", "reports"), [
    (-1, [(2, 2, True)]), (0, [(2, 2, False)]), (1, [(2, 1, True), (3, 1, False)])])
def test_a_landing_done_here_reports_at_once(answer: int, reports: list) -> None:
    from kvtier.lifecycle import Reason

    out, work, _, _ = _outbound(answer)
    assert out.perform([_land()]) == [ix.BlocksLanded("P", "kv", 3, first, count, ok, None if ok else Reason.CORRUPT)
                                      for first, count, ok in reports]
    assert work.held() == 0 and not work.settle  # nothing of the load runs on the pool


@pytest.mark.parametrize(("landed", "first", "last"), [(2, 2, True), (1, 1, False)])
def test_a_landing_on_the_pool_holds_its_peer_and_settles_the_tick_only_as_the_loads_last(
        landed: int, first: int, last: bool) -> None:
    out, work, _, _ = _outbound(None, landed=landed)
    assert out.perform([_land(first=first)]) == []  # its blocks_landed comes from the pool later
    assert work.held() == 1 and work.settle is last
    # what the peer sends next waits behind it
    assert list(work.inputs([_done("P")], 0.0)) == []
    work.landed("P", ("kv", 3, first, 2), -1)
    assert [type(i).__name__ for i in work.inputs((), 0.0)] == ["BlocksLanded", "Received"]


def test_a_bad_landing_here_settles_the_tick_only_while_others_run_on_the_pool() -> None:
    out, work, plane, _ = _outbound(None, landed=0)
    out.perform([_land(first=0)])  # blocks 0-1 on the pool, not the last
    assert not work.settle
    plane.answer = 0  # blocks 2-3, the load's last, land here and the first does not match
    (bad,) = out.perform([_land(first=2)])
    assert bad.ok is False and work.settle  # the pool's landing must end before the tick does
    out2, work2, _, _ = _outbound(0, landed=2)
    out2.perform([_land(first=2)])  # the last batch, bad, nothing on the pool: nothing to wait for
    assert not work2.settle


def test_a_landing_of_a_load_the_core_no_longer_tracks_never_settles_the_tick() -> None:
    out, work, _, _ = _outbound(None)
    assert out.perform([_land(kid="gone")]) == []
    assert work.held() == 1 and not work.settle


def test_a_large_store_asks_the_pool_for_its_blocks_digests_and_none_asks_nothing() -> None:
    pool = FakePool()
    bufs = _bufs()
    assert _work(pool).store(_store("kv", 1), bufs) is None
    assert pool.asked == [(bufs, "xxh3_64")]
    off = _work(pool, algorithm="none")  # integrity off: no digests, applied at once, the pool not asked
    ready = off.store(_store("kv", 2), bufs)
    assert ready is not None and ready.job_id == 2 and ready.digests == () and len(pool.asked) == 1
    assert off.held() == 0


def test_held_counts_stores_and_landings_together() -> None:
    work = _work(FakePool())
    work.store(_store("kv", 1), _bufs())
    work.holds(ix.RequestFinished("kv", producer=True))
    work.landing("P", ("x", 0, 0, 1))
    assert work.held() == 3


def test_a_landings_result_names_its_blocks_and_counts_or_logs_them() -> None:
    from kvtier.lifecycle import Reason

    counters, logs = Counters(), Logs()
    work = ByteWork(algorithm="xxh3_64", digest_pool=None, block_bytes=BB, metrics=counters, logs=logs)
    assert work.results("P", ("kv", 3, 4, 2), -1) == [ix.BlocksLanded("P", "kv", 3, 4, 2, True)]
    assert counters.bytes == 2 * BB
    assert work.results("P", ("kv", 3, 4, 2), 0) == [ix.BlocksLanded("P", "kv", 3, 4, 2, False, Reason.CORRUPT)]
    assert counters.bytes == 2 * BB  # a bad block's bytes, and those after it, are not counted as landed
    # the blocks before the mismatch were checked: landed (a failed load names them), the rest failed
    assert work.results("P", ("kv", 3, 4, 3), 2) == [ix.BlocksLanded("P", "kv", 3, 4, 2, True),
                                                     ix.BlocksLanded("P", "kv", 3, 6, 1, False, Reason.CORRUPT)]
    assert counters.bytes == 4 * BB
    assert logs.lines == [f"kvtier: block {b} of kv round 3 from P {MISMATCH}" for b in (4, 6)]


def test_a_one_sided_loads_keys_are_rechecked_and_a_mismatch_is_logged_once(caplog) -> None:
    from kvtier.integrity import block_digests
    from kvtier.lifecycle import Reason
    from kvtier.lifecycle import effects as fx
    from kvtier.memory import BlockPool

    pool = BlockPool(8, 64, pin=False)
    pool.write(3, bytes(range(64)))
    (d3,) = block_digests([pool.buffer(3)], "xxh3_64")
    out, _, _, _ = _outbound(-1, pool=pool)
    out.jobs.open(5, store=False, kv_request_id="K", now=0.0, nbytes=128)
    out.jobs.open(6, store=False, kv_request_id="L", now=0.0, nbytes=64)
    with caplog.at_level("WARNING", logger="kvtier.manager"):
        out.perform([fx.JobDone(6, False, Reason.PEER_LOST, (b"k3",), ((3, d3),))])  # still matches: no line
        out.perform([fx.JobDone(5, False, Reason.PEER_LOST, (b"k3", b"k4", b"k5"), ((3, d3), (4, d3), (5, d3)))])
    got = {r.job_id: r.successful_keys for r in out.jobs.take()}
    assert got == {6: (b"k3",), 5: (b"k3",)}
    assert [r.getMessage() for r in caplog.records] == [
        "kvtier: job 5: 2 landed blocks no longer match their digests; not reported"]


def test_a_held_input_keeps_its_own_arrival_stamp_and_an_unstamped_one_holds_every_deadline() -> None:
    import msgspec

    work = _work()
    work.landing("P", ("kv", 0, 0, 1))
    stamped = msgspec.structs.replace(_done("P"), after=5.0)
    assert list(work.inputs([stamped], after=9.0)) == []  # held behind the landing
    assert work.floor() == 5.0  # its own stamp, not the pass's
    other = _work()
    other.landing("P", ("kv", 0, 0, 1))
    assert list(other.inputs([_done("P")])) == []  # no stamp, and none given for the pass
    assert other.floor() == float("-inf")  # when it arrived is unknown: no deadline may fire


def test_a_landing_started_after_a_pass_has_no_arrival_bound() -> None:
    work = _work()
    assert [type(i).__name__ for i in work.inputs([_bd("P")], after=4.0)] == ["Received"]
    work.landing("P", ("kv", 0, 0, 1))  # after the pass: not behind anything read in it
    assert work.floor() == float("inf")


def test_ready_only_when_a_held_head_can_go() -> None:
    work = _work()
    assert not work.ready()
    work.landing("P", ("kv", 0, 0, 1))
    list(work.inputs([_done("P")], after=1.0))  # held behind the landing
    assert not work.ready()  # the landing still runs
    work.landed("P", ("kv", 0, 0, 1), -1)
    assert work.ready()
    work.landing("Q", ("kv2", 0, 0, 1))
    assert work.ready()  # P's queue can go, Q's cannot


def test_corrupt_landings_are_logged_once_per_peer_per_interval() -> None:
    """The log line of a corrupt batch is rate-limited per peer, so one bad peer cannot hide
    another's."""
    import logging

    from kvtier.shell.logs import RateLimitedLog

    logs = RateLimitedLog(lambda: 0.0, lambda p: p)  # the clock stands still: one interval
    work = ByteWork(algorithm="xxh3_64", digest_pool=None, block_bytes=BB, metrics=Counters(), logs=logs)
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Grab()
    logger = logging.getLogger("kvtier.manager")
    logger.addHandler(handler)
    try:
        for peer in ("P", "P", "Q"):
            work.results(peer, ("kv", 0, 0, 1), 0)
    finally:
        logger.removeHandler(handler)
    assert [r for r in records if "does not match" in r] == [
        f"kvtier: block 0 of kv round 0 from {p} {MISMATCH}" for p in ("P", "Q")]


def test_a_peers_bad_payloads_make_one_line_per_interval_whichever_check_finds_them(caplog) -> None:
    """Lines are rate-limited per (peer, reason): a block_data the plane refuses is ``bad_payload``
    (the wire error it is counted as), as is one whose payload frame the decoder refuses, so a peer
    whose payloads fail both checks makes one line per interval; another peer's refusal in the
    same interval is a line of its own."""
    from kvtier.dataplane import Notified, PlaneError
    from kvtier.shell.inbound import Inbound
    from kvtier.shell.logs import RateLimitedLog
    from kvtier.wire import Decoder, encode

    logs = RateLimitedLog(lambda: 0.0, lambda p: "")  # the clock stands still: one interval
    out, work, plane, metrics = _outbound(PlaneError("block_data carries 1 payload frames for 2 blocks"), logs=logs)
    inbound = Inbound(transport=out.transport, plane=plane, decoder=Decoder(block_bytes=BB), metrics=metrics,
                      logs=logs, clock=lambda: 0.0, posted={}, work=work)
    short = (encode(wm.BlockData(gen=1, kv_request_id="kv", round=3, first=0, count=1)), b"short")
    with caplog.at_level("WARNING", logger="kvtier.manager"):
        (refused,) = inbound.reports([Notified("P", short)])
        assert type(refused) is ix.Malformed and refused.reason == "bad_payload"
        out.perform([_land()])  # P again, refused by the plane this time
        out.perform([_land(peer="Q")])
    assert metrics.calls == [("wire_error", "bad_payload")] * 3
    assert [r.getMessage() for r in caplog.records] == [
        f"kvtier: bad message from P about kv: bad_payload: payload 0 is 5 bytes, block_bytes is {BB}",
        "kvtier: bad block_data from Q: block_data carries 1 payload frames for 2 blocks"]


def test_a_loads_landings_leave_nothing_behind_once_they_ended() -> None:
    """A load's blocks landing on the pool are counted while they land (what ``last`` adds) and
    forgotten once its landings ended, so a consumer that serves for months keeps nothing per
    load: 10,000 loads leave this module's traced memory where the first left it (tracemalloc:
    sizes of objects, not timings; the bound leaves room for the interpreter's free lists, which
    keep a few freed objects traced where they were made; one entry kept per load is ~90 B)."""
    import tracemalloc

    from kvtier.shell import perbyte

    work = _work()

    def load(i: int) -> None:
        key = (f"kv{i}", 1, 0, 2)
        work.landing("P", key)
        assert work.last((f"kv{i}", 1, 2, 2), 0, 4)  # its other half lands now: the load's last
        work.landed("P", key, -1)
        assert not work.last((f"kv{i}", 1, 2, 1), 0, 4)  # ended: no longer counted
        assert [type(i).__name__ for i in work.inputs((), 0.0)] == ["BlocksLanded"]

    mine = [tracemalloc.Filter(True, perbyte.__file__)]
    tracemalloc.start()
    try:
        load(0)
        before = tracemalloc.take_snapshot().filter_traces(mine)
        for i in range(1, 10_001):
            load(i)
        after = tracemalloc.take_snapshot().filter_traces(mine)
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown < 256 << 10, grown
