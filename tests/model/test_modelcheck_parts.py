"""The model checker's parts, each at its seam: interned core exports, the transport model, abstract
time, the network's budgets, the property registry, and the structured counterexample trace."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.effects import CancelTransfer, JobDone, SendBlocks
from tools import snapshot
from tools.modelcheck import (
    PROFILES,
    PROPERTIES,
    REGISTRY,
    Bounds,
    chart_dot,
    chart_steps,
    check,
    encoding,
    format_result,
    main,
    to_chart_steps,
)
from tools.modelcheck.encoding import timeless
from tools.modelcheck.properties import Fail
from tools.modelcheck.reduction import visit_key
from tools.modelcheck.state import State
from tools.modelcheck.system import System
from tools.modelcheck.trace import KINDS
from tools.modelcheck.transport import HELD, REFUSED, TAKEN, Transfer, after_effects, after_report, reports
from tools.planted import PLANTED
from tools.spec import load as load_spec

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
        again = cores.restore(snap)
        assert timeless(snapshot.export(again)) == snap
        assert snapshot.index_problems(again) == []
        assert snapshot.indexes(again) == snapshot.indexes(cores.restore(snap))
    p = cores.snaps[g.p]
    assert [(e.kv_request_id, e.state.value, e.deadline) for e in p.producer] == [("X", "parked", float("inf"))]
    assert [(e.peer, e.state.value) for e in p.sessions] == [("c1", "ready"), ("c2", "ready")]


def test_core_steps_are_memoised() -> None:
    system = System(Bounds())
    g = system.initial()
    before = system.cores.core_steps
    a = system.apply(g, ("store", 0))
    ran = system.cores.core_steps - before
    assert ran == 2  # store, then request_finished
    b = system.apply(g, ("store", 0))
    assert a == b and system.cores.core_steps - before == ran


def test_the_model_refuses_core_state_the_export_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    class Grown(TierCore):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self._producer.new_field = {}  # type: ignore[attr-defined]

    monkeypatch.setattr(encoding, "TierCore", Grown)
    with pytest.raises(RuntimeError, match=r"does not export: \['producer.new_field'\]"):
        System(Bounds())


# -- transport -----------------------------------------------------------------------------------


def test_transport_reports_of_a_transfer() -> None:
    t = Transfer(0, "X", 3, 101, (5,))
    assert reports(t, failures=True, completion=False, session_ended=False) == ("released", "failed")
    assert reports(t, failures=False, completion=False, session_ended=True) == ("released",)
    # as a completion step (the liveness search), only once the session that carried it ended
    assert reports(t, failures=True, completion=True, session_ended=False) == ()
    assert reports(t, failures=True, completion=True, session_ended=True) == ("released",)


def test_transport_follows_send_and_cancel() -> None:
    consumers = {"c1": 0, "c2": 1}
    t = after_effects((), (SendBlocks("c2", "Y", 1, (7,), gen=102), JobDone(5, True)), consumers)
    assert t == (Transfer(1, "Y", 1, 102, (7,)),)
    t = after_effects(t, (SendBlocks("c1", "X", 0, (3,), gen=101), SendBlocks("elsewhere", "Z", 0, (1,))), consumers)
    assert t == (Transfer(0, "X", 0, 101, (3,)), Transfer(1, "Y", 1, 102, (7,)))  # sorted; unknown peers carry nothing
    # a cancel stops the posting, not the references: only a report ends them
    assert after_effects(t, (CancelTransfer("Y", 1),), consumers) == t
    assert after_report(t, Transfer(1, "Y", 1, 102, (7,))) == (Transfer(0, "X", 0, 101, (3,)),)


def _serving(system: System) -> State:
    g = system.initial()
    for action in (("store", 0), ("load", 0, 0), ("deliver", 1, 0)):  # the fetch reaches the producer
        g = system.apply(g, action)
    return g


def test_references_outlive_a_cancel_until_the_plane_reports() -> None:
    """Through the composed system: serving, the consumer aborts, the producer cancels; the plane
    keeps its references (no completion step releases them while the session is up) until it
    reports; then the producer gives its terminal answer."""
    system = System(Bounds(transfer_failures=False))
    g = _serving(system)
    t = Transfer(0, "X", 0, 101, (0,))
    assert g.transfers == (t,)
    assert [a for a in system.actions(g, True) if a[0] == "transport"] == [("transport", t, "released")]
    g = system.apply(g, ("c_finished", 0, 0))  # the consumer's engine gives up: abort_fetch queued
    g = system.apply(g, ("deliver", 1, 0))
    assert system.cores.summaries[g.p].producer["X"][0] == "cancelling" and g.transfers == (t,)
    assert not [a for a in system.actions(g, False) if a[0] == "transport"], "the session is up: not a completion step"
    g = system.apply(g, ("transport", t, "released"))
    assert g.transfers == () and system.cores.summaries[g.p].producer["X"][0] == "tombstoned"
    assert system.cores.msgs[g.chans[0][-1]].kind == "abort_ack"  # the terminal answer, only now


def test_a_release_is_a_completion_step_once_the_session_is_gone() -> None:
    """The quarantine path: the cancel deadline ends the session (give_up), and only then may the
    liveness search count on the plane's release."""
    system = System(Bounds())
    g = _serving(system)
    t = g.transfers[0]
    for timer in ("transfer", "cancel"):  # serving -> cancelling -> quarantined (+ give_up)
        g = system.apply(g, ("fire", "p", "producer", "X", ""))
    assert system.cores.summaries[g.p].producer["X"][0] == "quarantined"
    assert "c1" not in system.cores.summaries[g.p].sessions, "force_release ended the session"
    assert ("transport", t, "released") in list(system.actions(g, False))
    g = system.apply(g, ("transport", t, "released"))
    assert system.cores.summaries[g.p].producer["X"][0] == "tombstoned" and not g.outstanding - {2000}


