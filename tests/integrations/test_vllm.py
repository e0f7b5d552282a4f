"""kvtier's adapter inside vLLM 0.33.0's real tiering manager ("level A"): the real
``OffloadingSpecFactory`` -> ``TieringOffloadingSpec`` -> ``TieringOffloadingManager`` with a real CPU
primary tier over ``/dev/shm``, driven in the order the offloading connector drives it. The harness
(and the module-level skip when vLLM 0.33.0 is missing) is :mod:`tests.integrations.vllm_harness`.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import numpy as np
import pytest

from tests.integrations.vllm_harness import (  # the harness (and its module-level skips)
    ROW,
    TIER,
    LookupResult,
    OffloadingSpecFactory,
    OffloadPolicy,
    ReqContext,
    TierConfigError,
    TransportError,
    finish,
    free_port,
    keys,
    managers,  # noqa: F401  (fixture)
    offloading_config,
    pattern,
    producer_store,
    promote,
    scrambled_keys,
    shm_files,
    stat,
    step,
)

pytestmark = [pytest.mark.vllm]


# -- manager level --------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_manager_level_store_park_lookup_load_finish(managers, data_plane) -> None:
    prod, ptier = managers({**TIER, "unbound_store_timeout_s": "180", "locality": "REMOTE", "data_plane": data_plane})
    cons, ctier = managers({**TIER, "data_plane": data_plane})
    assert ptier.config.unbound_store_timeout_s == 180.0  # a string, as vLLM p2p's configs give it, is converted
    assert ptier.tier_type == "KvTierSecondaryTier" and ptier.cache_hit_source.name == "P2P"
    assert ptier.medium is None and ptier.locality is None
    assert prod._polled_tiers == [ptier]  # opted in to off-thread polling (thread off: poll_s=0)
    host, port = ptier.address.rsplit(":", 1)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    cview = np.asarray(cons.primary_tier.get_kv_memoryview())
    ks = scrambled_keys("prompt", 3)

    # producer leg: REQUEST_LEVEL, lookups MISS, the store is parked past on_request_finished
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "cmpl-K1"}})
    with prod.lock:
        assert prod.on_new_request(P).policy is OffloadPolicy.REQUEST_LEVEL
        assert prod.lookup(ks[0], P) is LookupResult.MISS
    producer_store(prod, P, ks, pview)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
        step(prod)
    assert len(prod._jobs) == 1, "the store job must stay outstanding (parked) until fetched"
    assert ptier.has_pending_work()

    # consumer leg: HIT -> promotion -> one submit_load -> fetch over zmq -> bytes in place
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "cmpl-K1", "remote_host": host, "remote_port": int(port)}})
    with cons.lock:
        assert cons.on_new_request(D).policy is OffloadPolicy.CHUNK_LEVEL
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.HIT_PENDING] * 3
        step(cons, ("req-D",))  # _flush_pending_promotions -> tier.submit_load
    assert promote(prod, cons, D, ks) == [LookupResult.HIT] * 3, ctier.kvtier.stats()
    with cons.lock:
        spec = cons.prepare_load(ks, D)
        for k, cid in zip(ks, spec.chunk_ids.tolist()):
            assert np.array_equal(cview[cid], pattern(k)), "promoted bytes differ from the prefill's"
        cons.complete_load(ks, D)
        cons.on_request_finished(D)
        step(cons)
    assert stat(ctier, "kvtier_block_landed_bytes") == 3 * ROW

    # the producer's store job is reported (success) once the transfer completed: rows unpinned
    deadline = time.monotonic() + 10
    while prod._jobs:
        with prod.lock:
            step(prod)
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert stat(ptier, 'kvtier_jobs_total{kind=store,outcome=ok') == 1
    # engine calls hand commands to kvtier's I/O thread: it has work until it applied the last ones
    while ctier.has_pending_work() or ptier.has_pending_work():
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert not cons._jobs
    del pview, cview


@pytest.mark.timeout(60)
def test_second_decode_request_for_one_id_fails_fast_and_recomputes(managers) -> None:
    prod, _ = managers(TIER)
    cons, ctier = managers(TIER)
    host, port = prod.secondary_tiers[0].address.rsplit(":", 1)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    ks = keys("twice", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K2"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    with prod.lock:
        prod.on_request_finished(P)
    src = {"remote_prefiller": {"kv_request_id": "K2", "remote_host": host, "remote_port": int(port)}}
    A = ReqContext("req-A", kv_transfer_params=src)
    B = ReqContext("req-B", kv_transfer_params=src)  # e.g. a proxy retry reusing the id
    with cons.lock:
        cons.on_new_request(A)
        assert [cons.lookup(k, A) for k in ks] == [LookupResult.HIT_PENDING] * 2
        step(cons)
    assert promote(prod, cons, A, ks) == [LookupResult.HIT] * 2
    t0 = time.monotonic()
    with cons.lock:  # A still runs; B asks for the same id: refused (at once or by its load)
        cons.on_new_request(B)
        cons.reset_cache()  # empty the primary so that B's lookups reach the tier
        cons.on_reset_flushed()
        first = [cons.lookup(k, B) for k in ks]
        step(cons)
    if first != [LookupResult.MISS] * 2:
        assert LookupResult.MISS in promote(prod, cons, B, ks)
    assert time.monotonic() - t0 < 5.0  # not load_timeout_s (30 s)
    with cons.lock:
        assert [cons.lookup(k, B) for k in ks] == [LookupResult.MISS] * 2  # and it stays MISS
        cons.on_request_finished(A)
        cons.on_request_finished(B)
        step(cons)
    assert not cons._jobs, cons._jobs  # every job reported exactly once
    assert stat(ctier, "kvtier_jobs_total{kind=load,outcome=ok") == 1
    del pview


def _refused_hand_off(prod: Any, ptier: Any, cons: Any, ctier: Any, kid: str) -> None:
    """``prod`` parks one block for ``kid``; ``cons`` loads it: the handshake refuses the session,
    so the lookup answers MISS (vLLM recomputes) and one ``handshake_mismatch`` is counted."""
    ks = keys(kid, 1)
    P = ReqContext(f"req-P-{kid}", kv_transfer_params={"remote_decoder": {"kv_request_id": kid}})
    with prod.lock:
        prod.on_new_request(P)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    producer_store(prod, P, ks, pview)
    host, port = ptier.address.rsplit(":", 1)
    D = ReqContext(f"req-D-{kid}", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": kid, "remote_host": host, "remote_port": int(port)}})
    with cons.lock:
        cons.on_new_request(D)
        assert cons.lookup(ks[0], D) is LookupResult.HIT_PENDING  # until the session answers
        step(cons)
    assert promote(prod, cons, D, ks) == [LookupResult.MISS]
    assert stat(ctier, "kvtier_session_ends_total{reason=handshake_mismatch}") == 1
    finish(prod, cons, P, D)
    del pview


@pytest.mark.timeout(60)
def test_hash_seed_is_resolved_lazily_and_checked_in_the_handshake(managers, monkeypatch) -> None:
    import vllm.v1.core.kv_cache_utils as kcu
    from vllm.utils.hashing import sha256

    prod, ptier = managers(TIER)  # built before init_none_hash, as in vLLM's EngineCore
    cons, ctier = managers({**TIER, "hash_seed": "another-seed"})  # explicit: wins, with a warning
    monkeypatch.setattr(kcu, "_NONE_HASH_SEED", kcu._NONE_HASH_SEED)  # restore vLLM's globals after
    monkeypatch.setattr(kcu, "NONE_HASH", getattr(kcu, "NONE_HASH", None), raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", "kvtier-seed-test")
    kcu.init_none_hash(sha256)
    with prod.lock:
        step(prod)  # the first poll after init_none_hash picks the seed up
    seed = ptier.kvtier.local_hello.hash_seed  # vLLM's seed, then its root hash's first bytes (the algorithm)
    assert seed == f"kvtier-seed-test/{bytes(kcu.NONE_HASH)[:8].hex()}", seed

    # the producer refuses the hello (hash_seed differs): the load fails, vLLM recomputes
    _refused_hand_off(prod, ptier, cons, ctier, "K3")


@pytest.mark.timeout(60)
def test_engines_hashing_blocks_with_two_algorithms_are_refused_in_the_handshake(managers, monkeypatch) -> None:
    """``--prefix-caching-hash-algo`` sha256 on one engine and sha256_cbor on the other share vLLM's
    hash seed but no block hash: the handshake compared that hash seed alone and passed, and every
    load then failed ``incomplete`` (an outside tester).  The root hash now travels with it (A11)."""
    import vllm.v1.core.kv_cache_utils as kcu
    from vllm.utils.hashing import sha256, sha256_cbor

    prod, ptier = managers(TIER)
    cons, ctier = managers(TIER)
    monkeypatch.setattr(kcu, "_NONE_HASH_SEED", kcu._NONE_HASH_SEED)  # restore vLLM's globals after
    monkeypatch.setattr(kcu, "NONE_HASH", getattr(kcu, "NONE_HASH", None), raising=False)
    monkeypatch.setenv("PYTHONHASHSEED", "kvtier-algo-test")
    kcu.init_none_hash(sha256)  # each engine is a process of its own: each resolves its own
    with prod.lock:
        step(prod)
    kcu.init_none_hash(sha256_cbor)
    with cons.lock:
        step(cons)
    pseed, cseed = ptier.kvtier.local_hello.hash_seed, ctier.kvtier.local_hello.hash_seed
    assert pseed.split("/")[0] == cseed.split("/")[0] == "kvtier-algo-test" and pseed != cseed
    _refused_hand_off(prod, ptier, cons, ctier, "K4")


def test_engines_with_two_kv_cache_layouts_are_refused_in_the_handshake(managers) -> None:
    """NHD and HND hold a block's bytes in two orders at the same size: a consumer reading a
    producer's NHD block as HND decodes garbage.  The layout fingerprint left the attention
    backend's layout out: the load succeeded (an outside tester); a dtype mismatch was refused."""
    prod, ptier = managers({**TIER, "unbound_store_timeout_s": 5}, kv_cache_layout="NHD")
    cons, ctier = managers(TIER, kv_cache_layout="HND")
    assert "kv_layout=NHD" in ptier.kvtier.local_hello.layout and "kv_layout=HND" in ctier.kvtier.local_hello.layout
    _refused_hand_off(prod, ptier, cons, ctier, "K5")


