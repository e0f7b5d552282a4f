"""The producer machine's records: what one ``kv_request_id`` we park holds while it lives
(:class:`ProducerRecord`), the little a done or tombstoned id keeps while retained
(:class:`RetainedRecord`, decision I8), and the consumer input the machine reads
(:class:`FetchInput`).  The machine that moves them is :mod:`kvtier.lifecycle.producer`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvtier.lifecycle._machine import Record
from kvtier.lifecycle._table import PRODUCER_INITIAL, ProducerState

#: states a finished id is retained in (as a RetainedRecord) until pruned
RETAINED = frozenset({ProducerState.DONE, ProducerState.TOMBSTONED})
#: states in which the data plane may reference the id's blocks
REFERENCED = frozenset(
    {ProducerState.SERVING, ProducerState.CONFIRMED, ProducerState.CANCELLING, ProducerState.QUARANTINED}
)


class FetchInput(msgspec.Struct, frozen=True, gc=False):
    """A consumer's fetch, abort or receipt for ``kv_request_id`` from ``peer`` (session
    generation ``gen``, authenticated ``principal``) in ``round``.  ``slots`` are the consumer's
    destination slots (one per key; one-sided planes write into them); ``fetched`` tells, for an
    abort, whether that round sent a fetch (an abort of a fetched round concerns only the life
    that fetch bound)."""

    peer: str
    kv_request_id: str
    round: int
    keys: tuple[bytes, ...] = ()
    gen: int = 0
    slots: tuple[int, ...] = ()
    fetched: bool = False
    principal: str | None = None
    life: str = ""
    low: int = 0
    rounds: Any = None
    """The session's :class:`~kvtier.lifecycle.session.RoundLedger` (None: no session)."""


_NO_BLOCKS: dict[bytes, tuple[int, int]] = {}


class ProducerRecord(Record):
    __slots__ = ("owner", "consumer", "ender", "blocks", "jobs", "peer", "principal", "gen", "round", "demand",
                 "slots", "supply_complete", "receipt", "life", "rounds")

    def __init__(self, key: str) -> None:
        super().__init__(key, PRODUCER_INITIAL)
        self.owner: str | None = None
        self.consumer: str | None = None  # the only principal allowed to touch the id, if named
        # the principal that ended the id before any producer request named a consumer (L17): a
        # request naming another starts the id afresh; it refuses nobody (no consumer was named)
        self.ender: str | None = None
        self.blocks: dict[bytes, tuple[int, int]] = _NO_BLOCKS  # key -> (pool block, digest)
        self.jobs: list[int] = []
        self.peer: str | None = None
        self.principal: str | None = None  # the bound peer's principal
        self.gen = 0
        self.round = -1
        self.demand: tuple[bytes, ...] = ()
        self.slots: tuple[int, ...] = ()
        self.supply_complete = False
        self.receipt = False
        self.life = ""  # the pairing's life (decision I20): set by the first store or the binding
        self.rounds: Any = None  # the bound session's RoundLedger


class RetainedRecord(Record):
    """What a done or tombstoned id keeps for the rest of ``tombstone_retention_s`` (decision
    I8: ≤ 256 B per id): its state, reason, named consumer and ender — all a late fetch, abort,
    receipt or store is answered from.  The fields of a live record read as their empty values (class
    attributes, not slots), so code that scans every record needs no special case; writing one
    raises AttributeError, which is the point: nothing may bind or park a retained id."""

    __slots__ = ("consumer", "ender", "life")
    rounds = None
    owner = None
    peer = None
    principal = None
    gen = 0
    round = -1
    blocks = _NO_BLOCKS
    jobs: tuple[int, ...] = ()
    demand: tuple[bytes, ...] = ()
    slots: tuple[int, ...] = ()
    supply_complete = False
    receipt = False

    def __init__(self, rec: Record) -> None:  # no super().__init__: every slot is set here
        self.key = rec.key
        self.state = rec.state
        self.reason = rec.reason
        self.timer = rec.timer
        self.tseq = rec.tseq
        # an id nobody named a consumer for, tombstoned while bound, remembers the principal whose
        # binding ended it, so a producer request naming another starts it afresh (decision L17);
        # one served whole (done) keeps none: a second fetch is already_served
        unnamed_end = rec.consumer is None and rec.state is ProducerState.TOMBSTONED
        self.consumer = rec.consumer
        self.ender = rec.ender if rec.ender is not None else (rec.principal if unnamed_end else None)
        self.life = rec.life
