"""P0: vLLM 0.33.0's own ``p2p`` secondary tier as a benchmark peer.

Producer and consumer are two spawned processes on one host.  Each builds, the way vLLM builds
them, one ``TieringOffloadingManager`` per system under test (``TieringOffloadingSpec(...)
.get_manager()``: a real CPU primary tier over ``/dev/shm``, the tier loaded by vLLM's
``SecondaryTierFactory``), and drives it in the order vLLM's offloading connector does, holding
the manager's lock, with vLLM's ``vllm_offload_tier_poll`` thread (1 ms) as the only poller of the
system being measured (the others' poll threads are stopped meanwhile and their heartbeats kept by
one poll every 0.25 s):

* ``seed``: ``{"type": "p2p"}`` — the p2p tier with its NIXL data plane and ZeroMQ control;
* ``kvtier_nixl`` / ``kvtier_zmq``: ``{"type": "KvTierSecondaryTier", "module_path":
  "kvtier.integrations.vllm", "data_plane": ...}``;

plus the limits, between the same two processes: a raw NIXL WRITE pair (two
:class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent`: post → ``DONE``) and torch ``copy_`` of the
same blocks (one thread, into a pre-faulted destination).

Per request of 1 block and of 8, 64, 256 MiB (1 MiB blocks; ``--quick``: 1 and 8 MiB), repeated
A/B interleaved (the order of the systems rotates every round), every hand-off checked
byte-exact in the consumer's primary rows:

* ``load``: the consumer's ``submit_load`` (inside ``on_schedule_end``) → the tier reporting the
  job's result (``get_finished_jobs``, called by vLLM's poll thread), median;
* ``submit_store``: the producer engine thread's time inside ``tier.submit_store`` (wall and that
  thread's CPU), median;
* ``cpu``: CPU seconds per GB moved in each process (``getrusage``, all threads, from just before
  the store to the end of the hand-off), and the same split by thread (the engine's main thread,
  vLLM's tier poll thread, kvtier's digest pool, libzmq's I/O threads, the rest: UCX, torch), from
  ``/proc/self/task`` — where the time goes;
* ``late``: a fetch for an id the producer reaped (``unbound_store_timeout_s`` passed): the
  consumer's ``submit_load`` → the failed result.

vLLM's p2p tier imports ``nixl`` while ``nixl-cu12`` installs ``nixl_cu12``: the child processes alias
one to the other in ``sys.modules`` (NIXL's meta package does the same); kvtier never does.

In the suite: ``python -m bench --only P0`` (part of ``make bench``).  Alone, with more knobs:
``python -m bench.seed [--quick] [--rounds N] [--systems a,b] [--two-hosts] [--json PATH]`` prints
the markdown tables; ``--two-hosts`` runs producer and consumer in two network namespaces joined by
a veth pair (root), NIXL with UCX over TCP on it.  The two children are
:class:`tools.child.Child` processes running :class:`Side`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import socket
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bench.p0_raw import RawZmq, phase_table, raw_zmq
from kvtier.lifecycle.batches import MAX_BATCH_BYTES

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
                 window_bytes: int | None = None) -> None:
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

        self.region = np.zeros((max_blocks, ROW), dtype=np.uint8)
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
        mgr = OffloadingSpecFactory.create_spec(cfg).get_manager()
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


# -- the parent --------------------------------------------------------------------------------------


def _remove_shm(tag: str) -> None:
    """Remove primaries a killed child left in /dev/shm (vLLM unlinks them on a clean shutdown)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        if f"kvtier-p0-{tag}-" in name:
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run(quick: bool = False, log: Callable[[str], None] = print, rounds: int | None = None,
        late_rounds: int | None = None, systems: Sequence[str] = SYSTEMS, two_hosts: bool = False,
        sizes: Sequence[int] | None = None, batch_bytes: int | None = None,
        tail_bytes: int | None = None, window_bytes: int | None = None) -> dict[str, Any]:
    """Run P0; returns a result record (``rows`` per size and system, ``late``, ``machine``).

    ``two_hosts``: producer and consumer in two network namespaces joined by a veth pair
    (:class:`tests.support.netns.TwoHosts`; root), NIXL with UCX over TCP on it.  ``sizes``: MiB
    per request (default 1, 8, 64, 256; quick 1, 8).  ``batch_bytes``/``tail_bytes``: kvtier's
    batch plan and the NIXL plane's window in the children (measuring them; default the shipped
    constants)."""
    plan = {"batch_bytes": batch_bytes, "tail_bytes": tail_bytes, "window_bytes": window_bytes}
    if two_hosts:
        from tests.support.netns import TwoHosts, unavailable_reason

        why = unavailable_reason()
        if why:
            raise RuntimeError(f"two hosts: {why}")
        with TwoHosts() as h:
            def ucx(dev: str) -> dict[str, str]:
                return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": dev, "UCX_TCP_USER_TIMEOUT": "2s"}

            sides = ({"host": h.addr_a, "netns": h.a, "env": ucx(h.dev_a), **plan},
                     {"host": h.addr_b, "netns": h.b, "env": ucx(h.dev_b), **plan})
            res = _run(quick, log, rounds, late_rounds, systems, sides, sizes)
        res["two_hosts"] = True
        return res
    return _run(quick, log, rounds, late_rounds, systems, (plan, plan), sizes)


