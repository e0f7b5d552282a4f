"""The shell's side of the symmetric path and of partial loads: serve windows
(:class:`~kvtier.shell.serving.ServeWindows`), the one-sided re-check of ``successful_keys``
(:class:`~kvtier.shell.outbound.Outbound`), and a PD load that partly lands from a raw producer on
real ZeroMQ sockets (the manager reports the landed keys as ``successful_keys``).

Properties: ``lookup_context_closed_once``, ``pin_released_once``, ``partial_keys_verified``.
"""

from __future__ import annotations

import secrets
import time

import pytest
import zmq

from kvtier.api import LookupResult, RequestContext, TransferJob
from kvtier.blocksource import BlockIndex, Pin, Presence
from kvtier.integrity import block_digests
from kvtier.lifecycle import Reason
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.views import ProbeAnswers
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.shell.jobs import JobBook
from kvtier.shell.logs import RateLimitedLog
from kvtier.shell.outbound import Outbound
from kvtier.shell.published import Published
from kvtier.shell.serving import ServeWindows
from kvtier.wire import messages as wm
from kvtier.wire.codec import Decoder, WireLimits, encode_frames

pytestmark = pytest.mark.timeout(60)


class Room:
    """A serve room (``TierCore.serve_room``) for the window alone: ``reach`` found keys at most,
    ``fit`` of a pin's blocks (all by default)."""

    def __init__(self, reach: int, fit: int | None = None) -> None:
        self.reach, self._fit = reach, fit

    def fits(self, blocks) -> int:
        return len(blocks) if self._fit is None else min(self._fit, len(blocks))


ROOM = Room(1 << 30)


class Source:
    """A BlockSource that records every call."""

    def __init__(self, found=(), pending=()) -> None:
        self.found, self.pending = dict(found), set(pending)
        self.calls: list[tuple] = []
        self.next_pin = 0

    def open(self, ctx_id):
        self.calls.append(("open", ctx_id))
        return ctx_id

    def lookup(self, key, ctx):
        self.calls.append(("lookup", key))
        return Presence.FOUND if key in self.found else Presence.PENDING if key in self.pending else Presence.MISSING

    def pin(self, keys, ctx):
        self.next_pin += 1
        self.calls.append(("pin", tuple(keys)))
        return Pin(self.next_pin, tuple(self.found[k] for k in keys))

    def release(self, pin_id, ok, reason):
        self.calls.append(("release", pin_id, ok, reason))

    def close(self, ctx):
        self.calls.append(("close", ctx))


def test_a_window_closes_first_then_looks_up_what_was_queued_before_it() -> None:
    """lookup_context_closed_once: a round's context is opened once (at its first lookup), reused by
    its re-polls and closed once; lookups queued during a window wait for the next one."""
    errors: list[int] = []
    w = ServeWindows(on_error=lambda: errors.append(1))
    src = Source(found={b"a": 3}, pending={b"b"})
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a", b"b")))
    applied: list[ix.LookupAnswered] = []

    def apply(inp):
        applied.append(inp)
        w.queue_lookup(fx.LookUpBlocks("p", "K", 0, inp.pending))  # the core's re-poll of pending keys

    assert w.run(src, lambda *k: ROOM, apply) == 1
    (a,) = applied
    assert a.found == (b"a",) and a.blocks == (3,) and a.pin == 1 and a.pending == (b"b",)
    assert [c[0] for c in src.calls] == ["open", "lookup", "lookup", "pin"]
    src.pending.clear()

    def settle(inp):  # the round settles: the core asks for its context to be closed
        applied.append(inp)
        w.queue_close(fx.CloseLookup("p", "K", 0))

    w.run(src, lambda *k: ROOM, settle)  # the re-poll, then the close it made, in the same window
    assert [c[0] for c in src.calls][4:] == ["lookup", "close"]  # no second open: the context is reused
    assert applied[-1].missing == (b"b",) and applied[-1].pin is None
    w.queue_close(fx.CloseLookup("p", "K", 0))  # a second close of the round: nothing
    w.run(src, lambda *k: ROOM, lambda inp: None)
    assert sum(1 for c in src.calls if c[0] == "close") == 1 and not errors
    # a close queued before a window runs before its lookups: a round that settled and was probed
    # again gets a fresh context
    w.queue_close(fx.CloseLookup("p", "K", 1))
    w.queue_lookup(fx.LookUpBlocks("p", "K", 1, (b"a",)))
    w.run(src, lambda *k: ROOM, lambda inp: None)
    assert [c[0] for c in src.calls][-3:] == ["open", "lookup", "pin"]


