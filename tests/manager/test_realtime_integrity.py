"""Integrity under real transport timing: real processes, real ZeroMQ, real stalls.

Each test reproduces one bug-scenario entry of the second batch where timing is the point, with
the entry's expected values:

* B32/B26 — a consumer that stops reading (SIGSTOP: its libzmq threads stop too, so zero-copy
  frames stay referenced in the producer's zmq queues) while a 64 MiB transfer is in flight; the
  producer's ``transfer_timeout_s`` is 0.5 s.  The store job must not be reported while zmq
  holds the frames; past the cancel deadline the session ends (``transfer_stalled``), the frames
  are released, and only then the job fails.  The test then plays the engine: the moment the
  job result arrives it overwrites the blocks (reuse).  The resumed consumer must never report a
  success whose bytes are not the parked ones.  Also with a consumer that keeps receiving,
  slowly, through the stall (the first release's exact shape).
* Receipt — a raw consumer that is SIGKILLed after 8 of 200 blocks, or that received every
  block but never sent a receipt: the store job is never successful.
* B21 — ``shutdown()`` while a transfer is in flight to a healthy consumer and another consumer
  is wedged: it returns within the grace, every job gets one result, the healthy consumer gets
  its answer at once (never by waiting ``peer_timeout_s``).

Nothing asserts how long anything took; the waits are bounds that stop a hung test
(``BOUND_S``).  The one duration checked, shutdown's, is checked against a generous bound
(grace + 2 s) that only a shutdown waiting on the wedged peer could exceed.
"""

from __future__ import annotations

import time

import pytest

from kvtier.lifecycle._table import ProducerState
from tests.support import wedge
from tests.support.raw_peer import raw_child
from mgr_helpers import (
    SENTINEL,
    Jobs,
    fill_pattern,
    in_core,
    job,
    keys_for,
    metric,
    pattern_digest,
    producer_req,
    pump_until,
)

pytestmark = pytest.mark.timeout(120)

BOUND_S = 15.0  # failure bound of every wait; never an expectation
QUARANTINE_BOUND_S = 5.0  # bound on the release after the session was ended (immediate on zmq)

#: Reported to the lead: ``SessionMachine.effect_close_connection`` emits
#: ``CloseConnection`` only for sessions we dialled, so when a *producer* ends a session with a
#: consumer that dialled it (``transfer_stalled``, also ``peer_timeout``/``send_failed``/
#: ``give_up``) the inbound TCP connection is never shut down, libzmq keeps every zero-copy frame
#: queued to it, and the id stays ``quarantined`` (its store job outstanding) until libzmq's own
#: heartbeat timeout (= peer_timeout_s) or the peer's process goes away.  The spec's effect text
#: says "an inbound connection is shut down".  The fix is in kvtier/lifecycle/session.py
#: (emit ``CloseConnection`` for every session; the manager's performer already calls
#: ``transport.drop_peer``, which shuts an inbound connection down).
MIB = 1 << 20
BB = MIB  # 8 blocks per block_data batch (8 MiB)
N = 64  # 64 MiB: far more than the kernel's socket buffers absorb from a stopped reader
REUSED = 0x5A  # what the "engine" writes into blocks it was handed back

# The consumer side never gives up on its own clock in these tests: whatever ends a load is
# the producer's doing (its answer, or its ending the session).
C_CFG = {"peer_timeout_s": 60.0, "heartbeat_interval_s": 0.5, "load_timeout_s": 60.0,
         "fetch_supply_timeout_s": 30.0, "shutdown_grace_s": 0.2}
P_CFG = {"peer_timeout_s": 60.0, "heartbeat_interval_s": 0.5, "transfer_timeout_s": 0.5,
         "shutdown_grace_s": 0.5}


def _fill_reused(pool, slots) -> None:
    for s in slots:
        pool.view(s).fill_(REUSED)


