"""The whole state of a :class:`~kvtier.lifecycle.TierCore` as one canonical, hashable value, and
a core restored from it.

:func:`export` reads every record of every machine and the few machine-wide facts that are state
(the next session generation and load round, the suspect producer instances, whether shutdown
began, the consumers named before their first store, the rate limit of unsolicited errors) into a
:class:`CoreState`: frozen msgspec records, sorted by key, so two cores that will behave the same
export equal values.  :func:`restore` builds a fresh core from one: records are put in place by
the machines' own index maintenance (the code every transition runs), deadlines are armed at the
times the export names.  ``export(restore(s, ...)) == s`` for every exported ``s``.

What is not state: configuration (settings, our hello), indexes (rebuilt by :func:`restore` and
checked by :func:`index_problems`), counters for metrics (inputs ignored, retained ids evicted
early) and caches.  :data:`KNOWN` classifies every attribute of the core and its machines, and
:func:`unknown_state` names any attribute added later that nobody classified, so the export
cannot silently fall behind the machines.

Two details of a restored core differ from the core it was exported from, by design: deadlines
due at the same instant on one timer fire in key order (the live core fires them in the order
they were armed; nothing in the spec depends on the order of simultaneous deadlines), and the
retained ids' prune order is rebuilt without stale entries (the live core may keep one for an id
that left retention out of order and came back, which only ever delays a prune).

:func:`retime` maps every time in a state (deadlines, when a peer was last heard or did work,
the error rate limit) through a function: a model checker abstracts time with it (what is armed,
not when) and makes exactly one deadline due before a restore.

Nothing here is on a per-message path: exports and restores are for model checkers, tests and
tools, and cost O(records).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from kvtier.lifecycle._table import ConsumerState, ProducerState, Reason, SessionState
from kvtier.lifecycle.consumer import ConsumerRecord
from kvtier.lifecycle.core import CoreSettings, TierCore
from kvtier.lifecycle.deadlines import DeadlineQueue
from kvtier.lifecycle.producer import _NO_BLOCKS, RETAINED, ProducerRecord
from kvtier.lifecycle.session import HelloInput, SessionRecord

__all__ = [
    "KNOWN",
    "ConsumerEntry",
    "CoreState",
    "ProducerEntry",
    "SessionEntry",
    "export",
    "index_problems",
    "indexes",
    "restore",
    "retime",
    "unknown_state",
]


class SessionEntry(msgspec.Struct, frozen=True, gc=False):
    """One session record: its peer, state and reason, the timer its state names and that
    timer's live deadline (seconds, or None), and the session's facts."""

    peer: str
    state: SessionState
    reason: Reason | None
    timer: str | None
    deadline: float | None
    gen: int
    dialled: bool
    instance: str
    principal: str | None
    heard: float
    active: float
    rounds: tuple[int, tuple[int, ...]] = (0, ())
    """The inbound session's round ledger (decision I11): the consumer's low watermark and the
    rounds at or above it already answered, ascending."""


class ProducerEntry(msgspec.Struct, frozen=True, gc=False):
    """One producer record.  ``blocks``: ``(key, pool block, digest)`` per parked key, by key;
    ``deadline``: the live deadline (for a done or tombstoned id: its prune time).  A retained
    id keeps only its state, reason, timer, deadline and named consumer; its other fields read as
    their defaults."""

    kv_request_id: str
    state: ProducerState
    reason: Reason | None
    timer: str | None
    deadline: float | None
    consumer: str | None = None
    owner: str | None = None
    blocks: tuple[tuple[bytes, int, int], ...] = ()
    jobs: tuple[int, ...] = ()
    peer: str | None = None
    principal: str | None = None
    gen: int = 0
    round: int = -1
    demand: tuple[bytes, ...] = ()
    slots: tuple[int, ...] = ()
    supply_complete: bool = False
    receipt: bool = False
    life: str = ""


class ConsumerEntry(msgspec.Struct, frozen=True, gc=False):
    """One consumer record (``landed``: one byte per key, 1 once its block landed)."""

    kv_request_id: str
    state: ConsumerState
    reason: Reason | None
    timer: str | None
    deadline: float | None
    peer: str
    job_id: int | None
    keys: tuple[bytes, ...]
    slots: tuple[int, ...]
    round: int
    landed: bytes
    n_landed: int
    fetched: bool
    engine_finished: bool
    life: str = ""
    notice: Reason | None = None
    digests: tuple[int, ...] = ()
    """Per key, the digest its ``block_data`` carried (a partial load's re-check)."""


class CoreState(msgspec.Struct, frozen=True, gc=False):
    """Everything a :class:`~kvtier.lifecycle.TierCore` will act on, canonically ordered.

    ``retained``: the done/tombstoned ids oldest first (the order they are pruned and evicted
    in); ``suspect``: suspect producer instances, oldest first (the order they are forgotten
    in); ``named``: ``(kv_request_id, consumer)`` named before the id's first store, by id;
    ``error_replies``: ``(peer, wire reason, when)`` of the last unsolicited ``error`` answer."""

    sessions: tuple[SessionEntry, ...]
    producer: tuple[ProducerEntry, ...]
    consumer: tuple[ConsumerEntry, ...]
    retained: tuple[str, ...]
    next_gen: int
    next_round: int
    suspect: tuple[str, ...]
    closing: bool
    named: tuple[tuple[str, str], ...]
    error_replies: tuple[tuple[str, str, float], ...]
    gone: tuple[str, ...] = ()
    """Suspect instances whose last session ended as if their process was gone (decision I18),
    oldest first."""
    last_instance: tuple[tuple[str, str], ...] = ()
    """``(peer address, instance)`` last heard there, oldest first (the order they are forgotten in)."""
    last_gen: tuple[tuple[str, int], ...] = ()
    """``(peer address, generation)`` of the last session there a hello names as ``replaces``, oldest first."""


#: Every attribute of the core and of each machine, by what it is: ``state`` (exported),
#: ``index`` (rebuilt by :func:`restore`, checked by :func:`index_problems`), ``config``,
#: ``counter`` (metrics, not state), ``cache``, ``machine`` (one of the core's machines) or
#: ``symmetric`` (a machine of the symmetric path: :func:`export` refuses a core where one holds
#: records, :func:`restore` leaves them empty).
#: :func:`unknown_state` checks it is complete.
KNOWN: dict[str, dict[str, str]] = {
    "core": {
        "settings": "config", "_notes": "state", "_producer": "machine", "_sessions": "machine",
        "_consumer": "machine", "_error_replies": "state", "_APPLY": "config", "_RECEIVE": "config",
        "_ROUTE": "config", "_machines": "config", "_probe": "symmetric", "_rounds": "symmetric",
        "_serve": "symmetric",
    },
    "session": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "peer_timeout_s": "config", "max_peers": "config", "local": "config",
        "_notes": "config", "_next_gen": "state", "suspect": "state", "gone": "state", "last_instance": "state",
        "last_gen": "state",
    },
    "producer": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "park_clock_last": "config", "tombstone_max": "config", "max_pending": "config",
        "by_peer": "index", "awaiting_per_peer": "index", "quarantined": "index", "retained": "state",
        "_prune_order": "index", "_prune_at": "cache", "count_evicted": "counter", "closing": "state",
        "named": "state", "_notes": "config",
    },
    "consumer": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "_sessions": "config", "_notes": "config", "_one_sided": "config",
        "by_peer": "index", "_next_round": "state", "_open": "index", "_revoke_bounded": "config",
        "integrity": "config", "rounds": "config",
    },
}