def test_a_lookup_the_core_no_longer_wants_is_skipped() -> None:
    w = ServeWindows(on_error=lambda: None)
    src = Source(found={b"a": 1})
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a",)))
    assert w.run(src, lambda *k: None, lambda inp: pytest.fail("applied")) == 0
    assert src.calls == []


def test_a_lookup_pins_at_most_the_room_the_core_gives_and_misses_the_rest() -> None:
    """Y23: the window asks the core for the round's room when it performs the lookup; found keys
    beyond it are answered missing without asking the engine, and with no room nothing is pinned."""
    w = ServeWindows(on_error=lambda: None)
    src = Source(found={b"a": 1, b"b": 2, b"c": 3}, pending={b"p"})
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"x", b"a", b"p", b"b", b"c")))
    got: list[ix.LookupAnswered] = []
    w.run(src, lambda *k: Room(2), got.append)
    (a,) = got
    assert (a.found, a.blocks, a.pending, a.missing) == ((b"a", b"b"), (1, 2), (b"p",), (b"x", b"c"))
    assert [c[1] for c in src.calls if c[0] == "lookup"] == [b"x", b"a", b"p", b"b"]  # never c
    w.queue_lookup(fx.LookUpBlocks("p", "K", 1, (b"a", b"b")))
    w.run(src, lambda *k: Room(0), got.append)
    assert (got[-1].found, got[-1].pin, got[-1].missing) == ((), None, (b"a", b"b"))
    assert w.pins() == {a.pin}


def test_a_window_asks_the_engine_about_a_bounded_number_of_keys_and_the_rest_wait_their_turn() -> None:
    """Y25: one window asks the engine about at most its key budget; the keys of a lookup past it
    are answered pending (the core asks them again) and lookups it did not reach keep their place,
    ahead of the re-polls queued during the window — so one peer's long probe holds neither the
    loop nor an engine's thread for long, and another peer's lookup is not pushed behind it."""
    w = ServeWindows(on_error=lambda: None)
    many = tuple(bytes([i]) * 4 for i in range(10))
    src = Source(found={k: i for i, k in enumerate(many)} | {b"o": 50})
    w.queue_lookup(fx.LookUpBlocks("flood", "F", 0, many))
    w.queue_lookup(fx.LookUpBlocks("other", "O", 0, (b"o",)))
    got: list[ix.LookupAnswered] = []

    def apply(inp):  # the core's re-poll of pending keys is queued during the window
        got.append(inp)
        if inp.pending:
            w.queue_lookup(fx.LookUpBlocks(inp.peer, inp.kv_request_id, inp.round, inp.pending))

    per_window = []
    while w.wanted():
        before = len([c for c in src.calls if c[0] == "lookup"])
        w.run(src, lambda *k: ROOM, apply, budget=4)
        per_window.append(len([c for c in src.calls if c[0] == "lookup"]) - before)
    assert per_window == [4, 4, 3]  # 10 + 1 keys, never more than 4 a window
    # the peer with fewer keys waiting goes first (Y27)
    assert [(a.peer, len(a.found), len(a.pending)) for a in got] == [
        ("other", 1, 0), ("flood", 3, 7), ("flood", 4, 3), ("flood", 3, 0)]
    assert [k for a in got if a.peer == "flood" for k in a.found] == list(many)  # each key asked once


