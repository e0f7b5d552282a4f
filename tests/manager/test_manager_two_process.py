"""Two managers in two processes, real bytes over real zmq sockets on 127.0.0.1.

The producer runs in a child process (tests.support.peer_process), the consumer in the test
process (and once the reverse).  Block contents are deterministic patterns, and
every successful load is checked slot by slot against the sha256 of what the producer stored.
Waits are bounded poll loops (``WAIT_S``); nothing asserts on timing.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
import time

import pytest

from kvtier.api import LookupResult
from kvtier.lifecycle._table import SessionState
from mgr_helpers import (
    BOTH_PLANES,
    SENTINEL,
    WAIT_S,
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
    sentinel_digest,
)
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)

BB = 128 * 1024  # above zmq's zero-copy threshold (64 KiB): block data goes out zero-copy
NB = 96
HB = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 2.0}
PCFG = {**HB}
CCFG = {**HB, "load_timeout_s": 10.0, "fetch_supply_timeout_s": 5.0}


def _consumer(make_manager, cfg=None, *, block_bytes=BB, num_blocks=NB):
    c = make_manager({**CCFG, **(cfg or {})}, num_blocks=num_blocks, block_bytes=block_bytes)
    c.pool.tensor.fill_(SENTINEL)
    return c, Jobs(c)


def _wait_state(producer, kv_id, states, *, managers=(), timeout_s=WAIT_S):
    states = {states} if isinstance(states, str) else set(states)
    seen = []

    def pred():
        seen.append(producer.state(kv_id))
        return seen[-1] in states

    assert pump_until(pred, managers=managers, timeout_s=timeout_s), f"{kv_id}: state stayed {seen[-1:]}, want {states}"


# -- the happy path ------------------------------------------------------------------------------


@BOTH_PLANES
def test_park_fetch_bind_transfer_done_bytes_identical(producer, make_manager):
    """park -> fetch -> bind -> transfer -> done: store ok on the producer, load ok on the
    consumer, every destination slot byte-identical to what the producer stored.  80 blocks of
    128 KiB = 10 MiB, so the transfer spans several block_data messages."""
    producer.start_manager(PCFG, num_blocks=NB, block_bytes=BB)
    n = 80
    keys = keys_for("kv-basic", n)
    stored = producer.store("kv-basic", 1, keys, list(range(n)), seed=11)
    assert stored["immediate"] == []
    assert stored["digests"] == [pattern_digest(11, i, BB) for i in range(n)]
    assert producer.state("kv-basic") == "parked"

    c, jobs = _consumer(make_manager)
    req = consumer_req("c1", "kv-basic", producer.host, producer.port)
    assert c.on_new_request(req) == "consumer"
    assert c.lookup(keys[0], req) is LookupResult.HIT
    dst = list(range(10, 10 + n))
    c.submit_load(job(101, keys, dst, req))
    assert pump_until(lambda: jobs.has(101), jobs=[jobs]), "load never finished"
    r = jobs.one(101)
    assert r.success, r
    assert r.transfer_bytes == n * BB
    assert digests(c.pool, dst) == stored["digests"]
    # slots outside the load are untouched
    assert digests(c.pool, [0, 9, 90]) == [sentinel_digest(BB)] * 3

    p_res = producer.wait_results([1])
    assert [x["success"] for x in p_res[1]] == [True]
    assert producer.state("kv-basic") == "done"
    assert metric(producer.stats(), "kvtier_block_sent_bytes_total") == n * BB
    assert metric(c, "kvtier_block_landed_bytes_total") == n * BB
    # 8 MiB batches tapering to 1 MiB: 2, 4, 2, 1, 1 MiB (kvtier.shell.outbound.plan_batches); on
    # nixl the session's first WRITE is a 1 MiB piece of the first batch, the link's rate unknown (T23)
    posts = 5 if c.plane.name == "zmq" else 6
    assert producer.plane() == {"name": c.plane.name, "posts": posts, "referenced": 0}
    # nothing more arrives for either job
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.2)
    assert jobs.total() == 1
    assert all(x["job_id"] != 1 for x in producer.results())


@BOTH_PLANES
def test_decoder_first_fetch_before_store_succeeds(producer, make_manager):
    """The load is submitted before the producer stored anything: the producer binds the fetch
    (awaiting) and serves it when the store arrives within fetch_supply_timeout_s."""
    producer.start_manager({**PCFG, "fetch_supply_timeout_s": 5.0}, num_blocks=NB, block_bytes=BB)
    c, jobs = _consumer(make_manager)
    keys = keys_for("kv-first", 4)
    req = consumer_req("c1", "kv-first", producer.host, producer.port)
    c.on_new_request(req)
    c.submit_load(job(7, keys, [20, 21, 22, 23], req))
    _wait_state(producer, "kv-first", "awaiting", managers=[c])
    assert not jobs.has(7)

    stored = producer.store("kv-first", 1, keys, [0, 1, 2, 3], seed=22)
    assert all(x["success"] for x in stored["immediate"])  # may already be served in that call
    assert pump_until(lambda: jobs.has(7), jobs=[jobs])
    assert jobs.one(7).success
    assert digests(c.pool, [20, 21, 22, 23]) == stored["digests"]
    res = producer.wait_results([1]) if not stored["immediate"] else {1: stored["immediate"]}
    assert [x["success"] for x in res[1]] == [True]
    assert all(x["job_id"] != 1 for x in producer.results())


@BOTH_PLANES
def test_consumer_in_the_child_producer_here(producer, make_manager):
    """The reverse direction: the producer runs in the test process, the consumer in the child."""
    producer.start_manager(CCFG, num_blocks=NB, block_bytes=BB)  # the child is the consumer now
    p = make_manager(PCFG, num_blocks=NB, block_bytes=BB)
    pjobs = Jobs(p)
    n = 12
    keys = keys_for("kv-rev", n)
    preq = producer_req("p1", "kv-rev")
    p.on_new_request(preq)
    stored = fill_pattern(p.pool, range(n), seed=77)
    p.submit_store(job(1, keys, list(range(n)), preq))
    dst = list(range(40, 40 + n))
    assert producer.load("kv-rev", 5, keys, dst, host=p.host, port=p.port, sentinel=SENTINEL) == []
    seen: dict = {}

    def done():
        for r in producer.results():
            seen.setdefault(r["job_id"], []).append(r)
        return 5 in seen

    assert pump_until(done, managers=[p], jobs=[pjobs])
    assert [(r["success"], r["transfer_bytes"]) for r in seen[5]] == [(True, n * BB)]
    assert producer.digests(dst) == stored
    assert pump_until(lambda: pjobs.has(1), managers=[p], jobs=[pjobs]) and pjobs.one(1).success


# -- reap, tombstones, prune ---------------------------------------------------------------------

REAP = {**PCFG, "unbound_store_timeout_s": 0.5}


def _store_and_wait_reaped(producer, kv_id, job_id=1, n=4, seed=5):
    stored = producer.store(kv_id, job_id, keys_for(kv_id, n), list(range(n)), seed=seed)
    res = producer.wait_results([job_id])
    assert [(x["success"], x["reason"]) for x in res.get(job_id, [])] == [(False, "reaped")], res
    assert producer.state(kv_id) == "tombstoned"
    return stored


def test_reap_after_unbound_store_timeout(producer):
    """Parked blocks nobody fetched are reaped after unbound_store_timeout_s: the store job
    fails exactly once with reason ``reaped`` and the id is tombstoned."""
    producer.start_manager(REAP, num_blocks=NB, block_bytes=BB)
    _store_and_wait_reaped(producer, "kv-reap")
    stats = producer.stats()
    assert metric(stats, "kvtier_jobs_total", kind="store", outcome="fail", reason="reaped") == 1
    assert metric(stats, "kvtier_block_sent_bytes_total") == 0


@BOTH_PLANES
def test_late_fetch_after_reap_fails_reaped_and_sends_zero_bytes(producer, make_manager):
    """B01 over real sockets: a fetch for a reaped id is refused (reason ``reaped``); not one
    block byte is sent or lands, and the destination slots keep their sentinel fill."""
    producer.start_manager(REAP, num_blocks=NB, block_bytes=BB)
    _store_and_wait_reaped(producer, "kv-late")
    c, jobs = _consumer(make_manager)
    keys = keys_for("kv-late", 4)
    req = consumer_req("c1", "kv-late", producer.host, producer.port)
    c.on_new_request(req)
    c.submit_load(job(9, keys, [30, 31, 32, 33], req))
    assert pump_until(lambda: jobs.has(9), jobs=[jobs])
    r = jobs.one(9)
    assert (r.success, r.reason) == (False, "reaped")
    assert c.lookup(keys[0], req) is LookupResult.MISS  # the engine recomputes

    stats = producer.stats()
    assert metric(stats, "kvtier_block_sent_bytes_total") == 0
    assert producer.plane()["posts"] == 0  # nixl: not one WRITE posted; zmq: not one block_data
    assert metric(stats, "kvtier_fetches_refused_total", reason="reaped") == 1
    assert metric(c, "kvtier_block_landed_bytes_total") == 0
    assert digests(c.pool, [30, 31, 32, 33]) == [sentinel_digest(BB)] * 4
    assert producer.state("kv-late") == "tombstoned"


def test_store_for_tombstoned_id_fails_at_once(producer):
    """B03: a late store under a reaped id fails in the submit call itself (reason ``reaped``),
    for the original engine request and for another one; the id stays tombstoned."""
    producer.start_manager(REAP, num_blocks=NB, block_bytes=BB)
    _store_and_wait_reaped(producer, "kv-tomb")
    again = producer.store("kv-tomb", 2, [b"late-chunk"], [10], seed=6)
    assert [(x["success"], x["reason"]) for x in again["immediate"]] == [(False, "reaped")]
    other = producer.store("kv-tomb", 3, [b"other"], [11], seed=7, req_id="another-request")
    assert [(x["success"], x["reason"]) for x in other["immediate"]] == [(False, "reaped")]
    assert producer.state("kv-tomb") == "tombstoned"
    # exactly once: no second result turns up later
    time.sleep(0.1)
    assert [x for x in producer.results() if x["job_id"] in (2, 3)] == []


@BOTH_PLANES
def test_fetch_after_prune_fails_supply_timeout_not_load_timeout(producer, make_manager):
    """Once a tombstone is pruned (tiny tombstone_retention_s) the id is unknown again: a
    fetch binds, waits fetch_supply_timeout_s for blocks that never come and fails with
    ``supply_timeout``; it never hangs until the consumer's load_timeout."""
    cfg = {**PCFG, "unbound_store_timeout_s": 0.3, "tombstone_retention_s": 0.2, "fetch_supply_timeout_s": 0.5}
    producer.start_manager(cfg, num_blocks=NB, block_bytes=BB)
    _store_and_wait_reaped(producer, "kv-pruned")
    _wait_state(producer, "kv-pruned", "absent")

    c, jobs = _consumer(make_manager, {"load_timeout_s": 20.0})
    req = consumer_req("c1", "kv-pruned", producer.host, producer.port)
    c.on_new_request(req)
    c.submit_load(job(4, keys_for("kv-pruned", 4), [0, 1, 2, 3], req))
    assert pump_until(lambda: jobs.has(4), jobs=[jobs])
    r = jobs.one(4)
    assert (r.success, r.reason) == (False, "supply_timeout")
    assert digests(c.pool, [0, 1, 2, 3]) == [sentinel_digest(BB)] * 4
    assert metric(producer.stats(), "kvtier_block_sent_bytes_total") == 0


