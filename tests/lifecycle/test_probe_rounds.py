"""The probe machine's answers a symmetric request's engine reads, effect by effect: an empty load
job succeeds in every state, a reply or a refusal naming another round is dropped and said stale,
a round's load reports its own reason when it fails, and a round that loaded leaves its keys
answerable (they are not held MISS) whether or not blocks carry digests.

Two real cores on the symmetric harness (tests/symmetric/harness.py: a fake network and engine,
the spec's properties checked at every step).
"""

from __future__ import annotations

import pytest

from kvtier.lifecycle import Answer, ProbeState, Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Ignored, JobDone, SlotsHeld
from kvtier.wire import messages as wm
from tests.symmetric.harness import SymNet, make_core
from tools.coreview import CoreView

K = "sym-r"
KEYS = [bytes([i]) * 8 for i in range(1, 4)]


def pair(*, integrity: bool = True, one_sided: bool = False) -> SymNet:
    net = SymNet()
    net.attach("C", make_core("C", integrity=integrity, one_sided=one_sided))
    net.attach("P", make_core("P", integrity=integrity, one_sided=one_sided))
    for i, k in enumerate(KEYS[:2]):
        net.engines["P"].blocks[k] = 20 + i
    return net


def settle(net: SymNet, now: float, *, windows: bool = True) -> None:
    """Deliver everything in flight both ways, opening the producer's serve window between passes."""
    for _ in range(100):
        moved = bool(list(net.directions()))
        for src, dst in net.directions():
            net.deliver(src, dst, 0, now)
        if windows and net.windows["P"].pending():
            engine = net.engines["P"]
            before = engine.opened | set(engine.pins)
            net.serve_window("P", now)
            moved = moved or before != (engine.opened | set(engine.pins))
        if not moved:
            return
    raise AssertionError("the network never went quiet")


def answers(net: SymNet, keys: list[bytes], now: float) -> list[Answer]:
    out = []
    for k in keys:
        net.engine_input("C", ix.KeyLookedUp(K, k), now)
        out.append(CoreView(net.cores["C"]).probe_answer(K, k))
    return out


def to_state(net: SymNet, state: ProbeState) -> None:
    """Drive the request's probe to ``state`` (KEYS[0], KEYS[1] held by the producer)."""
    net.engine_input("C", ix.ProbeAnnounced(K, "P"), 0.0)
    if state is ProbeState.IDLE:
        return
    if state is ProbeState.FAILED:
        answers(net, KEYS[:1], 0.0)
        net.fire("C", 5.0)  # probe_timeout_s 1.0: no probe ever left
    else:
        settle(net, 0.0, windows=False)  # the session
        answers(net, KEYS[:2], 0.0)
        if state is not ProbeState.COLLECTING:
            net.engine_input("C", ix.ScheduleEnded(), 0.0)
        if state is ProbeState.OFFERED:
            settle(net, 0.0)
    assert net.cores["C"].probe_state(K) is state


@pytest.mark.parametrize("state", [ProbeState.IDLE, ProbeState.COLLECTING, ProbeState.PROBING, ProbeState.OFFERED,
                                   ProbeState.FAILED], ids=lambda s: s.value)
def test_an_empty_load_job_of_a_symmetric_request_succeeds_at_once_in_every_state(state: ProbeState) -> None:
    net = pair()
    to_state(net, state)
    out = net.cores["C"].handle(ix.LoadSubmitted(K, 9, (), ()), 1.0)
    assert out == [JobDone(9, True, None)]
    assert net.cores["C"].probe_state(K) is state


@pytest.mark.parametrize(("state", "msg"), [
    (ProbeState.PROBING, "probe_reply"), (ProbeState.PROBING, "transfer_done"), (ProbeState.OFFERED, "transfer_done"),
])
def test_a_reply_or_refusal_naming_another_round_is_dropped_as_stale(state: ProbeState, msg: str) -> None:
    net = pair()
    to_state(net, state)
    c = net.cores["C"]
    view = CoreView(c).probe(K)
    gen = CoreView(c).session_gen("P")
    other = view.round + 1
    m = (wm.ProbeReply(gen=gen, kv_request_id=K, round=other, keys=[KEYS[0]], hits=[False]) if msg == "probe_reply"
         else wm.TransferDone(gen=gen, kv_request_id=K, round=other, ok=False, reason="offer_expired"))
    out = c.handle(ix.Received("P", m), 0.5)
    assert out == [Ignored("probe", K, state, "other_round", Reason.STALE)]
    assert CoreView(c).probe(K) == view  # nothing else changed: the open round keeps its offers