def _spy_regions(monkeypatch) -> list[Any]:
    """The shared primary regions vLLM's tiering spec makes from now on, in order."""
    import vllm.v1.kv_offload.tiering.spec as spec_mod

    regions: list[Any] = []

    class SpyRegion(spec_mod.SharedOffloadRegion):  # type: ignore[name-defined,misc]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            regions.append(self)

    monkeypatch.setattr(spec_mod, "SharedOffloadRegion", SpyRegion)
    return regions


@pytest.mark.timeout(60)
def test_config_is_validated_before_anything_is_built(monkeypatch) -> None:
    # a bool is not a number (Python's bool is an int): refused, and vLLM cleans up /dev/shm
    cfg, engine_id = offloading_config({**TIER, "unbound_store_timeout_s": True})
    with pytest.raises(TierConfigError, match=r"unbound_store_timeout_s=true"):
        OffloadingSpecFactory.create_spec(cfg).get_manager()
    assert not shm_files(engine_id)
    # +inf and a typo are refused too, the typo with a did-you-mean
    for bad, match in (({"load_timeout_s": float("inf")}, "load_timeout_s=inf"),
                       ({"unbound_store_timout_s": 180}, "did you mean 'unbound_store_timeout_s'")):
        cfg, engine_id = offloading_config({**TIER, **bad})
        with pytest.raises(TierConfigError, match=match):
            OffloadingSpecFactory.create_spec(cfg).get_manager()
        assert not shm_files(engine_id)

    # a failure after the pool exists (the port is taken) releases the primary memory too
    regions = _spy_regions(monkeypatch)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cfg, engine_id = offloading_config({**TIER, "port": busy.getsockname()[1]})
        with pytest.raises(TransportError):
            OffloadingSpecFactory.create_spec(cfg).get_manager()
    (region,) = regions
    assert region.mmap_obj is None, "the failed constructor kept a view of the primary memory"
    assert not shm_files(engine_id)


