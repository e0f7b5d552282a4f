"""A consumer request's finish once its load ended costs the engine's thread no wake-up (decision
C40); a naming, a load and a finish that aborts a load still wake the loop at once.

``MAX_WAIT_S`` and the heartbeat are stretched so that only the rule under test can wake a loop in
time; nobody calls ``get_finished_jobs`` (it wakes a loop with commands queued) until a test says so.
"""

from __future__ import annotations

import time

import pytest

import kvtier.shell.loop as loop_module
from kvtier.lifecycle import ConsumerState
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from tests.manager.mgr_helpers import asleep, consumer_req, fill_pattern, job, keys_for, producer_req, pump_until

_QUIET = {"host": "127.0.0.1", "port": 0, "background_poll": True, "heartbeat_interval_s": 600.0,
          "peer_timeout_s": 1800.0, "fetch_supply_timeout_s": 600.0, "load_timeout_s": 1200.0,
          "unbound_store_timeout_s": 600.0}


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(loop_module, "MAX_WAIT_S", 60.0)
    p = KvTierManager(_QUIET, BlockPool(16, 256, pin=False))
    c = KvTierManager(_QUIET, BlockPool(16, 256, pin=False))
    yield p, c
    c.shutdown()
    p.shutdown()


def _state(m: KvTierManager, kid: str) -> ConsumerState:
    with m.lock:
        return m.core.consumer_state(kid)


def _park(p: KvTierManager, kid: str, slot: int) -> None:
    req = producer_req("p" + kid, kid)
    p.on_new_request(req)
    fill_pattern(p.pool, [slot], seed=slot)
    p.submit_store(job(100 + slot, keys_for(kid, 1), [slot], req))
    p.on_request_finished(req)


def test_every_naming_wakes_the_loop_to_dial_or_announce_at_once(pair) -> None:
    p, c = pair
    _park(p, "A", 0)
    _park(p, "B", 1)
    for n, kid in enumerate("AB"):  # a first naming of the producer, and one of a producer already named
        req = consumer_req("c" + kid, kid, p.host, p.port)
        before = asleep(c)
        c.on_new_request(req)
        assert pump_until(lambda: c.passes > before, timeout_s=10.0), f"naming {kid} did not wake the loop"
        assert pump_until(lambda: _state(c, kid) is ConsumerState.ANNOUNCED, timeout_s=10.0)
        c.submit_load(job(n + 1, keys_for(kid, 1), [8 + n], req))
        assert pump_until(lambda: _state(c, kid) is ConsumerState.LOADED, timeout_s=20.0)
    assert {r.job_id: r.success for r in c.get_finished_jobs()} == {1: True, 2: True}


def test_an_ended_loads_finish_waits_a_running_loads_finish_aborts_at_once(pair) -> None:
    p, c = pair
    _park(p, "A", 0)
    done = consumer_req("cA", "A", p.host, p.port)
    c.on_new_request(done)
    c.submit_load(job(1, keys_for("A", 1), [8], done))
    assert pump_until(lambda: _state(c, "A") is ConsumerState.LOADED, timeout_s=20.0)

    before = asleep(c)
    c.on_request_finished(done)
    time.sleep(0.3)
    assert c.passes == before and _state(c, "A") is ConsumerState.LOADED, "an ended load's finish woke the loop"
    assert [(r.job_id, r.success) for r in c.get_finished_jobs()] == [(1, True)]  # which wakes it
    assert pump_until(lambda: _state(c, "A") is ConsumerState.ABSENT, timeout_s=10.0)

    running = consumer_req("cR", "R", p.host, p.port)  # nothing parked under R: the fetch waits for a store
    c.on_new_request(running)
    c.submit_load(job(2, keys_for("R", 1), [9], running))
    assert pump_until(lambda: _state(c, "R") is ConsumerState.IN_FLIGHT, timeout_s=20.0)
    asleep(c)
    c.on_request_finished(running)
    assert pump_until(lambda: _state(c, "R") is not ConsumerState.IN_FLIGHT, timeout_s=10.0), \
        "a finish that aborts did not wake"
    assert pump_until(lambda: [(r.job_id, r.success, r.reason) for r in c.get_finished_jobs()]
                      == [(2, False, "cancelled")], timeout_s=20.0)
