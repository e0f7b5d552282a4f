"""``kvtier why KV_REQUEST_ID ENDPOINT...`` explains a failed load from the metrics endpoints of both
engines, on both data planes: a reaped id, a refused dial, a load that timed out and a corrupt
block.  Each test makes the failure happen for real (real sockets, real planes), then reads the
story back the way an operator would — the CLI against ``/kvtier/requests`` — and checks that it
names the reason, what it means, what to change, the peer and the states the id went through.

Waits are bounded poll loops; nothing asserts on timing.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from click.testing import CliRunner
from mgr_helpers import (BOTH_PLANES, Jobs, consumer_req, job, keys_for, metric, producer_req, pump_until,
                         serve_http, transfer_once)

from kvtier.cli import cli
from kvtier.lifecycle import REASON_DOCS, Reason
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(90)

HB = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 5.0, "metrics_port": 0}


def _why(kid: str, *managers) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, ["why", kid, *[m.metrics_address for m in managers]])
    return res.exit_code, res.stdout, res.stderr


def _records(kid: str, mgr) -> list[dict]:
    res = CliRunner().invoke(cli, ["why", "--json", kid, mgr.metrics_address])
    return json.loads(res.stdout)[mgr.metrics_address]["requests"]


def _failed_load(out: str, kid: str, reason: str) -> None:
    """The consumer's story: the outcome, the spec's meaning and a line on what to change."""
    assert f"{kid} load (consumer) FAILED: {reason}" in out, out
    assert f"meaning   {REASON_DOCS[Reason(reason)]}" in out, out
    assert "  change    " in out and f"docs/troubleshooting.md#{reason}" in out, out


@BOTH_PLANES
def test_why_explains_a_reaped_load(make_manager) -> None:
    p = make_manager({**HB, "unbound_store_timeout_s": 0.2})
    c = make_manager(HB)
    pjobs, cjobs = Jobs(p), Jobs(c)
    keys = keys_for("kv-late", 3)
    preq = producer_req("p1", "kv-late")
    p.on_new_request(preq)
    p.submit_store(job(1, keys, [0, 1, 2], preq))
    p.on_request_finished(preq)
    assert pump_until(lambda: pjobs.has(1), managers=[p], jobs=[pjobs])
    creq = consumer_req("c1", "kv-late", p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys, [3, 4, 5], creq))
    assert pump_until(lambda: cjobs.has(2), managers=[p, c], jobs=[cjobs])
    assert cjobs.one(2).reason == "reaped"

    code, out, _ = _why("kv-late", c, p)
    assert code == 0
    _failed_load(out, "kv-late", "reaped")
    assert "unbound_store_timeout_s" in out  # the change names the key
    # the producer's side: the parked blocks reaped (no consumer came), then the late fetch refused
    assert "kv-late parked blocks (producer) FAILED: reaped" in out and "blocks    3 parked" in out, out
    assert f"kv-late a peer's fetch (producer) FAILED: reaped, peer {c.address.rpartition(':')[0]}" in out, out
    (load,) = _records("kv-late", c)
    assert load["peer"] == p.address and load["path"] == ["in_flight", "failed"]
    assert list(load["marks"]) == ["fetch", "result"] and load["landed"] == 0 and load["blocks"] == 3


def _fetch_before_any_store(make_manager, kid: str, supply_s: float):
    """A producer and a consumer whose load job 2 of ``kid`` asks before anything is stored."""
    p = make_manager({**HB, "fetch_supply_timeout_s": supply_s})
    c = make_manager(HB)
    cjobs = Jobs(c)
    creq = consumer_req("c1", kid, p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys_for(kid, 1), [0], creq))
    return p, c, cjobs, creq


def test_why_tells_how_long_a_fetch_waited_for_blocks_never_stored(make_manager) -> None:
    """The consumer asked before the prefill stored anything, and nothing came: the producer's
    entry says the fetch bound the id and waited the supply timeout (at least: each store restarts
    it), not that it was refused at once."""
    p, c, cjobs, _ = _fetch_before_any_store(make_manager, "kv-never", 0.3)
    assert pump_until(lambda: cjobs.has(2), managers=[p, c], jobs=[cjobs])
    assert cjobs.one(2).reason == "supply_timeout"
    (fetch,) = _records("kv-never", p)
    assert fetch["role"] == "fetch" and fetch["reason"] == "supply_timeout"
    assert list(fetch["marks"]) == ["bound", "refused"] and fetch["path"] == ["awaiting", "tombstoned"], fetch
    assert fetch["marks"]["refused"] == fetch["seconds"] >= 0.3, fetch
    code, out, _ = _why("kv-never", p)
    assert code == 0 and "timeline  bound +0.0 ms · refused +3" in out, out


def _bind(make_manager, kid: str, stored: int):
    """A producer (``stored`` of 3 blocks parked by its store job 1) and a consumer whose load job 2
    of ``kid`` fetched all three: the fetch bound the id and waits for the rest of its blocks."""
    p = make_manager({**HB, "fetch_supply_timeout_s": 20.0})
    c = make_manager({**HB, "load_timeout_s": 20.0})
    keys = keys_for(kid, 3)
    preq = producer_req("p1", kid)
    p.on_new_request(preq)
    if stored:
        p.submit_store(job(1, keys[:stored], range(stored), preq))
    creq = consumer_req("c1", kid, p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys, [3, 4, 5], creq))
    bound = lambda: getattr(CoreView(p.core).producer(kid), "state", None) == "awaiting"  # noqa: E731
    assert pump_until(bound, managers=[p, c])
    return p, c, preq


@pytest.mark.parametrize(("reason", "stored"), [("nothing_stored", 0), ("incomplete", 2), ("drained", 1)])
def test_why_on_the_producer_tells_how_long_a_bound_fetch_waited(make_manager, reason: str, stored: int) -> None:
    """A fetch bound the id and waited for its blocks; then the prefill request finished having
    stored none or only some, or the engine drained: the producer's side says the fetch was bound
    and refused after it waited (as long as the consumer did), through the awaiting step — not
    that it was refused at once — and the parked blocks' record names the consumer."""
    kid = f"kv-{reason}"
    p, c, preq = _bind(make_manager, kid, stored)
    pjobs, cjobs = Jobs(p), Jobs(c)
    pump_until(lambda: False, managers=[p, c], timeout_s=0.3)  # it waits bound
    if reason == "drained":
        p.drain_jobs(5.0)
    else:
        p.on_request_finished(preq)
    assert pump_until(lambda: cjobs.has(2) and (not stored or pjobs.has(1)), managers=[p, c], jobs=[pjobs, cjobs])
    assert cjobs.one(2).reason == reason
    records = {r["role"]: r for r in _records(kid, p)}
    fetch = records["fetch"]
    assert fetch["reason"] == reason and list(fetch["marks"]) == ["bound", "refused"], fetch
    assert fetch["marks"]["refused"] == fetch["seconds"] >= 0.3 and fetch["path"] == ["awaiting", "tombstoned"]
    if stored:
        parked = records["producer"]
        assert parked["peer"].startswith("127.0.0.1:") and parked["path"] == ["awaiting", "tombstoned"], parked
    code, out, _ = _why(kid, p)
    assert code == 0 and "timeline  bound +0.0 ms · refused +" in out, out
    assert f"meaning   {REASON_DOCS[Reason(reason)]}" in out, out
    assert "before a consumer fetched it" not in out, out  # drained: a fetch had bound it


