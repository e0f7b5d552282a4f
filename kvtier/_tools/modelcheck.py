"""Bounded exhaustive model check of the composed kvtier system (``kvtier check``).

What is explored
----------------
One producer and ``consumers`` consumers, each a **real** :class:`~kvtier.lifecycle.TierCore`
(so every lifecycle step runs the generated table through the real producer, consumer and
session classes), joined by FIFO channels per direction and per consumer (zmq keeps
per-connection order; ``--reorder`` delivers any queued message), with:

* the producer's engine storing ``chunks`` one-key chunks per id (the last store is followed by
  ``request_finished``), or finishing the request early ("abandon"); optionally drain / shutdown;
* each consumer's engine loading an id (``announce`` + ``submit_load``; the fetch names every key)
  and finishing a live load (the consumer-side abort).  With the default ``routing="fixed"`` id i
  is loaded by consumer i; ``routing="any"`` (+ ``loads_per_id=2``) lets two consumers race;
* the data plane: a ``SendBlocks`` puts one ``block_data`` message on the channel and leaves a
  transfer that the transport ends with ``transfer_complete`` or ``transfer_failed``
  (``transfer_released`` after a ``CancelTransfer``);
* ``faults`` lost or duplicated messages per consumer connection (``fault_scope="total"``: in
  all), any message of any channel;
* ``crashes`` session deaths (both sides see ``disconnect``, or one side's liveness deadline;
  a later announce reconnects with a new generation and the old session's messages are dropped
  by the generation gate);
* **abstract time**: any armed deadline of any record "may fire" at any step (a nondeterministic
  step that runs the core's own ``tick``), so every ordering of deadlines is covered, whatever the
  configured durations.

A state is the tuple of the cores' canonical snapshots plus channels, transfers and the engines'
bookkeeping.  Core steps are memoised on (snapshot, input), so each distinct local step runs the
real core once; a snapshot is restored into a fresh ``TierCore`` (indexes rebuilt by the machines'
own ``on_state_change``) and every restore is verified against the live core it came from.

Search: breadth-first (shortest counterexamples first) with **partial-order reduction** when each
id has its own consumer: in each state only the steps of one id are expanded if they provably
commute with everything the other ids can do (they touch only that id's records, channels,
transfers and jobs; fault budgets are per connection; the retained-id cap couples ids, so steps
that retire an id are always interleaved both ways).  The default configuration is explored to
exhaustion (the longest path is ~27 steps, far past the depth bound of 12 the brief asks for).

Properties (``spec/lifecycle.toml`` ``[properties]``), checked on every explored transition:

* ``exactly_once_job_result`` — no job gets a second result; a job without a result is always held
  by a live record (so it will get one);
* ``every_state_has_deadline_or_exit`` — after every step, a record in a state that names a timer
  has a live deadline;
* ``tombstoned_never_reparks`` — an id that ended (tombstoned, done, or dropped without a
  tombstone) is never parked or bound again until it was pruned from ``done``/``tombstoned``;
* ``no_bytes_for_tombstoned`` — ``SendBlocks`` only on a parked/awaiting -> serving step;
* ``late_fetch_one_rtt`` — a fetch (passing the session gate) for a done, tombstoned, cancelling
  or ended id is answered ``transfer_done(fail)`` in the step that receives it;
* ``no_write_after_terminal`` — ``WriteBlocks`` only for a consumer record in ``in_flight`` and for
  its current round;
* ``bounded_bookkeeping`` — retained (done + tombstoned) ids never exceed ``tombstone_max``;

and **no stuck ids** (``fetch_always_answered`` and the liveness half of
``exactly_once_job_result``): from every explored state, a quiescent state — every job has its
result, no transfer in progress, no producer record parked/awaiting/serving/cancelling, no
consumer load queued/in_flight/aborting/cancelling — is reachable by *completion* steps only:
deliveries, transport reports, deadlines, the producer's request finishing.  New work, faults,
crashes and the consumer giving up on its own are not completion steps (an engine waits for its
load), so a load that only ends when its engine abandons it counts as stuck.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any, NamedTuple

import attrs

from kvtier.lifecycle._table import SessionEvent
from kvtier.lifecycle.consumer import LoadInput
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings, TierCore
from kvtier.lifecycle.effects import (
    CancelTransfer,
    JobDone,
    OpenConnection,
    SendBlocks,
    SendTransferDone,
    WriteBlocks,
)
from kvtier.lifecycle.producer import StoreInput
from kvtier.lifecycle.session import HelloInput
from kvtier.testing.fakenet import Envelope, FakeNetwork, to_envelope

__all__ = ["Bounds", "Result", "check", "main"]

PROPERTIES = (
    "exactly_once_job_result",
    "every_state_has_deadline_or_exit",
    "tombstoned_never_reparks",
    "no_bytes_for_tombstoned",
    "late_fetch_one_rtt",
    "no_write_after_terminal",
    "bounded_bookkeeping",
    "no_stuck_ids",
)

_P_LIVE = frozenset({"parked", "awaiting", "serving", "cancelling"})
_P_RETAINED = frozenset({"done", "tombstoned"})
_P_LATE = frozenset({"done", "tombstoned", "cancelling"})
_C_LIVE = frozenset({"queued", "in_flight", "aborting", "cancelling"})
_LOCAL = HelloInput(version=1, block_bytes=16, layout="model-check", hash_seed="")


@attrs.frozen(kw_only=True)
class Bounds:
    """The size of the explored system."""

    ids: int = 2
    """kv_request_ids the producer stores."""
    consumers: int = 2
    """consumer peers (each its own TierCore)."""
    depth: int = 40
    """BFS depth bound (the default state space is exhausted well before it: deepest path ~27)."""
    faults: int = 1
    """lost or duplicated messages (per consumer connection, or in total: see fault_scope)."""
    fault_scope: str = "per_peer"
    """"per_peer": each consumer's connection may suffer ``faults`` faults; "total": all together."""
    chunks: int = 1
    """stores (one key each) per id; the fetch names every key."""
    loads_per_id: int = 1
    """how many consumers may load the same id (2 exercises duplicate_fetch)."""
    crashes: int = 0
    """session deaths (two-sided disconnect, or one side's liveness timer)."""
    tombstone_max: int = 2
    """the producer's retained-id cap (below ``ids`` the count bound evicts; that couples the ids and
    defeats most of the partial-order reduction, so keep the depth small then)."""
    max_pending: int = 1
    """max_pending_fetches_per_peer (1: too_many_pending is exercised)."""
    park_clock: str = "last_store"
    transfer_failures: bool = True
    """the transport may fail a transfer."""
    reduce: bool = True
    """partial-order reduction (persistent sets over ids; needs routing="fixed", ids == consumers)."""
    routing: str = "fixed"
    """"any": every consumer may load every id; "fixed": id i goes to consumer i % consumers."""
    abandon: bool = True
    """the producer's request may finish before all its chunks are stored (request_finished early)."""
    prune_timers: bool = True
    """let the prune deadline of done/tombstoned ids fire (a later fetch then meets a fresh id)."""
    drain: bool = False
    shutdown: bool = False
    reorder: bool = False
    """deliver any message of a channel, not only the oldest (zmq keeps per-connection order)."""
    max_states: int = 2_000_000
    """give up (exit 3) beyond this many states."""


