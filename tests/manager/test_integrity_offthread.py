"""Digests and checks off the thread that holds the manager's lock keep every integrity promise
(decision I14), on both planes, over real sockets:

* a block changed after ``submit_store`` — once its digest was taken, by whichever thread took it
  (the engine's, with ``digest_threads=0`` or for a small store; the digest pool's for a large
  one) — fails the load ``corrupt``, whether the consumer checked the batch on its poll thread
  (a small, last batch) or on its digest pool (a large one);
* the engine's inputs about an id keep their order behind a store whose digests are still being
  taken (the request's end right after the store does not tombstone the id);
* ``shutdown()`` (and ``close_abruptly()``) closes the digest pool and joins its threads, also
  with a store whose digests were still being taken (its job gets exactly one result).

Waits are bounded poll loops; nothing asserts on timing.
"""

from __future__ import annotations

import threading

import pytest

from kvtier.lifecycle import ProducerState
from mgr_helpers import (
    BOTH_PLANES,
    SENTINEL,
    Jobs,
    consumer_req,
    digests,
    fill_pattern,
    in_core,
    job,
    keys_for,
    metric,
    producer_req,
    pump_until,
)
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)

BB = 128 * 1024
N = 64  # 8 MiB: batches of 4, 2, 1, 1 MiB (the first two checked on the pool, the last two inline)
HB = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 2.0}
CCFG = {**HB, "load_timeout_s": 10.0, "fetch_supply_timeout_s": 5.0}


def _digest_threads(mgr) -> list[threading.Thread]:
    pool = mgr.digest_pool
    prefix = f"kvtier-digest-{mgr.instance}-"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)] if pool is not None else []


@BOTH_PLANES
@pytest.mark.parametrize(("digested_by", "bad_block"), [
    ("engine thread", 1),    # digest_threads=0; block 1 lands in the first, 4 MiB batch: the pool checks it
    ("digest pool", 1),
    ("engine thread", 62),   # the last, 1 MiB batch: checked on the consumer's poll thread
    ("digest pool", 62),
])
def test_a_block_changed_after_submit_store_fails_the_load_corrupt(make_manager, digested_by, bad_block):
    pcfg = {**HB, "digest_threads": 0} if digested_by == "engine thread" else HB
    p = make_manager(pcfg, num_blocks=N + 8, block_bytes=BB)
    c = make_manager(CCFG, num_blocks=N + 8, block_bytes=BB)
    assert (p.digest_pool is None) == (digested_by == "engine thread")
    c.pool.tensor.fill_(SENTINEL)
    pjobs, cjobs = Jobs(p), Jobs(c)
    keys = keys_for("kv-chg", N)
    preq = producer_req("p1", "kv-chg")
    p.on_new_request(preq)
    fill_pattern(p.pool, range(N), seed=5)
    p.submit_store(job(1, keys, list(range(N)), preq))
    if digested_by == "digest pool":
        assert not in_core(p, "kv-chg", 1)  # 8 MiB: held while the pool takes the digests
    assert pump_until(lambda: in_core(p, "kv-chg", 1), managers=[p])
    # the engine reuses a block it was told to keep (as scenarios B26/B32 do)
    p.pool.buffer(bad_block)[777] ^= 0xFF

    creq = consumer_req("c1", "kv-chg", p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys, list(range(N)), creq))
    assert pump_until(lambda: cjobs.has(2), managers=[p, c], jobs=[pjobs, cjobs])
    r = cjobs.one(2)
    assert (r.success, r.reason) == (False, "corrupt")
    assert c.lookup(keys[0], creq).name == "MISS"
    assert pump_until(lambda: pjobs.has(1), managers=[p, c], jobs=[pjobs, cjobs])
    assert (pjobs.one(1).success, pjobs.one(1).reason) == (False, "aborted")


@BOTH_PLANES
def test_an_unchanged_large_transfer_lands_byte_exact_through_both_pools(make_manager):
    p = make_manager(HB, num_blocks=N, block_bytes=BB)
    c = make_manager(CCFG, num_blocks=N + 8, block_bytes=BB)
    c.pool.tensor.fill_(SENTINEL)
    pjobs, cjobs = Jobs(p), Jobs(c)
    keys = keys_for("kv-ok", N)
    preq = producer_req("p1", "kv-ok")
    p.on_new_request(preq)
    want = fill_pattern(p.pool, range(N), seed=9)
    p.submit_store(job(1, keys, list(range(N)), preq))
    creq = consumer_req("c1", "kv-ok", p.host, p.port)
    c.on_new_request(creq)
    dst = list(range(8, 8 + N))
    c.submit_load(job(2, keys, dst, creq))
    assert pump_until(lambda: cjobs.has(2) and pjobs.has(1), managers=[p, c], jobs=[pjobs, cjobs])
    assert cjobs.one(2).success and pjobs.one(1).success
    assert digests(c.pool, dst) == want
    assert metric(c, "kvtier_block_landed_bytes_total") == N * BB
    assert _digest_threads(p) and _digest_threads(c)  # both pools did work


def test_the_requests_end_right_after_a_large_store_waits_for_its_digests(make_manager):
    """vLLM finishes the producer request right after its last store: had the end reached the
    core first, the id would be tombstoned (``nothing_stored``) and the store refused."""
    p = make_manager(HB, num_blocks=N, block_bytes=BB)
    pjobs = Jobs(p)
    preq = producer_req("p1", "kv-end")
    p.on_new_request(preq)
    fill_pattern(p.pool, range(N), seed=1)
    p.submit_store(job(1, keys_for("kv-end", N), list(range(N)), preq))
    p.on_request_finished(preq)
    assert pump_until(lambda: in_core(p, "kv-end", 1), managers=[p])
    view = CoreView(p.core).producer("kv-end")
    assert view is not None and view.state is ProducerState.PARKED and view.jobs == (1,)
    assert not pjobs.has(1)


@pytest.mark.parametrize("how", ["shutdown", "close_abruptly"])
def test_shutdown_closes_the_digest_pool_and_joins_its_threads(make_manager, how):
    p = make_manager(HB, num_blocks=N, block_bytes=BB)
    pjobs = Jobs(p)
    preq = producer_req("p1", "kv-sd")
    p.on_new_request(preq)
    fill_pattern(p.pool, range(N), seed=2)
    p.submit_store(job(1, keys_for("kv-sd", N), list(range(N)), preq))  # threads start here
    assert _digest_threads(p)
    pool = p.digest_pool
    getattr(p, how)()  # maybe with the digests still being taken
    assert pool.closed
    assert _digest_threads(p) == []
    if how == "shutdown":
        results = p.get_finished_jobs()
        assert [(r.job_id, r.success, r.reason) for r in results] == [(1, False, "shutdown")]
        pjobs.pump()
