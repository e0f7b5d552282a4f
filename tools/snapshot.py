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

from kvtier.lifecycle._table import ConsumerState, ProbeState, ProducerState, Reason, ServeState, SessionState
from kvtier.lifecycle.blockstates import BlockStates
from kvtier.lifecycle.consumer import ConsumerRecord
from kvtier.lifecycle.core import CoreSettings, TierCore
from kvtier.lifecycle.deadlines import DeadlineQueue
from kvtier.lifecycle.probe import ProbeRecord
from kvtier.lifecycle.producer_records import _NO_BLOCKS, RETAINED, ProducerRecord
from kvtier.lifecycle.serve import ServeRecord, transfer_key
from kvtier.lifecycle.session import HelloInput, SessionRecord
from tools.snapshot_indexes import P_BOUND, index_problems, indexes

__all__ = [
    "KNOWN",
    "ConsumerEntry",
    "CoreState",
    "ProbeEntry",
    "ProducerEntry",
    "ServeEntry",
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
    id keeps only its state, reason, timer, deadline, named consumer and ender; its other fields read
    as their defaults."""

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
    ender: str | None = None
    """the principal that ended the id before any producer request named a consumer (decision L17)"""


class ConsumerEntry(msgspec.Struct, frozen=True, gc=False):
    """One consumer record (``landed``: one byte per key, its :class:`~kvtier.lifecycle.blockstates.BlockState`
    value; ``n_landed``: how many are verified)."""

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
    redialled: bool = False
    """It dialled its producer again (decision N25)."""
    due: float = 0.0
    """The load's own deadline: an abort's answer is waited for again before it while the producer is heard (L19)."""


class ProbeEntry(msgspec.Struct, frozen=True, gc=False):
    """One probe record (the consumer side of a symmetric request).  ``unsent`` and ``waiting``
    keep their registration order (a probe names its keys in it); ``offered`` and ``miss`` are
    sets, sorted; ``loading``: ``(key, round)`` per key handed to a round's load, by key."""

    kv_request_id: str
    state: ProbeState
    reason: Reason | None
    timer: str | None
    deadline: float | None
    peer: str
    round: int
    sent: bool
    unsent: tuple[bytes, ...]
    waiting: tuple[bytes, ...]
    offered: tuple[bytes, ...]
    miss: tuple[bytes, ...]
    loading: tuple[tuple[bytes, int], ...]


class ServeEntry(msgspec.Struct, frozen=True, gc=False):
    """One serve record (the producer side of one symmetric round), keyed ``(peer, kv_request_id,
    round)``.  ``keys`` and ``pins`` keep their order (replies name keys in it, pins are released
    in it); sets are sorted; ``found``: ``(key, pool block)`` by key; ``transfer``: the round's
    transfer is registered with the data plane under its plane key (from ``start_transfer`` until
    the record ends)."""

    peer: str
    kv_request_id: str
    round: int
    state: ServeState
    reason: Reason | None
    timer: str | None
    deadline: float | None
    gen: int
    keys: tuple[bytes, ...]
    todo: tuple[bytes, ...]
    found: tuple[tuple[bytes, int], ...]
    missing: tuple[bytes, ...]
    answered: tuple[bytes, ...]
    pins: tuple[int, ...]
    held: tuple[int, ...]
    probes: int
    demand: tuple[bytes, ...]
    slots: tuple[int, ...]
    receipt: bool
    transfer: bool


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
    suspect_by: tuple[tuple[str, str], ...] = ()
    """``(suspect instance, the address whose refusal condemned it)`` where one did, oldest first."""
    survived: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``(instance, addresses whose refusal it outlived)``, oldest first (decision I37)."""
    probe: tuple[ProbeEntry, ...] = ()
    """The symmetric path's probe records, by ``kv_request_id`` (decision M14: empty, as every
    field below, for a core that never saw a symmetric request, so such a core exports as before)."""
    rounds: tuple[ConsumerEntry, ...] = ()
    """The loads of symmetric rounds, by ``(kv_request_id, round)`` (each entry's ``round`` is its
    key's)."""
    serve: tuple[ServeEntry, ...] = ()
    """The serve records, by ``(peer, kv_request_id, round)``."""
    serve_closing: bool = False
    """The serve machine saw shutdown (no new probe is served)."""
    serve_withdrawn: tuple[tuple[str, str, int, str], ...] = ()
    """``(peer, kv_request_id, round, reason)`` of the rounds the serve machine withdrew with a
    notice and remembers, oldest first (a fetch crossing the notice is answered with its reason)."""


#: Every attribute of the core and of each machine, by what it is: ``state`` (exported),
#: ``index`` (rebuilt by :func:`restore`, checked by :func:`index_problems`), ``config``,
#: ``counter`` (metrics, not state), ``cache``, ``machine`` (one of the core's machines; the
#: symmetric path's probe, rounds and serve machines are exported like the others, decision M14)
#: or ``part`` (a part built on the machines, decision W12: its own attributes are classified too).
#: :func:`unknown_state` checks it is complete.
KNOWN: dict[str, dict[str, str]] = {
    "core": {
        "settings": "config", "_notes": "state", "_producer": "machine", "_sessions": "machine",
        "_consumer": "machine", "_APPLY": "config", "_ROUTE": "config", "_machines": "config",
        "_probe": "machine", "_rounds": "machine", "_serve": "machine", "_rx": "part", "_reads": "part",
    },
    "receive": {
        "_sessions": "config", "_producer": "config", "_consumer": "config", "_probe": "config", "_rounds": "config",
        "_serve": "config", "_settle": "config", "_error_interval": "config", "error_replies": "state",
        "_table": "config",
    },
    "reads": {
        "_sessions": "config", "_producer": "config", "_consumer": "config", "_probe": "config", "_rounds": "config",
        "_serve": "config",
    },
    "session": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "peer_timeout_s": "config", "goodbye_linger_s": "config", "max_peers": "config", "local": "config",
        "_notes": "config", "_next_gen": "state", "suspect": "state", "gone": "state", "last_instance": "state",
        "last_gen": "state", "survived": "state",
    },
    "producer": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "park_clock_last": "config", "tombstone_max": "config", "max_pending": "config",
        "max_pending_keys": "config", "awaiting_keys": "index", "awaiting_n": "index", "awaiting_version": "counter",
        "by_peer": "index", "awaiting_per_peer": "index", "quarantined": "index", "retained": "state",
        "_prune_order": "index", "_left_early": "index", "_prune_at": "cache", "count_evicted": "counter", "closing": "state",
        "named": "state", "_notes": "config", "batcher": "config",
    },
    "consumer": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "_sessions": "config", "_notes": "config", "_one_sided": "config",
        "by_peer": "index", "_next_round": "state", "_open": "index", "_revoke_bounded": "config",
        "integrity": "config", "rounds": "config",
    },
    "probe": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "_sessions": "config", "_notes": "config", "_rounds": "config",
        "by_peer": "index", "collecting": "index",
    },
    "rounds": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "_sessions": "config", "_notes": "config", "_one_sided": "config",
        "by_peer": "index", "_open": "index", "_revoke_bounded": "config", "integrity": "config",
        "rounds": "config", "by_request": "index",
    },
    "serve": {
        "records": "state", "_deadlines": "state", "_durations": "config", "_rules": "config",
        "ignored": "counter", "_notes": "config", "limits": "config", "by_peer": "index", "batcher": "config",
        "holds": "index", "holds_per_peer": "index", "closing": "state", "transfers": "state",
        "withdrawn": "state",
    },
}