def test_a_window_serves_the_peers_with_fewest_keys_asked_and_waiting_first() -> None:
    """Y27: a peer with many rounds queued does not hold another peer behind all of them: each
    window takes first the rounds of the peers with the fewest keys asked lately plus waiting, a
    peer's rounds in queue order — B's 1 key and C's 4 go before A's three rounds of 4 queued
    ahead of them, and A's rounds then follow one a window."""
    w = ServeWindows(on_error=lambda: None)
    keys = {p: tuple(b"%s%d" % (p.encode(), i) for i in range(4)) for p in ("a0", "a1", "a2", "c0")}
    src = Source(found={k: i for i, k in enumerate(k for ks in keys.values() for k in ks)} | {b"b": 99})
    for r in range(3):  # peer A: three rounds of a full budget each, queued first
        w.queue_lookup(fx.LookUpBlocks("A", "KA", r, keys[f"a{r}"]))
    w.queue_lookup(fx.LookUpBlocks("B", "KB", 0, (b"b",)))
    w.queue_lookup(fx.LookUpBlocks("C", "KC", 0, keys["c0"]))
    got: list[ix.LookupAnswered] = []
    windows = []
    while w.wanted():
        before = len(got)
        w.run(src, lambda *k: ROOM, got.append, budget=4)
        windows.append([(a.peer, a.round, len(a.found)) for a in got[before:]])
    assert windows == [[("B", 0, 1), ("C", 0, 3)], [("A", 0, 4)], [("A", 1, 4)], [("A", 2, 4)]], windows


def test_a_small_prober_is_not_behind_peers_that_each_keep_one_full_round_waiting() -> None:
    """Y27: turns follow the keys a window asked for each peer lately (halved every window), not
    whether a peer has rounds left: three peers that each queue one full-budget round again right
    after every window, ahead of an honest peer's 1-key probe, do not hold it for a window each —
    it is answered in the window after it came, every time."""
    w = ServeWindows(on_error=lambda: None)
    fresh = iter(range(10**6))

    def full() -> tuple[bytes, ...]:
        return tuple(b"f%d" % next(fresh) for _ in range(4))

    src = Source()
    src.lookup = lambda key, ctx: Presence.MISSING  # type: ignore[method-assign]
    rounds = iter(range(10**6))
    for f in ("F1", "F2", "F3"):
        w.queue_lookup(fx.LookUpBlocks(f, "K" + f, next(rounds), full()))
    got: list[ix.LookupAnswered] = []
    w.run(src, lambda *k: ROOM, got.append, budget=4)
    answered = {a.peer for a in got}
    for window in range(6):
        for f in sorted(answered - {"H"}):  # an answered flooder queues its next full round at once
            w.queue_lookup(fx.LookUpBlocks(f, "K" + f, next(rounds), full()))
        w.queue_lookup(fx.LookUpBlocks("H", "KH", next(rounds), (b"h",)))
        before = len(got)
        w.run(src, lambda *k: ROOM, got.append, budget=4)
        answered = {a.peer for a in got[before:]}
        assert "H" in answered, (window, [(a.peer, a.round) for a in got[before:]])


def test_a_peer_served_beside_a_busy_one_is_not_behind_it_when_it_comes_back() -> None:
    """Y27: a peer served beside a busy one comes back first: the keys asked for it lately and still
    waiting are fewer — not behind the busy one, which an order by last window would tie with it."""
    w = ServeWindows(on_error=lambda: None)
    ka = [tuple(b"a%d-%d" % (r, i) for i in range(4)) for r in range(4)]
    src = Source(found={k: i for i, k in enumerate([k for ks in ka for k in ks] + [b"b1", b"b2"])})
    w.queue_lookup(fx.LookUpBlocks("B", "KB", 0, (b"b1",)))
    for r in range(4):
        w.queue_lookup(fx.LookUpBlocks("A", "KA", r, ka[r]))
    got: list[ix.LookupAnswered] = []
    w.run(src, lambda *k: ROOM, got.append, budget=4)
    assert [(a.peer, a.round) for a in got] == [("B", 0), ("A", 0)]
    w.queue_lookup(fx.LookUpBlocks("B", "KB", 1, (b"b2",)))  # B comes back; A still has rounds waiting
    w.run(src, lambda *k: ROOM, got.append, budget=4)
    assert [(a.peer, a.round) for a in got[2:]] == [("B", 1), ("A", 1)], got[2:]


