"""What the metrics endpoint reads at each scrape (:meth:`TierCore.snapshot`) and the shell's
whole-core questions (``busy``, ``symmetric_work``), counted exactly on a producer and a consumer in
known states: parked, serving, tombstoned and done ids, loads in flight and revoking, sessions.

Each figure follows from the scenario: a store of ``n`` blocks pins ``n``; one fetched id waits for
one receipt; an abort tombstones with reason ``aborted``; a completed hand-off is retained as done.
"""

from __future__ import annotations

from kvtier.lifecycle import ConsumerState, ProducerState, Reason, SessionState
from kvtier.lifecycle import inputs as ix
from tests.lifecycle.scenario_pair import P, Pair, keys


def _scenario() -> tuple[Pair, int]:
    """Producer: A parked (4 blocks), B parked (2), C tombstoned (aborted), D serving (3, one store
    job waiting for its receipt), E done.  Consumer: the loads of D and E (whose bytes it is
    never shown) in flight.  Returns the pair and D's
    round."""
    s = Pair()
    s.store("A", 4, 0.0, blocks=(0, 1, 2, 3))
    s.store("B", 2, 0.0, blocks=(4, 5))
    s.abort("C", 0.0)
    s.store("D", 3, 0.0, blocks=(6, 7, 8))
    s.store("E", 1, 0.0, blocks=(9,))
    _, rnd_e, out = s.load("E", 1, 0.5)
    s.forward_fetch(out, 0.5)
    s.complete("E", rnd_e, 0.6)
    _, rnd_d, out = s.load("D", 3, 1.0)
    s.forward_fetch(out, 1.0)
    return s, rnd_d


def test_the_producer_counts_each_state_its_pinned_blocks_and_its_retained_ids() -> None:
    s, _ = _scenario()
    snap = s.p.snapshot()
    assert s.p.producer_state("D") is ProducerState.SERVING and s.p.producer_state("E") is ProducerState.DONE
    parked, serving = ProducerState.PARKED.value, ProducerState.SERVING.value
    assert snap.producer == {parked: 2, serving: 1}
    assert snap.pinned_blocks == {parked: 6, serving: 3}
    assert snap.retained == {(ProducerState.TOMBSTONED.value, Reason.ABORTED.value): 1,
                             (ProducerState.DONE.value, ""): 1}
    assert sorted(snap.parked) == ["A", "B"]
    assert snap.awaiting_receipt_jobs == 1  # D's one store job
    assert snap.sessions == {SessionState.READY.value: 1}
    assert snap.consumer == {} and snap.revoking_slots == 0 and snap.quarantined_blocks == 0
    assert snap.probe == {} and snap.serve == {} and snap.serve_pinned_blocks == 0 and snap.evicted == 0
    assert snap.deadline_entries >= 4  # A's and B's reap, C's and E's prune at least


def test_the_consumer_counts_its_loads_and_the_slots_a_revocation_holds() -> None:
    s, _ = _scenario()
    snap = s.c.snapshot()
    # D's load and E's (whose bytes never reached the consumer here) are in flight
    assert snap.consumer == {ConsumerState.IN_FLIGHT.value: 2}
    assert snap.producer == {} and snap.pinned_blocks == {} and snap.retained == {} and snap.parked == ()
    assert snap.sessions == {SessionState.READY.value: 1} and snap.revoking_slots == 0
    # a silent producer: the session dies with two loads (4 + 3 slots) out, and the consumer holds
    # their slots until its plane proves the producer's access revoked
    s = Pair(peer_timeout_s=5.0, heartbeat_interval_s=1.0)
    s.store("A", 4, 0.0)
    s.store("B", 3, 0.0)
    s.load("A", 4, 0.0)
    s.load("B", 3, 0.0)
    for t in (1.0, 2.0, 3.0, 4.0):  # heartbeats on time (a late one spares the peer, decision I35)
        s.c.fire(t)
    out = s.c.fire(5.0)
    assert s.c.consumer_state("A") is ConsumerState.REVOKING
    snap = s.c.snapshot()
    assert snap.revoking_slots == 7
    assert snap.consumer == {ConsumerState.REVOKING.value: 2}
    s.revoked(out, 5.0)
    assert s.c.snapshot().revoking_slots == 0


