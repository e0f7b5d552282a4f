"""Scenarios recorded from real runs: two ``KvTierManager`` s, one virtual clock, one recorder.

Each scenario drives a real producer manager and a real consumer manager over
:class:`~kvtier.testing.inproc.InprocTransport` with a
:class:`~kvtier.testing.clock.VirtualClock` (no sockets, no sleeps, deterministic), **asserts the
outcomes it exists to show**, and leaves behind a trace the review page draws as a message
sequence chart (:mod:`tools.seqchart`).  Nothing is simulated: the managers, their
lifecycle cores, the wire codec and the block pools are the production ones.  What is recorded:

* engine calls (``on_new_request``, ``submit_store``, ``submit_load``, ``on_request_finished``,
  ``drain_jobs``, ``shutdown``) and the job results the engine collects — by :class:`Engine`,
  which the scenario uses instead of calling the manager directly;
* every wire message — by :class:`RecordingTransport`, which decodes the header frame with
  :mod:`kvtier.wire.codec` at ``send`` and marks it delivered when the receiver's ``recv``
  hands it over (a message that never arrives is labelled so); pings and pongs are recorded but
  left out of charts;
* every lifecycle state change, deadline and ignored input — by :class:`RecordingCore`, which
  wraps the manager's :class:`~kvtier.lifecycle.TierCore` entry points (``handle``, ``fire``) and
  compares record states (its read API) before and after each input.

Adding a scenario is one function::

    @scenario("Title shown on the review page", properties=("exactly_once_job_result",))
    def my_case(h: Harness) -> None:
        \"\"\"One paragraph for the reviewer.\"\"\"
        req = h.prefill.request("p-A", "A")
        ...
        h.expect(h.decode.outcome(10) == (True, None), "the load succeeds")

Harness arguments (configs, pool geometry, transport options such as ``hold_completion``) go in
``@setup(...)`` under ``@scenario``.  ``python -m tools diagram`` then draws it
(``diagrams/scenarios/<name>.svg``), ``docs/review.md`` lists
it, and ``tests/lifecycle/test_scenarios.py`` runs it.  Every scenario additionally checks, at
the end, that every job it submitted got exactly one result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from tools.seqchart import Lane, Step
from tools.spec import Spec, load
from kvtier.api import JobResult, LookupResult, RequestContext, TransferJob
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Ignored, LandBlocks
from kvtier.manager import MAX_BATCH_BYTES, KvTierManager
from kvtier.memory import BlockPool
from kvtier.testing.clock import VirtualClock
from kvtier.testing.inproc import InprocNetwork, InprocTransport
from kvtier.wire.codec import Decoder, WireError, WireLimits

__all__ = [
    "AWAITING",
    "Engine",
    "Harness",
    "LANES",
    "RecordingCore",
    "RecordingTransport",
    "SCENARIOS",
    "Scenario",
    "ScenarioFailed",
    "Trace",
    "record",
    "scenario",
    "setup",
]

#: The chart lanes of every scenario, left to right.
LANES = (
    Lane("pe", "engine (prefill)"),
    Lane("P", "producer"),
    Lane("C", "consumer"),
    Lane("ce", "engine (decode)"),
)

#: Message types recorded but not drawn (liveness traffic every heartbeat_interval_s).
QUIET_TYPES = frozenset({"ping", "pong"})

#: Scenario parameters (seconds) unless a scenario says otherwise: short park and retention
#: times keep the charts' time column readable.
#: ``digest_threads: 0``: digests and checks on the calling thread, so a recording under the
#: virtual clock is the same every run (the pool's threads would finish at wall-clock times)
SCEN_CFG = {"unbound_store_timeout_s": 60.0, "tombstone_retention_s": 60.0, "digest_threads": 0}

SENTINEL = 0xAB


class ScenarioFailed(AssertionError):
    """A scenario no longer produces the outcome it exists to show (the message says which)."""


# -- the recorder -----------------------------------------------------------------------------------


@attrs.define
class _Event:
    src: str
    dst: str
    label: str
    kind: str
    t: float
    quiet: bool = False
    delivered: bool = True
    failed: str = ""


class Trace:
    """What a run recorded, in order.  :meth:`steps` turns it into chart steps."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.events: list[_Event] = []
        self.transports: dict[str, RecordingTransport] = {}  # by address, alive or not
        self.recording = True
        self.checks: list[str] = []  # what the scenario asserted, in order (all held)

    def add(self, src: str, dst: str, label: str, kind: str, **kw: Any) -> _Event:
        ev = _Event(src, dst, label, kind, self.clock.now(), **kw)
        if self.recording:
            self.events.append(ev)
        return ev

    def steps(self, *, include_quiet: bool = False) -> list[Step]:
        """Chart steps; messages that never reached their receiver say so in their label."""
        out = []
        for ev in self.events:
            if ev.quiet and not include_quiet:
                continue
            label = ev.label
            if ev.failed:
                label += f"\n(send failed: {ev.failed})"
            elif not ev.delivered:
                label += "\n(never delivered)"
            out.append(Step(ev.src, ev.dst, label, ev.kind, ev.t))
        return out


