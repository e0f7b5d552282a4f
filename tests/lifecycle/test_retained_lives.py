"""A done or tombstoned id remembers the life it belonged to (decision I20): an input of another
life prunes it and meets a fresh record at once, while one of the same life (or naming none) is
answered from the retained state."""

from __future__ import annotations

from kvtier.lifecycle import ProducerState, Reason
from kvtier.lifecycle.effects import JobDone
from tests.lifecycle.scenario_pair import Pair, of


def _tombstoned(life: str) -> Pair:
    s = Pair()
    s.store("A", 2, 0.0, blocks=(0, 1), life=life)
    s.abort("A", 1.0)
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED
    return s


def _store(s: Pair, life: str, t: float) -> tuple[int, list]:
    return s.store("A", 2, t, owner="req-A2", blocks=(2, 3), life=life)


def test_a_store_of_a_new_life_parks_over_the_tombstone_of_the_old_one() -> None:
    s = _tombstoned("L1")
    _, out = _store(s, "L2", 2.0)
    assert of(out, JobDone) == []
    assert s.p.producer_state("A") is ProducerState.PARKED
    assert s.p.snapshot().retained == {}


def test_a_store_of_the_same_life_meets_the_tombstone() -> None:
    s = _tombstoned("L1")
    job, out = _store(s, "L1", 2.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.ABORTED, at_submission=True)]
    assert s.p.producer_state("A") is ProducerState.TOMBSTONED


def test_a_store_naming_no_life_meets_the_tombstone_of_a_named_one() -> None:
    s = _tombstoned("L1")
    job, out = _store(s, "", 2.0)
    assert of(out, JobDone) == [JobDone(job, False, Reason.ABORTED, at_submission=True)]
