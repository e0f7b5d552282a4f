"""The model checker's parts, each at its seam: the snapshot codec, the transport model, abstract
time, the network's budgets, the property registry, and the structured counterexample trace."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kvtier._tools.modelcheck import PROPERTIES, REGISTRY, Bounds, check, encoding, format_result, to_chart_steps
from kvtier._tools.modelcheck.encoding import Codec
from kvtier._tools.modelcheck.properties import Fail
from kvtier._tools.modelcheck.system import System
from kvtier._tools.modelcheck.trace import KINDS
from kvtier._tools.modelcheck.transport import Transfer, after_effects, after_report, reports
from kvtier._tools.spec import load as load_spec
from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.effects import CancelTransfer, JobDone, SendBlocks
from kvtier.testing.planted import PLANTED

LANE = re.compile(r"^(engine:prefill|producer|consumer:\d+|engine:decode:\d+|network|clock)$")


# -- encoding ------------------------------------------------------------------------------------


def test_a_restored_snapshot_is_the_same_core() -> None:
    system = System(Bounds())
    g = system.initial()
    g = system.apply(g, ("store", 0))  # X parked (+ request finished): records, deadlines, retained
    g = system.apply(g, ("load", 0, 0))  # c1 in flight, a fetch queued
    cores = system.cores
    for sid in (g.p, *g.c):
        snap = cores.snaps[sid]
        again = cores.codec.restore(snap)
        assert cores.codec.snapshot(again) == snap
        assert Codec.indexes(again) == Codec.indexes(cores.codec.restore(snap))


def test_core_steps_are_memoised() -> None:
    system = System(Bounds())
    g = system.initial()
    before = system.cores.core_steps
    a = system.apply(g, ("store", 0))
    ran = system.cores.core_steps - before
    assert ran == 2  # store, then request_finished
    b = system.apply(g, ("store", 0))
    assert a == b and system.cores.core_steps - before == ran


def test_the_codec_refuses_core_state_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    class Grown(TierCore):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.producer.new_field = {}  # type: ignore[attr-defined]

    monkeypatch.setattr(encoding, "TierCore", Grown)
    with pytest.raises(RuntimeError, match=r"producer has state the snapshot codec does not know: \['new_field'\]"):
        System(Bounds())


# -- transport -----------------------------------------------------------------------------------


def test_transport_reports_of_a_transfer() -> None:
    live = Transfer(0, "X", 3, False)
    assert reports(live, failures=True) == ("complete", "failed")
    assert reports(live, failures=False) == ("complete",)
    assert reports(live._replace(cancelled=True), failures=True) == ("released",)


def test_transport_follows_send_and_cancel() -> None:
    consumers = {"c1": 0, "c2": 1}
    t = after_effects((), (SendBlocks("c2", "Y", 1, (7,)), JobDone(5, True)), consumers)
    assert t == (Transfer(1, "Y", 1, False),)
    t = after_effects(t, (SendBlocks("c1", "X", 0, (3,)), SendBlocks("elsewhere", "Z", 0, (1,))), consumers)
    assert t == (Transfer(0, "X", 0, False), Transfer(1, "Y", 1, False))  # sorted; unknown peers carry nothing
    # a cancel names peer, id and round: only that transfer is cancelled
    t = after_effects(t, (CancelTransfer("c1", "Y", 1), CancelTransfer("c2", "Y", 1)), consumers)
    assert t == (Transfer(0, "X", 0, False), Transfer(1, "Y", 1, True))
    assert after_report(t, Transfer(1, "Y", 1, True)) == (Transfer(0, "X", 0, False),)


def test_a_cancelled_transfer_is_released_to_the_producer() -> None:
    """Through the composed system: serving, the consumer aborts, the producer cancels, the
    transport releases, the producer's record leaves ``cancelling``."""
    system = System(Bounds(transfer_failures=False))
    g = system.initial()
    for action in (("store", 0), ("load", 0, 0), ("deliver", 1, 0)):  # the fetch reaches the producer
        g = system.apply(g, action)
    assert g.transfers == (Transfer(0, "X", 0, False),)
    assert [a for a in system.actions(g, True) if a[0] == "transport"] == [("transport", g.transfers[0], "complete")]
    g = system.apply(g, ("c_finished", 0, 0))  # consumer gives up: abort_fetch queued
    g = system.apply(g, ("deliver", 1, 0))
    assert g.transfers == (Transfer(0, "X", 0, True),)
    assert system.cores.summaries[g.p].producer["X"][0] == "cancelling"
    g = system.apply(g, ("transport", g.transfers[0], "released"))
    assert g.transfers == ()
    assert system.cores.summaries[g.p].producer["X"][0] != "cancelling"


# -- clock and network ---------------------------------------------------------------------------


def test_any_armed_deadline_may_fire() -> None:
    system = System(Bounds())
    g = system.apply(system.initial(), ("store", 0))
    fires = system.clock.actions(g, True)
    assert ("fire", "p", "producer", "X") in fires  # the parked id's reap deadline
    assert not any(a[2] == "sessions" for a in fires), "liveness deadlines are crashes: none without a crash budget"
    crashy = System(Bounds(crashes=1))
    g = crashy.apply(crashy.initial(), ("store", 0))
    assert any(a[2] == "sessions" for a in crashy.clock.actions(g, True))
    assert not any(a[2] == "sessions" for a in crashy.clock.actions(g, False)), "not a completion step"