def _msg_label(msg: Any) -> tuple[str, str]:
    """(type, compact text) of a decoded wire message: the fields a reviewer needs, none of the
    per-run random ones (generation, instance token, ping time) and none of the bulk ones (digests,
    destination slots, data-plane descriptors, the handshake's configuration fields)."""
    mtype = type(msg).__name__
    tag = getattr(type(msg), "__struct_config__", None)
    name = tag.tag if tag is not None and isinstance(tag.tag, str) else mtype
    skip = {"gen", "instance", "t", "version", "layout", "hash_seed", "block_bytes", "data_plane", "digest",
            "descriptor", "digests", "slots"}
    parts = []
    for field in msg.__struct_fields__:
        if field in skip:
            continue
        value = getattr(msg, field)
        if field == "kv_request_id":
            parts.insert(0, str(value))
        elif field == "round":
            parts.append(f"r{value}")
        elif field == "keys":
            parts.append(f"{len(value)} keys")
        elif field == "first":
            parts.append(f"blocks [{value}:{value + msg.count}]")
        elif field == "count":
            continue
        elif field == "ok":
            parts.append("ok" if value else "FAIL")
        elif field == "fetched":
            parts.append("fetched" if value else "not fetched")
        elif field == "reason" and value == "":
            continue
        elif field in ("life", "low", "replaces") and not value:
            continue  # unnamed life, no watermark, nothing replaced: the defaults say nothing
        elif field == "offered":
            if value:
                parts.append("offered")
        elif field == "final":
            if not value:
                parts.append("notice")
        elif field == "detail":
            continue
        else:
            parts.append(f"{value}")
    return name, f"{name}({', '.join(parts)})" if parts else name


class RecordingTransport(InprocTransport):
    """An :class:`InprocTransport` that records every message it sends (decoded header) and marks
    it delivered when the receiving :class:`RecordingTransport` hands it to its manager."""

    def __init__(self, network: InprocNetwork, address: str, *, trace: Trace, lane: str,
                 lanes_by_address: dict[str, str], **kw: Any) -> None:
        super().__init__(network, address, **kw)
        self.trace = trace
        self.lane = lane
        self.lanes_by_address = lanes_by_address
        trace.transports[address] = self
        self._in_transit: list[tuple[str, bytes, _Event]] = []  # (receiver address, header, event)
        self._decoders: dict[int, Decoder] = {}

    def _peer_address(self, peer: str) -> str:
        return peer[3:] if peer.startswith("in:") else peer

    def send(self, peer: str, frames: Sequence[Any], *, track: bool = False):  # type: ignore[override]
        header = bytes(memoryview(frames[0])) if frames else b""
        handle = super().send(peer, frames, track=track)
        dst_addr = self._peer_address(peer)
        dst = self.lanes_by_address.get(dst_addr, dst_addr)
        try:
            msg, _ = self._decoder_for(len(frames), frames).decode(frames)
            mtype, label = _msg_label(msg)
        except WireError as err:
            mtype, label = "malformed", f"malformed ({err.reason})"
        ev = self.trace.add(self.lane, dst, label, "msg", quiet=mtype in QUIET_TYPES, delivered=False,
                            failed=handle.error if handle.failed else "")
        if not handle.failed:
            self._in_transit.append((dst_addr, header, ev))
        return handle

    def _decoder_for(self, nframes: int, frames: Sequence[Any]) -> Decoder:
        # payload frames are checked against block_bytes: use the size this message carries
        size = len(memoryview(frames[1])) if nframes > 1 else 0
        dec = self._decoders.get(size)
        if dec is None:
            kw = {"block_bytes": size} if size else {}
            dec = self._decoders[size] = Decoder(
                limits=WireLimits(max_message_bytes=1 << 30, max_blocks_per_fetch=1 << 20), **kw)
        return dec

    def recv(self, max_messages: int = 1000):  # type: ignore[override]
        got = super().recv(max_messages)
        for sender_id, frames in got:
            sender = self.trace.transports.get(self._peer_address(sender_id))
            if sender is not None:
                sender._mark_delivered(self.address, bytes(memoryview(frames[0])))
        return got

    def _mark_delivered(self, receiver: str, header: bytes) -> None:
        for i, (addr, h, ev) in enumerate(self._in_transit):
            if addr == receiver and h == header:
                ev.delivered = True
                del self._in_transit[i]
                return


