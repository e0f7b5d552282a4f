"""Live fuzzing: raw zmq sockets flood a producer with garbage of every kind
while a legitimate consumer keeps completing byte-exact transfers from it.

The producer runs in its own process (tests.support.peer_process) so that its memory can be
measured alone. Pass: the producer never raises (internal errors 0) and stays alive, the
consumer's session is never lost and every load it makes succeeds byte-exact, and the producer's
RSS grows by less than a generous bound. Bounded: ``FLOOD_S`` of flood, under 30 s in all.
"""

from __future__ import annotations

import random
import threading
import time

import msgspec
import psutil
import pytest
import zmq

from kvtier.wire import PROTOCOL_VERSION
from tests.support.peer_process import PeerProcess, pattern_digest
from mgr_helpers import Jobs, consumer_req, digests, job, metric, metric_sum, pump_until

pytestmark = pytest.mark.timeout(120)

FLOOD_S = 8.0
BB = 16 * 1024
MAX_MSG = 64 * 1024
RSS_BOUND = 256 << 20  # bytes of growth allowed (generous: allocator caches, zmq buffers)
pack = msgspec.msgpack.encode


def _garbage(rng: random.Random, kv: str) -> list[list[bytes]]:
    """One batch of hostile messages, one or more of every kind."""
    gen = rng.getrandbits(62)
    deep: object = 1
    for _ in range(200):
        deep = [deep]
    hello = {"type": "hello", "gen": gen, "version": PROTOCOL_VERSION, "instance": "fz", "block_bytes": BB, "layout": "raw",
             "hash_seed": ""}
    return [
        [rng.randbytes(rng.randrange(1, 2048))],  # random bytes
        [pack({"type": "fetch", "gen": gen, "kv_request_id": kv, "round": 0, "keys": [b"k"]})[: rng.randrange(1, 20)]],
        [pack({"type": "ping", "gen": gen, "t": 0.0, "pad": "x" * (MAX_MSG + 10)})],  # oversize, under the socket cap
        [rng.randbytes(MAX_MSG * 3)],  # over the socket cap: the connection is cut
        [pack({"type": "fetch", "gen": "1", "kv_request_id": 5, "round": 1.5, "keys": "no"})],  # wrong types
        [pack({"type": rng.choice(["bogus", "", "x" * 300]), "gen": gen})],  # unknown types
        [pack({**hello, "version": rng.choice([0, 2, 99, "1"])})],  # wrong versions
        [pack({"type": "fetch", "gen": rng.getrandbits(62), "kv_request_id": kv, "round": 0, "keys": []})],  # wrong gen
        [pack({"type": "abort_fetch", "gen": gen, "kv_request_id": kv, "round": 0})],  # before hello
        [pack({"type": "block_data", "gen": gen, "kv_request_id": kv, "round": 0, "first": 2**62, "count": 1}),
         b"\x00" * BB],  # out-of-range index
        [pack({"type": "ping", "gen": gen, "t": 0.0, "deep": deep})],  # deep nesting
        [pack(hello)], [pack(hello)],  # duplicate hellos
        [pack({"type": "error", "gen": gen, "reason": f"r{rng.random()}", "detail": "d", "kv_request_id": ""})],
        [b""], [pack([1, 2, 3])], [pack({"type": "fetch"}), b"extra", b"frames"],
    ]


def _flood(address: str, seed: int, stop: threading.Event, sent: list[int]) -> None:
    rng = random.Random(seed)
    ctx = zmq.Context()
    try:
        while not stop.is_set():
            d = ctx.socket(zmq.DEALER)  # a fresh identity every round: new "peers" all the time
            d.linger = 0
            d.sndhwm = 100
            d.connect(f"tcp://{address}")
            for frames in _garbage(rng, "kv-live-0"):
                try:
                    d.send_multipart(frames, zmq.NOBLOCK)
                    sent[0] += 1
                except zmq.Again:
                    break
            time.sleep(0.01)
            while d.poll(0):  # read what the producer answers, as a peer would
                d.recv_multipart()
            d.close(linger=0)
    finally:
        ctx.destroy(linger=0)


def test_live_fuzz_while_a_consumer_is_served(make_manager) -> None:
    cfg = {"heartbeat_interval_s": 0.2, "peer_timeout_s": 5.0, "max_message_bytes": MAX_MSG, "max_peers": 4096}
    with PeerProcess("kvt-fuzz-producer", max_lifetime_s=120) as p:
        p.start_manager(cfg, num_blocks=256, block_bytes=BB)
        c = make_manager(cfg, num_blocks=64, block_bytes=BB)
        jobs = Jobs(c)
        proc = psutil.Process(p.pid)

        def one_transfer(i: int) -> None:
            kv, n = f"kv-live-{i}", 8
            keys = [f"{kv}/{k}".encode() for k in range(n)]
            p.store(kv, 1000 + i, keys, list(range(n * (i % 16), n * (i % 16) + n)), seed=i)
            creq = consumer_req(f"c-{i}", kv, p.host, p.port)
            c.on_new_request(creq)
            slots = list(range(n * (i % 4), n * (i % 4) + n))
            c.submit_load(job(2000 + i, keys, slots, creq))
            assert pump_until(lambda: jobs.has(2000 + i), managers=[c], jobs=[jobs], timeout_s=20.0), i
            r = jobs.one(2000 + i)
            assert r.success, (i, r)
            assert digests(c.pool, slots) == [pattern_digest(i, k, BB) for k in range(n)], i
            c.on_request_finished(creq)
            p.finish(f"p-{kv}")

        for i in range(3):  # warm-up: session up, allocator and zmq buffers at steady state
            one_transfer(i)
        i, t0 = 3, time.monotonic()  # a short quiet phase: the rate without flood, for the log
        while time.monotonic() - t0 < 2.0:
            one_transfer(i)
            i += 1
        quiet_rate = (i - 3) / (time.monotonic() - t0)
        rss0 = proc.memory_info().rss
        stop, sent = threading.Event(), [0]
        flooders = [threading.Thread(target=_flood, args=(p.address, s, stop, sent), daemon=True) for s in range(3)]
        for t in flooders:
            t.start()
        done, end = 0, time.monotonic() + FLOOD_S
        try:
            while time.monotonic() < end:
                one_transfer(i)
                i += 1
                done += 1
        finally:
            stop.set()
            for t in flooders:
                t.join(10)
        rss1 = proc.memory_info().rss
        stats = p.stats()
        assert p.alive
        assert metric(stats, "kvtier_internal_errors_total") == 0
        assert metric_sum(stats, "kvtier_wire_errors_total") > 100, stats  # the flood did arrive
        assert sent[0] > 1000
        assert done >= 3  # the legitimate consumer kept being served meanwhile
        assert metric_sum(c, "kvtier_peer_down_total") == 0, c.stats()  # its session never died
        assert rss1 - rss0 < RSS_BOUND, (rss0, rss1)
        print(f"live fuzz: {sent[0]} hostile messages, {done} byte-exact loads "
              f"({done / FLOOD_S:.0f}/s under flood, {quiet_rate:.0f}/s quiet), "
              f"producer RSS {rss0 >> 20} -> {rss1 >> 20} MiB, wire errors {metric_sum(stats, 'kvtier_wire_errors_total'):.0f}")
