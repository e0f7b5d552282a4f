"""A prefill/decode pair of real vLLM 0.33.0 v1 ``Scheduler``s ("level C"), each with the real
``OffloadingConnector`` and its own kvtier tier, over kvtier's transport on 127.0.0.1; only the GPU
worker is faked (harness: :mod:`tests.integrations.vllm_harness`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from tests.integrations.vllm_harness import (  # the harness (and its module-level skips)
    ROW,
    TIER,
    Engine,
    assert_released,
    kvtier_threads,
    model_dir,  # noqa: F401  (fixture)
    pattern,
    run,
    stat,
)

pytestmark = [pytest.mark.vllm]


@contextlib.contextmanager
def pair(*engines: Engine) -> Iterator[list[Engine]]:
    """The engines, shut down however the block ends; once it ended without an error, each one's
    regions unmapped, its /dev/shm files gone."""
    try:
        yield list(engines)
    finally:
        for e in engines:
            e.shutdown()
    for e in engines:
        assert_released(e.manager, e.engine_id)


def hand_off(prefill: Engine, decode: Engine, prompt: list[int], kid: str) -> None:
    """Prefill request ``P`` parks ``prompt``'s KV under ``kid``; decode request ``D`` loads it and
    finishes (both engines stepped)."""
    host, port = prefill.tier.address.rsplit(":", 1)
    prefill.add("P", prompt, 1, {"remote_decoder": {"kv_request_id": kid}})
    run([prefill], lambda: "P" in prefill.finished, "prefill")
    decode.add("D", prompt, 2, {"remote_prefiller": {"kv_request_id": kid, "remote_host": host,
                                                     "remote_port": int(port)}})
    run([prefill, decode], lambda: "D" in decode.finished, "decode of D")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_pd_pair_with_real_schedulers(model_dir: str, data_plane: str) -> None:
    """Prefill and decode engines with vLLM's real schedulers, on each data plane (NIXL: the
    adapter registers vLLM's primary-tier region with the agent; blocks are WRITten into it)."""
    load_timeout_s = 20.0
    plane = {"data_plane": data_plane}
    prefill = Engine("prefill", model_dir, {**TIER, **plane, "unbound_store_timeout_s": "5"})
    decode = Engine("decode", model_dir, {**TIER, **plane, "load_timeout_s": load_timeout_s})
    engines = [prefill, decode]
    try:
        host, port = prefill.tier.address.rsplit(":", 1)

        def consumer(kid: str) -> dict:
            return {"remote_prefiller": {"kv_request_id": kid, "remote_host": host, "remote_port": int(port)}}

        prompt = [(i * 7 + 3) % 1000 + 10 for i in range(50)]  # 3 full blocks + 2 tokens
        late_prompt = [(i * 11 + 5) % 1000 + 10 for i in range(40)]  # 2 full blocks + 8 tokens

        # 1. prefill both requests (max_tokens=1, as a PD proxy sends); their chunks are parked
        prefill.add("P1", prompt, 1, {"remote_decoder": {"kv_request_id": "cmpl-kv-1"}})
        prefill.add("P2", late_prompt, 1, {"remote_decoder": {"kv_request_id": "cmpl-kv-2"}})
        run([prefill], lambda: {"P1", "P2"} <= prefill.finished, "prefill")
        assert len(prefill.stored) == 5
        assert len(prefill.manager._jobs) >= 2  # parked store jobs (at least one per request)

        # 2. decode request 1: promoted from the prefill engine over kvtier, byte-identical
        decode.add("D1", prompt, 3, consumer("cmpl-kv-1"))
        run(engines, lambda: "D1" in decode.finished, "decode of D1")
        assert len(decode.loaded["D1"]) == 3
        for h in decode.loaded["D1"]:  # what the decode worker loaded == what the prefill stored
            assert decode.loaded_bytes[h] == prefill.stored[h] == pattern(h).tobytes()
        assert decode.scheduled["D1"] < len(prompt)  # only the tail + decode tokens computed
        assert stat(decode.tier, "kvtier_block_landed_bytes") == 3 * ROW

        # 3. the unfetched request 2 is reaped (short unbound_store_timeout_s): vLLM unpins it
        run([prefill], lambda: not prefill.manager._jobs, "the reap of cmpl-kv-2", timeout_s=15)
        assert stat(prefill.tier, "kvtier_jobs_total{kind=store,outcome=fail,reason=reaped}") >= 1
        assert stat(prefill.tier, "kvtier_jobs_total{kind=store,outcome=ok") >= 1  # request 1's

        # 4. a late decode for it is refused in one round trip, and vLLM recomputes locally
        t0 = time.monotonic()
        decode.add("D2", late_prompt, 2, consumer("cmpl-kv-2"))
        run(engines, lambda: stat(decode.tier, "kvtier_jobs_total{kind=load,outcome=fail") >= 1,
            "the failed load of D2", timeout_s=load_timeout_s)
        elapsed = time.monotonic() - t0
        assert elapsed < load_timeout_s / 4, f"late fetch took {elapsed:.1f}s to be refused"
        assert stat(prefill.tier, "kvtier_fetches_refused_total{reason=reaped}") == 1
        assert stat(decode.tier, "kvtier_jobs_total{kind=load,outcome=fail,reason=reaped}") == 1
        run(engines, lambda: "D2" in decode.finished, "the local recompute of D2")
        assert "D2" not in decode.loaded  # nothing was loaded for it ...
        assert decode.scheduled["D2"] >= len(late_prompt)  # ... the whole prompt was computed

        run(engines, lambda: not (prefill.busy() or decode.busy()), "both engines idle")
    finally:
        for e in engines:
            e.shutdown()
    # 5. clean shutdown: regions unmapped, /dev/shm files gone, no poll threads left
    for e in engines:
        assert_released(e.manager, e.engine_id)
        assert e.tier.kvtier is None
    assert not kvtier_threads()


