"""Cores as small hashable values: interned exports, interned messages, memoised core steps.

The model holds no core objects.  Each core is its **export** (:func:`tools.snapshot.export`,
a canonical :class:`~tools.snapshot.CoreState`) with its times abstracted
(:func:`timeless`: what is armed, not when; every peer heard "now"), interned as a small int.  A
core step (:meth:`Cores.step`) hands the interned state to the composed system's ``feed``, which
restores a real :class:`~kvtier.lifecycle.TierCore` from it
(:func:`~tools.snapshot.restore`), drives it through
:func:`kvtier.lifecycle.driver.drive` and returns the core; the step's result is exported and
interned.  Steps are memoised on ``(snapshot, input)``, so each distinct local step runs the real
core once however many global states share it; messages are interned the same way (states hold
message ids, not :class:`~tools.fakenet.Envelope` objects).

Nothing here reads or writes a machine's records: the export and restore live in
``kvtier/lifecycle``, and two guards keep them honest as the core evolves:

* at start-up, :func:`tools.snapshot.unknown_state` must name no attribute of a core
  that the export does not classify;
* every new snapshot is restored once and compared with the live core it came from: the restored
  core must export the same state and rebuild the same indexes
  (:func:`~tools.snapshot.indexes`), and the live core's indexes must match its records
  (:func:`~tools.snapshot.index_problems`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import msgspec

from kvtier.lifecycle.blockstates import BlockStates
from kvtier.lifecycle.core import CoreSettings, TierCore
from kvtier.lifecycle.effects import Send, SendBlocks
from kvtier.lifecycle.session import HelloInput
from kvtier.wire import messages as wm
from tools import snapshot
from tools.coreview import CoreView
from tools.fakenet import Envelope
from tools.snapshot import CoreState

__all__ = ["LOCAL", "CoreStep", "Cores", "Feed", "Summary", "summarise", "timeless"]

LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="model-check", hash_seed="",
                   instance="model")
"""Every core of the model announces the same local configuration, so every hello matches."""

MACHINES = ("session", "producer", "consumer", "probe", "rounds", "serve")
"""The machines of a core, in the order the summary lists their timers."""

Feed = Callable[[str, CoreState, tuple], tuple[TierCore, list, bool]]
"""``feed(name, state, inp) -> (core, effects, early)``: restore core ``name`` from ``state``, apply
input ``inp`` (message ids already resolved to :class:`~tools.fakenet.Envelope`) through
the driver, and return the core after the step, every effect performed, and whether a deadline
fired while input that arrived before it was still unapplied."""


def _key(entry: Any) -> Any:
    """The record key of an export entry: its first field (peer or kv_request_id), or for the
    symmetric path's keyed-by-round machines the tuple the machine keys it by."""
    if isinstance(entry, snapshot.ServeEntry):
        return (entry.peer, entry.kv_request_id, entry.round)
    return getattr(entry, entry.__struct_fields__[0])


def _entries(state: CoreState) -> tuple[tuple[str, Any, Any], ...]:
    """(machine, key, entry) of every record of ``state``, machine by machine (:data:`MACHINES`)."""
    return (
        *(("session", e.peer, e) for e in state.sessions),
        *(("producer", e.kv_request_id, e) for e in state.producer),
        *(("consumer", e.kv_request_id, e) for e in state.consumer),
        *(("probe", e.kv_request_id, e) for e in state.probe),
        *(("rounds", (e.kv_request_id, e.round), e) for e in state.rounds),
        *(("serve", _key(e), e) for e in state.serve),
    )


def _abstract(kind: str, machine: str, key: str, t: float) -> float:
    return math.inf if kind == "deadline" else 0.0


def timeless(state: CoreState) -> CoreState:
    """``state`` with time abstracted: every armed deadline at +inf (armed, never due by itself),
    every session heard and active at 0 (the model's one instant), and every load's own deadline
    at 0 too: when its abort's answer is overdue the load's deadline has passed, so the model
    explores the ending; waiting again (L19) only restarts a timer, a step that changes nothing."""
    return snapshot.retime(state, _abstract)


