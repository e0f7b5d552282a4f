"""The data-plane rules over real processes, on both planes (zmq and NIXL, loopback).

* A store job's result comes only after the plane released the transfer: kill -9 of the consumer
  mid-transfer fails the store, never while a send or a WRITE may still read its blocks.
* A block changed after it was parked never reaches a consumer as a success (``corrupt``).
* The handshake refuses another data plane, and a NIXL descriptor the plane cannot use.
* A consumer whose producer cannot answer gets its load answered within the revocation bound
  on both planes, and a late write never reaches the slots the engine reused (NIXL: the
  session's window of the pool is withdrawn, its late WRITE lands in a sink).

Waits are bounded poll loops; nothing asserts on timing.
"""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq

from kvtier.dataplane import Released
from kvtier.lifecycle import ConsumerState
from kvtier.wire import messages as wm
from kvtier.wire.codec import PROTOCOL_VERSION, Decoder
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
    pattern_digest,
    producer_req,
    pump_until,
    sentinel_digest,
)
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)

BB = 128 * 1024
NB = 96
HB = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 2.0}
CCFG = {**HB, "load_timeout_s": 10.0, "fetch_supply_timeout_s": 5.0}


def _record_order(p):
    """Wrap the producer's plane reports and its job-result handover: one list, in the order they
    happened, each with how many transfers the plane still referenced at that moment."""
    events: list[tuple] = []
    poll, take = p.plane.poll, p.get_finished_jobs

    def plane_poll():
        out = poll()
        events.extend(("released", r.kv_request_id, r.failed, p.plane.referenced()) for r in out
                      if isinstance(r, Released))
        return out

    def get_finished_jobs():
        out = take()
        events.extend(("job", r.job_id, r.success, r.reason, p.plane.referenced()) for r in out)
        return out

    p.plane.poll = plane_poll
    p.get_finished_jobs = get_finished_jobs
    return events


@BOTH_PLANES
def test_consumer_killed_mid_transfer_fails_the_store_only_after_the_plane_released(
    data_plane, victim, make_manager, monkeypatch
):
    """The consumer process stops reading (paused) while 8 MiB are on their way, then dies by
    kill -9.  The producer's store job fails exactly once, and only in a step where the plane had
    already reported the transfer released (zmq: every tracker done; NIXL: every WRITE
    terminal).  With NIXL, ``UCX_TLS=tcp`` on the producer makes the WRITE wait for the
    consumer's progress, so it is really in flight when the consumer dies."""
    if data_plane == "nixl":
        monkeypatch.setenv("UCX_TLS", "tcp")
    p = make_manager({**HB, "transfer_timeout_s": 20.0}, num_blocks=NB, block_bytes=BB)
    pjobs = Jobs(p)
    events = _record_order(p)
    victim.start_manager(CCFG, num_blocks=NB, block_bytes=BB)
    n = 64
    keys = keys_for("kv-cut", n)
    preq = producer_req("p1", "kv-cut")
    p.on_new_request(preq)
    fill_pattern(p.pool, range(n), seed=3)
    p.submit_store(job(1, keys, list(range(n)), preq))

    victim.call("announce", req_id="c-kv-cut", kv_id="kv-cut", host=p.host, port=p.port)
    assert pump_until(lambda: any(r.state.value == "ready" for r in CoreView(p.core).sessions()),
                      managers=[p]), "no session"
    # the consumer must have taken the hello_ack too, or its load would queue behind the
    # handshake of a consumer that no longer reads
    assert pump_until(lambda: victim.session_state(p.address) == "ready", managers=[p]), "consumer not ready"
    victim.pause()  # from now on the consumer reads nothing and makes no NIXL progress
    victim.load("kv-cut", 7, keys, list(range(n)), host=p.host, port=p.port)
    assert pump_until(lambda: p.core.producer_state("kv-cut").value in ("serving", "delivering"),
                      managers=[p], jobs=[pjobs])
    in_flight = p.plane.referenced() > 0
    victim.kill()

    assert pump_until(lambda: pjobs.has(1), managers=[p], jobs=[pjobs]), events
    pump_until(lambda: False, managers=[p], jobs=[pjobs], timeout_s=0.3)
    r = pjobs.one(1)
    assert not r.success and r.reason in ("peer_lost", "transfer_failed"), r
    released = [e for e in events if e[0] == "released"]
    assert len(released) == 1 and released[0][1] == "kv-cut", events
    job_event = next(e for e in events if e[0] == "job")
    assert events.index(released[0]) < events.index(job_event), events
    assert job_event[4] == 0, events  # nothing referenced when the engine got its blocks back
    print(f"{data_plane}: WRITE/send in flight at the kill: {in_flight}; events {events}")
    if data_plane == "nixl":
        assert in_flight and released[0][2] is True  # the WRITE failed, it did not complete


