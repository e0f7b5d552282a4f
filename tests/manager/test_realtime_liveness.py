"""Liveness under real timing: a stalled producer loop, kill -9, sibling ranks.

Real processes (or real threads) over real ZeroMQ, with the expected values of bug-scenarios B24 and B11:

* B24 — the producer's process stops polling for 3 s (its main thread sleeps, holding nothing)
  while a consumer sends 300 fetches for parked ids whose ``unbound_store_timeout_s`` (2 s)
  expires during the stall, and the producer's own ``peer_timeout_s`` (1 s) is shorter than the
  stall.  After the stall every id is served, none is reaped, and nobody is declared dead.  The
  same with a backlog larger than one poll's read budget (``RECV_BUDGET``, made small here).
* B11 — kill -9 of a producer mid-transfer fails the consumer's load at once
  (``peer_disconnected``), not after ``peer_timeout_s`` (60 s here); the death of one producer
  process fails new loads to its sibling (same ``instance``) at once (``instance_down``) until
  the sibling is heard from again, and then loads to it work.
* B24, the side that pings — the consumer's loop stalls past its own ``peer_timeout_s``; the
  producer, which only answers pings, is not declared dead for the silence the stall made.

Waits are bounds (``BOUND_S``); nothing asserts how long anything took.
"""

from __future__ import annotations

import time

import pytest

import kvtier.shell.inbound
from kvtier.lifecycle._table import SessionState
from tests.support import wedge
from mgr_helpers import (
    SENTINEL,
    Jobs,
    consumer_req,
    digests,
    fill_pattern,
    job,
    keys_for,
    metric,
    metric_sum,
    pattern_digest,
    producer_req,
    pump_until,
)
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(120)

BOUND_S = 15.0  # failure bound of every wait; peer_timeout_s/load_timeout_s below are 60 s
BB = 4096
N_IDS = 300
C_CFG = {"peer_timeout_s": 60.0, "heartbeat_interval_s": 0.2, "load_timeout_s": 60.0,
         "fetch_supply_timeout_s": 30.0, "shutdown_grace_s": 0.2}


def _session_ready(c, host, port) -> bool:
    return CoreView(c.core).session_ready(f"{host}:{port}")


# -- B24 -----------------------------------------------------------------------------------------

# unbound_store_timeout_s leaves the 300 stores (one command, ~0.3 s) time to finish before the
# stall begins; the stall outlasts it, and the producer's own peer_timeout_s
P_B24 = {"unbound_store_timeout_s": 2.0, "peer_timeout_s": 1.0, "heartbeat_interval_s": 0.2,
         "shutdown_grace_s": 0.2}
STALL_S = 3.0