class RecordingCore:
    """Records what a manager's :class:`~kvtier.lifecycle.TierCore` does: :meth:`install` wraps
    the core's two entry points (``handle`` and ``fire``) on the instance, so every input the
    manager's shell applies — and every firing of its deadlines — passes through here; the record
    states before and after (the core's read API) are compared, and changes, fired deadlines,
    transport reports and ignored inputs are added to the trace on ``lane``."""

    #: inputs that report what the transport or the data plane did: noted on the lane
    _TRANSPORT_INPUTS = (ix.TransferReleased, ix.SendFailed, ix.ConnectFailed, ix.ConnectionClosed, ix.AccessRevoked)

    def __init__(self, core: Any, trace: Trace, lane: str, spec: Spec, peer_names: dict[str, str]) -> None:
        self._core = core
        self._trace = trace
        self._lane = lane
        self._spec = spec
        self._peer_names = peer_names

    @classmethod
    def install(cls, core: Any, trace: Trace, lane: str, spec: Spec, peer_names: dict[str, str]) -> RecordingCore:
        """Record ``core`` from now on; returns the recorder."""
        rec = cls(core, trace, lane, spec, peer_names)
        handle, fire = core.handle, core.fire

        def recorded_handle(inp: Any, now: float) -> list[Any]:
            return rec._run(lambda: handle(inp, now), inp)

        def recorded_fire(now: float) -> list[Any]:
            return rec._run(lambda: fire(now), None)

        core.handle = recorded_handle
        core.fire = recorded_fire
        return rec

    def _run(self, apply: Callable[[], list[Any]], inp: Any) -> list[Any]:
        before = self._snapshot()
        if isinstance(inp, self._TRANSPORT_INPUTS):
            self._trace.add(self._lane, self._lane, f"transport: {self._describe(inp)}", "note")
        effects = apply()
        self._record(inp is None, before, self._snapshot(), effects)
        return effects

    def _describe(self, inp: Any) -> str:
        if isinstance(inp, ix.TransferReleased):
            return f"{'transfer_failed' if inp.failed else 'transfer_released'} {inp.kv_request_id} r{inp.round}"
        name = {ix.SendFailed: "send_failed", ix.ConnectFailed: "connect_failed", ix.ConnectionClosed: "connection_closed",
                ix.AccessRevoked: "access_revoked"}[type(inp)]
        return f"{name} {self._peer_names.get(inp.peer, inp.peer)}"

    def _snapshot(self) -> dict[tuple[str, str], tuple[str, float | None]]:
        """(state, live deadline) of every record, by (machine, key), from the read API."""
        core = self._core
        due = {(d.machine, d.key): d.when for d in core.deadlines()}
        out = {}
        for v in core.sessions():
            out[("session", v.peer)] = (v.state.value, due.get(("session", v.peer)))
        for kid in core.producer_ids():
            out[("producer", kid)] = (core.producer_state(kid).value, due.get(("producer", kid)))
        for kid in core.consumer_ids():
            out[("consumer", kid)] = (core.consumer_state(kid).value, due.get(("consumer", kid)))
        return out

    def _gone_to(self, machine: str, state: str) -> str:
        """Where a record that disappeared from ``state`` went: the one final (or initial) state
        the spec lets it reach from there, else ``"deleted"``."""
        m = self._spec.machines[machine]
        dests = {b.dest for (s, _), r in m.rules.items() if s == state for b in r.branches
                 if b.dest != state and (b.dest in m.final or b.dest == m.initial)}
        return dests.pop() if len(dests) == 1 else "deleted"

    def _who(self, machine: str, key: str) -> str:
        return f"session {self._peer_names.get(key, key)}" if machine == "session" else key

    def _record(self, firing: bool, before: dict, after: dict, effects: list[Any]) -> None:
        now = self._trace.clock.now()
        fired, followed = [], []
        for k in list(dict.fromkeys([*before, *after])):
            machine, key = k
            a, b = before.get(k, (None, None))[0], after.get(k, (None, None))[0]
            if a == b:
                continue
            m = self._spec.machines[machine]
            a = a if a is not None else m.initial
            b = b if b is not None else self._gone_to(machine, a)
            change = f"{self._who(machine, key)}: {a} → {b}"
            deadline = before.get(k, (None, None))[1]
            # a deadline that was due is what moved the record; anything else a firing changed
            # followed from it (a dead session's peer_lost, say)
            if firing and deadline is not None and deadline <= now and m.state(a).timer:
                t = m.timers[m.state(a).timer]
                fired.append(f"{t.event} ({t.config_key})\n{change}")
            else:
                followed.append(change)
        for text in fired:
            self._trace.add(self._lane, self._lane, text, "timer")
        for text in followed:
            self._trace.add(self._lane, self._lane, text, "note")
        for e in effects:
            if isinstance(e, LandBlocks):
                n = len(e.slots)
                self._trace.add(self._lane, self._lane,
                                f"{e.kv_request_id}: lands {n} block{'s' if n != 1 else ''} in slots "
                                f"{', '.join(map(str, e.slots))} and checks their digests", "note")
            elif isinstance(e, Ignored) and e.event not in ("ping", "pong", "message", "heartbeat_deadline"):
                self._trace.add(self._lane, self._lane,
                                f"{self._who(e.machine, e.key)}: ignores {e.event} in {e.state} ({e.reason})", "note")


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


