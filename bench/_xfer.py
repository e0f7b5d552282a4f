"""Child-process sides of the cross-process benchmarks (P1 throughput, P2 vs copy_, P3 late fetch).

Each child owns one :class:`~kvtier.manager.KvTierManager` (real ZeroMQ on 127.0.0.1) *and* one
raw pyzmq socket of the same type (producer: ROUTER, consumer: DEALER), so kvtier and the raw
baseline run between the same two processes, over the same loopback, into the same pool memory.

Each child can hold up to three managers over the same pool: ``zmq`` (the plain pair), ``curve``
(CURVE on) and ``nixl`` (``data_plane="nixl"``: one-sided WRITEs through NIXL/UCX, CMA on this
host), so every plane moves the same bytes between the same two processes in the same run.

* The **producer** parks blocks (``submit_store``) on command; its manager runs with
  ``background_poll=True`` (the demo's configuration), so fetches are served by the manager's own
  poll thread.  Its main thread serves the raw ROUTER: a ``stream`` request is answered with the
  requested blocks, grouped into multipart messages exactly as kvtier groups them
  (``MAX_BATCH_BYTES`` per message), sent zero-copy from the same pool slots; an ``rtt``
  request is answered with one small reply.
* The **consumer** times everything: kvtier loads (``submit_load`` → successful ``JobResult``),
  raw streams (request → last frame landed with ``recv_into`` in the same pool slots: the same
  landing memcpy kvtier performs), per-block torch ``copy_`` of the same bytes, and late-fetch
  rejections interleaved with raw round trips.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from typing import Any

KIND_STREAM = 1
KIND_RTT = 2
_HDR = struct.Struct("<BII")  # kind, nblocks, blocks per message
RTT_PAD = 96  # bytes of the raw RTT request (a kvtier fetch header with a few keys is ~100-200 B)
RTT_REPLY = b"r" * 64  # a transfer_done header is ~70 B
IDLE_POLL_S = 0.05  # how often the managers not being measured are polled (heartbeats need it)


def _pattern(block_bytes: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(block_bytes)
    return torch.randint(0, 256, (block_bytes,), dtype=torch.uint8, generator=g)


def _xor(i: int) -> int:
    return (i * 37 + 1) & 255 or 1


def _keys(n: int) -> tuple[bytes, ...]:
    return tuple(b"k%015d" % i for i in range(n))


def _quiet_logs() -> None:
    import logging

    logging.getLogger("kvtier").setLevel(logging.WARNING)


class Producer:
    def __init__(self) -> None:
        import torch
        import zmq

        torch.set_num_threads(1)
        _quiet_logs()
        self.mgrs: dict[str, Any] = {}
        self.pool: Any = None
        self.bufs: list[memoryview] = []
        self._jobs = itertools.count(1)
        self.finished = 0
        self.ctx = zmq.Context(1)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.SNDHWM, 1000)
        self.router.setsockopt(zmq.RCVHWM, 1000)
        self.router.bind("tcp://127.0.0.1:*")
        self.raw_port = int(self.router.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2])
        self.floor: Any = None

    def hello(self) -> dict[str, Any]:
        return {"raw_port": self.raw_port, "pid": os.getpid()}

    def op_floor(self) -> int:
        """Start P3's Python floor server (:mod:`bench.floor`) once; its port.  Every id parked
        from then on is one of its tombstones."""
        if self.floor is None:
            from bench.floor import FloorServer

            self.floor = FloorServer(self.ctx)
        return int(self.floor.port)

    def op_setup(self, block_bytes: int, num_blocks: int, configs: dict[str, dict[str, Any]]) -> dict[str, str]:
        """One manager per entry of ``configs`` (``zmq``, and optionally ``curve``, ``nixl``),
        all over one pool, so P1 compares them in the same run on the same bytes.  Returns each
        one's address."""
        from kvtier.manager import KvTierManager
        from kvtier.memory import BlockPool

        self._shutdown()
        self.pool = BlockPool(num_blocks, block_bytes)
        base = _pattern(block_bytes)
        for i in range(num_blocks):
            v = self.pool.view(i)
            v.copy_(base)
            v.bitwise_xor_(_xor(i))
        self.bufs = [self.pool.buffer(i) for i in range(num_blocks)]
        for name, config in configs.items():
            self.mgrs[name] = KvTierManager(config, self.pool, layout="kvtier-bench")
        return {name: m.address for name, m in self.mgrs.items()}

    @property
    def mgr(self) -> Any:
        return self.mgrs["zmq"]

    def op_park(self, prefix: str, count: int, nblocks: int, pair: str = "zmq") -> list[str]:
        """Park ``count`` fresh ids of ``nblocks`` blocks (slots 0..nblocks-1, keys k0..), on the
        manager ``pair``."""
        from kvtier.api import RequestContext, TransferJob

        self._collect()
        mgr = self.mgrs[pair]
        keys = _keys(nblocks)
        slots = tuple(range(nblocks))
        ids = []
        for j in range(count):
            kid = f"{prefix}-{j}"
            req = RequestContext(req_id="P" + kid, kv_transfer_params={"remote_decoder": {"kv_request_id": kid}})
            mgr.on_new_request(req)
            mgr.submit_store(TransferJob(job_id=next(self._jobs), keys=keys, slots=slots, req=req))
            mgr.on_request_finished(req)
            if self.floor is not None:
                self.floor.tombstones[kid] = "reaped"  # what P3's floor answers a late fetch of it
            ids.append(kid)
        # a large store's digests are taken on the manager's digest pool: let them end here, not
        # during the measurement that follows (parking is not what is measured)
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            with mgr.lock:
                if all(mgr.core.producer_state(k).value != "absent" for k in ids):  # O(1) each
                    break
            self._collect()  # as an engine polls: wakes the loop for stores no fetch awaits (C34)
            time.sleep(0.001)
        return ids

    def op_states(self, ids: list[str], pair: str = "zmq") -> list[str]:
        mgr = self.mgrs[pair]
        with mgr.lock:  # the poll thread may be applying inputs
            return [mgr.core.producer_state(k).value for k in ids]

    def op_stats(self) -> dict[str, Any]:
        self._collect()
        return {"finished_jobs": self.finished, "records": self.mgr.core.producer_count()}

    def _collect(self) -> None:
        for mgr in self.mgrs.values():
            self.finished += len(mgr.get_finished_jobs())

    def op_digest_rate(self, nblocks: int, algorithm: str = "xxh3_64", min_s: float = 0.05) -> dict[str, Any]:
        """What the store path pays per byte for ``integrity``: ``block_digests`` over ``nblocks``
        pool blocks, repeated for at least ``min_s`` seconds; returns bytes/s."""
        from kvtier.integrity import block_digests

        bufs = [self.pool.buffer(i) for i in range(nblocks)]
        done, t0 = 0, time.perf_counter()
        while True:
            block_digests(bufs, algorithm)
            done += 1
            dt = time.perf_counter() - t0
            if dt >= min_s:
                return {"bytes_per_s": done * nblocks * self.pool.block_bytes / dt, "seconds": dt}

    def wait(self, conn: Any) -> None:
        """Serve the raw ROUTER until a command arrives on the pipe."""
        import zmq

        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        fd = conn.fileno()
        poller.register(fd, zmq.POLLIN)
        while True:
            events = dict(poller.poll(500))
            if self.router in events:
                self._serve_raw()
            if fd in events:
                return

    def _serve_raw(self) -> None:
        import zmq

        router = self.router
        while True:
            try:
                rid, hdr = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, n, per_msg = _HDR.unpack_from(hdr)
            if kind == KIND_RTT:
                router.send_multipart([rid, RTT_REPLY])
                continue
            bufs = self.bufs
            for first in range(0, n, per_msg):
                router.send_multipart([rid, *bufs[first : min(n, first + per_msg)]], copy=False)

    def _shutdown(self) -> None:
        for mgr in self.mgrs.values():
            mgr.shutdown()
        self.mgrs = {}

    def close(self) -> None:
        self._shutdown()
        if self.floor is not None:
            self.floor.close()
        self.router.close(linger=0)
        self.ctx.destroy(linger=0)