def test_the_counts_add_up_over_many_records_of_one_state() -> None:
    s = Pair()
    for i in range(5):
        s.store(f"R{i}", 2, 0.0, blocks=(2 * i, 2 * i + 1))
    snap = s.p.snapshot()
    assert snap.producer == {ProducerState.PARKED.value: 5}
    assert snap.pinned_blocks == {ProducerState.PARKED.value: 10}
    for i in range(3):
        s.abort(f"R{i}", 1.0)
    snap = s.p.snapshot()
    assert snap.producer == {ProducerState.PARKED.value: 2}
    assert snap.retained == {(ProducerState.TOMBSTONED.value, Reason.ABORTED.value): 3}


def test_busy_while_a_transfer_is_in_flight_on_either_side_and_not_after() -> None:
    s = Pair()
    s.store("A", 2, 0.0)
    s.c.handle(ix.LoadAnnounced("X", P), 0.0)
    assert s.c.consumer_state("X") is ConsumerState.ANNOUNCED
    assert not s.p.busy() and not s.c.busy()  # parked and announced are not in flight
    _, rnd, out = s.load("A", 2, 1.0)
    assert s.c.busy()  # the consumer's load is in flight
    s.forward_fetch(out, 1.0)
    assert s.p.busy()  # the producer serves it
    s.complete("A", rnd, 1.5)
    assert not s.p.busy()
    assert not s.p.symmetric_work() and not s.c.symmetric_work()  # nothing symmetric here


def test_an_id_fetched_before_its_blocks_are_stored_is_counted_as_awaiting_not_parked() -> None:
    s = Pair()
    s.store("A", 1, 0.0)
    s.fetch("A", keys("A", 2), 0.5)  # the consumer wants a block not stored yet
    snap = s.p.snapshot()
    assert s.p.producer_state("A") is ProducerState.AWAITING
    assert snap.parked == () and snap.producer == {ProducerState.AWAITING.value: 1}
    assert snap.pinned_blocks == {ProducerState.AWAITING.value: 1}


def test_the_records_view_shows_each_producer_records_binding_consumer_and_receipt() -> None:
    s = Pair()
    s.store("D", 3, 0.0, blocks=(6, 7, 8))
    s.store("N", 1, 0.0, blocks=(9,), consumer="alice")
    s.abort("C", 0.0)
    _, rnd, out = s.load("D", 3, 1.0)
    s.forward_fetch(out, 1.0)
    s.receipt("D", rnd, 1.5)  # the consumer's receipt, before the plane released D's blocks
    views = {v.kv_request_id: v for v in s.p.records().producers}
    d = views["D"]
    assert d.state is ProducerState.CONFIRMED and d.reason is None and d.receipt is True
    assert (d.peer, d.gen, d.round) == ("decode-1", s.gen, rnd)
    assert d.demand == keys("D", 3) and d.parked == keys("D", 3) and d.consumer is None
    n = views["N"]
    assert n.state is ProducerState.PARKED and n.consumer == "alice" and n.receipt is False
    assert (n.peer, n.gen, n.round, n.demand) == (None, 0, -1, ())
    c = views["C"]
    assert c.state is ProducerState.TOMBSTONED and c.reason is Reason.ABORTED and c.receipt is False
    assert c.peer is None and c.demand == () and c.deadline is not None  # its prune


def test_every_fetched_ids_store_jobs_wait_for_its_receipt() -> None:
    s = Pair()
    s.store("A", 1, 0.0, blocks=(0,))
    s.store("A", 1, 0.0, start=1, blocks=(1,))  # two store jobs for A
    s.store("B", 1, 0.0, blocks=(2,))
    for kid, n in (("A", 2), ("B", 1)):
        _, _, out = s.load(kid, n, 1.0)
        s.forward_fetch(out, 1.0)
    snap = s.p.snapshot()
    assert snap.producer == {ProducerState.SERVING.value: 2}
    assert snap.awaiting_receipt_jobs == 3