#: Record slots each entry type carries (``key`` is the entry's first field, ``tseq`` the
#: deadline's handle: neither is stored as such).
_SLOTS = {
    "session": (SessionRecord, SessionEntry),
    "producer": (ProducerRecord, ProducerEntry),
    "consumer": (ConsumerRecord, ConsumerEntry),
    "probe": (ProbeRecord, ProbeEntry),
    "rounds": (ConsumerRecord, ConsumerEntry),
    "serve": (ServeRecord, ServeEntry),
}


#: Record slots rebuilt from other state instead of exported: a bound producer record shares its
#: session's round ledger.
_DERIVED = {"producer": {"rounds"}}


def _parts(core: TierCore) -> dict[str, Any]:
    return {"core": core, "session": core._sessions, "producer": core._producer, "consumer": core._consumer,
            "probe": core._probe, "rounds": core._rounds, "serve": core._serve, "receive": core._rx,
            "reads": core._reads}


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
    return {key: when for when, key, _lane in machine.live_deadlines()}


def export(core: TierCore) -> CoreState:
    """The whole state of ``core`` (between inputs).  O(records).

    Raises:
        RuntimeError: a note between machines is still queued (only possible from inside an
            input: :meth:`TierCore.handle` routes every note before it returns).
    """
    if core._notes:
        raise RuntimeError(f"export: notes still queued between machines: {list(core._notes)}")
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
            producer.append(ProducerEntry(kid, r.state, r.reason, r.timer, pm.retained.get(kid), r.consumer,
                                          ender=r.ender))
            continue
        producer.append(ProducerEntry(
            kid, r.state, r.reason, r.timer, due.get(kid), r.consumer, r.owner,
            tuple(sorted((k, b, d) for k, (b, d) in r.blocks.items())), tuple(r.jobs), r.peer, r.principal, r.gen,
            r.round, tuple(r.demand), tuple(r.slots), r.supply_complete, r.receipt, r.life, r.ender,
        ))
    consumer = _consumer_entries(cm)
    qm, rm, vm = core._probe, core._rounds, core._serve
    due = _deadlines(qm)
    probe = tuple(
        ProbeEntry(kid, r.state, r.reason, r.timer, due.get(kid), r.peer, r.round, r.sent, tuple(r.unsent),
                   tuple(r.waiting), tuple(sorted(r.offered)), tuple(sorted(r.miss)), tuple(sorted(r.loading.items())))
        for kid, r in sorted(qm.records.items())
    )
    due = _deadlines(vm)
    with_transfer = set(vm.transfers.values())
    serve = tuple(
        ServeEntry(r.peer, r.kv_request_id, r.round, r.state, r.reason, r.timer, due.get(key), r.gen, tuple(r.keys),
                   tuple(sorted(r.todo)), tuple(sorted(r.found.items())), tuple(sorted(r.missing)),
                   tuple(sorted(r.answered)), tuple(r.pins), tuple(r.held), r.probes, tuple(r.demand), tuple(r.slots),
                   r.receipt, key in with_transfer)
        for key, r in sorted(vm.records.items())
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
        error_replies=tuple(sorted((peer, reason, when) for (peer, reason), when in core._rx.error_replies.items())),
        gone=tuple(sm.gone),
        last_instance=tuple(sm.last_instance.items()),
        last_gen=tuple(sm.last_gen.items()),
        suspect_by=tuple((k, v) for k, v in sm.suspect.items() if v),
        survived=tuple((k, tuple(sorted(v))) for k, v in sm.survived.items()),
        probe=probe,
        rounds=_consumer_entries(rm),
        serve=serve,
        serve_closing=vm.closing,
        serve_withdrawn=tuple((*k, str(r)) for k, r in vm.withdrawn.items()),
    )


