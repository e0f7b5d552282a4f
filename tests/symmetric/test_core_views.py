"""What ``kvtier why`` reads of a symmetric round in the core (:meth:`TierCore.records`,
:meth:`TierCore.round_loads`): the probe's peer, round and key lists as the round moves from
collecting to probing to offered, a serve record's reason while it winds down, and one request's
round loads among another's."""

from __future__ import annotations

from kvtier.lifecycle import ProbeState, Reason, ServeState
from kvtier.lifecycle import inputs as ix
from tests.symmetric.test_core_symmetric import KEYS, K, announce, deliver_all, deliver_dir, hold, lookup_all, pair


def offered():
    """A pair whose consumer holds the producer's offer of KEYS[:3] (blocks 10-12) for ``K``."""
    net = pair()
    hold(net, 3, 10)
    announce(net)
    lookup_all(net, KEYS, 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    return net


def test_the_probe_view_follows_its_keys_from_collected_to_sent_to_answered() -> None:
    net = pair()
    cons = net.cores["C"]
    hold(net, 3, 10)
    announce(net)
    lookup_all(net, KEYS, 0.0)
    (v,) = cons.records().probes
    assert (v.state, v.peer, v.round, v.sent, v.unsent, v.waiting) == (
        ProbeState.COLLECTING, "P", 0, False, tuple(KEYS), ())
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0, windows=False)  # the probe left; the producer has not answered
    (v,) = cons.records().probes
    assert (v.state, v.peer, v.round, v.sent, v.unsent, v.waiting) == (
        ProbeState.PROBING, "P", 0, True, (), tuple(KEYS))
    deliver_all(net, 0.0)
    (v,) = cons.records().probes
    assert (v.state, v.sent, v.unsent, v.waiting) == (ProbeState.OFFERED, True, (), ())
    assert v.offered == frozenset(KEYS[:3]) and v.missed == frozenset(KEYS[3:])


def test_a_serve_cancelled_while_its_blocks_move_shows_why() -> None:
    net = offered()
    prod = net.cores["P"]
    net.engine_input("C", ix.LoadSubmitted(K, 7, tuple(KEYS[:3]), (0, 1, 2)), 0.0)
    deliver_dir(net, "C", "P", 0.0)
    (v,) = prod.records().serves
    assert (v.state, v.reason) == (ServeState.SERVING, None)
    net.engine_input("C", ix.RequestFinished(K, False), 0.0)  # the consumer gives the round up
    deliver_dir(net, "C", "P", 0.0)
    (v,) = prod.records().serves
    assert (v.state, v.reason) == (ServeState.CANCELLING, Reason.ABORTED)


def test_round_loads_of_one_request_leave_out_the_others() -> None:
    net = pair()
    cons = net.cores["C"]
    hold(net, 3, 10)
    for kid in (K, "sym-2"):
        announce(net, kid=kid)
        lookup_all(net, KEYS, 0.0, kid=kid)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    net.engine_input("C", ix.LoadSubmitted(K, 7, tuple(KEYS[:3]), (0, 1, 2)), 0.0)
    net.engine_input("C", ix.LoadSubmitted("sym-2", 8, tuple(KEYS[:2]), (3, 4)), 0.0)
    assert [(v.kv_request_id, v.job_id) for v in cons.round_loads(K)] == [(K, 7)]
    assert [(v.kv_request_id, v.job_id) for v in cons.round_loads("sym-2")] == [("sym-2", 8)]
    assert sorted(v.job_id for v in cons.round_loads()) == [7, 8]


def test_the_consumer_count_adds_a_rounds_load_to_the_plain_loads_in_the_same_state() -> None:
    net = offered()
    cons = net.cores["C"]
    net.engine_input("C", ix.LoadSubmitted(K, 7, tuple(KEYS[:3]), (0, 1, 2)), 0.0)
    # and a prefill/decode load of an id the same peer parked
    net.engine_input("P", ix.StoreSubmitted("pd-1", "req-pd", 50, (b"pd-key",), (20,)), 0.0)
    net.engine_input("C", ix.LoadAnnounced("pd-1", "P"), 0.0)
    net.engine_input("C", ix.LoadSubmitted("pd-1", 9, (b"pd-key",), (5,)), 0.0)
    assert cons.consumer("pd-1").state.value == "in_flight" and len(cons.round_loads(K)) == 1
    assert cons.snapshot().consumer == {"in_flight": 2}