# -- consumer deadlines --------------------------------------------------------------------------


def test_load_timeout_abort_then_late_data_is_not_written(producer, make_manager):
    """The producer holds the blocks but stops answering (paused process).  The consumer's load
    times out, aborts, waits abort_ack_timeout_s and reports ``load_timeout`` exactly once.  When
    the producer wakes up it sends the blocks anyway (the fetch was queued before the abort):
    they are dropped, never written, and no second result appears."""
    producer.start_manager({**PCFG, "peer_timeout_s": 30.0, "heartbeat_interval_s": 0.2}, num_blocks=NB, block_bytes=BB)
    keys = keys_for("kv-slow", 4)
    producer.store("kv-slow", 1, keys, [0, 1, 2, 3], seed=33)
    c, jobs = _consumer(
        make_manager,
        {
            "load_timeout_s": 1.0,
            "abort_ack_timeout_s": 0.4,
            "fetch_supply_timeout_s": 0.5,
            "handshake_timeout_s": 0.9,
            "peer_timeout_s": 30.0,
            "heartbeat_interval_s": 0.2,
        },
    )
    req = consumer_req("c1", "kv-slow", producer.host, producer.port)
    c.on_new_request(req)
    peer = f"{producer.host}:{producer.port}"
    assert pump_until(lambda: CoreView(c.core).session_ready(peer), managers=[c]), "handshake never completed"

    producer.pause()
    try:
        dst = [40, 41, 42, 43]
        c.submit_load(job(5, keys, dst, req))
        assert pump_until(lambda: jobs.has(5), jobs=[jobs])
        r = jobs.one(5)
        assert (r.success, r.reason) == (False, "load_timeout")
        assert c.lookup(keys[0], req) is LookupResult.MISS
    finally:
        producer.resume()

    # the producer now processes the fetch (sends the blocks) and then the abort
    _wait_state(producer, "kv-slow", ("tombstoned", "done"), managers=[c])
    ignored = lambda: metric_sum(c, "kvtier_ignored_inputs_total", machine="consumer")  # noqa: E731
    assert pump_until(lambda: ignored() >= 2, jobs=[jobs]), "late block_data/abort_ack never reached the consumer"
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.2)
    assert jobs.total() == 1
    assert metric(c, "kvtier_block_landed_bytes_total") == 0
    assert digests(c.pool, dst) == [sentinel_digest(BB)] * 4
    res = producer.wait_results([1])
    # normally cancelled by the abort (both arrive in one batch); a transfer that completed
    # first would be a success -- either way, exactly one result
    assert [(x["success"], x["reason"]) for x in res[1]] in ([(False, "aborted")], [(True, None)])


