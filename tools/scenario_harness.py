"""The scenarios' harness (:mod:`tools.scenarios`): a producer and a consumer engine, each a real
:class:`~kvtier.manager.KvTierManager` over the recording transport, on one virtual clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.api import JobResult, LookupResult, RequestContext, TransferJob
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.testing.clock import VirtualClock
from kvtier.testing.inproc import InprocNetwork
from tools.scenario_record import SCEN_CFG, SENTINEL, RecordingCore, RecordingTransport, ScenarioFailed, Trace
from tools.spec import Spec, load

# -- engines and the harness ------------------------------------------------------------------------


class Engine:
    """The recorded engine side of one manager: every call is added to the trace before it is
    made, every job result when the engine collects it (:meth:`collect`)."""

    def __init__(self, h: Harness, lane: str, mgr_lane: str) -> None:
        self.h = h
        self.lane = lane
        self.mgr_lane = mgr_lane
        self.results: dict[int, list[JobResult]] = {}
        self.submitted: list[int] = []
        self.killed = False  # its manager's process died: outstanding jobs died with it

    @property
    def mgr(self) -> KvTierManager:
        return self.h.P if self.mgr_lane == "P" else self.h.C

    def _call(self, label: str) -> None:
        self.h.trace.add(self.lane, self.mgr_lane, label, "call")

    def request(self, req_id: str, kv_id: str) -> RequestContext:
        """``on_new_request`` for a producer (prefill) or consumer (decode) request of ``kv_id``."""
        if self.mgr_lane == "P":
            req = RequestContext(req_id=req_id, kv_transfer_params={"remote_decoder": {"kv_request_id": kv_id}})
        else:
            host, port = self.h.P_ADDR.split(":")
            req = RequestContext(req_id=req_id, kv_transfer_params={
                "remote_prefiller": {"kv_request_id": kv_id, "remote_host": host, "remote_port": int(port)}})
        self._call(f"on_new_request({kv_id})")
        self.mgr.on_new_request(req)
        return req

    def store(self, job_id: int, req: RequestContext, keys: Sequence[bytes], slots: Sequence[int], *,
              seed: int = 1, first: int = 0) -> None:
        """Fill ``slots`` with blocks ``first``, ``first + 1`` … of pattern ``seed`` and
        ``submit_store`` them under ``keys``."""
        pool = self.mgr.pool
        for i, s in enumerate(slots):
            pool.write(s, _pattern(seed, first + i, pool.block_bytes))
        kid = _kid(req)
        self._call(f"submit_store(job {job_id}: {kid}, {len(keys)} block{'s' if len(keys) != 1 else ''})")
        self.submitted.append(job_id)
        self.mgr.submit_store(TransferJob(job_id=job_id, keys=tuple(keys), slots=tuple(slots), req=req))

    def load(self, job_id: int, req: RequestContext, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        self._call(f"submit_load(job {job_id}: {_kid(req)}, {len(keys)} block{'s' if len(keys) != 1 else ''})")
        self.submitted.append(job_id)
        self.mgr.submit_load(TransferJob(job_id=job_id, keys=tuple(keys), slots=tuple(slots), req=req))

    def finish(self, req: RequestContext) -> None:
        self._call(f"on_request_finished({_kid(req)})")
        self.mgr.on_request_finished(req)

    def lookup(self, req: RequestContext, key: bytes) -> LookupResult:
        return self.mgr.lookup(key, req)

    def drain(self) -> None:
        self._call("drain_jobs()")
        self.mgr.drain_jobs(timeout_s=5.0)
        self.collect()

    def shutdown(self) -> None:
        self._call("shutdown()")
        self.mgr.shutdown()
        self.collect()

    def collect(self) -> None:
        """``get_finished_jobs`` (which also polls once), recording each result."""
        mgr = self.mgr
        if mgr is None:
            return
        for r in mgr.get_finished_jobs():
            self.results.setdefault(r.job_id, []).append(r)
            text = "ok" if r.success else f"failed ({r.reason})"
            self.h.trace.add(self.mgr_lane, self.lane, f"job {r.job_id} {text}", "result")

    def outcome(self, job_id: int) -> tuple[bool, str | None] | None:
        """``(success, reason)`` of the job's one result, None if it has none yet.

        Raises:
            ScenarioFailed: the job got more than one result.
        """
        got = self.results.get(job_id, [])
        if len(got) > 1:
            raise ScenarioFailed(f"job {job_id} got {len(got)} results: {got}")
        return (got[0].success, got[0].reason) if got else None


def _kid(req: RequestContext) -> str:
    params = req.kv_transfer_params or {}
    sub = params.get("remote_decoder") or params.get("remote_prefiller") or {}
    return str(sub.get("kv_request_id"))


def _pattern(seed: int, index: int, nbytes: int) -> bytes:
    from tools.blocks import block_pattern

    return block_pattern(seed, index, nbytes)


class Harness:
    """A recorded producer/consumer pair on one in-memory network and one virtual clock.

    Nothing happens unless the scenario says so: :meth:`settle` delivers and processes messages
    until every inbox is empty (time stands still); :meth:`advance_to` moves time in small ticks
    (so heartbeats flow as they would) and settles after each; :meth:`poll` polls named
    managers once, for races.  Managers named in :attr:`frozen` are not polled (a wedged process).

    Args:
        p_cfg, c_cfg: config overrides for the producer / consumer (on top of :data:`SCEN_CFG`).
        block_bytes, num_blocks: pool geometry of both managers.
        p_transport, c_transport: extra :class:`InprocTransport` keyword arguments
            (``hold_completion``, ``rcvhwm``).
    """

    P_ADDR = "prod:1"
    C_ADDR = "cons:1"

    def __init__(self, p_cfg: dict | None = None, c_cfg: dict | None = None, *, block_bytes: int = 64,
                 num_blocks: int = 8, p_transport: dict | None = None, c_transport: dict | None = None,
                 spec: Spec | None = None) -> None:
        self.spec = spec if spec is not None else load()
        self.clock = VirtualClock()
        self.net = InprocNetwork()
        self.trace = Trace(self.clock)
        self.frozen: set[str] = set()
        self._lanes_by_address = {self.P_ADDR: "P", self.C_ADDR: "C"}
        peer_names = {self.P_ADDR: "with producer", "in:" + self.C_ADDR: "with consumer"}
        self.P: KvTierManager | None = self._make("P", self.P_ADDR, {**SCEN_CFG, **(p_cfg or {})},
                                                  block_bytes, num_blocks, p_transport or {}, peer_names)
        self.C: KvTierManager | None = self._make("C", self.C_ADDR, {**SCEN_CFG, **(c_cfg or {})},
                                                  block_bytes, num_blocks, c_transport or {}, peer_names)
        self.C.pool.tensor.fill_(SENTINEL)
        self.prefill = Engine(self, "pe", "P")
        self.decode = Engine(self, "ce", "C")

    def _make(self, lane: str, addr: str, cfg: dict, block_bytes: int, num_blocks: int, tkw: dict,
              peer_names: dict[str, str]) -> KvTierManager:
        transport = RecordingTransport(self.net, addr, trace=self.trace, lane=lane,
                                       lanes_by_address=self._lanes_by_address, **tkw)
        mgr = KvTierManager(cfg, BlockPool(num_blocks, block_bytes, pin=False), clock=self.clock.now,
                            transport=transport)
        RecordingCore.install(mgr.core, self.trace, lane, self.spec, peer_names)
        return mgr

    # -- driving --------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.clock.now()

    def _live(self) -> list[tuple[str, KvTierManager, Engine]]:
        out = []
        for name, m, e in (("P", self.P, self.prefill), ("C", self.C, self.decode)):
            if m is not None and name not in self.frozen and not m.transport.closed:
                out.append((name, m, e))
        return out

    def poll(self, *names: str) -> None:
        """Poll the named managers once each (in order) and collect their job results."""
        for name, m, e in self._live():
            if name in names:
                e.collect()

    def settle(self, max_rounds: int = 64) -> None:
        """Deliver and process messages until no live inbox holds anything (time stands still)."""
        for _ in range(max_rounds):
            live = self._live()
            for _, _, e in live:
                e.collect()
            if all(m.transport.inbox_size() == 0 for _, m, _ in live):
                return
        raise ScenarioFailed(f"the managers did not go quiet within {max_rounds} rounds")

    def advance_to(self, t: float, tick: float = 0.25) -> None:
        """Move the clock to ``t`` in steps of at most ``tick`` seconds, settling after each."""
        while self.clock.now() < t:
            self.clock.set(min(t, self.clock.now() + tick))
            self.settle()

    def kill(self, name: str) -> None:
        """The named manager's process dies: no goodbye; its queued sends are lost."""
        mgr = self.P if name == "P" else self.C
        lane = "P" if name == "P" else "C"
        self.trace.add(lane, lane, "process killed (no goodbye)", "note")
        self.net.kill(mgr.transport.address)
        if name == "P":
            self.P = None
            self.prefill.killed = True
        else:
            self.C = None
            self.decode.killed = True

    def note(self, lane: str, text: str) -> None:
        """A free-text note on a lane (e.g. what the scenario does next)."""
        self.trace.add(lane, lane, text, "note")

    # -- checks ---------------------------------------------------------------------------------
    def expect(self, cond: bool, what: str) -> None:
        """Raise :class:`ScenarioFailed` with ``what`` unless ``cond``; the review page lists
        every ``what`` that held."""
        if not cond:
            raise ScenarioFailed(what)
        self.trace.checks.append(what)

    def producer_state(self, kv_id: str) -> str:
        return self.P.core.producer_state(kv_id).value

    def consumer_state(self, kv_id: str) -> str:
        return self.C.core.consumer_state(kv_id).value

    def slots_hold_pattern(self, slots: Sequence[int], seed: int) -> bool:
        pool = self.C.pool
        return all(bytes(pool.buffer(s)) == _pattern(seed, i, pool.block_bytes) for i, s in enumerate(slots))

    def slots_untouched(self, slots: Sequence[int]) -> bool:
        pool = self.C.pool
        return all(bytes(pool.buffer(s)) == bytes([SENTINEL]) * pool.block_bytes for s in slots)

    def close(self) -> None:
        for m in (self.P, self.C):
            if m is not None:
                m.shutdown()