@BOTH_PLANES
def test_block_changed_after_park_fails_the_load_corrupt(producer, make_manager):
    """A parked block is overwritten after its digest was taken (as a reused engine block would
    be): the consumer checks every block as it lands, fails the load ``corrupt`` and never
    reports those bytes as the parked ones — only the two checked before it, which hold the
    producer's bytes (decision I21); the producer's store fails too (aborted)."""
    producer.start_manager(HB, num_blocks=NB, block_bytes=BB)
    keys = keys_for("kv-bad", 4)
    producer.store("kv-bad", 1, keys, [0, 1, 2, 3], seed=8)
    producer.corrupt(2, offset=777)
    c = make_manager(CCFG, num_blocks=NB, block_bytes=BB)
    c.pool.tensor.fill_(SENTINEL)
    jobs = Jobs(c)
    req = consumer_req("c1", "kv-bad", producer.host, producer.port)
    c.on_new_request(req)
    c.submit_load(job(5, keys, [10, 11, 12, 13], req))
    assert pump_until(lambda: jobs.has(5), jobs=[jobs])
    r = jobs.one(5)
    assert (r.success, r.reason, r.successful_keys) == (False, "corrupt", tuple(keys[:2]))
    assert digests(c.pool, [10, 11]) == [pattern_digest(8, i, BB) for i in range(2)]
    assert c.lookup(keys[0], req).name == "MISS"
    assert metric(c, "kvtier_block_landed_bytes_total") == 2 * BB
    res = producer.wait_results([1])
    assert [(x["success"], x["reason"]) for x in res[1]] == [(False, "aborted")]
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.2)
    assert jobs.total() == 1


def _one_block_hand_off(p, c, kid: str):
    """``p`` parks one block of ``kid`` (store job 1, slot 0), ``c`` loads it (load job 2, slot 3):
    the load's result, once it came (``p`` polled, ``c`` collected)."""
    jobs = Jobs(c)
    preq = producer_req(f"p-{kid}", kid)
    p.on_new_request(preq)
    p.submit_store(job(1, [b"k"], [0], preq))
    creq = consumer_req(f"c-{kid}", kid, p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, [b"k"], [3], creq))
    assert pump_until(lambda: jobs.has(2), managers=[p], jobs=[jobs])
    return jobs.one(2)


def test_data_plane_mismatch_is_refused_in_the_handshake(make_manager):
    """A NIXL consumer dialling a zmq producer: the producer refuses the hello naming
    ``data_plane``, and the load fails ``handshake_mismatch`` without a byte moved."""
    p = make_manager({**HB, "data_plane": "zmq"})
    c = make_manager({**HB, "data_plane": "nixl", "load_timeout_s": 30.0})
    r = _one_block_hand_off(p, c, "kv-dp")
    assert (r.success, r.reason) == (False, "handshake_mismatch")
    assert metric(p, "kvtier_session_ends_total", reason="handshake_mismatch") == 1
    assert metric(p, "kvtier_block_sent_bytes_total") == 0