def test_the_producer_names_the_consumer_of_a_bound_fetch_that_died(make_manager) -> None:
    """A fetch bound the id (one of its three blocks stored) and its consumer's process dies: the
    producer's record of the parked blocks names that consumer and the step it was in (awaiting),
    so the log line `session with … ended` it points to can be found."""
    p, c, _ = _bind(make_manager, "kv-orphan", 1)
    pjobs = Jobs(p)
    c.close_abruptly()
    assert pump_until(lambda: pjobs.has(1), managers=[p], jobs=[pjobs])
    assert pjobs.one(1).reason == "peer_lost"
    (rec,) = _records("kv-orphan", p)
    assert (rec["role"], rec["reason"]) == ("producer", "peer_lost") and rec["peer"].startswith("127.0.0.1:"), rec
    assert rec["path"] == ["awaiting", "tombstoned"] and list(rec["marks"]) == ["bound", "result"], rec
    code, out, _ = _why("kv-orphan", p)
    assert code == 0 and f"FAILED: peer_lost, peer {rec['peer']}" in out, out


@BOTH_PLANES
def test_why_on_the_producer_tells_a_fetch_its_consumer_aborted_before_any_block(make_manager) -> None:
    """The consumer asked before the prefill stored anything, then its request ended: the
    producer tombstoned the id (aborted) and its endpoint tells that fetch's story too."""
    p, c, cjobs, creq = _fetch_before_any_store(make_manager, "kv-gone", 20.0)
    assert pump_until(lambda: CoreView(p.core).producer("kv-gone") is not None, managers=[p, c], jobs=[cjobs])
    c.on_request_finished(creq)
    assert pump_until(lambda: cjobs.has(2), managers=[p, c], jobs=[cjobs])
    assert cjobs.one(2).reason == "cancelled"
    assert pump_until(lambda: bool(_records("kv-gone", p)), managers=[p, c])
    (fetch,) = _records("kv-gone", p)
    assert (fetch["role"], fetch["ok"], fetch["reason"]) == ("fetch", False, "aborted"), fetch
    assert list(fetch["marks"]) == ["bound", "aborted"] and fetch["path"] == ["awaiting", "tombstoned"], fetch
    code, out, _ = _why("kv-gone", p)
    assert code == 0 and "a peer's fetch (producer) FAILED: aborted" in out, out


