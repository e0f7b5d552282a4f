"""The metrics endpoint over real HTTP, checked against what a two-process run did.

The producer runs in a child process (tests.support.peer_process) with ``metrics_port: 0``; the
consumer runs here, with an endpoint of its own.  One id is fetched (the load is submitted before
the store, so no reap can race it), one is left parked until it is reaped and then fetched late.
Both endpoints are scraped with ``GET /metrics`` and every value is compared with the run.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from kvtier.metrics import SERIES
from kvtier.top import Snapshot, scrape
from mgr_helpers import Jobs, consumer_req, job, keys_for, pump_until

pytestmark = pytest.mark.timeout(60)

BB = 64 * 1024
PARK_S = 2.0  # long enough that the first scrape sees the id parked, short enough to wait out
PCFG = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 2.0, "unbound_store_timeout_s": PARK_S, "metrics_port": 0}
CCFG = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 2.0, "load_timeout_s": 10.0,
        "fetch_supply_timeout_s": 5.0, "metrics_port": 0}


def _get(address: str) -> Snapshot:
    snap = scrape(f"http://{address}/metrics")
    assert not snap.error, snap.error
    return snap


def _families(address: str) -> set[str]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_two_process_run_shows_every_series_with_the_values_of_the_run(producer, make_manager):
    producer.start_manager(PCFG, num_blocks=32, block_bytes=BB)
    paddr = producer.metrics_address
    assert paddr is not None and paddr.startswith("127.0.0.1:")

    # 1. an id parked and left alone: visible as parked, pinned, aging
    late_keys = keys_for("kv-late", 4)
    producer.store("kv-late", 1, late_keys, [0, 1, 2, 3], seed=1)
    snap = _get(paddr)
    if producer.state("kv-late") == "parked":  # still parked after the scrape: it saw it parked
        assert snap.total("kvtier_parked_ids", state="parked") == 1
        assert snap.total("kvtier_pinned_bytes", state="parked") == 4 * BB
        assert snap.total("kvtier_oldest_parked_age_seconds") > 0
    assert snap.label("kvtier_parked_ids", "listener") == producer.address
    assert snap.label("kvtier_parked_ids", "tier") == "KvTierSecondaryTier"

    # 2. an id fetched: the load is submitted before the store (bound first, served at the store)
    c = make_manager(CCFG, num_blocks=32, block_bytes=BB)
    jobs = Jobs(c)
    n = 6
    keys = keys_for("kv-ok", n)
    req = consumer_req("c-ok", "kv-ok", producer.host, producer.port)
    c.on_new_request(req)
    c.submit_load(job(11, keys, list(range(10, 10 + n)), req))
    assert pump_until(lambda: producer.state("kv-ok") == "awaiting", managers=[c])
    seen: dict[int, list[dict]] = {}
    for r in producer.store("kv-ok", 2, keys, list(range(4, 4 + n)), seed=2)["immediate"]:
        seen.setdefault(r["job_id"], []).append(r)  # the store may be served within the call
    assert pump_until(lambda: jobs.has(11), jobs=[jobs])
    assert jobs.one(11).success

    # 3. the parked id is reaped; a late fetch for it is refused with 'reaped'
    def both_reported() -> bool:
        for r in producer.results():
            seen.setdefault(r["job_id"], []).append(r)
        return {1, 2} <= seen.keys()

    assert pump_until(both_reported, managers=[c], timeout_s=PARK_S + 10), seen  # c keeps its session alive
    assert [(r["success"], r["reason"]) for r in seen[1]] == [(False, "reaped")]
    assert [r["success"] for r in seen[2]] == [True]
    req2 = consumer_req("c-late", "kv-late", producer.host, producer.port)
    c.on_new_request(req2)
    c.submit_load(job(12, late_keys, [20, 21, 22, 23], req2))
    assert pump_until(lambda: jobs.has(12), jobs=[jobs])
    assert (jobs.one(12).success, jobs.one(12).reason) == (False, "reaped")

    # every series of docs/metrics.md is declared on both endpoints
    caddr = c.metrics_address
    assert caddr is not None and caddr != paddr
    for address in (paddr, caddr):
        assert {s.name for s in SERIES} <= _families(address)

    # the producer's endpoint, against the run
    p = _get(paddr)
    assert p.total("kvtier_block_sent_bytes_total") == n * BB  # the fetched id only
    assert p.total("kvtier_transfer_bytes_count", role="producer") == 1
    assert p.total("kvtier_transfer_bytes_sum", role="producer") == n * BB
    assert p.total("kvtier_transfer_duration_seconds_count", role="producer") == 1
    assert p.total("kvtier_transfer_throughput_bytes_per_second_count", role="producer") == 1
    assert p.total("kvtier_jobs_total", kind="store", outcome="ok") == 1  # one per store job
    assert p.total("kvtier_jobs_total", kind="store", outcome="fail", reason="reaped") == 1
    assert p.total("kvtier_jobs_total") == 2
    assert p.total("kvtier_fetches_refused_total", reason="reaped") == 1  # the late fetch
    assert p.total("kvtier_fetches_refused_total") == 1
    assert p.total("kvtier_retained_ids", state="done") == 1
    assert p.total("kvtier_retained_ids", state="tombstoned", reason="reaped") == 1
    assert p.total("kvtier_parked_ids") == 0 and p.total("kvtier_pinned_bytes") == 0
    assert p.total("kvtier_oldest_parked_age_seconds") == 0
    assert p.total("kvtier_sessions", state="ready") == 1 and p.total("kvtier_session_ends_total") == 0
    assert p.total("kvtier_wire_errors_total") == 0 and p.total("kvtier_internal_errors_total") == 0
    assert p.total("kvtier_block_landed_bytes_total") == 0

    # the consumer's endpoint, against the run
    q = _get(caddr)
    assert q.label("kvtier_sessions", "listener") == c.address
    assert q.total("kvtier_block_landed_bytes_total") == n * BB
    assert q.total("kvtier_transfer_bytes_count", role="consumer") == 1
    assert q.total("kvtier_transfer_bytes_sum", role="consumer") == n * BB
    assert q.total("kvtier_jobs_total", kind="load", outcome="ok") == 1
    assert q.total("kvtier_jobs_total", kind="load", outcome="fail", reason="reaped") == 1
    assert q.total("kvtier_sessions", state="ready") == 1
    assert q.total("kvtier_block_sent_bytes_total") == 0

    # a consumer that says goodbye: a routine session end on the producer (its goodbye names
    # the shutdown, so the reason is ``shutdown``, not a lost peer), and its endpoint closes
    c.shutdown()
    assert pump_until(lambda: _get(paddr).total("kvtier_session_ends_total", reason="shutdown") == 1)
    assert _get(paddr).total("kvtier_session_ends_total", reason="peer_disconnected") == 0
    assert _get(paddr).total("kvtier_sessions") == 0
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://{caddr}/metrics", timeout=5)


def test_shutdown_with_the_endpoint_served_keeps_to_its_grace(make_manager):
    """``shutdown(grace_s)`` returns within its grace (plus a few milliseconds) with the metrics
    endpoint served too: stopping the endpoint wakes its server at once.  It waited out the
    HTTP server's 0.5 s poll interval after the grace (0.45 s here: the scrape just before
    restarts that interval)."""
    import time

    m = make_manager({"metrics_port": 0})
    address = m.metrics_address
    assert "kvtier_sessions" in _families(address)
    start = time.monotonic()
    m.shutdown(0.05)
    assert time.monotonic() - start < 0.25
    with pytest.raises(urllib.error.URLError):  # and its port is released
        _families(address)


def test_the_endpoint_serves_its_two_pages_and_404_elsewhere(make_manager):
    """``/metrics`` (and ``/``, where some scrape configs point) is Prometheus text, ``/kvtier/requests``
    is JSON; any other path is 404 naming both pages — a mistyped path answered with metrics read as
    a page that did not parse."""
    import json

    c = make_manager({"metrics_port": 0})
    base = f"http://{c.metrics_address}"
    for path in ("/metrics", "/metrics/", "/"):
        with urllib.request.urlopen(base + path, timeout=10) as resp:
            assert resp.status == 200 and b"# TYPE kvtier_" in resp.read(), path
    with urllib.request.urlopen(base + "/kvtier/requests?limit=1", timeout=10) as resp:
        assert json.loads(resp.read())["requests"] == []
    for path in ("/kvtier/request", "/favicon.ico", "/metricz"):
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(base + path, timeout=10)
        body = json.loads(exc.value.read())
        assert exc.value.code == 404 and "serves /metrics and /kvtier/requests" in body["error"], body