@pytest.mark.parametrize("data_plane", ["nixl"], indirect=True)
def test_a_nixl_tier_loading_from_its_own_address_fails_self_fetch_at_once(data_plane, make_manager, caplog):
    """A request naming the instance's own address (a router that picked it for both ends): a NIXL
    agent is not its own peer, so the load fails at once with ``self_fetch`` and a log line naming
    the cause and the fix; it failed ``handshake_mismatch``, with advice to repair NIXL (N26).  The
    zmq plane loads such a request (it has no agent)."""
    m = make_manager(HB)
    r = _one_block_hand_off(m, m, "kv-self")
    assert (r.success, r.reason) == (False, "self_fetch")
    assert metric(m, "kvtier_session_ends_total", reason="handshake_mismatch") == 0
    assert "is this tier itself (self_fetch)" in caplog.text and "same backends" not in caplog.text, caplog.text


def _other_pool_descriptor(block_bytes: int) -> bytes:
    """A well-formed NIXL plane descriptor of a pool with another block size."""
    import numpy as np

    from kvtier.dataplane.nixl import _Hello, this_process
    from kvtier.dataplane.nixl_agent import NixlBlockAgent

    agent = NixlBlockAgent("other-pool-agent", np.zeros((4, block_bytes), np.uint8), layout="raw")
    try:
        return msgspec.msgpack.encode(_Hello(agent.descriptor(), this_process()))
    finally:
        agent.close()


@pytest.mark.parametrize("data_plane", ["nixl"], indirect=True)
def test_unusable_nixl_descriptor_is_refused_naming_the_descriptor(data_plane, make_manager):
    """A hello that matches every compared field but carries a descriptor the NIXL plane cannot
    use (garbage, none, or a pool of another block size) is refused at once, with
    ``field="descriptor"``; the producer keeps serving its parked blocks to a good consumer."""
    p = make_manager(HB, num_blocks=8, block_bytes=4096)
    bad = {"garbage": b"\x93not a descriptor", "empty": b"", "other block size": _other_pool_descriptor(8192)}
    ctx = zmq.Context()
    dec = Decoder(block_bytes=4096)
    try:
        for gen, (label, descriptor) in enumerate(bad.items(), start=11):
            d = ctx.socket(zmq.DEALER)
            d.linger = 0
            d.connect(f"tcp://{p.address}")
            hello = wm.Hello(gen=gen, version=PROTOCOL_VERSION, instance="mallory", block_bytes=4096, layout="raw",
                             hash_seed="", data_plane="nixl", descriptor=descriptor)
            d.send(msgspec.msgpack.encode(hello))
            got: list = []

            def reply(sock=d, into=got):
                if sock.poll(0):
                    into.append(dec.decode(sock.recv_multipart())[0])
                return bool(into)

            assert pump_until(reply, managers=[p]), label
            assert isinstance(got[0], wm.HelloReject) and got[0].field == "descriptor", (label, got[0])
            d.close()
    finally:
        ctx.destroy(linger=0)
    assert metric(p, "kvtier_internal_errors_total") == 0
    # each refused session counted once (its end counts it; the refusal it sent is the same end)
    assert metric(p, "kvtier_session_ends_total", reason="handshake_mismatch") == len(bad)


