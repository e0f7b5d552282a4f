# ============================================================================================
# GENERATED FILE — DO NOT EDIT.
# Source: spec/lifecycle.toml   Generator: python -m kvtier._tools.specgen
# A test (tests/lifecycle/test_spec.py) fails when this file does not match the spec.
# ============================================================================================
"""kvtier lifecycle tables, generated from ``spec/lifecycle.toml``.

For each machine (producer, consumer, session): ``State``, ``Event``, ``Guard`` and ``Effect``
enums, the immutable ``TABLE`` mapping ``(state, event)`` to a :class:`Rule`, the timer of each
state, and the initial/final states.  ``SPEC_SHA256`` is the hash of the spec text this was
generated from.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Final, NamedTuple

SPEC_SHA256: Final = "acde3d44ab6527cf730ed0aa7eafbc52d8f7158eb3b3b619ddc48968c8c1ec50"
"""SHA-256 of spec/lifecycle.toml at generation time."""

TRANSITION: Final = "transition"
IGNORE: Final = "ignore"
REJECT: Final = "reject"


class Reason(enum.StrEnum):
    REAPED = "reaped"
    """the parked blocks waited longer than unbound_store_timeout_s for a fetch and were released"""
    ABORTED = "aborted"
    """the consumer aborted the fetch (or cancelled before fetching)"""
    TRANSFER_FAILED = "transfer_failed"
    """sending the blocks failed"""
    TRANSFER_TIMEOUT = "transfer_timeout"
    """the transfer did not finish within transfer_timeout_s"""
    SUPPLY_TIMEOUT = "supply_timeout"
    """a bound fetch waited longer than fetch_supply_timeout_s for blocks that were never stored"""
    INCOMPLETE = "incomplete"
    """the producer's request finished without storing every block the fetch named"""
    PEER_LOST = "peer_lost"
    """the peer's session died (silence, disconnect, send failure, restart)"""
    DRAINED = "drained"
    """drain_jobs ended the id before a consumer fetched it"""
    SHUTDOWN = "shutdown"
    """the manager shut down"""
    DUPLICATE_FETCH = "duplicate_fetch"
    """a second fetch for an id that is already bound to another round"""
    TOO_MANY_PENDING = "too_many_pending"
    """the peer already has max_pending_fetches_per_peer fetches waiting for blocks"""
    ALREADY_SERVED = "already_served"
    """the id's blocks were already transferred to a consumer"""
    ROUND_FINISHED = "round_finished"
    """a store arrived after the id's transfer completed"""
    ID_IN_USE = "id_in_use"
    """another engine request already parks blocks under this kv_request_id"""
    LOAD_TIMEOUT = "load_timeout"
    """the consumer's load did not complete within load_timeout_s"""
    CANCELLED = "cancelled"
    """the consumer's engine finished the request before the load completed"""
    DUPLICATE_LOAD = "duplicate_load"
    """a second load for an id while one is live"""
    ONE_FETCH_PER_ID = "one_fetch_per_id"
    """an id is fetched at most once; a second load after a terminal one fails"""
    INCOMPLETE_DATA = "incomplete_data"
    """transfer_done(ok) arrived but not every block had landed"""
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    """the session was not ready within handshake_timeout_s"""
    HANDSHAKE_MISMATCH = "handshake_mismatch"
    """protocol version, block layout or hash seed differ between the peers"""
    PEER_TIMEOUT = "peer_timeout"
    """nothing heard from the peer for peer_timeout_s"""
    PEER_DISCONNECTED = "peer_disconnected"
    """the peer said disconnect (or did not know our session)"""
    PEER_RESTARTED = "peer_restarted"
    """the peer reconnected with a new generation"""
    SEND_FAILED = "send_failed"
    """the transport could not send to the peer"""
    TOO_MANY_PEERS = "too_many_peers"
    """this manager already has max_peers sessions"""
    NO_RECORD = "no_record"
    """the id has no record in this machine (never seen or already pruned)"""
    STALE = "stale"
    """a late, duplicate or out-of-order input for this state; counted and dropped"""
    NOT_BOUND = "not_bound"
    """the id is not bound to a peer, so the input does not concern it"""
    PEER_ERROR = "peer_error"
    """the peer refused our message as malformed (e.g. over its size limits)"""
    LATE_DATA = "late_data"
    """block data for a round that is no longer in flight is dropped, never written"""
    NOT_ANNOUNCED = "not_announced"
    """the engine must announce a request (on_new_request) before loading it"""