class _Watch:
    """Polls the in-process producer and records, per poll, what the test asserts on."""

    def __init__(self, p, pjobs: Jobs, kv: str) -> None:
        self.p, self.pjobs, self.kv = p, pjobs, kv
        self.states: list[str] = []
        self.referenced_when: dict[str, int] = {}  # state -> plane references on entering it
        self.entered: dict[str, float] = {}  # state -> when it was first seen

    def step(self) -> None:
        self.p.poll(0.002)
        self.observe()

    def observe(self) -> None:
        """Record the state now (also after a result collection, which may tick the manager)."""
        st = self.p.core.producer_state(self.kv)
        if not self.states or self.states[-1] != st.value:
            self.states.append(st.value)
            self.referenced_when.setdefault(st.value, self.p.plane.referenced())
            self.entered.setdefault(st.value, time.monotonic())


# -- B32 / B26 -----------------------------------------------------------------------------------


def _stalled_transfer_trial(p, pjobs: Jobs, consumer, trial: int, *, throttle: float | None) -> dict:
    """One trial: the consumer fetches, stops (or slows down), the producer stores and serves.
    Returns what happened; asserts the producer-side rule on the way."""
    kv = f"kv-stall-{'slow' if throttle else 'stop'}-{trial}"
    if trial:
        # a fresh consumer manager per trial: nothing of the last trial's cut session is left
        consumer.start_manager(C_CFG, num_blocks=N, block_bytes=BB)
    keys = keys_for(kv, N)
    cjob, pjob = 100 + trial, 10 + trial
    dst = list(range(N))
    assert consumer.load(kv, cjob, keys, dst, host=p.host, port=p.port, sentinel=SENTINEL) == []
    # fetch before store: the transfer starts only once the consumer is already stopped
    assert pump_until(lambda: p.core.producer_state(kv) is ProducerState.AWAITING, managers=[p],
                      timeout_s=BOUND_S), p.core.producer_state(kv)
    stalled0 = metric(p, "kvtier_session_ends_total", reason="transfer_stalled")
    w = _Watch(p, pjobs, kv)
    ctl = wedge.Throttle(consumer.pid, run_s=0.002, stop_s=throttle) if throttle else None
    wedge.stop(consumer.pid)
    try:
        if ctl is not None:
            ctl.start()
        preq = producer_req(f"p-{kv}", kv)
        p.on_new_request(preq)
        parked = fill_pattern(p.pool, range(N), seed=1000 + trial)
        p.submit_store(job(pjob, keys, range(N), preq))
        at_result: dict = {}
        end = time.monotonic() + BOUND_S
        while time.monotonic() < end:
            w.step()
            pjobs.pump()
            w.observe()
            if w.states[-1] == "quarantined" and ctl is None:
                # the session was ended to force the release: it comes within a poll or two;
                # a shorter bound so that a missing release fails fast (a throttled consumer
                # may also release the frames by reading them, slowly: the general bound)
                end = min(end, w.entered["quarantined"] + QUARANTINE_BOUND_S)
            if pjobs.has(pjob):
                # the moment the engine learns the result: it may reuse the blocks at once
                at_result = {
                    "referenced": p.plane.referenced(),
                    "stalled": metric(p, "kvtier_session_ends_total", reason="transfer_stalled") - stalled0,
                    "state": w.states[-1],
                }
                _fill_reused(p.pool, range(N))
                break
        assert at_result, f"trial {trial}: no store result within {BOUND_S} s; states {w.states}"
    finally:
        if ctl is not None:
            ctl.close()
        wedge.cont(consumer.pid)
    res = consumer.wait_results([cjob], timeout_s=BOUND_S)
    pump_until(lambda: False, managers=[p], timeout_s=0.2)  # a late duplicate would show up now
    pjobs.pump()
    return {"kv": kv, "states": w.states, "referenced_when": w.referenced_when, "at_result": at_result,
            "store": pjobs.by_id[pjob], "load": res.get(cjob, []), "parked": parked, "dst": dst}


def _check_consumer(t: dict, consumer) -> str:
    """A consumer result is either a failure or byte-exact: never the reused bytes."""
    assert len(t["load"]) == 1, t["load"]
    r = t["load"][0]
    if r["success"]:
        assert consumer.digests(t["dst"]) == t["parked"], f"{t['kv']}: success with bytes that are not the parked ones"
        return "ok"
    return r["reason"]


