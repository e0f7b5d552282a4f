"""Run a :class:`~kvtier.manager.KvTierManager` in a child process, driven over a Pipe.

Runtime tests need two managers in two *processes* exchanging real bytes over real sockets.
:class:`PeerProcess` starts a child with the ``spawn`` context (a fresh interpreter: no forked
zmq context, no forked torch state) and talks to it with small commands over a
``multiprocessing`` Pipe.  The child owns at most one manager (and its block pool) at a time;
:meth:`PeerProcess.start_manager` replaces it, so one child can serve many tests (a spawn costs
seconds: it imports torch).

While a manager is running and not paused, the child polls it continuously (about every 2 ms)
and collects every job result; :meth:`PeerProcess.pause` stops all polling so nothing the peer
sends is answered (a wedged process), :meth:`PeerProcess.kill` is ``kill -9``.

The child always terminates: it is a daemon, it exits when the pipe closes (the parent died) or
after ``max_lifetime_s``, and :meth:`PeerProcess.close` asks it to exit, joins with a timeout and
then kills it.

Block contents are deterministic (:func:`block_pattern`), so the parent can compute the
checksum of what a producer stored without asking it (:func:`pattern_digest`).
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "PeerError",
    "PeerProcess",
    "block_pattern",
    "pattern_digest",
    "slot_digest",
]

_CTX = mp.get_context("spawn")


class PeerError(RuntimeError):
    """A command failed inside the child; ``kind`` is the exception's class name there."""

    def __init__(self, kind: str, message: str, tb: str = "") -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.tb = tb


# -- deterministic block contents -----------------------------------------------------------------


def block_pattern(seed: int, index: int, block_bytes: int) -> bytes:
    """``block_bytes`` pseudo-random bytes determined by ``(seed, index)``.

    Different seeds or indexes give different blocks (with overwhelming probability), so a block
    that lands in the wrong slot, or a slot that is never written, is caught by a checksum.
    """
    import numpy as np

    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(index) & 0xFFFFFFFF, 0x6B76])
    return rng.integers(0, 256, size=block_bytes, dtype=np.uint8).tobytes()


def pattern_digest(seed: int, index: int, block_bytes: int) -> str:
    """sha256 hex of :func:`block_pattern`."""
    return hashlib.sha256(block_pattern(seed, index, block_bytes)).hexdigest()


def slot_digest(pool: Any, slot: int) -> str:
    """sha256 hex of one slot of a :class:`~kvtier.memory.BlockPool`."""
    return hashlib.sha256(pool.buffer(slot)).hexdigest()


# -- the child ------------------------------------------------------------------------------------


def _result_dict(r: Any) -> dict[str, Any]:
    return {
        "job_id": r.job_id,
        "success": r.success,
        "reason": r.reason,
        "transfer_bytes": r.transfer_bytes,
    }


