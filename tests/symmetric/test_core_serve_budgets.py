"""The serve machine's budgets on the symmetric path, in the sans-I/O core (two cores on a fake
network, the producer's windows through the shell's real ServeWindows): what a peer may pin
(decision Y23), how many rounds it may hold, and how many keys its probes may have waiting for the
engine (Y25); and a round whose pending keys timed out.
"""

from __future__ import annotations

from kvtier.blocksource import Presence
from kvtier.lifecycle import REASON_DOCS, Answer, ProbeState, Reason, ServeState
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


def _probe_keys(net, kid: str, keys, now: float = 0.0) -> None:
    """The consumer's engine looks ``keys`` up for ``kid`` in one step (its probes leave back to
    back, 4,096 keys a message) — without the per-key checks of ``lookup_all``."""
    announce(net, kid=kid)
    for k in keys:
        net.engine_input("C", ix.KeyLookedUp(kid, k), now)
    net.engine_input("C", ix.ScheduleEnded(), now)


def _answer_all(net) -> None:
    """Run the producer's windows until none is wanted, then deliver everything (the harness's
    ``deliver_all`` stops at a window that opens and pins nothing: all misses)."""
    while net.windows["P"].wanted():
        net.serve_window("P", 0.0)
    deliver_all(net, 0.0)


def _counting(net) -> list[int]:
    """Counts each serve window's engine lookups (one entry per window)."""
    eng, seen = net.engines["P"], []
    look = eng.lookup

    def counted(k, ctx):
        seen[-1] += 1
        return look(k, ctx)

    eng.lookup = counted
    run = net.serve_window

    def window(name, now):
        seen.append(0)
        return run(name, now)

    net.serve_window = window
    return seen


def test_a_round_longer_than_what_may_wait_gets_the_hits_it_reaches_and_misses_the_rest() -> None:
    """Y25: a peer's rounds may have four lookup budgets' keys waiting for the engine (the budget:
    its pin reach, at least 4,096 keys); a round's probes past that are answered miss without
    asking the engine, never refused — an honest long prompt keeps its hits (Y23) — and each window
    asks the engine about one budget's keys at most."""
    net = pair(serve_max_pinned_blocks_per_peer=4096)
    assert net.cores["P"].serve_lookup_budget == 4096
    keys = [i.to_bytes(8, "big") + b"k" for i in range(20000)]
    net.engines["P"].blocks.update({k: i for i, k in enumerate(keys[:3000])})
    windows = _counting(net)
    _probe_keys(net, "long", keys)
    deliver_all(net, 0.0, windows=False)  # every probe message arrives before a window
    _answer_all(net)
    assert max(windows) <= 4096 and sum(windows) == 4 * 4096  # never asked about the keys past it
    view = CoreView(net.cores["C"]).probe("long")
    assert view.state is ProbeState.OFFERED and view.offered == set(keys[:3000]), view.reason


def test_a_new_round_is_refused_only_once_the_peers_rounds_wait_on_four_budgets() -> None:
    """Y25: requests of one engine step each get their round while the peer's rounds wait on less
    than four lookup budgets' keys — a second request is not refused behind a first one of 4,096
    keys (mostly misses), even when the pool caps pinning below 4,096 — and a new round past that
    is refused serve_busy in one round trip; once the windows answered, the next round is served."""
    net = pair(serve_max_pinned_blocks_per_peer=1000)
    assert net.cores["P"].serve_lookup_budget == 4096
    held = [i.to_bytes(8, "big") + b"h" for i in range(500)]
    net.engines["P"].blocks.update({k: i for i, k in enumerate(held)} | {KEYS[0]: 900})
    long = [i.to_bytes(8, "big") + b"x" for i in range(4096)]
    _probe_keys(net, "first", long)
    _probe_keys(net, "second", held)
    deliver_all(net, 0.0, windows=False)
    _answer_all(net)
    assert CoreView(net.cores["C"]).probe("second").offered == set(held)
    many = [i.to_bytes(8, "big") + b"m" for i in range(4 * 4096)]
    _probe_keys(net, "a", many)
    _probe_keys(net, "b", KEYS[:1])
    deliver_all(net, 0.0, windows=False)
    assert CoreView(net.cores["C"]).probe("b").reason is Reason.SERVE_BUSY
    assert "keys waiting for its engine" in REASON_DOCS[Reason.SERVE_BUSY]  # what the docs say it is
    _answer_all(net)  # the windows answer round a's keys (all miss)
    assert CoreView(net.cores["C"]).probe_answer("a", many[0]) is Answer.MISS
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