@pytest.mark.timeout(90)
def test_pd_pair_driven_by_engine_steps_only(model_dir: str) -> None:
    """tier_poll_interval_s = 0 and kvtier caller-driven (``background_poll: false``): no poll
    thread at all; kvtier progresses only when engines step, which they keep doing while a job is
    outstanding (has_pending_push_work)."""
    steps_only = {**TIER, "background_poll": False}
    with pair(Engine("prefill0", model_dir, steps_only, poll_s=0),
              Engine("decode0", model_dir, steps_only, poll_s=0)) as engines:
        prefill, decode = engines
        assert not kvtier_threads()
        host, port = prefill.tier.address.rsplit(":", 1)
        prompt = [(i * 13 + 1) % 1000 + 10 for i in range(64)]  # 4 full blocks
        prefill.add("P", prompt, 1, {"remote_decoder": {"kv_request_id": "cmpl-kv-steps"}})
        run([prefill], lambda: "P" in prefill.finished, "prefill")
        assert prefill.busy(), "a parked store job keeps the prefill engine stepping"
        decode.add("D", prompt, 2, {"remote_prefiller": {
            "kv_request_id": "cmpl-kv-steps", "remote_host": host, "remote_port": int(port)}})
        run(engines, lambda: "D" in decode.finished, "decode of D")
        run(engines, lambda: not (prefill.busy() or decode.busy()), "both engines idle")
        loaded = decode.loaded["D"]
        assert len(loaded) >= 3  # at least the blocks before the last (partly recomputed) one
        for h in loaded:
            assert decode.loaded_bytes[h] == prefill.stored[h]


@pytest.mark.timeout(90)
def test_pd_pair_inside_a_multiconnector(model_dir: str) -> None:
    """Both engines run the offloading connector (and kvtier in it) as a ``MultiConnector``'s
    connector, as beside a NixlConnector: vLLM builds it from its own entry, and the hand-off is
    the same — byte-identical blocks, nothing left pinned."""
    from kvtier.vllmconfig import check_kv_transfer_config

    with pair(Engine("mprefill", model_dir, TIER, multi=True),
              Engine("mdecode", model_dir, TIER, multi=True)) as engines:
        prefill, decode = engines
        config = prefill.sched.vllm_config.kv_transfer_config
        assert config.kv_connector == "MultiConnector"
        problems, notes = check_kv_transfer_config({"kv_connector": config.kv_connector, "kv_role": config.kv_role,
                                                    "kv_connector_extra_config": config.kv_connector_extra_config})
        assert not problems and notes, problems  # what check-config says of the config this engine runs
        prompt = [(i * 17 + 2) % 1000 + 10 for i in range(64)]  # 4 full blocks
        hand_off(prefill, decode, prompt, "cmpl-kv-multi")
        run(engines, lambda: not (prefill.busy() or decode.busy()), "both engines idle")
        loaded = decode.loaded["D"]
        assert len(loaded) >= 3
        for h in loaded:
            assert decode.loaded_bytes[h] == prefill.stored[h] == pattern(h).tobytes()
        assert stat(decode.tier, "kvtier_block_landed_bytes") == len(loaded) * ROW


@pytest.mark.timeout(90)
def test_a_prompt_larger_than_the_primary_tier_loads_what_fits_and_recomputes_the_rest(model_dir: str) -> None:
    """The decode engine's primary (CPU) tier holds 16 chunks, the prompt 20 full blocks: vLLM loads
    16 from kvtier and looks up the other 4 again.  An id is fetched once (the producer released the
    rest with the first fetch), so those lookups MISS and vLLM recomputes them.  They answered HIT
    (an outside tester): vLLM's second load failed ``one_fetch_per_id`` at once, the lookups said HIT
    again, and the request was never scheduled (11,456 failed loads in 20 s)."""
    with pair(Engine("bigprefill", model_dir, {**TIER, "unbound_store_timeout_s": 10}),
              Engine("bigdecode", model_dir, TIER)) as engines:
        prefill, decode = engines
        prompt = [(i * 19 + 4) % 1000 + 10 for i in range(20 * 16 + 1)]  # 20 full blocks + 1 token
        hand_off(prefill, decode, prompt, "cmpl-kv-big")
        loaded = decode.loaded["D"]
        assert len(loaded) == 16, len(loaded)  # what the primary tier had room for
        for h in loaded:
            assert decode.loaded_bytes[h] == prefill.stored[h] == pattern(h).tobytes()
        assert decode.scheduled["D"] >= 4 * 16, decode.scheduled  # the other 4 blocks recomputed
        assert stat(decode.tier, "kvtier_jobs_total{kind=load,outcome=fail") == 0
        run(engines, lambda: not (prefill.busy() or decode.busy()), "both engines idle")
