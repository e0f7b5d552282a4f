"""Bad input: wire garbage from raw zmq sockets (a hostile consumer and a hostile producer), and
API misuse by the engine.

Wire garbage is counted in ``kvtier_wire_errors_total{reason=...}``, answered with an ``error``
message, never raises out of ``poll`` and never disturbs a legitimate peer in the same test.
"""

from __future__ import annotations

import random
import time

import msgspec
import numpy as np
import pytest
import torch
import zmq

from kvtier.api import DuplicateJob, LookupResult, RequestContext, UnknownRequest
from kvtier.config import TierConfig
from kvtier.integrity import digest
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.testing.inproc import InprocNetwork, InprocTransport
from kvtier.wire import PROTOCOL_VERSION
from kvtier.wire import messages as wm
from kvtier.wire.codec import decode, encode_frames
from mgr_helpers import (
    SENTINEL,
    Jobs,
    block_pattern,
    consumer_req,
    digests,
    fill_pattern,
    job,
    metric,
    metric_sum,
    pattern_digest,
    producer_req,
    pump_until,
    sentinel_digest,
)
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)

BB = 4096
HB = {"heartbeat_interval_s": 0.1, "peer_timeout_s": 5.0}
LIMITS = {"max_message_bytes": 4096, "max_blocks_per_fetch": 16}
pack = msgspec.msgpack.encode


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


def _hdr(**fields) -> bytes:
    return pack(fields)


FETCH_OK = dict(type="fetch", gen=1, kv_request_id="kv-x", round=0, keys=[b"a"])

#: (label, frames, expected wire error reason)
GARBAGE = [
    ("random bytes", [random.Random(7).randbytes(64)], "malformed"),
    ("empty header", [b""], "malformed"),
    ("msgpack list", [pack([1, 2, 3])], "malformed"),
    ("no type", [_hdr(gen=1)], "malformed"),
    ("unknown type", [_hdr(type="bogus", gen=1)], "unknown_type"),
    ("oversize header", [_hdr(type="ping", gen=1, t=0.0, pad="x" * 5000)], "oversize"),
    ("fetch with a payload frame", [_hdr(**FETCH_OK), b"\x00" * BB], "bad_payload"),
    ("block_data count=2, one frame",
     [_hdr(type="block_data", gen=1, kv_request_id="kv-x", round=0, first=0, count=2), b"\x00" * BB], "bad_payload"),
    ("block_data short payload",
     [_hdr(type="block_data", gen=1, kv_request_id="kv-x", round=0, first=0, count=1), b"\x00" * 100], "bad_payload"),
    ("bool for int", [_hdr(**{**FETCH_OK, "round": True})], "bad_field"),
    ("float for int", [_hdr(**{**FETCH_OK, "round": 1.5})], "bad_field"),
    ("negative int", [_hdr(**{**FETCH_OK, "round": -1})], "bad_field"),
    ("duplicate keys in fetch", [_hdr(**{**FETCH_OK, "keys": [b"a", b"b", b"a"]})], "bad_field"),
    ("bad kv_request_id", [_hdr(**{**FETCH_OK, "kv_request_id": "no spaces allowed"})], "bad_field"),
    ("missing field", [_hdr(type="fetch", gen=1, kv_request_id="kv-x", keys=[b"a"])], "bad_field"),
    ("unknown field", [_hdr(**{**FETCH_OK, "extra": 1})], "bad_field"),
    ("too many keys", [_hdr(**{**FETCH_OK, "keys": [b"k%d" % i for i in range(17)]})], "oversize"),
    ("block index out of range",
     [_hdr(type="block_data", gen=1, kv_request_id="kv-x", round=0, first=20, count=1), b"\x00" * BB], "oversize"),
    ("hello from the future",
     [_hdr(type="hello", gen=1, version=PROTOCOL_VERSION + 1, instance="x", block_bytes=BB, layout="raw",
           hash_seed="")],
     "version_mismatch"),
]