def test_b32_stopped_consumer_blocks_never_returned_while_zmq_holds_them(victim, make_manager):
    """B32/B26, 3 trials: the consumer is SIGSTOPped before the producer starts a 64 MiB transfer
    (transfer_timeout_s=0.5).  Expected per trial: the transfer deadline finds zmq holding the
    frames (cancelling, references > 0) and reports nothing; the cancel deadline ends the session
    (``transfer_stalled``) and quarantines the id; only the release that follows fails the job
    (``transfer_timeout``), with no reference left.  The engine then overwrites the blocks, and
    the resumed consumer fails (or, never observed, succeeds byte-exact) — never a success with
    the overwritten bytes."""
    victim.start_manager(C_CFG, num_blocks=N, block_bytes=BB)
    p = make_manager(P_CFG, num_blocks=N, block_bytes=BB)
    pjobs = Jobs(p)
    outcomes = []
    for trial in range(3):
        t = _stalled_transfer_trial(p, pjobs, victim, trial, throttle=None)
        assert t["referenced_when"].get("cancelling", 0) > 0, (
            f"trial {trial}: zmq held nothing at the transfer deadline, the scenario did not happen: {t}")
        assert t["states"][-2:] == ["quarantined", "tombstoned"], t["states"]
        assert "cancelling" in t["states"]
        assert t["at_result"] == {"referenced": 0, "stalled": 1, "state": "tombstoned"}, t["at_result"]
        assert [(r.success, r.reason) for r in t["store"]] == [(False, "transfer_timeout")]
        outcomes.append(_check_consumer(t, victim))
    print("consumer outcomes:", outcomes)
    assert metric(p, "kvtier_internal_errors_total") == 0
    assert metric(p, "kvtier_quarantined_blocks", role="producer") == 0


def test_b26_slow_consumer_receiving_through_the_stall_never_lands_reused_bytes(victim, make_manager):
    """B26's first-release shape: the consumer keeps receiving, slowly (it runs ~2 ms of every
    60 ms, then of every 250 ms), so the transfer outlives transfer_timeout_s while bytes still flow.  Whatever the race
    gives — the consumer finishes in time (then its receipt completes the store job), or the
    session is ended — the store job is reported only with nothing referenced, and a consumer
    success is byte-exact although the engine overwrites the blocks the moment it hears back."""
    victim.start_manager(C_CFG, num_blocks=N, block_bytes=BB)
    p = make_manager(P_CFG, num_blocks=N, block_bytes=BB)
    pjobs = Jobs(p)
    outcomes = []
    for trial, stop_s in enumerate((0.06, 0.25)):
        t = _stalled_transfer_trial(p, pjobs, victim, trial, throttle=stop_s)
        assert t["at_result"]["referenced"] == 0, t
        (store,) = t["store"]
        outcome = _check_consumer(t, victim)
        if store.success:  # only with the consumer's receipt: it had every parked byte
            assert outcome == "ok", t
        else:
            assert store.reason == "transfer_timeout", store
        outcomes.append((store.success, outcome, t["states"]))
    print("slow consumer outcomes:", outcomes)
    assert metric(p, "kvtier_internal_errors_total") == 0