def test_a_rounds_lookups_are_one_and_its_close_drops_what_it_still_had_queued() -> None:
    """Y25: a round's lookups queued between windows are asked as one (one answer); a close of the
    round drops its queued lookups, so a round that ended and started again under the same key is
    never asked about its earlier keys, and a peer cannot pile up lookups no round waits for."""
    w = ServeWindows(on_error=lambda: None)
    src = Source(found={b"a": 1, b"b": 2, b"c": 3})
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a",)))
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"b",)))  # the round's second probe
    got: list[ix.LookupAnswered] = []
    w.run(src, lambda *k: ROOM, got.append)
    assert [(a.found, a.blocks) for a in got] == [((b"a", b"b"), (1, 2))]
    w.queue_lookup(fx.LookUpBlocks("p", "K", 1, (b"a", b"b")))
    w.queue_close(fx.CloseLookup("p", "K", 1))  # the round ended before any window
    w.queue_lookup(fx.LookUpBlocks("p", "K", 1, (b"c",)))  # and started again
    before = len(src.calls)
    w.run(src, lambda *k: ROOM, got.append)
    assert [c[1] for c in src.calls[before:] if c[0] == "lookup"] == [b"c"]
    assert got[-1].found == (b"c",) and not w.wanted()


def test_a_pin_past_the_room_is_given_back_and_only_the_keys_that_fit_are_pinned_again() -> None:
    """Y23: blocks a pin holds are known only once it is taken; when some are new past the room
    (a block pinned already costs nothing), the pin is released (ok) and the keys before the
    first that does not fit are pinned again, the rest answered missing."""
    w = ServeWindows(on_error=lambda: None)
    src = Source(found={b"a": 1, b"b": 2, b"c": 3})
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a", b"b", b"c")))
    got: list[ix.LookupAnswered] = []
    w.run(src, lambda *k: Room(10, fit=1), got.append)
    (a,) = got
    assert (a.found, a.blocks, a.missing) == ((b"a",), (1,), (b"b", b"c"))
    pins = [c for c in src.calls if c[0] in ("pin", "release")]
    assert pins == [("pin", (b"a", b"b", b"c")), ("release", 1, True, None), ("pin", (b"a",))], pins
    assert w.pins() == {a.pin} and a.pin != 1


def test_every_pin_is_released_once_through_its_source_and_a_second_release_is_dropped() -> None:
    """pin_released_once: the ledger passes each release to the source that made the pin; a second
    one (a kvtier bug) is counted and never reaches the engine."""
    errors: list[int] = []
    w = ServeWindows(on_error=lambda: errors.append(1))
    src = Source(found={b"a": 1})
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a",)))
    w.run(src, lambda *k: ROOM, lambda inp: None)
    assert w.pins() == {1}
    w.release(fx.ReleasePins((1,), False, Reason.OFFER_EXPIRED))
    w.release(fx.ReleasePins((1,), True))
    assert [c for c in src.calls if c[0] == "release"] == [("release", 1, False, "offer_expired")]
    assert errors == [1] and not w.pins()


def test_a_source_that_raises_answers_miss_and_never_crashes_the_manager() -> None:
    errors: list[int] = []
    w = ServeWindows(on_error=lambda: errors.append(1))

    class Broken(Source):
        def lookup(self, key, ctx):
            raise RuntimeError("engine blew up")

    got: list[ix.LookupAnswered] = []
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a", b"b")))
    w.run(Broken(), lambda *k: ROOM, got.append)
    assert got[0].missing == (b"a", b"b") and got[0].pin is None and errors == [1]


