"""A NIXL plane fault ends the session; the next load dials afresh (decision I25), over real
sockets and a real NIXL agent on each side.

The producer's agent is made to raise ``nixlRemoteDisconnectError`` at one WRITE post — what NIXL
raises when the UCX endpoint to the consumer went away (measured on a link that went down:
tests/dataplane/test_nixl_agent.py).  The agent then fails every later post to that peer entry;
before, the session stayed ready and every later fetch of it failed ``transfer_failed``.  Now the
plane reports the fault once, the producer ends the session (its goodbye names ``plane_fault``),
and the consumer's next load dials a fresh session whose entry works.
"""

from __future__ import annotations

import pytest

from mgr_helpers import Jobs, consumer_req, digests, fill_pattern, job, keys_for, pattern_digest, producer_req, pump_until
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(120)

HB = {"heartbeat_interval_s": 0.2, "peer_timeout_s": 30.0}
BB = 4096


class nixlRemoteDisconnectError(Exception):  # noqa: N801 - NIXL's class name is what the plane reads
    """Stands in for NIXL's own (``nixl._bindings``), matched by name like the real one."""


def _inject_one_disconnect(mgr) -> list[int]:
    """The next WRITE post of ``mgr``'s NIXL agent raises a remote disconnect; returns a counter."""
    agent = mgr.plane.agent._agent  # noqa: SLF001 - the fault is injected below the plane
    real = agent.make_prepped_xfer
    raised = [0]

    def make_prepped_xfer(op, *args, **kw):
        if op == "WRITE" and not raised[0]:
            raised[0] += 1
            raise nixlRemoteDisconnectError("NIXL_ERR_REMOTE_DISCONNECT (injected)")
        return real(op, *args, **kw)

    agent.make_prepped_xfer = make_prepped_xfer
    return raised


def _load(p, c, kv: str, job_id: int, n: int = 4):
    jobs, pjobs = Jobs(c), Jobs(p)
    keys = keys_for(kv, n)
    preq = producer_req(f"p-{kv}", kv)
    p.on_new_request(preq)
    fill_pattern(p.pool, range(n), seed=job_id)
    p.submit_store(job(job_id, keys, list(range(n)), preq))
    p.on_request_finished(preq)
    req = consumer_req(f"c-{kv}", kv, p.host, p.port)
    c.on_new_request(req)
    c.submit_load(job(job_id + 1, keys, list(range(8, 8 + n)), req))
    assert pump_until(lambda: jobs.has(job_id + 1) and pjobs.has(job_id), managers=[p, c], jobs=[jobs, pjobs],
                      timeout_s=20.0)
    c.on_request_finished(req)
    return jobs.one(job_id + 1)


@pytest.mark.parametrize("data_plane", ["nixl"], indirect=True)
def test_one_disconnect_error_ends_the_session_and_the_next_load_dials_afresh(data_plane, make_manager):
    p = make_manager(HB, num_blocks=16, block_bytes=BB)
    c = make_manager({**HB, "load_timeout_s": 15.0, "fetch_supply_timeout_s": 10.0}, num_blocks=16, block_bytes=BB)
    peer = f"{p.host}:{p.port}"
    assert _load(p, c, "kv-before", 10).success
    gen = CoreView(c.core).session(peer).gen
    raised = _inject_one_disconnect(p)
    r = _load(p, c, "kv-fault", 20)
    assert raised == [1] and not r.success and r.reason == "plane_fault", r  # the fault, not the failed WRITE it caused
    # the fault ended the session on both sides; nothing condemned the producer
    assert pump_until(lambda: CoreView(c.core).session(peer) is None, managers=[p, c], timeout_s=10.0)
    assert CoreView(c.core).suspect_instances() == frozenset()
    for i in range(3):  # every later load works, on a fresh session
        r = _load(p, c, f"kv-after-{i}", 30 + 10 * i)
        assert r.success, r
        assert digests(c.pool, range(8, 12)) == [pattern_digest(30 + 10 * i, b, BB) for b in range(4)]
    assert CoreView(c.core).session(peer).gen != gen
