"""P0's child processes (:mod:`bench.seed` runs them): one :class:`Side` per system and role
(vLLM 0.33.0's ``p2p`` tier or kvtier, producer or consumer) drives a real
``TieringOffloadingManager`` and records what each hand-off cost, with the constants both sides
share.
"""

from __future__ import annotations

import hashlib
import os
import resource
import socket
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from bench.p0_raw import RawZmq

MiB = 1 << 20
ROW = MiB
"""Bytes per block (one primary row): 1 MiB."""
SYSTEMS = ("seed", "kvtier_nixl", "kvtier_zmq")
SIZES_MIB = (1, 8, 64, 256)
QUICK_SIZES_MIB = (1, 8)
UNBOUND_S = 1.5
"""``unbound_store_timeout_s`` of every producer: long enough for any hand-off here to bind,
short enough for the late-fetch rows."""
POLL_S = 0.001
"""vLLM's ``tier_poll_interval_s`` (its default)."""
TOKENS = 16
TITLE = "vLLM 0.33.0's p2p tier vs kvtier through vLLM's TieringOffloadingManager"
IDLE_POLL_S = 0.25
"""How often the systems not being measured are polled (their poll threads are stopped)."""

# -- inside a child ----------------------------------------------------------------------------------


def _alias_nixl() -> None:
    """Make ``import nixl`` (vLLM p2p's) find ``nixl_cu12``, as NIXL's meta package would."""
    if "nixl" in sys.modules:
        return
    import importlib

    for pkg in ("nixl_cu12", "nixl_cu13"):
        try:
            mod = importlib.import_module(pkg)
            api = importlib.import_module(pkg + "._api")
            bindings = importlib.import_module(pkg + "._bindings")
        except ImportError:
            continue
        sys.modules["nixl"], sys.modules["nixl._api"], sys.modules["nixl._bindings"] = mod, api, bindings
        return


BIND_TRIES = 5
"""A tier asks for its port up front (vLLM's p2p tier has no ephemeral port): a free one is picked
and, when another process took it meanwhile (parallel tests), another."""


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_GROUPS = (
    ("kvtier-digest", "digest pool"),
    ("kvtier-io", "kvtier I/O loop"),
    ("vllm_offload_tier", "vLLM tier poll"),
    ("ZMQbg", "libzmq I/O"),
    ("p0-idle", "idle poller"),
    ("p2p", "vLLM p2p's threads"),
)


def thread_cpu() -> dict[str, float]:
    """CPU seconds of every live thread of this process, summed by group: the digest pool,
    kvtier's poll thread, vLLM's tier poll thread, libzmq's I/O threads, the main (engine)
    thread, and ``other`` (UCX/NIXL progress threads, torch, …).  From
    ``/proc/self/task/*/schedstat`` (nanoseconds on a CPU; a thread that ended is no longer
    counted)."""
    main = str(os.getpid())
    python = {str(t.native_id): t.name for t in threading.enumerate()}  # comm says "python" for these
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = python.get(tid) or f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
        group = "engine (main)" if tid == main else next((g for p, g in _GROUPS if name.startswith(p)), "other")
        out[group] = out.get(group, 0.0) + cpu
    return out


def _shared_rows(rows: int, row_bytes: int) -> Any:
    """``(rows, row_bytes)`` uint8 over shared memory (tmpfs pages, as vLLM's primary CPU tier, a
    ``/dev/shm`` file: every system here reads and writes that memory), so the raw baselines move
    bytes between memory of the same kind as the tiers.  numpy's own arrays of this size sit on
    transparent huge pages (numpy advises them), which this host gives anonymous memory but not
    shared memory, and a CMA copy between them ran 1.1-1.5x faster than between 4 KiB pages
    (docs/benchmarks.md, P0) — a baseline no tier over vLLM's memory could reach."""
    import numpy as np

    from kvtier.memory.shared import allocate

    mm, _ = allocate(rows * row_bytes, "kvtier-p0-raw")
    return np.frombuffer(mm, dtype=np.uint8).reshape(rows, row_bytes)


def _key_hash(kid: str, i: int) -> bytes:
    return hashlib.sha256(f"{kid}/{i}".encode()).digest()


