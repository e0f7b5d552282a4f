"""Every result true, no live producer condemned by a hiccup — over real sockets, both planes
(decisions I21-I28).

* a block that fails its digest check in the middle of a load: the load fails ``corrupt`` and
  reports as ``successful_keys`` exactly the verified prefix (the batches before the bad one),
  never a key of the bad batch or one after it, and those slots hold the parked bytes (I21);
* a consumer that cancels right behind its hello (its ``abort_fetch`` reaches a producer session
  still attaching: NIXL's warm-up READ) frees the producer's blocks in one round trip, not at the
  reap (I24);
* a connection reset between a consumer and a live producer fails the load in flight
  (``peer_disconnected``), and the next load to that producer dials afresh and succeeds — the
  instance is not held gone (I23); a producer that restarted on the same port is (its old
  instance is proven gone by the new hello_ack) and still serves the next load — also to a
  caller-driven consumer that made no call while it restarted (C33);
* a request cancelled while a landing of more than 1 MiB copies on the digest pool: its job's
  result comes after the last write into its slots — slots the engine refills at the result stay
  refilled (I26);
* a duplicate ``abort_fetch`` is acknowledged again and counted (I27);
* a slow consumer whose transfer the producer gives up learns why (``transfer_timeout``) on zmq
  too: the goodbye is read before the cut (I28);
* a quarantined NIXL transfer ends once the paused consumer resumes (UCX tcp and default).

The NIXL plane fault (I25) and the symmetric path's failed keys (I22) have their own files,
``test_plane_fault.py`` and ``tests/symmetric/test_failed_keys_real.py``.  Waits are failure
bounds, never timing assertions.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kvtier.api import RequestContext
from mgr_helpers import (
    BOTH_PLANES,
    SENTINEL,
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
from tests.support.raw_peer import RawConsumer
from tests.support import wedge
from tests.support.relay import TcpRelay
from kvtier.wire import messages as wm
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(120)

BB = 128 * 1024
NB = 64  # 8 MiB: batches of 32, 16, 8 and 8 blocks (4, 2, 1, 1 MiB; decision I16)
HB = {"heartbeat_interval_s": 0.2, "peer_timeout_s": 30.0}
CCFG = {**HB, "load_timeout_s": 20.0, "fetch_supply_timeout_s": 10.0}


@BOTH_PLANES
def test_a_corrupt_block_mid_load_reports_only_the_verified_prefix(data_plane, producer, make_manager):
    """Block 50 of 64 no longer matches its digest (the producer's engine rewrote it after the
    store).  It travels in the third batch (blocks 48-55); the fourth (56-63) lands intact after
    the hole.  The load fails ``corrupt`` with successful_keys a verified prefix — on zmq exactly
    keys 0..49 (the batches arrive in order, the result waits for the checks of the first two, and
    the bad batch's blocks before the hole were checked too); on NIXL the WRITEs of a window
    complete in any order, so a batch whose notification came after the failure is not in it —
    never the bad block or a key after it, and those slots hold the producer's bytes."""
    producer.start_manager(HB, num_blocks=NB, block_bytes=BB)
    c = make_manager(CCFG, num_blocks=NB, block_bytes=BB)
    c.pool.tensor.fill_(SENTINEL)
    jobs = Jobs(c)
    kv = "kv-hole"
    keys = keys_for(kv, NB)
    assert producer.store(kv, 1, keys, list(range(NB)), seed=9)["immediate"] == []
    producer.corrupt(50, 1000)
    req = consumer_req("c-hole", kv, producer.host, producer.port)
    c.on_new_request(req)
    c.submit_load(job(2, keys, list(range(NB)), req))
    assert pump_until(lambda: jobs.has(2), managers=[c], jobs=[jobs], timeout_s=20.0)
    r = jobs.one(2)
    assert (r.success, r.reason) == (False, "corrupt"), r
    k = len(r.successful_keys or ())
    assert k == 50 if data_plane == "zmq" else k in (0, 32, 50), r.successful_keys
    assert (r.successful_keys or ()) == tuple(keys[:k])
    assert digests(c.pool, range(k)) == [pattern_digest(9, i, BB) for i in range(k)]


@BOTH_PLANES
def test_a_release_right_behind_the_hello_frees_the_blocks_in_one_round_trip(data_plane, producer, make_manager):
    """The consumer announces the request (it dials: hello) and the engine finishes it at once:
    its ``abort_fetch`` follows the hello on the wire and reaches a producer session that may
    still be attaching (NIXL: the warm-up READ of the consumer's window).  The producer's store
    job fails ``aborted`` within 2 s (one round trip), not at ``unbound_store_timeout_s`` (60 s)."""
    producer.start_manager({**HB, "unbound_store_timeout_s": 60.0}, num_blocks=16, block_bytes=4096)
    c = make_manager(CCFG, num_blocks=16, block_bytes=4096)
    kv = "kv-early"
    assert producer.store(kv, 1, keys_for(kv, 4), [0, 1, 2, 3], seed=3)["immediate"] == []
    req = consumer_req("c-early", kv, producer.host, producer.port)
    t0 = time.monotonic()
    c.on_new_request(req)
    c.on_request_finished(req)  # before the session is ready: the abort goes right behind the hello
    got: list = []
    assert pump_until(lambda: got.extend(r for r in producer.results() if r["job_id"] == 1) or got,
                      managers=[c], timeout_s=10.0), producer.state(kv)
    assert [(r["success"], r["reason"]) for r in got] == [(False, "aborted")], got
    assert time.monotonic() - t0 < 2.0
    assert producer.state(kv) == "tombstoned"


def _load_once(c, producer, kv: str, job_id: int, n: int = 4, *, via: str | None = None) -> object:
    """Park ``n`` blocks of ``kv`` on ``producer`` and load them on ``c`` (dialling ``via``, a
    relay's address, when given); returns the load's result."""
    jobs = Jobs(c)
    keys = keys_for(kv, n)
    assert producer.store(kv, job_id, keys, list(range(n)), seed=job_id)["immediate"] == []
    host, port = (via or f"{producer.host}:{producer.port}").rsplit(":", 1)
    req = consumer_req(f"c-{kv}", kv, host, int(port))
    c.on_new_request(req)
    c.submit_load(job(job_id + 1, keys, list(range(8, 8 + n)), req))
    assert pump_until(lambda: jobs.has(job_id + 1), managers=[c], jobs=[jobs], timeout_s=15.0)
    c.on_request_finished(req)
    return jobs.one(job_id + 1)


@BOTH_PLANES
def test_a_connection_reset_does_not_condemn_a_live_producer(data_plane, producer, make_manager):
    """The control connection between a consumer and a live producer is reset mid-load (a relay
    on the path sends an RST each way): the load in flight fails ``peer_disconnected``; the next
    load to the same producer dials afresh and succeeds — it never fails ``instance_down`` without
    dialling (decision I23)."""
    producer.start_manager({**HB, "transfer_timeout_s": 20.0}, num_blocks=16, block_bytes=4096)
    c = make_manager(CCFG, num_blocks=16, block_bytes=4096)
    with TcpRelay(f"{producer.host}:{producer.port}") as relay:
        assert _load_once(c, producer, "kv-warm", 10, via=relay.address).success
        # the next load waits for blocks the producer has not stored yet; then the path resets
        jobs = Jobs(c)
        kv = "kv-reset"
        req = consumer_req("c-reset", kv, relay.host, relay.port)
        c.on_new_request(req)
        c.submit_load(job(21, keys_for(kv, 4), [8, 9, 10, 11], req))
        assert pump_until(lambda: producer.state(kv) == "awaiting", managers=[c], jobs=[jobs])
        relay.reset()
        assert pump_until(lambda: jobs.has(21), managers=[c], jobs=[jobs], timeout_s=10.0)
        assert (jobs.one(21).success, jobs.one(21).reason) == (False, "peer_disconnected"), jobs.one(21)
        assert CoreView(c.core).suspect_instances() == frozenset()
        c.on_request_finished(req)
        r = _load_once(c, producer, "kv-after", 30, via=relay.address)
        assert r.success, r
        assert CoreView(c.core).session_ready(relay.address)


def _served_then_crashed(producer, make_manager) -> tuple[Any, str, int]:
    """A consumer loads once from ``producer``, which then crashes: (the consumer, the crashed
    instance, its port)."""
    producer.start_manager({**HB}, num_blocks=16, block_bytes=4096)
    c = make_manager(CCFG, num_blocks=16, block_bytes=4096)
    assert _load_once(c, producer, "kv-first", 10).success
    old = CoreView(c.core).session(f"{producer.host}:{producer.port}").instance
    port = producer.port
    producer.crash_manager()
    return c, old, port


@BOTH_PLANES
def test_a_restarted_producer_is_proven_gone_and_its_successor_serves(data_plane, producer, make_manager):
    """The producer restarts on the same port (a new instance).  The consumer's next dial meets
    the new instance: its hello_ack proves the old one gone (decision I23), and the load on it
    succeeds."""
    c, old, port = _served_then_crashed(producer, make_manager)
    producer.start_manager({**HB, "port": port}, num_blocks=16, block_bytes=4096)
    assert pump_until(lambda: CoreView(c.core).session(f"{producer.host}:{port}") is None, managers=[c], timeout_s=10.0)
    r = _load_once(c, producer, "kv-second", 30)
    assert r.success, r
    assert old in CoreView(c.core).suspect_instances()
    assert CoreView(c.core).session(f"{producer.host}:{port}").instance != old


@BOTH_PLANES
def test_the_first_load_after_a_restart_is_served_even_after_a_refused_dial(data_plane, producer, make_manager):
    """The producer dies; a load while it is down is refused at the dial (``connect_refused``),
    which proves its instance gone.  It restarts on the same port: the very next load dials and is
    served by the new instance — the old proof does not fail it ``instance_down`` (decision I30)."""
    c, old, port = _served_then_crashed(producer, make_manager)
    addr = f"{producer.host}:{port}"
    assert pump_until(lambda: CoreView(c.core).session(addr) is None, managers=[c], timeout_s=10.0)
    jobs = Jobs(c)
    req = consumer_req("c-kv-down", "kv-down", producer.host, port)
    c.on_new_request(req)
    c.submit_load(job(21, keys_for("kv-down", 1), [8], req))
    assert pump_until(lambda: jobs.has(21), managers=[c], jobs=[jobs], timeout_s=10.0)
    assert (jobs.one(21).success, jobs.one(21).reason) == (False, "connect_refused")
    assert old in CoreView(c.core).suspect_instances()
    c.on_request_finished(req)
    producer.start_manager({**HB, "port": port}, num_blocks=16, block_bytes=4096)
    r = _load_once(c, producer, "kv-after", 30)
    assert r.success, r


@BOTH_PLANES
def test_a_cancel_during_a_pool_landing_reports_after_the_last_write(data_plane, make_manager):
    """16 MiB loads, cancelled while a landing of more than 1 MiB runs on the digest pool (zmq:
    copies into the slots; NIXL: checks).  The engine refills the slots the moment it has the
    job's result; nothing of the load lands in them afterwards (decision I26).  Five trials, the
    cancel after 0..4 landings were seen running."""
    n = 128
    p = make_manager({**HB, "background_poll": True, "poll_interval_s": 0.001}, num_blocks=n, block_bytes=BB)
    c = make_manager(CCFG, num_blocks=n, block_bytes=BB)
    fill_pattern(p.pool, range(n), seed=4)
    for trial in range(5):
        kv = f"kv-cancel-{trial}"
        keys = keys_for(kv, n)
        jobs = Jobs(c)
        preq = producer_req(f"p-{kv}", kv)
        p.on_new_request(preq)
        p.submit_store(job(100 + trial, keys, list(range(n)), preq))
        creq = consumer_req(f"c-{kv}", kv, p.host, p.port)
        c.on_new_request(creq)
        c.pool.tensor.fill_(SENTINEL)
        c.submit_load(job(200 + trial, keys, list(range(n)), creq))
        seen, end = 0, time.monotonic() + 10.0
        while time.monotonic() < end and seen <= trial and not jobs.has(200 + trial):
            c.poll(0.0005)
            jobs.pump()
            seen += c.plane.finish_landings(0.0) is False  # a landing still runs on the pool
        c.on_request_finished(creq)
        assert pump_until(lambda t=trial: jobs.has(200 + t), managers=[c], jobs=[jobs], timeout_s=10.0)
        c.pool.tensor.fill_(0x5A)  # the engine reuses the slots at once
        for _ in range(30):
            c.poll(0.001)
        assert digests(c.pool, range(n)) == [sentinel_digest(BB, 0x5A)] * n, f"trial {trial}: a write after the result"
        p.on_request_finished(preq)


def test_a_duplicate_abort_is_acknowledged_again_and_counted(make_manager):
    """A consumer's abort_fetch of a parked id tombstones it (abort_ack); the same abort again —
    a retry after a lost ack, or a network duplicate — is acknowledged again, so the consumer is
    never left waiting, and counted (``kvtier_ignored_inputs_total{machine=producer,reason=stale}``)
    instead of passing silently (decision I27)."""
    p = make_manager({"background_poll": True, "poll_interval_s": 0.001, **HB}, num_blocks=16, block_bytes=4096)
    preq = producer_req("p-dup", "kv-dup")
    p.on_new_request(preq)
    p.submit_store(job(1, keys_for("kv-dup", 2), [0, 1], preq))
    before = metric(p, "kvtier_ignored_inputs_total", machine="producer", reason="stale")
    with RawConsumer(p.address, block_bytes=4096) as raw:
        raw.hello()
        for _ in range(2):
            raw.abort("kv-dup", 0, fetched=False)
            assert raw.expect(wm.AbortAck).kv_request_id == "kv-dup"
    assert metric(p, "kvtier_ignored_inputs_total", machine="producer", reason="stale") == before + 1
    assert p.core.producer_state("kv-dup").value == "tombstoned"


@BOTH_PLANES
def test_a_slow_consumer_learns_why_the_producer_gave_its_transfer_up(data_plane, victim, make_manager, monkeypatch):
    """10 trials: the consumer runs 2 ms of every 100-200 ms (SIGSTOP/SIGCONT), so the producer's
    ``transfer_timeout_s`` (0.3 s) passes mid-transfer, then its cancel deadline: it gives the
    session up (``transfer_stalled``).  Its notice and its goodbye name why, and the connection is
    cut only once the goodbye had ``shutdown_grace_s`` to leave behind the data already queued
    (decision I28).  The consumer recovers as the producer gives up (slow, not dead), so it reads
    its way to the goodbye within the grace and reports ``transfer_timeout`` (or success when
    every block still landed intact), never the bare ``peer_disconnected`` of a cut that
    overtook the reason — on zmq too, where the notice queues behind the data.  (Kept throttled
    through the grace, whether it reached the goodbye was the host's speed: 10 of 10 trials on
    some runs, 0 of 10 on others, on the same quiet host.)"""
    if data_plane == "nixl":
        monkeypatch.setenv("UCX_TLS", "tcp")  # WRITEs need the consumer's progress
    # zmq: 96 MiB, more than the 32 MiB a transfer may have inside the transport plus what the
    # kernel's socket buffers take on loopback (tcp_rmem's 32 MiB and tcp_wmem's 4 MiB here), so
    # the transfer cannot end within the deadlines
    bb, nb = 128 * 1024, (768 if data_plane == "zmq" else 128)
    p = make_manager({**HB, "transfer_timeout_s": 0.3, "shutdown_grace_s": 3.0}, num_blocks=nb, block_bytes=bb)
    pjobs = Jobs(p)
    reasons = []
    for trial in range(10):
        victim.start_manager({**HB, "load_timeout_s": 20.0, "fetch_supply_timeout_s": 15.0}, num_blocks=nb,
                             block_bytes=bb)
        kv = f"kv-slow-{trial}"
        keys = keys_for(kv, nb)
        assert victim.load(kv, 100 + trial, keys, list(range(nb)), host=p.host, port=p.port) == []
        assert pump_until(lambda kv=kv: p.core.producer_state(kv).value == "awaiting", managers=[p], jobs=[pjobs])
        throttle = wedge.Throttle(victim.pid, run_s=0.002, stop_s=0.2 if data_plane == "zmq" else 0.1)
        try:
            throttle.start()
            preq = producer_req(f"p-{kv}", kv)
            p.on_new_request(preq)
            ends = metric(p, "kvtier_session_ends_total", reason="transfer_stalled")
            p.submit_store(job(trial + 1, keys, list(range(nb)), preq))

            def gave_up(ends=ends) -> bool:  # the session's end queues the goodbye in the same pass
                return metric(p, "kvtier_session_ends_total", reason="transfer_stalled") > ends

            assert pump_until(lambda t=trial: gave_up() or pjobs.has(t + 1), managers=[p], jobs=[pjobs],
                              timeout_s=20.0)
        finally:
            throttle.close()  # the consumer recovers: it has the whole grace to read up to the goodbye
        assert pump_until(lambda t=trial: pjobs.has(t + 1), managers=[p], jobs=[pjobs], timeout_s=20.0)
        # the producer keeps running (as its background thread would): its goodbye waits in its
        # own send queue until a pass hands it to the transport
        got: list = []
        assert pump_until(
            lambda j=100 + trial: got.extend(r for r in victim.call("results") if r["job_id"] == j) or got,
            managers=[p], jobs=[pjobs], timeout_s=20.0,
        )
        got.extend(victim.wait_results([100 + trial], timeout_s=0.2).get(100 + trial, []))
        assert len(got) == 1, got
        reasons.append("ok" if got[0]["success"] else got[0]["reason"])
    assert set(reasons) <= {"transfer_timeout", "ok"} and reasons.count("transfer_timeout") >= 5, reasons


@pytest.mark.parametrize("tls", ["tcp", "default"])
@pytest.mark.parametrize("data_plane", ["nixl"], indirect=True)
def test_a_quarantined_transfer_ends_once_the_paused_consumer_resumes(data_plane, tls, victim, make_manager,
                                                                      monkeypatch):
    """The consumer is paused (SIGSTOP) while 96 blocks are written into it (UCX tcp: its WRITEs
    wait for the consumer's progress), past the producer's transfer and cancel deadlines: the
    producer gives the session up and quarantines the blocks (its WRITEs still run).  Once the
    consumer runs again the WRITEs end and the quarantine with them: within 5 s of the resume
    (bound), the store job has its one result and no block stays quarantined."""
    if tls == "tcp":
        monkeypatch.setenv("UCX_TLS", "tcp")
    bb, nb = 128 * 1024, 96
    p = make_manager({**HB, "transfer_timeout_s": 0.3}, num_blocks=nb, block_bytes=bb)
    pjobs = Jobs(p)
    victim.start_manager({**HB, "load_timeout_s": 20.0, "fetch_supply_timeout_s": 15.0}, num_blocks=nb, block_bytes=bb)
    kv = "kv-quarantine"
    keys = keys_for(kv, nb)
    assert victim.load(kv, 100, keys, list(range(nb)), host=p.host, port=p.port) == []
    assert pump_until(lambda: p.core.producer_state(kv).value == "awaiting", managers=[p], jobs=[pjobs])
    wedge.stop(victim.pid)
    try:
        preq = producer_req("p-q", kv)
        p.on_new_request(preq)
        p.submit_store(job(1, keys, list(range(nb)), preq))
        assert pump_until(lambda: p.core.quarantined_count() > 0 or pjobs.has(1), managers=[p], jobs=[pjobs])
    finally:
        wedge.cont(victim.pid)
    assert pump_until(lambda: p.core.quarantined_count() == 0 and pjobs.has(1), managers=[p], jobs=[pjobs],
                      timeout_s=5.0), (p.core.quarantined_blocks(), p.core.producer_state(kv))
    assert len(pjobs.by_id[1]) == 1
    assert len(victim.wait_results([100], timeout_s=10.0)[100]) == 1


@pytest.mark.parametrize("how", ["graceful", "crash"])
def test_an_idle_caller_driven_consumer_loads_from_a_restarted_producer(how, make_manager):
    """A caller-driven consumer (``background_poll: false``) makes no call while its producer
    stops (``shutdown``, or closes with no goodbye) and a new one starts on the same port with the
    next id parked.  Its next load dials the new producer and succeeds byte-exact: the engine call
    applies first what the network delivered before it (the goodbye, the close), then the load.
    It failed ``shutdown`` (``peer_disconnected`` after a crash): the load was attached to the
    dead session, whose end was read only after it (decision C33)."""
    def producer(port: int, kid: str, seed: int):
        p = make_manager({"port": port, "background_poll": True}, num_blocks=4, block_bytes=4096)
        want = fill_pattern(p.pool, [0], seed)
        req = producer_req(f"p-{kid}", kid)
        p.on_new_request(req)
        p.submit_store(job(1, keys_for(kid, 1), [0], req))
        p.on_request_finished(req)
        return p, want

    c = make_manager({}, num_blocks=4, block_bytes=4096)
    jobs = Jobs(c)

    def load(p, kid: str, job_id: int, slot: int):
        host, port = p.address.rsplit(":", 1)
        req = consumer_req(f"c-{kid}", kid, host, int(port))
        c.on_new_request(req)
        c.submit_load(job(job_id, keys_for(kid, 1), [slot], req))
        assert pump_until(lambda: jobs.has(job_id), managers=[c], jobs=[jobs])
        c.on_request_finished(req)
        return jobs.one(job_id)

    p1, want_a = producer(0, "kv-a", 1)
    assert load(p1, "kv-a", 1, 0).success
    port = int(p1.address.rsplit(":", 1)[1])
    if how == "crash":
        p1.close_abruptly()
    else:
        p1.shutdown()
    p2, want_b = producer(port, "kv-b", 2)
    time.sleep(0.5)  # the consumer makes no call: its engine is idle
    r = load(p2, "kv-b", 2, 1)
    assert (r.success, r.reason) == (True, None)
    assert digests(c.pool, [1]) == want_b
    assert jobs.total() == 2