@attrs.frozen
class Violation:
    prop: str
    message: str
    trace: tuple[str, ...]


@attrs.define
class Result:
    bounds: Bounds
    bug: str | None
    states: int = 0
    transitions: int = 0
    frontier_closure: int = 0
    max_depth: int = 0
    core_steps: int = 0
    seconds: float = 0.0
    violation: Violation | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.violation is None and not self.truncated


# ------------------------------------------------------------------------------------------------
# snapshots of real cores


def _slots(cls: type) -> tuple[str, ...]:
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for s in getattr(klass, "__slots__", ()):
            if s not in names:
                names.append(s)
    return tuple(names)


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return ("__d", tuple(v.items()))
    if isinstance(v, list):
        return ("__l", tuple(v))
    if isinstance(v, bytearray):
        return ("__b", bytes(v))
    return v


def _thaw(v: Any) -> Any:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and v[0].startswith("__"):
        tag, data = v
        if tag == "__d":
            return dict(data)
        if tag == "__l":
            return list(data)
        if tag == "__b":
            return bytearray(data)
    return v


class _Codec:
    """Snapshot a TierCore into a hashable tuple and restore a fresh TierCore from one."""

    # Attributes of the machines: configuration, indexes rebuilt by on_state_change, counters (not
    # state), or state this codec snapshots.  Anything else is new state the codec does not know.
    KNOWN = {
        "core": {"consumer", "producer", "sessions", "settings"},
        "producer": {
            "_deadlines", "_durations", "_effects", "_guards", "awaiting_per_peer", "by_peer", "count_evicted",
            "ignored", "max_pending", "park_clock_last", "records", "retained", "tombstone_max",
        },
        "consumer": {
            "_deadlines", "_durations", "_effects", "_guards", "_next_round", "_session_ready", "by_peer", "ignored",
            "records",
        },
        "sessions": {
            "_deadlines", "_durations", "_effects", "_guards", "_next_gen", "_on_peer_down", "_on_ready", "ignored",
            "local", "max_peers", "records",
        },
    }

    def __init__(self, settings: CoreSettings) -> None:
        self.settings = settings
        probe = TierCore(settings, _LOCAL)
        for name, obj in (("core", probe), *((n, getattr(probe, n)) for n in ("producer", "consumer", "sessions"))):
            unknown = set(vars(obj)) - self.KNOWN[name]
            if unknown:
                raise RuntimeError(
                    f"model check: {name} has state the snapshot codec does not know: {sorted(unknown)}; teach "
                    f"kvtier/_tools/modelcheck.py (_Codec) whether it is configuration, an index rebuilt by "
                    f"on_state_change, or state to snapshot and restore"
                )
        self.fields = {
            name: tuple(s for s in _slots(type(getattr(probe, name).new_record("k"))) if s not in ("key", "tseq"))
            for name in ("sessions", "producer", "consumer")
        }

    def snapshot(self, core: TierCore) -> tuple:
        parts = []
        for name in ("sessions", "producer", "consumer"):
            m = getattr(core, name)
            fields = self.fields[name]
            recs = tuple(
                sorted((key, tuple(_freeze(getattr(rec, f)) for f in fields)) for key, rec in m.records.items())
            )
            parts.append(recs)
        return (
            tuple(parts),
            core.sessions._next_gen,
            core.consumer._next_round,
            tuple(core.producer.retained),
        )

    def restore(self, snap: tuple) -> TierCore:
        (recs_by_machine, next_gen, next_round, retained) = snap
        core = TierCore(self.settings, _LOCAL)
        for name, recs in zip(("sessions", "producer", "consumer"), recs_by_machine):
            m = getattr(core, name)
            fields = self.fields[name]
            for key, values in recs:
                rec = m.new_record(key)
                for f, v in zip(fields, values):
                    setattr(rec, f, _thaw(v))
                m.records[key] = rec
                m.on_state_change(rec, m.INITIAL, rec.state)
                if rec.timer is not None:
                    rec.tseq = m._deadlines.arm(math.inf, key)
        core.sessions._next_gen = next_gen
        core.consumer._next_round = next_round
        core.producer.retained = dict.fromkeys(retained)
        return core

    @staticmethod
    def indexes(core: TierCore) -> tuple:
        p, c = core.producer, core.consumer
        return (
            {k: frozenset(v) for k, v in p.by_peer.items() if v},
            dict(p.awaiting_per_peer),
            list(p.retained),
            {k: frozenset(v) for k, v in c.by_peer.items() if v},
        )


@attrs.frozen
class _Summary:
    """What the checker needs to know about one core snapshot."""

    producer: dict[str, tuple[str, tuple[int, ...]]]
    consumer: dict[str, tuple[str, int, int | None]]
    sessions: dict[str, tuple[str, int]]
    timers: tuple[tuple[str, str, str], ...]
    retained: int


def _summarise(core: TierCore) -> _Summary:
    timers = []
    for name in ("sessions", "producer", "consumer"):
        m = getattr(core, name)
        for key in sorted(m.records):
            rec = m.records[key]
            if rec.timer is not None:
                timers.append((name, key, rec.timer))
    return _Summary(
        producer={k: (r.state.value, tuple(r.jobs)) for k, r in core.producer.records.items()},
        consumer={k: (r.state.value, r.round, r.job_id) for k, r in core.consumer.records.items()},
        sessions={k: (r.state.value, r.gen) for k, r in core.sessions.records.items()},
        timers=tuple(timers),
        retained=len(core.producer.retained),
    )


@attrs.frozen
class _Step:
    snap: int
    effects: tuple
    envelopes: tuple[int, ...]
    """message ids (see :meth:`_Cores.mid`)"""
    dead_timers: tuple[str, ...] = ()
    """records that name a timer but have no live deadline after the step"""