def test_the_consumer_shell_lands_blocks_and_answers_at_once() -> None:
    """A block_data is landed in the step that reads it (blocks_landed), the load succeeds and its
    receipt goes out; with the corrupt fault the round is remembered and the load aborts."""
    system = System(Bounds())
    g = _serving(system)
    ok = system.apply(g, ("deliver", 0, 0))
    assert system.cores.summaries[ok.c[0]].consumer["X"][0] == "loaded"
    assert [system.cores.msgs[m].kind for m in ok.chans[1]] == ["receipt"]
    assert ("corrupt", 0, 0) in system.network.faults(g)
    bad = system.apply(g, ("corrupt", 0, 0))
    assert system.cores.summaries[bad.c[0]].consumer["X"][0] == "aborting"
    assert bad.corrupted == frozenset({(0, 0, 0)}) and bad.faults == (0, 1)


def test_a_one_sided_plane_confirms_revocation_later() -> None:
    for one_sided in (False, True):
        system = System(Bounds(one_sided=one_sided, crashes=1))
        g = _serving(system)
        g = system.apply(g, ("crash", 0))  # the consumer's load: in_flight -> revoking
        state = system.cores.summaries[g.c[0]].consumer["X"][0]
        if not one_sided:
            assert state == "failed" and g.revokes == ()
            continue
        assert state == "revoking" and g.revokes == (0,)
        assert ("revoked", 0) in list(system.actions(g, False))
        g = system.apply(g, ("revoked", 0))
        assert system.cores.summaries[g.c[0]].consumer["X"][0] == "failed" and g.revokes == ()


# -- clock and network ---------------------------------------------------------------------------


def test_any_armed_deadline_may_fire() -> None:
    system = System(Bounds())
    g = system.apply(system.initial(), ("store", 0))
    fires = system.clock.actions(g, True)
    assert ("fire", "p", "producer", "X", "") in fires  # the parked id's reap deadline
    assert not any(a[2] == "session" for a in fires), "a silent heartbeat is a crash; pings are off"
    crashy = System(Bounds(crashes=1))
    g = crashy.apply(crashy.initial(), ("store", 0))
    silent = [a for a in crashy.clock.actions(g, True) if a[2] == "session"]
    assert ("fire", "p", "session", "c1", "silent") in silent and ("fire", "c1", "session", "p", "silent") in silent
    assert not any(a[2] == "session" for a in crashy.clock.actions(g, False)), "not a completion step"
    pinging = System(Bounds(pings=True))
    g = pinging.initial()
    heard = [a for a in pinging.clock.actions(g, False) if a[2] == "session"]
    assert heard == [("fire", "c1", "session", "p", ""), ("fire", "c2", "session", "p", "")], \
        "the dialled side pings (a completion step); the accepting side's heartbeat changes nothing"
    g = pinging.apply(g, heard[0])
    assert [pinging.cores.msgs[m].kind for m in g.chans[1]] == ["ping"]
    assert ("fire", "c1", "session", "p", "") not in pinging.clock.actions(g, True), "one ping in flight"
    g = pinging.apply(g, ("deliver", 1, 0))
    assert [pinging.cores.msgs[m].kind for m in g.chans[0]] == ["pong"]
    g = pinging.apply(g, ("deliver", 0, 0))
    assert g == pinging.initial(), "a ping answered leaves nothing behind"


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