@pytest.mark.timeout(60)
def test_a_data_plane_that_cannot_start_releases_the_primary_memory_and_says_nothing_false(
        monkeypatch, caplog) -> None:
    """NIXL's LIBFABRIC backend cannot start here: the engine's start fails naming it, vLLM unmaps
    its region, and no warning claims the region stays mapped (an outside tester saw one: the
    chained NIXL error's frames still held the pool until the exception was dropped)."""
    from kvtier.dataplane import PlaneError

    regions = _spy_regions(monkeypatch)
    monkeypatch.setenv("NIXL_LOG_LEVEL", "ERROR")
    caplog.set_level(logging.WARNING, logger="kvtier")
    cfg, engine_id = offloading_config({**TIER, "data_plane": "nixl", "backends": ["LIBFABRIC"]})
    with pytest.raises(PlaneError, match="LIBFABRIC"):
        OffloadingSpecFactory.create_spec(cfg).get_manager()
    (region,) = regions
    assert region.mmap_obj is None and not shm_files(engine_id)
    assert "still referenced" not in caplog.text, caplog.text


@pytest.mark.timeout(60)
def test_port_adds_the_data_parallel_index(managers) -> None:
    port = free_port()
    _, tier = managers({**TIER, "port": port - 1}, dp_index=1)
    assert tier.address == f"127.0.0.1:{port}"
    assert tier.config.port == port



