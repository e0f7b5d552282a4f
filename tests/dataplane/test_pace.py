"""The per-peer drain rate a producer's plane measures from its releases, and the window it
allows a transfer (decision T23), on a clock the test moves."""

from __future__ import annotations

import pytest

from kvtier.dataplane.pace import Pace

MiB = 1 << 20


def test_the_rate_is_unknown_until_a_release_and_then_sets_the_window() -> None:
    pace = Pace(horizon_s=1.0)
    assert pace.window("a", 32 * MiB) == 0 and pace.rate("a") is None
    pace.posted("a", 8 * MiB, now=10.0)
    assert pace.window("a", 32 * MiB) == 0  # posted, nothing released yet
    pace.released("a", 8 * MiB, now=12.0)  # 8 MiB in 2 s
    assert pace.rate("a") == 4 * MiB and pace.window("a", 32 * MiB) == 4 * MiB
    assert pace.window("a", 2 * MiB) == 2 * MiB  # never above the plane's largest
    assert pace.window("b", 32 * MiB) == 0  # per peer


def test_the_rate_is_measured_while_bytes_are_in_flight_not_over_idle_time() -> None:
    """A sample counts from when bytes were in flight: a link idle between two transfers does not
    look slow, several batches in flight are measured together, and a stall (a stopped consumer)
    weighs only until the next samples."""
    pace = Pace(horizon_s=0.5)
    pace.posted("a", 8 * MiB, now=0.0)
    pace.posted("a", 8 * MiB, now=0.0)
    pace.released("a", 8 * MiB, now=1.0)
    pace.released("a", 8 * MiB, now=2.0)  # 8 MiB a second, twice
    assert pace.rate("a") == pytest.approx(8 * MiB)
    pace.posted("a", 8 * MiB, now=100.0)  # idle for 98 s, then in flight again
    pace.released("a", 8 * MiB, now=100.1)  # 80 MiB/s: half of the average
    assert pace.rate("a") == pytest.approx(44 * MiB) and pace.window("a", 64 * MiB) == pytest.approx(22 * MiB, abs=1)
    pace.released("a", 8 * MiB, now=101.0)  # more released than posted (a failed send): ignored
    assert pace.rate("a") == pytest.approx(44 * MiB)
    pace.posted("a", 32 * MiB, now=200.0)
    pace.released("a", 8 * MiB, now=210.0)  # a 10 s stall: 0.8 MiB/s
    slow = pace.rate("a")
    for t in (210.1, 210.2, 210.3):  # then 80 MiB/s again
        pace.released("a", 8 * MiB, now=t)
    assert slow < 23 * MiB and pace.rate("a") > 70 * MiB
    pace.posted("b", MiB, now=5.0)
    pace.released("b", MiB, now=5.0002)  # the whole of it, within MIN_SAMPLE_S: a sample all the same
    assert pace.rate("b") == pytest.approx(MiB / 0.0002)


def test_a_forgotten_peer_starts_slow_again() -> None:
    pace = Pace(horizon_s=1.0)
    pace.posted("a", MiB, now=0.0)
    pace.released("a", MiB, now=0.001)
    assert pace.window("a", 32 * MiB) == 32 * MiB
    pace.forget("a")
    assert pace.window("a", 32 * MiB) == 0
    pace.released("a", MiB, now=1.0)  # a late release of the old session's bytes
    assert pace.rate("a") is None
