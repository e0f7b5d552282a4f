"""How the core cuts a transfer into ``block_data`` messages (:mod:`kvtier.lifecycle.batches`,
decision I16): the taper of :func:`plan_batches`, and :class:`Batcher` keeping every header within
what the data plane carries (a NIXL notification: 4 KiB) while packing as many blocks as fit."""

from __future__ import annotations

import msgspec
import pytest

from kvtier.lifecycle.batches import MAX_BATCH_BYTES, TAIL_BYTES, Batcher, plan_batches
from kvtier.wire import messages as wm

BIG = 2**64 - 1  # the longest digest msgpack encodes (9 bytes)


def _encoded(header: wm.BlockData) -> int:
    return len(msgspec.msgpack.encode(header))


@pytest.mark.parametrize(("n", "per", "tail", "want"), [
    (256, 8, 1, [8] * 31 + [4, 2, 1, 1]),
    (1, 8, 1, [1]),
    (0, 8, 1, []),
    (3, 8, 4, [3]),  # at most `tail` blocks: one batch
    (5, 8, 4, [1, 4]),
    (10, 2, 8, [2, 2, 2, 2, 2]),  # a tail above `per` is cut to `per`
])
def test_the_plan_tapers_to_the_tail_and_sums_to_the_transfer(n, per, tail, want) -> None:
    assert plan_batches(n, per, tail) == want
    assert sum(want) == n and all(b > 0 for b in want)


@pytest.mark.parametrize(("per", "tail"), [(0, 1), (1, 0), (-1, 1)])
def test_the_plan_refuses_a_size_that_is_not_positive(per, tail) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        plan_batches(4, per, tail)


def test_every_header_fits_the_planes_limit_and_the_batches_are_as_full_as_it_allows() -> None:
    limit = 4096
    batcher = Batcher(block_bytes=64, max_header_bytes=limit, integrity=True)
    n = 2000
    out = batcher.send_blocks("peer", "kid-" + "x" * 40, 7, range(n), gen=3, digests=[BIG] * n,
                              slots=range(n))
    sizes = [h.count for h in out.headers]
    assert sum(sizes) == n and [h.first for h in out.headers] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert all(_encoded(h) <= limit for h in out.headers)
    full = max(sizes)
    assert full > 100  # far more than one block per batch
    # one more digest would not leave the margin the estimate keeps (4 bytes for longer prefixes)
    bigger = wm.BlockData(gen=3, kv_request_id="kid-" + "x" * 40, round=7, first=n, count=full + 1,
                          digests=[BIG] * (full + 1))
    assert _encoded(bigger) > limit - 13
    assert all(h.digests == [BIG] * h.count for h in out.headers)


@pytest.mark.parametrize("k", range(1, 40))
def test_at_every_limit_a_batch_holds_the_most_blocks_whose_header_fits(k) -> None:
    """The estimate's margin, swept across the 9-byte steps of a digest: at a limit of one
    one-block header plus its 4-byte margin plus ``k`` digests, the full batches hold ``k + 1``
    blocks, every header fits, and a header one block longer would not."""
    kid, n = "req-1", 64
    one = _encoded(wm.BlockData(gen=1, kv_request_id=kid, round=0, first=n, count=1, digests=[BIG]))
    limit = one + 4 + 9 * k
    out = Batcher(block_bytes=1024, max_header_bytes=limit, integrity=True).send_blocks(
        "peer", kid, 0, range(n), gen=1, digests=[BIG] * n, slots=range(n))
    assert all(_encoded(h) <= limit for h in out.headers)
    full = max(h.count for h in out.headers)
    assert full == k + 1
    longer = wm.BlockData(gen=1, kv_request_id=kid, round=0, first=n, count=full + 1, digests=[BIG] * (full + 1))
    assert _encoded(longer) > limit


def test_a_tiny_header_limit_still_sends_one_block_per_batch() -> None:
    out = Batcher(64, max_header_bytes=10, integrity=True).send_blocks("p", "k", 0, range(5), 1, [BIG] * 5,
                                                                          range(5))
    assert [h.count for h in out.headers] == [1] * 5


def test_without_digests_or_without_a_limit_only_the_byte_plan_counts() -> None:
    block = 1 << 20  # 1 MiB blocks: 8 per batch, a tail of 1
    per, tail = MAX_BATCH_BYTES // block, TAIL_BYTES // block
    want = plan_batches(40, per, tail)
    no_digests = Batcher(block, max_header_bytes=4096, integrity=True).send_blocks("p", "k", 0, range(40), 1, [],
                                                                                      range(40))
    no_limit = Batcher(block, max_header_bytes=None, integrity=True).send_blocks("p", "k", 0, range(40), 1,
                                                                                    [BIG] * 40, range(40))
    assert [h.count for h in no_digests.headers] == want == [h.count for h in no_limit.headers]
    assert all(h.digests == [] for h in no_digests.headers)