def _consumer_entries(machine: Any) -> tuple[ConsumerEntry, ...]:
    """The PD consumer's records, or the rounds' loads (keyed ``(kv_request_id, round)``: the
    entry names both)."""
    due = _deadlines(machine)
    return tuple(
        ConsumerEntry(r.kv_request_id, r.state, r.reason, r.timer, due.get(key), r.peer, r.job_id, tuple(r.keys),
                      tuple(r.slots), r.round, r.landed.raw(), r.n_landed, r.fetched, r.engine_finished, r.life,
                      r.notice, tuple(r.digests), r.redialled, r.due)
        for key, r in sorted(machine.records.items())
    )


#: What a reset sets the scalar attributes that are not configuration to (containers are emptied
#: in place instead); a scalar classified later without an entry here fails the reset loudly.
_FRESH: dict[tuple[str, str], Any] = {
    ("session", "ignored"): 0, ("session", "_next_gen"): 0,
    ("producer", "ignored"): 0, ("producer", "count_evicted"): 0, ("producer", "closing"): False,
    ("producer", "awaiting_version"): 0,
    ("producer", "_prune_at"): (math.nan, math.nan),
    ("consumer", "ignored"): 0, ("consumer", "_next_round"): 0,
    ("probe", "ignored"): 0, ("rounds", "ignored"): 0,
    ("serve", "ignored"): 0, ("serve", "closing"): False,
}