# -- registry ---------------------------------------------------------------------------------------


@attrs.frozen
class Scenario:
    """One recorded scenario: ``run(h)`` drives a :class:`Harness` and asserts its outcomes."""

    name: str
    title: str
    doc: str
    properties: tuple[str, ...]
    run: Callable[[Harness], None]


SCENARIOS: list[Scenario] = []

#: Scenarios the code on this branch cannot produce yet: name -> what they need.  The review
#: page lists them; each becomes a ``@scenario`` function once the behaviour exists.
AWAITING: dict[str, str] = {
    "transfer_stalled_past_cancel_deadline": (
        "the transport still holds a cancelled transfer's blocks when cancel_transfer's deadline "
        "passes: needs the producer's quarantine rule (blocks stay pinned, the store job's result "
        "waits for the release)"
    ),
}


_Run = Callable[[Harness], None]


def scenario(title: str, *, properties: Sequence[str] = ()) -> Callable[[_Run], _Run]:
    """Register a scenario function (in review order: registration order).  Its docstring is the
    paragraph the review page shows; ``properties`` names the spec properties its assertions
    check (validated against ``[properties]``)."""

    def deco(fn: _Run) -> _Run:
        doc = " ".join((fn.__doc__ or "").split())
        if not doc:
            raise ValueError(f"scenario {fn.__name__} needs a docstring (the review page shows it)")
        if any(s.name == fn.__name__ for s in SCENARIOS):
            raise ValueError(f"scenario {fn.__name__} is registered twice")
        SCENARIOS.append(Scenario(fn.__name__, title, doc, tuple(properties), fn))
        return fn

    return deco


