"""The symmetric path (``remote_kv_source``) inside real vLLM 0.33.0 code, on CPU.

Two engines, each a real v1 ``Scheduler`` with the real ``OffloadingConnector``,
``TieringOffloadingManager`` and its own kvtier tier with ``serve_external`` on, talking over
kvtier's transport on 127.0.0.1 (the harness of ``vllm_harness.py``: only the GPU worker is faked).
Each engine serves and fetches: B loads what A computed, then A loads what B computed, the bytes
the worker loads identical to the ones the other worker stored, vLLM counting them as computed,
and the serving side's pins (store jobs of its tiering manager) all released afterwards.
Variants: the peer lacks the last block (partial: the missing block is computed, never probed
twice); the peer is unreachable (the request is computed after a MISS, well inside the probe
bound); a ``reset_cache`` on the serving engine while it pins blocks for an unfetched round
(vLLM asserts that no job is left after the drain: ``drain_jobs`` releases the pins, decision V5).
Properties exercised:
``probe_answered_in_bound``, ``pin_released_once``, ``no_hit_without_pin``.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from tests.integrations.vllm_harness import (  # the harness (and its module-level skips)
    BLOCK,
    TIER,
    Engine,
    LookupResult,
    ReqContext,
    finish,
    keys,
    managers,  # noqa: F401  (fixture)
    model_dir,  # noqa: F401  (fixture)
    pattern,
    producer_store,
    run,
    stat,
    step,
)
from tools.coreview import CoreView

pytestmark = [pytest.mark.vllm]

SERVE = {**TIER, "serve_external": True}


def source(kid: str, engine: Engine) -> dict[str, Any]:
    host, port = engine.tier.address.rsplit(":", 1)
    return {"remote_kv_source": {"kv_request_id": kid, "remote_host": host, "remote_port": int(port)}}


def prompt_of(seed: int, n_tokens: int) -> list[int]:
    return [(i * seed + 3) % 1000 + 10 for i in range(n_tokens)]


def pins_outstanding(engine: Engine) -> int:
    """Store jobs of the serving engine's tiering manager still outstanding under the kvtier tier
    (a pin is one): 0 once every pin was released."""
    return len(engine.manager._jobs)


def idle(engines: list[Engine]) -> bool:
    return not any(e.busy() or e.tier.has_pending_work() for e in engines)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_two_instances_each_serve_and_fetch_with_real_schedulers(model_dir: str, data_plane: str) -> None:
    """A computes prompt 1, B fetches its 6 full blocks; B computes prompt 2, A fetches it; both
    byte-identical, counted as computed, every pin released; then a partial (A lacks the last
    block) and an unreachable peer."""
    plane = {"data_plane": data_plane}
    a = Engine("symA", model_dir, {**SERVE, **plane})
    b = Engine("symB", model_dir, {**SERVE, **plane})
    engines = [a, b]
    try:
        # -- 1. A computes prompt 1 locally (no kv_transfer_params): its blocks live in A's tiers
        p1 = prompt_of(7, 6 * BLOCK + 2)
        a.add("A-local-1", p1, 1, {})
        run([a], lambda: "A-local-1" in a.finished, "A's local prefill")
        assert len(a.stored) >= 6

        # -- 2. B gets prompt 1 naming A: probe -> HIT x6 -> one fetch -> loaded, not computed
        t0 = time.monotonic()
        b.add("B-sym-1", p1, 2, source("sym-1", a))
        run(engines, lambda: "B-sym-1" in b.finished, "B's symmetric request")
        loaded = b.loaded["B-sym-1"]
        assert len(loaded) == 6, f"B loaded {len(loaded)} blocks"
        for h in loaded:  # what B's worker loaded == what A's worker stored
            assert b.loaded_bytes[h] == a.stored[h] == pattern(h).tobytes()
        assert b.scheduled["B-sym-1"] < len(p1) - 5 * BLOCK  # only the tail (and decode) computed
        assert stat(b.tier, "kvtier_probe_keys_total{answer=hit}") == 6
        assert stat(a.tier, "kvtier_served_keys_total{answer=hit}") == 6
        run(engines, lambda: idle(engines), "both idle after round 1")
        assert pins_outstanding(a) == 0, "A still holds pins for B"
        assert stat(a.tier, "kvtier_pins_released_total{outcome=ok") >= 1
        assert stat(a.tier, "kvtier_pins_released_total{outcome=fail") == 0
        first_s = time.monotonic() - t0

        # -- 3. the other way round: B computes prompt 2, A fetches it from B
        p2 = prompt_of(11, 4 * BLOCK + 5)
        b.add("B-local-2", p2, 1, {})
        run([b], lambda: "B-local-2" in b.finished, "B's local prefill")
        a.add("A-sym-2", p2, 2, source("sym-2", b))
        run(engines, lambda: "A-sym-2" in a.finished, "A's symmetric request")
        assert len(a.loaded["A-sym-2"]) == 4
        for h in a.loaded["A-sym-2"]:
            assert a.loaded_bytes[h] == b.stored[h]
        assert a.scheduled["A-sym-2"] < len(p2) - 3 * BLOCK
        run(engines, lambda: idle(engines), "both idle after round 2")
        assert pins_outstanding(b) == 0

        # -- 4. partial: A holds the first 5 blocks of prompt 3 but not its 6th
        p3 = prompt_of(13, 6 * BLOCK + 2)
        p3_a = p3[: 5 * BLOCK] + prompt_of(17, BLOCK + 2)  # same 5 blocks, another 6th
        a.add("A-local-3", p3_a, 1, {})
        run([a], lambda: "A-local-3" in a.finished, "A's local prefill of the partial prompt")
        served_before = stat(a.tier, "kvtier_served_keys_total{answer=")
        b.add("B-sym-3", p3, 2, source("sym-3", a))
        run(engines, lambda: "B-sym-3" in b.finished, "B's partial symmetric request")
        assert len(b.loaded["B-sym-3"]) == 5
        for h in b.loaded["B-sym-3"]:
            assert b.loaded_bytes[h] == a.stored[h]
        assert b.scheduled["B-sym-3"] >= BLOCK + 2  # the 6th block and the tail were computed
        run(engines, lambda: idle(engines), "both idle after the partial round")
        # six keys answered once each: the missing 6th was not probed a second time (decision Y3)
        assert stat(a.tier, "kvtier_served_keys_total{answer=") - served_before == 6
        assert pins_outstanding(a) == 0

        # -- 5. unreachable peer: nobody listens on the port; MISS, the prompt is computed
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead_port = s.getsockname()[1]
        p4 = prompt_of(19, 3 * BLOCK + 1)
        t1 = time.monotonic()
        b.add("B-sym-4", p4, 2, {"remote_kv_source": {"kv_request_id": "sym-4", "remote_host": "127.0.0.1",
                                                       "remote_port": dead_port}})
        run(engines, lambda: "B-sym-4" in b.finished, "B's request to an unreachable peer", timeout_s=15)
        unreachable_s = time.monotonic() - t1
        assert "B-sym-4" not in b.loaded and b.scheduled["B-sym-4"] >= len(p4)
        # bounded by probe_timeout_s (1 s) from the round's first key, plus scheduling slack
        assert unreachable_s < 1.0 + 2.0, f"unreachable peer deferred the request {unreachable_s:.1f} s"
        print(f"\n[{data_plane}] first symmetric request {first_s * 1e3:.0f} ms (cold session); "
              f"unreachable peer computed after {unreachable_s * 1e3:.0f} ms")
        run(engines, lambda: idle(engines), "both idle at the end")
    finally:
        for e in engines:
            e.shutdown()


@pytest.mark.timeout(90)
def test_serving_is_off_by_default_and_the_request_is_computed(model_dir: str) -> None:
    """A tier without ``serve_external`` refuses probes (``not_serving``) in one round trip; the
    consumer's lookups answer MISS and vLLM computes the whole prompt."""
    a = Engine("offA", model_dir, TIER)
    b = Engine("offB", model_dir, SERVE)
    engines = [a, b]
    try:
        p = prompt_of(23, 3 * BLOCK + 4)
        a.add("A-local", p, 1, {})
        run([a], lambda: "A-local" in a.finished, "A's local prefill")
        b.add("B-sym", p, 2, source("sym-off", a))
        run(engines, lambda: "B-sym" in b.finished, "B's request")
        assert "B-sym" not in b.loaded and b.scheduled["B-sym"] >= len(p)
        assert stat(a.tier, "kvtier_fetches_refused_total{reason=not_serving}") == 1
        run(engines, lambda: idle(engines), "both idle")
        assert pins_outstanding(a) == 0
    finally:
        for e in engines:
            e.shutdown()


