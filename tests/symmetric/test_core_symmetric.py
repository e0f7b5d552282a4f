"""The symmetric path in the sans-I/O core: a consumer core (probe machine, its rounds' loads)
and a producer core (serve machine) on a fake network, with a fake engine answering the
producer's serve windows through the shell's real ServeWindows.

Each test names the spec property it shows (tests/symmetric/harness.py checks them on every
step): ``probe_answered_in_bound``, ``pin_released_once``, ``no_hit_without_pin``,
``no_block_after_release``, ``lookup_context_closed_once``, ``partial_keys_verified``,
``exactly_once_job_result``.
"""

from __future__ import annotations

import pytest

from kvtier.lifecycle.session import fate
from kvtier.lifecycle import Answer, InvalidTransition, ProbeState, Reason, ServeState
from kvtier.lifecycle import inputs as ix
from kvtier.wire import messages as wm
from tests.symmetric.harness import PropertyViolation, SymNet, make_core
from tools.coreview import CoreView

K = "sym-1"
KEYS = [bytes([i]) * 8 for i in range(1, 5)]


def pair(**producer_settings):
    net = SymNet()
    net.attach("C", make_core("C"))
    net.attach("P", make_core("P", **producer_settings))
    return net


def deliver_all(net: SymNet, now: float, *, windows: bool = True, limit: int = 200) -> None:
    """Deliver every message in flight, FIFO per direction, and open the producer's serve window
    between passes, until nothing moves."""
    for _ in range(limit):
        moved = False
        for src, dst in net.directions():
            net.deliver(src, dst, 0, now)
            moved = True
        if windows and net.windows["P"].pending():
            before = net.engines["P"].opened | set(net.engines["P"].pins)
            net.serve_window("P", now)
            moved = moved or before != (net.engines["P"].opened | set(net.engines["P"].pins))
        if not moved:
            return
    raise AssertionError("the network never went quiet")


def lookup_all(net: SymNet, keys, now: float, kid: str = K) -> list[Answer]:
    """vLLM's prefix scan: every key until the first MISS (RETRY does not stop it)."""
    out = []
    for k in keys:
        net.engine_input("C", ix.KeyLookedUp(kid, k), now)
        a = CoreView(net.cores["C"]).probe_answer(kid, k)
        out.append(a)
        net.check("C", kid, keys, now)
        if a is Answer.MISS:
            break
    return out


def deliver_dir(net: SymNet, src: str, dst: str, now: float) -> None:
    """Deliver everything in flight from ``src`` to ``dst`` (and nothing the other way)."""
    while net.pending(src, dst):
        net.deliver(src, dst, 0, now)


def hold(net: SymNet, n: int, first: int) -> None:
    """The producer's engine holds KEYS[:n] in pool blocks first, first + 1, ..."""
    for i, k in enumerate(KEYS[:n]):
        net.engines["P"].blocks[k] = first + i


def announce(net: SymNet, now: float = 0.0, kid: str = K) -> None:
    net.engine_input("C", ix.ProbeAnnounced(kid, "P"), now)


def finish_transfers(net: SymNet, now: float) -> None:
    while net.transfers:
        net.finish_transfer(0, now)
        deliver_all(net, now)