class Branch(NamedTuple):
    """One outcome of a (state, event) pair: taken if ``guard`` holds (``None``: fallback)."""

    guard: enum.StrEnum | None
    dest: enum.StrEnum
    effects: tuple[enum.StrEnum, ...]
    reason: Reason | None


class Rule(NamedTuple):
    """``kind`` is TRANSITION (branches: guarded first, fallback last), IGNORE or REJECT."""

    kind: str
    branches: tuple[Branch, ...]
    reason: Reason | None


class TimerSpec(NamedTuple):
    """A named timer: the event it fires and the config key that sets its duration (s)."""

    name: str
    event: enum.StrEnum
    config_key: str


# ------------------------------------------------------------------------------------------
# machine: producer — Life of one kv_request_id on the prefill (producer) side.
# ------------------------------------------------------------------------------------------

class ProducerState(enum.StrEnum):
    ABSENT = "absent"
    """No record: never seen, or pruned (an id is reusable after prune)."""
    PARKED = "parked"
    """Blocks stored, pinned, no fetch yet."""
    AWAITING = "awaiting"
    """Bound to one (peer, round) fetch whose blocks are not all stored yet (fetch-before-store or chunked prefill)."""
    SERVING = "serving"
    """Bound; every demanded block is stored and the blocks are being sent."""
    CANCELLING = "cancelling"
    """A started transfer was cancelled; waits until the transport releases every block it was sending."""
    DONE = "done"
    """Transfer completed; retained so a late or duplicate fetch is answered in one round trip."""
    TOMBSTONED = "tombstoned"
    """Ended without a transfer (reaped, aborted, failed …); retained with its reason so a late fetch or store is refused in one round trip."""
    PRUNED = "pruned"
    """Record deleted (final)."""


class ProducerEvent(enum.StrEnum):
    STORE = "store"
    """the engine submitted a store job (submit_store) for this id"""
    FETCH = "fetch"
    """a consumer's fetch(kv_request_id, round, keys) arrived"""
    TRANSFER_COMPLETE = "transfer_complete"
    """the transport released every block of the transfer after sending it"""
    TRANSFER_FAILED = "transfer_failed"
    """the transport failed to send the transfer (blocks released)"""
    TRANSFER_RELEASED = "transfer_released"
    """after a cancel, the transport released every block it was sending"""
    ABORT_FETCH = "abort_fetch"
    """the consumer's abort_fetch(kv_request_id, round) arrived"""
    REQUEST_FINISHED = "request_finished"
    """the engine finished the producer request (all its stores were submitted)"""
    REAP_DEADLINE = "reap_deadline"
    """timer reap fired"""
    SUPPLY_DEADLINE = "supply_deadline"
    """timer supply fired"""
    TRANSFER_DEADLINE = "transfer_deadline"
    """timer transfer fired"""
    CANCEL_DEADLINE = "cancel_deadline"
    """timer cancel fired"""
    PRUNE_DEADLINE = "prune_deadline"
    """timer prune fired, or the retained-id count cap evicts this (oldest) id"""
    PEER_LOST = "peer_lost"
    """the session of the peer this id is bound to died"""
    DRAIN = "drain"
    """the engine called drain_jobs"""
    SHUTDOWN = "shutdown"
    """the manager is shutting down"""


class ProducerGuard(enum.StrEnum):
    STORE_EMPTY = "store_empty"
    """the store job names zero blocks"""
    OTHER_OWNER = "other_owner"
    """the store comes from a different engine request than the one that parked the id"""
    PARK_CLOCK_LAST = "park_clock_last"
    """config park_clock == 'last_store': every store restarts the reap clock"""
    FETCH_EMPTY = "fetch_empty"
    """the fetch names zero keys (the consumer already has every block)"""
    DEMAND_MET = "demand_met"
    """every key the fetch names is already stored"""
    STORE_MEETS_DEMAND = "store_meets_demand"
    """this store supplies every key of the bound fetch that was still missing"""
    PEER_BUSY = "peer_busy"
    """the fetching peer already has max_pending_fetches_per_peer ids awaiting blocks"""
    SAME_ROUND = "same_round"
    """the input comes from the (peer, round) the id is bound to"""
    SUPPLY_COMPLETE = "supply_complete"
    """the engine finished the producer request, so no more stores will come for this id"""