@BOTH_PLANES
def test_why_explains_a_refused_dial(make_manager) -> None:
    c = make_manager(HB)
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    cjobs = Jobs(c)
    creq = consumer_req("c1", "kv-nobody", "127.0.0.1", dead)
    c.on_new_request(creq)
    c.submit_load(job(2, keys_for("kv-nobody", 2), [0, 1], creq))
    assert pump_until(lambda: cjobs.has(2), managers=[c], jobs=[cjobs])

    code, out, _ = _why("kv-nobody", c)
    assert code == 0
    _failed_load(out, "kv-nobody", "connect_refused")
    assert f"peer 127.0.0.1:{dead}" in out and "remote_port" in out, out
    (load,) = _records("kv-nobody", c)
    assert load["path"] == ["failed"] and list(load["marks"]) == ["result"]


@BOTH_PLANES
def test_why_explains_a_load_that_timed_out(make_manager) -> None:
    """The producer stops being polled (a wedged engine) after the handshake: the consumer's load
    times out, its abort goes unanswered and it gives the session up."""
    timers = {"load_timeout_s": 0.6, "abort_ack_timeout_s": 0.3, "revoke_timeout_s": 0.3,
              "fetch_supply_timeout_s": 0.3, "handshake_timeout_s": 0.5}
    p = make_manager(HB)
    c = make_manager({**HB, **timers})
    cjobs = Jobs(c)
    keys = keys_for("kv-slow", 2)
    creq = consumer_req("c1", "kv-slow", p.host, p.port)
    c.on_new_request(creq)
    assert pump_until(lambda: CoreView(c.core).session_ready(p.address), managers=[p, c])
    c.submit_load(job(2, keys, [0, 1], creq))  # the producer is never polled again: nothing answers
    assert pump_until(lambda: cjobs.has(2), managers=[c], jobs=[cjobs])
    assert cjobs.one(2).reason == "load_timeout"

    code, out, _ = _why("kv-slow", c)
    assert code == 0
    _failed_load(out, "kv-slow", "load_timeout")
    (load,) = _records("kv-slow", c)
    assert load["peer"] == p.address
    assert load["path"][:2] == ["in_flight", "aborting"] and load["path"][-1] == "failed", load["path"]
    assert list(load["marks"]) == ["fetch", "abort", "result"]
    assert load["marks"]["abort"] >= timers["load_timeout_s"] * 0.9  # the abort left at the deadline, not before


