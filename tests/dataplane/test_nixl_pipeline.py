"""The NIXL plane's WRITE pipeline: batches packed into few WRITEs, each batch's header still its
own notification (decision N18), only for a consumer that reads packed notifications.

Two real planes in this process (two NIXL agents over two block pools); every byte moves through
NIXL/UCX.
"""

from __future__ import annotations

import os

import msgspec
import pytest

from kvtier.dataplane import Batch, Notified, Released, make_plane
from kvtier.dataplane.nixl_pipeline import PACKED, WRITE_BYTES, pack_headers, unpack_notification
from kvtier.memory import BlockPool
from kvtier.transport import SendHandle

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

pytestmark = pytest.mark.timeout(60)

BB = 1 << 20  # 1 MiB blocks: a packed WRITE holds WRITE_BYTES // BB of them
NB = 64


class _Quiet:
    def send(self, peer: str, frames: list, track: bool = False) -> SendHandle:
        h = SendHandle(peer)
        h._mark_sent()
        return h


def _unpacked(descriptor: bytes) -> bytes:
    """The same plane descriptor as a peer of the previous release sends it (no ``packed``)."""
    d = msgspec.msgpack.decode(descriptor)
    del d["packed"]
    return msgspec.msgpack.encode(d)


@pytest.fixture(scope="module")
def planes():
    pools = [BlockPool(NB, BB, pin=False) for _ in range(3)]
    p = make_plane("nixl", transport=_Quiet(), pool=pools[0], layout="raw")
    c = make_plane("nixl", transport=_Quiet(), pool=pools[1], layout="raw")
    old = make_plane("nixl", transport=_Quiet(), pool=pools[2], layout="raw")
    c.add_peer("prod", p.descriptor())
    old.add_peer("prod", p.descriptor())
    p.add_peer("cons", c.descriptor(), accepted=True)
    p.add_peer("old", _unpacked(old.descriptor()), accepted=True)
    for peer, plane in (("cons", c), ("old", old)):  # each link's rate measured: whole windows (T23)
        _run(p, plane, peer, "kv-warm", _batches(4, 4, slot0=60))
    yield p, c, old, pools
    for x in (p, c, old):
        x.close()


def _run(p, c, peer, kid, batches):
    """Post ``batches`` to ``peer`` (the consumer plane ``c``) as round 0 of ``kid`` and poll both
    until the transfer is released and every header arrived; (``p``'s reports, the headers)."""
    p.post(peer, kid, 0, batches)
    return _run_posted(p, c, len(batches))


