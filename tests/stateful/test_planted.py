"""Test the tests: the stateful suite must FIND every planted bug (``tools.planted``) and
shrink it to a short counterexample (style anchors rule 14; Hypothesis' own
``test_bad_machines_fail``).

Each bug is hunted with the same rules, invariants and liveness teardown as
``test_interleavings.py``, on a smaller configuration (one id, one consumer, two chunks, the
stop/peer-failure rules left out, and an opening step that stores and/or loads the id), with a
fixed seed (``derandomize=True``) and a bounded number of examples, so a run is deterministic and
takes seconds.  The shrunk counterexample must be at most 10 steps.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tools.planted import PLANTED
from stateful_model import make_machine

Hunt = make_machine(("A",), ("c1",), full=False, opening=True, chunks=2, quiet_sessions=True)
# the hunts of decisions I21 and I23 keep the one rule each needs: a block landing corrupt, a disconnect
HUNTS = {
    "partial_keys_unverified": make_machine(("A",), ("c1",), full=False, opening=True, chunks=2, quiet_sessions=True,
                                            keep=("corrupt_block",)),
    "disconnect_condemns_instance": make_machine(("A",), ("c1",), full=False, opening=True, chunks=2,
                                                 quiet_sessions=True, keep=("peer_failure",)),
}

# bug -> the property whose check must fire (a substring of the failure message)
EXPECTED = {
    "bind_ignores_tombstone": "no_bytes_for_tombstoned",
    "dup_ack_releases_twice": "exactly_once_job_result",
    "reap_forgets_jobs": "job",  # the invariant or the liveness teardown, whichever comes first
    "prune_before_retention": "",  # late_fetch_one_rtt or tombstoned_never_reparks
    "write_after_abort": "no_write_after_terminal",
    "store_reparks_tombstone": "",  # tombstoned_never_reparks or late_fetch_one_rtt
    "success_without_receipt": "no_success_without_receipt",
    "abort_ignores_round": "lives_never_mix",
    "deadlines_before_input": "input_before_deadline",
    "partial_keys_unverified": "partial_keys_verified",
    "disconnect_condemns_instance": "instance_fate_proven",
}
# abort_never_gives_up needs a lost abort_ack after a timed-out load: a deep, rare interleaving
# that the bounded hunt does not reach reliably.  `python -m tools check` finds it in every run
# (tests/model/test_modelcheck.py); HYPOTHESIS_PROFILE=explore finds it here too.
NOT_HUNTED = {"abort_never_gives_up"}
# cancel_deadline_returns_blocks needs a transfer left alone past its transfer and cancel
# deadlines while the consumer neither times out nor reads the notice: since the round watermark
# and the notice (decisions I11, I19) the bounded hunt reaches it only after ~70-90 s (measured:
# 1500 examples of 60 steps, or 2000 of 25 with a jump-to-deadline rule); the model check finds
# it in 235 states in every run (tests/model/test_modelcheck.py)
NOT_HUNTED |= {"cancel_deadline_returns_blocks"}
# the symmetric path's planted bugs (tools/planted.py PROFILE_OF): this suite drives PD hand-offs
# only; the model check's symmetric profile finds them (tests/model/test_modelcheck_symmetric.py)
# and tests/symmetric/test_planted_symmetric.py plants its own in the symmetric stateful machine
NOT_HUNTED |= {"serve_releases_pins_at_cancel", "reply_hits_unpinned", "failed_keys_not_missed"}
# bugs that need a longer quiet stretch (a transfer left alone past two deadlines while nothing
# else happens) get more examples; the seed stays fixed, so the run stays deterministic
EXAMPLES: dict[str, int] = {}

HUNT_SETTINGS = settings(
    max_examples=2000,
    stateful_step_count=25,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    # no explain phase: once a hunt fails, Hypothesis traces every later example (sys.settrace) to
    # explain the failure's lines, and each hunt is meant to fail; untraced, the same hunts find
    # and shrink the same counterexamples in ~40 % of the CPU (decision V8)
    phases=[p for p in Phase if p is not Phase.explain],
)


def steps_of(exc: BaseException) -> list[str]:
    """The rule calls of Hypothesis' (shrunk) failure report, invariant checks left out."""
    notes = getattr(exc, "__notes__", [])
    return [
        n
        for n in notes
        if n.startswith("state.")
        and not n.startswith(("state.teardown", "state.bounded_bookkeeping", "state.jobs_without_result",
                                "state.producer_indexes"))
    ]


def test_every_planted_bug_is_hunted_or_explained() -> None:
    assert set(EXPECTED) | NOT_HUNTED == set(PLANTED)


def test_the_hunt_passes_on_the_real_core() -> None:
    run_state_machine_as_test(Hunt, settings=settings(HUNT_SETTINGS, max_examples=200))


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_the_stateful_suite_finds_the_planted_bug(bug: str) -> None:
    t0 = time.perf_counter()
    with PLANTED[bug](), pytest.raises(AssertionError) as info:
        run_state_machine_as_test(HUNTS.get(bug, Hunt),
                                  settings=settings(HUNT_SETTINGS, max_examples=EXAMPLES.get(bug, 2000)))
    elapsed = time.perf_counter() - t0
    steps = steps_of(info.value)
    report = "\n".join(steps)
    assert EXPECTED[bug] in str(info.value), str(info.value)
    assert 1 <= len(steps) <= 10, f"{bug}: shrunk to {len(steps)} steps:\n{report}"
    print(f"{bug}: found in {elapsed:.1f} s, {len(steps)} steps: {str(info.value).splitlines()[0]}\n{report}")
