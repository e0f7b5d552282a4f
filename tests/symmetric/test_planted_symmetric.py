"""The stateful suite finds planted bugs of the symmetric path (so its checks can fail): each bug
is patched into the real machine for one run of tests/symmetric/test_stateful_symmetric.py's
state machine, which must report a violation of the property named."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from contextlib import ExitStack

from kvtier.lifecycle import Reason
from kvtier.lifecycle.consumer import ConsumerMachine
from kvtier.lifecycle.probe import ProbeMachine
from kvtier.lifecycle.serve import ServeMachine
from tests.symmetric.harness import PropertyViolation
from tests.symmetric.test_stateful_symmetric import Symmetric, SymmetricHonest
from tools.planted import PLANTED


def _drain_keeps_pins(self, rec, inp, reason, now, out):  # vLLM p2p's reset_cache bug
    if reason is not Reason.DRAINED:
        self._release(rec, False, reason or Reason.TRANSFER_FAILED, out)


_original_probe_message = ProbeMachine.message


def _hit_after_withdraw(self, peer, event, inp, now, out):  # the peer's withdrawal is not listened to
    if event.value == "transfer_done":
        return
    _original_probe_message(self, peer, event, inp, now, out)


def _serve_unpinned_guard(self, rec, inp, now):  # any probed key counts as offered ...
    return all(k in rec.keys for k in inp.keys)


def _serve_unpinned_effect(self, rec, inp, reason, now, out):  # ... served from a block it never pinned
    from kvtier.lifecycle.effects import SendBlocks
    from kvtier.lifecycle.serve import transfer_key

    key = transfer_key(rec.peer, rec.kv_request_id)
    self.transfers[(key, rec.round)] = rec.key
    blocks = tuple(rec.found.get(k, 99) for k in rec.demand)
    out.append(SendBlocks(rec.peer, rec.kv_request_id, rec.round, blocks, rec.gen, (), rec.slots, key, True))


def _partial_unverified(self, rec):  # every key of the fetch reported as landed
    return (rec.keys if rec.n_landed else None), ()


def _planted(name: str):
    """A planted bug of tools.planted, as a monkeypatch-style entry of BUGS."""
    return [(None, name, None)]


BUGS = {
    "drain_keeps_pins": ([(ServeMachine, "effect_fail_pins", _drain_keeps_pins)], "pin_released_once"),
    "hit_after_withdraw": ([(ProbeMachine, "message", _hit_after_withdraw)], "no_hit_without_pin"),
    "serve_unpinned": ([(ServeMachine, "guard_fetch_offered", _serve_unpinned_guard),
                        (ServeMachine, "effect_start_transfer", _serve_unpinned_effect)],
                       # a fetch taken before its lookups answered also leaves their context open, and
                       # a transfer started without the real effect's pin bookkeeping leaves a pin
                       # held (or its serve record, at quiescence): whichever the hunt meets first
                       # names the bug (which it meets depends on the derandomized seed, a digest of
                       # the machine's source, and on what ran before in the worker)
                       "no_block_after_release|lookup_context_closed_once|pin_released_once|"
                       "serve records left at quiescence"),
    "partial_unverified": ([(ConsumerMachine, "_verified_prefix", _partial_unverified)], "partial_keys_verified"),
    # tools.planted's bugs of the symmetric path (also hunted by the model check and tests/stateful)
    "partial_keys_unverified": (_planted("partial_keys_unverified"), "partial_keys_verified"),
    "failed_keys_not_missed": (_planted("failed_keys_not_missed"), "failed_keys_miss"),
}
HONEST = {"partial_keys_unverified", "failed_keys_not_missed", "partial_unverified"}
"""hunted with corrupt blocks and late landings (:class:`SymmetricHonest`)"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_stateful_suite_finds_the_planted_bug(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    patches, prop = BUGS[bug]
    with ExitStack() as stack:
        for cls, name, fn in patches:
            if cls is None:
                stack.enter_context(PLANTED[name]())
            else:
                monkeypatch.setattr(cls, name, fn)
        _hunt(prop, SymmetricHonest if bug in HONEST else Symmetric)


def _hunt(prop: str, machine: type) -> None:
    # the honest hunts need a corrupt block before its landing: shorter examples, more of them.
    # Run alone, the serve_unpinned hunt meets its bug after ~750 examples (the machine reads the
    # answers the shell publishes, decision W12); a hunt stops at the bug, so the margin costs nothing.
    # The derandomized search is not the same in every process: after the real-manager tests of
    # this directory ran in the same worker, its draws part from a lone run's at the fourth
    # example (same hash seed; cause not found), so what a hunt costs is what it costs on average.
    # Measured over six random seeds each (examples to the bug, median): partial_keys_unverified
    # ~530 with blocks corrupted only by the rule, ~50 with some corrupt from the setup on (a CI run
    # had spent 86 s on it); failed_keys_not_missed ~135 → ~110; partial_unverified ~375 → ~280.
    # 4000 leaves a wide margin.
    examples, steps = (4000, 15) if machine is SymmetricHonest else (2000, 30)
    with pytest.raises((PropertyViolation, AssertionError), match=prop):
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, database=None, derandomize=True,
            phases=(Phase.generate,),  # finding is the point; a shrunk counterexample is not needed here
            suppress_health_check=list(HealthCheck)))
