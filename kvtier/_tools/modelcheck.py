"""Bounded exhaustive model check of the composed kvtier system (``kvtier check``).

What is explored
----------------
One producer and ``consumers`` consumers, each a **real** :class:`~kvtier.lifecycle.TierCore`
(so every lifecycle step runs the generated table through the real producer, consumer and
session classes), joined by FIFO channels per direction and per consumer, with:

* the producer's engine storing ``chunks`` one-key chunks for each of ``ids`` ids, finishing a
  request, and (optionally) draining or shutting down;
* each consumer's engine loading an id (``announce`` + ``submit_load``: the fetch names every key)
  and finishing its request (the consumer-side abort);
* the data plane: a ``SendBlocks`` puts one ``block_data`` message on the channel and leaves a
  transfer that the transport ends with ``transfer_complete`` or ``transfer_failed``
  (``transfer_released`` after a ``CancelTransfer``);
* ``faults`` lost or duplicated messages (any message of any channel);
* ``crashes`` session deaths (both sides see ``disconnect``; a later announce reconnects with a new
  generation, so messages of the dead session are dropped by the generation gate);
* **abstract time**: any armed timer of any record "may fire" at any step (a nondeterministic
  step that runs the core's own ``tick``), so every ordering of deadlines is covered whatever the
  configured durations are.  Session liveness timers count as crashes (a one-sided session death).

A state is the tuple of the three cores' canonical snapshots plus channels, transfers and the
engines' bookkeeping.  Core steps are memoised on (snapshot, input), so each distinct local step
runs the real core once; a snapshot is restored into a fresh ``TierCore`` (indexes rebuilt by the
machines' own ``on_state_change``) and the restore is verified against the live core it came from.

Properties (``spec/lifecycle.toml`` ``[properties]``)
-----------------------------------------------------
checked on every explored transition:

* ``exactly_once_job_result`` — no job gets a second result; a job without a result is always held
  by a live record (so it will get one);
* ``tombstoned_never_reparks`` — an id that ended (tombstoned, done, or dropped without a
  tombstone) is never parked or bound again until it was pruned from ``done``/``tombstoned``;
* ``no_bytes_for_tombstoned`` — ``SendBlocks`` only on a parked/awaiting -> serving step;
* ``late_fetch_one_rtt`` — a fetch (passing the session gate) for a done, tombstoned, cancelling
  or ended id is answered ``transfer_done(fail)`` in the step that receives it;
* ``no_write_after_terminal`` — ``WriteBlocks`` only for a consumer record in ``in_flight`` and for
  its current round;
* ``bounded_bookkeeping`` — retained (done + tombstoned) ids never exceed ``tombstone_max``;

and, over the explored graph, **no stuck ids** (``fetch_always_answered`` and the liveness half of
``exactly_once_job_result``): from every state a state is reachable where every job has its
result, no transfer is in progress and no record waits in a live state (producer parked /
awaiting / serving / cancelling; consumer queued / in_flight / aborting / cancelling).  Beyond
``depth`` the search continues with "completion" steps only (deliveries, transport reports,
timers, engines finishing requests), so the frontier is closed and the check is exact for it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import attrs

from kvtier.lifecycle._table import ConsumerState, ProducerState, SessionEvent, SessionState
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
    depth: int = 12
    """BFS depth with every kind of step; beyond it only completion steps."""
    faults: int = 1
    """lost or duplicated messages in total."""
    chunks: int = 1
    """stores (one key each) per id; the fetch names every key."""
    loads_per_id: int = 1
    """how many consumers may load the same id (2 exercises duplicate_fetch)."""
    crashes: int = 0
    """session deaths (two-sided disconnect, or one side's liveness timer)."""
    tombstone_max: int = 1
    """the producer's retained-id cap (1: the count bound is exercised with 2 ids)."""
    max_pending: int = 1
    """max_pending_fetches_per_peer (1: too_many_pending is exercised)."""
    park_clock: str = "last_store"
    transfer_failures: bool = True
    """the transport may fail a transfer."""
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

    def __init__(self, settings: CoreSettings) -> None:
        self.settings = settings
        probe = TierCore(settings, _LOCAL)
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
    envelopes: tuple[Envelope, ...]


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

    def step(self, name: str, sid: int, inp: tuple) -> _Step:
        key = (sid, inp)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        self.core_steps += 1
        core = self.codec.restore(self.snaps[sid])
        effects = _call(core, inp)
        more = []
        for eff in effects:
            if isinstance(eff, OpenConnection):  # the connection comes up at once
                more.extend(core.transport_up(eff.peer, 0.0))
        effects = effects + more
        envs = tuple(e for e in (to_envelope(name, core, eff) for eff in effects) if e is not None)
        result = _Step(self.intern(core), tuple(effects), envs)
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


@attrs.frozen
class _G:
    """One global state (hashable)."""

    p: int
    c: tuple[int, ...]
    chans: tuple[tuple[Envelope, ...], ...]
    """index 2*c: producer -> consumer c; 2*c+1: consumer c -> producer"""
    transfers: tuple[tuple[int, str, int, bool], ...]
    stores: tuple[int, ...]
    p_finished: tuple[bool, ...]
    loads: tuple[tuple[int, ...], ...]
    """per consumer, per id: 0 not loaded, 1 load submitted, 2 request finished"""
    outstanding: frozenset[int]
    retired: tuple[bool, ...]
    faults: int
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
            hello = next(e for e in st.envelopes if e.kind == "hello")
            pst = cores.step("p", p, ("deliver", hello))
            p = pst.snap
            ack = next(e for e in pst.envelopes if e.kind == "hello_ack")
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
            faults=self.b.faults,
            crashes=self.b.crashes,
            drained=False,
            shut=False,
        )

    # -- actions -------------------------------------------------------------------------------
    def actions(self, g: _G, full: bool) -> Iterator[tuple[str, tuple]]:
        """(label, action) pairs enabled in ``g``; ``full=False``: completion steps only."""
        b = self.b
        cores = self.cores
        ps = cores.summaries[g.p]
        if full and not g.shut:
            for i, kid in enumerate(self.kids):
                if g.stores[i] < b.chunks and not g.p_finished[i]:
                    yield f"P.store({kid} chunk {g.stores[i]})", ("store", i)
        if not g.shut:
            for i, kid in enumerate(self.kids):
                if g.stores[i] >= 1 and not g.p_finished[i]:
                    yield f"P.request_finished({kid})", ("p_finished", i)
        for c, cname in enumerate(self.cnames):
            for i, kid in enumerate(self.kids):
                st = g.loads[c][i]
                if full and st == 0 and sum(1 for cc in range(b.consumers) if g.loads[cc][i]) < b.loads_per_id:
                    yield f"{cname}.load({kid})", ("load", c, i)
                if st == 1:
                    yield f"{cname}.request_finished({kid})", ("c_finished", c, i)
        for ch, q in enumerate(g.chans):
            if not q:
                continue
            idxs = range(len(q)) if b.reorder else (0,)
            for j in idxs:
                yield f"deliver {q[j]}", ("deliver", ch, j)
            if full and g.faults > 0:
                for j in range(len(q)):
                    yield f"LOSE {q[j]}", ("drop", ch, j)
                    yield f"DUPLICATE {q[j]}", ("dup", ch, j)
        for t in g.transfers:
            c, kid, rnd, cancelled = t
            if cancelled:
                yield f"transport released {kid} r{rnd}", ("transport", t, "released")
            else:
                yield f"transport complete {kid} r{rnd}", ("transport", t, "complete")
                if b.transfer_failures:
                    yield f"transport failed {kid} r{rnd}", ("transport", t, "failed")
        comps = [("p", g.p)] + [(self.cnames[c], sid) for c, sid in enumerate(g.c)]
        for comp, sid in comps:
            for machine, key, timer in cores.summaries[sid].timers:
                if machine == "sessions" and timer == "liveness" and not (full and g.crashes > 0):
                    continue
                who = "P" if comp == "p" else comp
                yield f"timer {who}.{machine[:-1] if machine == 'sessions' else machine}.{timer}({key}) fires", (
                    "fire",
                    comp,
                    machine,
                    key,
                )
        if full and g.crashes > 0:
            for c, cname in enumerate(self.cnames):
                csess = cores.summaries[g.c[c]].sessions.get("p")
                psess = ps.sessions.get(cname)
                if csess and psess and csess[0] == "ready" and psess[0] == "ready":
                    yield f"session p<->{cname} dies (both sides disconnect)", ("crash", c)
        if full and b.drain and not g.drained and not g.shut:
            yield "P.drain_jobs()", ("drain",)
        if full and b.shutdown and not g.shut:
            yield "P.shutdown()", ("shutdown",)

    # -- applying one action -------------------------------------------------------------------
    def apply(self, g: _G, action: tuple) -> tuple[_G, list[str]]:
        """Successor of ``g``; raises _Fail on a safety violation. Returns notes for traces."""
        kind = action[0]
        st = _Mut(g)
        notes: list[str] = []
        if kind == "store":
            i = action[1]
            chunk = g.stores[i]
            job = self.store_job(i, chunk)
            st.stores[i] += 1
            st.outstanding.add(job)
            self._p(st, ("store", self.kids[i], chunk, job), notes)
        elif kind == "p_finished":
            i = action[1]
            st.p_finished[i] = True
            self._p(st, ("p_finished", self.kids[i]), notes)
        elif kind == "load":
            _, c, i = action
            job = self.load_job(c, i)
            st.loads[c][i] = 1
            st.outstanding.add(job)
            self._c(st, c, ("load", self.kids[i], self.b.chunks, job, "p"), notes)
        elif kind == "c_finished":
            _, c, i = action
            st.loads[c][i] = 2
            self._c(st, c, ("c_finished", self.kids[i]), notes)
        elif kind in ("deliver", "drop", "dup"):
            _, ch, j = action
            q = st.chans[ch]
            env = q[j]
            if kind == "drop":
                del q[j]
                st.faults -= 1
            elif kind == "dup":
                q.append(env)
                st.faults -= 1
            else:
                del q[j]
                c = ch // 2
                if ch % 2 == 0:
                    self._c(st, c, ("deliver", env), notes)
                else:
                    self._p(st, ("deliver", env), notes)
        elif kind == "transport":
            _, t, outcome = action
            st.transfers.remove(t)
            c, kid, rnd, _cancelled = t
            self._p(st, ("transport", kid, rnd, outcome), notes)
        elif kind == "fire":
            _, comp, machine, key = action
            if machine == "sessions" and self.cores.summaries[g.p if comp == "p" else g.c[self.cindex[comp]]].sessions[
                key
            ][0] == "ready":
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
        return st.freeze(), notes

    def _jobs(self, st: _Mut, effects: tuple, who: str) -> None:
        for eff in effects:
            if isinstance(eff, JobDone):
                if eff.job_id not in st.outstanding:
                    raise _Fail(
                        "exactly_once_job_result",
                        f"{who} reported {self.describe_job(eff.job_id)} again "
                        f"(JobDone ok={eff.ok} reason={eff.reason}); it already had its result",
                    )
                st.outstanding.discard(eff.job_id)

    def _p(self, st: _Mut, inp: tuple, notes: list[str]) -> None:
        cores = self.cores
        pre = cores.summaries[st.p]
        res = cores.step("p", st.p, inp)
        post = cores.summaries[res.snap]
        st.p = res.snap
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
                    st.transfers.append((self.cindex[eff.peer], eff.kv_request_id, eff.round, False))
            elif isinstance(eff, CancelTransfer):
                for k, t in enumerate(st.transfers):
                    if t[1:3] == (eff.kv_request_id, eff.round) and self.cnames[t[0]] == eff.peer:
                        st.transfers[k] = (t[0], t[1], t[2], True)
        for env in res.envelopes:
            if env.dst in self.cindex:
                st.chans[2 * self.cindex[env.dst]].append(env)
        # late fetch answered in the same step
        if inp[0] == "deliver" and inp[1].kind == "fetch":
            env = inp[1]
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
                st.retired[i] = True
            elif before in _P_RETAINED and after == "absent":
                st.retired[i] = False  # pruned by its deadline or the count cap: the id is fresh again
            elif before in _P_LIVE and after == "absent" and inp[0] != "shutdown":
                st.retired[i] = True  # ended without a tombstone (never legitimate; see above)
        if post.retained > self.b.tombstone_max:
            raise _Fail(
                "bounded_bookkeeping",
                f"the producer retains {post.retained} done/tombstoned ids, more than tombstone_max="
                f"{self.b.tombstone_max}",
            )
        notes.append("P: " + _describe(pre, post, res.effects))

    def _c(self, st: _Mut, c: int, inp: tuple, notes: list[str]) -> None:
        cores = self.cores
        cname = self.cnames[c]
        pre = cores.summaries[st.c[c]]
        res = cores.step(cname, st.c[c], inp)
        post = cores.summaries[res.snap]
        st.c[c] = res.snap
        self._jobs(st, res.effects, cname)
        for eff in res.effects:
            if isinstance(eff, WriteBlocks):
                rec = pre.consumer.get(eff.kv_request_id)
                env = inp[1] if inp[0] == "deliver" else None
                if rec is None or rec[0] != "in_flight" or (env is not None and env.round != rec[1]):
                    state = rec[0] if rec else "absent"
                    raise _Fail(
                        "no_write_after_terminal",
                        f"{cname} wrote block data for {eff.kv_request_id} into slots {eff.slots} while its load was "
                        f"{state}" + (f" (message round {env.round}, load round {rec[1]})" if rec and env else ""),
                    )
        for env in res.envelopes:
            if env.dst == "p":
                st.chans[2 * c + 1].append(env)
        notes.append(f"{cname}: " + _describe(pre, post, res.effects))

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