def record(s: Scenario, spec: Spec | None = None) -> Trace:
    """Run scenario ``s`` and return its trace.

    Raises:
        ScenarioFailed: an outcome the scenario asserts did not happen, or a submitted job did not
            get exactly one result.
        ValueError: the scenario names a property the spec does not declare.
    """
    spec = spec if spec is not None else load()
    unknown = [p for p in s.properties if p not in spec.properties]
    if unknown:
        raise ValueError(f"scenario {s.name} names unknown properties {unknown}")
    h = _build(s, spec)
    log = logging.getLogger("kvtier")
    level = log.level
    log.setLevel(logging.CRITICAL)  # a scenario's expected peer failures are not news
    try:
        s.run(h)
        for eng in (h.prefill, h.decode):
            if eng.killed:
                continue
            for job_id in eng.submitted:
                got = eng.results.get(job_id, [])
                if len(got) != 1:
                    raise ScenarioFailed(
                        f"scenario {s.name}: job {job_id} got {len(got)} results (exactly one expected): {got}")
        jobs = [j for e in (h.prefill, h.decode) if not e.killed for j in e.submitted]
        if jobs:
            h.trace.checks.append(f"every job ({', '.join(map(str, sorted(jobs)))}) got exactly one result")
    finally:
        h.trace.recording = False  # tearing the pair down is not part of the scenario
        h.close()
        log.setLevel(level)
    return h.trace


_BUILD: dict[str, dict[str, Any]] = {}


def _build(s: Scenario, spec: Spec) -> Harness:
    return Harness(spec=spec, **_BUILD.get(s.name, {}))


def setup(**kw: Any) -> Callable[[_Run], _Run]:
    """Harness arguments for the decorated scenario (put it under ``@scenario``)."""

    def deco(fn: _Run) -> _Run:
        _BUILD[fn.__name__] = kw
        return fn

    return deco


def _keys(kv: str, n: int) -> list[bytes]:
    return [f"{kv}/blk{i}".encode() for i in range(n)]


def _connect(h: Harness, req_id: str, kv: str) -> RequestContext:
    """The decode engine announces ``kv``; the session handshake completes."""
    req = h.decode.request(req_id, kv)
    h.settle()
    return req


def _park_then_connect(h: Harness, n: int, seed: int) -> tuple[RequestContext, RequestContext]:
    """At 0 s: the prefill stores ``n`` blocks of A (slots 0..n-1) and finishes its request; the
    decode engine announces A and the handshake completes.  Then the clock moves to 1 s."""
    preq = h.prefill.request("p-A", "A")
    h.prefill.store(1, preq, _keys("A", n), list(range(n)), seed=seed)
    h.prefill.finish(preq)
    h.settle()
    creq = _connect(h, "c-A", "A")
    h.advance_to(1.0)
    return preq, creq


# -- the scenarios (review order) -------------------------------------------------------------------


@scenario("Happy path: store, fetch, transfer, prune", properties=("exactly_once_job_result",))
def happy_path(h: Harness) -> None:
    """The prefill engine stores four blocks of id A and finishes its request; the decode engine
    announces A (the session handshake runs), loads the four blocks into its own slots, and the
    producer streams them. Both jobs succeed once; the producer keeps A as `done` for
    `tombstone_retention_s` so a late duplicate fetch is refused in one round trip, then prunes it."""
    _, creq = _park_then_connect(h, 4, seed=1)
    h.decode.load(10, creq, _keys("A", 4), [4, 5, 6, 7])
    h.settle()
    h.expect(h.decode.outcome(10) == (True, None), "the load succeeds")
    h.expect(h.prefill.outcome(1) == (True, None), "the store job succeeds once the transfer completed")
    h.expect(h.slots_hold_pattern([4, 5, 6, 7], seed=1), "the consumer's slots hold the producer's blocks")
    h.expect(h.producer_state("A") == "done", "the producer retains A as done")
    h.decode.finish(creq)
    h.advance_to(61.0, tick=0.5)
    h.expect(h.producer_state("A") == "absent", "A is pruned after tombstone_retention_s")


@scenario("Fetch before store: the consumer is faster than the prefill",
          properties=("exactly_once_job_result", "fetch_always_answered"))
