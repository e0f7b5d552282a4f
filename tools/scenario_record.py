"""The scenarios' recorder (:mod:`tools.scenarios`): a trace of engine calls, wire messages,
state changes, deadlines and ignored inputs, taken from the production managers through a
recording transport and a recording core (their public entry points), for the review page's
sequence charts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import Ignored, LandBlocks
from kvtier.testing.clock import VirtualClock
from kvtier.testing.inproc import InprocNetwork, InprocTransport
from kvtier.wire.codec import Decoder, WireError, WireLimits
from tools.coreview import CoreView
from tools.seqchart import Lane, Step
from tools.spec import Spec

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
        due = {(d.machine, d.key): d.when for d in CoreView(core).deadlines()}
        out = {}
        for v in CoreView(core).sessions():
            out[("session", v.peer)] = (v.state.value, due.get(("session", v.peer)))
        for kid in CoreView(core).producer_ids():
            out[("producer", kid)] = (core.producer_state(kid).value, due.get(("producer", kid)))
        for kid in CoreView(core).consumer_ids():
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