def _drain_replies(sock, into, n, *, managers, timeout_s=8.0):
    def pred():
        while True:
            try:
                into.append(sock.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return len(into) >= n

    return pump_until(pred, managers=managers, timeout_s=timeout_s)


def test_wire_garbage_to_router_is_counted_and_a_legit_consumer_is_served(make_manager, zctx):
    p = make_manager({**HB, **LIMITS}, block_bytes=BB)
    raw = zctx.socket(zmq.DEALER)
    raw.linger = 0
    raw.connect(f"tcp://{p.host}:{p.port}")
    for _, frames, _ in GARBAGE:
        raw.send_multipart(frames)
    # a well-formed message from a peer without a session is answered with disconnect
    raw.send_multipart([pack({"type": "ping", "gen": 5, "t": 1.0})])

    # error replies are rate-limited per (peer, reason) unless they name a kv_request_id, so at
    # least one reply per distinct reason, a hello_reject and the disconnect come back
    replies: list = []
    distinct = {r for _, _, r in GARBAGE if r != "version_mismatch"}
    assert _drain_replies(raw, replies, len(distinct) + 2, managers=[p]), replies
    pump_until(lambda: False, managers=[p], timeout_s=0.3)  # let any further replies arrive
    _drain_replies(raw, replies, 10**6, managers=[p], timeout_s=0.05)
    expected: dict[str, int] = {}
    for _, _, reason in GARBAGE:
        expected[reason] = expected.get(reason, 0) + 1
    for reason, n in expected.items():
        assert metric(p, "kvtier_wire_errors_total", reason=reason) == n, (reason, p.stats())
    assert metric_sum(p, "kvtier_wire_errors_total") == len(GARBAGE)
    assert metric(p, "kvtier_internal_errors_total") == 0

    decoded = [decode(f)[0] for f in replies]
    errors = [m for m in decoded if isinstance(m, wm.Error)]
    assert {e.reason for e in errors} == distinct
    assert len(errors) <= len(GARBAGE) - 1
    # a hello from another protocol version is answered as a handshake mismatch
    rejects = [m for m in decoded if isinstance(m, wm.HelloReject)]
    assert [(m.field, m.ours, m.theirs) for m in rejects] == [
        ("version", str(PROTOCOL_VERSION), str(PROTOCOL_VERSION + 1))
    ]
    assert [e.kv_request_id for e in errors if e.reason == "bad_payload"][:1] == ["kv-x"]
    assert any(isinstance(m, wm.Disconnect) and m.reason == "peer_disconnected" for m in decoded)

    # the same garbage over a legitimate session: counted, answered, the session survives
    c = make_manager({**HB, **LIMITS}, block_bytes=BB)
    c.pool.tensor.fill_(SENTINEL)
    jobs = Jobs(c)
    preq = producer_req("p1", "kv-legit")
    p.on_new_request(preq)
    stored = fill_pattern(p.pool, [0, 1, 2], seed=3)
    p.submit_store(job(1, [b"a", b"b", b"c"], [0, 1, 2], preq))
    creq = consumer_req("c1", "kv-legit", p.host, p.port)
    c.on_new_request(creq)
    assert pump_until(lambda: CoreView(c.core).session_ready(p.address), managers=[p, c])
    before = metric_sum(p, "kvtier_wire_errors_total")
    for _, frames, _ in GARBAGE[:6]:
        c.transport.send(p.address, frames)
    assert pump_until(lambda: metric_sum(p, "kvtier_wire_errors_total") == before + 6, managers=[p, c])
    # answered (rate-limited: at least once per distinct reason), counted as peer_reported_*
    n_reasons = len({r for _, _, r in GARBAGE[:6]})
    assert pump_until(lambda: metric_sum(c, "kvtier_wire_errors_total") >= n_reasons, managers=[p, c])
    assert CoreView(c.core).session_ready(p.address)

    c.submit_load(job(9, [b"a", b"b", b"c"], [7, 8, 9], creq))
    assert pump_until(lambda: jobs.has(9), managers=[p], jobs=[jobs])
    assert jobs.one(9).success
    assert digests(c.pool, [7, 8, 9]) == stored
    assert metric(p, "kvtier_internal_errors_total") == 0
    assert metric(c, "kvtier_internal_errors_total") == 0


class _FakeProducer:
    """A raw ROUTER standing in for the producer of a real consumer's load of two blocks (job 1
    into slots 4 and 5, id ``kv-h``): :meth:`recv` pumps the consumer until it sent a message of
    a kind, :meth:`send` answers with a message (and payload frames)."""

    def __init__(self, make_manager, zctx, cfg: dict) -> None:
        self.fake = zctx.socket(zmq.ROUTER)
        self.fake.linger = 0
        port = self.fake.bind_to_random_port("tcp://127.0.0.1")
        self.c = make_manager({**HB, **LIMITS, **cfg}, block_bytes=BB)
        self.c.pool.tensor.fill_(SENTINEL)
        self.jobs = Jobs(self.c)
        creq = consumer_req("c1", "kv-h", "127.0.0.1", port)
        self.c.on_new_request(creq)
        self.c.submit_load(job(1, [b"k0", b"k1"], [4, 5], creq))
        self.inbox: list = []
        self.rid, self.hello = self.recv(wm.Hello)

    def recv(self, kind):
        def pred():
            while True:
                try:
                    rid, *frames = self.fake.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.inbox.append((rid, decode(frames)[0]))
            return any(isinstance(m, kind) for _, m in self.inbox)

        assert pump_until(pred, managers=[self.c]), f"no {kind.__name__} from the consumer"
        i = next(i for i, (_, m) in enumerate(self.inbox) if isinstance(m, kind))
        return self.inbox.pop(i)

    def send(self, msg, payloads=()) -> None:
        self.fake.send_multipart([self.rid, *encode_frames(msg, payloads)])

    def send_raw(self, frames) -> None:
        self.fake.send_multipart([self.rid, *frames])


def test_hostile_producer_cannot_write_out_of_range_or_stale_blocks(make_manager, zctx):
    """A fake producer (raw ROUTER) answers the consumer's handshake and fetch, then sends
    garbage, out-of-range and duplicate block indexes, a wrong generation and a stale round,
    before the real blocks.  Only the real blocks land; the load succeeds exactly once."""
    fp = _FakeProducer(make_manager, zctx, {})
    c, jobs, recv, send, hello = fp.c, fp.jobs, fp.recv, fp.send, fp.hello
    send(wm.HelloAck(gen=hello.gen + 1, instance="fake"))  # wrong generation: ignored
    send(wm.HelloAck(gen=hello.gen, instance="fake"))
    _, fetch = recv(wm.Fetch)
    assert fetch.keys == [b"k0", b"k1"]
    g, kid, rnd = hello.gen, fetch.kv_request_id, fetch.round
    good = [block_pattern(9, i, BB) for i in range(2)]
    evil = b"\xee" * BB

    def bd(first, count, payload, *, gen=g, round=rnd):  # noqa: A002
        # honest digests: what is tested here is where blocks may land, not the digest check
        return wm.BlockData(gen=gen, kv_request_id=kid, round=round, first=first, count=count,
                            digests=[digest(payload)] * count)

    # undecodable block_data about another id (one about this load fails it at once: the test below)
    raw_frames = [
        [random.Random(1).randbytes(40)],  # malformed
        [_hdr(type="block_data", gen=g, kv_request_id="kv-other", round=rnd, first=20, count=1), evil],  # oversize
        [_hdr(type="block_data", gen=g, kv_request_id="kv-other", round=rnd, first=0, count=2), evil],  # bad_payload
        [_hdr(type="block_data", gen=g, kv_request_id="kv-other", round=rnd, first=0, count=1), evil[:10]],
        [_hdr(type="block_data", gen=g, kv_request_id="kv-other", round=rnd, first=True, count=1), evil],  # bad_field
    ]
    for frames in raw_frames:
        fp.send_raw(frames)
    send(bd(5, 1, evil), [evil])  # index past the fetch's 2 keys: valid wire, refused by the core
    send(bd(0, 1, evil, gen=g + 1), [evil])  # another generation
    send(bd(0, 1, evil, round=rnd + 1000), [evil])  # another round
    send(wm.TransferDone(gen=g, kv_request_id=kid, round=rnd + 1000, ok=False, reason="aborted"))  # stale
    send(bd(0, 1, good[0]), [good[0]])
    send(bd(0, 1, evil), [evil])  # block 0 again: must not overwrite
    send(bd(1, 1, good[1]), [good[1]])
    send(wm.TransferDone(gen=g, kv_request_id=kid, round=rnd, ok=True, reason=""))

    assert pump_until(lambda: jobs.has(1), jobs=[jobs])
    r = jobs.one(1)
    assert r.success, r
    assert digests(c.pool, [4, 5]) == [pattern_digest(9, i, BB) for i in range(2)]
    assert metric(c, "kvtier_block_landed_bytes_total") == 2 * BB
    assert metric(c, "kvtier_wire_errors_total", reason="malformed") == 1
    assert metric(c, "kvtier_wire_errors_total", reason="oversize") == 1
    assert metric(c, "kvtier_wire_errors_total", reason="bad_payload") == 2
    assert metric(c, "kvtier_wire_errors_total", reason="bad_field") == 1
    assert metric(c, "kvtier_ignored_inputs_total", machine="consumer", reason="incomplete_data") == 2
    assert metric(c, "kvtier_ignored_inputs_total", machine="session", reason="stale") == 2
    assert metric(c, "kvtier_internal_errors_total") == 0
    pump_until(lambda: False, jobs=[jobs], timeout_s=0.2)
    assert jobs.total() == 1


@pytest.mark.parametrize(("name", "payload", "count"), [("short payload", 10, 1), ("long payload", BB + 1, 1),
                                                       ("too few frames", BB, 2)])
def test_a_block_data_for_this_load_that_does_not_decode_fails_it_at_once(make_manager, zctx, name, payload, count):
    """Decision I36: a block_data about our load, from its producer on the live session, whose
    payload frames are not the blocks it names (``bad_payload``) fails the load at once as
    ``corrupt`` — not at ``load_timeout_s`` — and writes nothing; the producer gets an ``error``."""
    fp = _FakeProducer(make_manager, zctx, {"load_timeout_s": 30.0})
    fp.send(wm.HelloAck(gen=fp.hello.gen, instance="fake"))
    _, fetch = fp.recv(wm.Fetch)
    fp.send_raw([_hdr(type="block_data", gen=fp.hello.gen, kv_request_id=fetch.kv_request_id, round=fetch.round,
                      first=0, count=count), b"\xee" * payload])
    c, jobs, recv = fp.c, fp.jobs, fp.recv
    t0 = time.monotonic()
    assert pump_until(lambda: jobs.has(1), jobs=[jobs], timeout_s=5.0), name
    assert time.monotonic() - t0 < 5.0  # not load_timeout_s
    r = jobs.one(1)
    assert (r.success, r.reason) == (False, "corrupt"), r
    assert digests(c.pool, [4, 5]) == [sentinel_digest(BB)] * 2  # nothing written
    (_, err) = recv(wm.Error)
    assert (err.reason, err.kv_request_id) == ("bad_payload", fetch.kv_request_id)
    assert metric(c, "kvtier_wire_errors_total", reason="bad_payload") == 1
    assert metric(c, "kvtier_internal_errors_total") == 0


# -- API misuse (no sockets: in-memory transport) ------------------------------------------------


@pytest.fixture
def mgr():
    net = InprocNetwork()
    m = KvTierManager({}, BlockPool(8, 64, pin=False), transport=InprocTransport(net, "misuse:1"))
    try:
        yield m
    finally:
        m.shutdown()


def test_store_for_never_announced_request_raises_unknown_request(mgr):
    req = producer_req("never-announced", "kv-1")
    with pytest.raises(UnknownRequest):
        mgr.submit_store(job(1, [b"a"], [0], req))
    with pytest.raises(UnknownRequest):
        mgr.submit_load(job(2, [b"a"], [0], consumer_req("nope", "kv-1", "127.0.0.1", 9)))
    mgr.on_new_request(req)
    with pytest.raises(UnknownRequest):  # a producer request cannot load
        mgr.submit_load(job(3, [b"a"], [0], req))
    assert mgr.get_finished_jobs() == []
    assert not mgr.has_pending_work()


def test_duplicate_job_id_raises_and_leaves_the_first_job_alone(mgr):
    req = producer_req("p1", "kv-1")
    mgr.on_new_request(req)
    mgr.submit_store(job(1, [b"a"], [0], req))
    with pytest.raises(DuplicateJob):
        mgr.submit_store(job(1, [b"b"], [1], req))
    creq = consumer_req("c1", "kv-2", "127.0.0.1", 9)
    mgr.on_new_request(creq)
    with pytest.raises(DuplicateJob):  # job ids are unique across stores and loads
        mgr.submit_load(job(1, [b"c"], [2], creq))
    assert mgr.get_finished_jobs() == []
    assert mgr.jobs_in_flight() == {1}
    mgr.drain_jobs(timeout_s=5.0)
    assert [(r.job_id, r.success, r.reason) for r in mgr.get_finished_jobs()] == [(1, False, "drained")]


def test_job_id_whose_result_is_not_collected_yet_is_still_outstanding(mgr):
    # A local request's store and a refused load get their result at once; until
    # get_finished_jobs hands it over the id is outstanding, so a second submission with that id
    # is refused instead of producing two results with one job_id (review2).
    local = RequestContext(req_id="l1", kv_transfer_params=None)
    mgr.on_new_request(local)
    mgr.submit_store(job(100, [b"a"], [0], local))
    with pytest.raises(DuplicateJob, match="100"):
        mgr.submit_store(job(100, [b"b"], [1], local))
    creq = consumer_req("c1", "kv-2", "127.0.0.1", 9)
    mgr.on_new_request(creq)
    with pytest.raises(DuplicateJob, match="100"):
        mgr.submit_load(job(100, [b"c"], [2], creq))
    assert [(r.job_id, r.success) for r in mgr.get_finished_jobs()] == [(100, True)]
    mgr.submit_store(job(100, [b"d"], [3], local))  # handed over: the id is free again
    assert [(r.job_id, r.success) for r in mgr.get_finished_jobs()] == [(100, True)]


def test_lookup_misses_once_shutdown_began(mgr):
    creq = consumer_req("c1", "kv-2", "127.0.0.1", 9)
    mgr.on_new_request(creq)
    assert mgr.lookup(b"a", creq) is LookupResult.HIT
    mgr.shutdown(grace_s=0.05)
    assert mgr.lookup(b"a", creq) is LookupResult.MISS  # a load submitted now would raise
    with pytest.raises(RuntimeError, match="shut down"):
        mgr.submit_load(job(1, [b"a"], [0], creq))


@pytest.mark.parametrize("slot", [8, 1000, -1, True, False, 1.0, "1", None])
def test_slot_outside_pool_or_not_an_int_raises_value_error(mgr, slot):
    req = producer_req("p1", "kv-1")
    mgr.on_new_request(req)
    with pytest.raises(ValueError, match="slot"):
        mgr.submit_store(job(1, [b"a"], [slot], req))
    creq = consumer_req("c1", "kv-2", "127.0.0.1", 9)
    mgr.on_new_request(creq)
    with pytest.raises(ValueError, match="slot"):
        mgr.submit_load(job(2, [b"a"], [slot], creq))
    # nothing was registered: the same job ids are still free
    mgr.submit_store(job(1, [b"a"], [0], req))
    assert mgr.jobs_in_flight() == {1}


@pytest.mark.parametrize(
    ("keys", "slots", "match"),
    [
        ([b"a", b"b"], [0], "2 keys but 1 slots"),
        ([b"a", b"a"], [0, 1], "duplicate keys"),
        ([b""], [0], "keys must be"),
        ([b"x" * 257], [0], "keys must be"),
        (["text"], [0], "keys must be"),
        # element types are checked first, named with their fix (a set of unhashable values would
        # otherwise raise a bare "unhashable type"; a numpy slot was reported "outside the pool")
        (["text"], [0], r"key 'text' is a str; keys must be 1\.\.256 bytes \(pass key\.encode\(\)\)"),
        ([bytearray(b"a")], [0], r"is a bytearray; .*\(pass bytes\(key\)\)"),
        ([b"a"], [[0]], r"job 1: slot \[0\] is a list, not an int slot number"),
        ([b"a", b"b"], [np.int64(0), 1], r"job 1: slot np\.int64\(0\) is a numpy\.int64, not an int slot number \(pass int\(slot\)\)"),
        ([b"a"], [torch.tensor(0)], r"is a torch\.Tensor, not an int slot number \(pass int\(slot\)\)"),
        ([b"a", b"b"], [1, True], "slot True is a bool, not an int slot number"),
    ],
)
def test_bad_keys_raise_value_error(mgr, keys, slots, match):
    req = producer_req("p1", "kv-1")
    mgr.on_new_request(req)
    with pytest.raises(ValueError, match=match):
        mgr.submit_store(job(1, keys, slots, req))


def _pref(**over):
    base = {"kv_request_id": "kv-1", "remote_host": "127.0.0.1", "remote_port": 5555}
    base.update(over)
    return {"remote_prefiller": base}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ([("remote_decoder", {"kv_request_id": "k"})], "kv_transfer_params"),
        ("remote_decoder", "kv_transfer_params"),
        ({"remote_prefiller": "127.0.0.1:5555"}, "remote_prefiller"),
        ({"remote_decoder": ["kv-1"]}, "remote_decoder"),
        (_pref(remote_port=0), "remote_port"),
        (_pref(remote_port=65536), "remote_port"),
        (_pref(remote_port=-5), "remote_port"),
        (_pref(remote_port="55x5"), "remote_port"),
        (_pref(remote_port="70000"), "remote_port"),
        (_pref(remote_port=True), "remote_port"),
        (_pref(remote_port=5555.0), "remote_port"),
        (_pref(remote_port=None), "remote_port"),
        (_pref(remote_host=""), "remote_host"),
        (_pref(remote_host=None), "remote_host"),
        (_pref(remote_host=b"127.0.0.1"), "remote_host"),
        (_pref(kv_request_id="has space"), "kv_request_id"),
        (_pref(kv_request_id="naïve"), "kv_request_id"),
        (_pref(kv_request_id=""), "kv_request_id"),
        (_pref(kv_request_id="x" * 257), "kv_request_id"),
        (_pref(kv_request_id=42), "kv_request_id"),
        ({"remote_decoder": {"kv_request_id": "a\nb"}}, "kv_request_id"),
        ({"remote_decoder": {}}, "kv_request_id"),
    ],
)
def test_malformed_kv_transfer_params_raise_value_error_naming_the_field(mgr, params, field):
    req = RequestContext(req_id="r1", kv_transfer_params=params)
    with pytest.raises(ValueError, match=field):
        mgr.on_new_request(req)
    with pytest.raises(UnknownRequest):  # the bad request was not registered
        mgr.submit_store(job(1, [b"a"], [0], req))
    assert CoreView(mgr.core).sessions() == []  # and nothing was dialled