# -- the normal life ---------------------------------------------------------------------------------
def test_full_round_retry_then_hit_one_probe_per_step_and_every_pin_released_once() -> None:
    """probe_answered_in_bound, no_hit_without_pin, pin_released_once, lookup_context_closed_once."""
    net = pair()
    eng = net.engines["P"]
    hold(net, 3, 10)
    announce(net)
    assert lookup_all(net, KEYS, 0.0) == [Answer.RETRY] * 4
    assert lookup_all(net, KEYS, 0.0) == [Answer.RETRY] * 4  # repeated lookups only answer
    net.engine_input("C", ix.ScheduleEnded(), 0.0)  # the session is not ready: the keys wait
    deliver_all(net, 0.0, windows=False)  # handshake; the probe leaves when the session is ready
    probes = [e for e in net.log if "deliver C->P probe" in e]
    assert len(probes) == 1, net.log  # one probe for the step, carrying all four keys
    assert CoreView(net.cores["P"]).serve_state("C", K, 0) is ServeState.LOOKING_UP
    deliver_all(net, 0.0)  # the serve window answers; the reply arrives
    assert lookup_all(net, KEYS, 0.0) == [Answer.HIT] * 3 + [Answer.MISS]
    assert net.cores["C"].probe_state(K) is ProbeState.OFFERED
    (pin,) = eng.pins
    assert eng.opened == eng.closed and len(eng.opened) == 1  # the context closed in its window
    # the load of the HIT prefix: one consumer life keyed (K, round) fetches them, offered=true
    net.engine_input("C", ix.LoadSubmitted(K, 7, tuple(KEYS[:3]), (0, 1, 2)), 0.0)
    deliver_all(net, 0.0)
    # the receipt came back while the plane still reads the blocks: the pin waits for the release
    assert CoreView(net.cores["P"]).serve_state("C", K, 0) is ServeState.CONFIRMED
    assert not eng.released
    finish_transfers(net, 0.0)
    assert [r.ok for r in net.results[7]] == [True]
    assert eng.released == {pin: True}
    assert net.cores["C"].round_loads() == []  # the round's life ended with its job
    assert lookup_all(net, KEYS[3:], 0.0) == [Answer.MISS]  # a miss is kept: never probed again
    net.engine_input("C", ix.RequestFinished(K, False), 0.0)
    deliver_all(net, 0.0)
    assert net.cores["C"].probe_ids() == []
    net.quiet_checks("P")