@pytest.mark.timeout(60)
def test_kvtier_lines_go_through_vllms_handlers(managers, monkeypatch) -> None:
    """vLLM sets up only its ``vllm`` logger: with nothing else configured, kvtier's lines go
    through vLLM's handlers, so the tier's "listening on" line (docs/integrations/vllm.md) shows.
    It was dropped (an INFO line with no handler), and warnings printed bare."""
    import logging

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root, kv, vl = logging.getLogger(), logging.getLogger("kvtier"), logging.getLogger("vllm")
    levels = kv.level, vl.level
    monkeypatch.setattr(root, "handlers", [])  # as under vLLM: no root handler (pytest's own aside)
    monkeypatch.setattr(kv, "handlers", [])
    monkeypatch.setattr(kv, "propagate", True)
    monkeypatch.setattr(vl, "handlers", [Keep()])
    kv.setLevel(logging.NOTSET)
    vl.setLevel(logging.INFO)
    try:
        _, tier = managers(TIER)
        assert any(r.name == "kvtier.integrations.vllm" and f"listening on {tier.address}" in r.getMessage()
                   for r in records), [r.getMessage() for r in records]
        assert kv.propagate is False  # not twice, should the application add a root handler later
    finally:
        kv.setLevel(levels[0])  # setLevel, not an attribute: it clears the loggers' level caches
        vl.setLevel(levels[1])


# -- a producer request with nothing stored; remote_port as a string --------------------
@pytest.mark.timeout(60)
def test_nothing_stored_is_refused_in_one_round_trip_through_the_adapter(managers) -> None:
    """vLLM could not store the producer request's chunks (no prepare/complete_store, so kvtier
    never sees a store job) and the request finished.  The decode request's promotion then MISSes
    at once with the kvtier reason ``nothing_stored`` — well inside promote()'s 10 s bound while
    fetch_supply_timeout_s is 30 s — and vLLM recomputes.  The decode side names the producer with
    ``remote_port`` as a numeric string, as a JSON proxy writes it."""
    slow = {"fetch_supply_timeout_s": "30", "load_timeout_s": "60"}
    prod, ptier = managers({**TIER, **slow})
    cons, ctier = managers({**TIER, **slow})
    host, port = ptier.address.rsplit(":", 1)
    ks = keys("never-stored", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K9"}})
    with prod.lock:
        prod.on_new_request(P)
        step(prod, ("req-P",))
        prod.on_request_finished(P)  # finished without a single store
        step(prod)
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "K9", "remote_host": host, "remote_port": str(port)}})
    with cons.lock:
        cons.on_new_request(D)
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.HIT_PENDING] * 2
        step(cons, ("req-D",))
    assert LookupResult.MISS in promote(prod, cons, D, ks)
    assert stat(ctier, "kvtier_jobs_total{kind=load,outcome=fail,reason=nothing_stored}") == 1
    assert stat(ptier, "kvtier_fetches_refused_total{reason=nothing_stored}") == 1
    with cons.lock:
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.MISS] * 2
        cons.on_request_finished(D)
        step(cons)
    assert not cons._jobs and not prod._jobs


