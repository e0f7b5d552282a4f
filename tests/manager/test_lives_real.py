"""An id's lives, duplicate hellos and prompt refusals, over real ZeroMQ.

* B14 — a ``kv_request_id`` reused after its tombstone was pruned: a straggler ``abort_fetch``
  (and ``receipt``) of the first life, arriving while the second life is parked, is acknowledged
  and changes nothing; the second life is then fetched and served with *its* bytes.  The consumer
  here is a raw DEALER speaking the wire protocol (:mod:`tests.support.raw_peer`), so the
  straggler is sent exactly when the test wants it.
* I5 / B30 — a second ``hello`` with the same generation on a ready session is answered
  ``hello_ack`` again; the session stays up and loads continue.
* vLLM — a producer request that finished with nothing stored: a consumer's
  fetch is refused in one round trip (``nothing_stored``; ``incomplete`` when the fetch was
  already waiting), never after ``fetch_supply_timeout_s``.  A ``remote_port`` written as a
  numeric string works end to end.

Waits are bounds (``BOUND_S``); the configured timeouts they must beat are far longer.
"""

from __future__ import annotations

import hashlib

import pytest

from kvtier.lifecycle._table import ProducerState, SessionState
from tests.support.raw_peer import RawConsumer
from kvtier.wire import messages as wm
from mgr_helpers import (
    SENTINEL,
    Jobs,
    consumer_req,
    digests,
    fill_pattern,
    job,
    keys_for,
    metric,
    metric_sum,
    producer_req,
    pump_until,
)
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)

BOUND_S = 5.0
BB = 4096


def _producer(make_manager, **cfg):
    # background_poll: the producer answers while the test blocks on the raw consumer's socket
    return make_manager({"background_poll": True, "poll_interval_s": 0.001, "heartbeat_interval_s": 0.2,
                         "peer_timeout_s": 30.0, **cfg}, num_blocks=16, block_bytes=BB)


def _serve(raw: RawConsumer, kv: str, rnd: int, keys: list[bytes]) -> list[str]:
    """Fetch ``kv`` in round ``rnd`` and read its block data; returns the sha256 of each block."""
    raw.fetch(kv, rnd, keys)
    got: list[str] = []
    while len(got) < len(keys):
        m = raw.recv(BOUND_S)
        assert m is not None, f"{kv} round {rnd}: no block_data"
        msg, payloads = m
        assert isinstance(msg, wm.BlockData) and msg.round == rnd, msg
        got += [hashlib.sha256(p).hexdigest() for p in payloads]
    return got


def _result(p, jobs: Jobs, job_id: int):
    assert pump_until(lambda: jobs.has(job_id), jobs=[jobs], timeout_s=BOUND_S), f"job {job_id}: no result"
    return jobs.one(job_id)


def test_b14_straggler_of_a_pruned_life_never_touches_the_next_life(make_manager):
    """B14: life 1 of ``kv-life`` is stored, fetched in round 7, confirmed (done) and pruned
    (tombstone_retention_s=0.2).  Life 2 is stored under the same id by a new engine request.
    Then the straggler abort of round 7 (``fetched=true``) and a straggler receipt arrive.
    Expected: the abort is acknowledged and life 2 stays ``parked`` with its store job
    outstanding (not ``aborted``); the receipt changes nothing; a fetch in round 8 is served
    life 2's bytes, and its receipt completes life 2's job."""
    p = _producer(make_manager, tombstone_retention_s=0.2)
    pjobs = Jobs(p)
    keys = keys_for("kv-life", 2)
    with RawConsumer(p.address, block_bytes=BB) as raw:
        raw.hello()
        r1 = producer_req("p-life-1", "kv-life")
        p.on_new_request(r1)
        life1 = fill_pattern(p.pool, [0, 1], seed=141)
        p.submit_store(job(1, keys, [0, 1], r1))
        assert _serve(raw, "kv-life", 7, keys) == life1
        raw.receipt("kv-life", 7)
        assert _result(p, pjobs, 1).success
        p.on_request_finished(r1)
        assert pump_until(lambda: p.core.producer_state("kv-life") is ProducerState.ABSENT, timeout_s=BOUND_S)

        r2 = producer_req("p-life-2", "kv-life")
        p.on_new_request(r2)
        life2 = fill_pattern(p.pool, [2, 3], seed=142)
        assert life2 != life1
        p.submit_store(job(2, keys, [2, 3], r2))
        raw.abort("kv-life", 7, fetched=True)  # the straggler
        ack = raw.expect(wm.AbortAck, timeout_s=BOUND_S)
        assert (ack.kv_request_id, ack.round) == ("kv-life", 7)
        raw.receipt("kv-life", 7)
        raw.ping()  # answered after the receipt was applied (one FIFO connection)
        raw.expect(wm.Pong, timeout_s=BOUND_S, skip=())
        assert p.core.producer_state("kv-life") is ProducerState.PARKED
        pjobs.pump()
        assert not pjobs.has(2), pjobs.by_id

        assert _serve(raw, "kv-life", 8, keys) == life2
        raw.receipt("kv-life", 8)
        r = _result(p, pjobs, 2)
        assert (r.success, r.reason) == (True, None)
        assert p.core.producer_state("kv-life") is ProducerState.DONE
    assert pjobs.total() == 2
    assert metric(p, "kvtier_internal_errors_total") == 0