#: Record slots each entry type carries (``key`` is the entry's first field, ``tseq`` the
#: deadline's handle: neither is stored as such).
_SLOTS = {
    "session": (SessionRecord, SessionEntry),
    "producer": (ProducerRecord, ProducerEntry),
    "consumer": (ConsumerRecord, ConsumerEntry),
}


#: Record slots rebuilt from other state instead of exported: a bound producer record shares its
#: session's round ledger.
_DERIVED = {"producer": {"rounds"}}


def _symmetric(core: TierCore) -> dict[str, Any]:
    return {"probe": core._probe, "rounds": core._rounds, "serve": core._serve}


def _parts(core: TierCore) -> dict[str, Any]:
    return {"core": core, "session": core._sessions, "producer": core._producer, "consumer": core._consumer}


def _slots(cls: type) -> set[str]:
    return {s for klass in cls.__mro__ for s in getattr(klass, "__slots__", ())}


def unknown_state(core: TierCore) -> list[str]:
    """Attributes of ``core`` or its machines that :data:`KNOWN` does not classify, and record
    slots the entries do not carry, as ``"<part>.<name>"`` (empty when the export is complete)."""
    out = [f"{name}.{attr}" for name, obj in _parts(core).items() for attr in sorted(vars(obj))
           if attr not in KNOWN[name]]
    for name, (rec_cls, entry_cls) in _SLOTS.items():
        carried = set(entry_cls.__struct_fields__) | {"key", "tseq"} | _DERIVED.get(name, set())
        out.extend(f"{name} record.{s}" for s in sorted(_slots(rec_cls) - carried))
    return out