class ProducerEffect(enum.StrEnum):
    PARK_BLOCKS = "park_blocks"
    """record the store job's (key, block) pairs; the engine keeps them pinned until the job result"""
    REPORT_STORE_OK = "report_store_ok"
    """report this store job as succeeded at once (nothing needs to be kept)"""
    FAIL_STORE_JOB = "fail_store_job"
    """report this store job as failed with the reason"""
    BIND = "bind"
    """bind the id to the fetch's (peer, round) and its key list"""
    START_TRANSFER = "start_transfer"
    """send the demanded blocks to the bound peer, in fetch key order"""
    CANCEL_TRANSFER = "cancel_transfer"
    """stop sending; the transport reports transfer_released once no block is referenced"""
    COMPLETE_JOBS = "complete_jobs"
    """report every store job of the id as succeeded (its blocks may be released)"""
    FAIL_JOBS = "fail_jobs"
    """report every store job of the id as failed with the reason"""
    REPLY_DONE_OK = "reply_done_ok"
    """send transfer_done(ok) to the fetch's peer and round"""
    REPLY_DONE_FAIL = "reply_done_fail"
    """send transfer_done(fail, reason) to the bound peer and round"""
    REPLY_FETCH_FAILED = "reply_fetch_failed"
    """send transfer_done(fail, reason) to the peer and round of THIS fetch only"""
    REPLY_ABORT_ACK = "reply_abort_ack"
    """send abort_ack to the aborting peer and round"""
    RESTART_TIMER = "restart_timer"
    """restart the current state's timer from now"""
    NOTE_DUPLICATE = "note_duplicate"
    """count an exactly repeated input (network duplicate); nothing else"""
    NOTE_SUPPLY_COMPLETE = "note_supply_complete"
    """remember that the engine finished the request: every store has been submitted"""