@pytest.mark.parametrize("blocks, says", [
    ((1, 64), "block 64 is outside the pool (0..63)"), ((-1, 2), "block -1 is outside the pool"),
    ((1.0, 2), "block 1.0 (float) is not an integer"), ((True, 2), "block True (bool) is not an integer"),
    ((1,), ": 1 blocks"), (None, "not a Pin"), ((3, 3), "block 3 is pinned for two keys"),
])
def test_a_pin_whose_blocks_cannot_be_served_is_released_and_its_keys_miss(blocks, says, caplog) -> None:
    """A pin of blocks outside the pool, or not integers, was served as HIT: the transfer raised
    in the serving tier's I/O loop, the peer's fetch was never answered (its load failed at
    ``load_timeout_s`` and its whole session ended), and the pin was never released, so the
    engine's ``drain_jobs`` never ended (an outside tester).  Now it is refused where it is made:
    released at once, every key MISS, the fault named in the log."""
    errors: list[int] = []
    w = ServeWindows(on_error=lambda: errors.append(1), num_blocks=64)

    class Bad(Source):
        def pin(self, keys, ctx):
            self.next_pin += 1
            return Pin(self.next_pin, blocks)

    src, got = Bad(found={b"a": 1, b"b": 2}), []
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a", b"b")))
    w.run(src, lambda *k: ROOM, got.append)
    assert got[0].missing == (b"a", b"b") and got[0].pin is None and not got[0].blocks
    assert [c for c in src.calls if c[0] == "release"] == [("release", 1, False, "job_refused")]
    assert errors == [1] and not w.pins()
    assert says in caplog.text, caplog.text


@pytest.mark.parametrize("pin_id, says", [(None, "pin id None"), ([7], "pin id [7] is not hashable")])
def test_a_pin_without_a_usable_id_is_refused_and_released_by_the_engines_own_id(pin_id, says, caplog) -> None:
    """A pin whose id is None read as no pin at all: served, never released (the engine's
    ``drain_jobs`` never ended); an unhashable id was refused as "not a Pin" and its release raised
    (an outside tester).  Both are refused now, their keys MISS, and each is released at once with
    the id the engine gave."""
    errors: list[int] = []
    w = ServeWindows(on_error=lambda: errors.append(1), num_blocks=64)

    class Odd(Source):
        def pin(self, keys, ctx):
            return Pin(pin_id, tuple(self.found[k] for k in keys))

    src, got = Odd(found={b"a": 1}), []
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a",)))
    w.run(src, lambda *k: ROOM, got.append)
    assert got[0].missing == (b"a",) and got[0].pin is None and errors == [1] and not w.pins()
    assert says in caplog.text and "not a Pin" not in caplog.text, caplog.text
    assert [c for c in src.calls if c[0] == "release"] == [("release", pin_id, False, "job_refused")]


def test_a_pin_id_another_source_holds_is_refused_and_released_through_its_own_source() -> None:
    """An engine switched to a fresh BlockIndex while the old one still held pin 1: the new index's
    pin 1 was refused as outstanding but never released, its blocks pinned for ever (an outside
    tester).  It is refused (ids must be unique across the manager's pins) and released through the
    source that made it; the old source's pin 1 stays with it."""
    w = ServeWindows(on_error=lambda: None, num_blocks=64)
    old, new = Source(found={b"a": 1}), Source(found={b"b": 2})
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a",)))
    w.run(old, lambda *k: ROOM, lambda inp: None)
    got: list[ix.LookupAnswered] = []
    w.queue_lookup(fx.LookUpBlocks("p", "L", 0, (b"b",)))
    w.run(new, lambda *k: ROOM, got.append)  # its pin is 1 too
    assert got[0].missing == (b"b",) and got[0].pin is None
    assert [c for c in new.calls if c[0] == "release"] == [("release", 1, False, "job_refused")]
    assert [c for c in old.calls if c[0] == "release"] == [] and w.pins() == {1}