@BOTH_PLANES
def test_duplicate_fetch_and_unknown_id_fail_only_that_request(producer, make_manager):
    """Two consumers fetch the same id: the second fetch fails (``duplicate_fetch``) and the
    first is served.  A fetch for an id nobody stores fails with ``supply_timeout``.  Neither
    failure disturbs the legitimate load on the same session."""
    producer.start_manager({**PCFG, "fetch_supply_timeout_s": 2.0}, num_blocks=NB, block_bytes=BB)
    c1, jobs1 = _consumer(make_manager)
    c2, jobs2 = _consumer(make_manager)
    keys = keys_for("kv-dup", 3)
    r1 = consumer_req("c1", "kv-dup", producer.host, producer.port)
    c1.on_new_request(r1)
    c1.submit_load(job(1, keys, [0, 1, 2], r1))
    ru = consumer_req("c1-unknown", "kv-never-stored", producer.host, producer.port)
    c1.on_new_request(ru)
    c1.submit_load(job(2, [b"nobody"], [9], ru))
    _wait_state(producer, "kv-dup", "awaiting", managers=[c1, c2])

    r2 = consumer_req("c2", "kv-dup", producer.host, producer.port)
    c2.on_new_request(r2)
    c2.submit_load(job(1, keys, [5, 6, 7], r2))
    assert pump_until(lambda: jobs2.has(1), managers=[c1], jobs=[jobs2])
    assert (jobs2.one(1).success, jobs2.one(1).reason) == (False, "duplicate_fetch")
    assert producer.state("kv-dup") == "awaiting"  # the legitimate binding is untouched

    stored = producer.store("kv-dup", 10, keys, [0, 1, 2], seed=44)
    assert pump_until(lambda: jobs1.has(1, 2), managers=[c2], jobs=[jobs1, jobs2])
    assert jobs1.one(1).success
    assert digests(c1.pool, [0, 1, 2]) == stored["digests"]
    assert (jobs1.one(2).success, jobs1.one(2).reason) == (False, "supply_timeout")
    assert digests(c2.pool, [5, 6, 7]) == [sentinel_digest(BB)] * 3
    assert digests(c1.pool, [9]) == [sentinel_digest(BB)]
    res = {10: stored["immediate"]} if stored["immediate"] else producer.wait_results([10])
    assert [x["success"] for x in res[10]] == [True]
    pump_until(lambda: False, managers=[c2], jobs=[jobs1, jobs2], timeout_s=0.2)
    assert jobs1.total() == 2 and jobs2.total() == 1