SETTLE_S = 0.05
"""After a frozen pair is thawed, this long before it is measured (heartbeats, deadlines due)."""


def _run(quick: bool, log: Callable[[str], None], rounds: int | None, late_rounds: int | None,
         systems: Sequence[str], sides: tuple[dict[str, Any], dict[str, Any]],
         sizes: Sequence[int] | None = None) -> dict[str, Any]:
    """Every system, and the limits, in a pair of processes of its own; only the pair being
    measured runs, the others are frozen (SIGSTOP): vLLM p2p's NIXL agent runs its progress
    thread, which keeps a core busy even when idle, and would otherwise run beside every other
    system's hand-offs."""
    import signal

    from bench._util import CpuMeter, machine_info, summary
    from tools.child import Child, start_all

    sizes = tuple(sizes or (QUICK_SIZES_MIB if quick else SIZES_MIB))
    rounds = rounds or (3 if quick else 9)
    late_rounds = late_rounds or (1 if quick else 3)
    max_blocks = max(sizes)
    t_start = time.monotonic()
    meter = CpuMeter()
    names = [*systems, "limits"]
    log(f"P0: starting a producer and a consumer for each of {', '.join(names)} ({max_blocks} MiB primaries)")
    tag = uuid.uuid4().hex[:8]
    children: list[Child] = []
    for name in names:
        for role, side in zip(("producer", "consumer"), sides):
            kw = {"role": role, "systems": [] if name == "limits" else [name], "max_blocks": max_blocks,
                  "tag": tag, "limits": name == "limits", **side}
            children.append(Child("bench.seed", "Side", kw, name=f"p0-{name}-{role}", call_timeout_s=300))
    try:
        start_all(*children, timeout_s=600)
    except BaseException:
        _remove_shm(tag)
        raise
    pairs = {name: (children[2 * i], children[2 * i + 1]) for i, name in enumerate(names)}
    frozen: set[str] = set()

    def freeze(name: str) -> None:
        for c in pairs[name]:
            os.kill(c.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        frozen.add(name)

    def thaw(name: str) -> None:
        if name in frozen:
            for c in pairs[name]:
                try:
                    os.kill(c.pid, signal.SIGCONT)  # type: ignore[arg-type]
                except ProcessLookupError:  # it died (its caller reports why)
                    pass
            frozen.discard(name)
            time.sleep(SETTLE_S)

    def only(name: str) -> tuple[Child, Child]:
        for other in names:
            if other != name and other not in frozen:
                freeze(other)
        thaw(name)
        return pairs[name]

    samples: dict[tuple[int, str], dict[str, list[float]]] = {}
    late: dict[str, list[float]] = {s: [] for s in systems}
    try:
        lp, lc = only("limits")
        lp.call("raw_peer", descriptor=lc.hello["descriptor"])
        lc.call("raw_peer", descriptor=lp.hello["descriptor"])
        seq = iter(range(10**9))

        def hand_off(system: str, n: int) -> dict[str, float]:
            prod, cons = only(system)
            kid = f"p0-{system}-{n}-{next(seq)}"
            host, port = prod.hello["addresses"][system].rsplit(":", 1)
            c0p, c0c = prod.call("cpu"), cons.call("cpu")
            t0p, t0c = prod.call("threads"), cons.call("threads")
            st = prod.call("store", system=system, kid=kid, n=n)
            ld = cons.call("load", system=system, kid=kid, n=n, host=host, port=int(port))
            if not prod.call("stored", system=system, job=st["job"]):
                raise RuntimeError(f"{system}: the producer's store job failed after a successful load")
            c1p, c1c = prod.call("cpu"), cons.call("cpu")
            t1p, t1c = prod.call("threads"), cons.call("threads")
            out = {"load_s": ld["load_s"], "submit_store_s": st["submit_store_s"],
                   "submit_store_cpu_s": st["submit_store_cpu_s"], "complete_store_s": st["complete_store_s"],
                   "cpu_prod_s": c1p - c0p, "cpu_cons_s": c1c - c0c}
            for side, a, b in (("prod", t0p, t1p), ("cons", t0c, t1c)):
                for group in set(a) | set(b):
                    out[f"thr_{side}_{group}"] = b.get(group, 0.0) - a.get(group, 0.0)
            out.update(_hops(ld, prod.call("trace")))
            return out

        def raw_write(kid: str, n: int) -> dict[str, float]:
            prod, cons = only("limits")
            cons.send("raw_recv", kid=kid, n=n)
            w = prod.call("raw_write", kid=kid, n=n)
            got = cons.result()
            if not got["exact"]:
                raise RuntimeError("raw NIXL WRITE: the consumer's bytes differ")
            return {"done_s": w["done_s"], "notified_s": got["notified"] - w["posted"]}

        log("P0: warm-up (handshakes, first touch)")
        for system in systems:
            for c in only(system):
                c.call("activate", system=system)
            hand_off(system, min(8, max_blocks))
            hand_off(system, max_blocks)
        raw_write("warm", max_blocks)
        lc.call("zraw_connect", address=lp.call("zraw_bind"))
        per_msg = max(1, MAX_BATCH_BYTES // ROW)
        raw_zmq(*only("limits"), "warm", max_blocks, per_msg)
        only("limits")[1].call("copy", n=max_blocks)

        for r in range(rounds):
            order = list(systems[r % len(systems):]) + list(systems[: r % len(systems)])
            for mib in sizes:
                n = mib
                for system in order:
                    got = hand_off(system, n)
                    d = samples.setdefault((mib, system), {})
                    for k, v in got.items():
                        d.setdefault(k, []).append(v)
                kid = f"raw-{r}-{mib}"
                raw = raw_write(kid, n)
                d = samples.setdefault((mib, "raw_nixl"), {})
                d.setdefault("load_s", []).append(raw["done_s"])
                d.setdefault("notified_s", []).append(raw["notified_s"])
                for k, v in raw_zmq(*only("limits"), f"zraw-{r}-{mib}", n, per_msg).items():
                    samples.setdefault((mib, "raw_zmq"), {}).setdefault(k, []).append(v)
                samples.setdefault((mib, "copy"), {}).setdefault("load_s", []).append(
                    only("limits")[1].call("copy", n=n))
            log(f"P0: round {r + 1}/{rounds} done ({time.monotonic() - t_start:.0f} s)")

        log("P0: late fetches (reaped ids)")
        for r in range(late_rounds):
            for system in systems:
                prod, cons = only(system)
                host, port = prod.hello["addresses"][system].rsplit(":", 1)
                kid = f"late-{system}-{r}"
                st = prod.call("store", system=system, kid=kid, n=1)
                time.sleep(UNBOUND_S + 0.5)
                ld = cons.call("load", system=system, kid=kid, n=1, host=host, port=int(port), expect_ok=False)
                late[system].append(ld["load_s"])
                prod.call("stored", system=system, job=st["job"])
    finally:
        for name in list(frozen):
            thaw(name)
        for c in reversed(children):  # consumers first: their producers see a clean disconnect
            c.close()
        _remove_shm(tag)

    rows = []
    for mib in sizes:
        for system in (*systems, "raw_nixl", "raw_zmq", "copy"):
            d = samples.get((mib, system))
            if not d:
                continue
            row: dict[str, Any] = {"mib": mib, "system": system, "load_s": summary(d["load_s"])}
            for k in ("submit_store_s", "submit_store_cpu_s", "complete_store_s", "notified_s", "first_s", "done_s"):
                if k in d:
                    row[k] = summary(d[k])
            if "cpu_prod_s" in d:
                gb = mib * MiB / 1e9
                row["cpu_s_per_gb"] = {"producer": _median(d["cpu_prod_s"]) / gb,
                                       "consumer": _median(d["cpu_cons_s"]) / gb}
                hops = {k: summary(d[k]) for k, _ in HOPS if d.get(k)}
                if hops:
                    row["hops_s"] = hops
                row["thread_cpu_s_per_gb"] = {  # mean over the rounds: per hand-off it is noise
                    side: {k.split("_", 2)[2]: sum(v) / len(v) / gb for k, v in sorted(d.items())
                           if k.startswith(f"thr_{tag}_") and sum(v) > 0}
                    for side, tag in (("producer", "prod"), ("consumer", "cons"))}
            rows.append(row)
    noise = meter.stop()
    targets = _targets(samples, sizes, systems)
    ratio, kv, base = _headline(samples, sizes, systems)
    return {"id": "P0", "title": TITLE,
            "status": "ok", "quick": quick, "rounds": rounds, "block_bytes": ROW, "rows": rows,
            "late_s": {s: summary(v) for s, v in late.items() if v}, "ratio": ratio, "kvtier": kv,
            "baseline": base, "targets": targets, "noise": noise, "machine": machine_info(),
            "wall_s": time.monotonic() - t_start}


HOPS = (
    ("hop_fetch", "submit_load → the producer's plane posts (fetch, producer tick)"),
    ("hop_write", "post → the producer's plane released every block (WRITEs / sends done)"),
    ("hop_first", "post → the consumer's first landing starts (first batch written / sent)"),
    ("hop_stream", "first → last landing started (the other batches)"),
    ("hop_check", "last landing started → every landing checked"),
    ("hop_result", "every landing checked → the job's result reaches vLLM"),
)


def _hops(load: dict[str, Any], producer: list[tuple[str, float]]) -> dict[str, float]:
    """Where a kvtier hand-off's time went (seconds per hop, see :data:`HOPS`), from the two
    planes' traces; empty for vLLM p2p (whose plane is not traced)."""
    cons = load.get("trace") or []
    posts = [t for e, t in producer if e == "post"]
    lands = [t for e, t in cons if e == "land"]
    landed = [t for e, t in cons if e == "Landed"]
    if not (posts and lands and landed):
        return {}
    released = [t for e, t in producer if e == "Released"]
    out = {"hop_write": released[-1] - posts[0]} if released else {}
    return out | {"hop_fetch": posts[0] - load["t_submit"], "hop_first": lands[0] - posts[0],
            "hop_stream": lands[-1] - lands[0], "hop_check": max(landed) - lands[-1],
            "hop_result": load["t_done"] - max(landed)}


def _paired(samples: dict, mib: int, a: str, b: str, key: str = "load_s") -> list[float]:
    """Per-round ratios a/b (the two measured in the same round, back to back)."""
    xa, xb = samples.get((mib, a), {}).get(key, []), samples.get((mib, b), {}).get(key, [])
    return [x / y for x, y in zip(xa, xb) if y > 0]


def _headline(samples: dict, sizes: Sequence[int], systems: Sequence[str]) -> tuple[dict, dict, dict]:
    """The suite's headline: kvtier nixl's hand-off time over vLLM p2p's at the largest size."""
    from bench._util import summary

    mib = max(sizes)
    a = "kvtier_nixl" if "kvtier_nixl" in systems else systems[-1]
    b = "seed" if "seed" in systems else systems[0]
    pr = _paired(samples, mib, a, b)
    ratio = summary(pr) if pr else {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    kv = {"what": f"{a} hand-off, {mib} MiB", "value": _median(samples[(mib, a)]["load_s"]), "unit": "s"}
    base = {"what": f"{b} hand-off, {mib} MiB", "value": _median(samples[(mib, b)]["load_s"]), "unit": "s"}
    return ratio, kv, base


def _targets(samples: dict, sizes: Sequence[int], systems: Sequence[str]) -> list[dict[str, Any]]:
    """The targets of the issue that P0 measures, each from the per-round paired ratios' median."""
    from bench._util import target

    out: list[dict[str, Any]] = []

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    if {"seed", "kvtier_nixl"} <= set(systems):
        for mib in sizes:
            out.append(target("<=", 0.5, med(_paired(samples, mib, "kvtier_nixl", "seed")),
                              f"kvtier nixl hand-off ≤ 0.5× vLLM p2p's, {mib} MiB"))
    if "kvtier_nixl" in systems:
        for mib in sizes:
            # throughput ratio = raw time / kvtier time
            r = med([1 / x for x in _paired(samples, mib, "kvtier_nixl", "raw_nixl")])
            if mib == 1:
                t = med(_paired(samples, mib, "kvtier_nixl", "raw_nixl"))
                out.append(target("<=", 3.0, t, "kvtier nixl 1-block hand-off ≤ 3× a raw NIXL WRITE's time"))
            elif mib >= 64:
                out.append(target(">=", 0.85, r, f"kvtier nixl ≥ 0.85× a raw NIXL WRITE's throughput, {mib} MiB"))
            elif mib >= 8:
                out.append(target(">=", 0.6, r, f"kvtier nixl ≥ 0.6× a raw NIXL WRITE's throughput, {mib} MiB"))
    if "seed" in systems:
        for s in systems:
            if s == "seed":
                continue
            for mib in sizes:
                out.append(target("<=", 1.0, med(_paired(samples, mib, s, "seed", "submit_store_cpu_s")),
                                  f"{s}: engine-thread CPU per submit_store ≤ vLLM p2p's, {mib} MiB"))
                for side in ("prod", "cons"):
                    out.append(target("<=", 1.0, med(_paired(samples, mib, s, "seed", f"cpu_{side}_s")),
                                      f"{s}: {'producer' if side == 'prod' else 'consumer'} CPU s/GB "
                                      f"≤ vLLM p2p's, {mib} MiB"))
    return out


def render(res: dict[str, Any]) -> str:
    """The result as markdown: hand-off time, engine time per submit_store, CPU s/GB, late fetch."""
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in res["rows"])]
    cols = [c for c in (*systems, "raw_nixl", "raw_zmq", "copy") if any(r["system"] == c for r in res["rows"])]
    names = {"seed": "vLLM p2p (NIXL)", "kvtier_nixl": "kvtier nixl", "kvtier_zmq": "kvtier zmq",
             "raw_nixl": "raw NIXL WRITE", "raw_zmq": "raw pyzmq", "copy": "`copy_`"}
    by = {(r["mib"], r["system"]): r for r in res["rows"]}
    sizes = sorted({r["mib"] for r in res["rows"]})

    def ms(x: float) -> str:
        return f"{x * 1e3:.2f} ms" if x < 0.1 else f"{x * 1e3:.1f} ms"

    def us(x: float) -> str:
        return f"{x * 1e6:.0f} µs"

    where = "two network namespaces, UCX over tcp on a veth" if res.get("two_hosts") else "one host"
    lines = [f"P0 ({'quick' if res['quick'] else 'full'}, {where}, {res['rounds']} interleaved rounds, 1 MiB blocks; "
             f"median (min–max))", "",
             "| consumer `submit_load` → result | " + " | ".join(names[c] for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for mib in sizes:
        cells = []
        for c in cols:
            r = by.get((mib, c))
            cells.append("—" if r is None else f"{ms(r['load_s']['median'])} ({ms(r['load_s']['min'])}–{ms(r['load_s']['max'])})")
        lines.append(f"| {mib} MiB | " + " | ".join(cells) + " |")
    notes = [f"{mib} MiB {ms(by[(mib, 'raw_nixl')]['notified_s']['median'])}" for mib in sizes
             if "notified_s" in by.get((mib, "raw_nixl"), {})]
    if notes:
        lines += ["", "raw NIXL WRITE is the producer's post → `DONE`; its notification reached the consumer "
                  "(post → `get_new_notifs`, median): " + ", ".join(notes) + "."]
    lines += ["", "| engine thread in `tier.submit_store`: wall / CPU | " + " | ".join(names[s] for s in systems) + " |",
              "|---|" + "---|" * len(systems)]
    for mib in sizes:
        lines.append(f"| {mib} MiB | " + " | ".join(
            f"{us(by[(mib, s)]['submit_store_s']['median'])} / {us(by[(mib, s)]['submit_store_cpu_s']['median'])}"
            for s in systems) + " |")
    lines += ["", "| CPU s per GB: producer / consumer | " + " | ".join(names[s] for s in systems) + " |",
              "|---|" + "---|" * len(systems)]
    for mib in sizes:
        lines.append(f"| {mib} MiB | " + " | ".join(
            f"{by[(mib, s)]['cpu_s_per_gb']['producer']:.2f} / {by[(mib, s)]['cpu_s_per_gb']['consumer']:.2f}"
            for s in systems) + " |")
    hop_systems = [s for s in systems if any("hops_s" in by.get((m, s), {}) for m in sizes)]
    if hop_systems:
        lines += ["", "| where kvtier's hand-off time goes, median ms (" + ", ".join(
            f"{names[s]}" for s in hop_systems) + ") | " + " | ".join(f"{m} MiB" for m in sizes) + " |",
            "|---|" + "---|" * len(sizes)]
        for s in hop_systems:
            for k, text in HOPS:
                lines.append(f"| {names[s]}: {text} | " + " | ".join(
                    f"{by[(m, s)]['hops_s'][k]['median'] * 1e3:.2f}" if k in by.get((m, s), {}).get("hops_s", {})
                    else "—" for m in sizes) + " |")
    lines += phase_table(by, sizes, names)
    big = max(sizes)
    thr = {s: by[(big, s)].get("thread_cpu_s_per_gb") for s in systems if by.get((big, s))}
    if any(thr.values()):
        lines += ["", f"| CPU s per GB by thread, {big} MiB (producer; consumer) | " + " | ".join(
            names[s] for s in systems) + " |", "|---|" + "---|" * len(systems)]
        for side in ("producer", "consumer"):
            groups = sorted({g for s in systems for g in (thr.get(s) or {}).get(side, {})})
            for g in groups:
                lines.append(f"| {side}: {g} | " + " | ".join(
                    f"{(thr.get(s) or {}).get(side, {}).get(g, 0.0):.3f}" for s in systems) + " |")
    if res.get("late_s"):
        lines += ["", "| late fetch (reaped id): `submit_load` → failed result | " + " | ".join(
            names[s] for s in systems if s in res["late_s"]) + " |", "|---|" + "---|" * len(res["late_s"])]
        lines.append("| median (min–max) | " + " | ".join(
            f"{ms(v['median'])} ({ms(v['min'])}–{ms(v['max'])})" for s, v in res["late_s"].items()) + " |")
    if res.get("targets"):
        lines += ["", "| target (median of per-round paired ratios) | achieved | met |", "|---|---|---|"]
        for t in res["targets"]:
            a = t["achieved"]
            lines.append(f"| {t['text']} | {'—' if a is None else f'{a:.2f}'} | "
                         f"{'—' if t['met'] is None else ('yes' if t['met'] else 'no')} |")
    m = res["machine"]
    nz = res.get("noise", {})
    lines += ["", f"other processes kept {nz.get('others_cores', float('nan')):.2f} cores busy on average during the run."]
    lines += ["", f"{m.get('affinity')} CPUs ({m.get('cpu_model')}), load average at start "
                  f"{m.get('loadavg_at_start')}; wall {res['wall_s']:.0f} s. The machine is shared: figures move "
                  "with other developers' load."]
    return "\n".join(lines)


def unavailable() -> str | None:
    """Why P0 cannot run here (NIXL or vLLM 0.33.0's p2p tier missing), or None."""
    try:
        import importlib

        importlib.import_module("nixl_cu12")
    except ImportError as exc:
        return f"NIXL (nixl-cu12) is not installed: {exc}"
    try:
        from vllm.v1.kv_offload.tiering.p2p.manager import P2PSecondaryTierManager  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a half-installed stack raises TypeError and the like
        return f"vLLM 0.33.0's p2p tier is not importable: {exc!r}"
    return None


def run_p0(quick: bool, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The suite's entry (``python -m bench --only P0``): one host, every system; skipped with
    the reason when NIXL or vLLM's p2p tier is missing."""
    why = unavailable()
    if why is not None:
        return {"P0": {"id": "P0", "title": TITLE, "status": "skipped", "reason": why}}
    res = run(quick, log)
    res["method"] = render(res)
    return {"P0": res}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.seed", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 and 8 MiB only, 3 rounds, 1 late round")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 9; quick 3)")
    ap.add_argument("--late-rounds", type=int, default=None, help="late-fetch rounds (default 3; quick 1)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--json", default=None, help="also write the result record here")
    ap.add_argument("--two-hosts", action="store_true",
                    help="producer and consumer in two network namespaces, NIXL over UCX tcp (root)")
    ap.add_argument("--sizes", default=None, help="comma-separated MiB per request (default 1,8,64,256)")
    ap.add_argument("--batch-mib", type=float, default=None, help="kvtier's largest batch (measuring it)")
    ap.add_argument("--tail-mib", type=float, default=None, help="kvtier's last batch (measuring it)")
    ap.add_argument("--window-mib", type=float, default=None, help="the NIXL plane's window (measuring it)")
    a = ap.parse_args(argv)
    mib = (lambda x: None if x is None else int(x * MiB))
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        ap.error(f"unknown systems {bad}; choose from {','.join(SYSTEMS)}")
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else None
    res = run(a.quick, lambda m: print(m, file=sys.stderr, flush=True), a.rounds, a.late_rounds, systems,
              two_hosts=a.two_hosts, sizes=sizes, batch_bytes=mib(a.batch_mib), tail_bytes=mib(a.tail_mib),
              window_bytes=mib(a.window_mib))
    res["plan"] = {"batch_mib": a.batch_mib, "tail_mib": a.tail_mib, "window_mib": a.window_mib}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