def test_an_engines_numpy_block_numbers_are_served_as_ints() -> None:
    """An engine that keeps its block table in numpy pins ``np.int64`` blocks: they are taken as the
    ints they are (they raised in the I/O loop at the transfer's start)."""
    import numpy as np
    w = ServeWindows(on_error=lambda: None, num_blocks=64)

    class Numpy(Source):
        def pin(self, keys, ctx):
            self.next_pin += 1
            return Pin(self.next_pin, tuple(np.int64(self.found[k]) for k in keys))

    got: list[ix.LookupAnswered] = []
    w.queue_lookup(fx.LookUpBlocks("p", "K", 0, (b"a", b"b")))
    w.run(Numpy(found={b"a": 5, b"b": 63}), lambda *k: ROOM, got.append)
    assert got[0].blocks == (5, 63) and all(type(b) is int for b in got[0].blocks) and got[0].pin == 1


def test_block_index_pins_keep_blocks_from_reuse_until_released() -> None:
    idx = BlockIndex(8)
    idx.publish(b"k", 5)
    p = idx.pin([b"k"], None)
    idx.retract(b"k")
    assert idx.pinned(5) and idx.lookup(b"k", None) is Presence.MISSING
    idx.release(p.pin_id, True, None)
    assert not idx.pinned(5)
    with pytest.raises(KeyError):
        idx.release(p.pin_id, True, None)
    with pytest.raises(ValueError, match="outside the pool"):
        idx.publish(b"k", 8)


def _outbound(pool: BlockPool, integrity: str) -> tuple[Outbound, JobBook]:
    from kvtier.dataplane import make_plane
    from kvtier.metrics import TierMetrics
    from kvtier.shell.perbyte import ByteWork
    from kvtier.testing.inproc import InprocNetwork, InprocTransport

    t = InprocTransport(InprocNetwork(), "x:1")
    jobs = JobBook()
    metrics = TierMetrics(tier="t", listener="x:1", core=None, lock=None, clock=time.monotonic,
                          block_bytes=pool.block_bytes)
    logs = RateLimitedLog(time.monotonic, lambda p: "")
    work = ByteWork(algorithm=integrity, digest_pool=None, block_bytes=pool.block_bytes, metrics=metrics, logs=logs)
    out = Outbound(transport=t, plane=make_plane("zmq", transport=t, pool=pool), pool=pool, jobs=jobs,
                   metrics=metrics, logs=logs, work=work, clock=time.monotonic)
    return out, jobs


@pytest.mark.parametrize("integrity", ["xxh3_64", "none"])
def test_one_sided_successful_keys_are_rechecked_at_reporting(integrity: str) -> None:
    """partial_keys_verified: a key whose slot no longer matches its digest when the result is
    reported is dropped; with integrity off no key is reported at all."""
    pool = BlockPool(8, 64, pin=False)
    pool.write(3, bytes(range(64)))
    pool.write(4, bytes(64))
    (d3,) = block_digests([pool.buffer(3)], "xxh3_64")
    out, jobs = _outbound(pool, integrity)
    jobs.open(5, store=False, kv_request_id="K", now=0.0, nbytes=128)
    out.perform([fx.JobDone(5, False, Reason.PEER_LOST, (b"k3", b"k4"), ((3, d3), (4, d3)))])
    (r,) = jobs.take()
    assert r.success is False and r.reason == "peer_lost"
    assert r.successful_keys == ((b"k3",) if integrity == "xxh3_64" else None)


