"""A request announced before its producer's session ended (decision I39): a session that was up
and ended leaves the request announced, and its load dials afresh — a producer restarted at the
address serves it; a dial of the request's own that failed answers it.  The core is driven by
hand (helpers of ``test_sessions``), so each transport event arrives exactly when the test says.
"""

from __future__ import annotations

from kvtier.lifecycle import Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import JobDone, OpenConnection
from kvtier.wire import messages as wm
from tests.lifecycle.test_sessions import P, core, dial, of, sends


def test_a_request_announced_before_its_producer_restarted_is_loaded_from_the_restarted_one() -> None:
    """The session an announced request named ends after it was up (the producer was killed):
    nothing was asked of it yet, so the request stays announced; its load dials afresh and a
    producer restarted at the address serves it — it is not failed on the old session's end (I39)."""
    c = core()
    dial(c, P, instance="prod-1")
    c.handle(ix.LoadAnnounced("A", P), 0.5)
    c.handle(ix.ConnectionClosed(P), 1.0)  # killed: proves nothing
    assert c.consumer_state("A").value == "announced"
    out = c.handle(ix.LoadSubmitted("A", 1, (b"k0",), (5,)), 2.0)
    assert of(out, JobDone) == [] and [e.peer for e in of(out, OpenConnection)] == [P]
    (opened,) = of(out, OpenConnection)
    c.handle(ix.ConnectionUp(P), 2.1)
    c.handle(ix.Received(P, wm.HelloAck(gen=opened.gen, instance="prod-2")), 2.1)  # the restarted one
    out = c.handle(ix.PeerAttached(P, opened.gen), 2.1)
    assert [s.msg.kv_request_id for s in sends(out) if isinstance(s.msg, wm.Fetch)] == ["A"]


def test_a_request_whose_own_dial_failed_is_answered_by_it() -> None:
    """The dial an announce made was refused before the session was ever ready: that is the
    request's answer (its lookups miss; a load fails with it, dialling nothing more)."""
    c = core()
    c.handle(ix.LoadAnnounced("B", "prefill:9"), 3.0)  # dials
    c.handle(ix.ConnectFailed("prefill:9", "refused"), 3.01)
    assert c.consumer_state("B").value == "failed"
    out = c.handle(ix.LoadSubmitted("B", 2, (b"k0",), (6,)), 3.1)
    assert of(out, OpenConnection) == [] and of(out, JobDone) == [JobDone(2, False, Reason.CONNECT_REFUSED)]