@pytest.mark.parametrize("one_sided", [False, True], ids=["receiver_applied", "one_sided"])
def test_a_rounds_load_that_fails_reports_the_reason_the_peer_gave(one_sided: bool) -> None:
    # one-sided: the producer writes the slots itself, so the load revokes its access first (a timer
    # of its own: the harness's plane confirms at once)
    net = pair(one_sided=one_sided)
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    rnd = CoreView(c).probe(K).round
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.0)
    net.deliver("C", "P", 0, 0.0)  # the round's fetch reaches the producer; its blocks are not sent
    net.queues[("P", "C")] = []
    gen = CoreView(c).session_gen("P")
    net.engine_input("C", ix.Received("P", wm.TransferDone(gen=gen, kv_request_id=K, round=rnd, ok=False,
                                                           reason="serve_busy")), 0.1)
    settle(net, 0.1)
    (r,) = net.results[5]
    assert (r.ok, r.reason, r.successful_keys) == (False, Reason.SERVE_BUSY, None)  # nothing landed


@pytest.mark.parametrize("integrity", [True, False])
def test_a_round_that_loaded_leaves_its_keys_answerable_not_missed(integrity: bool) -> None:
    net = pair(integrity=integrity)
    to_state(net, ProbeState.OFFERED)
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.0)
    settle(net, 0.0)
    while net.transfers:
        net.finish_transfer(0, 0.0)
    settle(net, 0.0)
    assert [r.ok for r in net.results[5]] == [True]
    view = CoreView(net.cores["C"]).probe(K)
    assert view.missed == frozenset() and not view.loading
    assert answers(net, KEYS[:2], 1.0) == [Answer.RETRY, Answer.RETRY]  # asked again, not held MISS


@pytest.mark.parametrize("state", [ProbeState.PROBING, ProbeState.OFFERED], ids=lambda s: s.value)
def test_a_load_naming_a_key_never_offered_fails_not_offered_and_leaves_the_round(state: ProbeState) -> None:
    net = pair()
    to_state(net, state)
    c = net.cores["C"]
    before = CoreView(c).probe(K)
    out = c.handle(ix.LoadSubmitted(K, 5, (KEYS[0], KEYS[2]), (0, 1)), 0.5)
    assert out == [JobDone(5, False, Reason.NOT_OFFERED)]
    assert CoreView(c).probe(K) == before and c.round_loads() == []


def test_keys_unanswered_when_a_round_loads_are_probed_in_a_fresh_round() -> None:
    net = pair()
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    first = CoreView(c).probe(K).round
    assert answers(net, KEYS[2:], 0.5) == [Answer.RETRY]  # a new key joins the open round
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.5)
    view = CoreView(c).probe(K)
    assert view.state is ProbeState.COLLECTING and view.round > first and not view.sent
    assert (view.unsent, view.waiting, view.offered) == ((KEYS[2],), (), frozenset())
    assert view.loading == {KEYS[0]: first, KEYS[1]: first}
    out = c.handle(ix.ScheduleEnded(), 0.6)
    gen = CoreView(c).session_gen("P")
    assert [s.msg for s in out if isinstance(getattr(s, "msg", None), wm.Probe)] == [
        wm.Probe(gen=gen, kv_request_id=K, round=view.round, keys=[KEYS[2]])]


def test_a_probe_with_no_open_round_says_round_minus_one() -> None:
    net = pair()
    to_state(net, ProbeState.OFFERED)
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.5)  # every key loads
    view = CoreView(net.cores["C"]).probe(K)
    assert (view.state, view.round, view.sent, view.unsent, view.offered) == (ProbeState.IDLE, -1, False, (),
                                                                                frozenset())
    failed = pair()
    to_state(failed, ProbeState.PROBING)
    failed.fire("C", 5.0)  # probe_timeout_s: the round is released and dropped
    view = CoreView(failed.cores["C"]).probe(K)
    assert (view.state, view.reason, view.round, view.sent) == (ProbeState.FAILED, Reason.PROBE_TIMEOUT, -1, False)