def _reset(core: TierCore) -> None:
    """Empty ``core`` as if it were new (configuration and compiled rules kept)."""
    for name, obj in _parts(core).items():
        for attr, kind in KNOWN[name].items():
            if kind in ("config", "machine", "part"):
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
    qm, rm, vm = core._probe, core._rounds, core._serve
    timed: dict[str, list[tuple[float, Any, Any]]] = {n: [] for n in ("session", "producer", "consumer", "probe",
                                                                      "rounds", "serve")}
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
        rec.state, rec.reason, rec.timer, rec.consumer, rec.ender = e.state, e.reason, e.timer, e.consumer, e.ender
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
        if e.state in P_BOUND:
            session = sm.records.get(e.peer)
            rec.rounds = session.rounds if session is not None and session.gen == e.gen else None
        _enter(pm, rec, timed["producer"], e.deadline)
    pm.retained = {kid: prune_at[kid] for kid in state.retained}
    pm._prune_order = deque(state.retained)
    for e in state.consumer:
        _enter(cm, _consumer_record(e, e.kv_request_id), timed["consumer"], e.deadline)
    for e in state.rounds:
        _enter(rm, _consumer_record(e, (e.kv_request_id, e.round)), timed["rounds"], e.deadline)
    for m in (cm, rm):
        for peer, rounds in list(m._open.items()):  # rounds only grow: the index is in round order
            m._open[peer] = dict.fromkeys(sorted(rounds))
    for e in state.probe:
        rec = ProbeRecord(e.kv_request_id)
        rec.state, rec.reason, rec.timer, rec.peer, rec.round, rec.sent = (
            e.state, e.reason, e.timer, e.peer, e.round, e.sent)
        rec.unsent, rec.waiting = dict.fromkeys(e.unsent), dict.fromkeys(e.waiting)
        rec.offered, rec.miss, rec.loading = set(e.offered), set(e.miss), dict(e.loading)
        _enter(qm, rec, timed["probe"], e.deadline)
    for e in state.serve:
        rec = ServeRecord((e.peer, e.kv_request_id, e.round))
        rec.state, rec.reason, rec.timer, rec.gen = e.state, e.reason, e.timer, e.gen
        rec.keys, rec.todo, rec.found = dict.fromkeys(e.keys), set(e.todo), dict(e.found)
        rec.missing, rec.answered, rec.pins, rec.held = set(e.missing), set(e.answered), list(e.pins), list(e.held)
        rec.probes, rec.demand, rec.slots, rec.receipt = e.probes, e.demand, e.slots, e.receipt
        _enter(vm, rec, timed["serve"], e.deadline)
        if e.transfer:
            vm.transfers[(transfer_key(e.peer, e.kv_request_id), e.round)] = rec.key
        mine = vm.holds_per_peer.setdefault(e.peer, {})
        for b in e.held:  # the holds are the records' sums (what note_found and _unpin keep)
            vm.holds[b] = vm.holds.get(b, 0) + 1
            mine[b] = mine.get(b, 0) + 1
        if not mine:
            del vm.holds_per_peer[e.peer]
    vm.closing = state.serve_closing
    for peer, kid, rnd, why in state.serve_withdrawn:
        vm.withdrawn[(peer, kid, rnd)] = Reason(why)
    for name, machine in (("session", sm), ("producer", pm), ("consumer", cm), ("probe", qm), ("rounds", rm),
                          ("serve", vm)):
        for when, key, rec in sorted(timed[name], key=lambda t: (t[0], t[1])):
            rec.tseq = machine._deadlines.arm(when, key, rec.timer)
    sm._next_gen = state.next_gen
    cm._next_round = state.next_round
    sm.suspect = dict.fromkeys(state.suspect)
    sm.suspect.update(state.suspect_by)
    sm.survived = {k: frozenset(v) for k, v in state.survived}
    sm.gone = dict.fromkeys(state.gone)
    sm.last_instance = dict(state.last_instance)
    sm.last_gen = dict(state.last_gen)
    pm.closing = state.closing
    pm.named = dict(state.named)
    core._rx.error_replies = {(peer, reason): when for peer, reason, when in state.error_replies}
    return core


