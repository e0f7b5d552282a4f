"""A whole process stopped (SIGSTOP, a VM pause) while its peer answered (decision T17).

What reached a stopped process waits in its kernel; when it runs again, its loop may read its
sockets before the transport's own threads took that in, and a deadline that fell due during the
stop would beat an answer that had arrived long before.  The pair's ``stop``/``cont`` model that
order on the in-memory network (``InprocTransport.io_lag``); a pass late for a deadline crosses
the transport's barrier before it reads.  Virtual clock: no sleeps.
"""

from __future__ import annotations

import pytest

from mgr_helpers import digests, job, keys_for, metric
from tools.coreview import CoreView
from virtual_helpers import BB, SCEN, outcome, store

pytestmark = pytest.mark.timeout(60)

_P = {**SCEN, "peer_timeout_s": 30.0}  # the producer never gives up on the stopped consumer here
_C = {**SCEN, "peer_timeout_s": 30.0, "handshake_timeout_s": 1.0, "load_timeout_s": 6.0,
      "fetch_supply_timeout_s": 3.0}


def _parked(pairs, slots=(3, 4)):
    v = pairs(_P, _C, block_bytes=BB)
    preq, dig = store(v, "A", 1, list(slots), seed=7)
    v.P.on_request_finished(preq)
    v.step()
    return v, dig


def test_a_hello_ack_that_reached_a_stopped_consumer_beats_its_handshake_deadline(pairs):
    """The producer answers the hello while the consumer is stopped; the consumer resumes after
    its handshake_timeout_s.  Its first pass reads the hello_ack before the deadline fires: the
    session stays, and the queued load succeeds."""
    v, dig = _parked(pairs)
    C = v.C
    v.frozen.add("P")  # the hello is not answered yet
    r = v.creq("c-A", "A")
    C.on_new_request(r)
    C.submit_load(job(10, keys_for("A", 2), [0, 1], r))
    v.step()
    assert C.core.consumer_state("A").value == "queued"
    v.stop("C")
    v.frozen.discard("P")
    v.step()  # the producer answers: the hello_ack waits in the stopped consumer's kernel
    v.advance_to(2.5)  # past handshake_timeout_s (1 s)
    v.cont("C")
    v.step()
    assert outcome(v.cjobs, 10) == (True, None)
    assert digests(C.pool, [0, 1]) == dig
    assert metric(C, "kvtier_session_ends_total") == 0


def test_blocks_that_reached_a_stopped_consumer_beat_its_load_deadline(pairs):
    """The fetch left; the consumer stops; the producer sends every block and transfer_done into
    its kernel; the consumer resumes after its load_timeout_s.  The data is read and landed before
    the deadline fires: the load succeeds, nothing is aborted."""
    v, dig = _parked(pairs)
    C = v.C
    r = v.creq("c-A", "A")
    C.on_new_request(r)
    v.step()
    assert CoreView(C.core).session_ready(v.P_ADDR)
    C.submit_load(job(10, keys_for("A", 2), [0, 1], r))  # caller-driven: the fetch leaves now
    v.stop("C")
    v.step()  # the producer serves it into the stopped consumer's kernel
    v.advance_to(7.0)  # past load_timeout_s (6 s)
    v.cont("C")
    v.step()
    assert outcome(v.cjobs, 10) == (True, None)
    assert digests(C.pool, [0, 1]) == dig
    assert v.pjobs.one(1).success
    assert metric(C, "kvtier_session_ends_total") == 0


def _hello_unanswered_through_a_stop(v):
    """The producer never answers the consumer's hello; the consumer is stopped from t = 0 to
    2.5 s (past its handshake_timeout_s) and continued, not yet polled."""
    C = v.C
    v.frozen.add("P")
    r = v.creq("c-A", "A")
    C.on_new_request(r)
    C.submit_load(job(10, keys_for("A", 2), [0, 1], r))
    v.step()
    v.stop("C")
    v.advance_to(2.5)
    v.cont("C")


def test_a_producer_that_never_answered_is_still_timed_out_when_the_consumer_resumes(pairs):
    """The barrier proves nothing arrived: a hello never answered (the producer wedged through
    the consumer's stop) fails handshake_timeout in the consumer's first pass after it resumes."""
    v, _ = _parked(pairs)
    _hello_unanswered_through_a_stop(v)
    assert not v.cjobs.by_id
    v.step()
    assert v.now == 2.5
    assert outcome(v.cjobs, 10) == (False, "handshake_timeout")