def test_every_request_probing_a_peer_learns_that_its_session_died() -> None:
    net = pair()
    to_state(net, ProbeState.IDLE)
    settle(net, 0.0, windows=False)
    c = net.cores["C"]
    for kid in ("K2", "K3"):
        c.handle(ix.ProbeAnnounced(kid, "P"), 0.1)
    c.handle(ix.RequestFinished(K, False), 0.2)  # one of three ends first
    c.handle(ix.ConnectionClosed("P"), 0.3)
    assert [(CoreView(c).probe(k).state, CoreView(c).probe(k).reason) for k in ("K2", "K3")] == [
        (ProbeState.FAILED, Reason.PEER_DISCONNECTED)] * 2


def test_a_message_for_a_rounds_load_from_another_peer_is_dropped_as_stale() -> None:
    net = pair()
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    rnd = CoreView(c).probe(K).round
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.5)  # the round's load: in flight
    (load,) = c.round_loads(K)
    (opened,) = c.handle(ix.Dial("Q"), 0.5)  # a second producer, ready too
    c.handle(ix.ConnectionUp("Q"), 0.5)
    c.handle(ix.Received("Q", wm.HelloAck(gen=opened.gen, instance="q")), 0.5)
    c.handle(ix.PeerAttached("Q", opened.gen), 0.5)
    out = c.handle(ix.Received("Q", wm.TransferDone(gen=opened.gen, kv_request_id=K, round=rnd, ok=False,
                                                    reason="aborted")), 0.6)
    assert out == [Ignored("consumer", K, load.state, "transfer_done", Reason.STALE)]
    assert c.round_loads(K) == [load]


def test_a_one_sided_rounds_load_noticed_of_a_give_up_waits_abort_ack_timeout_from_the_notice() -> None:
    # writes the producer already posted may still land: the load waits for its final answer, bounded
    net = pair(one_sided=True)
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    rnd = CoreView(c).probe(K).round
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.0)
    gen = CoreView(c).session_gen("P")
    c.handle(ix.Received("P", wm.TransferDone(gen=gen, kv_request_id=K, round=rnd, ok=False, reason="aborted",
                                              final=False)), 0.25)
    (load,) = c.round_loads(K)
    assert (load.state.value, load.deadline) == ("given_up", 0.25 + 10.0)  # abort_ack_timeout_s


def test_a_request_finished_cancels_every_round_load_still_out_after_another_ended() -> None:
    net = pair()
    net.engines["P"].blocks[KEYS[2]] = 22
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    net.engine_input("C", ix.LoadSubmitted(K, 5, (KEYS[0],), (0,)), 0.0)  # round 1's load
    while net.pending("C", "P"):
        net.deliver("C", "P", 0, 0.0)  # its fetch is served: its blocks wait in the network
    assert answers(net, KEYS[2:], 0.1) == [Answer.RETRY]
    net.engine_input("C", ix.ScheduleEnded(), 0.1)
    net.deliver("C", "P", 0, 0.1)  # the probe of round 2
    net.serve_window("P", 0.1)
    (i,) = [n for n, e in enumerate(net.pending("P", "C")) if isinstance(e.msg, wm.ProbeReply)]
    net.deliver("P", "C", i, 0.1)  # round 2's reply overtakes round 1's blocks
    net.engine_input("C", ix.LoadSubmitted(K, 6, (KEYS[2],), (1,)), 0.2)  # round 2's load
    while net.pending("P", "C"):
        net.deliver("P", "C", 0, 0.3)  # round 1's blocks land: its load ends
    assert [r.ok for r in net.results[5]] == [True]
    assert [(v.job_id, v.state.value) for v in c.round_loads(K)] == [(6, "in_flight")]
    c.handle(ix.RequestFinished(K, False), 0.4)
    assert [(v.job_id, v.state.value) for v in c.round_loads(K)] == [(6, "cancelling")]


@pytest.mark.parametrize(("integrity", "missed"), [(True, {KEYS[1]}), (False, {KEYS[0], KEYS[1]})])
def test_a_failed_rounds_load_holds_miss_exactly_the_keys_past_its_verified_prefix(integrity: bool,
                                                                                   missed: set[bytes]) -> None:
    # decision I22: a key whose block landed and matched stays the engine's; without digests nothing
    # was verified, so every key of the failed load answers MISS
    net = pair(integrity=integrity)
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    rnd = CoreView(c).probe(K).round
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.0)
    while net.pending("C", "P"):
        net.deliver("C", "P", 0, 0.0)
    first = next(e for e in net.pending("P", "C") if isinstance(e.msg, wm.BlockData) and e.msg.first == 0)
    net.queues[("P", "C")] = [first]
    net.deliver("P", "C", 0, 0.0)  # the first block lands (and, with digests, is checked)
    gen = CoreView(c).session_gen("P")
    net.engine_input("C", ix.Received("P", wm.TransferDone(gen=gen, kv_request_id=K, round=rnd, ok=False,
                                                           reason="transfer_failed")), 0.1)
    assert [r.ok for r in net.results[5]] == [False]
    assert CoreView(c).probe(K).missed == missed


