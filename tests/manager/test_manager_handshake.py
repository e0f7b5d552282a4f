"""Handshake mismatch over real sockets: the consumer's load fails promptly, both sides log the
field and both values, and the session never carries data."""

from __future__ import annotations

import logging

import pytest

from kvtier.api import LookupResult
from mgr_helpers import SENTINEL, Jobs, consumer_req, digests, job, metric, producer_req, pump_until, sentinel_digest

pytestmark = pytest.mark.timeout(60)

HB = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 2.0}


@pytest.mark.parametrize(
    ("field", "p_kw", "c_kw", "p_value", "c_value"),
    [
        ("block_bytes", {"block_bytes": 4096}, {"block_bytes": 8192}, "4096", "8192"),
        ("hash_seed", {"config": {"hash_seed": "seed-prefill"}}, {"config": {"hash_seed": "seed-decode"}},
         "seed-prefill", "seed-decode"),
        ("layout", {"layout": "raw"}, {"layout": "bf16[32,2,8,16,128]"}, "raw", "bf16[32,2,8,16,128]"),
        # the block digest: a consumer that would check nothing (or another hash) never gets blocks
        ("digest", {"config": {"integrity": "xxh3_64"}}, {"config": {"integrity": "none"}}, "xxh3_64", "none"),
    ],
)
def test_handshake_mismatch_fails_load_promptly_and_logs_both_values(
    make_manager, caplog, field, p_kw, c_kw, p_value, c_value
):
    # B37: a layout, block-size, hash-seed or digest mismatch is refused in the handshake, nothing moves
    caplog.set_level(logging.ERROR, logger="kvtier.manager")
    p_kw, c_kw = dict(p_kw), dict(c_kw)
    p = make_manager({**HB, **p_kw.pop("config", {})}, **p_kw)
    # a long load timeout: the failure must come from the handshake, not from the deadline
    c = make_manager({**HB, **c_kw.pop("config", {}), "load_timeout_s": 60.0}, **c_kw)
    c.pool.tensor.fill_(SENTINEL)
    jobs, pjobs = Jobs(c), Jobs(p)

    preq = producer_req("p1", "kv-hs")
    p.on_new_request(preq)
    p.submit_store(job(1, [b"k0", b"k1"], [0, 1], preq))
    creq = consumer_req("c1", "kv-hs", p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, [b"k0", b"k1"], [4, 5], creq))

    assert pump_until(lambda: jobs.has(2), managers=[p], jobs=[jobs, pjobs], timeout_s=8.0)
    r = jobs.one(2)
    # The session dies with handshake_mismatch and every load bound to the peer fails with it.
    assert (r.success, r.reason) == (False, "handshake_mismatch")
    assert metric(c, "kvtier_session_ends_total", reason="handshake_mismatch") == 1
    assert c.lookup(b"k0", creq) is LookupResult.MISS
    assert metric(c, "kvtier_block_landed_bytes_total") == 0
    assert metric(p, "kvtier_block_sent_bytes_total") == 0
    assert digests(c.pool, [4, 5]) == [sentinel_digest(c.pool.block_bytes)] * 2
    assert not pjobs.has(1)  # the producer still parks its blocks for a compatible consumer

    # both sides name the field and both values, each from its own point of view
    p_lines = [r.getMessage() for r in caplog.records if "rejecting hello" in r.getMessage()]
    c_lines = [r.getMessage() for r in caplog.records if "rejected our hello" in r.getMessage()]
    assert p_lines and c_lines, caplog.text
    if field == "hash_seed":
        # the refusal names the field, and no log on either side shows either seed
        assert f"{field} differs (ours (withheld), theirs (not shown))" in p_lines[0]
        assert f"{field} differs (ours (not shown), theirs (withheld))" in c_lines[0]
        assert p_value not in caplog.text and c_value not in caplog.text
    else:
        assert f"{field} differs (ours {p_value}, theirs {c_value})" in p_lines[0]
        assert f"{field} differs (ours {c_value}, theirs {p_value})" in c_lines[0]

    pump_until(lambda: False, managers=[p], jobs=[jobs, pjobs], timeout_s=0.2)
    assert jobs.total() == 1


def test_a_layout_mismatch_names_the_words_that_differ_first() -> None:
    """Two fingerprints of some 250 characters side by side are not for comparing by eye (an outside
    tester): the words that differ come first, the whole fingerprints after."""
    from kvtier.advice import differs

    ours = "vllm-offload/2 row_bytes=8192 tokens_per_hash=16 kv_layout=NHD model=m"
    theirs = "vllm-offload/2 row_bytes=8192 tokens_per_hash=32 kv_layout=NHD model=m"
    assert differs("layout", ours, theirs) == (
        f"layout differs in tokens_per_hash: ours 16, theirs 32 (whole: ours {ours}, theirs {theirs})")
    short = ours.replace(" model=m", "")
    assert differs("layout", ours, short).startswith("layout differs in model: ours m, theirs (none)")
    old = "vllm-offload/1 row_bytes=8192 model=m"  # another fingerprint version: shown whole
    assert differs("layout", ours, old) == f"layout differs (ours {ours}, theirs {old})"
    assert differs("hash_seed", "(withheld)", "(not shown)") == (
        "hash_seed differs (ours (withheld), theirs (not shown))")