def test_an_unread_message_is_read_before_the_deadlines_it_concerns() -> None:
    """Receive batching: when X's reap deadline falls due while a fetch for X waits unread in the
    producer's socket, the tick (the real driver) reads the fetch first and fires nothing due
    after the socket was last empty: X is served, not reaped.  The planted first-release tick
    fires first, and the check sees it in the code that runs."""
    system = System(Bounds())
    g = system.apply(system.initial(), ("store", 0))
    g = system.apply(g, ("load", 0, 0))
    reap = ("fire", "p", "producer", "X", "")
    assert reap in system.clock.actions(g, True)
    assert ("arrive", 1, 0) in system.network.arrivals(g)
    arrived = system.apply(g, ("arrive", 1, 0))
    fetch = arrived.chans[1][0]
    assert arrived.arrived == (0, 1, 0, 0) and system.network.unread_for(arrived, None, "X") == [(1, fetch)]
    assert system.network.unread_for(arrived, None, "c1") == [(1, fetch)], "it is from c1's session too"
    assert system.network.unread_for(arrived, 0, "X") == [], "the consumer's deadlines wait for nothing"
    assert reap in system.clock.actions(arrived, True)
    assert system.label(arrived, reap) == "timer reap of P.producer(X) fires, the tick reading first: c1->p fetch X r0 keys=1 g101"
    ticked = system.apply(arrived, reap)
    read = system.apply(arrived, ("deliver", 1, 0))
    assert ticked == read, "the tick read the fetch and the reap did not fire: the same as reading it"
    assert read.arrived == (0, 0, 0, 0) and system.cores.summaries[read.p].producer["X"][0] == "serving"


    def tick(system: System) -> State:  # core steps are memoised per system: a fresh one runs the driver
        g = system.initial()
        for a in (("store", 0), ("load", 0, 0), ("arrive", 1, 0)):
            g = system.apply(g, a)
        return system.apply(g, reap)

    with PLANTED["deadlines_before_input"]():
        with pytest.raises(Fail) as exc:
            tick(System(Bounds()))
    assert exc.value.prop == "input_before_deadline"
    again = System(Bounds())
    assert again.cores.summaries[tick(again).p].producer["X"][0] == "serving", "the planted driver is restored"


def test_an_arrival_happens_only_where_it_can_hold_a_deadline_back() -> None:
    system = System(Bounds())
    g = system.apply(system.initial(), ("load", 0, 0))  # a fetch for X, which the producer does not know
    assert system.network.arrivals(g) == [], "nothing at the producer has a deadline it could hold back"
    assert System(Bounds(batching=False)).network.arrivals(system.apply(g, ("store", 0))) == []


def test_a_pruned_id_lives_again() -> None:
    """lives=2: once X's tombstone is pruned the prefill engine stores it again (new store jobs),
    and the decode engine, once its request finished, loads it again (a new load job)."""
    system = System(Bounds(ids=1, consumers=1, lives=2))
    g = system.apply(system.initial(), ("abandon", 0))  # nothing stored: X tombstoned
    assert ("store", 0) not in system.engines.producer_actions(g, True)
    g = system.apply(g, ("fire", "p", "producer", "X", ""))  # prune
    assert ("store", 0) in system.engines.producer_actions(g, True)
    assert system.label(g, ("store", 0)) == "P.store(X life 2 chunk 0) + P.request_finished"
    g = system.apply(g, ("store", 0))
    assert g.lives == (1,) and g.outstanding == {system.engines.store_job(0, 0, 1)} == {1100}
    g = system.apply(g, ("load", 0, 0))
    g = system.apply(g, ("deliver", 1, 0))
    g = system.apply(g, ("deliver", 0, 0))  # block_data: loaded
    assert ("c_finished", 0, 0) in system.engines.consumer_actions(g, True)
    g = system.apply(g, ("c_finished", 0, 0))
    assert ("load", 0, 0) in system.engines.consumer_actions(g, True)
    g = system.apply(g, ("load", 0, 0))
    assert 2001 in g.outstanding and system.engines.describe_job(2001) == "load job 2001 (c1 X load 2)"