def test_a_miss_is_kept_for_the_request_life_and_hits_are_forgotten_after_the_load() -> None:
    net = pair()
    net.engines["P"].blocks[KEYS[0]] = 3
    announce(net)
    lookup_all(net, KEYS[:2], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert lookup_all(net, KEYS[:2], 0.0) == [Answer.HIT, Answer.MISS]
    net.engine_input("C", ix.LoadSubmitted(K, 1, (KEYS[0],), (5,)), 0.0)
    deliver_all(net, 0.0)
    finish_transfers(net, 0.0)
    view = CoreView(net.cores["C"]).probe(K)
    assert view.state is ProbeState.IDLE and view.missed == {KEYS[1]} and not view.offered and not view.loading
    served = sum(1 for e in net.log if "deliver C->P probe" in e)
    lookup_all(net, [KEYS[1]], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert sum(1 for e in net.log if "deliver C->P probe" in e) == served  # no second probe for a miss


def test_all_miss_closes_the_round_without_a_pin() -> None:
    net = pair()
    announce(net)
    lookup_all(net, KEYS, 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert lookup_all(net, KEYS, 0.0) == [Answer.MISS]
    assert net.cores["C"].probe_state(K) is ProbeState.IDLE
    assert CoreView(net.cores["P"]).serve_ids() == [] and not net.engines["P"].pins
    net.quiet_checks("P")


def test_pending_blocks_are_looked_up_again_at_the_next_window() -> None:
    """A block on its way into the engine's primary (HIT_PENDING) is asked again; the reply waits
    until it is settled (one reply per round's keys)."""
    net = pair()
    net.engines["P"].pending[KEYS[0]] = 4
    announce(net)
    lookup_all(net, KEYS[:1], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0, windows=False)
    net.serve_window("P", 0.0)  # pending: no reply yet
    assert CoreView(net.cores["P"]).serve_state("C", K, 0) is ServeState.LOOKING_UP
    assert not net.directions()
    net.serve_window("P", 0.0)  # found now
    deliver_all(net, 0.0)
    assert lookup_all(net, KEYS[:1], 0.0) == [Answer.HIT]
    assert len(net.engines["P"].opened) == 1 == len(net.engines["P"].closed)  # one context, both windows


def test_still_pending_at_the_lookup_deadline_is_answered_miss() -> None:
    net = pair()
    eng = net.engines["P"]
    eng.blocks[KEYS[0]] = 1
    announce(net)
    lookup_all(net, KEYS[:2], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0, windows=False)
    eng.pending[KEYS[1]] = 2
    eng.lookup = (lambda orig: lambda k, c: orig(k, c) if k != KEYS[1] else __import__(
        "kvtier.blocksource", fromlist=["Presence"]).Presence.PENDING)(eng.lookup)  # stays pending
    net.serve_window("P", 0.0)
    net.fire("P", 0.3)  # serve_lookup_timeout_s = 0.25: the pending key is answered miss
    deliver_all(net, 0.3)
    assert lookup_all(net, KEYS[:2], 0.3) == [Answer.HIT, Answer.MISS]
    assert eng.opened == eng.closed  # the deadline closed the context at the next window


# -- bounds: the consumer never waits long ----------------------------------------------------------
def test_a_silent_peer_bounds_retry_by_the_probe_timeout_from_the_first_key() -> None:
    """probe_answered_in_bound: the handshake never completes; RETRY stops at probe_timeout_s (1 s)
    after the round's first key, not 30 s (vLLM p2p's handshake bound)."""
    net = pair()
    announce(net, 0.0)
    assert lookup_all(net, KEYS, 0.0) == [Answer.RETRY] * 4
    net.engine_input("C", ix.ScheduleEnded(), 0.1)
    net.queues.clear()  # the peer never answers anything
    net.fire("C", 0.99)
    assert lookup_all(net, KEYS[:1], 0.99) == [Answer.RETRY]
    net.fire("C", 1.0)
    assert CoreView(net.cores["C"]).probe(K).reason is Reason.PROBE_TIMEOUT
    assert lookup_all(net, KEYS, 1.0) == [Answer.MISS]


def test_probe_deadline_with_a_probe_out_releases_the_round() -> None:
    net = pair()
    net.engines["P"].blocks[KEYS[0]] = 1
    announce(net)
    lookup_all(net, KEYS[:1], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0, windows=False)  # the probe is at P, the window not run yet
    net.fire("C", 1.0)
    (rel,) = [e.msg for e in net.pending("C", "P") if e.msg.TYPE != "ping"]
    assert rel.TYPE == "abort_fetch" and rel.offered and not rel.fetched
    deliver_all(net, 1.0)
    assert CoreView(net.cores["P"]).serve_ids() == []
    net.quiet_checks("P")


def test_instance_down_answers_miss_at_once() -> None:
    net = pair()
    net.connect("C", "P", 0.0)
    deliver_all(net, 0.0)
    net.cores["C"]._sessions.suspect[fate("P", "P")] = None  # noqa: SLF001 - stand in for a sibling's death (I7)
    announce(net)
    assert lookup_all(net, KEYS[:1], 0.0) == [Answer.MISS]
    assert CoreView(net.cores["C"]).probe(K).reason is Reason.INSTANCE_DOWN


# -- every way a pin is released --------------------------------------------------------------------
def _offered(net: SymNet, n: int = 2) -> int:
    hold(net, n, 20)
    announce(net)
    lookup_all(net, KEYS[:n], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert CoreView(net.cores["P"]).serve_state("C", K, 0) is ServeState.OFFERED
    (pin,) = net.engines["P"].pins
    return pin


def test_release_on_request_finished_without_a_fetch() -> None:
    net = pair()
    pin = _offered(net)
    net.engine_input("C", ix.RequestFinished(K, False), 0.0)
    deliver_all(net, 0.0)
    assert net.engines["P"].released == {pin: True}  # ok: nothing went wrong (decision Y8)
    net.quiet_checks("P")


def test_offer_expiry_withdraws_the_offer_and_the_consumer_answers_miss() -> None:
    """no_hit_without_pin: once the producer told transfer_done(fail, offer_expired), the consumer
    stops answering HIT; a load of the withdrawn keys, submitted on the earlier HIT, fails at once
    with why (offer_expired), not as keys never offered (decision I32)."""
    net = pair()
    pin = _offered(net)
    net.fire("P", 5.0)  # offer_timeout_s
    assert net.engines["P"].released == {pin: False}
    deliver_all(net, 5.0)
    assert lookup_all(net, KEYS[:2], 5.0) == [Answer.MISS]
    net.engine_input("C", ix.LoadSubmitted(K, 9, tuple(KEYS[:2]), (0, 1)), 5.0)
    assert net.results[9][0].ok is False and net.results[9][0].reason is Reason.OFFER_EXPIRED
    net.quiet_checks("P")


def test_session_death_releases_the_pins_failed() -> None:
    net = pair()
    pin = _offered(net)
    net.engine_input("P", ix.ConnectionClosed("C"), 0.0)
    assert net.engines["P"].released == {pin: False}
    net.engine_input("C", ix.ConnectionClosed("P"), 0.0)
    assert lookup_all(net, KEYS[:1], 0.0) == [Answer.MISS]
    net.quiet_checks("P")
    # the engine loads what it was offered before the session died: it learns the session's end
    reason = CoreView(net.cores["C"]).probe(K).reason
    assert reason is Reason.PEER_DISCONNECTED
    net.engine_input("C", ix.LoadSubmitted(K, 9, tuple(KEYS[:2]), (0, 1)), 0.5)
    assert net.results[9][0].ok is False and net.results[9][0].reason is reason


def test_a_load_after_the_peer_drained_the_round_fails_drained() -> None:
    net = pair()
    _offered(net)
    net.engine_input("P", ix.DrainStarted(), 0.0)
    deliver_all(net, 0.0)
    net.engine_input("C", ix.LoadSubmitted(K, 9, tuple(KEYS[:2]), (0, 1)), 0.5)
    assert net.results[9][0].ok is False and net.results[9][0].reason is Reason.DRAINED


def test_drain_releases_unfetched_rounds_at_once() -> None:
    """vLLM's reset_cache drains the tier and asserts no job of its (a pin is one) is left."""
    net = pair()
    pin = _offered(net)
    net.engine_input("P", ix.DrainStarted(), 0.0)
    assert net.engines["P"].released == {pin: False}
    deliver_all(net, 0.0)
    assert CoreView(net.cores["C"]).probe(K).state is ProbeState.FAILED
    assert CoreView(net.cores["C"]).probe(K).reason is Reason.DRAINED
    net.quiet_checks("P")


def test_shutdown_refuses_new_probes_and_releases_held_pins() -> None:
    net = pair()
    pin = _offered(net)
    net.engine_input("P", ix.ShutdownStarted(), 0.0)
    assert net.engines["P"].released == {pin: False}
    announce(net, 0.0, kid="sym-2")
    lookup_all(net, KEYS[:1], 0.0, kid="sym-2")
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert CoreView(net.cores["C"]).probe("sym-2").reason is Reason.SHUTDOWN
    net.quiet_checks("P")


def test_fetch_of_a_key_never_offered_moves_nothing_and_fails_at_once() -> None:
    """no_block_after_release: a forged fetch of an unoffered key is refused (not_offered) in the
    step that receives it, and the round's pins are released."""
    net = pair()
    pin = _offered(net)
    gen = CoreView(net.cores["C"]).session_gen("P")
    net.send(__import__("tools.fakenet", fromlist=["Envelope"]).Envelope(
        "C", "P", wm.Fetch(gen=gen, kv_request_id=K, round=0, keys=[KEYS[3]], offered=True)))
    net.deliver("C", "P", 0, 0.0)
    assert not net.transfers and net.engines["P"].released == {pin: False}
    (done,) = [e.msg for e in net.pending("P", "C") if e.msg.TYPE == "transfer_done"]
    assert done.reason == "not_offered"


def test_a_pd_fetch_never_reaches_a_served_round_and_an_offered_fetch_never_reaches_parked_blocks() -> None:
    """Namespacing (decision Y5): the same kv_request_id parked for PD and probed symmetrically
    meet different machines, by the fetch's offered flag."""
    net = pair()
    net.engine_input("P", ix.StoreSubmitted(K, "own", 50, (KEYS[3],), (9,)), 0.0)
    pin = _offered(net)
    gen = CoreView(net.cores["C"]).session_gen("P")
    env = __import__("tools.fakenet", fromlist=["Envelope"]).Envelope
    net.send(env("C", "P", wm.Fetch(gen=gen, kv_request_id=K, round=0, keys=[KEYS[3]], offered=True)))
    net.deliver("C", "P", 0, 0.0)
    assert not net.transfers  # the parked block is not offered
    assert net.cores["P"].producer_state(K).value == "parked"
    assert net.engines["P"].released == {pin: False}


def test_a_result_arriving_after_its_round_ended_is_released_at_once() -> None:
    net = pair()
    net.engines["P"].blocks[KEYS[0]] = 1
    announce(net)
    lookup_all(net, KEYS[:1], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0, windows=False)
    # the round ends (the consumer's release) before the window; the queued lookup is skipped
    net.engine_input("C", ix.RequestFinished(K, False), 0.0)
    deliver_all(net, 0.0, windows=False)
    net.serve_window("P", 0.0)
    assert not net.engines["P"].pins
    # and a late result (a lookup performed anyway) is released at once, ok
    eff = net.engine_input("P", ix.LookupAnswered("C", K, 0, (KEYS[0],), (1,), 999), 0.0)
    assert [e.pins for e in eff if type(e).__name__ == "ReleasePins"] == [(999,)]


# -- refusals (the budgets: test_core_serve_budgets.py) ---------------------------------------------
def test_serving_off_refuses_in_one_round_trip() -> None:
    net = pair(serve=False)
    net.engines["P"].blocks[KEYS[0]] = 1
    announce(net)
    lookup_all(net, KEYS[:1], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    view = CoreView(net.cores["C"]).probe(K)
    assert view.state is ProbeState.FAILED and view.reason is Reason.NOT_SERVING
    assert not net.engines["P"].opened  # the engine was never asked


def test_principals_not_allowed_are_refused() -> None:
    net = pair(serve_allowed_principals=frozenset({"someone-else"}))
    announce(net)
    lookup_all(net, KEYS[:1], 0.0)
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    assert CoreView(net.cores["C"]).probe(K).reason is Reason.NOT_SERVING


# -- the engine's misuse raises, a peer's never does ---------------------------------------------------
def test_lookup_for_an_unannounced_request_is_refused() -> None:
    net = pair()
    with pytest.raises(InvalidTransition):
        net.cores["C"].handle(ix.KeyLookedUp("nobody", KEYS[0]), 0.0)


def test_a_second_release_would_be_caught_by_the_harness() -> None:
    """The harness's pin ledger is not a test that cannot fail: a double release raises."""
    net = pair()
    pin = _offered(net)
    net.engines["P"].release(pin, True, None)
    net.engines["P"].release(pin, True, None)
    assert net.violations and "pin_released_once" in net.violations[0]
    from kvtier.lifecycle import effects as fx

    with pytest.raises(PropertyViolation, match="pin_released_once"):
        net.route("P", [fx.ReleasePins((pin,), True)], 0.0)


# -- partial loads ------------------------------------------------------------------------------------
def test_partial_round_load_reports_only_the_landed_keys_and_the_rest_answer_miss() -> None:
    """partial_keys_verified: the round's load lands its first block, then the peer fails the
    transfer: the job fails with successful_keys = the landed key; the other key answers MISS."""
    net = pair()
    _offered(net)
    net.engine_input("C", ix.LoadSubmitted(K, 5, tuple(KEYS[:2]), (0, 1)), 0.0)
    deliver_dir(net, "C", "P", 0.0)  # the fetch reached P: one block_data per block is in flight
    first, second = [e for e in net.pending("P", "C") if e.msg.TYPE == "block_data"]
    net.queues[("P", "C")] = [first]
    net.deliver("P", "C", 0, 0.0)  # the first block lands (and is checked)
    gen = first.msg.gen
    net.send(type(first)("P", "C", wm.TransferDone(gen=gen, kv_request_id=K, round=0, ok=False,
                                                   reason="transfer_failed")))
    net.deliver("P", "C", 0, 0.0)
    (r,) = net.results[5]
    assert r.ok is False and r.successful_keys == (KEYS[0],)
    assert lookup_all(net, KEYS[1:2], 0.0) == [Answer.MISS]


def test_pd_load_partial_successful_keys_and_none_without_integrity() -> None:
    """PD loads report successful_keys too; with integrity off nothing is verified, so none."""
    for integrity, expect in ((True, (KEYS[0],)), (False, None)):
        net = SymNet()
        net.attach("C", make_core("C", integrity=integrity))
        net.attach("P", make_core("P", integrity=integrity))
        net.engine_input("P", ix.StoreSubmitted("pd", "own", 1, tuple(KEYS[:2]), (0, 1)), 0.0)
        net.engine_input("C", ix.LoadAnnounced("pd", "P"), 0.0)
        net.engine_input("C", ix.LoadSubmitted("pd", 2, tuple(KEYS[:2]), (3, 4)), 0.0)
        net.connect("C", "P", 0.0)
        deliver_dir(net, "C", "P", 0.0)
        net.queues[("P", "C")].clear()
        gen = CoreView(net.cores["P"]).session("C").gen
        env = __import__("tools.fakenet", fromlist=["Envelope"]).Envelope
        net.send(env("P", "C", wm.BlockData(gen=gen, kv_request_id="pd", round=0, first=0, count=1)))
        net.send(env("P", "C", wm.TransferDone(gen=gen, kv_request_id="pd", round=0, ok=False, reason="aborted")))
        deliver_all(net, 0.0, windows=False)
        (r,) = net.results[2]
        assert r.ok is False and r.successful_keys == expect, integrity


def test_one_sided_partial_loads_carry_slot_digests_for_the_shell_to_recheck() -> None:
    net = SymNet()
    net.attach("C", make_core("C", one_sided=True))
    net.attach("P", make_core("P", one_sided=True))
    net.engine_input("P", ix.StoreSubmitted("pd", "own", 1, tuple(KEYS[:2]), (0, 1), (111, 222)), 0.0)
    net.engine_input("C", ix.LoadAnnounced("pd", "P"), 0.0)
    net.engine_input("C", ix.LoadSubmitted("pd", 2, tuple(KEYS[:2]), (3, 4)), 0.0)
    net.connect("C", "P", 0.0)
    deliver_dir(net, "C", "P", 0.0)
    net.queues[("P", "C")].clear()
    gen = CoreView(net.cores["P"]).session("C").gen
    env = __import__("tools.fakenet", fromlist=["Envelope"]).Envelope
    net.send(env("P", "C", wm.BlockData(gen=gen, kv_request_id="pd", round=0, first=0, count=1, digests=[111])))
    net.send(env("P", "C", wm.TransferDone(gen=gen, kv_request_id="pd", round=0, ok=False, reason="aborted")))
    deliver_all(net, 0.0, windows=False)
    (r,) = net.results[2]
    assert r.successful_keys == (KEYS[0],) and r.verify == ((3, 111),)


def test_symmetric_work_and_busy_follow_the_probe_the_serve_and_the_rounds_load() -> None:
    """What the shell asks to decide whether to keep passes coming (``symmetric_work``) and whether
    a transfer is in flight (``busy``), through one round from probe to release."""
    net = pair()
    cons, prod = net.cores["C"], net.cores["P"]
    hold(net, 3, 10)
    assert not cons.symmetric_work() and not prod.symmetric_work()
    announce(net)
    lookup_all(net, KEYS, 0.0)
    assert cons.symmetric_work() and not cons.busy()  # keys collected for the step's probe
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0, windows=False)
    assert CoreView(prod).serve_state("C", K, 0) is ServeState.LOOKING_UP
    assert prod.symmetric_work() and not prod.busy()  # looking keys up moves no bytes
    deliver_all(net, 0.0)
    assert cons.probe_state(K) is ProbeState.OFFERED and cons.symmetric_work()
    net.engine_input("C", ix.LoadSubmitted(K, 7, tuple(KEYS[:3]), (0, 1, 2)), 0.0)
    # the probe is idle again; the round's load alone is the symmetric work, and it is in flight
    assert cons.probe_state(K) is ProbeState.IDLE and cons.round_loads()
    assert cons.symmetric_work() and cons.busy()
    deliver_all(net, 0.0)
    assert CoreView(prod).serve_state("C", K, 0) is ServeState.CONFIRMED
    assert prod.busy() and prod.symmetric_work()  # the plane still reads the pinned blocks
    finish_transfers(net, 0.0)
    assert not prod.busy() and not cons.busy()
    net.engine_input("C", ix.RequestFinished(K, False), 0.0)
    deliver_all(net, 0.0)
    assert not cons.symmetric_work() and not prod.symmetric_work()


def test_the_counts_views_and_answers_of_one_round_on_both_sides() -> None:
    """What the metrics and ``kvtier why`` read of a symmetric round: the probe's answers and
    counts on the consumer, its round's load among the consumer's loads, the serve record with its
    keys, finds, pins and demand on the producer (the engine holds 3 of the 4 keys, blocks 10-12)."""
    net = pair()
    cons, prod = net.cores["C"], net.cores["P"]
    hold(net, 3, 10)
    announce(net)
    lookup_all(net, KEYS, 0.0)
    answers = cons.probe_answers(K)
    assert (answers.dead, answers.hit, answers.retry, answers.miss) == (False, frozenset(), frozenset(KEYS),
                                                                         frozenset())
    net.engine_input("C", ix.ScheduleEnded(), 0.0)
    deliver_all(net, 0.0)
    answers = cons.probe_answers(K)
    assert (answers.dead, answers.hit, answers.retry, answers.miss) == (False, frozenset(KEYS[:3]), frozenset(),
                                                                         frozenset(KEYS[3:]))
    assert cons.snapshot().probe == {ProbeState.OFFERED.value: 1}
    net.engine_input("C", ix.LoadSubmitted(K, 7, tuple(KEYS[:3]), (0, 1, 2)), 0.0)
    snap = cons.snapshot()
    assert snap.consumer == {"in_flight": 1} and snap.probe == {ProbeState.IDLE.value: 1}  # the round's load
    (probe,) = cons.records().probes
    (load,) = probe.loads
    assert (load.job_id, load.keys, load.slots, load.round) == (7, tuple(KEYS[:3]), (0, 1, 2), 0)
    deliver_all(net, 0.0)
    snap = prod.snapshot()
    assert snap.serve == {ServeState.CONFIRMED.value: 1} and snap.serve_pinned_blocks == 3
    assert snap.probe == {} and snap.consumer == {}
    (serve,) = prod.records().serves
    assert (serve.peer, serve.kv_request_id, serve.round, serve.reason) == ("C", K, 0, None)
    assert serve.keys == tuple(KEYS) and serve.found == {KEYS[0]: 10, KEYS[1]: 11, KEYS[2]: 12}
    assert serve.missing == frozenset(KEYS[3:]) and serve.pending == frozenset()
    assert serve.demand == tuple(KEYS[:3]) and serve.receipt is True and serve.deadline is not None
    assert len(serve.pins) == 1
    finish_transfers(net, 0.0)
    assert prod.snapshot().serve == {} and prod.snapshot().serve_pinned_blocks == 0
