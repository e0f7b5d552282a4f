"""The model check's symmetric profile (decision M14): the consumer's probe and its rounds' loads,
the producer's serve records, serve windows and engine pins, explored exhaustively with real cores
restored from snapshots; its properties fail when the core breaks them."""

from __future__ import annotations

import attrs
import msgspec
import pytest

from tools.modelcheck import PROFILES, PROPERTIES, check, format_result
from tools.modelcheck.system import System
from tools.planted import PROFILE_OF
from kvtier.lifecycle import probe as probe_module
from kvtier.lifecycle.effects import ReleasePins
from kvtier.lifecycle.reads import CoreReads
from kvtier.lifecycle.serve import ServeMachine

SYMMETRIC = PROFILES["symmetric"]


def test_the_symmetric_profile_is_exhausted_and_every_property_holds(profile_runs) -> None:
    """The symmetric profile's search (one of every profile's, shared: tests/model/conftest.py)."""
    r = profile_runs.of("symmetric")
    assert r.bounds == SYMMETRIC and r.bug is None
    text = format_result(r)
    print(text)
    assert r.ok, text
    assert r.max_depth < SYMMETRIC.depth, "exhausted, not cut by the depth bound"
    assert r.states > 10_000 and "symmetric sym_keys=2" in text
    for prop in PROPERTIES:
        assert f"ok   {prop}" in text
    got = profile_runs.reached["symmetric"]
    # the properties are not vacuous: the search went through every way a round lives and ends
    assert got["serve"] >= {"looking_up", "offered", "serving", "delivering", "confirmed", "cancelling", "quarantined"}
    assert got["probe"] >= {"idle", "collecting", "probing", "offered", "failed"}
    assert "in_flight" in got["loads"]
    assert got["releases"] == {True, False} and got["jobs"] == {True, False}


def test_with_one_key_the_faults_are_explored_too() -> None:
    """Lost, duplicated and corrupt messages of a one-key request (two keys with faults take ~2M
    states)."""
    b = attrs.evolve(SYMMETRIC, sym_keys=1, faults=1)
    r = check(b)
    text = format_result(r)
    assert r.ok, text
    assert r.max_depth < b.depth and r.states > 5_000, text


@pytest.mark.parametrize("bug", sorted(bug for bug, profile in PROFILE_OF.items() if profile == "symmetric"))
def test_the_symmetric_profile_finds_its_planted_bugs(bug: str, planted_checks) -> None:
    from tests.model.test_modelcheck import EXPECTED

    r = planted_checks(bug)  # check(SYMMETRIC, bug=bug, profile="symmetric"), searched once (conftest.py)
    assert r.bounds == SYMMETRIC and r.profile == "symmetric"
    text = format_result(r)
    print(text)
    assert r.violation is not None and r.violation.prop == EXPECTED[bug], text
    steps = [line for line in r.violation.trace if line[:5].strip().rstrip(".").isdigit()]
    assert 1 <= len(steps) <= 12, text


def test_a_pin_released_twice_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round that ends well releases its pins twice: pin_released_once, at the second release."""
    original = ServeMachine._release

    def twice(self, rec, ok, reason, out):  # type: ignore[no-untyped-def]
        pins = tuple(rec.pins)
        original(self, rec, ok, reason, out)
        if pins and ok:
            out.append(ReleasePins(pins, ok, None))

    monkeypatch.setattr(ServeMachine, "_release", twice)
    r = check(SYMMETRIC)
    assert r.violation is not None and r.violation.prop == "pin_released_once", format_result(r)
    assert "twice" in r.violation.message


def test_a_pin_never_released_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that forgets to tell the engine leaves a pin no record holds (the state check of
    pin_released_once finds it at once, before the liveness search would)."""

    def forget(self, rec, ok, reason, out):  # type: ignore[no-untyped-def]
        rec.pins = []
        self._unpin(rec)
        rec.found = {}

    monkeypatch.setattr(ServeMachine, "_release", forget)
    r = check(SYMMETRIC)
    assert r.violation is not None and r.violation.prop == "pin_released_once", format_result(r)
    assert "nobody will release" in r.violation.message


def test_a_retry_outside_the_bound_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that answers RETRY for a key the peer answered miss (so outside collecting and
    probing), in the answers the shell publishes to the engine: probe_answered_in_bound."""
    original = CoreReads.probe_answers

    def retry_misses(self, kv_request_id):  # type: ignore[no-untyped-def]
        a = original(self, kv_request_id)
        return msgspec.structs.replace(a, retry=a.retry | a.miss, miss=frozenset())

    monkeypatch.setattr(CoreReads, "probe_answers", retry_misses)
    r = check(SYMMETRIC)
    assert r.violation is not None and r.violation.prop == "probe_answered_in_bound", format_result(r)


def test_a_load_result_never_reported_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's load that ends without reporting its job: exactly_once_job_result (the job is held
    by no live load)."""
    monkeypatch.setattr(probe_module.RoundLoads, "effect_report_load_ok",
                        lambda self, rec, inp, reason, now, out: self._ended(rec, True))
    r = check(SYMMETRIC)
    assert r.violation is not None and r.violation.prop == "exactly_once_job_result", format_result(r)


def test_a_held_pin_and_a_serve_record_are_not_quiescent() -> None:
    """no_stuck_ids covers the symmetric path: a pinned, offered round is not an end state, and the
    liveness report names what is left (the completion search must reach the offer's release)."""
    system = System(SYMMETRIC)
    g = system.initial()
    for action in (("s_announce",), ("s_lookup", 0), ("s_schedule_end",), ("deliver", 1, 0), ("window", "f")):
        assert action in list(system.actions(g, True)), action
        g = system.apply(g, action)
    assert [p[:3] for p in g.pins] == [(1, "X", 0)]
    assert system.cores.summaries[g.p].serve[("c1", "X", 0)][0] == "offered"
    assert not system.quiescent(g)
    stuck = [text for _lane, text in system.stuck(g)]
    assert any("pin 1" in t for t in stuck) and any("serve" in t and "offered" in t for t in stuck), stuck
    # the offer deadline releases the pin (a completion step): the round ends, the pin is returned
    g = system.apply(g, ("fire", "p", "serve", ("c1", "X", 0), ""))
    assert g.pins == () and not system.cores.summaries[g.p].serve
