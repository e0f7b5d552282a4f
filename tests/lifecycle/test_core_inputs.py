"""The core's own handling of inputs that reach no single machine: a job the shell settles, a plane
fault of another generation, the hello a later handshake announces, whether a load of ours is out,
and the end of the shutdown grace reaching every machine at its moment.
"""

from __future__ import annotations

import msgspec

from kvtier.lifecycle import ProbeState, ProducerState, Reason, SessionState
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Ignored, JobDone, Send
from kvtier.wire import messages as wm
from tests.lifecycle.scenario_pair import LOCAL, P, Pair
from tests.lifecycle.test_probe_rounds import KEYS, K, pair, to_state
from tools.coreview import CoreView


def test_a_job_the_shell_settles_is_reported_as_it_says() -> None:
    s = Pair()
    assert s.p.handle(ix.JobSettled(41, False, Reason.JOB_REFUSED), 0.0) == [JobDone(41, False, Reason.JOB_REFUSED)]
    assert s.p.handle(ix.JobSettled(42, True), 0.0) == [JobDone(42, True, None)]


def test_a_plane_fault_of_another_generation_or_peer_is_dropped_as_stale() -> None:
    s = Pair()
    assert s.c.handle(ix.PlaneFaulted(P, s.gen + 1, "old"), 1.0) == [
        Ignored("session", P, SessionState.READY, "plane_fault", Reason.STALE)]
    assert s.c.handle(ix.PlaneFaulted("nobody", s.gen), 1.0) == [
        Ignored("session", "nobody", SessionState.ABSENT, "plane_fault", Reason.STALE)]
    assert CoreView(s.c).session_ready(P)


def test_a_later_handshake_announces_the_hello_set_last() -> None:
    s = Pair()
    s.c.set_local(msgspec.structs.replace(LOCAL, instance="cons", hash_seed="seed-2"))
    assert s.c.local.hash_seed == "seed-2"
    s.c.handle(ix.Dial("prefill:2"), 1.0)
    (hello,) = [e.msg for e in s.c.handle(ix.ConnectionUp("prefill:2"), 1.0) if isinstance(e, Send)]
    assert (hello.hash_seed, hello.instance) == ("seed-2", "cons")


def test_loading_is_true_exactly_while_a_load_of_ours_is_out() -> None:
    s = Pair()
    assert not s.c.loading()
    _, rnd, _ = s.load("A", 1, 1.0)
    assert s.c.loading()
    s.done("A", rnd, 1.5, ok=False, reason="aborted")
    s.c.handle(ix.RequestFinished("A", producer=False), 1.6)
    assert not s.c.loading()


def test_the_grace_end_gives_up_what_is_live_at_that_moment() -> None:
    s = Pair()
    s.store("A", 2, 0.0)  # parked on the producer
    out = s.p.handle(ix.GraceEnded(), 5.0)
    view = CoreView(s.p).producer("A")
    assert (view.state, view.reason) == (ProducerState.TOMBSTONED, Reason.SHUTDOWN)
    assert view.deadline == 5.0 + 60.0  # tombstone_retention_s from the grace's end
    assert [(e.job_id, e.ok) for e in out if isinstance(e, JobDone)] == [(1, False)]
    assert [m.reason for m in (e.msg for e in out if isinstance(e, Send)) if isinstance(m, wm.Disconnect)] == [
        "shutdown"]


def test_a_symmetric_rounds_load_alone_counts_as_loading() -> None:
    net = pair()
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    assert not c.loading()
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.0)
    assert c.round_loads(K) and CoreView(c).consumer_ids() == []  # no PD load: only the round's
    assert c.loading()


def test_a_send_that_failed_ends_the_session() -> None:
    s = Pair()
    out = s.c.handle(ix.SendFailed(P), 1.0)
    assert [(e.peer, e.reason) for e in out if type(e).__name__ == "SessionEnded"] == [(P, Reason.SEND_FAILED)]


def test_a_landing_that_failed_its_check_aborts_the_load_as_corrupt() -> None:
    s = Pair()
    _, rnd, _ = s.load("A", 2, 1.0)
    s.to_c(wm.BlockData(gen=s.gen, kv_request_id="A", round=rnd, first=0, count=1, digests=[7]), 1.1)
    out = s.c.handle(ix.BlocksLanded(P, "A", rnd, 0, 1, ok=False), 1.2)
    view = s.c.consumer("A")
    assert (view.state.value, view.reason) == ("aborting", Reason.CORRUPT)
    assert [m.kv_request_id for m in (e.msg for e in out if isinstance(e, Send)) if isinstance(m, wm.AbortFetch)] == [
        "A"]