class _Cores:
    """Interned snapshots and memoised core steps."""

    def __init__(self, settings: CoreSettings, *, verify: bool = True) -> None:
        self.codec = _Codec(settings)
        self.snaps: list[tuple] = []
        self.summaries: list[_Summary] = []
        self.ids: dict[tuple, int] = {}
        self.memo: dict[tuple, _Step] = {}
        self.verify = verify
        self.core_steps = 0
        self._precs: dict[int, dict[tuple[str, str], tuple]] = {}
        self.msgs: list[Envelope] = []
        self._mids: dict[Envelope, int] = {}

    def mid(self, env: Envelope) -> int:
        """Intern a message: states hold small ints, not Envelope objects."""
        got = self._mids.get(env)
        if got is None:
            got = self._mids[env] = len(self.msgs)
            self.msgs.append(env)
        return got

    def intern(self, core: TierCore) -> int:
        snap = self.codec.snapshot(core)
        sid = self.ids.get(snap)
        if sid is None:
            if self.verify:
                again = self.codec.restore(snap)
                if self.codec.indexes(again) != self.codec.indexes(core) or self.codec.snapshot(again) != snap:
                    raise RuntimeError(
                        "model check: restoring a core snapshot does not rebuild the same indexes; the snapshot "
                        "codec in kvtier/_tools/modelcheck.py is out of date with kvtier/lifecycle"
                    )
            sid = len(self.snaps)
            self.ids[snap] = sid
            self.snaps.append(snap)
            self.summaries.append(_summarise(core))
        return sid

    def precords(self, sid: int) -> dict[tuple[str, str], tuple]:
        """(machine, key) -> record fields of snapshot ``sid`` (cached)."""
        got = self._precs.get(sid)
        if got is None:
            recs_by_machine = self.snaps[sid][0]
            got = {}
            for name, recs in zip(("sessions", "producer", "consumer"), recs_by_machine):
                for key, values in recs:
                    got[(name, key)] = values
            self._precs[sid] = got
        return got

    def step(self, name: str, sid: int, inp: tuple) -> _Step:
        key = (sid, inp)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        self.core_steps += 1
        core = self.codec.restore(self.snaps[sid])
        effects = _call(core, ("deliver", self.msgs[inp[1]]) if inp[0] == "deliver" else inp)
        more = []
        for eff in effects:
            if isinstance(eff, OpenConnection):  # the connection comes up at once
                more.extend(core.transport_up(eff.peer, 0.0))
        effects = effects + more
        envs = tuple(self.mid(e) for e in (to_envelope(name, core, eff) for eff in effects) if e is not None)
        dead = tuple(
            f"{mname} {key} ({rec.state.value}, timer {rec.timer})"
            for mname in ("sessions", "producer", "consumer")
            for key, rec in getattr(core, mname).records.items()
            if rec.timer is not None and not getattr(core, mname)._is_live(key, rec.tseq)
        )
        result = _Step(self.intern(core), tuple(effects), envs, dead)
        self.memo[key] = result
        return result


def _call(core: TierCore, inp: tuple) -> list:
    kind = inp[0]
    now = 0.0
    if kind == "store":
        _, kid, chunk, job = inp
        key = f"{kid}.{chunk}".encode()
        return core.store(StoreInput(kid, f"req-{kid}", job, (key,), (job % 1000,)), now)
    if kind == "load":
        _, kid, chunks, job, producer = inp
        keys = tuple(f"{kid}.{k}".encode() for k in range(chunks))
        out = core.announce(kid, producer, now)
        out += core.submit_load(LoadInput(kid, job, keys, tuple(range(job % 1000, job % 1000 + chunks))), now)
        return out
    if kind == "p_finished":
        return core.producer_finished(inp[1], now)
    if kind == "c_finished":
        return core.consumer_finished(inp[1], now)
    if kind == "deliver":
        return FakeNetwork.dispatch(core, inp[1], now)
    if kind == "transport":
        _, kid, rnd, outcome = inp
        fn = {"complete": core.transfer_complete, "failed": core.transfer_failed, "released": core.transfer_released}
        return fn[outcome](kid, rnd, now)
    if kind == "fire":
        _, machine, key = inp
        m = getattr(core, machine)
        m.records[key].tseq = m._deadlines.arm(0.0, key)
        return core.tick(0.0)
    if kind == "disconnect":
        _, peer, gen = inp
        return core.disconnect(peer, gen, now)
    if kind == "dial":
        out: list = []
        core.sessions.apply(core.sessions.new_record(inp[1]), SessionEvent.DIAL, None, now, out)
        return out
    if kind == "drain":
        return core.drain(now)
    if kind == "shutdown":
        return core.shutdown(now)
    raise ValueError(inp)


# ------------------------------------------------------------------------------------------------
# the composed system


class _G(NamedTuple):
    """One global state (a plain tuple: cheap to hash)."""

    p: int
    c: tuple[int, ...]
    chans: tuple[tuple[int, ...], ...]
    """message ids; index 2*c: producer -> consumer c; 2*c+1: consumer c -> producer"""
    transfers: tuple[tuple[int, str, int, bool], ...]
    stores: tuple[int, ...]
    p_finished: tuple[bool, ...]
    loads: tuple[tuple[int, ...], ...]
    """per consumer, per id: 0 not loaded, 1 load submitted, 2 request finished"""
    outstanding: frozenset[int]
    retired: tuple[bool, ...]
    faults: tuple[int, ...]
    crashes: int
    drained: bool
    shut: bool


class _Fail(Exception):
    def __init__(self, prop: str, message: str) -> None:
        super().__init__(message)
        self.prop = prop
        self.message = message