PRODUCER_INITIAL: Final = ProducerState.ABSENT
PRODUCER_FINAL: Final = frozenset({ProducerState.PRUNED})
PRODUCER_TIMERS: Final = MappingProxyType({
    "reap": TimerSpec("reap", ProducerEvent.REAP_DEADLINE, "unbound_store_timeout_s"),
    "supply": TimerSpec("supply", ProducerEvent.SUPPLY_DEADLINE, "fetch_supply_timeout_s"),
    "transfer": TimerSpec("transfer", ProducerEvent.TRANSFER_DEADLINE, "transfer_timeout_s"),
    "cancel": TimerSpec("cancel", ProducerEvent.CANCEL_DEADLINE, "transfer_timeout_s"),
    "prune": TimerSpec("prune", ProducerEvent.PRUNE_DEADLINE, "tombstone_retention_s"),
})
"""Timer name -> (event it fires, config key that sets its duration in seconds)."""
PRODUCER_STATE_TIMER: Final = MappingProxyType({
    ProducerState.ABSENT: None,
    ProducerState.PARKED: 'reap',
    ProducerState.AWAITING: 'supply',
    ProducerState.SERVING: 'transfer',
    ProducerState.CANCELLING: 'cancel',
    ProducerState.DONE: 'prune',
    ProducerState.TOMBSTONED: 'prune',
    ProducerState.PRUNED: None,
})
"""State -> name of the timer armed while in it (None: no timer)."""
PRODUCER_TABLE: Final = MappingProxyType({
    (ProducerState.ABSENT, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.STORE_EMPTY, ProducerState.ABSENT, (ProducerEffect.REPORT_STORE_OK, ), None),
        Branch(None, ProducerState.PARKED, (ProducerEffect.PARK_BLOCKS, ), None),
    ), None),
    (ProducerState.ABSENT, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.FETCH_EMPTY, ProducerState.ABSENT, (ProducerEffect.REPLY_DONE_OK, ), None),
        Branch(ProducerGuard.PEER_BUSY, ProducerState.ABSENT, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.TOO_MANY_PENDING),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.BIND, ), None),
    ), None),
    (ProducerState.ABSENT, ProducerEvent.TRANSFER_COMPLETE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.REPLY_ABORT_ACK, ), Reason.ABORTED),
    ), None),
    (ProducerState.ABSENT, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.PARKED, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.PARKED, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.PARK_CLOCK_LAST, ProducerState.PARKED, (ProducerEffect.PARK_BLOCKS, ProducerEffect.RESTART_TIMER, ), None),
        Branch(None, ProducerState.PARKED, (ProducerEffect.PARK_BLOCKS, ), None),
    ), None),
    (ProducerState.PARKED, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.FETCH_EMPTY, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS, ProducerEffect.REPLY_DONE_OK, ), None),
        Branch(ProducerGuard.DEMAND_MET, ProducerState.SERVING, (ProducerEffect.BIND, ProducerEffect.START_TRANSFER, ), None),
        Branch(ProducerGuard.SUPPLY_COMPLETE, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_FETCH_FAILED, ), Reason.INCOMPLETE),
        Branch(ProducerGuard.PEER_BUSY, ProducerState.PARKED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.TOO_MANY_PENDING),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.BIND, ), None),
    ), None),
    (ProducerState.PARKED, ProducerEvent.TRANSFER_COMPLETE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_ABORT_ACK, ), Reason.ABORTED),
    ), None),
    (ProducerState.PARKED, ProducerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ProducerState.PARKED, (ProducerEffect.NOTE_SUPPLY_COMPLETE, ), None),
    ), None),
    (ProducerState.PARKED, ProducerEvent.REAP_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), Reason.REAPED),
    ), None),
    (ProducerState.PARKED, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.NOT_BOUND),
    (ProducerState.PARKED, ProducerEvent.DRAIN): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), Reason.DRAINED),
    ), None),
    (ProducerState.PARKED, ProducerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (ProducerEffect.FAIL_JOBS, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.AWAITING, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.STORE_MEETS_DEMAND, ProducerState.SERVING, (ProducerEffect.PARK_BLOCKS, ProducerEffect.START_TRANSFER, ), None),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.PARK_BLOCKS, ProducerEffect.RESTART_TIMER, ), None),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.AWAITING, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.DUPLICATE_FETCH),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.TRANSFER_COMPLETE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_ABORT_ACK, ), Reason.ABORTED),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.INCOMPLETE),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.SUPPLY_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.SUPPLY_TIMEOUT),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), Reason.PEER_LOST),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.DRAIN): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.DRAINED),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.SERVING, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.SERVING, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(None, ProducerState.SERVING, (ProducerEffect.REPORT_STORE_OK, ), None),
    ), None),
    (ProducerState.SERVING, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.SERVING, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.SERVING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.DUPLICATE_FETCH),
    ), None),
    (ProducerState.SERVING, ProducerEvent.TRANSFER_COMPLETE): Rule(TRANSITION, (
        Branch(None, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS, ProducerEffect.REPLY_DONE_OK, ), None),
    ), None),
    (ProducerState.SERVING, ProducerEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.TRANSFER_FAILED),
    ), None),
    (ProducerState.SERVING, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.CANCELLING, (ProducerEffect.CANCEL_TRANSFER, ProducerEffect.REPLY_ABORT_ACK, ), Reason.ABORTED),
        Branch(None, ProducerState.SERVING, (ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.SERVING, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.TRANSFER_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.CANCEL_TRANSFER, ProducerEffect.REPLY_DONE_FAIL, ), Reason.TRANSFER_TIMEOUT),
    ), None),
    (ProducerState.SERVING, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.CANCEL_TRANSFER, ), Reason.PEER_LOST),
    ), None),
    (ProducerState.SERVING, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (ProducerEffect.CANCEL_TRANSFER, ProducerEffect.FAIL_JOBS, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.FAIL_STORE_JOB, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.REPLY_FETCH_FAILED, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.TRANSFER_COMPLETE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.CANCEL_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (ProducerEffect.CANCEL_TRANSFER, ProducerEffect.FAIL_JOBS, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.DONE, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(None, ProducerState.DONE, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ROUND_FINISHED),
    ), None),
    (ProducerState.DONE, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.DONE, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ALREADY_SERVED),
    ), None),
    (ProducerState.DONE, ProducerEvent.TRANSFER_COMPLETE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.DONE, (ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.DONE, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.PRUNE_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
    (ProducerState.DONE, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_STORE_JOB, ), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.REPLY_FETCH_FAILED, ), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.TRANSFER_COMPLETE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.PRUNE_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
})


# ------------------------------------------------------------------------------------------
# machine: consumer — Life of one kv_request_id load on the decode (consumer) side.
# ------------------------------------------------------------------------------------------