def test_request_announced_twice_with_different_params_raises(mgr):
    mgr.on_new_request(producer_req("r1", "kv-1"))
    assert mgr.on_new_request(producer_req("r1", "kv-1")) == "producer"  # same params: idempotent
    with pytest.raises(ValueError, match="announced twice"):
        mgr.on_new_request(producer_req("r1", "kv-2"))


def test_config_typo_raises_value_error_with_did_you_mean():
    pool = BlockPool(4, 64, pin=False)
    with pytest.raises(ValueError, match=r"did you mean 'unbound_store_timeout_s'"):
        KvTierManager({"unbound_store_timout_s": 5}, pool, transport=InprocTransport(InprocNetwork(), "cfg:1"))
    with pytest.raises(ValueError, match="unbound_store_timeout_s"):
        KvTierManager({"unbound_store_timeout_s": True}, pool, transport=InprocTransport(InprocNetwork(), "cfg:2"))


def test_supply_timeout_not_shorter_than_load_timeout_is_refused():
    """The cross-field rule that makes a producer's supply_timeout answer reach the consumer
    before its own load deadline fires."""
    with pytest.raises(ValueError, match="fetch_supply_timeout_s") as exc:
        TierConfig.from_dict({"load_timeout_s": 5.0, "fetch_supply_timeout_s": 5.0})
    assert "load_timeout_s" in str(exc.value)


