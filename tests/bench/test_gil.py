"""``python -m bench.gil``: the digests and a 1-block request beside an engine thread that runs
Python part of the time.  A request that does not succeed raises, so a figure means the bytes
moved; the switch interval the run sets is the one it reports."""

from __future__ import annotations

import sys

import pytest

from bench import gil

pytestmark = pytest.mark.timeout(120)


def test_both_figures_are_measured_beside_a_busy_engine_thread() -> None:
    import logging

    level = logging.getLogger("kvtier").level
    assert gil.digests(0.5, reps=1) > 0
    assert gil.requests(0.5, n=3) > 0
    assert logging.getLogger("kvtier").level == level  # quieted for the run only


def test_the_switch_option_sets_the_interval_it_prints(capsys) -> None:
    before = sys.getswitchinterval()
    try:
        assert gil.main(["--switch", "0.0005", "--duty", "0", "--requests", "2"]) == 0
        assert sys.getswitchinterval() == 0.0005
    finally:
        sys.setswitchinterval(before)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "GIL switch interval 0.5 ms"
    assert out.count("| 0% of each 4 ms |") == 1