class ConsumerState(enum.StrEnum):
    ABSENT = "absent"
    """No record."""
    ANNOUNCED = "announced"
    """The engine announced the request (remote_prefiller params); lookups HIT; no load yet."""
    QUEUED = "queued"
    """Load submitted; the fetch waits for the session handshake. Nothing was sent, so nothing can land."""
    IN_FLIGHT = "in_flight"
    """Fetch sent; blocks are written into the load's slots as they arrive."""
    ABORTING = "aborting"
    """Load deadline passed; abort_fetch sent; block data is dropped; waiting for abort_ack."""
    CANCELLING = "cancelling"
    """The engine finished the request during the load; abort_fetch sent; waiting for abort_ack."""
    LOADED = "loaded"
    """Every block landed; success reported; waits for the engine to finish the request."""
    FAILED = "failed"
    """Failure reported; later lookups MISS so the engine recomputes; waits for the engine to finish the request."""
    FINISHED = "finished"
    """Record deleted (final)."""


class ConsumerEvent(enum.StrEnum):
    ANNOUNCE = "announce"
    """the engine announced a request whose kv_transfer_params name a remote producer"""
    SUBMIT_LOAD = "submit_load"
    """the engine submitted a load job (submit_load) for this id"""
    HANDSHAKE_READY = "handshake_ready"
    """the session to the producer became ready"""
    BLOCK_DATA = "block_data"
    """block_data(kv_request_id, round, first, count) arrived with its payload frames"""
    TRANSFER_DONE = "transfer_done"
    """transfer_done(kv_request_id, round, ok, reason) arrived"""
    ABORT_ACK = "abort_ack"
    """abort_ack(kv_request_id, round) arrived"""
    LOAD_DEADLINE = "load_deadline"
    """timer load fired"""
    ABORT_ACK_DEADLINE = "abort_ack_deadline"
    """timer abort_ack fired"""
    REQUEST_FINISHED = "request_finished"
    """the engine finished the request"""
    PEER_LOST = "peer_lost"
    """the session to the producer died (the job fails with the session's reason: peer_timeout, handshake_timeout, handshake_mismatch, peer_disconnected, peer_restarted, send_failed, too_many_peers)"""
    SHUTDOWN = "shutdown"
    """the manager is shutting down"""


class ConsumerGuard(enum.StrEnum):
    LOAD_EMPTY = "load_empty"
    """the load job names zero keys"""
    SESSION_READY = "session_ready"
    """the session to the producer is ready"""
    OTHER_ROUND = "other_round"
    """the message names a round other than this id's current round"""
    BLOCKS_VALID = "blocks_valid"
    """first..first+count lies inside the fetch and none of those blocks landed yet"""
    DONE_FAIL = "done_fail"
    """the transfer_done says ok=false"""
    ALL_RECEIVED = "all_received"
    """every block of the fetch has landed"""
    COMPLETES = "completes"
    """blocks_valid, and these blocks are the last ones of the fetch still missing"""


class ConsumerEffect(enum.StrEnum):
    ACCEPT_LOAD = "accept_load"
    """take the load job: its keys, destination slots and a fresh round number"""
    SEND_FETCH = "send_fetch"
    """send fetch(kv_request_id, round, keys) to the producer"""
    WRITE_BLOCKS = "write_blocks"
    """copy the payload frames into the load's slots for keys first..first+count-1"""
    REPORT_LOAD_OK = "report_load_ok"
    """report the load job as succeeded (slots hold the blocks)"""
    FAIL_JOB = "fail_job"
    """report the live load job as failed with the reason (its slots are safe to reuse: no write can land)"""
    FAIL_NEW_JOB = "fail_new_job"
    """report the NEW load job as failed with the reason; the live one is untouched"""
    REPORT_NEW_JOB_OK = "report_new_job_ok"
    """report the NEW (empty) load job as succeeded"""
    SEND_ABORT = "send_abort"
    """send abort_fetch(kv_request_id, round) to the producer (a fresh round if nothing was fetched: the producer may release the id at once)"""
    NOTE_STALE = "note_stale"
    """count a message for an old round; nothing else"""