# -- peer death ----------------------------------------------------------------------------------


@BOTH_PLANES
def test_peer_killed_mid_transfer_fails_each_job_once_and_consumer_keeps_serving(victim, producer, make_manager):
    """kill -9 the producer process while a 64 MiB transfer is on the wire (killed as soon as
    the first blocks land) and two of its fetches wait for blocks it never stored.  Every
    affected load gets exactly one result: the large one either completed byte-exact (if the
    kill came too late) or failed; the waiting ones fail with peer_lost / peer_timeout /
    load_timeout.  The consumer then loads from another producer process as if nothing
    happened."""
    big_bb, big_n = 256 * 1024, 256  # 64 MiB in 8 block_data messages
    victim.start_manager({**PCFG, "fetch_supply_timeout_s": 8.0}, num_blocks=big_n + 4, block_bytes=big_bb)
    producer.start_manager(PCFG, num_blocks=8, block_bytes=big_bb)
    stored0 = victim.store("kv-v0", 1, keys_for("kv-v0", 2), [0, 1], seed=50)
    stored_big = victim.store("kv-vbig", 2, keys_for("kv-vbig", big_n), list(range(4, 4 + big_n)), seed=51)

    c, jobs = _consumer(
        make_manager,
        {"peer_timeout_s": 1.5, "heartbeat_interval_s": 0.1, "load_timeout_s": 10.0},
        block_bytes=big_bb,
        num_blocks=big_n + 8,
    )
    vhost, vport = victim.host, victim.port
    r0 = consumer_req("c0", "kv-v0", vhost, vport)
    c.on_new_request(r0)
    c.submit_load(job(100, keys_for("kv-v0", 2), [0, 1], r0))
    assert pump_until(lambda: jobs.has(100), jobs=[jobs])
    assert jobs.one(100).success and digests(c.pool, [0, 1]) == stored0["digests"]

    waiting = {}
    for kv, jid, slot in (("kv-v1", 102, 2), ("kv-v2", 103, 3)):  # never stored: awaiting
        r = consumer_req("c-" + kv, kv, vhost, vport)
        c.on_new_request(r)
        c.submit_load(job(jid, keys_for(kv, 1), [slot], r))
        waiting[jid] = slot
    _wait_state(victim, "kv-v2", "awaiting", managers=[c])

    rbig = consumer_req("cbig", "kv-vbig", vhost, vport)
    c.on_new_request(rbig)
    big_dst = list(range(8, 8 + big_n))
    c.submit_load(job(101, keys_for("kv-vbig", big_n), big_dst, rbig))
    landed0 = metric(c, "kvtier_block_landed_bytes_total")
    landed = lambda: metric(c, "kvtier_block_landed_bytes_total") - landed0  # noqa: E731
    assert pump_until(lambda: landed() > 0 or jobs.has(101), jobs=[jobs], wait_s=0.0005)
    victim.kill()
    assert not victim.alive
    cut_midway = not jobs.has(101)

    assert pump_until(lambda: jobs.has(101, 102, 103), jobs=[jobs]), dict(jobs.by_id)
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.3)  # no late duplicates
    ok_reasons = {"peer_lost", "peer_disconnected", "peer_timeout", "load_timeout"}
    for jid, slot in waiting.items():
        r = jobs.one(jid)
        assert not r.success and r.reason in ok_reasons, r
        assert digests(c.pool, [slot]) == [sentinel_digest(big_bb)]
    rb = jobs.one(101)
    print(f"large load: success={rb.success} reason={rb.reason} landed={landed():.0f} of {big_n * big_bb}")
    if rb.success:
        assert digests(c.pool, big_dst) == stored_big["digests"]
    else:
        assert rb.reason in ok_reasons, rb
        assert cut_midway
    assert metric(c, "kvtier_internal_errors_total") == 0
    assert f"{vhost}:{vport}" not in c.transport.peers()  # the dead peer's socket is closed

    # the consumer keeps serving: a load from another producer process works
    stored = producer.store("kv-after", 1, keys_for("kv-after", 3), [5, 6, 7], seed=53)
    ra = consumer_req("c-after", "kv-after", producer.host, producer.port)
    c.on_new_request(ra)
    c.submit_load(job(200, keys_for("kv-after", 3), [2, 3, 4], ra))
    assert pump_until(lambda: jobs.has(200), jobs=[jobs])
    assert jobs.one(200).success
    assert digests(c.pool, [2, 3, 4]) == stored["digests"]