def test_a_round_answered_in_parts_is_offered_once_every_key_is_answered() -> None:
    net = pair()
    to_state(net, ProbeState.PROBING)  # KEYS[0], KEYS[1] wait for their answer
    c = net.cores["C"]
    rnd, gen = CoreView(c).probe(K).round, CoreView(c).session_gen("P")
    c.handle(ix.Received("P", wm.ProbeReply(gen=gen, kv_request_id=K, round=rnd, keys=[KEYS[0]], hits=[True])), 0.1)
    view = CoreView(c).probe(K)
    assert (view.state, view.offered, view.waiting) == (ProbeState.PROBING, {KEYS[0]}, (KEYS[1],))
    c.handle(ix.Received("P", wm.ProbeReply(gen=gen, kv_request_id=K, round=rnd, keys=[KEYS[1]], hits=[False])), 0.2)
    view = CoreView(c).probe(K)  # the hit of the first part still counts
    assert (view.state, view.offered, view.missed, view.waiting) == (ProbeState.OFFERED, {KEYS[0]}, {KEYS[1]}, ())


def test_a_load_of_the_offered_part_of_a_round_still_probing_restarts_the_probe_deadline() -> None:
    net = pair()
    to_state(net, ProbeState.PROBING)
    c = net.cores["C"]
    rnd, gen = CoreView(c).probe(K).round, CoreView(c).session_gen("P")
    c.handle(ix.Received("P", wm.ProbeReply(gen=gen, kv_request_id=K, round=rnd, keys=[KEYS[0]], hits=[True])), 0.1)
    net.engine_input("C", ix.LoadSubmitted(K, 5, (KEYS[0],), (0,)), 0.3)
    view = CoreView(c).probe(K)  # KEYS[1], still unanswered, goes to a fresh round, bounded from now
    assert (view.state, view.unsent, view.deadline) == (ProbeState.COLLECTING, (KEYS[1],), 0.3 + 1.0)
    assert view.round > rnd and view.loading == {KEYS[0]: rnd}


def test_a_probe_reply_from_another_peer_or_for_no_probe_is_dropped() -> None:
    net = pair()
    to_state(net, ProbeState.PROBING)
    c = net.cores["C"]
    rnd = CoreView(c).probe(K).round
    (opened,) = c.handle(ix.Dial("Q"), 0.0)
    c.handle(ix.ConnectionUp("Q"), 0.0)
    c.handle(ix.Received("Q", wm.HelloAck(gen=opened.gen, instance="q")), 0.0)
    c.handle(ix.PeerAttached("Q", opened.gen), 0.0)
    before = CoreView(c).probe(K)
    reply = wm.ProbeReply(gen=opened.gen, kv_request_id=K, round=rnd, keys=list(KEYS[:2]), hits=[True, True])
    assert c.handle(ix.Received("Q", reply), 0.1) == [Ignored("probe", K, ProbeState.PROBING, "probe_reply",
                                                              Reason.STALE)]
    assert CoreView(c).probe(K) == before
    other = wm.ProbeReply(gen=opened.gen, kv_request_id="nobody", round=0, keys=[KEYS[0]], hits=[True])
    assert c.handle(ix.Received("Q", other), 0.1) == [Ignored("probe", "nobody", ProbeState.ABSENT, "probe_reply",
                                                              Reason.NO_RECORD)]


def test_a_load_job_with_more_keys_than_slots_is_refused_by_name() -> None:
    net = pair()
    to_state(net, ProbeState.IDLE)
    with pytest.raises(ValueError, match=r"^load job 5: 2 keys but 1 slots$"):
        net.cores["C"].handle(ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0,)), 0.0)


