"""Retained ids are small (decision I8): a done or tombstoned producer record keeps its state,
reason, named consumer and timer, never the fetch's key list, block map or slots.

Sizes are deterministic (``sys.getsizeof``, and tracemalloc over identical runs that differ only
in the fetch size), so they are asserted; nothing here is a timing.  The first release kept the
whole key list: 144 KiB per done id after a 2000-key fetch.
"""

from __future__ import annotations

import pytest

from bench.corememory import RETAINED_TARGET_B, retained_breakdown, retained_bytes

N = 60  # ids per measurement (the 2000-key run builds N x 2000 fresh key objects)


@pytest.mark.parametrize("end", ["done", "tombstoned"])
def test_retained_record_does_not_grow_with_the_fetch(end: str) -> None:
    """Per retained id, a 2000-key fetch costs what a 1-key fetch costs: the record owns the same
    objects (none of them the keys, the block map or the slots), and tracemalloc counts the same
    bytes per id within 8 B, right after retention and once the earlier deadlines surfaced."""
    one, many = retained_breakdown(1, end), retained_breakdown(2000, end)
    assert one == many, (one, many)
    assert one["demand"] == one["blocks"] == one["slots"] == one["owner"] == 0, one
    small, big = retained_bytes(N, 1, end), retained_bytes(N, 2000, end)
    print(f"{end}: B/id with a 1-key fetch {small}, with a 2000-key fetch {big}; record {one}")
    for when in ("retained", "steady"):
        assert abs(big[when] - small[when]) <= 8, (when, small, big)
    assert big["retained"] < 2048  # the first release: ~147,000 B per id


@pytest.mark.parametrize("end", ["done", "tombstoned"])
def test_retained_id_costs_at_most_the_target(end: str) -> None:
    """Decision I8's target: ≤ 256 B per retained id (done or tombstoned), whatever its fetch
    named, for the rest of ``tombstone_retention_s``: the live record is swapped for a
    six-slot RetainedRecord and the prune timer is the id's place in ``retained`` (no deadline
    entry)."""
    got = retained_bytes(N, 2000, end)
    assert got["steady"] <= RETAINED_TARGET_B, got
    # right after retention too: the entries of its earlier deadlines (reap, transfer) went
    # stale in arming order, so they left the head of their lanes as they went stale
    assert got["retained"] <= RETAINED_TARGET_B, got