@pytest.mark.timeout(60)
def test_remote_port_as_a_numeric_string_loads_through_the_adapter(managers) -> None:
    """``remote_port: "<digits>"`` is accepted and the promotion loads the producer's bytes."""
    prod, ptier = managers(TIER)
    cons, _ = managers(TIER)
    host, port = ptier.address.rsplit(":", 1)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    cview = np.asarray(cons.primary_tier.get_kv_memoryview())
    ks = keys("string-port", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K10"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "K10", "remote_host": host, "remote_port": str(port)}})
    with cons.lock:
        cons.on_new_request(D)
        # the scheduler looks the blocks up when it schedules the request, in that same step
        # (a request scheduled with nothing to load tells its producer so at the step's end)
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.HIT_PENDING] * 2
        step(cons, ("req-D",))
    assert promote(prod, cons, D, ks) == [LookupResult.HIT] * 2
    with cons.lock:
        spec = cons.prepare_load(ks, D)
        for k, cid in zip(ks, spec.chunk_ids.tolist()):
            assert np.array_equal(cview[cid], pattern(k))
        cons.complete_load(ks, D)
        cons.on_request_finished(D)
        step(cons)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
    del pview, cview


@pytest.mark.timeout(60)
@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_a_decode_that_needs_nothing_releases_the_prefill_at_once(managers, data_plane) -> None:
    """The decode request is scheduled without loading anything (every block hit locally: no
    lookup, no submit_load).  At the end of that step the adapter tells the producer (an empty
    fetch, decision L16): the prefill's parked store job succeeds within a second (bound),
    counted ``not_needed``, not after ``unbound_store_timeout_s`` (180 s here)."""
    prod, ptier = managers({**TIER, "unbound_store_timeout_s": "180", "data_plane": data_plane})
    cons, ctier = managers({**TIER, "data_plane": data_plane})
    host, port = ptier.address.rsplit(":", 1)
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    ks = keys("cached", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "cmpl-N1"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
    assert len(prod._jobs) == 1  # parked
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "cmpl-N1", "remote_host": host, "remote_port": int(port)}})
    with cons.lock:
        cons.on_new_request(D)
        step(cons, ("req-D",))  # scheduled for the first time, nothing to load
    t0 = time.monotonic()
    while prod._jobs or ctier.has_pending_work():
        with prod.lock:
            step(prod)
        with cons.lock:
            step(cons)
        assert time.monotonic() - t0 < 1.0, (len(prod._jobs), ptier.kvtier.stats())
        time.sleep(0.002)
    assert stat(ptier, "kvtier_jobs_total{kind=store,outcome=ok,reason=not_needed}") == 1
    assert not cons._jobs  # the adapter's own empty load reports nothing to vLLM
    with cons.lock:
        cons.on_request_finished(D)
        step(cons)
    del pview