def test_fault_budgets_per_connection_or_in_total() -> None:
    for scope, budgets in (("per_peer", (1, 0)), ("total", (0,))):
        system = System(Bounds(fault_scope=scope))
        g = system.initial()
        g = system.apply(g, ("load", 0, 0))  # c1's fetch on channel 1
        g = system.apply(g, ("load", 1, 1))  # c2's fetch on channel 3
        g = system.apply(g, ("drop", 3, 0))
        assert g.faults == budgets and g.chans[3] == ()
        faults = system.network.faults(g)
        assert faults == ([("drop", 1, 0), ("dup", 1, 0)] if scope == "per_peer" else [])


# -- properties ----------------------------------------------------------------------------------


def test_every_spec_property_is_checked() -> None:
    covered = {name for p in REGISTRY for name in p.covers}
    missing = set(load_spec().properties) - covered
    assert not missing, f"spec properties the model check does not check: {sorted(missing)}"
    assert sorted(PROPERTIES) == sorted(p.name for p in REGISTRY)
    for p in REGISTRY:
        assert p.liveness or p.producer_step or p.consumer_step or p.state, p.name


def test_a_check_reports_the_property_and_the_lane() -> None:
    """A property's check raises Fail naming the property, with the lane where it broke."""
    system = System(Bounds())
    loading = system.apply(system.initial(), ("load", 0, 0))
    assert not system.quiescent(loading)
    assert system.stuck(loading)[0] == ("engine:decode:1", "load job 2000 (c1 X) never gets a result")
    g = system.apply(system.initial(), ("store", 0))
    system.check_state(g)  # the store job is held by the parked record: it will get its result
    g = system.apply(system.initial(), ("abandon", 0))  # nothing stored, no record
    lost = g._replace(outstanding=frozenset({system.engines.store_job(0, 0)}))
    with pytest.raises(Fail) as exc:
        system.check_state(lost)
    assert exc.value.prop == "exactly_once_job_result" and exc.value.lane == "producer"
    assert "store job 1000 (X chunk 0) has no result and is held by no record" in exc.value.message


# -- structured traces ---------------------------------------------------------------------------


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_structured_trace_mirrors_the_text_trace(bug: str) -> None:
    r = check(Bounds(), bug=bug)
    assert r.violation is not None
    numbered = [line for line in r.trace if line[:5].strip().rstrip(".").isdigit()]
    assert r.steps, "a violation has structured steps"
    assert {s.n for s in r.steps} == set(range(1, len(numbered) + 1)), "every action has its steps"
    for s in r.steps:
        assert s.kind in KINDS and LANE.match(s.src) and LANE.match(s.dst) and s.label, s
        if s.kind in ("note", "violation"):
            assert s.src == s.dst
    # every action starts with what the environment did: a call, a message, a timer, a report, a fault
    for n in range(1, len(numbered) + 1):
        first = next(s for s in r.steps if s.n == n)
        assert first.kind in ("call", "msg", "timer", "result", "note"), first
    last = r.steps[-1]
    assert (last.kind, last.label) == ("violation", f"violates {r.violation.prop}")
    delivered = [line.split("deliver ", 1)[1].split("   <-- ")[0] for line in numbered if "deliver " in line]
    msgs = [s for s in r.steps if s.kind == "msg" and s.dst != "network"]
    assert [m.label for m in msgs] == [d.split(" ", 1)[1] for d in delivered]
    chart = to_chart_steps(r)
    assert chart == [{"src": s.src, "dst": s.dst, "label": s.label, "kind": s.kind, "t": None} for s in r.steps]


def test_structured_trace_of_a_write_after_abort() -> None:
    r = check(Bounds(), bug="write_after_abort")
    steps = [(s.kind, s.src, s.dst, s.label) for s in r.steps]
    assert ("call", "engine:decode:1", "consumer:1", "load(X)") in steps
    assert ("msg", "consumer:1", "producer", "fetch X r0 keys=1 g101") in steps
    assert ("timer", "clock", "consumer:1", "load deadline of consumer X") in steps
    assert steps[-2] == ("msg", "producer", "consumer:1", "block_data X r0 [0:1] g101")
    assert steps[-1] == ("violation", "consumer:1", "consumer:1", "violates no_write_after_terminal")


def test_structured_trace_of_a_stuck_load_and_a_clean_run() -> None:
    r = check(Bounds(), bug="abort_never_gives_up")
    assert ("msg", "producer", "network", "lost: abort_ack X r0 g101") in [
        (s.kind, s.src, s.dst, s.label) for s in r.steps
    ]
    assert r.steps[-1].src == "engine:decode:1"  # the engine waits for its load forever
    ok = check(Bounds(ids=1, consumers=1))
    assert ok.ok and ok.steps == () and ok.trace == () and to_chart_steps(ok) == []
    assert "ok   no_stuck_ids" in format_result(ok)


def test_python_dash_m_runs_the_check() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvtier._tools.modelcheck", "--ids", "1", "--consumers", "1", "--depth", "4"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "ok   exactly_once_job_result" in out.stdout