def test_a_key_looked_up_again_while_its_probe_is_out_is_not_probed_twice() -> None:
    net = pair()
    to_state(net, ProbeState.PROBING)
    c = net.cores["C"]
    assert answers(net, KEYS[:2], 0.1) == [Answer.RETRY, Answer.RETRY]
    view = CoreView(c).probe(K)
    assert (view.state, view.unsent, view.waiting) == (ProbeState.PROBING, (), tuple(KEYS[:2]))
    assert c.handle(ix.ScheduleEnded(), 0.2) == []


def test_an_announced_probe_has_no_open_round_and_a_second_announce_is_dropped() -> None:
    net = pair()
    to_state(net, ProbeState.IDLE)
    c = net.cores["C"]
    view = CoreView(c).probe(K)
    assert (view.state, view.peer, view.round, view.sent, view.unsent, view.waiting) == (
        ProbeState.IDLE, "P", -1, False, (), ())
    assert c.handle(ix.ProbeAnnounced(K, "P"), 0.1) == [Ignored("probe", K, ProbeState.IDLE, "announce",
                                                                Reason.STALE)]


def test_a_round_never_probed_releases_nothing_at_its_deadline() -> None:
    net = pair()
    net.engine_input("C", ix.ProbeAnnounced(K, "P"), 0.0)
    settle(net, 0.0, windows=False)  # the session is ready; the key waits for the step's end
    answers(net, KEYS[:1], 0.0)
    out = net.cores["C"].fire(5.0)
    assert not [e for e in out if isinstance(getattr(e, "msg", None), wm.AbortFetch)]
    assert net.cores["C"].probe_state(K) is ProbeState.FAILED


def test_a_key_being_loaded_is_not_probed_again() -> None:
    net = pair()
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    rnd = CoreView(c).probe(K).round
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.0)  # not delivered: loading
    net.engine_input("C", ix.KeyLookedUp(K, KEYS[0]), 0.1)
    view = CoreView(c).probe(K)
    assert (view.state, view.unsent, view.loading) == (ProbeState.IDLE, (), {KEYS[0]: rnd, KEYS[1]: rnd})


def test_shutdown_and_close_end_every_probe() -> None:
    for last in (ix.ShutdownStarted(), ix.GraceEnded()):
        net = pair()
        to_state(net, ProbeState.OFFERED)
        c = net.cores["C"]
        c.handle(ix.ProbeAnnounced("K2", "P"), 0.0)
        c.handle(last, 1.0)
        assert c.probe_ids() == []


@pytest.mark.parametrize("bounded", [True, False], ids=["revoke_bounded", "revoke_unbounded"])
def test_a_one_sided_rounds_load_whose_session_died_waits_for_its_revocation_as_the_plane_allows(
        bounded: bool) -> None:
    # the producer could still write the slots: the result waits for the plane's proof; a plane that
    # withdraws access by itself fails the load at revoke_timeout_s, one that cannot holds the slots
    net = SymNet()
    net.attach("C", make_core("C", one_sided=True, revoke_bounded=bounded))
    net.attach("P", make_core("P", one_sided=True))
    net.engines["P"].blocks.update({KEYS[0]: 20, KEYS[1]: 21})
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    rnd = CoreView(c).probe(K).round
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.0)
    out = c.handle(ix.ConnectionClosed("P"), 1.0)  # the plane's confirmation never comes
    assert not [e for e in out if isinstance(e, JobDone)]
    (load,) = c.round_loads(K)
    assert (load.state.value, load.deadline) == ("revoking", 1.0 + 10.0)  # revoke_timeout_s
    out = c.fire(11.0)
    if bounded:
        assert [e for e in out if isinstance(e, JobDone)] == [JobDone(5, False, Reason.PEER_DISCONNECTED)]
    else:
        # held, said so, and the producer dialled again: a handshake it accepts is the proof (N25)
        assert [type(e).__name__ for e in out] == ["SlotsHeld", "OpenConnection"], out
        assert out[0] == SlotsHeld("P", (K, rnd), 2) and out[1].peer == "P"
        assert c.round_loads(K)[0].state.value == "revoking"


