"""An in-process producer/consumer pair for tests of code that drives kvtier: two real
:class:`~kvtier.manager.KvTierManager` instances on an :class:`~kvtier.testing.inproc.InprocNetwork`,
one :class:`~kvtier.testing.clock.VirtualClock`, nothing running unless the test steps it.

    pair = VirtualPair({"unbound_store_timeout_s": 60.0})
    pair.P.submit_store(...); pair.C.submit_load(...)
    pair.step()              # deliver until the network is quiet (time stands still)
    pair.advance(30.0)       # move time in 0.25 s ticks, stepping after each
    result = pair.cjobs.one(job_id)
    pair.close()

No threads, no sockets, no sleeps; the managers are the real ones (core, shell, zmq-plane
bookkeeping), only the transport and the clock are doubles.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kvtier.api import JobResult, RequestContext
from kvtier.manager import KvTierManager
from kvtier.testing.clock import VirtualClock
from kvtier.testing.inproc import InprocNetwork, InprocTransport

__all__ = ["Jobs", "VirtualPair"]


class Jobs:
    """Every result a manager reported, per job id (a list, so a duplicate is visible)."""

    def __init__(self, mgr: KvTierManager) -> None:
        self.mgr = mgr
        self.by_id: dict[int, list[JobResult]] = defaultdict(list)

    def pump(self) -> None:
        """Collect what :meth:`KvTierManager.get_finished_jobs` has now."""
        for r in self.mgr.get_finished_jobs():
            self.by_id[r.job_id].append(r)

    def has(self, *job_ids: int) -> bool:
        return all(self.by_id.get(j) for j in job_ids)

    def one(self, job_id: int) -> JobResult:
        """The job's one result.

        Raises:
            AssertionError: the job has no result yet, or more than one.
        """
        got = self.by_id.get(job_id, [])
        assert len(got) == 1, f"job {job_id}: expected exactly one result, got {got}"
        return got[0]

    def total(self) -> int:
        return sum(len(v) for v in self.by_id.values())


class VirtualPair:
    """A producer manager and a consumer manager in this process, on an InprocNetwork, driven by
    one VirtualClock.  Nothing happens unless the test steps it: :meth:`step` delivers messages
    until the network is quiet (time does not move), :meth:`advance_to` moves time in small
    increments (so heartbeats flow as they would) and steps after each.

    Managers named in :attr:`frozen` (``"P"``/``"C"``) are not polled: a wedged process.
    ``p_transport(network, address)`` builds the producer's transport (default: InprocTransport).
    ``consumer_fill``: a byte every consumer slot starts as (``None``: the pool's zeroes), so a
    test can tell a slot that was never written.

    A store or landing of more than 64 KiB runs on the manager's digest pool, real threads beside
    the virtual clock: a step may come before they finish, and time moved meanwhile counts against
    the fetch.  Give ``{"digest_threads": 0}`` in ``p_cfg``/``c_cfg`` to keep every byte on the
    test's thread.
    """

    P_ADDR = "prod:1"
    C_ADDR = "cons:1"

    def __init__(
        self,
        p_cfg: dict | None = None,
        c_cfg: dict | None = None,
        *,
        num_blocks: int = 16,
        block_bytes: int = 64,
        p_transport: Callable[[Any, str], Any] | None = None,
        consumer_fill: int | None = None,
    ) -> None:
        self.clock = VirtualClock()
        self.net = InprocNetwork()
        self.num_blocks, self.block_bytes = num_blocks, block_bytes
        self.p_cfg, self.c_cfg = dict(p_cfg or {}), dict(c_cfg or {})
        self.frozen: set[str] = set()
        self.P = self._make(self.p_cfg, self.P_ADDR, p_transport(self.net, self.P_ADDR) if p_transport else None)
        self.C = self._make(self.c_cfg, self.C_ADDR, None)
        if consumer_fill is not None:
            self.C.pool.tensor.fill_(consumer_fill)
        self.pjobs, self.cjobs = Jobs(self.P), Jobs(self.C)

    def _make(self, cfg: dict, addr: str, transport: Any) -> KvTierManager:
        from kvtier.memory import BlockPool

        return KvTierManager(
            cfg,
            BlockPool(self.num_blocks, self.block_bytes, pin=False),
            clock=self.clock.now,
            transport=transport if transport is not None else InprocTransport(self.net, addr),
        )

    def creq(self, req_id: str, kv_id: str) -> RequestContext:
        """A consumer request that loads ``kv_id`` from this pair's producer (``prod:1``)."""
        return RequestContext(req_id=req_id, kv_transfer_params={
            "remote_prefiller": {"kv_request_id": kv_id, "remote_host": "prod", "remote_port": 1}})

    @property
    def now(self) -> float:
        return self.clock.now()

    def _live(self) -> list[tuple[str, KvTierManager, Jobs]]:
        out = []
        for name, m, j in (("P", self.P, self.pjobs), ("C", self.C, self.cjobs)):
            if m is not None and name not in self.frozen and not m.transport.closed:
                out.append((name, m, j))
        return out

    def step(self, max_rounds: int = 64) -> None:
        """Deliver and process messages until no inbox holds anything (time stands still)."""
        for _ in range(max_rounds):
            live = self._live()
            for _, m, j in live:
                m.poll(0)
                j.pump()
            if all(m.transport.inbox_size() == 0 for _, m, _ in live):
                return

    def advance_to(self, t: float, tick: float = 0.25) -> None:
        """Move the clock to ``t`` (seconds) in steps of ``tick``, stepping after each."""
        while self.clock.now() < t:
            self.clock.set(min(t, self.clock.now() + tick))
            self.step()

    def advance(self, dt: float, tick: float = 0.25) -> None:
        self.advance_to(self.clock.now() + dt, tick)

    def stop(self, name: str) -> None:
        """The whole process ``name`` (``"P"``/``"C"``) stops, as under SIGSTOP: it is not polled,
        and what reaches it waits in its kernel (``io_lag``).  After :meth:`cont` its loop runs
        before its transport's threads take that in (the order that lets a deadline beat input
        unless the loop crosses the transport's barrier first, decision T17)."""
        self.frozen.add(name)
        (self.P if name == "P" else self.C).transport.io_lag = True

    def cont(self, name: str) -> None:
        """The stopped process ``name`` runs again (its transport still lags until it waits or
        crosses the barrier)."""
        self.frozen.discard(name)

    def crash_producer(self) -> None:
        """The producer's process dies: no goodbye, its queues are lost."""
        self.net.kill(self.P_ADDR)
        self.P = None  # type: ignore[assignment]

    def restart_producer(self, cfg: dict | None = None) -> KvTierManager:
        """A new producer process listens on the same address (after a crash or a shutdown)."""
        if self.P is not None and not self.P.transport.closed:
            self.crash_producer()
        self.P = self._make(dict(cfg if cfg is not None else self.p_cfg), self.P_ADDR, None)
        self.pjobs = Jobs(self.P)
        return self.P

    def close(self) -> None:
        """Shut both managers down (what a test's teardown calls)."""
        for m in (self.P, self.C):
            if m is not None:
                m.shutdown()
