"""State encoding: real :class:`~kvtier.lifecycle.TierCore` objects as small hashable values.

The model holds no core objects.  Each core is a **snapshot** — a canonical tuple of its records'
fields (sorted by key) plus the counters that are state (``_next_gen``, ``_next_round``, the
producer's ``retained`` order) — interned as a small int.  A core step
(:meth:`Cores.step`) restores a fresh ``TierCore`` from the snapshot (the machines' own
``on_state_change`` rebuilds every index), feeds it one input, and interns the resulting snapshot.
Steps are memoised on ``(snapshot, input)``, so each distinct local step runs the real core once
however many global states share it; messages are interned the same way (states hold message ids,
not :class:`~kvtier.testing.fakenet.Envelope` objects).

Two guards keep the codec honest as the core evolves:

* a probe core is inspected at start-up: an attribute the codec does not know (neither
  configuration, nor an index rebuilt by ``on_state_change``, nor snapshotted state) stops the
  check with a message naming it;
* every new snapshot is restored once and compared with the live core it came from (indexes and
  snapshot must both agree).

Restored deadlines are armed at +inf: they never fire on their own.  Abstract time
(:mod:`.clock`) chooses which armed deadline fires by re-arming it at ``now``.

How an input reaches the core's API is not this module's business: :class:`Cores` is given a
``feed`` function (the composed system's, :meth:`.system.System.feed`), which dispatches each
input to the part of the environment that owns its kind.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from kvtier.lifecycle.core import CoreSettings, TierCore
from kvtier.lifecycle.producer import RETAINED as P_RETAINED_STATES
from kvtier.lifecycle.producer import RetainedRecord
from kvtier.lifecycle.session import HelloInput
from kvtier.testing.fakenet import Envelope, to_envelope

__all__ = ["LOCAL", "Codec", "CoreStep", "Cores", "Feed", "Summary", "summarise"]

LOCAL = HelloInput(version=1, block_bytes=16, layout="model-check", hash_seed="")
"""Every core of the model announces the same local configuration, so every hello matches."""

MACHINES = ("sessions", "producer", "consumer")
"""The machines of a core, in snapshot order."""

Feed = Callable[[TierCore, tuple], list]
"""``feed(core, inp) -> effects``: apply one input (with message ids already resolved to
:class:`~kvtier.testing.fakenet.Envelope`) to a restored core."""


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


class Codec:
    """Snapshot a TierCore into a hashable tuple and restore a fresh TierCore from one.

    A snapshot is ``(records, next_gen, next_round, retained, suspect, closing, named)`` where
    ``records`` holds, per machine in :data:`MACHINES` order, the sorted ``(key, field values)`` of
    every record (``key`` and ``tseq`` excluded: the key is the tuple's first item, the deadline
    sequence is re-armed); ``suspect`` is the core's suspect producer instances (sorted),
    ``closing`` whether the producer's shutdown began, ``named`` the producer's named consumers
    (sorted items).  Raises RuntimeError at construction when a machine has an attribute the codec
    does not know.
    """

    # Attributes of the machines: configuration, indexes rebuilt by on_state_change, counters (not
    # state), or state this codec snapshots.  Anything else is new state the codec does not know.
    KNOWN: ClassVar[dict[str, set[str]]] = {
        # _give_ups is empty between inputs (the core settles it before returning; snapshot() checks)
        "core": {"_give_ups", "consumer", "producer", "sessions", "settings", "suspect"},
        "producer": {
            "_deadlines", "_durations", "_effects", "_give_up", "_guards", "awaiting_per_peer", "by_peer", "closing",
            "_prune_at", "_prune_order", "count_evicted", "ignored", "max_pending", "named", "park_clock_last",
            "quarantined", "records", "retained", "tombstone_max",
        },
        "consumer": {
            "_deadlines", "_durations", "_effects", "_give_up", "_guards", "_instance_down", "_next_round",
            "_session_gen", "_session_ready", "by_peer", "ignored", "records",
        },
        "sessions": {
            "_deadlines", "_durations", "_effects", "_guards", "_next_gen", "_on_peer_down", "_on_ready", "ignored",
            "local", "max_peers", "records",
        },
    }

    def __init__(self, settings: CoreSettings) -> None:
        self.settings = settings
        probe = TierCore(settings, LOCAL)
        for name, obj in (("core", probe), *((n, getattr(probe, n)) for n in MACHINES)):
            unknown = set(vars(obj)) - self.KNOWN[name]
            if unknown:
                raise RuntimeError(
                    f"model check: {name} has state the snapshot codec does not know: {sorted(unknown)}; teach "
                    f"tools/modelcheck/encoding.py (Codec) whether it is configuration, an index rebuilt "
                    f"by on_state_change, or state to snapshot and restore"
                )
        self.fields = {
            name: tuple(s for s in _slots(type(getattr(probe, name).new_record("k"))) if s not in ("key", "tseq"))
            for name in MACHINES
        }

    def snapshot(self, core: TierCore) -> tuple:
        if core._give_ups:  # pragma: no cover - a core input returned before settling its give-ups
            raise RuntimeError(f"model check: a core returned with give-ups unsettled: {core._give_ups}")
        parts = []
        for name in MACHINES:
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
            tuple(sorted(core.suspect)),
            core.producer.closing,
            tuple(sorted(core.producer.named.items())),
        )

    def restore(self, snap: tuple) -> TierCore:
        (recs_by_machine, next_gen, next_round, retained, suspect, closing, named) = snap
        core = TierCore(self.settings, LOCAL)
        for name, recs in zip(MACHINES, recs_by_machine):
            m = getattr(core, name)
            fields = self.fields[name]
            for key, values in recs:
                rec = m.new_record(key)
                for f, v in zip(fields, values):
                    setattr(rec, f, _thaw(v))
                if m is core.producer and rec.state in P_RETAINED_STATES:
                    # a retained id is its small record plus its place in ``retained`` (below)
                    rec = RetainedRecord(rec)
                    m.records[key] = rec
                    continue
                m.records[key] = rec
                m.on_state_change(rec, m.INITIAL, rec.state)
                if rec.timer is not None:
                    rec.tseq = m._deadlines.arm(math.inf, key)
        core.sessions._next_gen = next_gen
        core.consumer._next_round = next_round
        # prune deadlines at +inf like every other timer: only a "fire" step runs one
        core.producer.retained = dict.fromkeys(retained, math.inf)
        core.producer._prune_order = collections.deque(retained)
        core.suspect = dict.fromkeys(suspect)
        core.producer.closing = closing
        core.producer.named = dict(named)
        return core

    @staticmethod
    def indexes(core: TierCore) -> tuple:
        p, c = core.producer, core.consumer
        return (
            {k: frozenset(v) for k, v in p.by_peer.items() if v},
            dict(p.awaiting_per_peer),
            list(p.retained),
            frozenset(p.quarantined),
            {k: frozenset(v) for k, v in c.by_peer.items() if v},
        )


@attrs.frozen
class Summary:
    """What the model needs to know about one core snapshot (computed once per snapshot)."""

    producer: dict[str, tuple[str, tuple[int, ...], str | None, int]]
    """kv_request_id -> (state, job ids held, bound peer, bound round)"""
    consumer: dict[str, tuple[str, int, int | None]]
    """kv_request_id -> (state, round, load job id)"""
    sessions: dict[str, tuple[str, int]]
    """peer -> (state, generation)"""
    timers: tuple[tuple[str, str, str], ...]
    """(machine, key, timer) of every record that names a timer, in machine then key order"""
    retained: int
    """how many done/tombstoned ids the producer retains"""


def summarise(core: TierCore) -> Summary:
    timers = []
    for name in MACHINES:
        m = getattr(core, name)
        for key in sorted(m.records):
            rec = m.records[key]
            if rec.timer is not None:
                timers.append((name, key, rec.timer))
    return Summary(
        producer={k: (r.state.value, tuple(r.jobs), r.peer, r.round) for k, r in core.producer.records.items()},
        consumer={k: (r.state.value, r.round, r.job_id) for k, r in core.consumer.records.items()},
        sessions={k: (r.state.value, r.gen) for k, r in core.sessions.records.items()},
        timers=tuple(timers),
        retained=len(core.producer.retained),
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


class Cores:
    """Interned snapshots and messages, and memoised core steps."""

    def __init__(self, settings: CoreSettings, feed: Feed, *, verify: bool = True) -> None:
        self.codec = Codec(settings)
        self.feed = feed
        self.snaps: list[tuple] = []
        self.summaries: list[Summary] = []
        self.ids: dict[tuple, int] = {}
        self.memo: dict[tuple, CoreStep] = {}
        self.verify = verify
        self.core_steps = 0
        self._precs: dict[int, dict[tuple[str, str], tuple]] = {}
        self.msgs: list[Envelope] = []
        self._mids: dict[Envelope, int] = {}

    def fresh(self, **kwargs: Any) -> TierCore:
        """A new core with the model's settings (``kwargs`` go to :class:`TierCore`)."""
        return TierCore(self.codec.settings, LOCAL, **kwargs)

    def mid(self, env: Envelope) -> int:
        """Intern a message: states hold small ints, not Envelope objects."""
        got = self._mids.get(env)
        if got is None:
            got = self._mids[env] = len(self.msgs)
            self.msgs.append(env)
        return got

    def intern(self, core: TierCore) -> int:
        """The snapshot id of ``core`` (a new id, verified by a restore, if the snapshot is new)."""
        snap = self.codec.snapshot(core)
        sid = self.ids.get(snap)
        if sid is None:
            if self.verify:
                again = self.codec.restore(snap)
                if self.codec.indexes(again) != self.codec.indexes(core) or self.codec.snapshot(again) != snap:
                    raise RuntimeError(
                        "model check: restoring a core snapshot does not rebuild the same indexes; the snapshot "
                        "codec in tools/modelcheck/encoding.py is out of date with kvtier/lifecycle"
                    )
            sid = len(self.snaps)
            self.ids[snap] = sid
            self.snaps.append(snap)
            self.summaries.append(summarise(core))
        return sid

    def precords(self, sid: int) -> dict[tuple[str, str], tuple]:
        """(machine, key) -> record fields of snapshot ``sid`` (cached)."""
        got = self._precs.get(sid)
        if got is None:
            recs_by_machine = self.snaps[sid][0]
            got = {}
            for name, recs in zip(MACHINES, recs_by_machine):
                for key, values in recs:
                    got[(name, key)] = values
            self._precs[sid] = got
        return got

    def step(self, name: str, sid: int, inp: tuple) -> CoreStep:
        """Apply input ``inp`` to the core ``name`` (its peer name: "p", "c1"...) in snapshot ``sid``.

        ``inp`` is a tuple whose first item names its kind; a ``("deliver", mid, ...)`` input carries
        an interned message id, resolved here."""
        key = (sid, inp)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        self.core_steps += 1
        core = self.codec.restore(self.snaps[sid])
        effects = self.feed(core, ("deliver", self.msgs[inp[1]], *inp[2:]) if inp[0] == "deliver" else inp)
        envs = tuple(self.mid(e) for e in (to_envelope(name, core, eff) for eff in effects) if e is not None)
        dead = tuple(
            f"{mname} {key} ({rec.state.value}, timer {rec.timer})"
            for mname in MACHINES
            for key, rec in getattr(core, mname).records.items()
            if rec.timer is not None and not getattr(core, mname).timer_token(key)
        )
        snap = self.intern(core)
        result = CoreStep(
            snap, sid, tuple(effects), envs, dead, inp, self.summaries[sid], self.summaries[snap],
            frozenset(type(e) for e in effects),
        )
        self.memo[key] = result
        return result