class _Child:
    """State of the child process: one manager at a time, plus the results it produced."""

    def __init__(self) -> None:
        self.mgr: Any = None
        self.pool: Any = None
        self.paused = False
        self.results: list[dict[str, Any]] = []
        self.reqs: dict[str, Any] = {}
        self.stall_s = 0.0  # set by op_stall: the loop sleeps this long after replying

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
        if self.paused:
            with mgr._lock:
                done, mgr._results = mgr._results, []
        else:
            done = mgr.get_finished_jobs()
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
        """Drop the manager as a crash would: sockets closed, no disconnect sent, no results."""
        mgr, self.mgr = self.mgr, None
        if mgr is not None:
            mgr._closed = True  # so its finaliser-free object never touches the sockets again
            mgr.transport.close()
        self.results, self.reqs, self.paused = [], {}, False

    def op_store(
        self,
        req_id: str,
        kv_id: str,
        job_id: int,
        keys: Sequence[bytes],
        slots: Sequence[int],
        seed: int | None = None,
        fill_byte: int | None = None,
        consumer: str | None = None,
    ) -> dict[str, Any]:
        from kvtier.api import RequestContext, TransferJob

        mgr = self._need()
        req = self.reqs.get(req_id)
        if req is None:
            decoder: dict[str, Any] = {"kv_request_id": kv_id}
            if consumer is not None:
                decoder["consumer"] = consumer
            req = RequestContext(req_id=req_id, kv_transfer_params={"remote_decoder": decoder})
            mgr.on_new_request(req)
            self.reqs[req_id] = req
        self._fill(slots, seed, fill_byte)
        digests = [slot_digest(self.pool, s) for s in slots]
        mgr.submit_store(TransferJob(job_id=job_id, keys=tuple(keys), slots=tuple(slots), req=req))
        return {"digests": digests, "immediate": self._immediate(job_id)}

    def op_store_batch(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Several :meth:`op_store` calls in one command (one pipe round trip): ids stored
        together start their park clocks within milliseconds of each other."""
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
        req_id: str,
        kv_id: str,
        host: str,
        port: int,
        job_id: int,
        keys: Sequence[bytes],
        slots: Sequence[int],
        sentinel: int | None = None,
    ) -> list[dict[str, Any]]:
        from kvtier.api import TransferJob

        mgr = self._need()
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
        self.paused = True

    def op_stall(self, seconds: float) -> None:
        """After replying, the whole loop sleeps ``seconds``: no poll, no command, no lock held
        (a long engine step or GC pause, bug-scenarios B24).  libzmq's own threads keep
        receiving meanwhile, so what peers send waits in the sockets."""
        self.stall_s = float(seconds)

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
        m = core.producer if machine == "producer" else core.consumer
        return m.state_of(kv_id).value

    def op_drain(self, drain_timeout_s: float = 10.0) -> list[dict[str, Any]]:
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

    def op_exit(self) -> None:
        self.op_stop_manager()


def _child_main(
    conn: Any, max_lifetime_s: float, log_level: int, netns: str | None = None, env: Mapping[str, str] | None = None
) -> None:
    """Entry point of the child process (must stay importable for ``spawn``)."""
    import logging

    os.environ.update(env or {})  # before NIXL/UCX read it
    if netns is not None:  # before any thread or socket exists (kvtier.testing.netns)
        from kvtier.testing.netns import enter

        enter(netns, sysfs=True)

    logging.basicConfig(level=log_level, format="[peer %(process)d] %(levelname)s %(name)s: %(message)s")
    child = _Child()
    try:
        import kvtier.manager  # noqa: F401  (pay the torch import before saying ready)

        conn.send(("ready", os.getpid()))
    except (EOFError, OSError):  # the parent went away while we were starting
        return
    except BaseException as exc:  # pragma: no cover - broken environment
        try:
            conn.send(("err", type(exc).__name__, str(exc), traceback.format_exc()))
        except (EOFError, OSError):
            pass
        return
    deadline = time.monotonic() + max_lifetime_s
    try:
        while time.monotonic() < deadline:
            active = child.mgr is not None and not child.paused
            try:
                has_cmd = conn.poll(0 if active else 0.01)
            except (EOFError, OSError):
                break
            if has_cmd:
                try:
                    op, kwargs = conn.recv()
                except (EOFError, OSError):
                    break
                try:
                    value = getattr(child, "op_" + op)(**kwargs)
                    reply: tuple = ("ok", value)
                except Exception as exc:
                    reply = ("err", type(exc).__name__, str(exc), traceback.format_exc())
                try:
                    conn.send(reply)
                except (EOFError, OSError):
                    break
                if op == "exit":
                    return
                if child.stall_s > 0:
                    time.sleep(child.stall_s)
                    child.stall_s = 0.0
            if active:
                try:
                    child.step()
                except Exception:  # keep the peer alive; the parent sees it in results/logs
                    logging.getLogger("kvtier.testing.peer").exception("peer poll failed")
    finally:
        try:
            child.op_stop_manager()
        except Exception:
            pass


# -- the parent's handle --------------------------------------------------------------------------


class PeerProcess:
    """Handle on one child process running (at most) one manager.

    Args:
        name: process name (shows in ``ps``).
        max_lifetime_s: the child exits on its own after this long, whatever happens.
        log_level: logging level inside the child (its logs go to the inherited stderr).
        netns: run the child inside this network namespace (:mod:`kvtier.testing.netns`).
        env: environment variables set in the child before anything is imported (``UCX_*``;
            ``NIXL_LOG_LEVEL`` defaults to ``WARN``).

    ``start()`` returns at once (the child imports torch in the background); the first command
    waits for it to be ready.  Use as a context manager or call :meth:`close`.
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
        self.name = name
        self.netns = netns
        self.env = {"NIXL_LOG_LEVEL": "WARN", **(env or {})}
        self.defaults: dict[str, Any] = {}
        """Config keys :meth:`start_manager` puts under the test's own (e.g. ``data_plane``)."""
        self.max_lifetime_s = max_lifetime_s
        self.log_level = log_level
        self._proc: Any = None
        self._conn: Any = None
        self._ready = False
        self.pid: int | None = None
        self.address: str | None = None
        self.host: str | None = None
        self.port: int | None = None

    # -- process control -------------------------------------------------------------------------
    def start(self) -> PeerProcess:
        if self._proc is not None:
            return self
        parent, child = _CTX.Pipe(duplex=True)
        proc = _CTX.Process(
            target=_child_main, args=(child, self.max_lifetime_s, self.log_level, self.netns, self.env), name=self.name,
            daemon=True,
        )
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        if self._ready:
            return
        if self._proc is None:
            self.start()
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"{self.name}: child not ready after {timeout_s} s")
        try:
            msg = self._conn.recv()
        except EOFError:
            self.kill()
            raise EOFError(f"{self.name}: child died while starting (exit code {self._proc.exitcode})") from None
        if msg[0] != "ready":
            raise PeerError(msg[1], msg[2], msg[3])
        self.pid = msg[1]
        self._ready = True

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def call(self, op: str, *, timeout_s: float = 30.0, **kwargs: Any) -> Any:
        """Run one command in the child and return its value.

        Raises:
            PeerError: the command raised in the child.
            TimeoutError: no answer within ``timeout_s`` (the child is then killed, so a test
                never hangs on it).
            EOFError: the child is gone.
        """
        self.wait_ready()
        if not self.alive:
            raise EOFError(f"{self.name}: child process is not running")
        self._conn.send((op, kwargs))
        if not self._conn.poll(timeout_s):
            self.kill()
            raise TimeoutError(f"{self.name}: no answer to {op!r} within {timeout_s} s (child killed)")
        reply = self._conn.recv()
        if reply[0] == "ok":
            return reply[1]
        raise PeerError(reply[1], reply[2], reply[3])

    def kill(self) -> None:
        """``kill -9`` the child (no shutdown, no goodbye) and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.is_alive():
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.join(timeout=10.0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the child to shut its manager down and exit; kill it if it does not. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.is_alive() and self._ready:
                self._conn.send(("exit", {}))
                if self._conn.poll(timeout_s):
                    self._conn.recv()
        except (EOFError, OSError):
            pass
        try:
            self._conn.close()  # a child that never got "exit" sees EOF and leaves
        except OSError:
            pass
        proc.join(timeout=timeout_s)
        if proc.is_alive():
            self.kill()
        if not proc.is_alive():
            proc.close()
        self._proc = None
        self._ready = False

    def __enter__(self) -> PeerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands --------------------------------------------------------------------------------
    def start_manager(
        self, config: Mapping[str, Any], *, num_blocks: int = 64, block_bytes: int = 4096, layout: str = "raw"
    ) -> str:
        """(Re)start the child's manager with ``config`` over a fresh pool; returns its
        ``host:port`` (also in :attr:`address`, :attr:`host`, :attr:`port`)."""
        info = self.call(
            "start_manager", config={**self.defaults, **config}, num_blocks=num_blocks, block_bytes=block_bytes,
            layout=layout,
        )
        self.address, self.host, self.port = info["address"], info["host"], info["port"]
        self.metrics_address: str | None = info["metrics_address"]  # config metrics_port, else None
        return self.address

    def crash_manager(self) -> None:
        """The manager dies without a goodbye (its sockets close, nothing is sent); the process
        lives on, so a new manager can be started on the same port."""
        self.call("crash_manager")

    def stop_manager(self) -> list[dict[str, Any]]:
        """Shut the manager down; returns every result not yet fetched (shutdown failures too)."""
        return self.call("stop_manager")

    def store(
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
    ) -> dict[str, Any]:
        """Announce (once) a producer request for ``kv_id`` (naming ``consumer``, a principal, as
        the only one allowed to fetch it, if given), fill ``slots`` with :func:`block_pattern`
        (``seed``) or ``fill_byte``, submit a store job.  Returns ``{"digests": [sha256 per slot],
        "immediate": [results of this job produced at once]}``."""
        return self.call(
            "store",
            req_id=req_id or f"p-{kv_id}",
            kv_id=kv_id,
            job_id=job_id,
            keys=list(keys),
            slots=list(slots),
            seed=seed,
            fill_byte=fill_byte,
            consumer=consumer,
        )

    def load(
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
        """Announce (once) a consumer request and submit a load job into ``slots``."""
        return self.call(
            "load",
            req_id=req_id or f"c-{kv_id}",
            kv_id=kv_id,
            host=host,
            port=port,
            job_id=job_id,
            keys=list(keys),
            slots=list(slots),
            sentinel=sentinel,
        )

    def finish(self, req_id: str) -> None:
        self.call("finish", req_id=req_id)

    def results(self, *, clear: bool = True) -> list[dict[str, Any]]:
        return self.call("results", clear=clear)

    def wait_results(self, job_ids: Iterable[int], timeout_s: float = 10.0) -> dict[int, list[dict[str, Any]]]:
        """Collect results until every job in ``job_ids`` has one (or ``timeout_s``).  Returns
        job id -> every result seen for it (a list, so duplicates are visible)."""
        want = set(job_ids)
        seen: dict[int, list[dict[str, Any]]] = {}
        end = time.monotonic() + timeout_s
        while True:
            for r in self.results():
                seen.setdefault(r["job_id"], []).append(r)
            if want <= seen.keys() or time.monotonic() > end:
                return seen
            time.sleep(0.005)

    def poll_for(self, seconds: float) -> None:
        self.call("poll_for", seconds=seconds, timeout_s=seconds + 30.0)

    def store_batch(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Several :meth:`store` calls (dicts of its keyword arguments, ``req_id`` optional) in
        one command (one pipe round trip); returns their answers in order."""
        norm = []
        for it in items:
            it = dict(it)
            it.setdefault("req_id", f"p-{it['kv_id']}")
            it["keys"], it["slots"] = list(it["keys"]), list(it["slots"])
            norm.append(it)
        return self.call("store_batch", items=norm, timeout_s=120.0)

    def stall(self, seconds: float) -> None:
        """The child's loop sleeps ``seconds`` right after answering (returns at once): the
        manager is not polled, no command is read, nothing is held.  Like :meth:`pause`, but
        bounded and with the process's main thread really blocked."""
        self.call("stall", seconds=seconds)

    def pause(self) -> None:
        """Stop polling: nothing the peer receives is processed, no deadline fires."""
        self.call("pause")

    def resume(self) -> None:
        self.call("resume")

    def digests(self, slots: Sequence[int]) -> list[str]:
        return self.call("digests", slots=list(slots))

    def fill(self, slots: Sequence[int], fill_byte: int) -> None:
        self.call("fill", slots=list(slots), fill_byte=fill_byte)

    def stats(self) -> dict[str, float]:
        return self.call("stats")

    def plane(self) -> dict[str, Any]:
        """The manager's data plane: ``{"name", "posts", "referenced"}``."""
        return self.call("plane")

    def corrupt(self, slot: int, offset: int = 0) -> None:
        """Flip one byte of pool slot ``slot`` (e.g. after it was parked)."""
        self.call("corrupt", slot=slot, offset=offset)

    def state(self, kv_id: str, machine: str = "producer") -> str:
        return self.call("state", kv_id=kv_id, machine=machine)

    def drain(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """``drain_jobs`` in the child; returns the results collected afterwards."""
        return self.call("drain", drain_timeout_s=timeout_s, timeout_s=timeout_s + 20.0)