class Consumer:
    def __init__(self) -> None:
        import torch

        torch.set_num_threads(1)
        _quiet_logs()
        self.mgrs: dict[str, Any] = {}
        self.ports: dict[str, int] = {}
        self.pool: Any = None
        self.ctx: Any = None
        self.dealer: Any = None
        self.src: Any = None
        self.floor: Any = None
        self._jobs = itertools.count(1)

    def hello(self) -> dict[str, Any]:
        return {"pid": os.getpid()}

    def wait(self, conn: Any) -> None:
        """Between commands, poll every manager every IDLE_POLL_S: their sessions' heartbeats must
        go on while the producer parks ids or the raw baseline runs (a consumer that stays silent
        for peer_timeout_s loses its sessions)."""
        while not conn.poll(IDLE_POLL_S):
            for m in self.mgrs.values():
                m.poll(0)

    def op_setup(
        self,
        block_bytes: int,
        num_blocks: int,
        producers: dict[str, str],
        raw_port: int,
        configs: dict[str, dict[str, Any]],
        copy_source: bool = False,
        floor_port: int | None = None,
    ) -> dict[str, Any]:
        """One manager per entry of ``configs`` (same names as the producer's), each loading from
        the producer manager of that name (``producers``: name -> address)."""
        import torch
        import zmq

        from kvtier.manager import KvTierManager
        from kvtier.memory import BlockPool

        self._shutdown()
        self.pool = BlockPool(num_blocks, block_bytes)
        self.bufs = [self.pool.buffer(i) for i in range(num_blocks)]
        self.views = [self.pool.view(i) for i in range(num_blocks)]
        for name, config in configs.items():
            self.mgrs[name] = KvTierManager(config, self.pool, layout="kvtier-bench")
            self.host, _, port = producers[name].rpartition(":")
            self.ports[name] = int(port)
        self.ctx = zmq.Context(1)
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.setsockopt(zmq.SNDHWM, 1000)
        self.dealer.setsockopt(zmq.RCVHWM, 1000)
        self.dealer.connect(f"tcp://127.0.0.1:{raw_port}")
        if floor_port is not None:
            from bench.floor import FloorClient

            self.floor = FloorClient(self.ctx, floor_port)
        self.src = None
        if copy_source:
            self.src = torch.empty((num_blocks, block_bytes), dtype=torch.uint8)
            self.src.fill_(7)  # pre-faulted, like the pool
        self.expected = {}
        base = _pattern(block_bytes)
        for i in {0, num_blocks - 1}:
            self.expected[i] = base ^ _xor(i)
        return {"pinned": self.pool.pinned}

    # -- helpers ----------------------------------------------------------------------------
    def _req(self, kid: str, pair: str = "zmq") -> Any:
        from kvtier.api import RequestContext

        return RequestContext(
            req_id="C" + kid,
            kv_transfer_params={
                "remote_prefiller": {"kv_request_id": kid, "remote_host": self.host, "remote_port": self.ports[pair]}
            },
        )

    def _wait_job(self, job_id: int, timeout_s: float = 60.0, mgr: Any = None) -> Any:
        mgr = mgr or self.mgrs["zmq"]
        now = time.monotonic()
        deadline, idle_at = now + timeout_s, now + IDLE_POLL_S
        while True:
            for r in mgr.get_finished_jobs():
                if r.job_id == job_id:
                    return r
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"job {job_id}: no result within {timeout_s} s")
            idle_at = self._poll(mgr, now, idle_at)

    def _poll(self, mgr: Any, now: float, idle_at: float) -> float:
        """Wait for ``mgr`` (up to ``IDLE_POLL_S``) and, once ``idle_at`` has passed, poll the other
        managers too (their idle sessions would miss their heartbeats while this one works) —
        every ``IDLE_POLL_S``, which heartbeats need; polling them on every wake would put their
        ticks on the measured manager's critical path. Returns the next ``idle_at``."""
        mgr.poll(IDLE_POLL_S)
        if now < idle_at:
            return idle_at
        for m in self.mgrs.values():
            if m is not mgr:
                m.poll(0)
        return now + IDLE_POLL_S

    def _zero(self, n: int) -> None:
        for i in {0, n - 1}:
            self.views[i].zero_()

    def _check(self, n: int) -> bool:
        import torch

        base = _pattern(self.pool.block_bytes)
        return all(torch.equal(self.views[i], base ^ _xor(i)) for i in {0, n - 1})

    # -- measurements -----------------------------------------------------------------------
    def op_kvtier(self, ids: list[str], nblocks: int, verify: bool = False, pair: str = "zmq",
                  window: int = 1) -> dict[str, Any]:
        """Load the ids with at most ``window`` requests outstanding (1: one at a time, each
        request's whole latency on the clock; more: as an engine with many requests keeps
        several loads in flight, each into its own slots); seconds from the first submit_load
        to the last successful JobResult, through the managers named ``pair``."""
        from kvtier.api import TransferJob

        mgr = self.mgrs[pair]
        keys, slots = _keys(nblocks), tuple(range(nblocks))
        reqs = [self._req(k, pair) for k in ids]
        for r in reqs:
            mgr.on_new_request(r)
        if verify:
            self._zero(nblocks)
        failures = []
        if window > 1 and window * nblocks > self.pool.num_blocks:
            raise ValueError(f"window {window} x {nblocks} blocks exceeds the pool ({self.pool.num_blocks} slots)")
        t0 = time.perf_counter()
        if window == 1:
            for r in reqs:
                job = next(self._jobs)
                mgr.submit_load(TransferJob(job_id=job, keys=keys, slots=slots, req=r))
                res = self._wait_job(job, mgr=mgr)
                if not res.success:
                    failures.append(res.reason)
        else:
            failures = self._windowed(mgr, reqs, keys, nblocks, window)
        seconds = time.perf_counter() - t0
        for r in reqs:
            mgr.on_request_finished(r)
        out: dict[str, Any] = {"seconds": seconds, "failures": failures}
        if verify:
            out["verified"] = self._check(nblocks)
        return out

    def _windowed(self, mgr: Any, reqs: list[Any], keys: tuple[bytes, ...], nblocks: int, window: int) -> list[Any]:
        from kvtier.api import TransferJob

        free = [tuple(range(w * nblocks, (w + 1) * nblocks)) for w in range(window)]
        out: dict[int, tuple[int, ...]] = {}  # job -> its slots
        failures: list[Any] = []
        pending = list(reqs)
        deadline, idle_at = time.monotonic() + 60.0, time.monotonic() + IDLE_POLL_S
        while pending or out:
            while pending and free:
                job, slots = next(self._jobs), free.pop()
                out[job] = slots
                mgr.submit_load(TransferJob(job_id=job, keys=keys, slots=slots, req=pending.pop(0)))
            for r in mgr.get_finished_jobs():
                if r.job_id in out:
                    free.append(out.pop(r.job_id))
                    if not r.success:
                        failures.append(r.reason)
            if not out and not pending:
                break
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{len(out)} windowed loads: no result within 60 s")
            idle_at = self._poll(mgr, now, idle_at)
        return failures

    def op_raw(self, count: int, nblocks: int, per_msg: int, verify: bool = False) -> dict[str, Any]:
        """``count`` request→stream exchanges on the raw DEALER, each frame landed with recv_into
        in pool slot i."""
        dealer, bufs = self.dealer, self.bufs
        hdr = _HDR.pack(KIND_STREAM, nblocks, per_msg)
        if verify:
            self._zero(nblocks)
        t0 = time.perf_counter()
        for _ in range(count):
            dealer.send(hdr)
            for i in range(nblocks):
                dealer.recv_into(bufs[i])
        seconds = time.perf_counter() - t0
        out: dict[str, Any] = {"seconds": seconds}
        if verify:
            out["verified"] = self._check(nblocks)
        return out

    def op_copy(self, count: int, nblocks: int) -> dict[str, Any]:
        """``count`` times: torch ``copy_`` of each of ``nblocks`` source blocks into pool slot i."""
        src = [self.src[i] for i in range(nblocks)]
        views = self.views
        t0 = time.perf_counter()
        for _ in range(count):
            for i in range(nblocks):
                views[i].copy_(src[i])
        return {"seconds": time.perf_counter() - t0}

    def op_rtt(self, count: int) -> list[float]:
        dealer = self.dealer
        req = _HDR.pack(KIND_RTT, 0, 0) + b"x" * (RTT_PAD - _HDR.size)
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            dealer.send(req)
            dealer.recv()
            out.append(time.perf_counter() - t0)
        return out

    def op_late(self, ids: list[str], nblocks: int, pair: str = "zmq") -> dict[str, Any]:
        """For each (tombstoned) id: one kvtier load (submit_load → failed JobResult), one raw
        request/reply round trip and — with a floor server set up — one refused fetch of the
        Python floor (:mod:`bench.floor`), back to back, rotating which goes first."""
        from kvtier.api import TransferJob

        mgr, dealer = self.mgrs[pair], self.dealer
        keys, slots = _keys(nblocks), tuple(range(nblocks))
        reqs = [self._req(k, pair) for k in ids]
        for r in reqs:
            mgr.on_new_request(r)
        rtt_req = _HDR.pack(KIND_RTT, 0, 0) + b"x" * (RTT_PAD - _HDR.size)
        kv, raw, reasons, floor, floor_reasons = [], [], [], [], []

        def one_raw() -> None:
            t0 = time.perf_counter()
            dealer.send(rtt_req)
            dealer.recv()
            raw.append(time.perf_counter() - t0)

        def one_kv(r: Any) -> None:
            job = next(self._jobs)
            t0 = time.perf_counter()
            mgr.submit_load(TransferJob(job_id=job, keys=keys, slots=slots, req=r))
            res = self._wait_job(job, mgr=mgr)
            kv.append(time.perf_counter() - t0)
            reasons.append(None if res.success else res.reason)

        def one_floor(r: Any) -> None:
            kid = r.kv_transfer_params["remote_prefiller"]["kv_request_id"]
            t0 = time.perf_counter()
            floor_reasons.append(self.floor.one(kid, keys))
            floor.append(time.perf_counter() - t0)

        steps: list[Any] = [lambda _r: one_raw(), one_kv] + ([one_floor] if self.floor is not None else [])
        for i, r in enumerate(reqs):
            for k in range(len(steps)):
                steps[(i + k) % len(steps)](r)
        for r in reqs:
            mgr.on_request_finished(r)
        return {"kvtier": kv, "raw": raw, "reasons": reasons, "floor": floor, "floor_reasons": floor_reasons}

    def _shutdown(self) -> None:
        for mgr in self.mgrs.values():
            mgr.shutdown()
        self.mgrs = {}
        if self.floor is not None:
            self.floor.close()
            self.floor = None
        if self.dealer is not None:
            self.dealer.close(linger=0)
            self.ctx.destroy(linger=0)
            self.dealer = None

    def close(self) -> None:
        self._shutdown()