@BOTH_PLANES
def test_why_explains_a_corrupt_load(make_manager) -> None:
    """The prefill engine changes a block after its store was digested (an engine bug): the load
    fails ``corrupt``; the explanation points at the engine, never at turning integrity off."""
    p = make_manager(HB)
    c = make_manager({**HB, "load_timeout_s": 10.0, "fetch_supply_timeout_s": 5.0})
    pjobs, cjobs = Jobs(p), Jobs(c)
    keys = keys_for("kv-bad", 4)
    preq = producer_req("p1", "kv-bad")
    p.on_new_request(preq)
    p.submit_store(job(1, keys, [0, 1, 2, 3], preq))
    p.poll(0)
    p.pool.buffer(2)[77] ^= 0xFF  # after the digest was taken
    creq = consumer_req("c1", "kv-bad", p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys, [4, 5, 6, 7], creq))
    assert pump_until(lambda: cjobs.has(2) and pjobs.has(1), managers=[p, c], jobs=[pjobs, cjobs])
    assert cjobs.one(2).reason == "corrupt"

    code, out, _ = _why("kv-bad", c, p)
    assert code == 0
    _failed_load(out, "kv-bad", "corrupt")
    assert "never turn it off" in out, out
    (load,) = _records("kv-bad", c)
    assert load["peer"] == p.address and "first_block" in load["marks"] and load["path"][-1] == "failed"
    assert load["path"][0] == "in_flight"
    # landed: the blocks the checks matched (those before the corrupt one, decision I21), not those that arrived
    kept = len(cjobs.one(2).successful_keys or ())
    assert load["landed"] == kept < 4 and f"blocks    {kept} of 4 landed" in out, (load, out)
    # the producer's side of the same id: its transfer was aborted by the consumer
    (parked,) = _records("kv-bad", p)
    assert (parked["role"], parked["ok"], parked["reason"]) == ("producer", False, "aborted")
    assert "sending" in parked["marks"] and parked["blocks"] == 4


def _warm_hand_off(make_manager, kid: str, n: int):
    """A producer and a consumer whose session is up; ``n`` blocks of ``kid`` parked (store job 11)
    and their load submitted (job 12): its fetch leaves at once.  Nothing is polled after it."""
    p = make_manager(HB)
    c = make_manager(HB)
    pjobs, cjobs = Jobs(p), Jobs(c)
    transfer_once(p, c, "kv-warm")
    keys = keys_for(kid, n)
    preq = producer_req("p2", kid)
    p.on_new_request(preq)
    p.submit_store(job(11, keys, range(n), preq))
    creq = consumer_req("c2", kid, p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(12, keys, range(n, 2 * n), creq))
    return p, c, pjobs, cjobs


def test_why_shows_a_load_still_in_progress(make_manager) -> None:
    """A fetch still out, and blocks parked that no consumer fetched yet, are shown as in progress
    (states and milestones so far, what they wait for), not as ids the endpoints do not know; once
    the request ends, its finished records are shown."""
    p, c, pjobs, cjobs = _warm_hand_off(make_manager, "kv-open", 2)  # the producer is not polled: the fetch stays out
    assert pump_until(lambda: _why("kv-open", c)[0] == 0, managers=[c], jobs=[cjobs])
    code, out, err = _why("kv-open", c)
    assert "kv-open load (consumer) IN PROGRESS for " in out and f"peer {p.address}" in out, (out, err)
    assert "in_flight (so far)" in out and "timeline  fetch +" in out, out
    assert "waiting   for the producer's blocks (load_timeout_s)" in out, out
    # the producer has not read the fetch: its id is parked, which it says (and for how long)
    code, out, _ = _why("kv-open", p)
    assert code == 0 and "kv-open parked blocks (producer) IN PROGRESS for " in out, out
    assert "path      parked (so far)" in out and "waiting   for a consumer's fetch" in out, out
    assert not cjobs.has(12)
    assert pump_until(lambda: cjobs.has(12) and pjobs.has(11), managers=[p, c], jobs=[pjobs, cjobs])
    code, out, _ = _why("kv-open", c, p)
    assert code == 0 and "IN PROGRESS" not in out, out
    assert "kv-open load (consumer) ok" in out and "kv-open parked blocks (producer) ok" in out, out