def test_wrong_types_in_api_calls_raise_type_error_naming_the_argument(mgr):
    """The engine passes None, a generator or a foreign object: a TypeError that names the
    argument, never an AttributeError from inside the manager; nothing is registered."""
    from kvtier.api import TransferJob

    with pytest.raises(TypeError, match="on_new_request: req must be a kvtier.api.RequestContext, got NoneType"):
        mgr.on_new_request(None)
    with pytest.raises(TypeError, match="lookup: req must be"):
        mgr.lookup(b"a", {"req_id": "r1"})
    with pytest.raises(TypeError, match="on_request_finished: req must be"):
        mgr.on_request_finished("r1")
    req = producer_req("p1", "kv-1")
    mgr.on_new_request(req)
    with pytest.raises(TypeError, match="expected a kvtier.api.TransferJob, got dict"):
        mgr.submit_store({"job_id": 1, "keys": (b"a",), "slots": (0,), "req": req})
    with pytest.raises(TypeError, match="job 1: req must be a RequestContext, got NoneType"):
        mgr.submit_store(TransferJob(job_id=1, keys=(b"a",), slots=(0,), req=None))
    with pytest.raises(TypeError, match="job 1: keys must be a tuple or list, got NoneType"):
        mgr.submit_store(TransferJob(job_id=1, keys=None, slots=(0,), req=req))
    with pytest.raises(TypeError, match="job 1: slots must be a tuple or list, got generator"):
        mgr.submit_store(TransferJob(job_id=1, keys=(b"a",), slots=(s for s in [0]), req=req))
    mgr.submit_store(job(1, [b"a"], [0], req))  # job 1 was never registered by the refusals
    assert mgr.jobs_in_flight() == {1}


