"""``gil_switch_interval_s`` (decision C28): a manager holds Python's thread switch interval at what
its config asks while it runs; the setting is the process's, so live managers share it — the
shortest asked for holds, never longer than the process's own — and the last one to close puts
back what was there before the first, unless the process set another meanwhile.  ``null`` leaves the interval alone.  A value outside
0.1-5 ms is refused, naming the key."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from kvtier.config import TierConfig, TierConfigError
from kvtier.shell import switch


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = sys.getswitchinterval()
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_claims_hold_the_shortest_interval_and_the_last_release_puts_back_the_first_value() -> None:
    sys.setswitchinterval(0.004)
    assert switch.claim(None) is None and sys.getswitchinterval() == pytest.approx(0.004)
    a = switch.claim(0.001)
    assert sys.getswitchinterval() == pytest.approx(0.001)
    b = switch.claim(0.0005)
    c = switch.claim(0.002)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    switch.release(b)
    assert sys.getswitchinterval() == pytest.approx(0.001)  # the shortest still held
    switch.release(b)  # twice: nothing
    switch.release(None)
    switch.release(a)
    assert sys.getswitchinterval() == pytest.approx(0.002)
    switch.release(c)
    assert sys.getswitchinterval() == pytest.approx(0.004)


def test_a_claim_never_lengthens_the_processs_interval_nor_undoes_its_own_change() -> None:
    sys.setswitchinterval(0.0002)
    a = switch.claim(0.001)
    assert sys.getswitchinterval() == pytest.approx(0.0002)  # already shorter: kept
    switch.release(a)
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    sys.setswitchinterval(0.005)
    b = switch.claim(0.0005)
    sys.setswitchinterval(0.002)  # the application changes it while the manager runs
    switch.release(b)
    assert sys.getswitchinterval() == pytest.approx(0.002)  # its own setting stays
    c = switch.claim(0.001)
    d = switch.claim(0.0005)
    sys.setswitchinterval(0.0003)
    switch.release(d)  # a release that is not the last one respects the process's shorter setting
    assert sys.getswitchinterval() == pytest.approx(0.0003)
    switch.release(c)
    assert sys.getswitchinterval() == pytest.approx(0.0003)


@pytest.mark.parametrize("how", ["shutdown", "close_abruptly"])
def test_a_manager_holds_its_interval_while_it_runs(make_manager, how: str) -> None:
    sys.setswitchinterval(0.005)
    plain = make_manager()
    assert sys.getswitchinterval() == pytest.approx(0.005)  # null: left alone
    m = make_manager({"gil_switch_interval_s": 0.0005})
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    getattr(m, how)()
    assert sys.getswitchinterval() == pytest.approx(0.005)
    plain.shutdown()
    assert sys.getswitchinterval() == pytest.approx(0.005)


@pytest.mark.parametrize("bad", [0, 0.00005, 0.006, "fast", True])
def test_an_interval_outside_its_range_is_refused_naming_the_key(bad: object) -> None:
    with pytest.raises(TierConfigError, match="gil_switch_interval_s"):
        TierConfig.from_dict({"gil_switch_interval_s": bad})
    assert TierConfig.from_dict({"gil_switch_interval_s": "0.0005"}).gil_switch_interval_s == 0.0005
    assert TierConfig.from_dict({}).gil_switch_interval_s is None