def _while_pumping(c, call):
    """``call()`` on a thread while the caller-driven manager ``c`` is polled; returns its result."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(_outcome(call)), daemon=True)
    t.start()
    pump_until(lambda: not t.is_alive(), managers=[c], timeout_s=BOUND_S)
    t.join(BOUND_S)
    assert out, "the call did not return"
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _outcome(call):
    try:
        return True, call()
    except Exception as exc:  # noqa: BLE001 - re-raised on the test's thread
        return False, exc


def _load_all(c, cjobs, host, port, n, first_job=1000):
    reqs = []
    for i in range(n):
        kv = f"kv-b24-{i}"
        r = consumer_req(f"c-{kv}", kv, host, port)
        c.on_new_request(r)
        c.submit_load(job(first_job + i, keys_for(kv, 1), [i], r))
        reqs.append(r)
    return reqs


def test_b24_stalled_producer_serves_what_queued_during_the_stall(producer, make_manager, tmp_path):
    """B24: 300 ids are parked in the producer's process, which then stalls for 3 s (no poll,
    main thread asleep).  Their reap deadline (2 s) and the consumer's liveness on the
    producer (peer_timeout_s=1 s) fall due inside the stall, while the consumer's 300 fetches
    and its pings wait in the producer's socket.  Expected: on the first poll after the stall the
    fetches are applied before any deadline — every load succeeds byte-exact, no id is reaped, and
    neither side ends the session."""
    producer.start_manager(P_B24, num_blocks=N_IDS, block_bytes=BB)
    c = make_manager(C_CFG, num_blocks=N_IDS, block_bytes=BB)
    c.pool.tensor.fill_(SENTINEL)
    cjobs = Jobs(c)
    host, port = producer.host, producer.port
    c.on_new_request(consumer_req("c-open", "kv-open", host, port))  # opens the session
    assert pump_until(lambda: _session_ready(c, host, port), managers=[c], timeout_s=BOUND_S)

    items = [{"kv_id": f"kv-b24-{i}", "job_id": i, "keys": keys_for(f"kv-b24-{i}", 1), "slots": [i],
              "seed": 24_000 + i} for i in range(N_IDS)]
    # the consumer keeps pinging while the producer stores: on a loaded host the stores outlast the
    # producer's peer_timeout_s (1 s), which must fall due inside the stall, not before it
    stored = _while_pumping(c, lambda: producer.store_batch(items))
    assert all(s["immediate"] == [] for s in stored)
    released = tmp_path / "stall-over"
    # returns at once; the child sleeps STALL_S from its reply on, and on until the test says every
    # fetch was sent: the premise (they wait in its socket) holds however loaded the host is
    producer.stall_until(STALL_S, str(released))
    t_stall = time.monotonic()
    # Every reap deadline is at most 2 s after the last store, which came before the stall
    # began: all of them fall due inside it.
    _load_all(c, cjobs, host, port, N_IDS)
    assert pump_until(lambda: all(c.core.consumer_state(f"kv-b24-{i}").value == "in_flight" for i in range(N_IDS)),
                      managers=[c], jobs=[cjobs], timeout_s=BOUND_S)  # every fetch left
    pump_until(lambda: False, managers=[c], jobs=[cjobs], timeout_s=0.3)  # and reached the stalled child
    released.touch()
    pump_until(lambda: time.monotonic() - t_stall > STALL_S, managers=[c], jobs=[cjobs], timeout_s=BOUND_S)
    assert pump_until(lambda: cjobs.has(*range(1000, 1000 + N_IDS)), managers=[c], jobs=[cjobs], timeout_s=BOUND_S)

    results = [cjobs.one(1000 + i) for i in range(N_IDS)]
    failed = [(i, r.reason) for i, r in enumerate(results) if not r.success]
    assert failed == [], f"{len(failed)} of {N_IDS} loads failed, e.g. {failed[:5]}"
    assert digests(c.pool, range(N_IDS)) == [s["digests"][0] for s in stored]
    res = producer.wait_results(range(N_IDS), timeout_s=BOUND_S)
    assert {i: [(r["success"], r["reason"]) for r in res.get(i, [])] for i in range(N_IDS)} == {
        i: [(True, None)] for i in range(N_IDS)}
    pstats = producer.stats()
    assert metric(pstats, "kvtier_jobs_total", kind="store", outcome="fail", reason="reaped") == 0
    assert metric_sum(pstats, "kvtier_session_ends_total") == 0, pstats
    assert metric_sum(c, "kvtier_session_ends_total") == 0


def test_b24_backlog_larger_than_one_polls_read_budget(make_manager, monkeypatch):
    """B24 with a backlog larger than one poll's read budget: RECV_BUDGET is 64 messages here
    (8192 in production) and 300 fetches (plus pings) queue while the producer is not polled for
    3 s, past every reap deadline (2 s).  A poll that stops at its budget fires no deadline
    past the time the queue was last seen empty.  Expected: every load succeeds byte-exact, none
    is reaped."""
    monkeypatch.setattr(kvtier.shell.inbound, "RECV_BUDGET", 64)
    monkeypatch.setattr(kvtier.shell.inbound, "RECV_BATCH", 16)
    p = make_manager({**P_B24, "peer_timeout_s": 60.0}, num_blocks=N_IDS, block_bytes=BB)
    c = make_manager(C_CFG, num_blocks=N_IDS, block_bytes=BB)
    c.pool.tensor.fill_(SENTINEL)
    pjobs, cjobs = Jobs(p), Jobs(c)
    c.on_new_request(consumer_req("c-open", "kv-open", p.host, p.port))
    assert pump_until(lambda: _session_ready(c, p.host, p.port), managers=[p, c], timeout_s=BOUND_S)
    parked = []
    for i in range(N_IDS):
        kv = f"kv-b24-{i}"
        preq = producer_req(f"p-{kv}", kv)
        p.on_new_request(preq)
        parked += fill_pattern(p.pool, [i], seed=24_500 + i)
        p.submit_store(job(i, keys_for(kv, 1), [i], preq))
    t_stall = time.monotonic()  # from here on the producer is not polled (its loop "stalls")
    _load_all(c, cjobs, p.host, p.port, N_IDS)
    pump_until(lambda: time.monotonic() - t_stall > STALL_S, managers=[c], jobs=[cjobs], timeout_s=BOUND_S)
    assert p.transport.wait(0)  # the backlog is waiting in the producer's socket
    polls = 0

    def served() -> bool:
        nonlocal polls
        polls += 1
        return cjobs.has(*range(1000, 1000 + N_IDS))

    assert pump_until(served, managers=[p, c], jobs=[cjobs, pjobs], timeout_s=BOUND_S)
    failed = [(i, cjobs.one(1000 + i).reason) for i in range(N_IDS) if not cjobs.one(1000 + i).success]
    assert failed == [], f"{len(failed)} of {N_IDS} loads failed, e.g. {failed[:5]}"
    assert digests(c.pool, range(N_IDS)) == parked
    assert pump_until(lambda: pjobs.has(*range(N_IDS)), managers=[p, c], jobs=[pjobs], timeout_s=BOUND_S)
    assert all(pjobs.one(i).success for i in range(N_IDS))
    assert metric(p, "kvtier_jobs_total", kind="store", outcome="fail", reason="reaped") == 0
    assert metric_sum(p, "kvtier_session_ends_total") == 0


# -- B11 -----------------------------------------------------------------------------------------

MIB = 1 << 20


def test_b11_kill_9_mid_transfer_fails_the_load_at_once(victim, producer):
    """kill -9 of a producer process while a 64 MiB transfer to a consumer is on the wire (the
    consumer, in the other child, is stopped meanwhile so the transfer cannot finish first).
    Expected: the consumer's load fails with ``peer_disconnected`` — its TCP connection closed —
    within the 15 s bound although its peer_timeout_s and load_timeout_s are 60 s."""
    consumer, doomed = producer, victim
    n = 64
    doomed.start_manager({"peer_timeout_s": 60.0, "heartbeat_interval_s": 0.5, "transfer_timeout_s": 60.0},
                         num_blocks=n, block_bytes=MIB)
    consumer.start_manager(C_CFG, num_blocks=n, block_bytes=MIB)
    keys = keys_for("kv-k9", n)
    assert consumer.load("kv-k9", 7, keys, list(range(n)), host=doomed.host, port=doomed.port) == []
    end = time.monotonic() + BOUND_S
    while doomed.state("kv-k9") != "awaiting":
        assert time.monotonic() < end, "the fetch never reached the producer"
        time.sleep(0.005)
    wedge.stop(consumer.pid)
    try:
        doomed.store("kv-k9", 1, keys, list(range(n)), fill_byte=0x33)
        assert doomed.state("kv-k9") == "serving"
        doomed.kill()
        assert not doomed.alive
    finally:
        wedge.cont(consumer.pid)
    res = consumer.wait_results([7], timeout_s=BOUND_S)
    assert [(r["success"], r["reason"]) for r in res.get(7, [])] == [(False, "peer_disconnected")], res
    stats = consumer.stats()
    assert metric(stats, "kvtier_session_ends_total", reason="peer_disconnected") == 1, stats
    assert metric_sum(stats, "kvtier_session_ends_total") == 1


def test_b11_a_dead_rank_fails_new_loads_to_its_sibling_until_the_sibling_is_heard(victim, producer, make_manager):
    """B11: two producer processes (ranks) of one instance ``pod-x``; the consumer has a ready
    session to each.  The sibling is silent for a moment (not polled) when rank 0 is killed -9.
    Expected: rank 0's session ends at once (``peer_disconnected``) — which alone proves nothing
    (a reset looks the same), so the instance is not held gone (decision I23); the next load to
    rank 0 dials and is refused at once (``connect_refused``: nothing listens there), which proves
    ``pod-x`` gone: a new load to the sibling, whose session is still ready, then fails at once
    with ``instance_down`` (peer_timeout_s and load_timeout_s are 60 s); once the sibling is heard
    from again (a pong), loads to it work, byte-exact."""
    rank0, rank1 = victim, producer
    pcfg = {"instance": "pod-x", "peer_timeout_s": 60.0, "heartbeat_interval_s": 0.2}
    rank0.start_manager(pcfg, num_blocks=8, block_bytes=BB)
    rank1.start_manager(pcfg, num_blocks=8, block_bytes=BB)
    c = make_manager(C_CFG, num_blocks=8, block_bytes=BB)
    cjobs = Jobs(c)
    for r in (rank0, rank1):
        c.on_new_request(consumer_req(f"open-{r.port}", f"kv-open-{r.port}", r.host, r.port))
    assert pump_until(lambda: all(_session_ready(c, r.host, r.port) for r in (rank0, rank1)), managers=[c],
                      timeout_s=BOUND_S)
    p0, p1 = f"{rank0.host}:{rank0.port}", f"{rank1.host}:{rank1.port}"
    assert CoreView(c.core).session(p0).instance == CoreView(c.core).session(p1).instance == "pod-x"
    before = rank1.store("kv-before", 1, keys_for("kv-before", 1), [0], seed=110)
    after = rank1.store("kv-after", 2, keys_for("kv-after", 2), [1, 2], seed=111)

    rank1.pause()  # silent: it answers no ping until resumed
    try:
        rank0.kill()
        assert pump_until(lambda: CoreView(c.core).session(p0) is None
                          or CoreView(c.core).session_state(p0) is SessionState.DEAD, managers=[c], timeout_s=BOUND_S)
        assert metric(c, "kvtier_session_ends_total", reason="peer_disconnected") == 1
        assert "pod-x" not in CoreView(c.core).suspect_instances()  # a disconnect alone proves nothing
        assert CoreView(c.core).session_ready(p1)  # the sibling's own session has not noticed anything
        r0 = consumer_req("c-dead", "kv-dead", rank0.host, rank0.port)
        c.on_new_request(r0)
        c.submit_load(job(5, keys_for("kv-dead", 1), [3], r0))
        assert pump_until(lambda: cjobs.has(5), managers=[c], jobs=[cjobs], timeout_s=BOUND_S)
        assert (cjobs.one(5).success, cjobs.one(5).reason) == (False, "connect_refused")
        assert "pod-x" in CoreView(c.core).suspect_instances()  # the refused dial proves it gone
        rb = consumer_req("c-before", "kv-before", rank1.host, rank1.port)
        c.on_new_request(rb)
        c.submit_load(job(10, keys_for("kv-before", 1), [4], rb))
        assert pump_until(lambda: cjobs.has(10), managers=[c], jobs=[cjobs], timeout_s=BOUND_S)
        assert (cjobs.one(10).success, cjobs.one(10).reason) == (False, "instance_down")
    finally:
        rank1.resume()
    assert rank1.state("kv-before") == "parked"  # the refused load never reached the sibling

    # heard from again (the consumer's next ping is answered with a pong): loads to it work
    assert pump_until(lambda: "pod-x" not in CoreView(c.core).suspect_instances(), managers=[c], timeout_s=BOUND_S)
    ra = consumer_req("c-after", "kv-after", rank1.host, rank1.port)
    c.on_new_request(ra)
    c.submit_load(job(20, keys_for("kv-after", 2), [5, 6], ra))
    assert pump_until(lambda: cjobs.has(20), managers=[c], jobs=[cjobs], timeout_s=BOUND_S)
    r = cjobs.one(20)
    assert r.success, r
    assert digests(c.pool, [5, 6]) == after["digests"]
    assert before["digests"] == [pattern_digest(110, 0, BB)]
    assert metric(c, "kvtier_jobs_total", kind="load", outcome="fail", reason="peer_timeout") == 0


# -- B24, the side that pings ------------------------------------------------------------------


def test_b24_a_consumer_whose_own_loop_stalled_keeps_its_live_producer(make_manager):
    """The consumer's I/O loop makes no pass for 1.5 s (its pass lock held, as a long pass would),
    longer than its peer_timeout_s (0.6 s); the producer is healthy but only answers pings, and
    none were sent.  The session survives the stall (decision I35) and the next load works."""
    import threading

    p = make_manager({"background_poll": True, "heartbeat_interval_s": 0.2, "peer_timeout_s": 30.0})
    c = make_manager({"background_poll": True, "heartbeat_interval_s": 0.2, "peer_timeout_s": 0.6,
                      "load_timeout_s": 10.0, "fetch_supply_timeout_s": 5.0})
    pjobs, cjobs = Jobs(p), Jobs(c)
    for n, kid in enumerate(("before", "after")):
        if kid == "after":
            held = threading.Event()

            def stall() -> None:
                with c.lock:
                    held.set()
                    time.sleep(1.5)

            t = threading.Thread(target=stall)
            t.start()
            held.wait()
            t.join()
            time.sleep(0.6)  # three heartbeats after the stall
        preq = producer_req(f"p-{kid}", kid)
        p.on_new_request(preq)
        want = fill_pattern(p.pool, [n], seed=n + 3)
        p.submit_store(job(10 + n, keys_for(kid, 1), [n], preq))
        p.on_request_finished(preq)
        creq = consumer_req(f"c-{kid}", kid, p.host, p.port)
        c.on_new_request(creq)
        c.submit_load(job(20 + n, keys_for(kid, 1), [8 + n], creq))
        assert pump_until(lambda: cjobs.has(20 + n), jobs=[cjobs, pjobs], timeout_s=BOUND_S)
        assert cjobs.one(20 + n).success and digests(c.pool, [8 + n]) == want
    assert metric_sum(c, "kvtier_session_ends_total") == 0 and metric_sum(p, "kvtier_session_ends_total") == 0