class _Recorder:
    """Wraps one tier instance's ``submit_store``/``submit_load``/``get_finished_jobs`` to time them."""

    def __init__(self, tier: Any) -> None:
        self.submitted: dict[int, float] = {}
        self.store_wall: dict[int, float] = {}
        self.store_cpu: dict[int, float] = {}
        self.finished: dict[int, tuple[float, bool]] = {}
        self.cond = threading.Condition()
        orig_store, orig_load, orig_finished = tier.submit_store, tier.submit_load, tier.get_finished_jobs

        def submit_store(job: Any) -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                orig_store(job)
            finally:
                self.store_wall[job.job_id] = time.perf_counter() - t0
                self.store_cpu[job.job_id] = time.thread_time() - c0

        def submit_load(job: Any) -> None:
            self.submitted[job.job_id] = time.perf_counter()
            orig_load(job)

        def get_finished_jobs() -> Any:
            res = list(orig_finished())
            if res:
                now = time.perf_counter()
                with self.cond:
                    for r in res:
                        self.finished[r.job_id] = (now, bool(r.success))
                    self.cond.notify_all()
            return res

        tier.submit_store, tier.submit_load, tier.get_finished_jobs = submit_store, submit_load, get_finished_jobs

    def wait(self, job_id: int, timeout_s: float) -> tuple[float, bool]:
        with self.cond:
            if not self.cond.wait_for(lambda: job_id in self.finished, timeout_s):
                raise TimeoutError(f"job {job_id}: no result within {timeout_s} s")
            return self.finished.pop(job_id)


class _Trace:
    """When kvtier's data plane posted a transfer, reported what (``Released``, ``Notified``,
    ``Landed`` …) and started landings: ``(event, perf_counter)`` pairs, for the per-hop table."""

    def __init__(self, plane: Any) -> None:
        self.events: list[tuple[str, float]] = []
        post, poll, land = plane.post, plane.poll, plane.land
        ev = self.events

        def traced_post(*a: Any) -> Any:
            ev.append(("post", time.perf_counter()))
            return post(*a)

        def traced_poll() -> Any:
            out = poll()
            if out:
                t = time.perf_counter()
                ev.extend((type(r).__name__, t) for r in out)
            return out

        def traced_land(*a: Any) -> Any:
            ev.append(("land", time.perf_counter()))
            bad = land(*a)
            if bad is not None:
                ev.append(("Landed", time.perf_counter()))  # done on the calling thread
            return bad

        plane.post, plane.poll, plane.land = traced_post, traced_poll, traced_land  # instance attributes

    def take(self) -> list[tuple[str, float]]:
        out = list(self.events)
        self.events.clear()
        return out


class _System:
    def __init__(self, name: str, mgr: Any, address: str) -> None:
        self.name = name
        self.mgr = mgr
        self.tier = mgr.secondary_tiers[0]
        self.rec = _Recorder(self.tier)
        self.address = address
        self.view: Any = None  # the primary as (rows, ROW // 8) uint64
        kv = getattr(self.tier, "kvtier", None)
        self.trace = _Trace(kv.plane) if kv is not None else None

    def pause(self) -> None:
        self.mgr._stop_tier_poll_thread()

    def resume(self) -> None:
        if self.mgr._tier_poll_thread is None:
            self.mgr._tier_poll_stop.clear()
            self.mgr._start_tier_poll_thread()