# -- receipt -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "block_bytes", "stop_after"),
    [(200, MIB, 8), (40, 16 * 1024, 40)],
    ids=["killed-after-8-of-200", "got-all-no-receipt"],
)
def test_store_never_succeeds_without_the_consumers_receipt(make_manager, n, block_bytes, stop_after):
    """A raw consumer (a child speaking the wire protocol) fetches ``n`` blocks, stops reading
    after ``stop_after`` of them and never sends a receipt; then it is SIGKILLed.  Expected: no
    store result while it lives (the producer serves or waits for the receipt), and after the
    kill the store job fails — it is never reported successful ("handed to libzmq" is not
    "delivered"); and the blocks held for the dead reader come back (B27)."""
    p = make_manager({"peer_timeout_s": 60.0, "heartbeat_interval_s": 0.5, "transfer_timeout_s": 60.0},
                     num_blocks=n, block_bytes=block_bytes)
    pjobs = Jobs(p)
    kv = f"kv-receipt-{n}"
    preq = producer_req("p-" + kv, kv)
    p.on_new_request(preq)
    for i in range(n):
        p.pool.view(i).fill_(i % 251)
    p.submit_store(job(1, keys_for(kv, n), range(n), preq))
    child = raw_child(p.address, block_bytes=block_bytes)
    try:
        assert pump_until(child.is_ready, managers=[p], timeout_s=BOUND_S), "the raw consumer's hello"
        child.send("consume", kv=kv, keys=n, stop_after=stop_after)
        assert pump_until(child.has_answer, managers=[p], timeout_s=BOUND_S), "the raw consumer stopping"
        said = child.result()
        assert said["end"] == "stopped", said
        got = said["blocks"]
        assert stop_after <= got <= n
        # alive, not reading (or done reading), no receipt: the store job has no result
        pump_until(lambda: False, managers=[p], jobs=[pjobs], timeout_s=0.5)
        state = p.core.producer_state(kv)
        assert not pjobs.has(1), pjobs.by_id
        assert state in (ProducerState.SERVING, ProducerState.DELIVERING), state
        if got == n:  # every byte went out: the plane released them, only the receipt is missing
            assert pump_until(lambda: p.core.producer_state(kv) is ProducerState.DELIVERING, managers=[p])
    finally:
        child.kill()  # SIGKILL: no goodbye reaches the producer
        child.close()
    assert pump_until(lambda: pjobs.has(1), managers=[p], jobs=[pjobs], timeout_s=BOUND_S)
    pump_until(lambda: False, managers=[p], jobs=[pjobs], timeout_s=0.2)
    r = pjobs.one(1)
    assert (r.success, r.reason) == (False, "peer_lost"), r
    assert metric(p, "kvtier_session_ends_total", reason="peer_disconnected") == 1
    assert p.plane.referenced() == 0
    print(f"raw consumer got {got} of {n} blocks; store: {r}")