def test_shutdown_then_close_with_a_transfer_in_flight() -> None:
    """The producer shuts down (begin) with a transfer in flight, then its grace ends (close, a
    completion step): the session ends, the release becomes a completion step, and messages to the
    closed producer are dropped unread."""
    system = System(Bounds(shutdown=True))
    g = _serving(system)
    assert ("shutdown", 0) in system.engines.operator_actions(g, True)
    g = system.apply(g, ("shutdown", 0))
    assert ("store", 1) not in system.engines.producer_actions(g, True), "no new work after shutdown()"
    assert system.cores.summaries[g.p].producer["X"][0] == "serving", "work in flight goes on (in_grace)"
    assert ("close", 0) in system.engines.operator_actions(g, False)
    g = system.apply(g, ("close", 0))
    assert system.cores.summaries[g.p].producer["X"][0] == "cancelling" and g.shut[0] == 2
    assert ("transport", g.transfers[0], "released") in list(system.actions(g, False))
    g = system.apply(g, ("load", 1, 1))  # c2 fetches from the closed producer: dropped
    assert system.label(g, ("deliver", 3, 0)).endswith("(dropped: the receiver has closed)")
    p_before = g.p
    g = system.apply(g, ("deliver", 3, 0))
    assert g.p == p_before and g.chans[3] == ()


def test_a_connection_close_ends_both_sessions() -> None:
    system = System(Bounds(crashes=1))
    g = _serving(system)
    assert ("cut", 0) in system.network.crashes(g)
    g = system.apply(g, ("cut", 0))
    assert g.crashes == 0
    assert "c1" not in system.cores.summaries[g.p].sessions and "p" not in system.cores.summaries[g.c[0]].sessions
    assert system.cores.summaries[g.p].producer["X"][0] == "cancelling"
    assert ("transport", g.transfers[0], "released") in list(system.actions(g, False))


def test_a_finished_pair_is_one_state_however_it_finished() -> None:
    """The search merges states that differ only in how a finished pair ended (visit_key)."""
    system = System(Bounds())
    g = system.initial()
    assert visit_key(system, g) == g, "no pair finished"
    ends = []
    prune = ("fire", "p", "producer", "X", "")
    for path in (
        [("abandon", 0), ("load", 0, 0), ("deliver", 1, 0), ("deliver", 0, 0), prune],  # failed: nothing_stored
        [("store", 0), ("load", 0, 0), ("deliver", 1, 0), ("deliver", 0, 0), ("deliver", 1, 0), "release", prune],
    ):
        h = g
        for a in path:
            h = system.apply(h, ("transport", h.transfers[0], "released") if a == "release" else a)
        assert not [a for a in system.actions(h, True) if system.owner[a[0]].process_of(a) == 0]
        ends.append(h)
    assert ends[0] != ends[1] and visit_key(system, ends[0]) == visit_key(system, ends[1])
    assert visit_key(system, ends[0])[0][0] == "finished"
    assert visit_key(System(Bounds(reduce=False)), ends[0]) == ends[0]


# -- properties ----------------------------------------------------------------------------------


def test_every_spec_property_is_checked() -> None:
    """Every spec property is checked by the model check, or — what the model does not explore
    (the engine's lookup contexts, a landing answered steps after it started, a data-plane fault;
    decision M14) — by the symmetric harness or the PD stateful suite, which raise a violation
    naming it."""
    covered = {name for p in REGISTRY for name in p.covers}
    assert covered >= {"probe_answered_in_bound", "pin_released_once", "no_hit_without_pin", "no_block_after_release",
                       "partial_keys_verified", "failed_keys_miss", "instance_fate_proven", "release_never_dropped"}
    tests = Path(__file__).resolve().parents[1]
    harness = (tests / "symmetric" / "harness.py").read_text()
    symmetric = {name for name in load_spec().properties if f'PropertyViolation(f"{name}:' in harness
                 or f'PropertyViolation("{name}:' in harness}
    assert symmetric - covered == {"lookup_context_closed_once", "result_after_last_write"}
    stateful = (tests / "stateful" / "honest.py").read_text()
    pd = {name for name in load_spec().properties if f'f"{name}:' in stateful}
    assert pd - covered == {"result_after_last_write", "plane_fault_ends_session"}
    missing = set(load_spec().properties) - covered - symmetric - pd
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