@attrs.frozen
class Summary:
    """What the model needs to know about one core snapshot (computed once per snapshot)."""

    producer: dict[str, tuple[str, tuple[int, ...], str | None, int]]
    """kv_request_id -> (state, job ids held, bound peer, bound round)"""
    consumer: dict[str, tuple[str, int, int | None]]
    """kv_request_id -> (state, round, load job id)"""
    sessions: dict[str, tuple[str, int, bool]]
    """peer -> (state, generation, dialled)"""
    timers: tuple[tuple[str, str, str], ...]
    """(machine, key, timer) of every live deadline, in machine then key order"""
    dead_timers: tuple[str, ...]
    """records whose state names a timer but that have no live deadline"""
    retained: int
    """how many done/tombstoned ids the producer retains"""
    rounds: dict[str, tuple[int, tuple[int, ...]]] = attrs.Factory(dict)
    """peer -> the inbound session's round ledger (low watermark, rounds answered above it):
    a fetch of such a round is a duplicate or overtaken, dropped unanswered (decision I11)"""
    probe: dict[str, tuple[str, int, tuple[bytes, ...], tuple[bytes, ...]]] = attrs.Factory(dict)
    """the symmetric path: kv_request_id -> (probe state, open round, keys offered, keys loading)"""
    answers: dict[tuple[str, bytes], str] = attrs.Factory(dict)
    """(kv_request_id, key) -> what a lookup answers now (``TierCore.probe_answers``, asked of the
    live core), for every key the probe knows; any other key answers ``miss``"""
    loads: dict[tuple[str, int], tuple[str, int | None]] = attrs.Factory(dict)
    """(kv_request_id, round) -> (state, job id) of each symmetric round's load"""
    serve: dict[tuple[str, str, int], tuple[str, tuple[int, ...], dict[bytes, int]]] = attrs.Factory(dict)
    """(peer, kv_request_id, round) -> (serve state, pins held, key -> pool block found)"""
    fetched: dict[tuple[str, int], tuple[tuple[bytes, ...], int]] = attrs.Factory(dict)
    """(kv_request_id, round) of every load (PD and symmetric rounds) -> (the keys it fetches,
    how many of them from the first landed verified: its verified prefix)"""
    gone: tuple[str, ...] = ()
    """producer instances the core holds proven gone (decision I23)"""
    missed: dict[str, frozenset[bytes]] = attrs.Factory(dict)
    """the symmetric path: kv_request_id -> the keys its probe answers MISS for the request's life"""


def summarise(state: CoreState, core: TierCore | None = None) -> Summary:
    """What the model reads of ``state``; ``core`` (the live core ``state`` was exported from)
    answers the lookups of the symmetric path's keys (the answer is the core's, never the
    model's reading of the record)."""
    timers = []
    dead = []
    for machine, key, e in _entries(state):
        if e.deadline is not None:
            timers.append((machine, key, e.timer))
        elif e.timer is not None:
            dead.append(f"{machine} {key} ({e.state.value}, timer {e.timer})")
    answers = {}
    if core is not None:
        for e in state.probe:
            for k in {*e.unsent, *e.waiting, *e.offered, *e.miss, *(k for k, _ in e.loading)}:
                answers[(e.kv_request_id, k)] = CoreView(core).probe_answer(e.kv_request_id, k).value
    return Summary(
        producer={e.kv_request_id: (e.state.value, e.jobs, e.peer, e.round) for e in state.producer},
        consumer={e.kv_request_id: (e.state.value, e.round, e.job_id) for e in state.consumer},
        sessions={e.peer: (e.state.value, e.gen, e.dialled) for e in state.sessions},
        timers=tuple(timers),
        dead_timers=tuple(dead),
        retained=len(state.retained),
        rounds={e.peer: e.rounds for e in state.sessions},
        probe={e.kv_request_id: (e.state.value, e.round, e.offered, tuple(k for k, _ in e.loading))
               for e in state.probe},
        answers=answers,
        loads={(e.kv_request_id, e.round): (e.state.value, e.job_id) for e in state.rounds},
        serve={_key(e): (e.state.value, e.pins, dict(e.found)) for e in state.serve},
        fetched={(e.kv_request_id, e.round): (e.keys, BlockStates.from_raw(e.landed).prefix())
                 for e in (*state.consumer, *state.rounds)},
        gone=state.gone,
        missed={e.kv_request_id: frozenset(e.miss) for e in state.probe},
    )


@attrs.frozen
class CoreStep:
    """The memoised outcome of one core step (what the properties and the environment read)."""

    snap: int
    """the snapshot id after the step"""
    pre_snap: int
    """the snapshot id before the step"""
    effects: tuple
    envelopes: tuple[int, ...]
    """message ids (see :meth:`Cores.mid`) of the messages the effects put on the wire, in order"""
    dead_timers: tuple[str, ...]
    """records that name a timer but have no live deadline after the step"""
    inp: tuple
    """the input (a ``("deliver", mid)`` input carries an interned message id)"""
    pre: Summary
    """the core before the step"""
    post: Summary
    """the core after the step"""
    types: frozenset[type]
    """the types of ``effects`` (a cheap "does this step emit X" test: most steps emit little)"""
    early: bool = False
    """a deadline fired while input that arrived before it fell due was still unapplied"""


def envelope_of(src: str, eff: Any) -> Envelope | None:
    """The message an effect of core ``src`` puts on the wire: a ``Send``'s message, or the one
    ``block_data`` of a ``SendBlocks`` (payloads are the plane's, not the model's)."""
    t = type(eff)
    if t is Send:
        return Envelope(src, eff.peer, eff.msg)
    if t is SendBlocks and eff.blocks:
        msg = wm.BlockData(gen=eff.gen, kv_request_id=eff.kv_request_id, round=eff.round, first=0,
                           count=len(eff.blocks), digests=list(eff.digests))
        return Envelope(src, eff.peer, msg, eff.blocks)
    return None