def _deadlines(machine: Any) -> dict[Any, float]:
    return {key: when for when, _seq, key, _lane in machine._deadlines.live(machine._is_live)}


def export(core: TierCore) -> CoreState:
    """The whole state of ``core`` (between inputs).  O(records).

    Raises:
        RuntimeError: a note between machines is still queued (only possible from inside an
            input: :meth:`TierCore.handle` routes every note before it returns).
    """
    if core._notes:
        raise RuntimeError(f"export: notes still queued between machines: {list(core._notes)}")
    busy = [name for name, m in _symmetric(core).items() if m.records]
    if busy:
        # the model checker explores PD hand-offs only; tests/symmetric explores these machines
        raise NotImplementedError(f"export: the symmetric path's machines hold records ({busy}); they are not exported")
    sm, pm, cm = core._sessions, core._producer, core._consumer
    due = _deadlines(sm)
    sessions = tuple(
        SessionEntry(r.key, r.state, r.reason, r.timer, due.get(r.key), r.gen, r.dialled, r.instance, r.principal,
                     r.heard, r.active, (r.rounds.low, tuple(sorted(r.rounds.answered))))
        for _, r in sorted(sm.records.items())
    )
    due = _deadlines(pm)
    producer = []
    for kid, r in sorted(pm.records.items()):
        if r.state in RETAINED:
            producer.append(ProducerEntry(kid, r.state, r.reason, r.timer, pm.retained.get(kid), r.consumer))
            continue
        producer.append(ProducerEntry(
            kid, r.state, r.reason, r.timer, due.get(kid), r.consumer, r.owner,
            tuple(sorted((k, b, d) for k, (b, d) in r.blocks.items())), tuple(r.jobs), r.peer, r.principal, r.gen,
            r.round, tuple(r.demand), tuple(r.slots), r.supply_complete, r.receipt, r.life,
        ))
    due = _deadlines(cm)
    consumer = tuple(
        ConsumerEntry(kid, r.state, r.reason, r.timer, due.get(kid), r.peer, r.job_id, tuple(r.keys),
                      tuple(r.slots), r.round, bytes(r.landed), r.n_landed, r.fetched, r.engine_finished, r.life,
                      r.notice, tuple(r.digests))
        for kid, r in sorted(cm.records.items())
    )
    return CoreState(
        sessions=sessions,
        producer=tuple(producer),
        consumer=consumer,
        retained=tuple(pm.retained),
        next_gen=sm._next_gen,
        next_round=cm._next_round,
        suspect=tuple(sm.suspect),
        closing=pm.closing,
        named=tuple(sorted(pm.named.items())),
        error_replies=tuple(sorted((peer, reason, when) for (peer, reason), when in core._error_replies.items())),
        gone=tuple(sm.gone),
        last_instance=tuple(sm.last_instance.items()),
        last_gen=tuple(sm.last_gen.items()),
    )


#: What a reset sets the scalar attributes that are not configuration to (containers are emptied
#: in place instead); a scalar classified later without an entry here fails the reset loudly.
_FRESH: dict[tuple[str, str], Any] = {
    ("session", "ignored"): 0, ("session", "_next_gen"): 0,
    ("producer", "ignored"): 0, ("producer", "count_evicted"): 0, ("producer", "closing"): False,
    ("producer", "_prune_at"): (math.nan, math.nan),
    ("consumer", "ignored"): 0, ("consumer", "_next_round"): 0,
}


def _reset(core: TierCore) -> None:
    """Empty ``core`` as if it were new (configuration and compiled rules kept)."""
    for name, obj in _parts(core).items():
        for attr, kind in KNOWN[name].items():
            if kind in ("config", "machine", "symmetric"):
                continue
            value = getattr(obj, attr)
            if isinstance(value, (dict, set, deque, list, DeadlineQueue)):
                value.clear()  # in place: the compiled rules hold some of these
            else:
                setattr(obj, attr, _FRESH[(name, attr)])