# -- manager level: vLLM p2p's held-pin reset_cache, and a partial load ----------------------------
def _wait(pred, *mgrs, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        for m in mgrs:
            with m.lock:
                step(m)
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def _held_round(managers) -> tuple[Any, Any, Any, Any, list[bytes], ReqContext, ReqContext, Any]:
    """A holds 3 blocks; B's symmetric request probed them and A answered every one HIT (pinned
    for B's round, one store job of A's tiering manager): returns (prod, ptier, cons, ctier, keys,
    A's request, B's request, A's primary view)."""
    prod, ptier = managers(SERVE)
    cons, ctier = managers(SERVE)
    host, port = ptier.address.rsplit(":", 1)
    pview = __import__("numpy").asarray(prod.primary_tier.get_kv_memoryview())
    ks = keys("held", 3)
    L = ReqContext("req-L", kv_transfer_params=None)
    with prod.lock:
        prod.on_new_request(L)
    producer_store(prod, L, ks, pview)
    S = ReqContext("req-S", kv_transfer_params={"remote_kv_source": {
        "kv_request_id": "held-1", "remote_host": host, "remote_port": int(port)}})
    with cons.lock:
        cons.on_new_request(S)
        assert [cons.lookup(k, S) for k in ks] == [LookupResult.RETRY] * 3
        step(cons, ("req-S",))  # the tier's on_schedule_end sends the probe (once the session is up)
    _wait(lambda: CoreView(ptier.kvtier.core).serve_ids() and CoreView(ptier.kvtier.core).pins_held(), prod, cons)
    assert len(prod._jobs) == 1  # the pin: one store job of A's tiering manager
    return prod, ptier, cons, ctier, ks, L, S, pview


@pytest.mark.timeout(60)
def test_reset_cache_while_pins_are_held_for_an_unfetched_round(managers) -> None:
    """A answered B's probe (every block HIT, pinned) and B has not fetched yet; A's engine resets
    its cache.  vLLM's reset_cache drains the tier and asserts no job of its is left: kvtier's
    drain_jobs ends the unfetched round (drained), releasing its pins through their store jobs'
    results, so the assertion holds (a tier that keeps its pins fails it).  B's probe learns of the
    withdrawal (failed) and its lookups then MISS.  B waits for that without looking a key up: a
    lookup of an offered key is a fetch (vLLM starts its promotion), another interleaving
    (decision V5)."""
    prod, ptier, cons, ctier, ks, L, S, pview = _held_round(managers)
    with prod.lock:
        prod.reset_cache()  # drain_jobs, then `assert not self._jobs` inside vLLM
    assert not prod._jobs
    assert stat(ptier, "kvtier_pins_released_total{outcome=fail,reason=drained}") == 1
    # B learns the offer was withdrawn: its lookups answer MISS (not HIT for released pins)
    _wait(lambda: stat(ctier, "kvtier_probes{state=failed}") == 1, prod, cons)
    with cons.lock:
        assert [cons.lookup(k, S) for k in ks] == [LookupResult.MISS] * 3
    finish(prod, cons, L, S)
    assert stat(ctier, "kvtier_probe_keys_total{answer=") == 3  # never probed again
    del pview