class RawProducer:
    """A ROUTER that speaks just enough of the wire protocol to be a producer that sends the first
    block of a fetch and then fails it."""

    def __init__(self, block_bytes: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.decoder = Decoder(limits=WireLimits(), block_bytes=block_bytes)

    def recv(self, kind, timeout_s: float = 5.0):
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.sock.poll(50):
                ident, *frames = self.sock.recv_multipart()
                msg, _ = self.decoder.decode(frames)
                if isinstance(msg, kind):
                    return ident, msg
        raise AssertionError(f"no {kind.__name__}")

    def send(self, ident: bytes, msg, payloads=()) -> None:
        self.sock.send_multipart([ident, *encode_frames(msg, payloads)])

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def test_a_pd_load_that_partly_lands_reports_the_landed_keys() -> None:
    """A producer sends block 0 of a 2-block fetch (with its digest) and then transfer_done(fail):
    the consumer manager's job fails with successful_keys = (key 0,), so vLLM keeps that block."""
    bb = 64
    raw = RawProducer(bb)
    cons = KvTierManager({"host": "127.0.0.1", "port": 0, "hash_seed": ""}, BlockPool(8, bb, pin=False), layout="raw")
    try:
        req = RequestContext(req_id="r", kv_transfer_params={"remote_prefiller": {
            "kv_request_id": "pd-part", "remote_host": "127.0.0.1", "remote_port": raw.port}})
        cons.on_new_request(req)
        cons.submit_load(TransferJob(job_id=3, keys=(b"k0", b"k1"), slots=(2, 5), req=req))

        def pump_until(kind):
            end = time.monotonic() + 5
            while time.monotonic() < end:
                cons.poll(0.001)
                if raw.sock.poll(0):
                    return raw.recv(kind)
            raise AssertionError(f"no {kind.__name__}")

        ident, hello = pump_until(wm.Hello)
        raw.send(ident, wm.HelloAck(gen=hello.gen, instance="raw-producer"))
        ident, fetch = pump_until(wm.Fetch)
        assert fetch.keys == [b"k0", b"k1"] and not fetch.offered
        block = bytes([7]) * bb
        (d,) = block_digests([block], "xxh3_64")
        raw.send(ident, wm.BlockData(gen=hello.gen, kv_request_id="pd-part", round=fetch.round, first=0, count=1,
                                     digests=[d]), [block])
        raw.send(ident, wm.TransferDone(gen=hello.gen, kv_request_id="pd-part", round=fetch.round, ok=False,
                                        reason="transfer_failed"))
        results = []
        end = time.monotonic() + 5
        while not results and time.monotonic() < end:
            cons.poll(0.001)
            results = cons.get_finished_jobs(poll=False)
        (r,) = results
        assert r.success is False and r.reason == "transfer_failed" and r.successful_keys == (b"k0",)
        assert cons.pool.buffer(2).tobytes() == block
    finally:
        cons.shutdown(grace_s=0.2)
        raw.close()


def test_a_lookup_hands_the_loop_only_keys_the_core_does_not_hold_yet() -> None:
    """Y26: an engine scans every key of a prompt each step while any answers RETRY; a key the
    last pass published as HIT, RETRY (its probe is out) or MISS is answered without being handed
    to the loop again, so a long prompt's step costs the loop its new keys only."""
    pub = Published()
    pub.probes["sym"] = ProbeAnswers(False, hit=frozenset({b"h"}), retry=frozenset({b"r"}), miss=frozenset({b"m"}))
    step: dict[str, dict[bytes, None]] = {}
    got = [pub.probe_answer("sym", k, step) for k in (b"h", b"r", b"m", b"new")]
    assert got == [LookupResult.HIT, LookupResult.RETRY, LookupResult.MISS, LookupResult.RETRY]
    assert step == {"sym": {b"new": None}}
    pub.probes["sym"] = ProbeAnswers()  # dead: every key MISS, nothing handed over
    assert pub.probe_answer("sym", b"other", step) is LookupResult.MISS and step == {"sym": {b"new": None}}
    assert pub.probe_answer("fresh", b"k", step) is LookupResult.RETRY and step["fresh"] == {b"k": None}
