"""max_peers is enforced on both sides of a session (config `max_peers`)."""

from __future__ import annotations

from kvtier.api import LookupResult
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.testing.clock import VirtualClock
from kvtier.testing.inproc import InprocNetwork, InprocTransport
from mgr_helpers import Jobs, consumer_req, job, keys_for, producer_req
from tools.coreview import CoreView


def _mgr(net, clock, addr, cfg):
    return KvTierManager(cfg, BlockPool(8, 64, pin=False), clock=clock.now, transport=InprocTransport(net, addr))


def _pump(mgrs, rounds=20):
    for _ in range(rounds):
        for m in mgrs:
            m.poll()


def test_producer_refuses_a_session_beyond_max_peers_and_the_consumer_fails_fast():
    clock, net = VirtualClock(), InprocNetwork()
    p = _mgr(net, clock, "prod:1", {"max_peers": 1})
    c1 = _mgr(net, clock, "c1:1", {})
    c2 = _mgr(net, clock, "c2:1", {})
    try:
        preq = producer_req("p", "A")
        p.on_new_request(preq)
        p.submit_store(job(1, keys_for("A", 1), [0], preq))
        r1, r2 = consumer_req("r1", "A", "prod", 1), consumer_req("r2", "B", "prod", 1)
        c1.on_new_request(r1)
        _pump([p, c1])
        assert CoreView(c1.core).session_ready("prod:1")
        c2.on_new_request(r2)
        _pump([p, c1, c2])
        # the second consumer was refused at the handshake (names max_peers) and fails at once
        assert not CoreView(c2.core).session_ready("prod:1")
        assert c2.lookup(keys_for("B", 1)[0], r2) is LookupResult.MISS
        assert p.stats().get("kvtier_session_ends_total{reason=too_many_peers}") == 1.0
        # the first one is unaffected
        j1 = Jobs(c1)
        c1.submit_load(job(9, keys_for("A", 1), [3], r1))
        _pump([p, c1])
        j1.pump()
        assert j1.one(9).success
    finally:
        for m in (p, c1, c2):
            m.shutdown()


def test_consumer_dialling_beyond_max_peers_fails_that_request_only():
    clock, net = VirtualClock(), InprocNetwork()
    c = _mgr(net, clock, "c:1", {"max_peers": 1})
    p1 = _mgr(net, clock, "p1:1", {})
    try:
        ra = consumer_req("ra", "A", "p1", 1)
        rb = consumer_req("rb", "B", "p2", 1)  # a second producer: over the limit
        c.on_new_request(ra)
        c.on_new_request(rb)
        _pump([c, p1])
        assert c.lookup(keys_for("A", 1)[0], ra) is LookupResult.HIT
        assert c.lookup(keys_for("B", 1)[0], rb) is LookupResult.MISS  # recompute at once
    finally:
        for m in (c, p1):
            m.shutdown()


def test_a_load_of_zero_blocks_releases_the_producers_parked_blocks_at_once():
    """B20/B29: the decode side already has every block (prefix cache), loads nothing -- the
    producer is told with an empty fetch and releases the parked blocks in one round trip."""
    from mgr_helpers import VirtualPair

    v = VirtualPair(block_bytes=64)
    try:
        preq = producer_req("p", "A")
        v.P.on_new_request(preq)
        v.P.submit_store(job(1, keys_for("A", 4), [0, 1, 2, 3], preq))
        v.P.on_request_finished(preq)
        creq = v.creq("c", "A")
        v.C.on_new_request(creq)
        v.step()
        v.C.submit_load(job(9, [], [], creq))
        v.step()
        v.cjobs.pump()
        v.pjobs.pump()
        assert v.cjobs.one(9).success
        assert v.pjobs.one(1).success  # released at once, not reaped at unbound_store_timeout_s
        assert v.P.core.producer_state("A").value == "done"
        assert v.P.stats().get("kvtier_block_sent_bytes_total") == 0.0
    finally:
        v.close()


def test_duplicate_slots_in_one_job_are_refused():
    from mgr_helpers import VirtualPair

    import pytest

    v = VirtualPair(block_bytes=64)
    try:
        creq = v.creq("c", "A")
        v.C.on_new_request(creq)
        with pytest.raises(ValueError, match="duplicate slots"):
            v.C.submit_load(job(11, keys_for("A", 4), [0, 0, 1, 1], creq))
        with pytest.raises(ValueError, match="job_id"):
            v.C.submit_load(job(-5, keys_for("A", 1), [0], creq))
        assert not v.C.has_pending_work()
    finally:
        v.close()


def test_a_load_over_max_blocks_per_fetch_is_refused_with_the_limit_and_the_fix():
    from mgr_helpers import VirtualPair

    import pytest

    v = VirtualPair(c_cfg={"max_blocks_per_fetch": 2}, block_bytes=64)
    try:
        creq = v.creq("c", "A")
        v.C.on_new_request(creq)
        with pytest.raises(ValueError, match=r"^job 12: 3 blocks > max_blocks_per_fetch=2: split the job, or raise"):
            v.C.submit_load(job(12, keys_for("A", 3), [0, 1, 2], creq))
        assert not v.C.has_pending_work()
    finally:
        v.close()


def test_every_request_with_malformed_params_is_counted_not_only_the_logged_ones():
    """vLLM's adapter logs the first malformed leg each 10 s; every one is counted, so a proxy
    that breaks some requests shows in /metrics (an outside tester found the rest left no trace)."""
    from mgr_helpers import VirtualPair, metric

    import pytest

    from kvtier.api import RequestContext

    v = VirtualPair(block_bytes=64)
    try:
        legs = ({"kv_request_id": "a", "remote_host": "127.0.0.1", "remote_port": "abc"},
                {"kv_request_id": "b", "remote_port": 5710}, {"kv_request_id": "c", "remote_host": "h", "remote_port": 70000})
        for i, leg in enumerate(legs):
            with pytest.raises(ValueError, match="remote_"):
                v.C.on_new_request(RequestContext(req_id=f"bad-{i}", kv_transfer_params={"remote_prefiller": leg}))
        assert metric(v.C, "kvtier_rejected_params_total") == 3

        class Broken(dict):  # a params object that raises when read: refused and counted like the rest
            def get(self, *a):
                raise RuntimeError("boom")

            def __contains__(self, k):
                raise RuntimeError("boom")

        with pytest.raises(ValueError, match=r"kv_transfer_params could not be read \(RuntimeError\)"):
            v.C.on_new_request(RequestContext(req_id="broken", kv_transfer_params=Broken(x=1)))
        assert metric(v.C, "kvtier_rejected_params_total") == 4
    finally:
        v.close()