def restore(state: CoreState, settings: CoreSettings, local: HelloInput, *, into: TierCore | None = None) -> TierCore:
    """A core with ``settings`` and our hello ``local`` in ``state``: each record entered
    through its machine's index maintenance, each deadline armed at the time ``state`` names
    (``math.inf``: armed, never due by itself).  O(records log records).

    ``into``: a core built with the same ``settings`` to reuse (emptied first) instead of building
    a new one — a model checker restores thousands of states, and building a core compiles its
    tables.

    Raises:
        ValueError: ``into`` was built with other settings.
    """
    if into is None:
        core = TierCore(settings, local)
    else:
        if into.settings != settings:
            raise ValueError("restore: the core to restore into has other settings")
        core = into
        _reset(core)
        core.set_local(local)
    sm, pm, cm = core._sessions, core._producer, core._consumer
    timed: dict[str, list[tuple[float, Any, Any]]] = {"session": [], "producer": [], "consumer": []}
    for e in state.sessions:
        rec = SessionRecord(e.peer)
        rec.state, rec.reason, rec.timer = e.state, e.reason, e.timer
        rec.gen, rec.dialled, rec.instance, rec.principal, rec.heard, rec.active = (
            e.gen, e.dialled, e.instance, e.principal, e.heard, e.active)
        rec.rounds.low, rec.rounds.answered = e.rounds[0], set(e.rounds[1])
        _enter(sm, rec, timed["session"], e.deadline)
    prune_at: dict[str, float] = {}
    for e in state.producer:
        rec = ProducerRecord(e.kv_request_id)
        rec.state, rec.reason, rec.timer, rec.consumer = e.state, e.reason, e.timer, e.consumer
        if e.state in RETAINED:
            prune_at[e.kv_request_id] = math.inf if e.deadline is None else e.deadline
            for op in pm.index_ops(pm.INITIAL, e.state):
                op(rec)
            continue
        rec.owner = e.owner
        rec.blocks = {k: (b, d) for k, b, d in e.blocks} if e.blocks else _NO_BLOCKS
        rec.jobs = list(e.jobs)
        rec.peer, rec.principal, rec.gen, rec.round = e.peer, e.principal, e.gen, e.round
        rec.demand, rec.slots, rec.supply_complete, rec.receipt = e.demand, e.slots, e.supply_complete, e.receipt
        rec.life = e.life
        if e.state in _P_BOUND:
            session = sm.records.get(e.peer)
            rec.rounds = session.rounds if session is not None and session.gen == e.gen else None
        _enter(pm, rec, timed["producer"], e.deadline)
    pm.retained = {kid: prune_at[kid] for kid in state.retained}
    pm._prune_order = deque(state.retained)
    for e in state.consumer:
        rec = ConsumerRecord(e.kv_request_id)
        rec.state, rec.reason, rec.timer = e.state, e.reason, e.timer
        rec.peer, rec.job_id, rec.keys, rec.slots, rec.round = e.peer, e.job_id, e.keys, e.slots, e.round
        rec.landed, rec.n_landed, rec.fetched, rec.engine_finished = (
            bytearray(e.landed), e.n_landed, e.fetched, e.engine_finished)
        rec.life, rec.notice, rec.digests = e.life, e.notice, list(e.digests)
        _enter(cm, rec, timed["consumer"], e.deadline)
    for peer, rounds in list(cm._open.items()):  # rounds only grow: the index is in round order
        cm._open[peer] = dict.fromkeys(sorted(rounds))
    for name, machine in (("session", sm), ("producer", pm), ("consumer", cm)):
        for when, key, rec in sorted(timed[name], key=lambda t: (t[0], t[1])):
            rec.tseq = machine._deadlines.arm(when, key, rec.timer)
    sm._next_gen = state.next_gen
    cm._next_round = state.next_round
    sm.suspect = dict.fromkeys(state.suspect)
    sm.gone = dict.fromkeys(state.gone)
    sm.last_instance = dict(state.last_instance)
    sm.last_gen = dict(state.last_gen)
    pm.closing = state.closing
    pm.named = dict(state.named)
    core._error_replies = {(peer, reason): when for peer, reason, when in state.error_replies}
    return core