def test_why_shows_a_transfer_waiting_for_its_receipt(make_manager) -> None:
    """Every block left and the data plane let go of them, and the consumer (not polled) has not
    confirmed them: the producer's side says it is delivering and waits for the receipt, as
    ``kvtier_parked_ids`` does — not that it is still serving."""
    p, c, pjobs, cjobs = _warm_hand_off(make_manager, "kv-receipt", 3)  # the consumer is then not polled
    assert pump_until(lambda: metric(p, "kvtier_parked_ids", state="delivering") == 1, managers=[p])
    code, out, _ = _why("kv-receipt", p)
    assert code == 0 and "path      serving → delivering (so far)" in out, out
    assert "waiting   for the consumer's receipt" in out, out
    assert pump_until(lambda: cjobs.has(12) and pjobs.has(11), managers=[p, c], jobs=[pjobs, cjobs])
    parked = [r for r in _records("kv-receipt", p) if r["role"] == "producer"]
    assert [r["path"] for r in parked] == [["serving", "delivering", "done"]], parked


def test_why_says_when_no_endpoint_knows_the_id(make_manager) -> None:
    c = make_manager(HB)
    code, out, err = _why("kv-never", c)
    assert code == 1 and out == ""
    assert "'kv-never' is not among its last 1024 finished requests, nor in progress there" in err, err
    res = CliRunner().invoke(cli, ["why", "kv-x", "notaurl"])
    assert res.exit_code == 2 and "host:port (e.g. 10.0.0.5:9464)" in res.output, res.output
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    res = CliRunner().invoke(cli, ["why", "kv-x", dead])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"{dead}: cannot read it: connection refused: is the tier's metrics_port this port?" in res.stderr, \
        res.stderr


@pytest.mark.parametrize(("body", "status", "says"), [
    (b"<html>a web page</html>", 200, "is not kvtier's list of requests"),
    (b"[1, 2]", 200, "is not kvtier's list of requests"),
    (b'{"requests": 5}', 200, "is not kvtier's list of requests"),
    (b'{"requests": [1]}', 200, "is not kvtier's list of requests"),
    (b"no such page", 404, "has no /kvtier/requests page (HTTP 404"),
])
def test_why_names_an_endpoint_that_is_not_kvtiers(body: bytes, status: int, says: str) -> None:
    """Something that answers HTTP but is not a tier's metrics page: one line naming the endpoint,
    what answered and the fix, exit 1 — not a traceback, not a usage error."""
    server = serve_http(body, status, "text/html")
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        res = CliRunner().invoke(cli, ["why", "kv-1", target])
        assert res.exit_code == 1 and res.exception is None or isinstance(res.exception, SystemExit), res.output
        assert f"{target} is not a kvtier metrics endpoint: it" in res.stderr and says in res.stderr, res.stderr
        assert "metrics_port" in res.stderr, res.stderr
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("record", [
    {"kv_request_id": "kv-1", "ok": False, "reason": "reaped"},  # no role: another kvtier version's record
    {"kv_request_id": "kv-1", "role": "load", "ok": False, "reason": "reaped", "path": 5},
])
def test_why_shows_a_record_it_cannot_read_as_sent_not_a_traceback(record: dict) -> None:
    body = json.dumps({"capacity": 1024, "requests": [record], "open": []}).encode()
    server = serve_http(body, 200, "application/json")
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        res = CliRunner().invoke(cli, ["why", "kv-1", target])
        assert res.exit_code == 0, res.output
        assert f"{target}: a record of 'kv-1' this kvtier cannot read (" in res.output, res.output
        assert '"reason": "reaped"' in res.output  # the record itself, as sent
    finally:
        server.shutdown()
        server.server_close()