class Cores:
    """Interned snapshots and messages, and memoised core steps."""

    def __init__(self, settings: CoreSettings, feed: Feed, *, verify: bool = True) -> None:
        self.settings = settings
        unknown = snapshot.unknown_state(TierCore(settings, LOCAL))
        if unknown:
            raise RuntimeError(
                f"model check: the core has state tools.snapshot does not export: {unknown}; classify it "
                f"there (KNOWN) and export it if it is state"
            )
        self.feed = feed
        self.snaps: list[CoreState] = []
        self.summaries: list[Summary] = []
        self.ids: dict[CoreState, int] = {}
        self.memo: dict[tuple, CoreStep] = {}
        self.verify = verify
        self.core_steps = 0
        self._precs: dict[int, dict[tuple[str, str], Any]] = {}
        self.msgs: list[Envelope] = []
        self._mids: dict[tuple, int] = {}
        # two scratch cores, restored into for every step and every verification (building a core
        # compiles its tables: most of a step's cost otherwise)
        self._scratch = TierCore(settings, LOCAL)
        self._check = TierCore(settings, LOCAL)

    def fresh(self, **kwargs: Any) -> TierCore:
        """A new core with the model's settings (``kwargs`` go to :class:`TierCore`)."""
        return TierCore(self.settings, LOCAL, **kwargs)

    def restore(self, state: CoreState, *, scratch: bool = False) -> TierCore:
        """A core in ``state``: a new one, or (``scratch``) the step's scratch core, valid until the
        next scratch restore."""
        return snapshot.restore(state, self.settings, LOCAL, into=self._scratch if scratch else None)

    def mid(self, env: Envelope) -> int:
        """Intern a message: states hold small ints, not Envelope objects."""
        key = (env.src, env.dst, msgspec.msgpack.encode(env.msg), env.blocks)
        got = self._mids.get(key)
        if got is None:
            got = self._mids[key] = len(self.msgs)
            self.msgs.append(env)
        return got

    def intern(self, core: TierCore) -> int:
        """The snapshot id of ``core`` (a new id, verified by a restore, if the snapshot is new)."""
        state = timeless(snapshot.export(core))
        sid = self.ids.get(state)
        if sid is None:
            if self.verify:
                self._verify(core, state)
            sid = len(self.snaps)
            self.ids[state] = sid
            self.snaps.append(state)
            self.summaries.append(summarise(state, core))
        return sid

    def _verify(self, core: TierCore, state: CoreState) -> None:
        problems = snapshot.index_problems(core)
        again = snapshot.restore(state, self.settings, LOCAL, into=self._check)
        if timeless(snapshot.export(again)) != state:
            problems.append("a restored core exports another state")
        if snapshot.indexes(again) != snapshot.indexes(core):
            problems.append(f"a restored core rebuilds other indexes: {snapshot.indexes(again)} != "
                            f"{snapshot.indexes(core)}")
        if problems:
            raise RuntimeError("model check: tools.snapshot is out of date with the machines: "
                               + "; ".join(problems))

    def precords(self, sid: int) -> dict[tuple[str, str], Any]:
        """(machine, key) -> the record's entry in snapshot ``sid`` (cached)."""
        got = self._precs.get(sid)
        if got is None:
            state = self.snaps[sid]
            got = {(machine, key): e for machine, key, e in _entries(state)}
            self._precs[sid] = got
        return got

    def shared(self, sid: int) -> tuple:
        """The machine-wide part of snapshot ``sid`` (everything but the records)."""
        s = self.snaps[sid]
        return (s.retained, s.next_gen, s.next_round, s.suspect, s.closing, s.named, s.error_replies, s.serve_closing,
                s.serve_withdrawn)

    def step(self, name: str, sid: int, inp: tuple) -> CoreStep:
        """Apply input ``inp`` to the core ``name`` (its peer name: "p", "c1"...) in snapshot ``sid``.

        ``inp`` is a tuple whose first item names its kind; a ``("deliver", mid, ...)`` input carries
        an interned message id, resolved here (a ``("fire", ...)`` input names the ids of the unread
        messages that concern its deadline in its last item)."""
        key = (sid, inp)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        self.core_steps += 1
        if inp[0] == "deliver":
            resolved = ("deliver", self.msgs[inp[1]], *inp[2:])
        elif inp[0] == "fire":
            resolved = (*inp[:-1], tuple(self.msgs[m] for m in inp[-1]))
        else:
            resolved = inp
        core, effects, early = self.feed(name, self.snaps[sid], resolved)
        envs = tuple(self.mid(e) for e in (envelope_of(name, eff) for eff in effects) if e is not None)
        snap = self.intern(core)
        post = self.summaries[snap]
        result = CoreStep(
            snap, sid, tuple(effects), envs, post.dead_timers, inp, self.summaries[sid], post,
            frozenset(type(e) for e in effects), early,
        )
        self.memo[key] = result
        return result