def test_producer_restart_on_the_same_port_fails_old_loads_once_and_serves_new_ones(producer, make_manager):
    """The producer's manager dies without a goodbye and a new one listens on the same port.
    zmq reconnects the consumer's socket by itself; the new incarnation does not know the old
    session, says so, and the consumer fails the loads of the old session exactly once
    (``peer_lost``).  A new request opens a new session and loads (the disconnect alone did not
    condemn the address: decision I23)."""
    producer.start_manager(PCFG, num_blocks=NB, block_bytes=BB)
    port = producer.port
    c, jobs = _consumer(make_manager)
    r1 = consumer_req("c1", "kv-old", producer.host, port)
    c.on_new_request(r1)
    c.submit_load(job(1, keys_for("kv-old", 2), [0, 1], r1))  # never stored: stays awaiting
    _wait_state(producer, "kv-old", "awaiting", managers=[c])
    peer = f"{producer.host}:{port}"
    old_gen = CoreView(c.core).session_gen(peer)

    producer.crash_manager()
    producer.start_manager({**PCFG, "port": port}, num_blocks=NB, block_bytes=BB)
    assert producer.port == port
    assert pump_until(lambda: jobs.has(1), jobs=[jobs])
    assert (jobs.one(1).success, jobs.one(1).reason) == (False, "peer_disconnected")
    assert metric(c, "kvtier_session_ends_total", reason="peer_disconnected") == 1, c.stats()
    assert digests(c.pool, [0, 1]) == [sentinel_digest(BB)] * 2

    stored = producer.store("kv-new", 1, keys_for("kv-new", 3), [0, 1, 2], seed=70)
    # a disconnect alone proves nothing: the instance is not held gone (decision I23)
    assert CoreView(c.core).session(peer) is None and CoreView(c.core).suspect_instances() == frozenset()
    # a new request dials afresh and the restarted producer (a new instance) serves it; its
    # hello_ack proves the old instance gone
    r2 = consumer_req("c2", "kv-new", producer.host, port)
    c.on_new_request(r2)
    c.submit_load(job(2, keys_for("kv-new", 3), [5, 6, 7], r2))
    assert pump_until(lambda: jobs.has(2), jobs=[jobs])
    assert jobs.one(2).success, jobs.one(2)
    assert digests(c.pool, [5, 6, 7]) == stored["digests"]
    assert CoreView(c.core).session_gen(peer) not in (None, old_gen)
    assert len(CoreView(c.core).suspect_instances()) == 1  # the old instance, proven gone by the new one's hello_ack
    c.on_request_finished(r2)
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.2)
    assert jobs.total() == 2


