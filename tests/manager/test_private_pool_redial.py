"""A NIXL consumer whose pool is private memory gets its slots back once a stalled producer
recovers, without any new request (decision N25).

Such a pool cannot be windowed, so revoking a stalled producer's access waits for a proof: its
process gone, or a fresh handshake it accepts (its plane admits our agent again only once no WRITE
of the old session is in flight).  The consumer asks for that handshake itself at every revoke
deadline it passes holding slots; before N25 nothing dialled the producer again, and a load whose
producer was stopped and resumed stayed without a result for as long as no other request named
that producer.
"""

from __future__ import annotations

import time

import pytest

from kvtier.api import RequestContext
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from mgr_helpers import SENTINEL, Jobs, digests, job, keys_for, metric, pump_until, sentinel_digest
from tests.support import wedge
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(120)

BB = 64 * 1024
NB = 64
REFILL = 0x3C


@pytest.mark.parametrize("data_plane", ["nixl"], indirect=True)
def test_a_private_pool_gets_its_slots_back_once_the_stalled_producer_resumes(data_plane, victim, monkeypatch):
    import torch

    monkeypatch.setenv("UCX_TLS", "tcp")  # a WRITE stays in flight while its producer does not run
    victim.start_manager({"heartbeat_interval_s": 0.2, "peer_timeout_s": 30.0, "transfer_timeout_s": 30.0},
                         num_blocks=NB, block_bytes=BB)
    pool = BlockPool.wrap(torch.zeros((NB, BB), dtype=torch.uint8))  # private memory: no window
    c = KvTierManager({"host": "127.0.0.1", "port": 0, "data_plane": "nixl", "heartbeat_interval_s": 0.2,
                       "peer_timeout_s": 30.0, "load_timeout_s": 2.0, "fetch_supply_timeout_s": 1.5,
                       "abort_ack_timeout_s": 0.5, "revoke_timeout_s": 0.5, "handshake_timeout_s": 1.0,
                       "connect_timeout_s": 1.0}, pool)
    try:
        peer = f"{victim.host}:{victim.port}"
        kv, n = "kv-private", 48
        keys, dst = keys_for(kv, n), list(range(8, 8 + n))
        pool.tensor.fill_(SENTINEL)
        req = RequestContext(req_id=f"c-{kv}", kv_transfer_params={
            "remote_prefiller": {"kv_request_id": kv, "remote_host": victim.host, "remote_port": victim.port}})
        jobs = Jobs(c)
        c.on_new_request(req)
        assert pump_until(lambda: CoreView(c.core).session_ready(peer), managers=[c])
        c.submit_load(job(5, keys, dst, req))
        assert pump_until(lambda: victim.state(kv) == "awaiting", managers=[c], jobs=[jobs]), victim.state(kv)
        victim.store(kv, 1, keys, list(range(n)), seed=7)
        wedge.stop(victim.pid)  # its WRITEs were posted and stall with it
        try:
            # past load + abort + revoke deadlines and two more revoke deadlines: the slots stay held
            # (the stopped producer could still write into them), and each redial's handshake times out
            pump_until(lambda: jobs.has(5), jobs=[jobs], timeout_s=5.0)
            if jobs.has(5):  # every WRITE had ended before the stop (rare): then it is byte-exact
                pytest.skip("the producer's transfer ended before it was stopped; nothing was held")
            assert metric(c, "kvtier_quarantined_blocks", role="consumer") == n
            assert c.core.consumer_state(kv).value == "revoking"
        finally:
            wedge.cont(victim.pid)
        t0 = time.monotonic()
        # no request names the producer again: the consumer's own redial proves the access ended
        assert pump_until(lambda: jobs.has(5), jobs=[jobs], timeout_s=10.0), c.core.consumer_state(kv)
        took = time.monotonic() - t0
        r = jobs.one(5)
        assert not r.success and r.reason in ("load_timeout", "abort_unacknowledged"), r
        assert took < 8.0, f"slots given back {took:.1f} s after the producer resumed"
        assert metric(c, "kvtier_quarantined_blocks", role="consumer") == 0
        for s in dst:  # the engine reuses the slots the moment it has the result
            pool.view(s).fill_(REFILL)
        pump_until(lambda: False, jobs=[jobs], timeout_s=1.0)
        assert digests(pool, dst) == [sentinel_digest(BB, REFILL)] * n  # nothing late reached them
        assert jobs.total() == 1
        c.on_request_finished(req)
    finally:
        c.shutdown()


@pytest.mark.parametrize("data_plane", ["nixl"], indirect=True)
@pytest.mark.parametrize("producer", ["stopped", "killed"])
def test_shutdown_gives_no_result_for_slots_a_stalled_producer_on_this_host_may_still_write(
        data_plane, victim, producer, caplog, monkeypatch) -> None:
    """N27: a private pool's access is not withdrawn by our agent's end for a producer on this host
    (CMA writes into our process, agent or not).  A shutdown with such a producer stopped
    mid-transfer reported the load failed, the engine refilled the slots, and the resumed
    producer's WRITEs overwrote 3-14 of 192 (an outside tester).  Now the load gets no result
    and an error names its slots; a producer that is gone proves it done, so that load fails."""
    import logging

    import torch

    # over tcp a WRITE stays in flight while its producer does not run (one host: the rule is the
    # host's, so CMA is assumed — tcp only makes the stall certain)
    monkeypatch.setenv("UCX_TLS", "tcp")
    victim.start_manager({"heartbeat_interval_s": 0.2, "peer_timeout_s": 30.0, "transfer_timeout_s": 30.0},
                         num_blocks=NB, block_bytes=BB)
    pool = BlockPool.wrap(torch.zeros((NB, BB), dtype=torch.uint8))  # private memory: no window
    c = KvTierManager({"host": "127.0.0.1", "port": 0, "data_plane": "nixl", "heartbeat_interval_s": 0.2,
                       "peer_timeout_s": 30.0, "load_timeout_s": 20.0, "handshake_timeout_s": 5.0}, pool)
    peer = f"{victim.host}:{victim.port}"
    kv, n = "kv-private-shutdown", 48
    keys, dst = keys_for(kv, n), list(range(8, 8 + n))
    req = RequestContext(req_id=f"c-{kv}", kv_transfer_params={
        "remote_prefiller": {"kv_request_id": kv, "remote_host": victim.host, "remote_port": victim.port}})
    jobs = Jobs(c)
    stopped = False
    try:
        c.on_new_request(req)
        assert pump_until(lambda: CoreView(c.core).session_ready(peer), managers=[c])
        c.submit_load(job(5, keys, dst, req))
        assert pump_until(lambda: victim.state(kv) == "awaiting", managers=[c], jobs=[jobs]), victim.state(kv)
        victim.store(kv, 1, keys, list(range(n)), seed=7)
        wedge.stop(victim.pid)
        stopped = True
        if producer == "killed":
            victim.kill()
            stopped = False
        with caplog.at_level(logging.ERROR, logger="kvtier.manager"):
            c.shutdown(grace_s=0.3)
        results = list(c.get_finished_jobs())
        said = [r.getMessage() for r in caplog.records if "gets no result" in r.getMessage()]
        if producer == "stopped":
            assert [r.job_id for r in results] == [] and c.is_outstanding(5)
            assert len(said) == 1 and "load job 5" in said[0] and peer in said[0], said
        else:  # gone: its end proves the access over
            assert [(r.job_id, r.success) for r in results] == [(5, False)] and said == []
    finally:
        if stopped:
            wedge.cont(victim.pid)
        c.shutdown()