def _batches(n_blocks, per, slot0=0):
    return [Batch(i // per, tuple(range(i, i + per)), tuple(range(slot0 + i, slot0 + i + per)), b"hdr%d" % i)
            for i in range(0, n_blocks, per)]


def test_headers_pack_and_unpack_and_a_bad_packed_notification_is_returned_whole():
    assert pack_headers([b"a"]) == b"a"
    packed = pack_headers([b"\x85one", b"two", b"three"])
    assert packed[:1] == PACKED and unpack_notification(packed) == (b"\x85one", b"two", b"three")
    assert unpack_notification(b"\x85plain") == (b"\x85plain",)
    for bad in (PACKED + b"\xff\x00", PACKED, PACKED + msgspec.msgpack.encode([1, 2])):
        assert unpack_notification(bad) == (bad,)  # the shell's decoder refuses it as malformed


def test_full_batches_share_writes_and_every_header_arrives_in_order(planes):
    p, c, _, (pp, cp, _) = planes
    for i in range(32):
        pp.view(i).fill_(i + 1)
    cp.tensor.fill_(0)
    # 8 batches of 4 MiB, then a taper of two 1-block batches (equal, but not the largest size)
    batches = _batches(32, 4) + [Batch(8, (0,), (40,), b"tail"), Batch(9, (1,), (41,), b"tail2")]
    before = p.posts
    out, seen = _run(p, c, "cons", "kv-pack", batches)
    assert [r for r in out if isinstance(r, Released)] == [Released("kv-pack", 0, False, 34 * BB, "")]
    per_write = WRITE_BYTES // (4 * BB)
    assert p.posts - before == 8 // per_write + 2  # each taper batch goes alone
    # a packed WRITE's headers arrive in batch order; WRITEs may end out of posting order (a 1 MiB
    # one before a 16 MiB one posted earlier): the consumer checks each batch by its own header
    packed = [r.frames for r in seen if r.frames[0].startswith(b"hdr")]
    assert packed == [(b.header,) for b in batches[:8]], packed
    assert sorted(r.frames for r in seen) == sorted((b.header,) for b in batches)
    for i in range(32):
        assert bytes(cp.buffer(i)) == bytes([i + 1]) * BB
    assert bytes(cp.buffer(40)) == bytes([1]) * BB and bytes(cp.buffer(41)) == bytes([2]) * BB


def test_a_consumer_without_packed_notifications_gets_one_write_per_batch(planes):
    p, _, old, (pp, _, op) = planes
    op.tensor.fill_(0)
    batches = _batches(16, 4)
    before = p.posts
    out, seen = _run(p, old, "old", "kv-old", batches)
    assert [r for r in out if isinstance(r, Released)] == [Released("kv-old", 0, False, 16 * BB, "")]
    assert p.posts - before == 4
    assert sorted(r.frames for r in seen) == sorted((b.header,) for b in batches)  # WRITEs may end out of order


def test_a_poll_stops_posting_at_its_budget_and_asks_to_be_called_again_at_once(planes, monkeypatch):
    """Over CMA a WRITE's copy runs inside its post, so one poll used to post a whole transfer
    (a 256 MiB one held the producer's loop for 40-150 ms: a late consumer's fetch waited that
    long for its refusal).  Past its budget a poll stops posting: with no budget, every poll posts
    one WRITE and says the rest is ready to post (``max_wait_s`` 0, so the loop reads its
    sockets and comes back without waiting); the transfer still ends whole, every header in
    order (decision N22)."""
    import kvtier.dataplane.nixl_pipeline as pipeline

    p, c, _, (pp, cp, _) = planes
    for i in range(48):
        pp.view(i).fill_(i + 3)
    cp.tensor.fill_(0)
    batches = _batches(48, 4)  # 48 MiB: three packed WRITEs of WRITE_BYTES
    assert WRITE_BYTES == 16 * BB
    monkeypatch.setattr(pipeline, "DRIVE_S", 0.0)
    before = p.posts
    p.post("cons", "kv-budget", 0, batches)
    assert p.posts - before == 1 and p.max_wait_s(receiving=False) == 0.0
    p.poll()
    assert p.posts - before == 2 and p.max_wait_s(receiving=False) == 0.0
    out, seen = _run_posted(p, c, len(batches))
    assert p.posts - before == 3
    assert [r for r in out if isinstance(r, Released)] == [Released("kv-budget", 0, False, 48 * BB, "")]
    assert [r.frames for r in seen] == [(b.header,) for b in batches]
    for i in range(48):
        assert bytes(cp.buffer(i)) == bytes([i + 3]) * BB
    assert p.max_wait_s(receiving=False) is None  # nothing left: an idle plane is not woken


def _run_posted(p, c, n_batches):
    """Poll both planes until the transfer posted on ``p`` is released and ``n_batches`` headers
    arrived at ``c``."""
    seen: list = []
    out: list = []
    for _ in range(50000):
        out += p.poll()
        seen += [r for r in c.poll() if isinstance(r, Notified)]
        if any(isinstance(r, Released) for r in out) and len(seen) >= n_batches:
            return out, seen
    raise AssertionError(f"not done: {out} {seen}")


def test_a_new_transfer_posts_one_write_and_keeps_the_others_backlog(planes, monkeypatch):
    """A transfer that starts posts its first WRITE only (several starting in one pass must not
    each take a budget), and never clears what an earlier poll left to post: the loop still comes
    back at once for it (decision N22)."""
    import kvtier.dataplane.nixl_pipeline as pipeline

    p, c, _, (pp, cp, _) = planes
    cp.tensor.fill_(0)
    monkeypatch.setattr(pipeline, "DRIVE_S", 0.0)
    before = p.posts
    p.post("cons", "kv-first", 0, _batches(48, 4))  # three WRITEs of WRITE_BYTES
    assert p.posts - before == 1 and p.max_wait_s(receiving=False) == 0.0
    p.post("cons", "kv-second", 0, _batches(4, 4, slot0=48))  # one small WRITE: all it has
    assert p.posts - before == 2
    assert p.max_wait_s(receiving=False) == 0.0  # kv-first still has WRITEs to post
    out, seen = _run_posted(p, c, 13)
    assert sorted(r.kv_request_id for r in out if isinstance(r, Released)) == ["kv-first", "kv-second"]
    assert p.posts - before == 4


def test_a_transfer_to_a_link_of_unknown_rate_posts_one_piece_at_a_time_until_a_write_ends():
    """Decision T23: before any WRITE to a peer ended its link's rate is unknown, so a transfer has
    one piece (SLOW_START_BYTES, header-less) in flight at a time — a cancel then leaves at most that
    to drain before its answer; once one ended (here over CMA, fast) the rest of the batch goes with
    its header and the batches after it are packed into WRITE_BYTES again."""
    pools = [BlockPool(NB, BB, pin=False) for _ in range(2)]
    p = make_plane("nixl", transport=_Quiet(), pool=pools[0], layout="raw")
    c = make_plane("nixl", transport=_Quiet(), pool=pools[1], layout="raw")
    try:
        c.add_peer("prod", p.descriptor())
        p.add_peer("cons", c.descriptor(), accepted=True)
        for i in range(32):
            pools[0].view(i).fill_(i + 5)
        before = p.posts
        p.post("cons", "kv-slow", 0, _batches(32, 4))  # 8 batches of 4 MiB
        assert p.posts - before == 1
        out, seen = _run_posted(p, c, 8)
        assert [r for r in out if isinstance(r, Released)] == [Released("kv-slow", 0, False, 32 * BB, "")]
        assert 2 < p.posts - before < 8  # one alone, then the rest packed
        assert all(bytes(pools[1].buffer(i)) == bytes([i + 5]) * BB for i in range(32))
    finally:
        for x in (p, c):
            x.close()
