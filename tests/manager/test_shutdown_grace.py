"""``shutdown(grace_s)`` keeps to its grace with a large transfer in flight, on both planes.

The consumer (same process, caller-driven) is not polled while the producer shuts down, so its
transfer cannot finish: what the producer then waits for is bounded by the grace alone.  Checked
by what the plane is given, not by the clock: the plane's close (after the transport's) may wait
for its work in flight only what is left of the grace — before, the NIXL plane took its own
0.1 s on top of the grace (an outside tester measured a 0.05 s grace return after 0.16 s) — and
the goodbyes' slice never exceeds a fifth of a small grace (it was a fixed 50 ms floor).
"""

from __future__ import annotations

import time

import pytest
from mgr_helpers import BOTH_PLANES, consumer_req, job, producer_req, pump_until

from kvtier.dataplane.nixl import NixlPlane
from kvtier.dataplane.zmq import ZmqPlane

pytestmark = pytest.mark.timeout(120)

BB = 1 << 20
NB = 24


@BOTH_PLANES
@pytest.mark.parametrize("grace_s", [0.05, 0.3])
def test_the_planes_close_waits_only_what_is_left_of_the_grace(data_plane, make_manager, monkeypatch,
                                                               grace_s) -> None:
    closes: list[tuple[float | None, float]] = []
    cls = NixlPlane if data_plane == "nixl" else ZmqPlane
    original = cls.close

    def spy(self, wait_s=None):
        closes.append((wait_s, time.monotonic()))
        return original(self, wait_s)

    monkeypatch.setattr(cls, "close", spy)
    p = make_manager({"unbound_store_timeout_s": 30.0}, num_blocks=NB, block_bytes=BB)
    c = make_manager({}, num_blocks=NB, block_bytes=BB)
    preq = producer_req("p1", "kv-big")
    p.on_new_request(preq)
    keys = [b"k%d" % i for i in range(NB)]
    p.submit_store(job(1, keys, range(NB), preq))
    p.on_request_finished(preq)
    creq = consumer_req("c1", "kv-big", "127.0.0.1", p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys, range(NB), creq))
    assert pump_until(lambda: p.has_pending_work() and c.has_pending_work(), managers=[p, c], timeout_s=5.0)
    pump_until(lambda: False, managers=[p, c], timeout_s=0.02)  # the transfer starts
    start = time.monotonic()
    p.shutdown(grace_s)
    (wait_s, at), = closes  # the producer's plane, closed once
    left = start + grace_s - at
    assert wait_s is not None and wait_s <= max(0.2 * grace_s, left) + 1e-3, (wait_s, left, grace_s)
    results = p.get_finished_jobs()
    assert [r.job_id for r in results] == [1], results  # the store still gets its one result