class _System:
    def __init__(self, b: Bounds) -> None:
        self.b = b
        durations = {k: 10.0 for k in TIMER_KEYS}
        settings = CoreSettings(
            durations=durations,
            park_clock=b.park_clock,
            tombstone_max=b.tombstone_max,
            max_pending_fetches_per_peer=b.max_pending,
        )
        self.cores = _Cores(settings)
        self.kids = tuple(chr(ord("X") + i) if i < 3 else f"I{i}" for i in range(b.ids))
        self.cnames = tuple(f"c{i + 1}" for i in range(b.consumers))
        self.kindex = {k: i for i, k in enumerate(self.kids)}
        self.cindex = {c: i for i, c in enumerate(self.cnames)}

    # -- jobs ----------------------------------------------------------------------------------
    @staticmethod
    def store_job(i: int, chunk: int) -> int:
        return 1000 + 10 * i + chunk

    @staticmethod
    def load_job(c: int, i: int) -> int:
        return 2000 + 100 * c + 10 * i

    def describe_job(self, job: int) -> str:
        if job < 2000:
            i, k = divmod(job - 1000, 10)
            return f"store job {job} ({self.kids[i]} chunk {k})"
        c, rest = divmod(job - 2000, 100)
        return f"load job {job} ({self.cnames[c]} {self.kids[rest // 10]})"

    # -- initial state -------------------------------------------------------------------------
    def initial(self) -> _G:
        cores = self.cores
        p = cores.intern(TierCore(cores.codec.settings, _LOCAL))
        cs = []
        for name in self.cnames:
            c = cores.intern(TierCore(cores.codec.settings, _LOCAL, gen_base=100 * (len(cs) + 1)))
            st = cores.step(name, c, ("dial", "p"))
            hello = next(m for m in st.envelopes if cores.msgs[m].kind == "hello")
            pst = cores.step("p", p, ("deliver", hello))
            p = pst.snap
            ack = next(m for m in pst.envelopes if cores.msgs[m].kind == "hello_ack")
            cst = cores.step(name, st.snap, ("deliver", ack))
            cs.append(cst.snap)
        n = self.b.ids
        return _G(
            p=p,
            c=tuple(cs),
            chans=tuple(() for _ in range(2 * self.b.consumers)),
            transfers=(),
            stores=(0,) * n,
            p_finished=(False,) * n,
            loads=tuple((0,) * n for _ in self.cnames),
            outstanding=frozenset(),
            retired=(False,) * n,
            faults=(self.b.faults,) * (self.b.consumers if self.b.fault_scope == "per_peer" else 1),
            crashes=self.b.crashes,
            drained=False,
            shut=False,
        )

    # -- actions -------------------------------------------------------------------------------
    def actions(self, g: _G, full: bool) -> Iterator[tuple]:
        """Actions enabled in ``g``; ``full=False``: completion steps only (no new work, no faults,
        no crashes, and no consumer giving up on its own: an engine waits for its load), in the
        priority order the liveness search tries them."""
        b = self.b
        cores = self.cores
        for ch, q in enumerate(g.chans):
            if q:
                for j in range(len(q)) if b.reorder else (0,):
                    yield ("deliver", ch, j)
        for t in g.transfers:
            if t[3]:
                yield ("transport", t, "released")
            else:
                yield ("transport", t, "complete")
                if b.transfer_failures:
                    yield ("transport", t, "failed")
        comps = [("p", g.p)] + [(self.cnames[c], sid) for c, sid in enumerate(g.c)]
        for comp, sid in comps:
            for machine, key, timer in cores.summaries[sid].timers:
                if machine == "sessions" and timer == "liveness" and not (full and g.crashes > 0):
                    continue
                if timer == "prune" and not b.prune_timers:
                    continue
                yield ("fire", comp, machine, key)
        if not g.shut:
            for i in range(b.ids):
                if not g.p_finished[i]:
                    if full and g.stores[i] < b.chunks:
                        yield ("store", i)
                    if b.abandon and g.stores[i] < b.chunks:
                        yield ("abandon", i)
        for c in range(b.consumers):
            consumer = cores.summaries[g.c[c]].consumer
            for i, kid in enumerate(self.kids):
                st = g.loads[c][i]
                if (
                    full
                    and st == 0
                    and (b.routing == "any" or i % b.consumers == c)
                    and sum(1 for cc in range(b.consumers) if g.loads[cc][i]) < b.loads_per_id
                ):
                    yield ("load", c, i)
                if full and st == 1 and consumer.get(kid, ("absent",))[0] in ("queued", "in_flight", "aborting"):
                    yield ("c_finished", c, i)
        if full:
            if any(g.faults):
                for ch, q in enumerate(g.chans):
                    if not g.faults[self.budget_of(ch)]:
                        continue
                    for j in range(len(q)):
                        yield ("drop", ch, j)
                        yield ("dup", ch, j)
            if g.crashes > 0:
                ps = cores.summaries[g.p]
                for c, cname in enumerate(self.cnames):
                    csess = cores.summaries[g.c[c]].sessions.get("p")
                    psess = ps.sessions.get(cname)
                    if csess and psess and csess[0] == "ready" and psess[0] == "ready":
                        yield ("crash", c)
            if b.drain and not g.drained and not g.shut:
                yield ("drain",)
            if b.shutdown and not g.shut:
                yield ("shutdown",)

    def label(self, g: _G, action: tuple) -> str:
        """Human-readable text of ``action`` in state ``g``."""
        kind = action[0]
        if kind == "store":
            i = action[1]
            last = g.stores[i] + 1 == self.b.chunks
            return f"P.store({self.kids[i]} chunk {g.stores[i]})" + (" + P.request_finished" if last else "")
        if kind == "abandon":
            i = action[1]
            return f"P.request_finished({self.kids[i]}) after {g.stores[i]} of {self.b.chunks} chunks stored"
        if kind == "load":
            return f"{self.cnames[action[1]]}.load({self.kids[action[2]]})"
        if kind == "c_finished":
            return f"{self.cnames[action[1]]}.request_finished({self.kids[action[2]]})"
        if kind in ("deliver", "drop", "dup"):
            env = self.cores.msgs[g.chans[action[1]][action[2]]]
            return {"deliver": "deliver", "drop": "LOSE", "dup": "DUPLICATE"}[kind] + f" {env}"
        if kind == "transport":
            t = action[1]
            return f"transport: {action[2]} {t[1]} r{t[2]} (to {self.cnames[t[0]]})"
        if kind == "fire":
            _, comp, machine, key = action
            who = "P" if comp == "p" else comp
            summ = self.cores.summaries[g.p if comp == "p" else g.c[self.cindex[comp]]]
            timer = next(t for m, k, t in summ.timers if (m, k) == (machine, key))
            return f"timer {timer} of {who}.{machine.rstrip('s')}({key}) fires"
        if kind == "crash":
            return f"session p<->{self.cnames[action[1]]} dies (both sides get disconnect)"
        if kind == "drain":
            return "P.drain_jobs()"
        if kind == "shutdown":
            return "P.shutdown()"
        return repr(action)  # pragma: no cover

    # -- applying one action -------------------------------------------------------------------
    def apply(self, g: _G, action: tuple, notes: list[str] | None = None) -> _G:
        """Successor of ``g``; raises _Fail on a safety violation. Appends trace notes if asked."""
        kind = action[0]
        st = _Mut(g)
        if kind == "store":
            i = action[1]
            chunk = g.stores[i]
            job = self.store_job(i, chunk)
            st.stores = _put(st.stores, i, st.stores[i] + 1)
            st.outstanding = st.outstanding | {job}
            self._p(st, ("store", self.kids[i], chunk, job), notes)
            if st.stores[i] == self.b.chunks:  # the prefill is over once its last chunk is stored
                st.p_finished = _put(st.p_finished, i, True)
                self._p(st, ("p_finished", self.kids[i]), notes)
        elif kind == "abandon":
            i = action[1]
            st.p_finished = _put(st.p_finished, i, True)
            self._p(st, ("p_finished", self.kids[i]), notes)
        elif kind == "load":
            _, c, i = action
            job = self.load_job(c, i)
            st.loads = _put(st.loads, c, _put(st.loads[c], i, 1))
            st.outstanding = st.outstanding | {job}
            self._c(st, c, ("load", self.kids[i], self.b.chunks, job, "p"), notes)
        elif kind == "c_finished":
            _, c, i = action
            st.loads = _put(st.loads, c, _put(st.loads[c], i, 2))
            self._c(st, c, ("c_finished", self.kids[i]), notes)
        elif kind in ("deliver", "drop", "dup"):
            _, ch, j = action
            q = st.chan(ch)
            env = q[j]
            if kind == "drop":
                del q[j]
                st.faults = _put(st.faults, self.budget_of(ch), st.faults[self.budget_of(ch)] - 1)
            elif kind == "dup":
                q.append(env)
                st.faults = _put(st.faults, self.budget_of(ch), st.faults[self.budget_of(ch)] - 1)
            else:
                del q[j]
                c = ch // 2
                if ch % 2 == 0:
                    self._c(st, c, ("deliver", env), notes)
                else:
                    self._p(st, ("deliver", env), notes)
        elif kind == "transport":
            _, t, outcome = action
            st.transfers = tuple(x for x in st.transfers if x != t)
            self._p(st, ("transport", t[1], t[2], outcome), notes)
        elif kind == "fire":
            _, comp, machine, key = action
            sid = g.p if comp == "p" else g.c[self.cindex[comp]]
            if machine == "sessions" and self.cores.summaries[sid].sessions[key][0] == "ready":
                st.crashes -= 1
            if comp == "p":
                self._p(st, ("fire", machine, key), notes)
            else:
                self._c(st, self.cindex[comp], ("fire", machine, key), notes)
        elif kind == "crash":
            c = action[1]
            st.crashes -= 1
            cname = self.cnames[c]
            pgen = self.cores.summaries[st.p].sessions[cname][1]
            cgen = self.cores.summaries[st.c[c]].sessions["p"][1]
            self._p(st, ("disconnect", cname, pgen), notes)
            self._c(st, c, ("disconnect", "p", cgen), notes)
        elif kind == "drain":
            st.drained = True
            self._p(st, ("drain",), notes)
        elif kind == "shutdown":
            st.shut = True
            self._p(st, ("shutdown",), notes)
        else:  # pragma: no cover
            raise ValueError(action)
        return st.freeze()

    @staticmethod
    def _timers(res: _Step, who: str) -> None:
        if res.dead_timers:
            raise _Fail(
                "every_state_has_deadline_or_exit",
                f"{who}: {', '.join(res.dead_timers)}: the state names a timer but no deadline is pending, so "
                f"nothing will ever move it",
            )

    def _jobs(self, st: _Mut, effects: tuple, who: str) -> None:
        for eff in effects:
            if isinstance(eff, JobDone):
                if eff.job_id not in st.outstanding:
                    raise _Fail(
                        "exactly_once_job_result",
                        f"{who} reported {self.describe_job(eff.job_id)} again "
                        f"(JobDone ok={eff.ok} reason={eff.reason}); it already had its result",
                    )
                st.outstanding = st.outstanding - {eff.job_id}

    def _p(self, st: _Mut, inp: tuple, notes: list[str] | None) -> None:
        cores = self.cores
        pre = cores.summaries[st.p]
        res = cores.step("p", st.p, inp)
        post = cores.summaries[res.snap]
        st.p = res.snap
        self._timers(res, "the producer")
        self._jobs(st, res.effects, "the producer")
        for eff in res.effects:
            if isinstance(eff, SendBlocks):
                before = pre.producer.get(eff.kv_request_id, ("absent", ()))[0]
                after = post.producer.get(eff.kv_request_id, ("absent", ()))[0]
                if before not in ("parked", "awaiting") or after != "serving":
                    raise _Fail(
                        "no_bytes_for_tombstoned",
                        f"the producer sent blocks for {eff.kv_request_id} on a {before} -> {after} step "
                        f"(blocks are sent only on parked/awaiting -> serving)",
                    )
                if eff.peer in self.cindex:
                    st.transfers = tuple(sorted(st.transfers + ((self.cindex[eff.peer], eff.kv_request_id, eff.round, False),)))
            elif isinstance(eff, CancelTransfer):
                st.transfers = tuple(
                    sorted(
                        (t[0], t[1], t[2], True)
                        if t[1:3] == (eff.kv_request_id, eff.round) and self.cnames[t[0]] == eff.peer
                        else t
                        for t in st.transfers
                    )
                )
        msgs = cores.msgs
        for m in res.envelopes:
            dst = msgs[m].dst
            if dst in self.cindex:
                st.chan(2 * self.cindex[dst]).append(m)
        # late fetch answered in the same step
        if inp[0] == "deliver" and msgs[inp[1]].kind == "fetch":
            env = msgs[inp[1]]
            sess = pre.sessions.get(env.src)
            gated = sess is not None and sess[0] == "ready" and sess[1] == env.gen
            kid = env.kv_request_id
            before = pre.producer.get(kid, ("absent", ()))[0]
            if gated and (before in _P_LATE or st.retired[self.kindex[kid]]):
                answered = any(
                    isinstance(e, SendTransferDone)
                    and not e.ok
                    and (e.peer, e.kv_request_id, e.round) == (env.src, kid, env.round)
                    for e in res.effects
                )
                if not answered:
                    after = post.producer.get(kid, ("absent", ()))[0]
                    why = before if before in _P_LATE else "ended (retired) but no longer retained"
                    raise _Fail(
                        "late_fetch_one_rtt",
                        f"a fetch for {kid} (round {env.round}) from {env.src} reached the producer while {kid} was "
                        f"{why}; it was not answered transfer_done(fail) in the same step (-> {after})",
                    )
        # per-id lifecycle checks
        for i, kid in enumerate(self.kids):
            before = pre.producer.get(kid, ("absent", ()))[0]
            after = post.producer.get(kid, ("absent", ()))[0]
            if before == after:
                continue
            if after in ("parked", "awaiting", "serving") and st.retired[i]:
                raise _Fail(
                    "tombstoned_never_reparks",
                    f"{kid} ended earlier and was not pruned through its tombstone, yet it went {before} -> {after}",
                )
            if after in _P_RETAINED:
                st.retired = _put(st.retired, i, True)
            elif before in _P_RETAINED and after == "absent":
                st.retired = _put(st.retired, i, False)  # pruned by its deadline or the count cap: the id is fresh again
            elif before in _P_LIVE and after == "absent" and inp[0] != "shutdown":
                st.retired = _put(st.retired, i, True)  # ended without a tombstone (never legitimate; see above)
        if post.retained > self.b.tombstone_max:
            raise _Fail(
                "bounded_bookkeeping",
                f"the producer retains {post.retained} done/tombstoned ids, more than tombstone_max="
                f"{self.b.tombstone_max}",
            )
        if notes is not None:
            notes.append("P: " + _describe(pre, post, res.effects))

    def _c(self, st: _Mut, c: int, inp: tuple, notes: list[str] | None) -> None:
        cores = self.cores
        cname = self.cnames[c]
        pre = cores.summaries[st.c[c]]
        res = cores.step(cname, st.c[c], inp)
        post = cores.summaries[res.snap]
        st.c = _put(st.c, c, res.snap)
        self._timers(res, cname)
        self._jobs(st, res.effects, cname)
        for eff in res.effects:
            if isinstance(eff, WriteBlocks):
                rec = pre.consumer.get(eff.kv_request_id)
                env = cores.msgs[inp[1]] if inp[0] == "deliver" else None
                if rec is None or rec[0] != "in_flight" or (env is not None and env.round != rec[1]):
                    state = rec[0] if rec else "absent"
                    raise _Fail(
                        "no_write_after_terminal",
                        f"{cname} wrote block data for {eff.kv_request_id} into slots {eff.slots} while its load was "
                        f"{state}" + (f" (message round {env.round}, load round {rec[1]})" if rec and env else ""),
                    )
        for m in res.envelopes:
            if cores.msgs[m].dst == "p":
                st.chan(2 * c + 1).append(m)
        if notes is not None:
            notes.append(f"{cname}: " + _describe(pre, post, res.effects))

    # -- partial-order reduction -----------------------------------------------------------------
    @property
    def por_enabled(self) -> bool:
        """Persistent-set reduction applies when every id has its own consumer (fixed routing, one id
        per consumer): then an id's steps touch only its own records, channels and transfers, and
        the ids interact only through the fault/crash budgets and the retained-id cap."""
        return _por(self.b)

    def process_of(self, g: _G, action: tuple) -> int | None:
        kind = action[0]
        if kind in ("store", "abandon"):
            return action[1]
        if kind in ("load", "c_finished"):
            return action[2]
        if kind in ("deliver", "drop", "dup"):
            return action[1] // 2
        if kind == "transport":
            return self.kindex[action[1][1]]
        if kind == "fire":
            _, comp, machine, key = action
            if comp != "p":
                return self.cindex[comp]
            return self.cindex[key] if machine == "sessions" else self.kindex[key]
        if kind == "crash":
            return action[1]
        return None

    def projection(self, g: _G, i: int) -> tuple:
        """Everything that belongs to process ``i`` (id i with consumer i)."""
        kid, cname = self.kids[i], self.cnames[i]
        precs = self.cores.precords(g.p)
        return (
            precs.get(("producer", kid)),
            precs.get(("sessions", cname)),
            g.c[i],
            g.chans[2 * i],
            g.chans[2 * i + 1],
            tuple(t for t in g.transfers if t[0] == i),
            tuple(sorted(j for j in g.outstanding if self.job_owner(j) == i)),
            g.stores[i],
            g.p_finished[i],
            g.loads[i],
            g.retired[i],
            g.faults[i] if self.b.fault_scope == "per_peer" else None,
        )

    def budget_of(self, ch: int) -> int:
        return ch // 2 if self.b.fault_scope == "per_peer" else 0

    def job_owner(self, job: int) -> int:
        if job < 2000:
            return (job - 1000) // 10
        return ((job - 2000) % 100) // 10

    def ample(self, g: _G, acts: list[tuple]) -> list[tuple[tuple, _G | None]]:
        """A persistent subset of ``acts`` (with successors already computed where known)."""
        full = [(a, None) for a in acts]
        if not self.por_enabled:
            return full
        groups: dict[int, list[tuple]] = {}
        for a in acts:
            pid = self.process_of(g, a)
            if pid is None:
                return full
            groups.setdefault(pid, []).append(a)
        if len(groups) <= 1:
            return full
        cap_binding = self.b.tombstone_max < self.b.ids
        pstates = self.cores.summaries[g.p].producer
        for pid in sorted(groups):
            E = groups[pid]
            if any(a[0] == "crash" for a in E) or (
                self.b.fault_scope != "per_peer" and any(a[0] in ("drop", "dup") for a in E)
            ):
                continue  # they spend a budget the other ids share
            if any(a[0] == "fire" and a[2] == "sessions" for a in E) and g.crashes > 0:
                continue
            kid = self.kids[pid]
            retained = pstates.get(kid, ("absent",))[0] in _P_RETAINED
            if cap_binding and retained and any(self._touches_producer(a, pid) for a in E):
                continue  # another id's retirement may evict this one's record meanwhile
            others = [j for j in range(self.b.ids) if j != pid]
            before = {j: self.projection(g, j) for j in others}
            out: list[tuple[tuple, _G | None]] = []
            ok = True
            for a in E:
                try:
                    ng = self.apply(g, a)
                except _Fail:
                    return full  # let the main loop report it
                if cap_binding:
                    now_ret = self.cores.summaries[ng.p].producer.get(kid, ("absent",))[0] in _P_RETAINED
                    if now_ret != retained:
                        ok = False
                        break
                if any(self.projection(ng, j) != before[j] for j in others):
                    ok = False
                    break
                out.append((a, ng))
            if ok:
                return out
        return full

    @staticmethod
    def _touches_producer(a: tuple, pid: int) -> bool:
        kind = a[0]
        return (
            kind in ("store", "abandon", "transport", "crash")
            or (kind in ("deliver", "drop", "dup") and a[1] % 2 == 1)
            or (kind == "fire" and a[1] == "p")
        )

    # -- state predicates ----------------------------------------------------------------------
    def check_state(self, g: _G) -> None:
        """Safety invariants of one state (jobs without a result are held by live records)."""
        ps = self.cores.summaries[g.p]
        held: dict[int, str] = {}
        for _kid, (state, jobs) in ps.producer.items():
            for j in jobs:
                held[j] = state
        for job in g.outstanding:
            if job < 2000:
                if job not in held or held[job] not in _P_LIVE:
                    where = f"held by a {held[job]} record" if job in held else "held by no record"
                    raise _Fail(
                        "exactly_once_job_result",
                        f"{self.describe_job(job)} has no result and is {where}: it will never get one",
                    )
            else:
                c, rest = divmod(job - 2000, 100)
                kid = self.kids[rest // 10]
                rec = self.cores.summaries[g.c[c]].consumer.get(kid)
                if rec is None or rec[0] not in _C_LIVE or rec[2] != job:
                    state = rec[0] if rec else "absent"
                    raise _Fail(
                        "exactly_once_job_result",
                        f"{self.describe_job(job)} has no result but {self.cnames[c]}'s record for {kid} is {state}",
                    )

    def quiescent(self, g: _G) -> bool:
        if g.outstanding or g.transfers:
            return False
        if any(s in _P_LIVE for s, _ in self.cores.summaries[g.p].producer.values()):
            return False
        for sid in g.c:
            if any(r[0] in _C_LIVE for r in self.cores.summaries[sid].consumer.values()):
                return False
        return True

    def stuck_report(self, g: _G) -> str:
        lines = []
        for job in sorted(g.outstanding):
            lines.append(f"{self.describe_job(job)} never gets a result")
        for kid, (s, jobs) in sorted(self.cores.summaries[g.p].producer.items()):
            if s in _P_LIVE:
                lines.append(f"producer {kid} stays {s}")
        for c, sid in enumerate(g.c):
            for kid, r in sorted(self.cores.summaries[sid].consumer.items()):
                if r[0] in _C_LIVE:
                    lines.append(f"{self.cnames[c]} {kid} stays {r[0]}")
        for t in g.transfers:
            lines.append(f"transfer {t[1]} r{t[2]} to {self.cnames[t[0]]} never ends")
        return "; ".join(lines) or "no quiescent state is reachable"


def _put(t: tuple, i: int, v: Any) -> tuple:
    return t[:i] + (v,) + t[i + 1 :]


class _Mut:
    """A working copy of a :class:`_G`: fields are replaced, channels copied on first write."""

    __slots__ = (
        "p", "c", "chans", "transfers", "stores", "p_finished", "loads", "outstanding", "retired", "faults",
        "crashes", "drained", "shut", "_copied",
    )

    def __init__(self, g: _G) -> None:
        (
            self.p, self.c, chans, self.transfers, self.stores, self.p_finished, self.loads, self.outstanding,
            self.retired, self.faults, self.crashes, self.drained, self.shut,
        ) = g
        self.chans: list = list(chans)
        self._copied: set[int] = set()

    def chan(self, ch: int) -> list[int]:
        if ch not in self._copied:
            self.chans[ch] = list(self.chans[ch])
            self._copied.add(ch)
        return self.chans[ch]

    def freeze(self) -> _G:
        chans = self.chans
        for i in self._copied:
            chans[i] = tuple(chans[i])
        return _G(
            self.p, self.c, tuple(chans), self.transfers, self.stores, self.p_finished, self.loads, self.outstanding,
            self.retired, self.faults, self.crashes, self.drained, self.shut,
        )


def _describe(pre: _Summary, post: _Summary, effects: tuple) -> str:
    bits = []
    for table in ("producer", "consumer", "sessions"):
        a, b = getattr(pre, table), getattr(post, table)
        for key in sorted(set(a) | set(b)):
            sa = a[key][0] if key in a else "absent"
            sb = b[key][0] if key in b else "absent"
            if sa != sb:
                what = "session " if table == "sessions" else ""
                bits.append(f"{what}{key} {sa}->{sb}")
    shown = []
    for eff in effects:
        name = type(eff).__name__
        if name == "Ignored":
            shown.append(f"ignored {eff.event} ({eff.reason})")
        elif name == "JobDone":
            shown.append(f"JobDone({eff.job_id}, {'ok' if eff.ok else 'fail ' + str(eff.reason)})")
        elif name in ("SendTransferDone",):
            shown.append(f"transfer_done({eff.kv_request_id} r{eff.round} {'ok' if eff.ok else 'fail ' + str(eff.reason)})")
        elif name in ("SendBlocks", "WriteBlocks", "SendFetch", "SendAbortFetch", "SendAbortAck", "CancelTransfer"):
            shown.append(f"{name}({getattr(eff, 'kv_request_id', '')})")
        elif name in ("PeerDown", "SendDisconnect", "SendHello", "SendHelloAck", "OpenConnection"):
            shown.append(name)
    return ", ".join(bits + shown) or "(no change)"


# ------------------------------------------------------------------------------------------------
# the search


def check(bounds: Bounds | None = None, *, bug: str | None = None, progress: bool = False) -> Result:
    """Explore ``bounds`` (with planted bug ``bug`` active, if given) and return the result."""
    bounds = bounds or Bounds()
    if bug is not None:
        from kvtier.testing.planted import PLANTED

        if bug not in PLANTED:
            raise KeyError(f"unknown planted bug {bug!r}; known: {', '.join(sorted(PLANTED))}")
        ctx: Any = PLANTED[bug]()
    else:
        ctx = nullcontext()
    with ctx:
        return _search(bounds, bug, progress)


def _search(b: Bounds, bug: str | None, progress: bool) -> Result:
    t0 = time.perf_counter()
    system = _System(b)
    result = Result(bounds=b, bug=bug)
    init = system.initial()
    parent: dict[_G, tuple[_G | None, tuple | None]] = {init: (None, None)}
    queue: deque[tuple[_G, int]] = deque([(init, 0)])

    def trace_to(g: _G, last: tuple | None = None, mark: str = "") -> tuple[str, ...]:
        path: list[tuple[_G, tuple]] = []
        cur = g
        while True:
            par, action = parent[cur]
            if par is None:
                break
            path.append((par, action))
            cur = par
        path.reverse()
        if last is not None:
            path.append((g, last))
        lines = []
        for n, (state, action) in enumerate(path, 1):
            notes: list[str] = []
            try:
                system.apply(state, action, notes)
            except _Fail:
                pass
            tail = mark if (last is not None and n == len(path)) else ""
            lines.append(f"{n:3d}. {system.label(state, action)}{tail}")
            lines.extend(f"       {note}" for note in notes)
        return tuple(lines)

    def fail(g: _G, action: tuple, f: _Fail) -> Result:
        result.violation = Violation(f.prop, f.message, trace_to(g, action, f"   <-- violates {f.prop}"))
        return result

    depth_of: dict[_G, int] = {init: 0}
    try:
        system.check_state(init)
        # 1. safety: BFS to the depth bound with every kind of step
        while queue:
            g, d = queue.popleft()
            if d >= b.depth:
                continue
            for action, ng in system.ample(g, list(system.actions(g, True))):
                result.transitions += 1
                try:
                    if ng is None:
                        ng = system.apply(g, action)
                    if ng not in parent:
                        system.check_state(ng)
                except _Fail as f:
                    return fail(g, action, f)
                if ng not in parent:
                    parent[ng] = (g, action)
                    depth_of[ng] = d + 1
                    queue.append((ng, d + 1))
                    if len(parent) > b.max_states:
                        result.truncated = True
                        return result
                    if progress and len(parent) % 100000 == 0:
                        print(f"  ... {len(parent):,} states", file=sys.stderr)
        # 2. liveness: from every explored state a quiescent state is reachable by completion steps
        can: dict[_G, bool] = {}
        for g0 in list(depth_of):
            if g0 in can:
                continue
            path: list[_G] = []
            on_path: set[_G] = set()
            cur = g0
            ok = False
            while True:
                if cur in can:
                    ok = can[cur]
                    break
                if system.quiescent(cur):
                    ok = True
                    break
                if cur in on_path:
                    break
                path.append(cur)
                on_path.add(cur)
                nxt = None
                for action in system.actions(cur, False):
                    result.transitions += 1
                    try:
                        ng = system.apply(cur, action)
                        if ng not in parent:
                            system.check_state(ng)
                    except _Fail as f:
                        return fail(cur, action, f)
                    if ng not in parent:
                        parent[ng] = (cur, action)
                        result.frontier_closure += 1
                    nxt = ng
                    break  # greedy: the first completion step in priority order
                if nxt is None:
                    break
                cur = nxt
            if not ok:
                ok = _exhaustive_completion(system, g0, parent, result)
                if isinstance(ok, Result):
                    return ok
            for p in path:  # every state on the greedy path shares g0's fate
                can[p] = ok
            can[g0] = ok
            if not ok:
                stuck = g0
                result.violation = Violation(
                    "no_stuck_ids",
                    f"from this state no quiescent state is reachable: {system.stuck_report(stuck)}",
                    trace_to(stuck),
                )
                return result
        return result
    finally:
        result.max_depth = max(depth_of.values())
        result.states = len(parent)
        result.core_steps = system.cores.core_steps
        result.seconds = time.perf_counter() - t0


def _exhaustive_completion(system: _System, g0: _G, parent: dict, result: Result) -> bool | Result:
    """Search every completion path from ``g0`` for a quiescent state (the greedy path failed)."""
    seen = {g0}
    work = deque([g0])
    while work:
        g = work.popleft()
        if system.quiescent(g):
            return True
        for action in system.actions(g, False):
            result.transitions += 1
            try:
                ng = system.apply(g, action)
                if ng not in parent:
                    system.check_state(ng)
            except _Fail:
                continue  # reported by the main search if reachable there; here only reachability matters
            if ng not in parent:
                parent[ng] = (g, action)
                result.frontier_closure += 1
            if ng not in seen:
                seen.add(ng)
                work.append(ng)
                if len(seen) > system.b.max_states:
                    return True  # give up proving stuckness rather than report a false one
    return False


def _por(b: Bounds) -> bool:
    return b.reduce and b.routing == "fixed" and b.ids == b.consumers and not b.drain and not b.shutdown


def format_result(r: Result) -> str:
    b = r.bounds
    head = (
        f"kvtier model check{f' (planted bug: {r.bug})' if r.bug else ''}: ids={b.ids} consumers={b.consumers} "
        f"depth={b.depth} faults={b.faults} chunks={b.chunks} loads_per_id={b.loads_per_id} crashes={b.crashes} "
        f"tombstone_max={b.tombstone_max} max_pending={b.max_pending} park_clock={b.park_clock}"
        f" routing={b.routing} fault_scope={b.fault_scope}"
        f"{' drain' if b.drain else ''}{' shutdown' if b.shutdown else ''}{' reorder' if b.reorder else ''}"
        f"{'' if b.prune_timers else ' no-prune-timers'}{'' if b.abandon else ' no-abandon'}"
        f"{' no-transfer-failures' if not b.transfer_failures else ''}"
    )
    if r.violation is None and not r.truncated:
        scope = (
            f"state space exhausted (longest path {r.max_depth} steps)"
            if r.max_depth < b.depth
            else f"bounded: paths cut at depth {b.depth}, then closed with {r.frontier_closure:,} completion states"
        )
    else:
        scope = f"depth bound {b.depth}"
    reduction = "partial-order reduction over ids" if _por(b) else "no partial-order reduction"
    lines = [
        head,
        f"explored {r.states:,} states and {r.transitions:,} transitions in {r.seconds:.1f} s; {scope}; "
        f"{reduction}; {r.core_steps:,} distinct core steps",
    ]
    if r.truncated:
        lines.append(f"GAVE UP: more than {b.max_states:,} states; lower the bounds")
        return "\n".join(lines)
    failed = r.violation.prop if r.violation else None
    for prop in PROPERTIES:
        if prop == failed:
            lines.append(f"  FAIL {prop}")
        elif failed is None:
            lines.append(f"  ok   {prop}")
        else:
            lines.append(f"  ?    {prop} (search stopped)")
    if r.violation:
        lines.append("")
        lines.append(f"VIOLATION of {r.violation.prop}: {r.violation.message}")
        lines.append("counterexample:")
        lines.extend(r.violation.trace)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``kvtier check``: 0 when every property holds, 1 on a violation (trace printed), 2 on a
    usage error, 3 when the state space exceeded ``--max-states``."""
    ap = argparse.ArgumentParser(prog="kvtier check", description="Bounded exhaustive model check of the lifecycle.")
    d = Bounds()
    ap.add_argument("--bug", default=None, help="run against a planted bug variant (kvtier.testing.planted)")
    ap.add_argument("--list-bugs", action="store_true", help="list planted bug variants and exit")
    ap.add_argument("--ids", type=int, default=d.ids)
    ap.add_argument("--consumers", type=int, default=d.consumers)
    ap.add_argument("--depth", type=int, default=d.depth)
    ap.add_argument("--faults", type=int, default=d.faults, help="lost or duplicated messages")
    ap.add_argument("--chunks", type=int, default=d.chunks)
    ap.add_argument("--loads-per-id", type=int, default=d.loads_per_id)
    ap.add_argument("--crashes", type=int, default=d.crashes)
    ap.add_argument("--tombstone-max", type=int, default=d.tombstone_max)
    ap.add_argument("--max-pending", type=int, default=d.max_pending)
    ap.add_argument("--park-clock", choices=("last_store", "first_store"), default=d.park_clock)
    ap.add_argument("--no-transfer-failures", action="store_true")
    ap.add_argument("--drain", action="store_true")
    ap.add_argument("--shutdown", action="store_true")
    ap.add_argument("--reorder", action="store_true", help="deliver any queued message, not only the oldest")
    ap.add_argument("--routing", choices=("fixed", "any"), default=d.routing)
    ap.add_argument("--fault-scope", choices=("per_peer", "total"), default=d.fault_scope)
    ap.add_argument("--no-prune-timers", action="store_true")
    ap.add_argument("--no-abandon", action="store_true")
    ap.add_argument("--no-reduce", action="store_true", help="no partial-order reduction")
    ap.add_argument("--max-states", type=int, default=d.max_states)
    args = ap.parse_args(argv)
    if args.list_bugs:
        from kvtier.testing.planted import PLANTED

        for name, fn in sorted(PLANTED.items()):
            print(f"{name}: {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    if min(args.ids, args.consumers) < 1 or args.depth < 0 or args.faults < 0 or args.chunks < 1:
        print("kvtier check: --ids, --consumers and --chunks must be >= 1; --depth, --faults >= 0", file=sys.stderr)
        return 2
    bounds = Bounds(
        ids=args.ids,
        consumers=args.consumers,
        depth=args.depth,
        faults=args.faults,
        chunks=args.chunks,
        loads_per_id=args.loads_per_id,
        crashes=args.crashes,
        tombstone_max=args.tombstone_max,
        max_pending=args.max_pending,
        park_clock=args.park_clock,
        transfer_failures=not args.no_transfer_failures,
        drain=args.drain,
        shutdown=args.shutdown,
        reorder=args.reorder,
        routing=args.routing,
        fault_scope=args.fault_scope,
        prune_timers=not args.no_prune_timers,
        abandon=not args.no_abandon,
        reduce=not args.no_reduce,
        max_states=args.max_states,
    )
    try:
        r = check(bounds, bug=args.bug, progress=True)
    except KeyError as exc:
        print(f"kvtier check: {exc.args[0]}", file=sys.stderr)
        return 2
    print(format_result(r))
    if r.truncated:
        return 3
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main())