def _enter(machine: Any, rec: Any, timed: list, deadline: float | None) -> None:
    """Index ``rec`` as a transition from the initial state to its state would, and queue its
    deadline (armed once every record is in place, in firing order)."""
    for op in machine.index_ops(machine.INITIAL, rec.state):
        op(rec)
    if deadline is not None and rec.timer is not None:
        timed.append((deadline, rec.key, rec))


Clock = Callable[[str, str, str, float], float]
"""``clock(kind, machine, key, t) -> t'``: ``kind`` is ``"deadline"`` (``machine`` is
``"session"``, ``"producer"`` or ``"consumer"``), ``"heard"`` or ``"active"`` (a session's,
``machine`` ``"session"``) or ``"error_reply"`` (``machine`` ``"core"``, ``key`` the peer)."""


def retime(state: CoreState, clock: Clock) -> CoreState:
    """``state`` with every time in it replaced by ``clock(kind, machine, key, t)`` (see
    :data:`Clock`); deadlines that are None (nothing armed) stay None."""
    replace = msgspec.structs.replace

    def dl(machine: str, key: str, t: float | None) -> float | None:
        return None if t is None else clock("deadline", machine, key, t)

    return replace(
        state,
        sessions=tuple(replace(e, deadline=dl("session", e.peer, e.deadline),
                               heard=clock("heard", "session", e.peer, e.heard),
                               active=clock("active", "session", e.peer, e.active)) for e in state.sessions),
        producer=tuple(replace(e, deadline=dl("producer", e.kv_request_id, e.deadline)) for e in state.producer),
        consumer=tuple(replace(e, deadline=dl("consumer", e.kv_request_id, e.deadline)) for e in state.consumer),
        error_replies=tuple((p, r, clock("error_reply", "core", p, t)) for p, r, t in state.error_replies),
    )


def indexes(core: TierCore) -> tuple:
    """The indexes the machines keep beside their records, canonically: the producer's ids per
    bound peer, fetches awaiting blocks per peer, quarantined ids, retained ids (in prune order),
    and the consumer's ids per producer peer."""
    pm, cm = core._producer, core._consumer
    return (
        tuple(sorted((peer, tuple(sorted(ids))) for peer, ids in pm.by_peer.items() if ids)),
        tuple(sorted(pm.awaiting_per_peer.items())),
        tuple(sorted(pm.quarantined)),
        tuple(pm.retained),
        tuple(sorted((peer, tuple(sorted(ids))) for peer, ids in cm.by_peer.items() if ids)),
    )


_P_BOUND = frozenset({
    ProducerState.AWAITING, ProducerState.SERVING, ProducerState.DELIVERING, ProducerState.CONFIRMED,
    ProducerState.CANCELLING, ProducerState.QUARANTINED,
})


def index_problems(core: TierCore) -> list[str]:
    """Where an index disagrees with a scan of the records it indexes (empty when none does):
    the shell reads the indexes instead of scanning (quarantine gauge and log every tick, the
    per-peer fan-out of a session's end), so a drifted index is a wrong gauge or a missed end."""
    pm, cm = core._producer, core._consumer
    recs = pm.records.values()
    out = []
    bound: dict[str, set[str]] = {}
    awaiting: dict[str, int] = {}
    for r in recs:
        if r.state in _P_BOUND:
            bound.setdefault(r.peer, set()).add(r.key)
        if r.state is ProducerState.AWAITING:
            awaiting[r.peer] = awaiting.get(r.peer, 0) + 1
    checks = (
        ("producer ids per bound peer", {p: set(ids) for p, ids in pm.by_peer.items() if ids}, bound),
        ("producer fetches awaiting blocks per peer", dict(pm.awaiting_per_peer), awaiting),
        ("quarantined producer ids", set(pm.quarantined), {r.key for r in recs if r.state is ProducerState.QUARANTINED}),
        ("retained producer ids", set(pm.retained), {r.key for r in recs if r.state in RETAINED}),
        ("consumer ids per producer peer", {p: set(ids) for p, ids in cm.by_peer.items() if ids},
         _group((r.peer, r.key) for r in cm.records.values())),
    )
    for what, index, scan in checks:
        if index != scan:
            out.append(f"{what}: index {index} != records {scan}")
    missing = [k for k in pm.retained if k not in set(pm._prune_order)]
    if missing:
        out.append(f"retained ids missing from the prune order: {missing}")
    return out


def _group(pairs: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for peer, key in pairs:
        out.setdefault(peer, set()).add(key)
    return out