def fetch_before_store(h: Harness) -> None:
    """The decode engine loads id A before the prefill has stored anything. The producer binds the
    fetch (`awaiting`, timer `fetch_supply_timeout_s`); when the store arrives it meets the
    demand and the transfer starts at once."""
    creq = _connect(h, "c-A", "A")
    h.decode.load(10, creq, _keys("A", 2), [4, 5])
    h.settle()
    h.expect(h.producer_state("A") == "awaiting", "the producer holds the fetch, bound, waiting for blocks")
    h.advance_to(0.5)
    preq = h.prefill.request("p-A", "A")
    h.prefill.store(1, preq, _keys("A", 2), [0, 1], seed=3)
    h.settle()
    h.expect(h.decode.outcome(10) == (True, None), "the load succeeds as soon as the blocks are stored")
    h.expect(h.prefill.outcome(1) == (True, None), "the store job succeeds")
    h.expect(h.slots_hold_pattern([4, 5], seed=3), "the consumer's slots hold the stored blocks")
    h.prefill.finish(preq)
    h.decode.finish(creq)
    h.settle()


@scenario("Chunked prefill: the fetch waits for the last chunk",
          properties=("exactly_once_job_result", "fetch_always_answered"))
def chunked_prefill(h: Harness) -> None:
    """The prefill stores id A in three one-block chunks, one second apart; the fetch for all three
    blocks arrives after the first chunk. Each further store restarts the supply timer; the
    store that completes the demand starts the transfer, and all three store jobs succeed once."""
    preq = h.prefill.request("p-A", "A")
    keys = _keys("A", 3)
    h.prefill.store(1, preq, keys[:1], [0], seed=5)
    h.settle()
    creq = _connect(h, "c-A", "A")
    h.decode.load(10, creq, keys, [4, 5, 6])
    h.settle()
    h.expect(h.producer_state("A") == "awaiting", "a fetch for blocks not yet stored waits, bound")
    for i in (1, 2):
        h.advance_to(float(i))
        h.prefill.store(1 + i, preq, keys[i : i + 1], [i], seed=5, first=i)
        h.settle()
    h.expect(h.decode.outcome(10) == (True, None), "the load succeeds after the last chunk")
    h.expect(all(h.prefill.outcome(j) == (True, None) for j in (1, 2, 3)), "every chunk's store job succeeds")
    h.expect(h.slots_hold_pattern([4, 5, 6], seed=5), "the blocks land in fetch order")
    h.prefill.finish(preq)
    h.decode.finish(creq)
    h.settle()


@scenario("Late fetch refused after the reap, in one round trip, with no data",
          properties=("exactly_once_job_result", "late_fetch_one_rtt", "no_bytes_for_tombstoned",
                      "tombstoned_never_reparks"))
def late_fetch_after_reap(h: Harness) -> None:
    """Nobody fetches id A within `unbound_store_timeout_s` (60 s): the producer reaps it (`reaped`,
    the store job fails and the engine may reuse the blocks) and keeps a tombstone. A fetch at
    62 s is refused with `transfer_done(FAIL, reaped)` in the same step, not after the
    consumer's load timeout; no byte is sent and the consumer's slots are untouched."""
    preq = h.prefill.request("p-A", "A")
    h.prefill.store(1, preq, _keys("A", 4), [0, 1, 2, 3], seed=1)
    h.prefill.finish(preq)
    h.settle()
    h.advance_to(60.0, tick=0.5)
    h.expect(h.prefill.outcome(1) == (False, "reaped"), "the store job fails with reaped at 60 s")
    h.expect(h.producer_state("A") == "tombstoned", "A is tombstoned")
    h.advance_to(62.0)
    creq = _connect(h, "c-A", "A")
    h.decode.load(10, creq, _keys("A", 4), [4, 5, 6, 7])
    h.settle()
    h.expect(h.now == 62.0, "no time passed")
    h.expect(h.decode.outcome(10) == (False, "reaped"), "the load fails with the producer's reason at once")
    h.expect(h.decode.lookup(creq, _keys("A", 1)[0]) is LookupResult.MISS, "lookups miss: the engine recomputes")
    h.expect(h.slots_untouched([4, 5, 6, 7]), "no byte landed in the consumer's slots")
    h.expect(h.P.stats().get("kvtier_block_bytes_sent_total", 0) == 0, "the producer sent no block data")
    h.decode.finish(creq)
    h.settle()


