"""``kvtier check``: the bounded exhaustive model check passes on the real core and finds every
planted bug with a readable counterexample trace."""

from __future__ import annotations

import time

import pytest

from kvtier._tools import modelcheck
from kvtier._tools.modelcheck import Bounds, check, format_result
from kvtier.testing.planted import PLANTED

EXPECTED = {
    "bind_ignores_tombstone": "no_bytes_for_tombstoned",
    "dup_ack_releases_twice": "exactly_once_job_result",
    "reap_forgets_jobs": "exactly_once_job_result",
    "prune_before_retention": "late_fetch_one_rtt",
    "write_after_abort": "no_write_after_terminal",
    "store_reparks_tombstone": "tombstoned_never_reparks",
    "abort_never_gives_up": "no_stuck_ids",
}


def test_every_planted_bug_has_an_expected_property() -> None:
    assert set(EXPECTED) == set(PLANTED)


def test_default_bounds_pass_on_the_real_core() -> None:
    b = Bounds()
    assert b.ids >= 2 and b.consumers >= 2 and b.faults >= 1 and b.depth >= 12
    t0 = time.perf_counter()
    r = check(b)
    elapsed = time.perf_counter() - t0
    text = format_result(r)
    print(text)
    assert r.ok, text
    assert r.states > 10_000 and r.max_depth >= 12
    assert r.max_depth < b.depth, "the default state space is exhausted, not cut by the depth bound"
    for prop in modelcheck.PROPERTIES:
        assert f"ok   {prop}" in text
    assert elapsed < 120, f"the default model check took {elapsed:.0f} s"


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_each_planted_bug_fails_with_a_trace(bug: str) -> None:
    r = check(Bounds(), bug=bug)
    text = format_result(r)
    print(text)
    assert r.violation is not None, f"the model check did not find {bug}"
    assert r.violation.prop == EXPECTED[bug], text
    steps = [line for line in r.violation.trace if line[:5].strip().rstrip(".").isdigit()]
    assert 1 <= len(steps) <= 12, text
    assert "counterexample:" in text and f"FAIL {EXPECTED[bug]}" in text


def test_main_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert modelcheck.main(["--ids", "1", "--consumers", "1"]) == 0
    assert "ok   no_stuck_ids" in capsys.readouterr().out
    assert modelcheck.main(["--bug", "reap_forgets_jobs"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION of exactly_once_job_result" in out and "counterexample:" in out
    assert modelcheck.main(["--bug", "no_such_bug"]) == 2
    assert modelcheck.main(["--list-bugs"]) == 0
    assert set(PLANTED) <= set(line.split(":")[0] for line in capsys.readouterr().out.splitlines())
    assert modelcheck.main(["--depth", "3", "--max-states", "50", "--no-reduce"]) == 3


@pytest.mark.parametrize("bug", [None, "bind_ignores_tombstone", "write_after_abort", "store_reparks_tombstone"])
def test_partial_order_reduction_agrees_with_the_plain_search(bug: str | None) -> None:
    """At a depth both can afford, the reduced search reaches the same verdict as the plain one."""
    small = Bounds(depth=8)
    reduced, plain = check(small, bug=bug), check(Bounds(depth=8, reduce=False), bug=bug)
    assert (reduced.violation is None) == (plain.violation is None)
    if bug is not None:
        assert reduced.violation.prop == plain.violation.prop == EXPECTED[bug]
    assert reduced.states <= plain.states


def test_the_tombstone_count_cap_is_checked_too() -> None:
    """tombstone_max=1 with two ids: retiring one id evicts the other's tombstone."""
    r = check(Bounds(tombstone_max=1, depth=8))
    assert r.ok, format_result(r)


@pytest.mark.slow
@pytest.mark.parametrize(
    "bounds",
    [
        Bounds(crashes=1, depth=9),
        Bounds(drain=True, shutdown=True, depth=8),
        Bounds(routing="any", loads_per_id=2, depth=7),
        Bounds(chunks=2),
        Bounds(park_clock="first_store"),
        Bounds(reorder=True, depth=10),
        Bounds(fault_scope="total", depth=10),
    ],
    ids=["crash", "drain-shutdown", "two-consumers-per-id", "chunks2", "first-store", "reorder", "faults-total"],
)
def test_richer_configurations(bounds: Bounds) -> None:
    r = check(bounds)
    assert r.ok, format_result(r)