def test_manager_without_a_block_pool_raises_type_error():
    with pytest.raises(TypeError, match="pool must be a kvtier.memory.BlockPool, got NoneType"):
        KvTierManager({}, None, transport=InprocTransport(InprocNetwork(), "nopool:1"))


def test_key_files_without_curve_are_refused_not_ignored():
    """Fail closed: an operator who set key files but forgot auth='curve' would otherwise run
    unauthenticated believing the opposite."""
    with pytest.raises(ValueError, match="auth_secret_key_file set but auth='none'"):
        TierConfig.from_dict({"auth_secret_key_file": "/etc/kvtier/me.key_secret"})
    with pytest.raises(ValueError, match="auth_secret_key_file and auth_allowed_keys_dir set but auth='none'"):
        TierConfig.from_dict({"auth_secret_key_file": "/k", "auth_allowed_keys_dir": "/d", "auth": "none"})


def test_engine_job_ids_cannot_reach_the_managers_own(mgr):
    """Decision A5: ids from 2**62 up are the manager's own jobs (``load_nothing``); an engine id
    there is refused at the call, naming ``job_id`` — it once collided with one and lost its
    result.  The largest engine id is accepted and gets its one result."""
    req = producer_req("p-ids", "kv-ids")
    mgr.on_new_request(req)
    for bad in (2**62, 2**62 + 1, 2**70, -1, True, 1.0):
        with pytest.raises(ValueError, match="job_id must be an int from 0 to 2\\*\\*62 - 1"):
            mgr.submit_store(job(bad, [b"a"], [0], req))
        with pytest.raises(ValueError, match="job_id"):
            mgr.finish_job(bad, store=True, success=True)
    mgr.submit_store(job(2**62 - 1, [b"a"], [0], req))
    mgr.drain_jobs(timeout_s=5.0)
    assert [(r.job_id, r.reason) for r in mgr.get_finished_jobs()] == [(2**62 - 1, "drained")]


