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
from kvtier.lifecycle.effects import Ignored, JobDone
from kvtier.wire import messages as wm
from tests.symmetric.harness import SymNet, make_core
from tools.coreview import CoreView

K = "sym-r"
KEYS = [bytes([i]) * 8 for i in range(1, 4)]


def pair(*, integrity: bool = True) -> SymNet:
    net = SymNet()
    net.attach("C", make_core("C", integrity=integrity))
    net.attach("P", make_core("P", integrity=integrity))
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


def test_a_rounds_load_that_fails_reports_the_reason_the_peer_gave() -> None:
    net = pair()
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
