"""kvtier's series on vLLM 0.33.0's own ``/metrics`` path, and the endpoint's port under DP.

The PD pair of ``vllm_harness`` (two real schedulers, kvtier over zmq) runs one transfer; every
``SchedulerStats.kv_connector_stats`` payload the schedulers emit is fed to vLLM's own
``KVConnectorProm`` (what vLLM's ``PrometheusStatLogger`` does in the API server), built on a
private registry; the test then reads kvtier's ``vllm:kvtier_*`` series from that registry.
"""

from __future__ import annotations

import pytest

import tests.integrations.vllm_harness as V  # skips this module when vLLM 0.33.0 is missing
from tests.integrations.vllm_harness import managers, model_dir  # noqa: F401  (fixtures)

prometheus_client = pytest.importorskip("prometheus_client")

pytestmark = [pytest.mark.vllm]


def _private_prom(vllm_config, registry):
    """vLLM's KVConnectorProm with its metric classes bound to ``registry``."""
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm

    def bind(cls):
        class Bound(cls):
            def __init__(self, *args, **kwargs):
                kwargs["registry"] = registry
                super().__init__(*args, **kwargs)

        return Bound

    class Prom(KVConnectorProm):
        _gauge_cls = bind(prometheus_client.Gauge)
        _counter_cls = bind(prometheus_client.Counter)
        _histogram_cls = bind(prometheus_client.Histogram)

    return Prom(vllm_config, ["model_name", "engine"], {0: ["tiny", "0"]})


def _observe_stats(engine: V.Engine, prom) -> None:
    """Feed every scheduler stats payload of ``engine`` to ``prom`` (as vLLM's frontend does)."""
    original = engine.sched.update_from_output

    def update_from_output(so, out):
        outputs = original(so, out)
        for eco in outputs.values():
            stats = eco.scheduler_stats
            if stats is not None and stats.kv_connector_stats:
                prom.observe(stats.kv_connector_stats, 0)
        return outputs

    engine.sched.update_from_output = update_from_output


def _value(registry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"model_name": "tiny", "engine": "0", **labels})


@pytest.mark.timeout(120)
def test_kvtier_series_reach_vllms_prometheus_path(model_dir: str, monkeypatch) -> None:
    import kvtier.integrations.vllm as adapter

    monkeypatch.setattr(adapter, "_STATS_INTERVAL_S", 0.0)  # a payload at every step
    prefill = V.Engine("mprefill", model_dir, V.TIER)
    decode = V.Engine("mdecode", model_dir, V.TIER)
    engines = [prefill, decode]
    registries = {}
    try:
        for e in engines:
            registries[e.name] = prometheus_client.CollectorRegistry()
            _observe_stats(e, _private_prom(e.sched.vllm_config, registries[e.name]))
        host, port = prefill.tier.address.rsplit(":", 1)
        prompt = [(i * 5 + 2) % 1000 + 10 for i in range(48)]  # 3 full blocks
        prefill.add("P", prompt, 1, {"remote_decoder": {"kv_request_id": "cmpl-kv-metrics"}})
        V.run([prefill], lambda: "P" in prefill.finished, "prefill")
        decode.add("D", prompt, 2, {"remote_prefiller": {
            "kv_request_id": "cmpl-kv-metrics", "remote_host": host, "remote_port": int(port)}})
        V.run(engines, lambda: "D" in decode.finished, "decode")
        V.run(engines, lambda: not (prefill.busy() or decode.busy()), "both engines idle")
        # vLLM collects stats only when an engine steps; the prefill engine's store job ended in
        # vLLM's tier-poll thread after its last step, so its next step (next request) reports it
        for e in engines:
            e.step()
        n = len(decode.loaded["D"])
        assert n >= 2
        dconst = {"tier": "KvTierSecondaryTier", "listener": decode.tier.address}
        pconst = {"tier": "KvTierSecondaryTier", "listener": prefill.tier.address}
        dreg, preg = registries["mdecode"], registries["mprefill"]
        # counters arrive as increments, histograms as observations, gauges as snapshots
        landed = _value(dreg, "vllm:kvtier_block_landed_bytes_total", **dconst)
        assert landed == decode.tier.kvtier.stats()["kvtier_block_landed_bytes_total"] == n * V.ROW
        assert _value(dreg, "vllm:kvtier_transfer_bytes_count", role="consumer", **dconst) == 1
        assert _value(dreg, "vllm:kvtier_transfer_bytes_sum", role="consumer", **dconst) == n * V.ROW
        assert _value(dreg, "vllm:kvtier_jobs_total", kind="load", outcome="ok", reason="", **dconst) == 1
        assert _value(dreg, "vllm:kvtier_sessions", state="ready", **dconst) == 1
        assert _value(preg, "vllm:kvtier_transfer_bytes_count", role="producer", **pconst) == 1
        assert _value(preg, "vllm:kvtier_block_sent_bytes_total", **pconst) == n * V.ROW
        assert _value(preg, "vllm:kvtier_jobs_total", kind="store", outcome="ok", reason="", **pconst) >= 1
        assert _value(preg, "vllm:kvtier_parked_ids", state="parked", **pconst) == 0
        # nothing kvtier sent was dropped by vLLM for want of a definition
        names = {m.name for m in preg.collect()} | {m.name for m in dreg.collect()}
        assert "vllm:kvtier_parked_ids" in names and "vllm:kvtier_tick_lag_seconds" in names
    finally:
        for e in engines:
            e.shutdown()