def test_digests_the_shell_takes_later_are_planned_for_only_when_integrity_is_on() -> None:
    """``take_digests``: the headers get their digests when the shell hands the transfer over, so
    the plan must leave room for them — unless the tier runs without integrity."""
    n = 2000
    on = Batcher(64, 4096, integrity=True).send_blocks("p", "k", 0, range(n), 1, [], range(n), take_digests=True)
    off = Batcher(64, 4096, integrity=False).send_blocks("p", "k", 0, range(n), 1, [], range(n), take_digests=True)
    assert len(on.headers) > 1 and max(h.count for h in on.headers) < n
    assert [h.count for h in off.headers] == plan_batches(n, MAX_BATCH_BYTES // 64, TAIL_BYTES // 64)
    assert on.take_digests and on.blocks == tuple(range(n)) and on.slots == tuple(range(n))


def test_a_transfer_without_digests_is_not_cut_for_digests_it_will_not_carry() -> None:
    """Small blocks, no digests, none to be taken later: one batch, however tight the header limit
    would be for digests."""
    out = Batcher(64, 4096, integrity=True).send_blocks("p", "k", 0, range(2000), 1, [], range(2000))
    assert [h.count for h in out.headers] == [2000] and out.take_digests is False


def test_a_block_size_of_zero_sends_one_block_per_batch() -> None:
    out = Batcher(0, None, True).send_blocks("p", "k", 0, range(3), 1, [], range(3))
    assert [h.count for h in out.headers] == [1, 1, 1]


@pytest.mark.parametrize(("block_bytes", "n", "want"), [
    (1, 3, [3]),  # 1-byte blocks: a batch holds 8 Mi of them, the tail 1 Mi
    (MAX_BATCH_BYTES, 5, [1, 1, 1, 1, 1]),  # 8 MiB blocks: one per batch
    (5 << 20, 5, [1, 1, 1, 1, 1]),  # larger than half a batch: still one per batch
    (0, 5, [1, 1, 1, 1, 1]),  # no block size known: one per batch
])
def test_the_batch_and_tail_sizes_follow_the_block_size_at_its_edges(block_bytes, n, want) -> None:
    out = Batcher(block_bytes, None, integrity=True).send_blocks("p", "k", 0, range(n), 1, [], range(n))
    assert [h.count for h in out.headers] == want


def test_a_tail_that_is_not_a_whole_number_of_blocks_is_rounded_down() -> None:
    n = 400_000  # 3-byte blocks: the tail is 349,525 blocks (1 MiB // 3), the rest one batch before it
    out = Batcher(3, None, integrity=True).send_blocks("p", "k", 0, range(n), 1, [], range(n))
    counts = [h.count for h in out.headers]
    assert counts == [n - TAIL_BYTES // 3, TAIL_BYTES // 3] and all(type(c) is int for c in counts)


@pytest.mark.parametrize(("n", "limit", "digests"), [(1, None, True), (300, None, True), (2000, 4096, True),
                                                    (5, 4096, False), (64, 600, True)])
def test_every_header_the_core_builds_is_one_a_peer_decodes_and_accepts(n, limit, digests) -> None:
    """The core's headers skip the checks a decoded one gets (``wm.BuiltBlockData``): each must
    encode exactly as the checked ``BlockData`` of the same fields, and decode into one."""
    from kvtier.wire.codec import Decoder, encode

    digs = [BIG - i for i in range(n)] if digests else []
    out = Batcher(block_bytes=64, max_header_bytes=limit, integrity=digests).send_blocks(
        "peer", "kid-" + "y" * 20, 9, range(n), gen=2**63 - 1, digests=digs, slots=range(n))
    decoder = Decoder(block_bytes=64)
    for h in out.headers:
        checked = wm.BlockData(gen=h.gen, kv_request_id=h.kv_request_id, round=h.round, first=h.first,
                               count=h.count, digests=list(h.digests))
        assert encode(h) == encode(checked)
        msg, payloads = decoder.decode([encode(h)] + [b"\0" * 64] * h.count)
        assert type(msg) is wm.BlockData and msg == checked
    assert [d for h in out.headers for d in h.digests] == digs
