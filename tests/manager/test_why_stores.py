"""``kvtier why`` tells a store refused at submission apart from the blocks parked under its id, and
ends the story of a request whose engine needed none of its producer's blocks (decision E11).

Each case happens for real (real sockets), then is read back the way an operator reads it: the
CLI against the endpoint's ``/kvtier/requests``.  Waits are bounded poll loops.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from mgr_helpers import Jobs, consumer_req, job, keys_for, producer_req, pump_until

from kvtier.cli import cli

pytestmark = pytest.mark.timeout(90)

HB = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 5.0, "metrics_port": 0}


def _records(kid: str, mgr) -> tuple[list[dict], int, str]:
    """The finished entries of ``kid``, the endpoint's count of requests in progress, and the story."""
    res = CliRunner().invoke(cli, ["why", "--json", kid, mgr.metrics_address])
    doc = json.loads(res.stdout)[mgr.metrics_address]
    text = CliRunner().invoke(cli, ["why", kid, mgr.metrics_address]).stdout
    return doc["requests"], doc["in_progress"], text


def test_a_store_refused_id_in_use_is_its_own_entry_and_adds_nothing_to_the_parked_record(make_manager) -> None:
    p, c = make_manager(HB), make_manager(HB)
    pjobs, cjobs = Jobs(p), Jobs(c)
    first, second = producer_req("p1", "kv-dup"), producer_req("p2", "kv-dup")
    p.on_new_request(first)
    p.submit_store(job(1, keys_for("kv-dup", 1), [0], first))
    p.on_new_request(second)  # another engine request reusing a live id: its store is refused
    p.submit_store(job(2, keys_for("kv-dup-other", 3), [1, 2, 3], second))
    assert pump_until(lambda: pjobs.has(2), managers=[p], jobs=[pjobs])
    assert not pjobs.one(2).success and pjobs.one(2).reason == "id_in_use"
    p.on_request_finished(first)
    p.on_request_finished(second)
    creq = consumer_req("c1", "kv-dup", p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(7, keys_for("kv-dup", 1), [5], creq))
    assert pump_until(lambda: cjobs.has(7) and pjobs.has(1), managers=[p, c], jobs=[pjobs, cjobs])
    assert cjobs.one(7).success and pjobs.one(1).success
    recs, _, text = _records("kv-dup", p)
    served = [r for r in recs if r["ok"]]
    refused = [r for r in recs if not r["ok"]]
    assert [(r["blocks"], r["nbytes"]) for r in served] == [(1, 4096)], recs  # the one block parked, not four
    assert [(r["reason"], r["path"], r["blocks"]) for r in refused] == [("id_in_use", ["refused"], 0)], recs
    assert "FAILED: id_in_use" in text and "none parked: this store was refused" in text, text


def test_a_store_refused_on_a_tombstone_claims_no_parked_blocks(make_manager) -> None:
    p = make_manager({**HB, "unbound_store_timeout_s": 0.2})
    pjobs = Jobs(p)
    r1 = producer_req("p1", "kv-x")
    p.on_new_request(r1)
    p.submit_store(job(1, keys_for("kv-x", 2), [0, 1], r1))
    assert pump_until(lambda: pjobs.has(1), managers=[p], jobs=[pjobs])  # reaped: tombstoned
    r2 = producer_req("p2", "kv-x")  # the same prefill's later chunk, after the reap (B03)
    p.on_new_request(r2)
    p.submit_store(job(2, keys_for("kv-x-late", 3), [2, 3, 4], r2))
    assert pump_until(lambda: pjobs.has(2), managers=[p], jobs=[pjobs])
    assert (pjobs.one(2).success, pjobs.one(2).reason) == (False, "reaped")
    recs, _, text = _records("kv-x", p)
    by_path = sorted((r["path"], r["blocks"], r["reason"]) for r in recs)
    assert by_path == [(["refused"], 0, "reaped"), (["tombstoned"], 2, "reaped")], recs
    assert "3 parked" not in text, text


def test_a_request_that_needed_no_blocks_ends_its_story(make_manager) -> None:
    p, c = make_manager(HB), make_manager({**HB, "load_timeout_s": 30.0})
    pjobs = Jobs(p)
    preq = producer_req("p1", "kv-none")
    p.on_new_request(preq)
    p.submit_store(job(1, keys_for("kv-none", 2), [0, 1], preq))
    p.on_request_finished(preq)
    creq = consumer_req("c1", "kv-none", p.host, p.port)
    c.on_new_request(creq)
    assert c.load_nothing(creq) is True  # a local prefix hit: the producer releases its blocks now
    assert pump_until(lambda: pjobs.has(1), managers=[p, c], jobs=[pjobs])
    assert pump_until(lambda: _records("kv-none", c)[1] == 0 and _records("kv-none", c)[0], managers=[p, c])
    recs, in_progress, text = _records("kv-none", c)
    assert in_progress == 0 and [(r["role"], r["ok"]) for r in recs] == [("consumer", True)], recs
    assert "IN PROGRESS" not in text, text
    c.on_request_finished(creq)


def test_a_load_of_nothing_after_the_requests_own_dial_failed_tells_why_it_failed(make_manager) -> None:
    """The request's dial was refused (nothing listens there), then the engine needs none of its
    blocks: the manager's own empty load ends with the dial's reason, not ``job_refused``."""
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = make_manager(HB)
    creq = consumer_req("c1", "kv-nobody", "127.0.0.1", port)
    c.on_new_request(creq)  # dials, refused
    assert pump_until(lambda: c.core.consumer_state("kv-nobody").value == "failed", managers=[c])
    c.load_nothing(creq)
    assert pump_until(lambda: _records("kv-nobody", c)[0], managers=[c])
    recs, in_progress, text = _records("kv-nobody", c)
    assert in_progress == 0 and [(r["ok"], r["reason"]) for r in recs] == [(False, "connect_refused")], recs
    assert "job_refused" not in text, text
    c.on_request_finished(creq)
