"""``python -m bench.nixl_batches --digests``: the limit of a NIXL fetch with kvtier's digest work
(the source's digests first, or overlapped WRITE by WRITE; every WRITE's blocks checked on the
consumer's digest pool as its notification arrives).  A run raises unless the consumer checked
every block and every check passed; each digest cut gives the source a fill of its own, so a
block that did not land fails its check — and a wrong expected digest fails the run."""

from __future__ import annotations

import pytest

from bench.nixl_batches import CUTS, DIGESTED, OVERLAPPED, render, run

pytestmark = pytest.mark.timeout(120)


def test_every_cut_moves_and_the_digest_cuts_check_every_block() -> None:
    r = run(sizes=(3,), reps=1, shm=True, digests=True)
    names = [row["cut"] for row in r["rows"]]
    assert names == [name for name, _ in CUTS] + [DIGESTED, OVERLAPPED]
    assert all(row["mib"] == 3 and row["s"] > 0 and row["ratio"] > 0 for row in r["rows"])
    assert "packed 16 + digests, overlapped" in render(r)


def test_without_digests_only_the_plain_cuts_run() -> None:
    r = run(sizes=(2,), reps=1)
    assert [row["cut"] for row in r["rows"]] == [name for name, _ in CUTS]


def test_a_block_that_does_not_match_fails_the_run(monkeypatch) -> None:
    import bench.nixl_batches as nb

    monkeypatch.setattr(nb, "digest", lambda buf: 12345)  # what the consumer expects: not the bytes
    with pytest.raises(RuntimeError, match="bad=True"):
        run(sizes=(2,), reps=1, shm=True, digests=True)