CONSUMER_INITIAL: Final = ConsumerState.ABSENT
CONSUMER_FINAL: Final = frozenset({ConsumerState.FINISHED})
CONSUMER_TIMERS: Final = MappingProxyType({
    "load": TimerSpec("load", ConsumerEvent.LOAD_DEADLINE, "load_timeout_s"),
    "abort_ack": TimerSpec("abort_ack", ConsumerEvent.ABORT_ACK_DEADLINE, "abort_ack_timeout_s"),
})
"""Timer name -> (event it fires, config key that sets its duration in seconds)."""
CONSUMER_STATE_TIMER: Final = MappingProxyType({
    ConsumerState.ABSENT: None,
    ConsumerState.ANNOUNCED: None,
    ConsumerState.QUEUED: 'load',
    ConsumerState.IN_FLIGHT: 'load',
    ConsumerState.ABORTING: 'abort_ack',
    ConsumerState.CANCELLING: 'abort_ack',
    ConsumerState.LOADED: None,
    ConsumerState.FAILED: None,
    ConsumerState.FINISHED: None,
})
"""State -> name of the timer armed while in it (None: no timer)."""
CONSUMER_TABLE: Final = MappingProxyType({
    (ConsumerState.ABSENT, ConsumerEvent.ANNOUNCE): Rule(TRANSITION, (
        Branch(None, ConsumerState.ANNOUNCED, (), None),
    ), None),
    (ConsumerState.ABSENT, ConsumerEvent.SUBMIT_LOAD): Rule(REJECT, (), Reason.NOT_ANNOUNCED),
    (ConsumerState.ABSENT, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.PEER_LOST): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ANNOUNCED, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ConsumerGuard.LOAD_EMPTY, ConsumerState.LOADED, (ConsumerEffect.ACCEPT_LOAD, ConsumerEffect.SEND_FETCH, ConsumerEffect.REPORT_LOAD_OK, ), None),
        Branch(ConsumerGuard.SESSION_READY, ConsumerState.IN_FLIGHT, (ConsumerEffect.ACCEPT_LOAD, ConsumerEffect.SEND_FETCH, ), None),
        Branch(None, ConsumerState.QUEUED, (ConsumerEffect.ACCEPT_LOAD, ), None),
    ), None),
    (ConsumerState.ANNOUNCED, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.SEND_ABORT, ), Reason.CANCELLED),
    ), None),
    (ConsumerState.ANNOUNCED, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (), None),
    ), None),
    (ConsumerState.ANNOUNCED, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.QUEUED, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.HANDSHAKE_READY): Rule(TRANSITION, (
        Branch(None, ConsumerState.IN_FLIGHT, (ConsumerEffect.SEND_FETCH, ), None),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.LOAD_DEADLINE): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), Reason.LOAD_TIMEOUT),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ConsumerEffect.SEND_ABORT, ), Reason.CANCELLED),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), Reason.SHUTDOWN),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.IN_FLIGHT, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.BLOCK_DATA): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.IN_FLIGHT, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.COMPLETES, ConsumerState.LOADED, (ConsumerEffect.WRITE_BLOCKS, ConsumerEffect.REPORT_LOAD_OK, ), None),
        Branch(ConsumerGuard.BLOCKS_VALID, ConsumerState.IN_FLIGHT, (ConsumerEffect.WRITE_BLOCKS, ), None),
        Branch(None, ConsumerState.IN_FLIGHT, (ConsumerEffect.NOTE_STALE, ), Reason.INCOMPLETE_DATA),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.IN_FLIGHT, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.DONE_FAIL, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
        Branch(ConsumerGuard.ALL_RECEIVED, ConsumerState.LOADED, (ConsumerEffect.REPORT_LOAD_OK, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), Reason.INCOMPLETE_DATA),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.LOAD_DEADLINE): Rule(TRANSITION, (
        Branch(None, ConsumerState.ABORTING, (ConsumerEffect.SEND_ABORT, ), Reason.LOAD_TIMEOUT),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.CANCELLING, (ConsumerEffect.SEND_ABORT, ), Reason.CANCELLED),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), Reason.SHUTDOWN),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ABORTING, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.ABORTING, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ABORTING, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.LATE_DATA),
    (ConsumerState.ABORTING, ConsumerEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.ABORTING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.ABORT_ACK): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.ABORTING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ABORTING, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.CANCELLING, (), Reason.CANCELLED),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), Reason.SHUTDOWN),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.CANCELLING, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.LATE_DATA),
    (ConsumerState.CANCELLING, ConsumerEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.CANCELLING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.ABORT_ACK): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.CANCELLING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), Reason.SHUTDOWN),
    ), None),
    (ConsumerState.LOADED, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ConsumerGuard.LOAD_EMPTY, ConsumerState.LOADED, (ConsumerEffect.REPORT_NEW_JOB_OK, ), None),
        Branch(None, ConsumerState.LOADED, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.ONE_FETCH_PER_ID),
    ), None),
    (ConsumerState.LOADED, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.LOADED, ConsumerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.FAILED, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_NEW_JOB, ), None),
    ), None),
    (ConsumerState.FAILED, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.FAILED, ConsumerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
})