class _Mut:
    """A mutable working copy of a :class:`_G`."""

    def __init__(self, g: _G) -> None:
        self.p = g.p
        self.c = list(g.c)
        self.chans = [list(q) for q in g.chans]
        self.transfers = list(g.transfers)
        self.stores = list(g.stores)
        self.p_finished = list(g.p_finished)
        self.loads = [list(x) for x in g.loads]
        self.outstanding = set(g.outstanding)
        self.retired = list(g.retired)
        self.faults = g.faults
        self.crashes = g.crashes
        self.drained = g.drained
        self.shut = g.shut

    def freeze(self) -> _G:
        return _G(
            p=self.p,
            c=tuple(self.c),
            chans=tuple(tuple(q) for q in self.chans),
            transfers=tuple(sorted(self.transfers)),
            stores=tuple(self.stores),
            p_finished=tuple(self.p_finished),
            loads=tuple(tuple(x) for x in self.loads),
            outstanding=frozenset(self.outstanding),
            retired=tuple(self.retired),
            faults=self.faults,
            crashes=self.crashes,
            drained=self.drained,
            shut=self.shut,
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
    parent: dict[_G, tuple[_G | None, str, tuple[str, ...]]] = {init: (None, "initial state", ())}
    depth_of: dict[_G, int] = {init: 0}
    succ: dict[_G, list[_G]] = {}
    queue: deque[_G] = deque([init])

    def trace_to(g: _G, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
        steps = []
        cur: _G | None = g
        while cur is not None:
            par, label, notes = parent[cur]
            if par is not None:
                steps.append((label, notes))
            cur = par
        steps.reverse()
        lines = []
        for n, (label, notes) in enumerate(steps, 1):
            lines.append(f"{n:3d}. {label}")
            for note in notes:
                lines.append(f"       {note}")
        return tuple(lines) + extra

    try:
        system.check_state(init)
        while queue:
            g = queue.popleft()
            d = depth_of[g]
            full = d < b.depth
            nexts: list[_G] = []
            for label, action in system.actions(g, full):
                result.transitions += 1
                try:
                    ng, notes = system.apply(g, action)
                    if ng not in parent:
                        parent[ng] = (g, label, tuple(notes))
                        system.check_state(ng)
                except _Fail as f:
                    lines = trace_to(g)
                    n = sum(1 for x in lines if x[:5].strip().rstrip(".").isdigit())
                    tail = (f"{n + 1:3d}. {label}   <-- violates {f.prop}",)
                    result.violation = Violation(f.prop, f.message, lines + tail)
                    return result
                nexts.append(ng)
                if ng not in depth_of:
                    depth_of[ng] = d + 1
                    result.max_depth = max(result.max_depth, d + 1)
                    if d + 1 > b.depth:
                        result.frontier_closure += 1
                    queue.append(ng)
                    if len(depth_of) > b.max_states:
                        result.truncated = True
                        return result
                    if progress and len(depth_of) % 50000 == 0:
                        print(f"  … {len(depth_of):,} states", file=sys.stderr)
            succ[g] = nexts
        # liveness: every state can reach a quiescent one
        good = {g for g in depth_of if system.quiescent(g)}
        pred: dict[_G, list[_G]] = {}
        for g, ns in succ.items():
            for n in ns:
                pred.setdefault(n, []).append(g)
        can = set(good)
        work = deque(good)
        while work:
            n = work.popleft()
            for p in pred.get(n, ()):
                if p not in can:
                    can.add(p)
                    work.append(p)
        stuck = [g for g in depth_of if g not in can]
        if stuck:
            worst = min(stuck, key=lambda g: depth_of[g])
            result.violation = Violation(
                "no_stuck_ids",
                f"from this state no quiescent state is reachable: {system.stuck_report(worst)} "
                f"({len(stuck):,} stuck states in all)",
                trace_to(worst),
            )
        return result
    finally:
        result.states = len(depth_of)
        result.core_steps = system.cores.core_steps
        result.seconds = time.perf_counter() - t0


def format_result(r: Result) -> str:
    b = r.bounds
    head = (
        f"kvtier model check{f' (planted bug: {r.bug})' if r.bug else ''}: ids={b.ids} consumers={b.consumers} "
        f"depth={b.depth} faults={b.faults} chunks={b.chunks} loads_per_id={b.loads_per_id} crashes={b.crashes} "
        f"tombstone_max={b.tombstone_max} max_pending={b.max_pending} park_clock={b.park_clock}"
        f"{' drain' if b.drain else ''}{' shutdown' if b.shutdown else ''}{' reorder' if b.reorder else ''}"
    )
    lines = [
        head,
        f"explored {r.states:,} states and {r.transitions:,} transitions in {r.seconds:.1f} s "
        f"(BFS depth {b.depth}, then {r.frontier_closure:,} states of completion closure; deepest {r.max_depth}; "
        f"{r.core_steps:,} distinct core steps)",
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
    ap.add_argument("--reorder", action="store_true")
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