def _consumer_record(e: ConsumerEntry, key: Any) -> ConsumerRecord:
    rec = ConsumerRecord(key, kv_request_id=e.kv_request_id)
    rec.state, rec.reason, rec.timer = e.state, e.reason, e.timer
    rec.peer, rec.job_id, rec.keys, rec.slots, rec.round = e.peer, e.job_id, e.keys, e.slots, e.round
    rec.landed, rec.fetched, rec.engine_finished = BlockStates.from_raw(e.landed), e.fetched, e.engine_finished
    rec.life, rec.notice, rec.digests, rec.redialled = e.life, e.notice, list(e.digests), e.redialled
    rec.due = e.due
    return rec


def _enter(machine: Any, rec: Any, timed: list, deadline: float | None) -> None:
    """Index ``rec`` as a transition from the initial state to its state would, and queue its
    deadline (armed once every record is in place, in firing order)."""
    for op in machine.index_ops(machine.INITIAL, rec.state):
        op(rec)
    if deadline is not None and rec.timer is not None:
        timed.append((deadline, rec.key, rec))


Clock = Callable[[str, str, Any, float], float]
"""``clock(kind, machine, key, t) -> t'``: ``kind`` is ``"deadline"`` (``machine`` is
``"session"``, ``"producer"``, ``"consumer"``, ``"probe"``, ``"rounds"`` (``key``:
``(kv_request_id, round)``) or ``"serve"`` (``key``: ``(peer, kv_request_id, round)``)), ``"heard"`` or ``"active"`` (a session's,
``machine`` ``"session"``), ``"due"`` (a load's own deadline, ``machine`` ``"consumer"`` or ``"rounds"``) or
``"error_reply"`` (``machine`` ``"core"``, ``key`` the peer)."""


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
        consumer=tuple(replace(e, deadline=dl("consumer", e.kv_request_id, e.deadline),
                               due=clock("due", "consumer", e.kv_request_id, e.due)) for e in state.consumer),
        probe=tuple(replace(e, deadline=dl("probe", e.kv_request_id, e.deadline)) for e in state.probe),
        rounds=tuple(replace(e, deadline=dl("rounds", (e.kv_request_id, e.round), e.deadline),
                             due=clock("due", "rounds", (e.kv_request_id, e.round), e.due)) for e in state.rounds),
        serve=tuple(replace(e, deadline=dl("serve", (e.peer, e.kv_request_id, e.round), e.deadline))
                    for e in state.serve),
        error_replies=tuple((p, r, clock("error_reply", "core", p, t)) for p, r, t in state.error_replies),
    )