def test_why_and_top_name_a_tiers_own_port_given_for_its_metrics_port(make_manager) -> None:
    """The likeliest mistake: the tier's ``port`` (ZMTP, not HTTP) instead of its ``metrics_port``.
    Said as soon as the port greets, not after ``--timeout`` (a ZMTP peer greets, then waits for
    us: a status line read from it would wait the timeout out)."""
    c = make_manager(HB)
    t0 = time.monotonic()
    res = CliRunner().invoke(cli, ["why", "--timeout", "30", "kv-1", c.address])
    assert time.monotonic() - t0 < 15, "why waited out its --timeout before naming the port"
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert f"{c.address} is not a kvtier metrics endpoint: it is a kvtier tier's own port" in res.stderr, res.stderr
    assert f"metrics_port ({c.metrics_address})" not in res.stderr  # it cannot know which: it only names the key
    t0 = time.monotonic()
    res = CliRunner().invoke(cli, ["top", c.address, "--once", "--interval", "0.1", "--timeout", "30"],
                             env={"COLUMNS": "250"})
    assert time.monotonic() - t0 < 15, "top waited out its --timeout before naming the port"
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "a kvtier tier's own port" in res.output and "metrics_port" in res.output, res.output


def test_top_lists_the_last_finished_requests_failures_first(make_manager) -> None:
    c = make_manager(HB)
    cjobs = Jobs(c)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    creq = consumer_req("c1", "kv-top-fail", "127.0.0.1", dead)
    c.on_new_request(creq)
    c.submit_load(job(2, keys_for("kv-top-fail", 1), [0], creq))
    assert pump_until(lambda: cjobs.has(2), managers=[c], jobs=[cjobs])
    res = CliRunner().invoke(cli, ["top", c.metrics_address, "--once", "--interval", "0.1"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "recently finished" in res.output
    assert "kv-top-fail load (consumer) FAILED: connect_refused" in res.output, res.output


def test_stats_prints_a_readable_summary_with_the_recent_requests(make_manager) -> None:
    c = make_manager(HB)
    cjobs = Jobs(c)
    creq = consumer_req("c1", "kv-sum", "127.0.0.1", 1)
    c.on_new_request(creq)
    c.submit_load(job(2, keys_for("kv-sum", 1), [0], creq))
    assert pump_until(lambda: cjobs.has(2), managers=[c], jobs=[cjobs])
    stats = c.stats()
    assert stats["kvtier_jobs_total{kind=load,outcome=fail,reason=connect_refused}"] == 1  # still the samples
    text = str(stats)
    assert len(text.splitlines()) < 20, text
    assert "load jobs 0 ok · 1 failed (connect_refused 1)" in text, text
    assert "kv-sum load (consumer) FAILED: connect_refused, peer 127.0.0.1:1" in text, text


def test_why_tells_a_successful_load_too(make_manager) -> None:
    p = make_manager(HB)
    c = make_manager(HB)
    assert transfer_once(p, c, "kv-ok", 3).success
    # the consumer's success comes before the producer reads its receipt: wait for the producer's end
    assert pump_until(lambda: p.core.producer_state("kv-ok").value == "done", managers=[p, c])
    code, out, _ = _why("kv-ok", c, p)
    assert code == 0 and "kv-ok load (consumer) ok" in out and "kv-ok parked blocks (producer) ok" in out, out
    assert "  change" not in out  # nothing to change
    (load,) = _records("kv-ok", c)
    assert list(load["marks"]) == ["fetch", "first_block", "receipt", "result"]
    assert load["path"][-1] == "loaded" and load["landed"] == 3 == load["blocks"]
    (parked,) = _records("kv-ok", p)
    assert parked["path"][-1] == "done" and parked["peer"] and "sending" in parked["marks"]


def test_the_producer_names_a_consumer_that_died_by_its_address(make_manager) -> None:
    """The consumer's process dies mid-transfer (no goodbye): the producer's record of the id names
    the consumer by the address its connection came from, as its log lines do — not by the
    inbound routing id (``in:<hex>``), which was all it could say once the connection was gone."""
    p = make_manager({**HB, "transfer_timeout_s": 30.0}, num_blocks=64, block_bytes=256 * 1024)
    c = make_manager(HB, num_blocks=64, block_bytes=256 * 1024)
    pjobs, cjobs = Jobs(p), Jobs(c)
    keys = keys_for("kv-dead", 64)
    preq = producer_req("p1", "kv-dead")
    p.on_new_request(preq)
    p.submit_store(job(1, keys, range(64), preq))
    p.on_request_finished(preq)
    creq = consumer_req("c1", "kv-dead", p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys, range(64), creq))
    serving = lambda: getattr(CoreView(p.core).producer("kv-dead"), "state", None) in ("serving", "delivering")  # noqa: E731
    assert pump_until(serving, managers=[p, c])
    c.close_abruptly()
    assert pump_until(lambda: pjobs.has(1), managers=[p], jobs=[pjobs])
    (rec,) = [r for r in _records("kv-dead", p) if r["role"] == "producer"]
    assert not rec["ok"] and rec["peer"].startswith("127.0.0.1:"), rec


def test_why_explains_a_load_refused_by_allowed_peers(make_manager) -> None:
    """A request naming a producer outside ``allowed_peers`` is refused before any dial; its
    record explains it at once — under vLLM no load follows (its lookups miss), and an outside
    tester found no record — and a load submitted anyway adds no second one."""
    c = make_manager({**HB, "allowed_peers": ["10.9.9.9"]})
    req = consumer_req("c1", "kv-deny", "127.0.0.1", 5999)
    assert c.on_new_request(req) == "local"
    pump_until(lambda: bool(c.forensics.recent("kv-deny")), managers=[c])
    code, out, _ = _why("kv-deny", c)
    assert code == 0, out
    _failed_load(out, "kv-deny", "peer_not_allowed")
    c.submit_load(job(1, [b"k"], [0], req))
    jobs = Jobs(c)
    assert pump_until(lambda: jobs.has(1), managers=[c], jobs=[jobs])
    code, out, _ = _why("kv-deny", c)
    assert code == 0, out
    _failed_load(out, "kv-deny", "peer_not_allowed")
    (rec,) = _records("kv-deny", c)
    assert rec["peer"] == "127.0.0.1:5999", rec  # the endpoint to add to allowed_peers, or to fix


@pytest.mark.parametrize("kid", ["", "a b", "x" * 257])
def test_why_refuses_what_cannot_be_a_kv_request_id(kid: str) -> None:
    """An id no request can have is a usage error naming the rule (it was looked up and reported
    "not among its last 1024 finished requests")."""
    res = CliRunner().invoke(cli, ["why", kid, "127.0.0.1:9"])
    assert res.exit_code == 2 and "is not a kv_request_id" in res.output, res.output


def test_a_second_load_refused_while_the_first_runs_keeps_the_first_loads_story(make_manager) -> None:
    """A second load of an id refused ``duplicate_load`` while the first waits for its blocks is an
    entry of its own: the first load's record stays open and ends with its own result, timeline
    and peer (the refusal took the first load's record and the success was told bare)."""
    p, c = make_manager(HB), make_manager(HB)
    jobs = Jobs(c)
    preq = producer_req("p-dup", "kv-dup")
    p.on_new_request(preq)
    keys = keys_for("kv-dup", 2)
    creq = consumer_req("d-dup", "kv-dup", "127.0.0.1", p.port)
    c.on_new_request(creq)
    c.submit_load(job(11, keys, [10, 11], creq))  # fetch before store: it waits for the blocks
    assert pump_until(lambda: p.core.producer_state("kv-dup").value == "awaiting", managers=[p, c])
    c.submit_load(job(12, keys, [12, 13], creq))
    assert pump_until(lambda: jobs.has(12), managers=[p, c], jobs=[jobs])
    assert jobs.one(12).reason == "duplicate_load"
    p.submit_store(job(1, keys, [0, 1], preq))
    assert pump_until(lambda: jobs.has(11), managers=[p, c], jobs=[jobs])
    assert jobs.one(11).success
    records = _records("kv-dup", c)
    assert sorted((r["ok"], r["reason"]) for r in records) == [(False, "duplicate_load"), (True, "")], records
    (load,) = [r for r in records if r["ok"]]
    assert load["peer"] and "fetch" in load["marks"] and load["path"][-1] == "loaded", load


def test_a_second_load_refused_while_the_first_waits_for_its_session_has_no_path_of_its_own(make_manager) -> None:
    """The first load is still queued (no session yet): the refusal is told without the running
    load's state (it was never queued itself)."""
    p, c = make_manager(HB), make_manager(HB)
    jobs = Jobs(c)
    keys = keys_for("kv-q", 1)
    creq = consumer_req("d-q", "kv-q", "127.0.0.1", p.port)
    c.on_new_request(creq)
    c.submit_load(job(21, keys, [10], creq))
    c.submit_load(job(22, keys, [11], creq))  # before any pass: the first waits for its session
    assert pump_until(lambda: jobs.has(22), managers=[c], jobs=[jobs])
    (refused,) = [r for r in _records("kv-q", c) if r["reason"] == "duplicate_load"]
    assert refused["path"] == [] and list(refused["marks"]) == ["result"], refused


def test_why_and_top_read_silent_endpoints_at_once_and_once_each() -> None:
    """Two endpoints that accept a connection and never answer (a stalled process): ``why`` and
    ``top`` read both at once, so the pair costs one ``--timeout``, not one each, and ask each
    nothing more after its timeout (a ZMTP port greets at once: a second connection would only
    wait again).  Checked by what the listeners saw, not by the clock: both connections open
    before either read timed out, and one connection per endpoint per read."""
    import threading

    accepted: list[list[float]] = [[], []]
    listeners, held = [], []
    stop = threading.Event()

    def serve(i: int, sock: socket.socket) -> None:
        sock.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            accepted[i].append(time.monotonic())
            held.append(conn)  # never answered, closed at the end

    threads = []
    for i in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        listeners.append(s)
        threads.append(threading.Thread(target=serve, args=(i, s), daemon=True))
        threads[-1].start()
    targets = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    timeout_s = 1.0
    try:
        res = CliRunner().invoke(cli, ["why", "--timeout", str(timeout_s), "kv-1", *targets])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        for t in targets:
            assert f"{t}: cannot read it: connected, no answer within --timeout" in res.stderr, res.stderr
        assert [len(a) for a in accepted] == [1, 1], accepted
        assert abs(accepted[0][0] - accepted[1][0]) < timeout_s, accepted  # the second did not wait for the first
        for a in accepted:
            a.clear()
        res = CliRunner().invoke(cli, ["top", *targets, "--once", "--interval", "0.05", "--timeout", str(timeout_s)],
                                 env={"COLUMNS": "200"})
        assert res.exit_code == 1, res.output  # the endpoints failed
        assert [len(a) for a in accepted] == [1, 1], accepted  # --once scrapes twice, a failed endpoint once
        assert abs(accepted[0][0] - accepted[1][0]) < timeout_s, accepted
    finally:
        stop.set()
        for t in threads:
            t.join()
        for c in held + listeners:
            c.close()