# ------------------------------------------------------------------------------------------
# machine: session — One generation of the control session with one peer (both roles share it).
# ------------------------------------------------------------------------------------------

class SessionState(enum.StrEnum):
    ABSENT = "absent"
    """No session with this peer."""
    CONNECTING = "connecting"
    """We dialled the peer; the connection is being set up."""
    HANDSHAKING = "handshaking"
    """hello sent; waiting for hello_ack. Fetches queue behind it."""
    READY = "ready"
    """Handshake done; every message received restarts the liveness timer."""
    DEAD = "dead"
    """Session over (final); everything bound to it was told peer_lost. A reconnect is a new generation."""


class SessionEvent(enum.StrEnum):
    DIAL = "dial"
    """a consumer needs this producer and no session exists"""
    TRANSPORT_UP = "transport_up"
    """the transport has a connection object for the peer (zmq connects asynchronously)"""
    HELLO = "hello"
    """the peer's hello arrived (version, block layout, hash seed, generation)"""
    HELLO_ACK = "hello_ack"
    """the peer accepted our hello"""
    HELLO_REJECT = "hello_reject"
    """the peer rejected our hello (names the field and both values)"""
    MESSAGE = "message"
    """any valid message from the peer"""
    DISCONNECT = "disconnect"
    """the peer said disconnect, or answered that it does not know our session"""
    SEND_FAILED = "send_failed"
    """the transport could not send to the peer"""
    HANDSHAKE_DEADLINE = "handshake_deadline"
    """timer handshake fired"""
    LIVENESS_DEADLINE = "liveness_deadline"
    """timer liveness fired"""
    SHUTDOWN = "shutdown"
    """the manager is shutting down"""


class SessionGuard(enum.StrEnum):
    HELLO_COMPATIBLE = "hello_compatible"
    """the peer's protocol version, block size, layout fingerprint and hash seed equal ours"""
    TOO_MANY_PEERS = "too_many_peers"
    """this manager already has max_peers sessions (config max_peers)"""


class SessionEffect(enum.StrEnum):
    OPEN_CONNECTION = "open_connection"
    """open a transport connection to the peer"""
    SEND_HELLO = "send_hello"
    """send our hello"""
    SEND_HELLO_ACK = "send_hello_ack"
    """send hello_ack"""
    SEND_HELLO_REJECT = "send_hello_reject"
    """send hello_reject naming the first mismatching field and both values"""
    FLUSH_QUEUED = "flush_queued"
    """tell every queued load on this peer that the session is ready"""
    REPLY_UNKNOWN_SESSION = "reply_unknown_session"
    """answer disconnect(reason=peer_disconnected): we have no session with this peer"""
    SEND_DISCONNECT = "send_disconnect"
    """send disconnect"""
    CLOSE_CONNECTION = "close_connection"
    """close the transport connection"""
    PEER_DOWN = "peer_down"
    """tell every producer and consumer record bound to this peer: peer_lost"""
    RESTART_TIMER = "restart_timer"
    """restart the current state's timer from now"""