@pytest.mark.timeout(60)
def test_the_two_documented_examples_run_side_by_side_on_one_host(managers) -> None:
    """docs/integrations/vllm.md's prefill and decode tier entries, built through vLLM's factories
    in one process (host 127.0.0.1; every port shifted by one offset so that other runs on this
    machine do not collide, their relation kept): both listeners and both metrics endpoints bind
    together, the decode engine dials the listed prefill endpoint and loads from it."""
    import json
    import random
    import re
    import socket
    import urllib.request
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "integrations" / "vllm.md").read_text()
    blobs = re.findall(r"--kv-transfer-config '(\{.*?\})'", text, flags=re.S)
    prefill, decode = (json.loads(b)["kv_connector_extra_config"]["secondary_tiers"][0] for b in blobs[:2])
    assert prefill["metrics_port"] != decode["metrics_port"]
    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
            return True

    # below the kernel's ephemeral range (32768 up), where every other test's sockets bind: a
    # shift is taken only with its three ports free now (a collision failed a loaded run once)
    wanted = (prefill["port"], prefill["metrics_port"], decode["metrics_port"])
    shift = next(s for s in (random.randrange(10000, 32768 - max(wanted)) for _ in range(100))
                 if all(free(p + s) for p in wanted))
    p_entry = {**prefill, "host": "127.0.0.1", "port": prefill["port"] + shift,
               "metrics_port": prefill["metrics_port"] + shift}
    d_entry = {**decode, "host": "127.0.0.1", "metrics_port": decode["metrics_port"] + shift,
               "allowed_peers": [f"127.0.0.1:{prefill['port'] + shift}"]}
    assert decode["allowed_peers"] == [f"{prefill['host']}:{prefill['port']}"]
    prod, ptier = managers(p_entry)
    cons, ctier = managers(d_entry)
    for tier in (ptier, ctier):
        with urllib.request.urlopen(f"http://{tier.kvtier.metrics_address}/metrics", timeout=5) as r:
            assert b"kvtier_" in r.read()
    pview = np.asarray(prod.primary_tier.get_kv_memoryview())
    cview = np.asarray(cons.primary_tier.get_kv_memoryview())
    ks = keys("documented", 2)
    P = ReqContext("req-P", kv_transfer_params={"remote_decoder": {"kv_request_id": "K-doc"}})
    with prod.lock:
        prod.on_new_request(P)
    producer_store(prod, P, ks, pview)
    D = ReqContext("req-D", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "K-doc", "remote_host": "127.0.0.1", "remote_port": prefill["port"] + shift}})
    with cons.lock:
        cons.on_new_request(D)
        assert [cons.lookup(k, D) for k in ks] == [LookupResult.HIT_PENDING] * 2
        step(cons, ("req-D",))
    assert promote(prod, cons, D, ks) == [LookupResult.HIT] * 2
    with cons.lock:
        spec = cons.prepare_load(ks, D)
        for k, cid in zip(ks, spec.chunk_ids.tolist()):
            assert np.array_equal(cview[cid], pattern(k))
        cons.complete_load(ks, D)
        cons.on_request_finished(D)
        step(cons)
    with prod.lock:
        prod.on_request_finished(P)
        step(prod)
    del pview, cview


def test_a_malformed_store_fails_bad_job_without_raising_into_vllm(managers, caplog) -> None:
    """vLLM's ``submit_store`` must not raise: a store whose chunk ids repeat or leave the pool is
    checked on kvtier's I/O loop and fails ``bad_job`` (decision C29); a good one beside it parks."""
    from vllm.v1.kv_offload.tiering.base import TransferJob as VllmTransferJob

    prod, ptier = managers({**TIER})
    P = ReqContext("req-bad", kv_transfer_params={"remote_decoder": {"kv_request_id": "cmpl-bad"}})
    with prod.lock:
        prod.on_new_request(P)
    rows = ptier.kvtier.pool.num_blocks
    with caplog.at_level("ERROR", logger="kvtier"):
        for job_id, ids in ((901, [0, 0]), (902, [rows])):
            ptier.submit_store(VllmTransferJob(job_id=job_id, keys=keys(f"bad{job_id}", len(ids)),
                                               chunk_ids=np.array(ids, dtype=np.int64), is_promotion=False,
                                               req_context=P))
        ptier.submit_store(VllmTransferJob(job_id=903, keys=keys("good", 1), chunk_ids=np.array([1]),
                                           is_promotion=False, req_context=P))
        got: dict[int, Any] = {}
        deadline = time.monotonic() + 10
        while not {901, 902} <= set(got):
            got.update({r.job_id: r for r in ptier.get_finished_jobs()})
            assert time.monotonic() < deadline, got
            time.sleep(0.002)
    assert not got[901].success and not got[902].success and 903 not in got  # the good one stays parked
    assert stat(ptier, 'kvtier_jobs_total{kind=store,outcome=fail,reason=bad_job}') == 2
    messages = [r.getMessage() for r in caplog.records]
    assert any("store refused: job 901: duplicate slots" in m for m in messages), messages
