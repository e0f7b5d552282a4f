"""The promotion-during-reset interleaving of decision V5, on the sans-I/O cores (no threads, no
sockets, so the order is the test's, not the scheduler's).

A consumer's probe was answered (three keys offered, pinned by the producer's engine); vLLM's
lookup of an offered key starts that key's promotion, a load of that key alone; before the fetch
reaches the producer, the producer's engine resets its cache (``drain_jobs``).  By the rules the
load closes its round (the other offers are forgotten), the drained round's pin is released once,
failed, and the fetch is refused; the load fails ``drained`` once; the loaded key then answers
MISS for the request's life and is never probed again; the two forgotten keys answer RETRY, go out
in a fresh round, and the reset producer answers MISS one round trip later.
"""

from __future__ import annotations

from kvtier.lifecycle import Answer, Reason, ServeState
from kvtier.lifecycle import inputs as ix
from tests.symmetric.test_core_symmetric import KEYS, K, announce, deliver_all, finish_transfers, hold, lookup_all, pair
from tools.coreview import CoreView


def _probes(net) -> list[str]:
    return [e for e in net.log if "deliver C->P probe " in e]


def test_a_promotion_started_before_the_producer_reset_fails_drained_and_its_keys_miss_in_one_round_trip() -> None:
    net = pair()
    engine = net.engines["P"]
    hold(net, 3, 20)
    announce(net)
    lookup_all(net, KEYS[:3], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert CoreView(net.cores["P"]).serve_state("C", K, 0) is ServeState.OFFERED
    (pin,) = engine.pins
    assert lookup_all(net, KEYS[:3], 0.0) == [Answer.HIT] * 3

    # vLLM promotes the first offered key: a load of that key alone, its fetch not yet delivered
    net.engine_input("C", ix.LoadSubmitted(K, 7, (KEYS[0],), (0,)), 0.0)
    # the producer's engine resets its cache first: the unfetched round is drained
    net.engine_input("P", ix.DrainStarted(), 0.0)
    assert engine.released == {pin: False}
    engine.blocks.clear()
    deliver_all(net, 0.0)
    finish_transfers(net, 0.0)

    (result,) = net.results[7]  # exactly one result, and it says why
    assert not result.ok and result.reason is Reason.DRAINED and not result.successful_keys
    refusals = [e for e in net.log if "deliver P->C transfer_done sym-1 r0 fail" in e]
    # the fetch moved nothing, and was told the drain too (it crossed the notice, decision Y22)
    assert [e.split()[-2] for e in refusals] == ["drained", "drained"]
    assert not net.transfers
    assert engine.released == {pin: False}  # released once, failed

    # the loaded key: MISS from now on, never probed again
    assert lookup_all(net, KEYS[:1], 0.0) == [Answer.MISS]
    # the forgotten offers: RETRY, one fresh round carrying just those two, MISS one round trip later
    assert lookup_all(net, KEYS[1:3], 0.0) == [Answer.RETRY, Answer.RETRY]
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert [p.split()[4] for p in _probes(net)] == ["r0", "r1"]
    assert lookup_all(net, KEYS[1:3], 0.0) == [Answer.MISS]
    assert lookup_all(net, KEYS[2:3], 0.0) == [Answer.MISS]
    assert lookup_all(net, KEYS[:1], 0.0) == [Answer.MISS]
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert len(_probes(net)) == 2  # a missed key is never asked for again
    net.check("C", K, KEYS[:3], 0.0)
    net.quiet_checks("P")