# the searches that find a planted bug run once per session (tests/model/conftest.py)
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_structured_trace_mirrors_the_text_trace(bug: str, planted_checks) -> None:
    r = planted_checks(bug)
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
    delivered = []
    for line in numbered:  # a delivery, or the unread messages a tick reads before its deadlines
        if "deliver " in line:
            delivered.append(line.split("deliver ", 1)[1].split("   <-- ")[0])
        elif "the tick reading first: " in line:
            delivered.extend(line.split("the tick reading first: ", 1)[1].split("   <-- ")[0].split("; "))
    msgs = [s for s in r.steps if s.kind == "msg" and s.dst != "network"]
    assert [m.label for m in msgs] == [d.split(" ", 1)[1] for d in delivered]
    chart = to_chart_steps(r)
    assert chart == [{"src": s.src, "dst": s.dst, "label": s.label, "kind": s.kind, "t": None} for s in r.steps]


def test_structured_trace_of_a_write_after_abort(planted_checks) -> None:
    r = planted_checks("write_after_abort")  # check(Bounds(), bug="write_after_abort")
    steps = [(s.kind, s.src, s.dst, s.label) for s in r.steps]
    assert ("call", "engine:decode:1", "consumer:1", "load(X)") in steps
    assert ("msg", "consumer:1", "producer", "fetch X r0 keys=1 g101") in steps
    assert ("timer", "clock", "consumer:1", "load deadline of consumer X") in steps
    assert steps[-3] == ("msg", "producer", "consumer:1", "block_data X r0 [0:1] g101")
    # the violating step shows what the core did: it asked to land the blocks (and, aborting,
    # recorded the landing's answer: decision I21)
    assert steps[-2] == ("note", "consumer:1", "consumer:1", "LandBlocks(X)")
    assert steps[-1] == ("violation", "consumer:1", "consumer:1", "violates no_write_after_terminal")


def test_structured_trace_of_a_stuck_load_and_a_clean_run(planted_checks) -> None:
    r = planted_checks("abort_never_gives_up")  # check(Bounds(), bug="abort_never_gives_up")
    assert ("msg", "producer", "network", "lost: abort_ack X r0 g101") in [
        (s.kind, s.src, s.dst, s.label) for s in r.steps
    ]
    assert r.steps[-1].src == "engine:decode:1"  # the engine waits for its load forever
    ok = check(Bounds(ids=1, consumers=1))
    assert ok.ok and ok.steps == () and ok.trace == () and to_chart_steps(ok) == []
    assert "ok   no_stuck_ids" in format_result(ok)


def test_python_dash_m_runs_the_check() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tools.modelcheck", "--ids", "1", "--consumers", "1", "--depth", "4"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "ok   exactly_once_job_result" in out.stdout


# -- counterexample charts -----------------------------------------------------------------------


def test_a_counterexample_chart_is_drawn_from_the_structured_steps(planted_checks) -> None:
    r = planted_checks("cancel_deadline_returns_blocks")  # check(Bounds(), bug=...), searched once
    steps = chart_steps(r)
    assert len(steps) == len(r.steps)
    for drawn, step in zip(steps, r.steps):  # a deadline is a box on its core's lane, not an arrow from the clock
        assert (drawn.src, drawn.dst, drawn.kind) == ((step.dst, step.dst) if step.kind == "timer" else (step.src, step.dst)) + (step.kind,)
    assert steps[-1].label.replace("\n", " ").startswith("no_block_returned_while_referenced: the producer reported store job 1000")
    assert all(len(line) <= 60 for line in steps[-1].label.split("\n"))
    dot = chart_dot(r)
    assert dot == chart_dot(check(Bounds(), bug="cancel_deadline_returns_blocks")), "byte-stable: a search of its own"
    assert dot.startswith("digraph seqchart {") and "python -m tools check --bug cancel_deadline_returns_blocks" in dot
    heads = re.findall(r'label="?([^"]+?)"? fillcolor="#dde6f5"', dot)
    assert heads[: len(heads) // 2] == [
        "engine (prefill)", "producer", "consumer c1", "engine (decode c1)"
    ], "only the lanes the steps use, in the model's order"
    with pytest.raises(ValueError, match="no counterexample"):
        chart_dot(check(Bounds(ids=1, consumers=1, faults=0)))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")