@scenario("Abort racing completion: the engine cancels while the blocks are on the wire",
          properties=("exactly_once_job_result", "no_write_after_terminal", "no_success_without_receipt"))
def abort_racing_completion(h: Harness) -> None:
    """The producer serves id A in full and its transport has moved every block, but before the
    consumer reads them its engine finishes the request. The consumer sends `abort_fetch` and from
    then on drops block data (`late_data`): its load fails once with `cancelled` and no byte is
    written into slots the engine already considers free. The producer never gets a receipt, so
    its store job fails (`aborted`): handing the bytes to the transport is not delivering them."""
    _, creq = _park_then_connect(h, 2, seed=2)
    h.decode.load(10, creq, _keys("A", 2), [4, 5])  # fetch sent; the consumer is not polled yet
    h.poll("P")  # the producer serves; its transport moves the blocks: block_data in flight
    h.poll("P")  # its next tick reads the plane's report that it holds none of them any more
    h.expect(h.producer_state("A") == "delivering", "the blocks are moved; the producer waits for the receipt")
    h.decode.finish(creq)  # the engine gives up before reading them
    h.settle()
    h.expect(h.decode.outcome(10) == (False, "cancelled"), "the load fails once, cancelled")
    h.expect(h.slots_untouched([4, 5]), "no block data was written after the abort")
    h.expect(h.prefill.outcome(1) == (False, "aborted"), "no receipt: the producer's store job fails, aborted")
    h.expect(h.consumer_state("A") == "absent", "the consumer's record is gone")


@scenario("Transfer stalled past its deadline: the blocks stay quarantined until the transport lets go",
          properties=("exactly_once_job_result", "no_block_returned_while_referenced", "fetch_always_answered"))
@setup(p_cfg={"transfer_timeout_s": 10.0, "peer_timeout_s": 120.0}, c_cfg={"peer_timeout_s": 120.0},
       p_transport={"hold_completion": True, "hold_after_drop": True})
def transfer_stalled(h: Harness) -> None:
    """The producer hands A's blocks to its transport, but the consumer's process stalls and reads
    nothing, so zmq keeps holding the zero-copy frames. At `transfer_timeout_s` (10 s) the producer
    cancels, yet the store job stays outstanding: the engine must not reuse blocks a send may
    still read. At the cancel deadline (10 s later) the transport still has not let go, so the
    producer ends the session (`transfer_stalled`) to force it and keeps A `quarantined`. Only when
    the transport releases the frames does the store job fail, once (`transfer_timeout`). An
    earlier kvtier reported the job at the cancel deadline; the engine reused the blocks and the
    consumer landed another request's bytes as a success (B26/B32)."""
    _, creq = _park_then_connect(h, 2, seed=4)
    h.frozen.add("C")
    h.decode.load(10, creq, _keys("A", 2), [4, 5])  # the fetch goes out; then the consumer stalls
    h.settle()
    h.expect(h.producer_state("A") == "serving", "the transport holds the blocks")
    h.advance_to(10.75)
    h.expect(h.prefill.outcome(1) is None, "no store result before the deadline")
    h.advance_to(11.0)
    h.expect(h.producer_state("A") == "cancelling", "at transfer_timeout_s the producer cancels")
    h.expect(h.prefill.outcome(1) is None, "the store job waits for the transport to release the blocks")
    h.advance_to(21.0)
    h.expect(h.producer_state("A") == "quarantined", "past the cancel deadline: quarantined, session ended")
    h.expect(h.prefill.outcome(1) is None, "still no store result: the blocks are never handed back early")
    h.expect(h.P.quarantined() == (1, 2), "the manager reports 1 id, 2 blocks quarantined")
    h.note("P", "the transport releases the frames")
    h.P.transport.complete()
    h.settle()
    h.expect(h.prefill.outcome(1) == (False, "transfer_timeout"), "the store job fails once, transfer_timeout")
    h.expect(h.producer_state("A") == "tombstoned", "A is tombstoned")
    h.frozen.discard("C")
    h.settle()
    h.expect(h.decode.outcome(10) is not None and h.decode.outcome(10)[0] is not None,
             "the consumer's load ends once when it wakes")
    h.decode.finish(creq)
    h.settle()