# -- B21 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("healthy_speed", ["fast", "slow"])
def test_b21_shutdown_mid_transfer_with_a_wedged_consumer(producer, victim, make_manager, healthy_speed):
    """B21: the producer (here) has a 64 MiB transfer in flight to a healthy consumer (the shared
    child), an id bound but not yet stored for it, a parked id nobody fetched, a done id, and a
    transfer stuck to a wedged consumer (SIGSTOP).  shutdown(grace=1.5 s).  Expected: shutdown
    returns within the grace (bound: grace + 2 s) despite the wedged peer; every store job gets
    exactly one result (the parked and the awaiting one fail ``shutdown``; the in-flight ones fail
    ``shutdown`` or, with the consumer's receipt, succeed); the healthy consumer's loads end at
    once — the awaiting one with the terminal ``shutdown`` answer (``slow``: or, when the answer was
    still queued behind the big transfer's window at the cut, ``peer_disconnected``), the big one
    byte-exact or with ``shutdown``/``peer_disconnected`` — never by peer_timeout_s (60 s).  ``slow``: the healthy
    consumer reads slowly through the whole shutdown (SIGSTOP/SIGCONT duty cycle), so its big
    transfer is still in flight when the grace ends and only the goodbye (or the closed
    connection) can tell it."""
    healthy, wedged = producer, victim
    grace = 1.5
    p = make_manager({**P_CFG, "transfer_timeout_s": 30.0, "shutdown_grace_s": grace,
                      "fetch_supply_timeout_s": 20.0}, num_blocks=2 * N + 8, block_bytes=BB)
    pjobs = Jobs(p)
    healthy.start_manager(C_CFG, num_blocks=N + 4, block_bytes=BB)
    wedged.start_manager(C_CFG, num_blocks=N, block_bytes=BB)
    host, port = p.host, p.port

    def store(kv, job_id, slots, seed):
        preq = producer_req("p-" + kv, kv)
        p.on_new_request(preq)
        digs = fill_pattern(p.pool, slots, seed)
        p.submit_store(job(job_id, keys_for(kv, len(slots)), slots, preq))
        assert pump_until(lambda: in_core(p, kv, job_id), managers=[p])  # its digests are taken
        return digs

    # a done id (retained): nothing may change for it
    store("kv-done", 1, [0], seed=1)
    healthy.load("kv-done", 201, keys_for("kv-done", 1), [N], host=host, port=port)
    assert pump_until(lambda: pjobs.has(1), managers=[p], jobs=[pjobs], timeout_s=BOUND_S)
    assert pjobs.one(1).success
    # a parked id nobody fetches
    store("kv-parked", 2, [1], seed=2)
    # an id the healthy consumer fetched before it was stored (awaiting)
    healthy.load("kv-await", 202, keys_for("kv-await", 2), [N + 1, N + 2], host=host, port=port)
    # the wedged consumer's transfer: fetch first, stop it, then store (the frames pile up)
    wedge_slots = list(range(8, 8 + N))
    wedged.load("kv-wedged", 301, keys_for("kv-wedged", N), list(range(N)), host=host, port=port)
    for kv in ("kv-await", "kv-wedged"):
        assert pump_until(lambda kv=kv: p.core.producer_state(kv) is ProducerState.AWAITING, managers=[p],
                          timeout_s=BOUND_S), kv
    slow = wedge.Throttle(healthy.pid, run_s=0.002, stop_s=0.1) if healthy_speed == "slow" else None
    wedge.stop(wedged.pid)
    try:
        store("kv-wedged", 3, wedge_slots, seed=3)
        assert p.core.producer_state("kv-wedged") is ProducerState.SERVING
        # the big transfer to the healthy consumer: shut down as soon as it is under way
        big_slots = list(range(8 + N, 8 + 2 * N))
        big = store("kv-big", 4, big_slots, seed=4)
        healthy.load("kv-big", 203, keys_for("kv-big", N), list(range(N)), host=host, port=port)
        if slow is not None:
            # slow from here on, not stopped: its load hands the fetch to its I/O thread, which may not
            # have sent it yet; a stopped consumer would never send it and the producer would stay parked
            slow.start()
        assert pump_until(lambda: p.core.producer_state("kv-big") is not ProducerState.PARKED, managers=[p],
                          timeout_s=BOUND_S)
        big_state = p.core.producer_state("kv-big")
        t0 = time.monotonic()
        p.shutdown()
        took = time.monotonic() - t0
        pjobs.pump()
    finally:
        if slow is not None:
            slow.close()
        wedge.cont(wedged.pid)
    print(f"shutdown took {took:.2f} s (grace {grace} s); kv-big was {big_state.value} when it began")
    assert took <= grace + 2.0, f"shutdown() took {took:.1f} s with grace {grace} s"
    assert pjobs.total() == 4 and all(len(v) == 1 for v in pjobs.by_id.values()), dict(pjobs.by_id)
    assert (pjobs.one(2).success, pjobs.one(2).reason) == (False, "shutdown")
    assert (pjobs.one(3).success, pjobs.one(3).reason) == (False, "shutdown")
    assert p.get_finished_jobs() == []
    assert not p.has_pending_work()

    res = healthy.wait_results([202, 203], timeout_s=BOUND_S)
    assert set(res) >= {202, 203}, res  # promptly: the bound is 15 s, the consumer's peer_timeout 60 s
    # the awaiting load's terminal answer leaves behind the big transfer's window (up to 32 MiB on the
    # same connection): a consumer that reads it in time learns "shutdown"; the slow one may still be
    # short of it when the grace ends, and then only the closed connection can tell it — whether it
    # read that far in 1.5 s at a 2 % duty cycle is the host's speed (failed 1 of 3 fresh CI runs), so
    # either is true there, and neither may wait for a deadline
    want = {"shutdown"} if healthy_speed == "fast" else {"shutdown", "peer_disconnected"}
    (ra,) = res[202]
    assert not ra["success"] and ra["reason"] in want, ra
    (rb,) = res[203]
    if rb["success"]:
        assert healthy.digests(list(range(N))) == big
    else:
        assert rb["reason"] in ("shutdown", "peer_disconnected"), rb
    sb = pjobs.one(4)
    if sb.success:  # the producer counted it done only on the consumer's receipt
        assert rb["success"], (sb, rb)
    else:
        assert sb.reason == "shutdown", sb
    print(f"big transfer: load {rb}, store {sb}")
    # the wedged consumer, resumed, does not report the transfer a success with wrong bytes
    rw = wedged.wait_results([301], timeout_s=BOUND_S).get(301, [])
    assert len(rw) <= 1
    if rw and rw[0]["success"]:
        assert wedged.digests(list(range(N))) == [pattern_digest(3, i, BB) for i in range(N)]
