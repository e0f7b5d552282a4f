"""What a consumer says on the wire when one manager runs a PD load and a symmetric round side by
side: the two never share a round number (one counter per manager, decision I11), and a round's
load — whose blocks a probe reply offered — fetches and aborts with ``offered`` set, its round the
probe's, no life (a symmetric round pairs no producer request, decision I20) and no watermark
(``low`` 0: the producer's round ledger guards parked PD bindings only).

Two real cores on the symmetric harness (tests/symmetric/harness.py); the consumer ``C`` also loads
a PD id from ``P``.
"""

from __future__ import annotations

from kvtier.lifecycle import ProbeState
from kvtier.lifecycle import inputs as ix
from kvtier.wire import messages as wm
from tests.lifecycle.test_probe_rounds import KEYS, K, pair, to_state
from tests.symmetric.harness import SymNet
from tools.coreview import CoreView


def _sent(net: SymNet, kind: type) -> list:
    return [e.msg for e in net.pending("C", "P") if isinstance(e.msg, kind)]


def _pd_then_round() -> tuple[SymNet, int]:
    """``C`` loads PD id ``pd`` from ``P`` (its fetch waits in the network), then probes ``K`` on
    ``P`` until the reply offers KEYS[0..1], and submits the round's load of KEYS[0].  Returns the
    network and the round."""
    net = pair()
    net.engine_input("C", ix.LoadAnnounced("pd", "P"), 0.0)
    net.engine_input("C", ix.LoadSubmitted("pd", 1, (b"pd-key-0",), (7,)), 0.0)
    to_state(net, ProbeState.OFFERED)
    rnd = CoreView(net.cores["C"]).probe(K).round  # the offering round, handed to its load next
    net.queues[("C", "P")] = []  # what the settling left: nothing of the round's load yet
    net.engine_input("C", ix.LoadSubmitted(K, 5, (KEYS[0],), (0,)), 0.1)
    return net, rnd


def test_a_pd_load_and_a_symmetric_round_of_one_manager_take_distinct_rounds() -> None:
    net, rnd = _pd_then_round()
    assert (net.cores["C"].consumer("pd").round, rnd) == (0, 1)  # the PD load took the first, the probe the next
    (fetch,) = _sent(net, wm.Fetch)
    assert (fetch.kv_request_id, fetch.round) == (K, rnd)
    assert [v.round for v in net.cores["C"].round_loads(K)] == [rnd]


def test_a_rounds_load_fetches_offered_blocks_with_no_life_and_no_watermark() -> None:
    net, _ = _pd_then_round()
    # the PD load's round 0 is still open with P: a PD fetch would name it as its low watermark
    (fetch,) = _sent(net, wm.Fetch)
    assert (fetch.offered, fetch.life, fetch.low, fetch.keys) == (True, "", 0, [KEYS[0]])


def test_a_rounds_load_cancelled_aborts_with_offered_set_no_life_and_no_watermark() -> None:
    net, rnd = _pd_then_round()
    net.queues[("C", "P")] = []
    net.engine_input("C", ix.RequestFinished(K, False), 0.2)  # the request ends with its round's load out
    (abort,) = _sent(net, wm.AbortFetch)
    assert (abort.kv_request_id, abort.round, abort.fetched) == (K, rnd, True)
    assert (abort.offered, abort.life, abort.low) == (True, "", 0)