def test_a_pass_late_for_a_deadline_crosses_the_barrier_once(pairs):
    """The crossing is for a late pass, not for every pass while a deadline stays overdue: a
    second pass at the same time does not cross again; a pass on time does not cross at all."""
    v, _ = _parked(pairs)
    C = v.C
    crossings = []
    real = C.transport.barrier
    C.transport.barrier = lambda t: crossings.append(v.now) or real(t)
    r = v.creq("c-A", "A")
    C.on_new_request(r)
    v.step()
    v.advance_to(1.0, tick=0.005)  # polled every 5 ms: never late by LATE_S (20 ms)
    assert crossings == []
    v.stop("C")
    v.advance_to(3.3)  # a heartbeat (every 1 s) fell due meanwhile
    v.cont("C")
    v.step()
    v.step()
    assert crossings == [3.3]


def test_a_crossing_that_proves_nothing_holds_the_deadlines_of_one_pass_only(pairs):
    """A barrier that cannot prove the kernel drained (a backlog that does not move: a full queue)
    holds that pass's deadlines, so it reads first; the next pass fires them without crossing again:
    a barrier that always fails never keeps a dead peer alive."""
    v, _ = _parked(pairs)
    C = v.C
    crossings = []
    C.transport.barrier = lambda t: crossings.append(v.now) or False
    _hello_unanswered_through_a_stop(v)
    C.poll(0)  # late: crosses, proves nothing, fires nothing
    assert crossings == [2.5] and C.get_finished_jobs(poll=False) == []
    v.clock.set(2.55)  # a caller that polls every 50 ms: its next pass is late again, for the same deadline
    C.poll(0)
    assert crossings == [2.5]
    [res] = C.get_finished_jobs(poll=False)
    assert (res.job_id, res.success, res.reason) == (10, False, "handshake_timeout")


class _Quiet:
    """A transport with nothing to read whose barrier answers ``ok`` and notes when it was asked."""

    def __init__(self, now: list[float], ok: bool = True) -> None:
        self.now, self.ok, self.crossings = now, ok, []

    def service(self, max_messages: int):
        return [], [], True

    def barrier(self, timeout_s: float) -> bool:
        self.crossings.append(self.now[0])
        return self.ok


class _NoPlane:
    one_sided = False

    def poll(self):
        return []


def _inbound(transport, now):
    from kvtier.shell.inbound import Inbound
    from kvtier.wire import Decoder

    return Inbound(transport=transport, plane=_NoPlane(), decoder=Decoder(block_bytes=64), metrics=None, logs=None,
                   clock=lambda: now[0], posted={}, work=None)  # type: ignore[arg-type]


def test_a_pass_crosses_only_when_more_than_late_s_after_the_deadline_and_the_last_crossing():
    """LATE_S (20 ms): a pass 15 ms after its deadline does not cross; one 25 ms after does, and
    dates quiet_since at the crossing; a deadline that stays due (held back by a landing) is
    crossed for again only LATE_S after the last crossing, not on every pass."""
    from kvtier.shell.inbound import LATE_S

    now = [10.015]
    t = _Quiet(now)
    inbound = _inbound(t, now)
    inbound.collect(due=10.0)
    assert t.crossings == [] and inbound.quiet_since == 10.015
    now[0] = 10.0 + LATE_S + 0.005
    inbound.collect(due=10.0)
    assert t.crossings == [now[0]] and inbound.quiet_since == now[0]
    first = now[0]
    now[0] = first + LATE_S - 0.005
    inbound.collect(due=10.0)
    assert t.crossings == [first]
    now[0] = first + LATE_S + 0.005
    inbound.collect(due=10.0)
    assert t.crossings == [first, now[0]]


def test_a_failed_crossing_leaves_quiet_since_where_it_was_and_a_transport_without_a_barrier_is_read_as_before():
    now = [3.0]
    failing = _Quiet(now, ok=False)
    inbound = _inbound(failing, now)  # quiet since 3.0
    now[0] = 5.0
    inbound.collect(due=4.0)
    assert failing.crossings == [5.0] and inbound.quiet_since == 3.0  # the deadline due at 4.0 waits
    inbound.collect(due=4.0)
    assert failing.crossings == [5.0] and inbound.quiet_since == 5.0  # held once: now it may fire

    class _Plain:
        def service(self, max_messages: int):
            return [], [], True

    now[0] = 3.0
    inbound = _inbound(_Plain(), now)
    now[0] = 5.0
    inbound.collect(due=4.0)
    assert inbound.quiet_since == 5.0
