"""The serve machine's budgets on the symmetric path, in the sans-I/O core (two cores on a fake
network, the producer's windows through the shell's real ServeWindows): what a peer may pin
(decision Y23), how many rounds it may hold, and how many keys its probes may have waiting for the
engine (Y25); and a round whose pending keys timed out.
"""

from __future__ import annotations

from kvtier.blocksource import Presence
from kvtier.lifecycle import AWAITING_KEYS_PER_PEER, REASON_DOCS, WINDOW_KEYS, Answer, ProbeState, Reason, ServeState
from kvtier.lifecycle import inputs as ix
from tests.symmetric.test_core_symmetric import KEYS, K, announce, deliver_all, hold, lookup_all, pair
from tools.coreview import CoreView


def test_pinned_budget_per_peer_offers_what_fits_and_misses_the_rest() -> None:
    """The budget bounds what is pinned, not what is asked (Y23): a probe for more keys than it
    allows gets the blocks that fit, the rest miss; with no room left a new block misses too, while
    a block pinned already is offered again."""
    net = pair(serve_max_pinned_blocks_per_peer=2)
    hold(net, 4, 10)
    announce(net)
    lookup_all(net, KEYS[:3], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    view = CoreView(net.cores["C"]).probe(K)
    assert view.state is ProbeState.OFFERED and view.offered == set(KEYS[:2]) and KEYS[2] in view.missed
    assert net.cores["P"].snapshot().serve_pinned_blocks == 2
    announce(net, kid="b")
    lookup_all(net, [KEYS[3]], 0.0, kid="b")  # a new block: no room
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert CoreView(net.cores["C"]).probe("b").missed == {KEYS[3]}
    announce(net, kid="c")
    lookup_all(net, [KEYS[0]], 0.0, kid="c")  # pinned already for "sym-1": costs nothing
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert CoreView(net.cores["C"]).probe("c").offered == {KEYS[0]}
    assert net.cores["P"].snapshot().serve_pinned_blocks == 2



def test_rounds_per_peer_budget() -> None:
    net = pair(serve_max_rounds_per_peer=1)
    net.engines["P"].blocks.update({KEYS[0]: 1, KEYS[1]: 2})
    announce(net, kid="a")
    announce(net, kid="b")
    lookup_all(net, KEYS[:1], 0.0, kid="a")
    lookup_all(net, KEYS[1:2], 0.0, kid="b")
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert CoreView(net.cores["C"]).probe("a").state is ProbeState.OFFERED
    assert CoreView(net.cores["C"]).probe("b").reason is Reason.SERVE_BUSY
    assert f"({AWAITING_KEYS_PER_PEER:,})" in REASON_DOCS[Reason.SERVE_BUSY]  # what the docs say it is



def test_a_peer_with_too_many_keys_waiting_for_the_engine_is_refused_until_they_are_answered() -> None:
    """Y25: the keys one peer's rounds wait on the engine for are bounded (AWAITING_KEYS_PER_PEER):
    a probe past it is refused serve_busy in one round trip; once the windows answered them, the
    peer's next probe is served."""
    net = pair()
    net.engines["P"].blocks[KEYS[0]] = 1
    many = [i.to_bytes(8, "big") + b"x" for i in range(AWAITING_KEYS_PER_PEER)]
    for kid in ("a", "b"):
        announce(net, kid=kid)
    for k in many:
        net.engine_input("C", ix.KeyLookedUp("a", k), 0.0)
    net.engine_input("C", ix.KeyLookedUp("b", KEYS[0]), 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0, windows=False)
    assert CoreView(net.cores["C"]).probe("b").reason is Reason.SERVE_BUSY
    assert f"({AWAITING_KEYS_PER_PEER:,})" in REASON_DOCS[Reason.SERVE_BUSY]  # what the docs say it is
    assert CoreView(net.cores["P"]).serve_state("C", "a", 0) is ServeState.LOOKING_UP
    windows = 0
    while net.windows["P"].wanted():  # the windows answer round a's keys (all miss), a budget each
        net.serve_window("P", 0.0)
        windows += 1
    assert windows == AWAITING_KEYS_PER_PEER // WINDOW_KEYS
    deliver_all(net, 0.0)
    assert CoreView(net.cores["C"]).probe_answer("a", many[0]) is Answer.MISS
    assert CoreView(net.cores["P"]).serve_state("C", "a", 0) is ServeState.ABSENT
    announce(net, kid="c")
    assert lookup_all(net, KEYS[:1], 0.0, kid="c") == [Answer.RETRY]
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert lookup_all(net, KEYS[:1], 0.0, kid="c") == [Answer.HIT]



def test_a_later_probe_of_a_round_whose_pending_keys_timed_out_is_answered_in_its_window() -> None:
    """Y25: keys still pending at the lookup deadline are answered miss and stay missing; a probe of
    new keys in the same round waits on its own keys only (it waited for another deadline)."""
    net = pair()
    eng = net.engines["P"]
    eng.blocks.update({KEYS[0]: 1, KEYS[2]: 3})
    stuck = eng.lookup
    eng.lookup = lambda k, c: Presence.PENDING if k == KEYS[1] else stuck(k, c)  # pending for good
    announce(net)
    lookup_all(net, KEYS[:2], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    net.fire("P", 0.3)
    deliver_all(net, 0.3)
    assert lookup_all(net, KEYS[:2], 0.3) == [Answer.HIT, Answer.MISS]
    net.engine_input("C", ix.KeyLookedUp(K, KEYS[2]), 0.3)  # an engine asks past the miss
    net.engine_input("C", ix.ScheduleEnded(), 0.3)
    deliver_all(net, 0.3)
    assert CoreView(net.cores["C"]).probe_answer(K, KEYS[2]) is Answer.HIT
    assert CoreView(net.cores["P"]).serve_state("C", K, 0) is ServeState.OFFERED
