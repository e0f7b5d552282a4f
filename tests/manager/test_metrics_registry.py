"""kvtier.metrics: the series' shape, bounded labels, one registry per manager, the endpoint's
errors, the scrape-time gauges, and the generated table in docs/metrics.md."""

from __future__ import annotations

import inspect
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from kvtier.metrics import CONST_LABELS, SERIES, VOCABULARY, TierMetrics, bounded
from kvtier.transport import TransportError
from kvtier.wire import messages as wm
from kvtier.wire.codec import encode_frames
from mgr_helpers import consumer_req, job, keys_for, metric, metric_sum, producer_req, pump_until, transfer_once
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
UNIT_SUFFIX = {"counter": ("_total",), "histogram": ("_bytes", "_seconds", "_bytes_per_second")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_series_follow_the_naming_rules_and_name_their_feeder() -> None:
    names = [s.name for s in SERIES]
    assert len(names) == len(set(names))
    feeders = {n for n, _ in inspect.getmembers(TierMetrics, inspect.isfunction)}
    for s in SERIES:
        assert re.fullmatch(r"kvtier_[a-z_]+", s.name), s.name
        assert s.name.endswith(UNIT_SUFFIX.get(s.kind, ("",))), f"{s.name}: unit suffix for a {s.kind}"
        if s.unit in ("bytes", "seconds"):  # a base unit ends the name, before a counter's _total
            assert s.name.removesuffix("_total").endswith("_" + s.unit), f"{s.name}: unit {s.unit} last"
        assert s.kind in ("counter", "gauge", "histogram")
        assert s.help and s.unit and not set(s.labels) & set(CONST_LABELS)
        assert (s.kind == "histogram") == bool(s.buckets)
        assert s.fed_by == "scrape" or s.fed_by in feeders, f"{s.name}: fed by {s.fed_by!r}?"


def test_docs_metrics_table_is_generated_from_the_series() -> None:
    from tools.docgen import render_metrics_table, render_page

    page = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert render_page(page, ("metrics table",)) == page, "docs/metrics.md is stale: run python -m tools docs"
    for s in SERIES:
        assert f"| `{s.name}` |" in render_metrics_table()


def test_label_values_outside_kvtier_vocabulary_are_other() -> None:
    assert bounded("reaped") == "reaped" and bounded("bad_field") == "bad_field"
    assert bounded(None) == "" and bounded("x" * 200) == "other" and bounded("Reaped") == "other"
    assert "other" not in VOCABULARY


def test_a_peer_cannot_grow_the_label_set(make_manager) -> None:
    """Error messages with arbitrary reason texts from a real session are counted under one label."""
    p = make_manager({})
    c = make_manager({})
    req = consumer_req("c1", "kv-x", p.host, p.port)
    c.on_new_request(req)
    assert pump_until(lambda: CoreView(c.core).session_ready(p.address), managers=[p, c])
    for i in range(20):
        c.transport.send(p.address, encode_frames(wm.Error(gen=0, reason=f"made-up-{i}", detail="", kv_request_id="")))
    c.transport.send(p.address, encode_frames(wm.Error(gen=0, reason="bad_field", detail="", kv_request_id="")))
    assert pump_until(lambda: metric_sum(p, "kvtier_wire_errors_total") == 21, managers=[p, c])
    assert metric(p, "kvtier_wire_errors_total", reason="peer_reported_other") == 20
    assert metric(p, "kvtier_wire_errors_total", reason="peer_reported_bad_field") == 1
    labels = {k for k in p.stats() if k.startswith("kvtier_wire_errors_total")}
    assert len(labels) == 2


def test_several_managers_in_one_process_keep_their_own_series(make_manager) -> None:
    a = make_manager({"metrics_port": 0})
    b = make_manager({"metrics_port": 0})
    assert a.metrics is not b.metrics and a.metrics_address != b.metrics_address
    preq = producer_req("p1", "kv-local")
    local = {"req_id": "l1"}
    from kvtier.api import RequestContext

    lreq = RequestContext(**local)
    a.on_new_request(lreq)
    a.submit_store(job(1, keys_for("l", 1), [0], lreq))  # a local request: ok at once
    assert metric(a, "kvtier_jobs_total", kind="store", outcome="ok", reason="local") == 1
    assert metric(b, "kvtier_jobs_total", kind="store", outcome="ok", reason="local") == 0
    b.on_new_request(preq)
    b.submit_store(job(2, keys_for("kv-local", 2), [0, 1], preq))
    assert metric(b, "kvtier_parked_ids", state="parked") == 1
    assert metric(b, "kvtier_pinned_bytes", state="parked") == 2 * b.pool.block_bytes
    assert metric(a, "kvtier_parked_ids", state="parked") == 0
    for m in (a, b):
        with urllib.request.urlopen(f"http://{m.metrics_address}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        listeners = set(re.findall(r'listener="([^"]+)"', text))
        assert listeners == {m.address}


def test_oldest_parked_age_counts_from_the_first_store(make_manager) -> None:
    now = [100.0]
    m = make_manager({}, clock=lambda: now[0])
    req = producer_req("p1", "kv-age")
    m.on_new_request(req)
    m.submit_store(job(1, keys_for("kv-age", 1), [0], req))
    now[0] = 103.0
    m.submit_store(job(2, keys_for("kv-age2", 1), [1], req))  # a second store of the same id
    now[0] = 110.0
    assert metric(m, "kvtier_oldest_parked_age_seconds") == 10.0
    assert metric(m, "kvtier_pinned_bytes", state="parked") == 2 * m.pool.block_bytes


def test_a_scrape_while_a_stores_digests_are_taken_keeps_its_park_age(make_manager) -> None:
    """A scrape between a large store's hand-over and its digests' end (the digest pool's work)
    must not forget when the id parked: before, its age read 0 for as long as it stayed parked."""
    now = [100.0]
    m = make_manager({"digest_threads": 1}, clock=lambda: now[0])
    req = producer_req("p1", "kv-big")
    m.on_new_request(req)
    n = 32  # 128 KiB: past the inline size, so its digests are taken on the pool
    m.submit_store(job(1, keys_for("kv-big", n), list(range(n)), req))
    # caller-driven: no pass applies the store until the next poll, whatever the pool's pace
    assert metric(m, "kvtier_parked_ids", state="parked") == 0
    assert metric(m, "kvtier_oldest_parked_age_seconds") == 0
    now[0] = 101.0
    assert pump_until(lambda: metric(m, "kvtier_parked_ids", state="parked") == 1, managers=[m])
    now[0] = 110.0
    assert metric(m, "kvtier_oldest_parked_age_seconds") == 9.0  # from when the core parked it


def test_metrics_port_in_use_is_a_clear_error_and_leaks_no_listener(make_manager) -> None:
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = _free_port()
        with pytest.raises(TransportError, match=r"metrics_port=\d+: cannot serve metrics on 127\.0\.0\.1"):
            KvTierManager({"port": port, "metrics_port": taken.getsockname()[1]}, BlockPool(4, 4096, pin=False))
        # the zmq listener of the failed constructor was closed: its port binds again
        m = make_manager({"port": port})
        assert m.port == port
    finally:
        taken.close()


def test_a_wedged_manager_does_not_hang_the_scrape(make_manager, monkeypatch) -> None:
    from kvtier import metrics as M

    monkeypatch.setattr(M._Live, "LOCK_TIMEOUT_S", 0.05)
    m = make_manager({})
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with m.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        held.wait(10)
        names = {fam.name for fam in m.metrics.collect()}
        assert "kvtier_jobs" in names and "kvtier_parked_ids" not in names  # events yes, live no
    finally:
        release.set()
        t.join()
    assert "kvtier_parked_ids" in {fam.name for fam in m.metrics.collect()}


def test_the_tap_keeps_every_observation_up_to_its_bound(make_manager) -> None:
    m = make_manager({})
    tap = m.tier_metrics.tap(max_observations=3)
    for i in range(5):
        m.tier_metrics.tick_lag(i / 10)
    assert [v for _, _, v in tap.take()] == [0.2, 0.3, 0.4] and tap.dropped == 2
    assert tap.take() == []


def test_a_real_transfer_is_observed_per_transfer(make_manager) -> None:
    p = make_manager({})
    c = make_manager({})
    r = transfer_once(p, c, "kv-t")
    bb = p.pool.block_bytes
    assert metric(p, "kvtier_transfer_bytes_count", role="producer") == 1
    assert metric(p, "kvtier_transfer_bytes_sum", role="producer") == 3 * bb
    assert metric(c, "kvtier_transfer_bytes_sum", role="consumer") == 3 * bb
    assert metric(c, "kvtier_transfer_duration_seconds_sum", role="consumer") == r.transfer_time_s
    thr = metric(c, "kvtier_transfer_throughput_bytes_per_second_sum", role="consumer")
    assert thr == pytest.approx(3 * bb / r.transfer_time_s)