@pytest.mark.parametrize("call", ["drain_jobs", "poll", "shutdown"])
@pytest.mark.parametrize("bad", ["x", -1, float("nan"), float("inf"), True, None, 10**400, np.int64(-1)])
def test_timeouts_of_api_calls_are_checked_and_named(mgr, call, bad):
    """``drain_jobs(timeout_s)``, ``poll(timeout_s)`` and ``shutdown(grace_s)`` refuse anything but
    a finite number of seconds ≥ 0 with a ``ValueError`` naming the argument (None keeps its
    meaning where it has one: no drain budget, the configured grace)."""
    name = "grace_s" if call == "shutdown" else "timeout_s"
    if bad is None and call != "poll":
        getattr(mgr, call)(bad)  # the default
        return
    with pytest.raises(ValueError, match=f"{name} must be a finite number of seconds >= 0"):
        getattr(mgr, call)(bad)
    mgr.poll(0)  # the manager still works


def test_a_missing_kv_request_id_is_named_missing(mgr):
    for role in ("remote_decoder", "remote_prefiller"):
        params = {role: {"remote_host": "127.0.0.1", "remote_port": 9}} if role == "remote_prefiller" else {role: {}}
        with pytest.raises(ValueError, match=f"{role}.kv_request_id is missing"):
            mgr.on_new_request(RequestContext(req_id=f"r-{role}", kv_transfer_params=params))