# -- drain and shutdown --------------------------------------------------------------------------


@BOTH_PLANES
def test_drain_jobs_returns_only_when_every_job_has_a_result(producer, make_manager):
    """Producer side (in the child): parked ids fail ``drained`` at once, an awaiting id fails
    ``drained`` and its consumer is told; an id already served keeps its success.  Consumer side
    (here): drain_jobs returns only once its load in flight has a result."""
    producer.start_manager({**PCFG, "fetch_supply_timeout_s": 3.0}, num_blocks=NB, block_bytes=BB)
    c, jobs = _consumer(make_manager)
    host, port = producer.host, producer.port

    served = producer.store("kv-served", 1, keys_for("kv-served", 2), [0, 1], seed=60)
    rs = consumer_req("c-served", "kv-served", host, port)
    c.on_new_request(rs)
    c.submit_load(job(10, keys_for("kv-served", 2), [0, 1], rs))
    assert pump_until(lambda: jobs.has(10), jobs=[jobs]) and jobs.one(10).success
    assert digests(c.pool, [0, 1]) == served["digests"]
    assert [x["success"] for x in producer.wait_results([1])[1]] == [True]

    producer.store("kv-parked-1", 2, keys_for("kv-parked-1", 2), [2, 3], seed=61)
    producer.store("kv-parked-2", 3, keys_for("kv-parked-2", 1), [4], seed=62)
    producer.store("kv-await", 4, keys_for("kv-await", 1), [5], seed=63)  # stores 1 of the 2 keys fetched
    ra = consumer_req("c-await", "kv-await", host, port)
    c.on_new_request(ra)
    c.submit_load(job(11, keys_for("kv-await", 2), [10, 11], ra))
    _wait_state(producer, "kv-await", "awaiting", managers=[c])

    drained = producer.drain(timeout_s=10.0)
    by_job = {x["job_id"]: (x["success"], x["reason"]) for x in drained}
    assert by_job == {2: (False, "drained"), 3: (False, "drained"), 4: (False, "drained")}
    assert producer.state("kv-parked-1") == "tombstoned"
    assert pump_until(lambda: jobs.has(11), jobs=[jobs])
    assert (jobs.one(11).success, jobs.one(11).reason) == (False, "drained")
    assert digests(c.pool, [10, 11]) == [sentinel_digest(BB)] * 2

    # consumer side: drain_jobs waits for the producer's answer (a drained id is refused)
    rp = consumer_req("c-parked", "kv-parked-1", host, port)
    c.on_new_request(rp)
    c.submit_load(job(12, keys_for("kv-parked-1", 2), [20, 21], rp))
    assert 12 in c.jobs_in_flight()
    c.drain_jobs(timeout_s=WAIT_S)
    assert not c.jobs_in_flight()  # every job has its result (not yet collected)
    jobs.pump()
    assert (jobs.one(12).success, jobs.one(12).reason) == (False, "drained")
    assert not c.has_pending_work()
    assert jobs.total() == 3
    assert producer.results() == []


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_shutdown_fails_every_outstanding_job_and_leaves_nothing_behind(producer, make_manager, shm_files):
    """shutdown() with a parked store, a load in flight and a load queued behind a handshake that
    never completes: each job fails exactly once with ``shutdown``; afterwards no thread of the
    manager is left (background_poll=True), the transport and every socket are closed (file
    descriptors back to the baseline) and /dev/shm holds no new file of this process."""
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    bb = 4096
    producer.start_manager({**PCFG, "fetch_supply_timeout_s": 5.0}, num_blocks=16, block_bytes=bb)
    # a handshake that never completes: the kernel accepts the TCP connection, nobody speaks ZMTP
    # (a closed port would fail the dial at once: connect_refused)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    dead_port = silent.getsockname()[1]
    pool = BlockPool(16, bb, pin=False)
    gc.collect()
    threads0 = set(threading.enumerate())
    fds0 = _fd_count()

    m = KvTierManager(
        {**CCFG, "background_poll": True, "poll_interval_s": 0.002, "handshake_timeout_s": 5.0}, pool
    )
    assert any(t.name == "kvtier-io" for t in threading.enumerate())
    preq = producer_req("p1", "kv-mine")
    m.on_new_request(preq)
    m.submit_store(job(1, [b"mine"], [0], preq))
    rq_flight = consumer_req("c1", "kv-remote", producer.host, producer.port)
    m.on_new_request(rq_flight)
    m.submit_load(job(2, [b"never-stored"], [1], rq_flight))
    rq_queued = consumer_req("c2", "kv-nobody", "127.0.0.1", dead_port)
    m.on_new_request(rq_queued)
    m.submit_load(job(3, [b"x"], [2], rq_queued))
    _wait_state(producer, "kv-remote", "awaiting")  # the background thread sent the fetch

    m.shutdown()
    results = m.get_finished_jobs()
    assert sorted((r.job_id, r.success, r.reason) for r in results) == [
        (1, False, "shutdown"),
        (2, False, "shutdown"),
        (3, False, "shutdown"),
    ]
    assert m.get_finished_jobs() == []
    m.shutdown()  # idempotent
    assert m.get_finished_jobs() == []
    with pytest.raises(RuntimeError):
        m.submit_store(job(4, [b"y"], [3], preq))
    with pytest.raises(RuntimeError):
        m.on_new_request(producer_req("p2", "kv-2"))
    assert not m.has_pending_work()

    assert m.transport.closed
    assert m.transport._conns.router.closed and m.transport._ctx.closed
    assert not any(t.name == "kvtier-io" for t in threading.enumerate())
    del m
    gc.collect()
    assert pump_until(lambda: set(threading.enumerate()) <= threads0, timeout_s=5.0), (
        set(threading.enumerate()) - threads0
    )
    assert pump_until(lambda: _fd_count() <= fds0, timeout_s=5.0), (fds0, _fd_count())
    assert shm_files.new() == set()
    silent.close()

    # the producer was told: its fetch for kv-remote ended with the session
    _wait_state(producer, "kv-remote", "tombstoned")


def test_idle_session_is_kept_alive_by_heartbeats(producer, make_manager):
    """No false positives: an idle session outlives several peer_timeout_s periods because the
    heartbeats keep both sides' liveness timers fresh."""
    cfg = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 0.8}
    producer.start_manager(cfg, num_blocks=8, block_bytes=4096)
    c, _ = _consumer(make_manager, cfg, block_bytes=4096, num_blocks=8)
    c.on_new_request(consumer_req("c", "kv-any", producer.host, producer.port))
    peer = f"{producer.host}:{producer.port}"
    assert pump_until(lambda: CoreView(c.core).session_ready(peer), managers=[c])
    pump_until(lambda: False, managers=[c], timeout_s=2.0)
    assert CoreView(c.core).session_state(peer) is SessionState.READY
    assert metric_sum(c, "kvtier_session_ends_total") == 0
    assert metric_sum(producer.stats(), "kvtier_session_ends_total") == 0
