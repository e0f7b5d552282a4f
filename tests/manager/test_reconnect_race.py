"""The reconnect race (decision T10, N14), repeated many times in one run, on both planes.

Per cycle: a warm-up load over the current session; the producer process is stopped (SIGSTOP:
its libzmq threads too, so the consumer's pings and later its goodbye pile up unread); the
consumer reaps the session (``peer_timeout_s``), says goodbye and closes its DEALER; then, in one
order or the other, the producer resumes and a new request dials it again.  The producer then
reads, interleaved, the old connection's leftovers and the new connection's hello — often under
the same fd number.  What must hold, every cycle:

* the new load succeeds byte-exact (the old routing id never takes over the new connection, so
  ending the old session never cuts the new one; on NIXL the new hello names the generation it
  replaces and the producer ends the old session first, then admits the new one once the old
  entry's WRITEs are over);
* every job gets exactly one result;
* the producer ends exactly one session per cycle (the old one), so no close was reported for a
  connection that was still open.

Orders: ``cont-first`` (resume, then dial) and ``load-first`` (dial and load while it is still
stopped, then resume), alternating.  Waits are bounded; nothing asserts durations.
"""

from __future__ import annotations

import time

import pytest

from mgr_helpers import BOTH_PLANES, Jobs, consumer_req, digests, job, keys_for, pump_until
from tests.support import wedge
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(300)

CYCLES = 30
BB = 16 * 1024


@BOTH_PLANES
def test_reconnect_after_a_reaped_session_never_cuts_the_new_one(data_plane, victim, make_manager):
    victim.start_manager({"heartbeat_interval_s": 0.1, "peer_timeout_s": 30.0}, num_blocks=64, block_bytes=BB)
    c = make_manager({"heartbeat_interval_s": 0.1, "peer_timeout_s": 0.4, "load_timeout_s": 6.0,
                      "fetch_supply_timeout_s": 4.0}, num_blocks=64, block_bytes=BB)
    jobs = Jobs(c)
    peer = f"{victim.host}:{victim.port}"
    failures = []
    job_id = 0
    for cycle in range(CYCLES):
        order = "cont-first" if cycle % 2 == 0 else "load-first"
        # warm-up over the current session
        kv = f"kv-warm-{cycle}"
        want = victim.store(kv, 1000 + cycle, keys_for(kv, 2), [0, 1], seed=cycle)["digests"]
        job_id += 1
        warm = consumer_req(f"c-{kv}", kv, victim.host, victim.port)
        c.on_new_request(warm)
        c.submit_load(job(job_id, keys_for(kv, 2), [10, 11], warm))
        assert pump_until(lambda j=job_id: jobs.has(j), jobs=[jobs]), f"cycle {cycle}: warm-up had no result"
        assert jobs.one(job_id).success and digests(c.pool, [10, 11]) == want, (cycle, jobs.one(job_id), {k: v for k, v in c.stats().items() if "session_ends" in k})
        c.on_request_finished(warm)

        wedge.stop(victim.pid)
        try:
            assert pump_until(lambda: CoreView(c.core).session(peer) is None, jobs=[jobs]), f"cycle {cycle}: not reaped"
            kv = f"kv-new-{cycle}"
            keys = keys_for(kv, 3)
            job_id += 1
            new = consumer_req(f"c-{kv}", kv, victim.host, victim.port)
            if order == "load-first":
                c.on_new_request(new)  # the dial and the fetch wait in the stopped producer's socket
                c.submit_load(job(job_id, keys, [20, 21, 22], new))
                time.sleep(0.02)
        finally:
            wedge.cont(victim.pid)
        want = victim.store(kv, 2000 + cycle, keys, [2, 3, 4], seed=100 + cycle)["digests"]
        if order == "cont-first":
            c.on_new_request(new)
            c.submit_load(job(job_id, keys, [20, 21, 22], new))
        assert pump_until(lambda j=job_id: jobs.has(j), jobs=[jobs]), f"cycle {cycle} ({order}): no result"
        r = jobs.one(job_id)
        if not (r.success and digests(c.pool, [20, 21, 22]) == want):
            failures.append((cycle, order, r.reason))
        c.on_request_finished(new)
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.3)
    assert failures == [], failures
    assert jobs.total() == job_id  # exactly one result per job
    ends = victim.stats()
    ended = sum(v for k, v in ends.items() if k.startswith("kvtier_session_ends_total"))
    assert ended == CYCLES, {k: v for k, v in ends.items() if k.startswith("kvtier_session_ends_total")}
