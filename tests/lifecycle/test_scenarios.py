"""Recorded scenarios (tools.scenarios): each one runs two real managers on a virtual
clock, asserts its outcomes, and its recorded trace IS the committed chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import diagrams, scenarios, seqchart
from tools.scenarios import SCENARIOS, Harness, Scenario, ScenarioFailed, record
from tools.spec import load

SPEC = load()
BY_NAME = {s.name: s for s in SCENARIOS}

#: The situations the review page shows (in this order).
REQUIRED = [
    "happy_path",
    "fetch_before_store",
    "chunked_prefill",
    "late_fetch_after_reap",
    "abort_racing_completion",
    "transfer_stalled",
    "peer_killed_mid_transfer",
    "shutdown_in_flight",
]


def test_every_required_scenario_exists_in_review_order() -> None:
    names = [s.name for s in SCENARIOS]
    assert [n for n in names if n in REQUIRED] == REQUIRED
    assert not set(scenarios.AWAITING) & set(names)


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_scenario_holds_and_its_chart_is_its_recorded_trace(name: str) -> None:
    s = BY_NAME[name]
    trace = record(s, SPEC)
    assert trace.checks, "a scenario must assert something"
    assert trace.checks[-1].startswith("every job (")  # the exactly-once check ran
    assert all(p in SPEC.properties for p in s.properties)
    dot = seqchart.render_dot(scenarios.LANES, trace.steps(), s.title)
    committed = diagrams.diagram_dir() / "scenarios" / f"{name}.dot"
    assert committed.read_text() == dot, f"diagrams/scenarios/{name}.dot is stale: run `python -m tools diagram`"


def test_the_recorder_sees_real_wire_messages_calls_results_and_deadlines() -> None:
    trace = record(BY_NAME["happy_path"], SPEC)
    steps = trace.steps()
    msgs = [s.label for s in steps if s.kind == "msg"]
    # protocol v2: the consumer's receipt ends a round (the producer sends no transfer_done(ok))
    assert msgs == ["hello", "hello_ack", "fetch(A, r0, 4 keys)", "block_data(A, r0, blocks [0:4])",
                    "receipt(A, r0)"]
    # the store job succeeds only on the consumer's receipt, so after the load
    assert [s.label for s in steps if s.kind == "result"] == ["job 10 ok", "job 1 ok"]
    assert [(s.src, s.dst) for s in steps if s.kind == "call"][:2] == [("pe", "P"), ("pe", "P")]
    timers = [s for s in steps if s.kind == "timer"]
    assert len(timers) == 1 and timers[0].t == 61.0 and "A: done → pruned" in timers[0].label
    assert "A: lands 4 blocks in slots 4, 5, 6, 7 and checks their digests" in [s.label for s in steps]
    # pings are recorded but not drawn
    quiet = [s for s in trace.steps(include_quiet=True) if s.label.startswith(("ping", "pong"))]
    assert len(quiet) > 50


def test_a_message_that_never_arrives_says_so() -> None:
    steps = record(BY_NAME["peer_killed_mid_transfer"], SPEC).steps()
    data = [s.label for s in steps if s.label.startswith("block_data")]
    assert data == ["block_data(A, r0, blocks [0:1])", "block_data(A, r0, blocks [1:2])\n(never delivered)"]
    # no deadline fired: the transport saw the connection close and the session ended at once (B11)
    assert [s.label for s in steps if s.kind == "timer"] == []
    labels = [s.label for s in steps]
    closed = labels.index("transport: connection_closed with producer")
    assert labels[closed + 1] == "session with producer: ready → dead"
    assert "job 10 failed (peer_disconnected)" in labels[closed:]
    # no terminal answer came: the load fails only once the plane confirmed no write can land
    notes = [s.label for s in steps if s.kind == "note"]
    assert notes.index("A: in_flight → revoking") < notes.index("A: revoking → failed")


def test_a_scenario_that_stops_showing_its_outcome_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a reap timeout shorter than the time to the fetch, the happy path is no longer happy:
    its recording fails instead of drawing a different chart."""
    monkeypatch.setitem(scenarios.SCEN_CFG, "unbound_store_timeout_s", 0.5)
    with pytest.raises(ScenarioFailed, match="the load succeeds"):
        record(BY_NAME["happy_path"], SPEC)


def test_a_job_without_exactly_one_result_fails_the_scenario() -> None:
    def never_fetched(h: Harness) -> None:
        req = h.prefill.request("p-A", "A")
        h.prefill.store(1, req, [b"k"], [0])
        h.settle()

    s = Scenario("never_fetched", "t", "d", (), never_fetched)
    with pytest.raises(ScenarioFailed, match="job 1 got 0 results"):
        record(s, SPEC)


def test_scenario_registration_rules() -> None:
    with pytest.raises(ValueError, match="docstring"):
        scenarios.scenario("t")(lambda h: None)
    with pytest.raises(ValueError, match="registered twice"):
        scenarios.scenario("t")(BY_NAME["happy_path"].run)
    bad = Scenario("x", "t", "d", ("no_such_property",), BY_NAME["happy_path"].run)
    with pytest.raises(ValueError, match="unknown properties"):
        record(bad, SPEC)


def test_review_page_lists_each_scenario_with_its_chart_and_asserted_outcomes() -> None:
    page = (diagrams.docs_dir() / "review.md").read_text()
    for s in SCENARIOS:
        assert f"../diagrams/scenarios/{s.name}.svg" in page
        assert s.title in page
    for name in scenarios.AWAITING:
        assert f"`{name}`" in page
