"""Run a :class:`~kvtier.manager.KvTierManager` in a child process (:class:`PeerProcess`).

Runtime tests need two managers in two *processes* exchanging real bytes over real sockets.
:class:`PeerProcess` is a :class:`tools.child.Child` whose handler, :class:`PeerHandler`, owns at
most one manager (and its block pool) at a time; the test calls the handler's ``op_*`` methods by
name (``peer.store(...)`` is ``op_store`` in the child).  :meth:`PeerProcess.start_manager`
replaces the manager, so one child can serve many tests (a spawn costs seconds: it imports torch).

While a manager is running and not paused, the child polls it continuously (about every 2 ms)
and collects every job result; ``pause`` stops all polling so nothing the peer sends is answered
(a wedged process), :meth:`~tools.child.Child.kill` is ``kill -9``.

The child always terminates: it is a daemon, it exits when the pipe closes (the parent died) or
after ``max_lifetime_s``, and :meth:`~tools.child.Child.close` asks it to exit, joins with a
timeout and then kills it.

Block contents are deterministic (:func:`tools.blocks.block_pattern`), so the parent can compute
the checksum of what a producer stored without asking it (:func:`tools.blocks.pattern_digest`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tools.blocks import block_pattern, pattern_digest, slot_digest
from tools.child import Child
from tools.coreview import CoreView

__all__ = ["PeerHandler", "PeerProcess", "block_pattern", "pattern_digest", "slot_digest"]


# -- the child ------------------------------------------------------------------------------------


def _result_dict(r: Any) -> dict[str, Any]:
    return {
        "job_id": r.job_id,
        "success": r.success,
        "reason": r.reason,
        "transfer_bytes": r.transfer_bytes,
    }


class PeerHandler:
    """The child's side: one manager at a time, plus the results it produced.

    Args:
        log_level: logging level inside the child (its logs go to the inherited stderr).
        netns: enter this network namespace first (:mod:`tests.support.netns`), before any
            thread or socket exists.
    """

    def __init__(self, log_level: int = 30, netns: str | None = None) -> None:
        if netns is not None:
            from tests.support.netns import enter

            enter(netns, sysfs=True)
        logging.basicConfig(level=log_level, format="[peer %(process)d] %(levelname)s %(name)s: %(message)s")
        import kvtier.manager  # noqa: F401  (pay the torch import before saying ready)

        self.mgr: Any = None
        self.pool: Any = None
        self.paused = False
        self.results: list[dict[str, Any]] = []
        self.reqs: dict[str, Any] = {}
        self.stall_s = 0.0  # set by op_stall: the loop sleeps this long after replying
        self.stall_until, self.stall_max_s = "", 0.0  # op_stall_until: then until this file exists

    # -- helpers ---------------------------------------------------------------------------------
    def _need(self) -> Any:
        if self.mgr is None:
            raise RuntimeError("no manager running (call start_manager first)")
        return self.mgr

    def collect(self) -> None:
        """Move the manager's job results here.  While paused the manager is not polled (that
        would answer the peer): only results an engine call already produced are taken."""
        mgr = self.mgr
        if mgr is None:
            return
        done = mgr.get_finished_jobs(poll=not self.paused)
        self.results.extend(_result_dict(r) for r in done)

    def step(self) -> None:
        if self.mgr is not None and not self.paused:
            self.mgr.poll(0.002)
            self.collect()

    def _fill(self, slots: Sequence[int], seed: int | None, fill_byte: int | None) -> None:
        bb = self.pool.block_bytes
        for i, s in enumerate(slots):
            if seed is not None:
                self.pool.write(s, block_pattern(seed, i, bb))
            elif fill_byte is not None:
                self.pool.view(s).fill_(fill_byte)

    # -- commands --------------------------------------------------------------------------------
    def op_start_manager(
        self, config: Mapping[str, Any], num_blocks: int, block_bytes: int, layout: str = "raw"
    ) -> dict[str, Any]:
        from kvtier.manager import KvTierManager
        from kvtier.memory import BlockPool

        self.op_stop_manager()
        self.pool = BlockPool(num_blocks, block_bytes, pin=False)
        self.mgr = KvTierManager(dict(config), self.pool, layout=layout)
        self.paused = False
        self.results = []
        self.reqs = {}
        return {"port": self.mgr.port, "host": self.mgr.host, "address": self.mgr.address,
                "metrics_address": self.mgr.metrics_address}

    def op_stop_manager(self) -> list[dict[str, Any]]:
        """Shut the manager down; returns every result not yet fetched (shutdown failures too)."""
        out: list[dict[str, Any]] = []
        if self.mgr is not None:
            mgr, self.mgr = self.mgr, None
            try:
                mgr.shutdown()
            finally:
                out = self.results + [_result_dict(r) for r in mgr.get_finished_jobs()]
                self.results = []
                self.paused = False
                self.reqs = {}
        return out

    def op_crash_manager(self) -> None:
        """Drop the manager as a crash would: sockets closed, no disconnect sent, no results; the
        process lives on, so a new manager can be started on the same port."""
        mgr, self.mgr = self.mgr, None
        if mgr is not None:
            mgr.close_abruptly()
        self.results, self.reqs, self.paused = [], {}, False

    def op_store(
        self,
        kv_id: str,
        job_id: int,
        keys: Sequence[bytes],
        slots: Sequence[int],
        *,
        seed: int | None = None,
        fill_byte: int | None = None,
        req_id: str | None = None,
        consumer: str | None = None,
        life: str | None = None,
    ) -> dict[str, Any]:
        """Announce (once) a producer request for ``kv_id`` (``req_id``, default ``p-<kv_id>``;
        naming ``consumer``, a principal, as the only one allowed to fetch it, and ``life``, the
        pairing's life, if given), fill
        ``slots`` with :func:`block_pattern` (``seed``) or ``fill_byte``, submit a store job.
        Returns ``{"digests": [sha256 per slot], "immediate": [results of this job produced at
        once]}`` once the store reached the manager's core (a large store's digests are taken on
        its digest pool first; unless paused, this polls until then)."""
        from kvtier.api import RequestContext, TransferJob

        mgr = self._need()
        req_id = req_id or f"p-{kv_id}"
        req = self.reqs.get(req_id)
        if req is None:
            decoder: dict[str, Any] = {"kv_request_id": kv_id}
            if consumer is not None:
                decoder["consumer"] = consumer
            if life is not None:
                decoder["life"] = life
            req = RequestContext(req_id=req_id, kv_transfer_params={"remote_decoder": decoder})
            mgr.on_new_request(req)
            self.reqs[req_id] = req
        self._fill(slots, seed, fill_byte)
        digests = [slot_digest(self.pool, s) for s in slots]
        mgr.submit_store(TransferJob(job_id=job_id, keys=tuple(keys), slots=tuple(slots), req=req))
        deadline = time.monotonic() + 30.0
        while not self.paused and job_id in mgr.jobs_in_flight(kv_id) and time.monotonic() < deadline:
            view = CoreView(mgr.core).producer(kv_id)
            if view is not None and job_id in view.jobs:
                break
            mgr.poll(0.0005)
        return {"digests": digests, "immediate": self._immediate(job_id)}

    def op_store_batch(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Several :meth:`op_store` calls (dicts of its keyword arguments) in one command (one pipe
        round trip), answered in order: ids stored together start their park clocks within
        milliseconds of each other."""
        return [self.op_store(**dict(it)) for it in items]

    def _immediate(self, job_id: int) -> list[dict[str, Any]]:
        """Results of ``job_id`` produced by the submit call itself (handed over here and not
        again by ``results``); other results stay queued."""
        self.collect()
        mine = [r for r in self.results if r["job_id"] == job_id]
        self.results = [r for r in self.results if r["job_id"] != job_id]
        return mine

    def op_announce(self, req_id: str, kv_id: str, host: str, port: int) -> str:
        from kvtier.api import RequestContext

        mgr = self._need()
        req = RequestContext(
            req_id=req_id,
            kv_transfer_params={"remote_prefiller": {"kv_request_id": kv_id, "remote_host": host, "remote_port": port}},
        )
        role = mgr.on_new_request(req)
        self.reqs[req_id] = req
        return role

    def op_load(
        self,
        kv_id: str,
        job_id: int,
        keys: Sequence[bytes],
        slots: Sequence[int],
        *,
        host: str,
        port: int,
        sentinel: int | None = None,
        req_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Announce (once) a consumer request (``req_id``, default ``c-<kv_id>``) fetching from
        ``host:port`` and submit a load job into ``slots`` (first filled with ``sentinel``, if
        given); returns this job's results produced at once."""
        from kvtier.api import TransferJob

        mgr = self._need()
        req_id = req_id or f"c-{kv_id}"
        if req_id not in self.reqs:
            self.op_announce(req_id, kv_id, host, port)
        if sentinel is not None:
            self._fill(slots, None, sentinel)
        mgr.submit_load(TransferJob(job_id=job_id, keys=tuple(keys), slots=tuple(slots), req=self.reqs[req_id]))
        return self._immediate(job_id)

    def op_finish(self, req_id: str) -> None:
        req = self.reqs.pop(req_id, None)
        if req is not None:
            self._need().on_request_finished(req)

    def op_results(self, clear: bool = True) -> list[dict[str, Any]]:
        self.collect()
        out = list(self.results)
        if clear:
            self.results = []
        return out

    def op_poll_for(self, seconds: float) -> None:
        """Poll for ``seconds`` even while paused (a single-step of a wedged peer)."""
        mgr = self._need()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            mgr.poll(0.002)
        self.results.extend(_result_dict(r) for r in mgr.get_finished_jobs())

    def op_pause(self) -> None:
        """Stop polling: nothing the peer receives is processed, no deadline fires."""
        self.paused = True

    def op_stall(self, seconds: float) -> None:
        """After replying, the whole child sleeps ``seconds`` (the call returns at once): no poll,
        no command, no lock held (a long engine step or GC pause, bug-scenarios B24).  Like
        ``pause``, but bounded and with the main thread really blocked.  libzmq's own threads
        keep receiving meanwhile, so what peers send waits in the sockets."""
        self.stall_s = float(seconds)

    def op_stall_until(self, seconds: float, path: str, max_s: float = 60.0) -> None:
        """As :meth:`op_stall`, then on until ``path`` exists (at most ``max_s``): a stall that
        ends only once the test made its premise true (what it sends arrived meanwhile), however
        slowly a loaded host let it get there."""
        self.stall_s, self.stall_until, self.stall_max_s = float(seconds), path, float(max_s)

    def op_resume(self) -> None:
        self.paused = False

    def op_digests(self, slots: Sequence[int]) -> list[str]:
        return [slot_digest(self.pool, s) for s in slots]

    def op_fill(self, slots: Sequence[int], fill_byte: int) -> None:
        self._fill(slots, None, fill_byte)

    def op_stats(self) -> dict[str, float]:
        return dict(self._need().stats())

    def op_state(self, kv_id: str, machine: str = "producer") -> str:
        core = self._need().core
        state = core.producer_state(kv_id) if machine == "producer" else core.consumer_state(kv_id)
        return state.value

    def op_session_state(self, peer: str) -> str:
        """The state of this manager's session with ``peer`` (``absent`` when none)."""
        return CoreView(self._need().core).session_state(peer).value

    def op_drain(self, drain_timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """``drain_jobs`` in the child; returns the results collected afterwards."""
        mgr = self._need()
        mgr.drain_jobs(timeout_s=drain_timeout_s)
        self.collect()
        out, self.results = self.results, []
        return out

    def op_pid(self) -> int:
        return os.getpid()

    def op_plane(self) -> dict[str, Any]:
        """The data plane's name and counters: ``posts`` (zmq: block_data messages sent; nixl:
        WRITEs posted), ``referenced`` transfers."""
        plane = self._need().plane
        return {"name": plane.name, "posts": plane.posts, "referenced": plane.referenced()}

    def op_corrupt(self, slot: int, offset: int = 0) -> None:
        """Flip one byte of a pool slot in place (after it was parked: its digest is stale)."""
        buf = self.pool.buffer(slot)
        buf[offset] ^= 0xFF

    # -- the child loop's hooks (tools.child) -------------------------------------------------------
    def wait(self, conn: Any) -> None:
        """Between commands: sleep out a stall, then poll the manager (unless paused) until a
        command is waiting."""
        if self.stall_s > 0:
            time.sleep(self.stall_s)
            end = time.monotonic() + self.stall_max_s
            while self.stall_until and not os.path.exists(self.stall_until) and time.monotonic() < end:
                time.sleep(0.01)  # the whole child, still: no poll, no command
            self.stall_s, self.stall_until = 0.0, ""
        while not conn.poll(0 if self.mgr is not None and not self.paused else 0.01):
            if self.mgr is None or self.paused:
                return  # let the loop look at its lifetime
            try:
                self.step()
            except Exception:  # keep the peer alive; the parent sees it in results/logs
                logging.getLogger("tests.support.peer").exception("peer poll failed")

    def close(self) -> None:
        self.op_stop_manager()


# -- the parent's handle --------------------------------------------------------------------------


class PeerProcess(Child):
    """Handle on one child process running (at most) one manager: a :class:`~tools.child.Child`
    of :class:`PeerHandler`; every ``op_*`` of the handler is a method here (``peer.store(...)``).

    Args:
        name: process name (shows in ``ps``).
        max_lifetime_s: the child exits on its own after this long, whatever happens.
        log_level: logging level inside the child (its logs go to the inherited stderr).
        netns: run the child inside this network namespace (:mod:`tests.support.netns`).
        env: environment variables set in the child before anything is imported (``UCX_*``;
            ``NIXL_LOG_LEVEL`` defaults to ``WARN``).

    ``start()`` returns at once (the child imports torch in the background); the first command
    waits for it to be ready.  Commands time out after 30 s unless they say otherwise.
    """

    def __init__(
        self,
        name: str = "kvtier-peer",
        *,
        max_lifetime_s: float = 600.0,
        log_level: int = 30,
        netns: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(__name__, "PeerHandler", {"log_level": log_level, "netns": netns}, name=name,
                         env={"NIXL_LOG_LEVEL": "WARN", **(env or {})}, max_lifetime_s=max_lifetime_s,
                         call_timeout_s=30.0)
        self.netns = netns
        self.defaults: dict[str, Any] = {}
        """Config keys :meth:`start_manager` puts under the test's own (e.g. ``data_plane``)."""
        self.address: str | None = None
        self.host: str | None = None
        self.port: int | None = None
        self.metrics_address: str | None = None

    def start_manager(
        self, config: Mapping[str, Any], *, num_blocks: int = 64, block_bytes: int = 4096, layout: str = "raw"
    ) -> str:
        """(Re)start the child's manager with ``config`` over a fresh pool; returns its
        ``host:port`` (also in :attr:`address`, :attr:`host`, :attr:`port`; the metrics endpoint,
        with config ``metrics_port``, in :attr:`metrics_address`)."""
        info = self.call(
            "start_manager", config={**self.defaults, **config}, num_blocks=num_blocks, block_bytes=block_bytes,
            layout=layout,
        )
        self.address, self.host, self.port = info["address"], info["host"], info["port"]
        self.metrics_address = info["metrics_address"]
        return self.address

    def wait_results(self, job_ids: Iterable[int], timeout_s: float = 10.0) -> dict[int, list[dict[str, Any]]]:
        """Collect results until every job in ``job_ids`` has one (or ``timeout_s``).  Returns
        job id -> every result seen for it (a list, so duplicates are visible)."""
        want = set(job_ids)
        seen: dict[int, list[dict[str, Any]]] = {}
        end = time.monotonic() + timeout_s
        while True:
            for r in self.call("results"):
                seen.setdefault(r["job_id"], []).append(r)
            if want <= seen.keys() or time.monotonic() > end:
                return seen
            time.sleep(0.005)

    def poll_for(self, seconds: float) -> None:
        """Poll the manager for ``seconds``, even while paused (a single-step of a wedged peer)."""
        self.call("poll_for", seconds, timeout_s=seconds + 30.0)

    def drain(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """``drain_jobs(timeout_s)`` in the child; returns the results collected afterwards."""
        return self.call("drain", drain_timeout_s=timeout_s, timeout_s=timeout_s + 20.0)

    def store_batch(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``op_store_batch`` with a longer timeout (a batch may fill many blocks)."""
        return self.call("store_batch", [dict(it) for it in items], timeout_s=120.0)
