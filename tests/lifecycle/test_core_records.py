"""What ``kvtier why`` and ``kvtier top`` read of a core (:meth:`TierCore.records`,
:meth:`TierCore.consumer`): every field of the session, consumer-load and deadline views, on a
producer and a consumer in known states.  Each value follows from the scenario (the pair's
handshake at t=0; the durations of :data:`tests.lifecycle.scenario_pair.BASE`)."""

from __future__ import annotations

from kvtier.lifecycle import ConsumerState, ProducerState, Reason, SessionState
from tests.lifecycle.scenario_pair import BASE, C, P, Pair


def test_each_session_view_names_who_dialled_the_peer_instance_principal_and_when_heard() -> None:
    s = Pair()
    (on_c,) = s.c.records().sessions
    (on_p,) = s.p.records().sessions
    assert (on_c.peer, on_c.state, on_c.gen, on_c.dialled) == (P, SessionState.READY, s.gen, True)
    assert (on_p.peer, on_p.state, on_p.gen, on_p.dialled) == (C, SessionState.READY, s.gen, False)
    # the instance each side's hello named; no authentication here, so the principal is the
    # instance on the side that checks principals (the producer) and absent on the dialler
    assert on_c.instance == "scen" and on_p.instance == "cons"
    assert on_p.principal == "cons" and on_c.principal is None
    assert on_c.heard == 0.0 and on_p.heard == 0.0
    s.store("A", 1, 2.0)
    _, _, out = s.load("A", 1, 3.0)
    s.forward_fetch(out, 3.5)
    assert s.p.records().sessions[0].heard == 3.5
    assert s.p.records().suspect == frozenset() and s.p.records().pins == frozenset()


def test_a_loads_view_carries_its_peer_deadline_and_the_reason_it_failed() -> None:
    s = Pair(peer_timeout_s=5.0, heartbeat_interval_s=1.0)
    s.store("A", 2, 0.0)
    job, rnd, _ = s.load("A", 2, 1.0)
    one = s.c.consumer("A")
    (listed,) = s.c.records().consumers
    assert one == listed  # the two reads agree (one from the machine, one from the whole-core pass)
    assert (one.kv_request_id, one.state, one.reason, one.peer) == ("A", ConsumerState.IN_FLIGHT, None, P)
    assert (one.job_id, one.round, one.slots, one.landed) == (job, rnd, (100, 101), 0)
    assert one.deadline == 1.0 + BASE["load_timeout_s"]
    # the producer goes silent: the session dies and the load waits for its slots to be revoked
    # (each heartbeat on time: one that fires late after a stall spares the peer, decision I35)
    for t in (2.0, 3.0, 4.0, 5.0):
        s.c.fire(t)
    one = s.c.consumer("A")
    assert one.state is ConsumerState.REVOKING and one.reason is Reason.PEER_TIMEOUT
    assert s.c.records().consumers == (one,)
    assert one.deadline == 5.0 + BASE["revoke_timeout_s"]


def test_every_deadline_names_its_machine_and_timer_retained_ids_their_prune() -> None:
    s = Pair()
    s.store("A", 1, 0.0)  # parked: its reap
    s.abort("C", 0.0)  # tombstoned: its prune
    deadlines = {(d.machine, d.key): (d.when, d.timer) for d in s.p.records().deadlines}
    assert deadlines[("producer", "A")] == (BASE["unbound_store_timeout_s"], "reap")
    assert deadlines[("producer", "C")] == (BASE["tombstone_retention_s"], "prune")
    assert deadlines[("session", C)] == (BASE["heartbeat_interval_s"], "heartbeat")
    assert s.p.producer_state("C") is ProducerState.TOMBSTONED
    s.load("A", 1, 2.0)
    cdl = {(d.machine, d.key): (d.when, d.timer) for d in s.c.records().deadlines}
    assert cdl[("consumer", "A")] == (2.0 + BASE["load_timeout_s"], "load")