class Side(RawZmq):
    """One process: a TieringOffloadingManager per system, a raw NIXL agent, copy_ tensors."""

    def __init__(self, role: str, systems: Sequence[str], max_blocks: int, tag: str, host: str = "127.0.0.1",
                 netns: str | None = None, env: dict[str, str] | None = None, limits: bool = False,
                 batch_bytes: int | None = None, tail_bytes: int | None = None,
                 window_bytes: int | None = None, tier_config: dict[str, Any] | None = None) -> None:
        if netns is not None:
            # before any thread or socket exists: UCX and libzmq threads inherit the namespace
            from tests.support.netns import enter

            enter(netns, sysfs=True)
        os.environ.update(env or {})
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
        os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
        os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")  # what vLLM sets before importing NIXL
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        _alias_nixl()
        import logging

        import numpy as np

        for name in ("vllm", "kvtier"):
            logging.getLogger(name).setLevel(logging.WARNING)
        if batch_bytes is not None or tail_bytes is not None:  # measuring batch sizes (decision I14)
            import kvtier.lifecycle.batches as batches  # read when each core is built

            batches.MAX_BATCH_BYTES = batch_bytes or batches.MAX_BATCH_BYTES
            batches.TAIL_BYTES = tail_bytes or batches.TAIL_BYTES
        if window_bytes is not None:
            import kvtier.dataplane.nixl_pipeline as nixl_pipeline

            nixl_pipeline.WINDOW_BYTES = window_bytes
        self.np = np
        self.tier_config = dict(tier_config or {})
        self.role = role
        self.tag = tag
        self.host = host
        self.rows = max_blocks + 8
        self.systems: dict[str, _System] = {}
        self.base = np.random.default_rng(1).integers(0, 2**63, ROW // 8, dtype=np.uint64)
        self.agent: Any = None
        for name in systems:
            self.systems[name] = self._build(name)
        for s in self.systems.values():
            s.pause()
        self.active: str | None = None
        self._stop = threading.Event()
        self._keeper = threading.Thread(target=self._keep_idle, name="p0-idle-poll", daemon=True)
        self._keeper.start()
        self.req_n = 0
        if not limits:
            return
        from kvtier.dataplane.nixl_agent import NixlBlockAgent

        self.region = _shared_rows(max_blocks, ROW)
        self.agent = NixlBlockAgent(f"p0-raw-{role}-{os.getpid()}", self.region, layout="p0")
        if role == "consumer":
            import torch

            torch.set_num_threads(1)
            self.src = torch.empty((max_blocks, ROW), dtype=torch.uint8).fill_(7)
            self.dst = torch.empty((max_blocks, ROW), dtype=torch.uint8).fill_(0)

    def _build(self, name: str) -> _System:
        from vllm.v1.kv_offload.config import (
            OffloadingCacheConfig,
            OffloadingConfig,
            OffloadingGroupConfig,
            OffloadingModelConfig,
            OffloadingParallelConfig,
        )
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory

        port = _free_port(self.host)
        producer = self.role == "producer"
        if name == "seed":
            entry: dict[str, Any] = {"type": "p2p", "host": self.host, "port": port}
        else:
            # peer_timeout_s: a pair not being measured is frozen (SIGSTOP) for a while; its
            # sessions must still be there when it is thawed (vLLM p2p's have no such timer)
            entry = {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "host": self.host,
                     "port": port, "data_plane": name.removeprefix("kvtier_"), "peer_timeout_s": 600.0}
            entry.update(self.tier_config)  # measuring what a key costs (bench.seed --set)
        if producer:
            entry["unbound_store_timeout_s"] = UNBOUND_S
        cfg = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=TOKENS, layer_names=("model.layers.0.self_attn.attn",),
                                          group_id=0),),
            worker_kv_bytes_per_block=ROW,
            enable_kv_cache_events=False,
            extra_config={"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": self.rows * ROW,
                          "tier_poll_interval_s": POLL_S, "secondary_tiers": [entry]},
            engine_id=f"kvtier-p0-{self.tag}-{name}-{self.role}",
            model=OffloadingModelConfig(name="p0", dtype="float16", max_model_len=1 << 20),
            cache=OffloadingCacheConfig(tokens_per_hash=TOKENS, blocks_per_chunk=1),
            parallel=OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, data_parallel_index=0,
                data_parallel_size=1, data_parallel_rank_local=None, is_parallelism_agnostic=True,
            ),
        )
        for attempt in range(BIND_TRIES):
            try:
                mgr = OffloadingSpecFactory.create_spec(cfg).get_manager()
                break
            except Exception as exc:  # the port picked above was taken before the tier bound it
                if "Address already in use" not in str(exc) or attempt == BIND_TRIES - 1:
                    raise
                port = _free_port(self.host)
                entry["port"] = port
        s = _System(name, mgr, f"{self.host}:{port}")
        s.view = self.np.asarray(mgr.primary_tier.get_kv_memoryview()).view(self.np.uint64)
        return s

    def hello(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "addresses": {n: s.address for n, s in self.systems.items()},
                "descriptor": self.agent.descriptor() if self.agent is not None else None}

    # -- helpers -----------------------------------------------------------------------------
    def _keys(self, kid: str, n: int) -> list[bytes]:
        from vllm.v1.kv_offload.base import make_offload_key

        return [make_offload_key(_key_hash(kid, i), 0) for i in range(n)]

    def _fill(self, kid: str, i: int, out: Any) -> None:
        """Block ``i`` of ``kid``: a fixed random MiB XOR a per-block 64-bit tag, into ``out``."""
        tag = int.from_bytes(_key_hash(kid, i)[:8], "little")
        self.np.bitwise_xor(self.base, self.np.uint64(tag), out=out)

    def _exact(self, row: Any, kid: str, i: int) -> bool:
        tag = int.from_bytes(_key_hash(kid, i)[:8], "little")
        return bool(self.np.array_equal(row ^ self.np.uint64(tag), self.base))

    @staticmethod
    def _step(mgr: Any, new: Sequence[str] = ()) -> None:
        from vllm.v1.kv_offload.base import ScheduleEndContext

        mgr.on_schedule_end(ScheduleEndContext(new_req_ids=list(new), preempted_req_ids=()))

    def _keep_idle(self) -> None:
        """Poll the paused systems every IDLE_POLL_S: their sessions' heartbeats must go on (kvtier
        ends a session after peer_timeout_s = 5 s of silence), at a rate that costs nothing."""
        while not self._stop.wait(IDLE_POLL_S):
            for name, s in list(self.systems.items()):
                if name != self.active and s.mgr._tier_poll_thread is None:
                    with s.mgr.lock:
                        s.mgr.poll_tiers()

    # -- ops ---------------------------------------------------------------------------------
    def op_activate(self, system: str) -> None:
        """Only ``system``'s poll thread runs (the others' would tick 1,000 times a second)."""
        if self.active == system:
            return
        for name, s in self.systems.items():
            if name != system:
                s.pause()
        self.systems[system].resume()
        self.active = system

    def op_cpu(self) -> float:
        return _cpu_s()

    def op_threads(self) -> dict[str, float]:
        """CPU seconds of this process's threads so far, summed by thread group (see
        :func:`thread_cpu`)."""
        return thread_cpu()

    def op_store(self, system: str, kid: str, n: int) -> dict[str, Any]:
        """Producer: prepare_store, write the rows, complete_store (→ tier.submit_store), finish."""
        from vllm.v1.kv_offload.base import ReqContext

        s = self.systems[system]
        if s.trace is not None:
            s.trace.take()
        ks = self._keys(kid, n)
        ctx = ReqContext(f"P-{kid}", kv_transfer_params={"remote_decoder": {"kv_request_id": kid}})
        with s.mgr.lock:
            s.mgr.on_new_request(ctx)
            out = s.mgr.prepare_store(ks, ctx)
            self._step(s.mgr, (ctx.req_id,))
        if out is None or len(out.keys_to_store) != n:
            raise RuntimeError(f"{system}: the primary had no room for {n} blocks")
        index = {k: i for i, k in enumerate(ks)}
        for k, cid in zip(out.keys_to_store, out.store_spec.chunk_ids.tolist()):
            self._fill(kid, index[k], s.view[cid])
        before = set(s.rec.store_wall)
        t0 = time.perf_counter()
        with s.mgr.lock:
            s.mgr.complete_store(set(ks), ctx)  # a set, as from the connector
            s.mgr.on_request_finished(ctx)
        complete = time.perf_counter() - t0
        (jid,) = set(s.rec.store_wall) - before
        return {"job": jid, "submit_store_s": s.rec.store_wall[jid], "submit_store_cpu_s": s.rec.store_cpu[jid],
                "complete_store_s": complete}

    def op_trace(self) -> list[tuple[str, float]]:
        """Producer: the plane events of the last hand-off :meth:`op_stored` waited for."""
        return getattr(self, "last_trace", [])

    def op_stored(self, system: str, job: int, wait_s: float = 120.0) -> bool:
        """Producer: wait for the store job's result (the consumer fetched it, or it was reaped)."""
        s = self.systems[system]
        _, ok = s.rec.wait(job, wait_s)
        self.last_trace = s.trace.take() if s.trace is not None else []
        deadline = time.monotonic() + wait_s
        while s.mgr._jobs:  # the manager processed it too (rows unpinned)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system}: store jobs left {list(s.mgr._jobs)}")
            time.sleep(0.001)
        return ok

    def op_load(self, system: str, kid: str, n: int, host: str, port: int, expect_ok: bool = True,
                wait_s: float = 120.0) -> dict[str, Any]:
        """Consumer: lookups (HIT_PENDING) → on_schedule_end (→ tier.submit_load) → the result →
        lookups HIT → prepare_load, every row checked byte-exact → complete_load, finish."""
        from vllm.v1.kv_offload.base import LookupResult, ReqContext

        s = self.systems[system]
        ks = self._keys(kid, n)
        ctx = ReqContext(f"D-{kid}", kv_transfer_params={"remote_prefiller": {
            "kv_request_id": kid, "remote_host": host, "remote_port": port}})
        before = set(s.rec.submitted)
        if s.trace is not None:
            s.trace.take()
        with s.mgr.lock:
            s.mgr.on_new_request(ctx)
            first = [s.mgr.lookup(k, ctx) for k in ks]
            self._step(s.mgr, (ctx.req_id,))  # _flush_pending_promotions → tier.submit_load
        if first != [LookupResult.HIT_PENDING] * n:
            raise RuntimeError(f"{system}: first lookups {set(first)}, expected HIT_PENDING")
        (jid,) = set(s.rec.submitted) - before
        t_done, ok = s.rec.wait(jid, wait_s)
        t_sub = s.rec.submitted.pop(jid)
        out: dict[str, Any] = {"load_s": t_done - t_sub, "ok": ok, "exact": None, "t_submit": t_sub,
                               "t_done": t_done, "trace": s.trace.take() if s.trace is not None else []}
        deadline = time.monotonic() + wait_s
        while True:  # the manager applies the result (under its lock, from its poll thread)
            with s.mgr.lock:
                res = [s.mgr.lookup(k, ctx) for k in ks]
                if res == [LookupResult.HIT] * n or LookupResult.MISS in res:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system}: lookups stayed {set(res)}")
            time.sleep(0.0005)
        hit = res == [LookupResult.HIT] * n
        if ok != hit:
            raise RuntimeError(f"{system}: the tier said success={ok} but the lookups say {set(res)}")
        with s.mgr.lock:
            if hit:
                spec = s.mgr.prepare_load(ks, ctx)
                out["exact"] = all(self._exact(s.view[cid], kid, i) for i, cid in enumerate(spec.chunk_ids.tolist()))
                s.mgr.complete_load(ks, ctx)
            s.mgr.on_request_finished(ctx)
            self._step(s.mgr)
        if ok != expect_ok:
            raise RuntimeError(f"{system}: load of {kid} success={ok}, expected {expect_ok}")
        if hit and not out["exact"]:
            raise RuntimeError(f"{system}: load of {kid} reported success but the bytes differ")
        return out

    # -- limits ------------------------------------------------------------------------------
    def op_raw_peer(self, descriptor: bytes) -> None:
        self.agent.add_peer("peer", descriptor)

    def op_raw_write(self, kid: str, n: int, wait_s: float = 60.0) -> dict[str, float]:
        """Producer: one WRITE of blocks 0..n-1 into the consumer's slots n-1..0 with a
        notification; busy-polls post → ``DONE``."""
        r64 = self.region.view(self.np.uint64)
        for i in range(n):
            self._fill(kid, i, r64[i])
        slots = list(range(n - 1, -1, -1))
        t0 = time.perf_counter()
        xid = self.agent.post_write("peer", list(range(n)), slots, notif=kid.encode())
        deadline = t0 + wait_s
        while time.perf_counter() < deadline:
            for ev in self.agent.poll():
                if getattr(ev, "xfer_id", None) == xid:
                    if ev.status != "done":
                        raise RuntimeError(f"raw WRITE failed: {ev.detail}")
                    return {"posted": t0, "done_s": time.perf_counter() - t0}
        raise TimeoutError(f"raw WRITE of {n} blocks not done within {wait_s} s")

    def op_raw_recv(self, kid: str, n: int, wait_s: float = 60.0) -> dict[str, Any]:
        """Consumer: progress our agent (a UCX tcp target must) until the WRITE's notification
        arrives, then check every slot byte-exact."""
        deadline = time.perf_counter() + wait_s
        want = kid.encode()
        while time.perf_counter() < deadline:
            for note in self.agent.progress():
                if note.message == want:
                    t = time.perf_counter()
                    r64 = self.region.view(self.np.uint64)
                    exact = all(self._exact(r64[n - 1 - i], kid, i) for i in range(n))
                    return {"notified": t, "exact": exact}
            time.sleep(0.00005)
        raise TimeoutError(f"no notification for {kid} within {wait_s} s")

    def op_copy(self, n: int) -> float:
        """Consumer: torch ``copy_`` of ``n`` source blocks into ``n`` destination rows, one by one."""
        import torch

        src, dst = self.src, self.dst
        t0 = time.perf_counter()
        for i in range(n):
            dst[i].copy_(src[i])
        dt = time.perf_counter() - t0
        if not torch.equal(dst[:n], src[:n]):
            raise RuntimeError("copy_ produced other bytes")
        dst[:n].fill_(0)
        return dt

    def close(self) -> None:
        self._stop.set()
        if self._keeper.is_alive():
            self._keeper.join(5)
        for s in self.systems.values():
            s.view = None
            try:
                s.mgr.shutdown()
            except Exception:  # noqa: BLE001 - best effort at exit
                traceback.print_exc()
        self.systems.clear()
        if self.agent is not None:
            self.agent.close()
            self.agent = None