@scenario("Producer killed mid-transfer",
          properties=("exactly_once_job_result", "fetch_always_answered", "no_write_after_terminal"))
@setup(block_bytes=MAX_BATCH_BYTES // 2 + 64, num_blocks=2, c_transport={"rcvhwm": 1})
def peer_killed_mid_transfer(h: Harness) -> None:
    """Blocks are large enough that each travels in its own `block_data` message. The first one
    lands; the producer's process dies before the second leaves its send queue. The consumer's
    transport sees the connection close (the socket monitor): the session ends at once
    (`peer_disconnected`) and the load fails once, without waiting for `peer_timeout_s` of
    silence, so the engine recomputes at once (B11)."""
    _, creq = _park_then_connect(h, 2, seed=6)
    h.decode.load(10, creq, _keys("A", 2), [0, 1])
    h.poll("P")  # serves: block 0 fills the consumer's inbox, block 1 waits in the send queue
    t = h.now
    h.kill("P")
    h.poll("C")  # reads block 0, then sees the connection close
    h.expect(h.decode.outcome(10) == (False, "peer_disconnected"), "the load fails once, peer_disconnected")
    h.expect(h.now == t, "no time passed: no wait for peer_timeout_s")
    h.expect(h.decode.lookup(creq, _keys("A", 1)[0]) is LookupResult.MISS, "lookups miss: the engine recomputes")
    h.decode.finish(creq)
    h.settle()


@scenario("Shutdown with traffic in flight: every job still gets one result",
          properties=("exactly_once_job_result", "fetch_always_answered", "no_block_returned_while_referenced"))
@setup(p_cfg={"shutdown_grace_s": 0.2}, p_transport={"hold_completion": True})
def shutdown_in_flight(h: Harness) -> None:
    """The producer holds three ids: A parked (never fetched), B whose consumer already confirmed
    receipt while the transport still holds its frames (`confirmed`), and C awaiting blocks that
    were never stored. Its engine shuts it down (`shutdown_grace_s` 0.2 s): A's store job fails
    with `shutdown` at once; C's fetch is answered `transfer_done(FAIL, shutdown)` with the
    session's generation, so the consumer's load of C fails at once; B waits out the grace for
    its release, which only closing the transport gives — then its store job succeeds (the
    consumer confirmed every block). Every peer gets a goodbye; nothing is left waiting."""
    preq = {kv: h.prefill.request(f"p-{kv}", kv) for kv in ("A", "B")}
    h.prefill.store(1, preq["A"], _keys("A", 1), [0], seed=7)
    h.prefill.store(2, preq["B"], _keys("B", 2), [1, 2], seed=8)
    h.settle()
    creq = {kv: _connect(h, f"c-{kv}", kv) for kv in ("B", "C")}
    h.advance_to(1.0)
    h.decode.load(10, creq["B"], _keys("B", 2), [4, 5])
    h.decode.load(11, creq["C"], _keys("C", 1), [6])
    h.settle()
    h.expect(h.producer_state("B") == "confirmed" and h.producer_state("C") == "awaiting",
             "B's receipt is in but the transport holds its frames; C waits for blocks")
    h.advance_to(2.0)
    h.prefill.shutdown()
    h.settle()
    h.expect(h.prefill.outcome(1) == (False, "shutdown"), "A's store job fails with shutdown")
    h.expect(h.prefill.outcome(2) == (True, None), "B's store job succeeds once the closed transport let go")
    h.expect(h.decode.outcome(10) == (True, None), "B's load had completed")
    h.expect(h.decode.outcome(11) == (False, "shutdown"), "C's load fails once, at once, with shutdown")
    h.expect(h.now == 2.0, "no time passed on the scenario clock")
    h.expect(h.slots_untouched([6]), "nothing landed for C")
    for kv in ("B", "C"):
        h.decode.finish(creq[kv])
    h.settle()
