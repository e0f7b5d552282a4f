"""A request crosses each side once (decision C13): counted in passes of the I/O loop, on a
virtual clock, so the request path cannot silently grow more round trips through the loop.

One pass is one step of a manager's I/O loop that applies something to its core (an engine
command, what a service pass of the network read, deadlines): ``KvTierManager.passes``.  With the
session already up, a 1-block request costs:

* consumer: the ``submit_load`` command (the fetch leaves in it), then one pass that reads the
  ``block_data``, lands and checks the block and queues the job's result — the receipt leaves in
  that pass too, after the result;
* producer: one pass that reads the fetch and posts the block; one more that reads the receipt
  (off the request's critical path).
"""

from __future__ import annotations

import pytest

from tests.manager.mgr_helpers import Jobs, VirtualPair, job, keys_for, producer_req


def _park(v: VirtualPair, kid: str, job_id: int, slot: int) -> None:
    req = producer_req(f"p-{kid}", kid)
    v.P.on_new_request(req)
    v.P.pool.write(slot, bytes([job_id % 251]) * v.block_bytes)
    v.P.submit_store(job(job_id, keys_for(kid, 1), [slot], req))
    v.P.on_request_finished(req)


@pytest.fixture
def pair():
    v = VirtualPair(block_bytes=4096)
    try:
        # a first request opens the session: the handshake's passes are not a request's cost
        _park(v, "warm", 1, 0)
        creq = v.creq("c-warm", "warm")
        v.C.on_new_request(creq)
        v.C.submit_load(job(2, keys_for("warm", 1), [0], creq))
        v.step()
        assert v.cjobs.one(2).success
        v.C.on_request_finished(creq)
        v.step()
        yield v
    finally:
        v.close()


def test_a_one_block_request_crosses_each_side_once(pair: VirtualPair) -> None:
    v = pair
    _park(v, "kv", 3, 1)
    creq = v.creq("c-kv", "kv")
    v.C.on_new_request(creq)
    v.step()
    p0, c0 = v.P.passes, v.C.passes
    cjobs = Jobs(v.C)

    v.C.submit_load(job(4, keys_for("kv", 1), [1], creq))
    assert v.C.passes == c0 + 1, "the engine's command is one pass, and the fetch left in it"
    assert v.P.transport.inbox_size() == 1

    v.P.poll(0)
    assert v.P.passes == p0 + 1, "the producer answers the fetch in the pass that read it"
    assert v.P.transport.inbox_size() == 0 and v.C.transport.inbox_size() == 1  # the block_data

    v.C.poll(0)
    assert v.C.passes == c0 + 2, "the consumer lands, checks and reports in the pass that read the block"
    cjobs.pump()
    assert cjobs.one(4).success
    assert v.P.transport.inbox_size() == 1, "the receipt left in that same pass, after the result"

    before = v.pjobs.total()
    v.P.poll(0)
    v.pjobs.pump()
    assert v.P.passes == p0 + 2 and v.pjobs.total() == before + 1, "the receipt ends the store job in one pass"
    assert v.pjobs.one(3).success


def test_a_late_fetch_is_refused_in_the_pass_that_read_it(pair: VirtualPair) -> None:
    """P3's path: a fetch for a reaped id is answered in the pass that read it, and the refusal
    fails the load in the consumer's pass that read the answer."""
    v = pair
    _park(v, "late", 5, 2)
    v.advance(v.P.config.unbound_store_timeout_s + 1.0)  # reaped: tombstoned
    creq = v.creq("c-late", "late")
    v.C.on_new_request(creq)
    v.step()
    p0, c0 = v.P.passes, v.C.passes
    v.C.submit_load(job(6, keys_for("late", 1), [2], creq))
    v.P.poll(0)
    v.C.poll(0)
    assert (v.P.passes, v.C.passes) == (p0 + 1, c0 + 2)
    v.cjobs.pump()
    r = v.cjobs.one(6)
    assert not r.success and r.reason == "reaped"
