"""Read-only views of the core's records, for the shell, the metrics endpoint and tests.

Nothing outside :mod:`kvtier.lifecycle` reads a machine's records: it asks
:class:`~kvtier.lifecycle.TierCore`, which answers with these frozen snapshots (made on demand;
none of them is on a per-message path).
"""

from __future__ import annotations

import msgspec

from kvtier.lifecycle._table import ConsumerState, ProbeState, ProducerState, Reason, ServeState, SessionState

__all__ = ["ConsumerView", "CoreRecords", "CoreSnapshot", "DeadlineView", "ProbeView", "ProducerView", "ServeView",
           "SessionView"]


class SessionView(msgspec.Struct, frozen=True):
    """One live session: ``peer`` id, state, the generation our messages carry, whether we
    dialled it, the peer's instance and authenticated principal, and when it was last heard
    (seconds, the core's clock)."""

    peer: str
    state: SessionState
    gen: int
    dialled: bool
    instance: str
    principal: str | None
    heard: float


class ProducerView(msgspec.Struct, frozen=True):
    """One producer record: state and reason, outstanding store ``jobs``, the binding (peer,
    generation, round, demanded keys), the named consumer, the parked keys, whether the receipt
    was seen, and the live deadline (seconds, or None)."""

    kv_request_id: str
    state: ProducerState
    reason: Reason | None
    jobs: tuple[int, ...]
    peer: str | None
    gen: int
    round: int
    demand: tuple[bytes, ...]
    consumer: str | None
    parked: tuple[bytes, ...]
    receipt: bool
    deadline: float | None


class ConsumerView(msgspec.Struct, frozen=True):
    """One consumer record: state and reason, the producer ``peer``, the live load job (or
    None), its round, keys and slots, how many blocks landed, and the live deadline."""

    kv_request_id: str
    state: ConsumerState
    reason: Reason | None
    peer: str
    job_id: int | None
    round: int
    keys: tuple[bytes, ...]
    slots: tuple[int, ...]
    landed: int
    deadline: float | None


class DeadlineView(msgspec.Struct, frozen=True):
    """One live deadline: when it falls due (seconds, the core's clock), the machine
    (``"session"``, ``"producer"`` or ``"consumer"``), the record's key and the timer's name
    (spec/lifecycle.toml)."""

    when: float
    machine: str
    key: str
    timer: str


class ProbeView(msgspec.Struct, frozen=True):
    """One probe record (a symmetric request): state and reason, the ``peer`` probed, the open
    ``round`` (-1: none) and whether a probe of it was ``sent``, its keys not sent yet
    (``unsent``) and sent without an answer (``waiting``), the keys the peer ``offered`` (pinned
    for us), the keys answered MISS for the request's life (``missed``), the keys being loaded
    (``loading``: key -> round), the loads of its rounds, and the live deadline."""

    kv_request_id: str
    state: ProbeState
    reason: Reason | None
    peer: str
    round: int
    sent: bool
    unsent: tuple[bytes, ...]
    waiting: tuple[bytes, ...]
    offered: frozenset[bytes]
    missed: frozenset[bytes]
    loading: dict[bytes, int]
    loads: tuple[ConsumerView, ...]
    deadline: float | None


class ProbeAnswers(msgspec.Struct, frozen=True, gc=False):
    """What lookups of a symmetric request answer now, key by key (``TierCore.probe_answers``, the
    rule as sets, for a reader on another thread): ``dead`` (no record, or probing failed: every
    key MISS), else a key in ``miss`` is MISS, in ``hit`` HIT (offered, or being loaded), in
    ``retry`` RETRY (its round waits for the peer), any other key MISS."""

    dead: bool = True
    hit: frozenset[bytes] = frozenset()
    retry: frozenset[bytes] = frozenset()
    miss: frozenset[bytes] = frozenset()


class ServeView(msgspec.Struct, frozen=True):
    """One serve record (a peer's symmetric round): the round's identity, state and reason, every
    key its probes named, the ``found`` ones (key -> pool block, pinned), the ``missing`` ones,
    those still waiting for the engine (``pending``), the engine ``pins`` held, the fetch's keys
    (``demand``), whether the receipt was seen, and the live deadline."""

    peer: str
    kv_request_id: str
    round: int
    state: ServeState
    reason: Reason | None
    keys: tuple[bytes, ...]
    found: dict[bytes, int]
    missing: frozenset[bytes]
    pending: frozenset[bytes]
    pins: tuple[int, ...]
    demand: tuple[bytes, ...]
    receipt: bool
    deadline: float | None


class CoreSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What the metrics endpoint reads at each scrape.

    ``producer``: live producer records per state (retained ones excluded); ``pinned_blocks``:
    pool blocks those records hold, per state; ``retained``: done/tombstoned ids per (state,
    reason); ``parked``: the ids in ``parked`` (for the oldest-parked age); ``consumer`` and
    ``sessions``: records per state; ``awaiting_receipt_jobs``: store jobs handed over and waiting
    for the consumer's receipt; ``quarantined_blocks``: pool blocks of quarantined producer ids;
    ``revoking_slots``: consumer slots held until a revocation is proven; ``probe`` and ``serve``:
    symmetric records per state; ``serve_pinned_blocks``: engine blocks pinned for peers' rounds."""

    producer: dict[str, int]
    pinned_blocks: dict[str, int]
    retained: dict[tuple[str, str], int]
    parked: tuple[str, ...]
    consumer: dict[str, int]
    sessions: dict[str, int]
    awaiting_receipt_jobs: int
    quarantined_blocks: int
    revoking_slots: int
    probe: dict[str, int] = {}
    serve: dict[str, int] = {}
    serve_pinned_blocks: int = 0
    evicted: int = 0
    """Retained ids evicted early by the ``tombstone_max`` cap since start (a counter)."""
    deadline_entries: int = 0
    """Entries in the machines' deadline queues, stale ones not yet dropped included, and in the
    producer's prune order (one per retained id, plus those of ids that left retention early and
    are not dropped yet): what the deadlines cost in memory."""


class CoreRecords(msgspec.Struct, frozen=True, kw_only=True):
    """Every record of a core as frozen views, each sequence in key order: what tests, tools and
    introspection read (``TierCore.records()``; O(records) to make, never on a per-message path).

    ``sessions``: live sessions; ``suspect``: producer instances whose sessions are suspect
    (decision I7); ``producers``: producer records, live and retained; ``retained``: the ids
    retained until their prune; ``bound``: the producer's per-peer index (peer -> ids bound to
    it); ``quarantined``: producer ids in ``quarantined`` (decision I1); ``consumers``: the PD
    consumer records; ``round_loads``: the symmetric rounds' loads (their ``kv_request_id`` is the
    request's, ``round`` tells them apart); ``probes`` and ``serves``: the symmetric path's records;
    ``pins``: engine pins the serve records hold; ``deadlines``: every live deadline of the
    session, producer and consumer machines, earliest first (ties: machine, then key)."""

    sessions: tuple[SessionView, ...]
    suspect: frozenset[str]
    producers: tuple[ProducerView, ...]
    retained: frozenset[str]
    bound: dict[str, frozenset[str]]
    quarantined: frozenset[str]
    consumers: tuple[ConsumerView, ...]
    round_loads: tuple[ConsumerView, ...]
    probes: tuple[ProbeView, ...]
    serves: tuple[ServeView, ...]
    pins: frozenset[int]
    deadlines: tuple[DeadlineView, ...]