def _one_parked(cfg: dict, kid: str, **kw):
    """A manager (caller-driven, loopback) with one store of ``kid`` parked."""
    from kvtier.api import RequestContext, TransferJob
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    m = KvTierManager({"host": "127.0.0.1", "port": 0, **cfg}, BlockPool(4, 4096, pin=False), **kw)
    req = RequestContext(req_id="p1", kv_transfer_params={"remote_decoder": {"kv_request_id": kid}})
    m.on_new_request(req)
    m.submit_store(TransferJob(job_id=1, keys=(b"k0",), slots=(0,), req=req))
    return m, req


@pytest.mark.timeout(60)
def test_a_gauge_child_kvtier_no_longer_shows_reaches_vllm_as_zero() -> None:
    """vLLM keeps each gauge child's last value: once every tombstone of a reason is pruned,
    kvtier's registry shows no ``retained_ids{tombstoned,reaped}`` child, and vLLM's page would
    have held 1 for ever; the bridge sends it as 0, once."""
    from kvtier.integrations.vllm_stats import StatsBridge

    now = [100.0]
    m, req = _one_parked({"unbound_store_timeout_s": 1.0, "tombstone_retention_s": 5.0}, "kv-r",
                         clock=lambda: now[0])
    name, child = "vllm:kvtier_retained_ids", ("KvTierSecondaryTier", m.address, "tombstoned", "reaped")
    try:
        bridge = StatsBridge(m, 0.0)
        m.on_request_finished(req)
        sent = []
        for t in (102.0, 110.0, 111.0):  # reaped; pruned; later
            now[0] = t
            m.poll()
            stats = bridge.take()
            sent.append(None if stats is None else stats.metric_sections()[1].get(name, {}).get(child))
        assert sent == [1, 0.0, None]
    finally:
        m.shutdown()


@pytest.mark.timeout(60)
def test_a_scrape_that_reads_no_live_gauge_zeroes_none_of_them(monkeypatch) -> None:
    """A collection that could not take the manager's lock reads no live gauge: the bridge sends
    none of them as 0 (vLLM would show a wedged manager with nothing parked), and the next
    collection that reads them sends them again."""
    import threading

    from kvtier import metrics as M
    from kvtier.integrations.vllm_stats import StatsBridge

    monkeypatch.setattr(M._Live, "LOCK_TIMEOUT_S", 0.05)
    m, _ = _one_parked({}, "kv-w")
    child = ("KvTierSecondaryTier", m.address, "parked")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with m.lock:
            held.set()
            release.wait(10)

    def parked(stats) -> float | None:
        return None if stats is None else stats.metric_sections()[1].get("vllm:kvtier_parked_ids", {}).get(child)

    try:
        bridge = StatsBridge(m, 0.0)
        assert parked(bridge.take()) == 1
        t = threading.Thread(target=hold)
        t.start()
        try:
            assert held.wait(10)
            assert parked(bridge.take()) is None  # not read: not sent, not sent as 0
        finally:
            release.set()
            t.join()
        assert parked(bridge.take()) == 1
    finally:
        m.shutdown()


@pytest.mark.timeout(60)
def test_metrics_port_adds_the_data_parallel_index(managers) -> None:
    import urllib.request

    port = V.free_port()
    _, tier = managers({**V.TIER, "metrics_port": port - 1}, dp_index=1)
    assert tier.config.metrics_port == port
    assert tier.kvtier.metrics_address == f"127.0.0.1:{port}"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert f'kvtier_sessions{{listener="{tier.address}",state="ready",tier="KvTierSecondaryTier"}} 0.0' in text


@pytest.mark.timeout(60)
def test_metrics_port_beyond_65535_after_the_dp_index_is_refused(monkeypatch) -> None:
    with pytest.raises(V.TierConfigError, match="metrics_port"):
        cfg, _ = V.offloading_config({**V.TIER, "metrics_port": 65535}, dp_index=1)
        V.OffloadingSpecFactory.create_spec(cfg).get_manager()


@pytest.mark.timeout(60)
def test_a_metrics_port_one_above_the_port_shifts_with_it(managers) -> None:
    """``port`` P and ``metrics_port`` P + 1 on rank 1: the rank listens on P + 1 and serves its
    metrics on P + 2.  It was refused "metrics_port=P+1 is port too": the two were shifted one
    at a time, and the config in between was checked."""
    port = V.free_ports(3)
    _, tier = managers({**V.TIER, "port": port, "metrics_port": port + 1}, dp_index=1)
    assert (tier.config.port, tier.config.metrics_port) == (port + 1, port + 2)
    assert tier.kvtier.metrics_address == f"127.0.0.1:{port + 2}"


@pytest.mark.timeout(60)
def test_two_ranks_on_one_host_whose_ports_overlap_are_told_why(managers) -> None:
    """Ranks 0 and 1 on one host with ``metrics_port`` one above ``port``: rank 1's listener is
    rank 0's metrics port.  Rank 1's refusal says so and what to change (it read "another process
    listens there", which sent the user looking for a stranger)."""
    port = V.free_ports(2)
    entry = {**V.TIER, "port": port, "metrics_port": port + 1}
    _, rank0 = managers(entry, dp_index=0)
    assert (rank0.config.port, rank0.config.metrics_port) == (port, port + 1)
    with pytest.raises(V.TierConfigError) as exc:
        managers(entry, dp_index=1)
    assert exc.value.keys == ("port", "metrics_port")
    assert "each of the 2 data-parallel ranks binds both plus its index" in str(exc.value)
    assert "put them at least 2 apart" in str(exc.value)