SESSION_INITIAL: Final = SessionState.ABSENT
SESSION_FINAL: Final = frozenset({SessionState.DEAD})
SESSION_TIMERS: Final = MappingProxyType({
    "handshake": TimerSpec("handshake", SessionEvent.HANDSHAKE_DEADLINE, "handshake_timeout_s"),
    "liveness": TimerSpec("liveness", SessionEvent.LIVENESS_DEADLINE, "peer_timeout_s"),
})
"""Timer name -> (event it fires, config key that sets its duration in seconds)."""
SESSION_STATE_TIMER: Final = MappingProxyType({
    SessionState.ABSENT: None,
    SessionState.CONNECTING: 'handshake',
    SessionState.HANDSHAKING: 'handshake',
    SessionState.READY: 'liveness',
    SessionState.DEAD: None,
})
"""State -> name of the timer armed while in it (None: no timer)."""
SESSION_TABLE: Final = MappingProxyType({
    (SessionState.ABSENT, SessionEvent.DIAL): Rule(TRANSITION, (
        Branch(SessionGuard.TOO_MANY_PEERS, SessionState.DEAD, (SessionEffect.PEER_DOWN, ), Reason.TOO_MANY_PEERS),
        Branch(None, SessionState.CONNECTING, (SessionEffect.OPEN_CONNECTION, ), None),
    ), None),
    (SessionState.ABSENT, SessionEvent.TRANSPORT_UP): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.HELLO): Rule(TRANSITION, (
        Branch(SessionGuard.TOO_MANY_PEERS, SessionState.DEAD, (SessionEffect.SEND_HELLO_REJECT, ), Reason.TOO_MANY_PEERS),
        Branch(SessionGuard.HELLO_COMPATIBLE, SessionState.READY, (SessionEffect.SEND_HELLO_ACK, ), None),
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_HELLO_REJECT, ), Reason.HANDSHAKE_MISMATCH),
    ), None),
    (SessionState.ABSENT, SessionEvent.HELLO_ACK): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.HELLO_REJECT): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.MESSAGE): Rule(TRANSITION, (
        Branch(None, SessionState.ABSENT, (SessionEffect.REPLY_UNKNOWN_SESSION, ), None),
    ), None),
    (SessionState.ABSENT, SessionEvent.DISCONNECT): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.SEND_FAILED): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.HANDSHAKE_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.LIVENESS_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.SHUTDOWN): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.CONNECTING, SessionEvent.DIAL): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.TRANSPORT_UP): Rule(TRANSITION, (
        Branch(None, SessionState.HANDSHAKING, (SessionEffect.SEND_HELLO, ), None),
    ), None),
    (SessionState.CONNECTING, SessionEvent.HELLO): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.HELLO_ACK): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.HELLO_REJECT): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.MESSAGE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.DISCONNECT): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.CONNECTING, SessionEvent.SEND_FAILED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SEND_FAILED),
    ), None),
    (SessionState.CONNECTING, SessionEvent.HANDSHAKE_DEADLINE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_TIMEOUT),
    ), None),
    (SessionState.CONNECTING, SessionEvent.LIVENESS_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.DIAL): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.TRANSPORT_UP): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.HELLO): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.HELLO_ACK): Rule(TRANSITION, (
        Branch(None, SessionState.READY, (SessionEffect.FLUSH_QUEUED, ), None),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.HELLO_REJECT): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_MISMATCH),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.MESSAGE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.DISCONNECT): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.SEND_FAILED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SEND_FAILED),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.HANDSHAKE_DEADLINE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_TIMEOUT),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.LIVENESS_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
    ), None),
    (SessionState.READY, SessionEvent.DIAL): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.TRANSPORT_UP): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.HELLO): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.PEER_DOWN, ), Reason.PEER_RESTARTED),
    ), None),
    (SessionState.READY, SessionEvent.HELLO_ACK): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.HELLO_REJECT): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.MESSAGE): Rule(TRANSITION, (
        Branch(None, SessionState.READY, (SessionEffect.RESTART_TIMER, ), None),
    ), None),
    (SessionState.READY, SessionEvent.DISCONNECT): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.READY, SessionEvent.SEND_FAILED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SEND_FAILED),
    ), None),
    (SessionState.READY, SessionEvent.HANDSHAKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.LIVENESS_DEADLINE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_TIMEOUT),
    ), None),
    (SessionState.READY, SessionEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
    ), None),
})


PROPERTIES: Final = MappingProxyType({
    "exactly_once_job_result": ("safety", "Every store or load job handed to the manager gets exactly one result, on every path."),
    "tombstoned_never_reparks": ("safety", "A tombstoned id never returns to parked; a store for it fails at once and pins nothing."),
    "no_bytes_for_tombstoned": ("safety", "Blocks are sent only for an id in serving; never for a parked, done, tombstoned or pruned id."),
    "late_fetch_one_rtt": ("safety", "A fetch for a done, tombstoned or cancelling id is answered with transfer_done(fail, reason) in the same step that receives it."),
    "every_state_has_deadline_or_exit": ("structural", "Every non-final state other than the initial one has a timer, or names the engine calls that leave it."),
    "bounded_bookkeeping": ("safety", "Producer records <= live ids + retained ids, and retained ids <= tombstone_max."),
    "no_write_after_terminal": ("safety", "Block data is written into a load's slots only while the load is in_flight, so a slot reported free can never be written."),
    "fetch_always_answered": ("liveness", "Every fetch eventually gets transfer_done, or the consumer's own deadlines end the load; nothing waits forever."),
})
"""Property name -> (kind, statement). Verified by tests and `kvtier check`."""