@BOTH_PLANES
def test_an_unanswered_abort_is_answered_within_the_bound_and_a_late_write_never_reaches_the_slots(
    data_plane, producer, make_manager
):
    """The producer wedges (paused) with a fetch in its queue.  The consumer's load times out,
    its abort goes unanswered, it gives the session up and revokes the producer's access by
    itself (zmq: nothing lands outside in_flight; NIXL: the session's window of the pool is
    withdrawn, decision N14): the load fails exactly once, ``load_timeout``, within
    ``load_timeout_s + abort_ack_timeout_s + revoke_timeout_s``, while the producer still says
    nothing.  The engine reuses the slots at once (a new sentinel); the producer wakes and
    serves the stale fetch — on NIXL its WRITE completes into the withdrawn window's sink — and
    the slots still hold the engine's bytes.  A later request to the same producer loads
    byte-exact."""
    producer.start_manager({**HB, "peer_timeout_s": 30.0, "heartbeat_interval_s": 0.2}, num_blocks=NB, block_bytes=BB)
    keys = keys_for("kv-wedged", 4)
    producer.store("kv-wedged", 1, keys, [0, 1, 2, 3], seed=33)
    timers = {"load_timeout_s": 1.0, "abort_ack_timeout_s": 0.4, "revoke_timeout_s": 0.5}
    c = make_manager({**timers, "fetch_supply_timeout_s": 0.5, "handshake_timeout_s": 0.9, "peer_timeout_s": 30.0,
                      "heartbeat_interval_s": 0.2}, num_blocks=NB, block_bytes=BB)
    c.pool.tensor.fill_(SENTINEL)
    jobs = Jobs(c)
    req = consumer_req("c1", "kv-wedged", producer.host, producer.port)
    c.on_new_request(req)
    peer = f"{producer.host}:{producer.port}"
    assert pump_until(lambda: CoreView(c.core).session_ready(peer), managers=[c])

    dst = [40, 41, 42, 43]
    bound_s = sum(timers.values())
    producer.pause()
    try:
        t0 = time.monotonic()
        c.submit_load(job(5, keys, dst, req))
        assert pump_until(lambda: jobs.has(5), jobs=[jobs], timeout_s=bound_s + 3.0), c.core.consumer("kv-wedged")
        elapsed = time.monotonic() - t0
        assert (jobs.one(5).success, jobs.one(5).reason) == (False, "load_timeout")
        assert elapsed <= bound_s + 1.0, f"answered after {elapsed:.2f} s, bound {bound_s} s (machine shared)"
        assert metric(c, "kvtier_quarantined_blocks", role="consumer") == 0
        reused = 0x3C
        for s in dst:  # the engine reuses the slots the moment it has the result
            c.pool.view(s).fill_(reused)
    finally:
        producer.resume()

    # the producer serves the stale fetch (NIXL: a WRITE into the withdrawn window), then learns
    # the session is gone; it stays alive
    assert pump_until(lambda: producer.state("kv-wedged") == "tombstoned", managers=[c], jobs=[jobs])
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.3)
    assert digests(c.pool, dst) == [sentinel_digest(BB, reused)] * 4
    if data_plane == "nixl":
        assert producer.plane()["posts"] >= 1, "the stale fetch was never served: the late WRITE did not happen"

    keys2 = keys_for("kv-next", 3)
    stored2 = producer.store("kv-next", 2, keys2, [4, 5, 6], seed=34)
    req2 = consumer_req("c2", "kv-next", producer.host, producer.port)
    c.on_new_request(req2)
    assert pump_until(lambda: CoreView(c.core).session_ready(peer), managers=[c], jobs=[jobs])
    c.submit_load(job(6, keys2, [50, 51, 52], req2))
    assert pump_until(lambda: jobs.has(6), jobs=[jobs])
    assert jobs.one(6).success
    assert digests(c.pool, [50, 51, 52]) == stored2["digests"]
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.2)
    assert jobs.total() == 2


@pytest.mark.parametrize("data_plane", ["nixl"], indirect=True)
def test_a_private_pool_on_its_own_io_thread_completes_its_handshake_within_a_short_timeout(data_plane, make_manager):
    """A pool without windows (private memory) has no window to mark a session we dialled as in
    its handshake, so the consumer's I/O thread slept through its producer's warm-up READs (N15),
    each waiting for our progress: ~1 s per new session, and every load failed
    ``handshake_timeout`` with ``handshake_timeout_s`` 0.6 (an outside tester, 3 of 3)."""
    import torch

    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    producers = [make_manager({}), make_manager({})]  # each load is a new session's first
    c = KvTierManager({"host": "127.0.0.1", "port": 0, "data_plane": "nixl", "background_poll": True,
                       "handshake_timeout_s": 0.6, "load_timeout_s": 5.0, "abort_ack_timeout_s": 1.0,
                       "fetch_supply_timeout_s": 1.0},
                      BlockPool.wrap(torch.zeros((64, 4096), dtype=torch.uint8)))
    try:
        for n, p in enumerate(producers):
            r = _one_block_hand_off(p, c, f"kv-private-hs-{n}")
            assert r.success, r
            c.get_finished_jobs()  # job ids are reused by the next hand-off
    finally:
        c.shutdown()