def test_a_peers_error_naming_a_symmetric_request_fails_its_open_round_and_its_rounds_loads() -> None:
    net = pair()
    net.engines["P"].blocks[KEYS[2]] = 22
    to_state(net, ProbeState.OFFERED)
    c = net.cores["C"]
    net.engine_input("C", ix.LoadSubmitted(K, 5, (KEYS[0],), (0,)), 0.0)  # round 1's load, its fetch not delivered
    answers(net, KEYS[2:], 0.1)
    c.handle(ix.ScheduleEnded(), 0.1)  # a second round's probe is out
    assert c.probe_state(K) is ProbeState.PROBING
    gen = CoreView(c).session_gen("P")
    out = c.handle(ix.Received("P", wm.Error(gen=gen, reason="bad_field", detail="", kv_request_id=K)), 0.2)
    assert [(j.job_id, j.ok, j.reason) for j in out if isinstance(j, JobDone)] == [(5, False, Reason.PEER_ERROR)]
    view = CoreView(c).probe(K)
    assert (view.state, view.reason, view.round) == (ProbeState.FAILED, Reason.PEER_ERROR, -1)
    # an error from another peer about the request changes nothing
    other = pair()
    to_state(other, ProbeState.PROBING)
    oc = other.cores["C"]
    (opened,) = oc.handle(ix.Dial("Q"), 0.0)
    oc.handle(ix.ConnectionUp("Q"), 0.0)
    oc.handle(ix.Received("Q", wm.HelloAck(gen=opened.gen, instance="q")), 0.0)
    oc.handle(ix.PeerAttached("Q", opened.gen), 0.0)
    before = CoreView(oc).probe(K)
    assert oc.handle(ix.Received("Q", wm.Error(gen=opened.gen, reason="bad_field", detail="", kv_request_id=K)),
                     0.2) == []
    assert CoreView(oc).probe(K) == before


def test_a_peers_error_fails_the_managers_first_round_too_and_notes_the_peer_heard() -> None:
    net = pair()
    to_state(net, ProbeState.PROBING)  # the manager's first round: 0
    c = net.cores["C"]
    assert CoreView(c).probe(K).round == 0
    gen = CoreView(c).session_gen("P")
    c.handle(ix.Received("P", wm.Error(gen=gen, reason="bad_field", detail="", kv_request_id=K)), 0.7)
    view = CoreView(c).probe(K)
    assert (view.state, view.reason) == (ProbeState.FAILED, Reason.PEER_ERROR)
    assert CoreView(c).session("P").heard == 0.7
    stale = c.handle(ix.Received("P", wm.Error(gen=gen + 1, reason="bad_field", detail="", kv_request_id=K)), 0.8)
    assert stale == [Ignored("session", "P", CoreView(c).session_state("P"), "message", Reason.STALE)]


@pytest.mark.parametrize("kind", ["block_data", "abort_ack"])
def test_block_data_or_an_abort_ack_for_a_probed_request_with_no_round_load_is_stale(kind: str) -> None:
    net = pair()
    to_state(net, ProbeState.PROBING)
    c = net.cores["C"]
    rnd, gen = CoreView(c).probe(K).round, CoreView(c).session_gen("P")
    msg = (wm.BlockData(gen=gen, kv_request_id=K, round=rnd, first=0, count=1) if kind == "block_data"
           else wm.AbortAck(gen=gen, kv_request_id=K, round=rnd))
    assert c.handle(ix.Received("P", msg), 0.5) == [Ignored("probe", K, ProbeState.PROBING, kind, Reason.STALE)]
    assert c.probe_state(K) is ProbeState.PROBING


@pytest.mark.parametrize("state", [ProbeState.COLLECTING, ProbeState.PROBING, ProbeState.OFFERED],
                         ids=lambda s: s.value)
def test_a_steps_lookups_carried_by_its_end_answer_as_one_by_one_lookups_do(state: ProbeState) -> None:
    """Y26: the step's lookups ride ``ScheduleEnded``; keys the probe holds are dropped unapplied
    (a no-op in these states), a new one registers and leaves in the step's probe, and every key
    answers as it would have after one ``KeyLookedUp`` per key."""
    twin = {}
    for how in ("one_by_one", "carried"):
        net = pair()
        to_state(net, state)
        keys = (KEYS[1], KEYS[0], KEYS[2])  # two held already, KEYS[2] new
        if how == "one_by_one":
            for k in keys:
                net.engine_input("C", ix.KeyLookedUp(K, k), 0.0)
            eff = net.engine_input("C", ix.ScheduleEnded(), 0.0)
        else:
            eff = net.engine_input("C", ix.ScheduleEnded(((K, keys),)), 0.0)
        view = CoreView(net.cores["C"])
        twin[how] = ([view.probe_answer(K, k) for k in KEYS], view.probe(K).state, eff)
    assert twin["carried"] == twin["one_by_one"]
    assert twin["carried"][1] is ProbeState.PROBING
