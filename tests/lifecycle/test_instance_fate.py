"""A rank's refusal and the instance's other ranks (decision I37): the refusal of a rank the
instance already outlived condemns nothing; a condemnation pings the other ranks; a rank that
answers again makes its next refusal count (scenario B11 is in test_sessions.py)."""

from __future__ import annotations

from kvtier.lifecycle import Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import JobDone, OpenConnection
from kvtier.wire import messages as wm
from tests.lifecycle.test_sessions import P, core, dial, load, of, sends
from tools.coreview import CoreView


def test_a_refusal_its_instance_already_outlived_condemns_it_no_more() -> None:
    """Rank 0 of an instance is dead and refuses every dial; rank 1 lives.  The first refusal
    condemns the instance (B11: the pod may be gone), rank 1 heard since proves it outlived rank
    0, so rank 0's later refusals condemn nothing: rank 1's loads go out (decision I37).  Once
    rank 0 answers again, its next refusal is news again."""
    c = core()
    dial(c, P, instance="prod-1")
    dial(c, "prefill:2", instance="prod-1")
    c.handle(ix.ConnectionClosed(P), 1.0)
    c.handle(ix.Dial(P), 2.0)
    c.handle(ix.ConnectFailed(P, "refused"), 2.1)
    assert CoreView(c).suspect_instances() == frozenset({"prod-1"})
    gen2 = CoreView(c).session_gen("prefill:2")
    c.handle(ix.Received("prefill:2", wm.Pong(gen=gen2, t=3.0)), 3.0)  # rank 1 lives
    for i, t in enumerate((4.0, 5.0, 6.0)):  # loads for rank 0 keep coming, each dial refused
        out = load(c, f"R0-{i}", 10 + i, t)
        assert of(c.handle(ix.ConnectFailed(P, "refused"), t + 0.01) + out, JobDone) == [
            JobDone(10 + i, False, Reason.CONNECT_REFUSED)]
        assert CoreView(c).suspect_instances() == frozenset()
        out = load(c, f"R1-{i}", 20 + i, t + 0.02, "prefill:2")
        assert of(out, JobDone) == [] and [s.msg.kv_request_id for s in sends(out)] == [f"R1-{i}"]
    dial(c, P, 7.0, instance="prod-1")  # rank 0 is back under the same name
    c.handle(ix.ConnectionClosed(P), 8.0)
    c.handle(ix.Dial(P), 8.5)
    c.handle(ix.ConnectFailed(P, "refused"), 8.6)  # and dead again: that proves something again
    assert CoreView(c).suspect_instances() == frozenset({"prod-1"})


def test_a_refusal_pings_the_instances_other_ready_ranks_so_a_live_one_lifts_it_in_a_round_trip() -> None:
    c = core()
    dial(c, P, instance="prod-1")
    dial(c, "prefill:2", instance="prod-1")
    dial(c, "elsewhere:1", instance="prod-1")  # the same name on another host shares no fate (I33)
    c.handle(ix.ConnectionClosed(P), 1.0)
    c.handle(ix.Dial(P), 2.0)
    out = c.handle(ix.ConnectFailed(P, "refused"), 2.1)
    gen2 = CoreView(c).session_gen("prefill:2")
    assert [(s.peer, type(s.msg)) for s in sends(out)] == [("prefill:2", wm.Ping)]
    c.handle(ix.Received("prefill:2", wm.Pong(gen=gen2, t=2.1)), 2.102)
    assert CoreView(c).suspect_instances() == frozenset()


def test_a_rank_that_answers_again_is_news_again_even_after_another_rank_was_refused_meanwhile() -> None:
    """Ranks A, B, C: A refused, C heard (A outlived); B refused while A is away; A answers a
    hello_ack again; A's next refusal must condemn the pod (an outside tester found A still counted
    as outlived: the branch that remembered B never forgot A)."""
    a, b, cc = "prefill:1", "prefill:2", "prefill:3"
    c = core()
    for peer in (a, b, cc):
        dial(c, peer, instance="pod")

    def refuse(peer: str, t: float) -> None:
        c.handle(ix.ConnectionClosed(peer), t)
        c.handle(ix.Dial(peer), t + 0.1)
        c.handle(ix.ConnectFailed(peer, "refused"), t + 0.2)

    def hear(peer: str, t: float) -> None:
        c.handle(ix.Received(peer, wm.Pong(gen=CoreView(c).session_gen(peer), t=t)), t)

    refuse(a, 1.0)
    hear(cc, 2.0)  # the pod outlived A
    refuse(b, 3.0)
    dial(c, a, 4.0, instance="pod")  # A is back (heard: the pod lives, and it outlived B)
    assert CoreView(c).suspect_instances() == frozenset()
    refuse(a, 5.0)  # A dies again: news
    assert CoreView(c).suspect_instances() == frozenset({"pod"})


def test_a_load_refused_for_now_dials_once_more_and_a_second_refusal_fails_it() -> None:
    """A load queued behind a handshake the producer refuses for now (session_still_held: it still
    held another session of ours, right after a stall) dials once more instead of failing (N25); a
    second refusal fails it, so a producer dialled under two names, which refuses every time, costs
    one extra dial, not a loop."""
    c = core()

    def refuse(t: float) -> list:
        (opened,) = [e for e in out if isinstance(e, OpenConnection)]
        c.handle(ix.ConnectionUp(P), t)
        reject = wm.HelloReject(gen=opened.gen, reason="session_still_held", field="descriptor", ours="still_held",
                                theirs="")
        return c.handle(ix.Received(P, reject), t + 0.01)

    out = load(c, "A", 1, 0.0)
    out = refuse(0.1)
    assert of(out, JobDone) == [] and len(of(out, OpenConnection)) == 1  # dialled again, still queued
    assert c.consumer_state("A").value == "queued"
    out = refuse(0.2)
    assert of(out, JobDone) == [JobDone(1, False, Reason.SESSION_STILL_HELD)] and of(out, OpenConnection) == []


def test_a_name_that_does_not_resolve_condemns_no_instance() -> None:
    """A resolver's failure says nothing about the producer: unlike a refused dial, it leaves the
    instance unsuspected, so the next load dials again instead of failing at once (T21)."""
    c = core()
    dial(c, P, instance="prod-1")
    c.handle(ix.ConnectionClosed(P), 1.0)
    c.handle(ix.Dial(P), 2.0)
    out = c.handle(ix.ConnectFailed(P, "cannot resolve", unresolved=True), 2.1)
    assert CoreView(c).suspect_instances() == frozenset()
    assert of(out, JobDone) == []
    out = load(c, "after", 5, 3.0)
    assert of(out, OpenConnection) and of(out, JobDone) == []