def test_duplicate_hello_on_a_ready_session_is_answered_and_loads_continue(make_manager):
    """I5: a second hello carrying the session's generation is a duplicate: answered hello_ack
    again, the session stays ready (no session end on either side) and the next fetch is served.
    A hello with a *new* generation is the peer restarting: the old session ends
    (``peer_restarted``) and the new one serves."""
    p = _producer(make_manager)
    pjobs = Jobs(p)
    with RawConsumer(p.address, block_bytes=BB) as raw:
        first = raw.hello()
        again = raw.hello()
        assert again.instance == first.instance == p.instance
        (peer,) = [v.peer for v in CoreView(p.core).sessions() if v.state is SessionState.READY]
        assert metric_sum(p, "kvtier_session_ends_total") == 0
        req = producer_req("p-dup", "kv-dup")
        p.on_new_request(req)
        stored = fill_pattern(p.pool, [0], seed=5)
        p.submit_store(job(1, keys_for("kv-dup", 1), [0], req))
        assert _serve(raw, "kv-dup", 1, keys_for("kv-dup", 1)) == stored
        raw.receipt("kv-dup", 1)
        assert _result(p, pjobs, 1).success
        assert CoreView(p.core).session_state(peer) is SessionState.READY

        raw.gen += 1  # the peer restarted: a new generation on the same connection
        raw.hello()
        assert pump_until(lambda: metric(p, "kvtier_session_ends_total", reason="peer_restarted") == 1,
                          timeout_s=BOUND_S)
        assert CoreView(p.core).session_ready(peer)
        req2 = producer_req("p-dup2", "kv-dup2")
        p.on_new_request(req2)
        stored2 = fill_pattern(p.pool, [1], seed=6)
        p.submit_store(job(2, keys_for("kv-dup2", 1), [1], req2))
        assert _serve(raw, "kv-dup2", 2, keys_for("kv-dup2", 1)) == stored2
        assert metric_sum(p, "kvtier_session_ends_total") == 1


# -- vLLM: a producer request with nothing stored --------------------------------------------------

P_CFG = {"fetch_supply_timeout_s": 30.0, "load_timeout_s": 60.0, "heartbeat_interval_s": 0.2, "peer_timeout_s": 60.0}
C_CFG = {"fetch_supply_timeout_s": 30.0, "load_timeout_s": 60.0, "heartbeat_interval_s": 0.2, "peer_timeout_s": 60.0}


@pytest.mark.parametrize("order", ["finish_then_fetch", "fetch_then_finish"])
def test_producer_request_finished_with_nothing_stored_is_refused_in_one_round_trip(make_manager, order):
    """vLLM could not store the producer request's chunks, so no store job came;
    the request finished.  Expected: the consumer's load fails at once with ``nothing_stored``,
    whether the fetch arrives after the finish or was already waiting (decision L18) — within the
    5 s bound, although fetch_supply_timeout_s is 30 s; not one byte lands."""
    p = make_manager(P_CFG, num_blocks=4, block_bytes=BB)
    c = make_manager(C_CFG, num_blocks=4, block_bytes=BB)
    c.pool.tensor.fill_(SENTINEL)
    cjobs = Jobs(c)
    preq = producer_req("p-none", "kv-none")
    assert p.on_new_request(preq) == "producer"
    creq = consumer_req("c-none", "kv-none", p.host, p.port)
    c.on_new_request(creq)
    if order == "finish_then_fetch":
        p.on_request_finished(preq)
        assert p.core.producer_state("kv-none") is ProducerState.TOMBSTONED
        c.submit_load(job(1, keys_for("kv-none", 2), [0, 1], creq))
        want = "nothing_stored"
    else:
        c.submit_load(job(1, keys_for("kv-none", 2), [0, 1], creq))
        assert pump_until(lambda: p.core.producer_state("kv-none") is ProducerState.AWAITING, managers=[p, c],
                          timeout_s=BOUND_S)
        p.on_request_finished(preq)
        want = "nothing_stored"
    assert pump_until(lambda: cjobs.has(1), managers=[p, c], jobs=[cjobs], timeout_s=BOUND_S)
    assert (cjobs.one(1).success, cjobs.one(1).reason) == (False, want)
    assert metric(p, "kvtier_fetches_refused_total", reason=want) == 1
    assert metric(c, "kvtier_block_landed_bytes_total") == 0
    assert digests(c.pool, [0, 1]) == digests(c.pool, [2, 3])  # untouched sentinel fill


def test_remote_port_as_a_numeric_string_works_end_to_end(make_manager):
    """``remote_port: "5710"`` (a proxy that writes JSON strings): the consumer dials the
    producer and the load succeeds byte-exact."""
    p = make_manager(P_CFG, num_blocks=4, block_bytes=BB)
    c = make_manager(C_CFG, num_blocks=4, block_bytes=BB)
    cjobs = Jobs(c)
    preq = producer_req("p-str", "kv-str")
    p.on_new_request(preq)
    stored = fill_pattern(p.pool, [0, 1], seed=57)
    p.submit_store(job(1, keys_for("kv-str", 2), [0, 1], preq))
    creq = consumer_req("c-str", "kv-str", p.host, str(p.port))
    assert isinstance(creq.kv_transfer_params["remote_prefiller"]["remote_port"], str)
    assert c.on_new_request(creq) == "consumer"
    c.submit_load(job(2, keys_for("kv-str", 2), [2, 3], creq))
    assert pump_until(lambda: cjobs.has(2), managers=[p, c], jobs=[cjobs], timeout_s=BOUND_S)
    assert cjobs.one(2).success
    assert digests(c.pool, [2, 3]) == stored