@pytest.mark.parametrize("req_id", [123, None, "", b"r1"])
def test_a_request_id_that_is_not_a_string_is_refused_by_name(mgr, req_id):
    with pytest.raises(TypeError, match="req.req_id must be a non-empty str"):
        mgr.on_new_request(RequestContext(req_id=req_id, kv_transfer_params=None))  # type: ignore[arg-type]
    mgr.on_new_request(RequestContext(req_id="fine", kv_transfer_params=None))  # the manager still works


@pytest.mark.parametrize("key", [["unhashable"], "text", b"", b"x" * 257, 7])
def test_a_consumer_lookup_names_a_bad_key_before_and_after_its_load(mgr, key):
    """A key that is not 1..256 bytes is a ValueError naming it, whether or not a load of the id
    was submitted (it was HIT before one, and an unhashable one a TypeError after one)."""
    creq = consumer_req("c-bad-key", "kv-bad-key", "127.0.0.1", 9)
    mgr.on_new_request(creq)
    with pytest.raises(ValueError, match="key must be 1..256 bytes"):
        mgr.lookup(key, creq)
    mgr.submit_load(job(901, [b"k0"], [5], creq))
    with pytest.raises(ValueError, match="key must be 1..256 bytes"):
        mgr.lookup(key, creq)