def test_kvtier_check_chart_writes_the_counterexample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "charts"
    assert main(["--bug", "deadlines_before_input", "--chart", str(out)]) == 1
    printed = capsys.readouterr().out
    dot, svg = out / "deadlines_before_input.dot", out / "deadlines_before_input.svg"
    assert f"chart: {dot} {svg}" in printed and "counterexample:" in printed
    text = html.unescape(svg.read_text())
    assert "<svg" in text and "input_before_deadline: a deadline of" in text and "arrived, unread: fetch X r0" in text
    assert dot.read_text() == chart_dot(check(Bounds(), bug="deadlines_before_input", profile="core"))
    assert main(["--ids", "1", "--consumers", "1", "--faults", "0", "--chart", str(tmp_path / "none")]) == 0
    assert not (tmp_path / "none").exists(), "no violation, no chart"


def test_a_sessions_life_is_explored_from_the_dial() -> None:
    """connected=False, attach_later: the first load dials; the producer's session waits in
    attaching until its plane takes (or refuses) the descriptor, then answers hello_ack; the
    consumer's session attaches the same way before its queued load fetches."""
    system = System(PROFILES["sessions"])
    g = system.initial()
    s = system.cores.summaries
    assert s[g.p].sessions == {} and s[g.c[0]].sessions == {}, "no session before the first load"
    g = system.apply(g, ("load", 0, 0))
    assert s[g.c[0]].sessions["p"][0] == "handshaking" and s[g.c[0]].consumer["X"][0] == "queued"
    g = system.apply(g, ("deliver", 1, 0))  # the hello
    gen = s[g.p].sessions["c1"][1]
    assert s[g.p].sessions["c1"][0] == "attaching" and g.attaches == ((0, "c1", gen),) and g.chans[0] == ()
    acts = system.transport.attachments(g, True)
    assert {("attached", 0, "c1", gen, o) for o in (TAKEN, REFUSED, HELD)} <= set(acts)
    assert system.transport.attachments(g, False) == [("attached", 0, "c1", gen, TAKEN)], \
        "a refusal is not a completion step"
    refused = system.apply(g, ("attached", 0, "c1", gen, REFUSED))
    assert "c1" not in s[refused.p].sessions and system.cores.msgs[refused.chans[0][0]].kind == "hello_reject"
    # refused for now (decision N25): the reject says so, and the consumer's queued load dials once more
    held = system.apply(g, ("attached", 0, "c1", gen, HELD))
    reject = system.cores.msgs[held.chans[0][0]]
    assert reject.kind == "hello_reject" and "session_still_held" in repr(reject), reject
    held = system.apply(held, ("deliver", 0, 0))
    assert s[held.c[0]].consumer["X"][0] == "queued" and s[held.c[0]].sessions["p"][0] == "handshaking", \
        "a load refused for now dials again"
    g = system.apply(g, ("attached", 0, "c1", gen, TAKEN))
    assert s[g.p].sessions["c1"][0] == "ready" and system.cores.msgs[g.chans[0][0]].kind == "hello_ack"
    g = system.apply(g, ("deliver", 0, 0))  # the hello_ack: the consumer's plane takes the producer's
    assert s[g.c[0]].sessions["p"][0] == "attaching" and g.attaches == ((1, "p", gen),)
    assert ("fire", "c1", "session", "p", "") in system.clock.actions(g, True), "the handshake deadline"
    g = system.apply(g, ("attached", 1, "p", gen, TAKEN))
    assert s[g.c[0]].sessions["p"][0] == "ready" and s[g.c[0]].consumer["X"][0] == "in_flight"
    assert system.cores.msgs[g.chans[1][0]].kind == "fetch"
    assert ("fire", "c1", "session", "p", "") in system.clock.actions(g, False), "the heartbeat pings"
    assert ("fire", "c1", "session", "p", "silent") in system.clock.actions(g, True)
