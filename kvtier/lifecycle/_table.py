# ============================================================================================
# GENERATED FILE — DO NOT EDIT.
# Source: spec/lifecycle.toml   Generator: python -m tools gen
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

SPEC_SHA256: Final = "4c8ca6a7628ab00d1c134858d3702c7974dcc1fa9c0e8c50c08c7fec43bf4254"
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
    """the data plane failed to move the blocks (its references are released)"""
    TRANSFER_TIMEOUT = "transfer_timeout"
    """the transfer did not finish within transfer_timeout_s"""
    SUPPLY_TIMEOUT = "supply_timeout"
    """a bound fetch waited longer than fetch_supply_timeout_s for blocks that were never stored"""
    INCOMPLETE = "incomplete"
    """the producer's request finished without storing every block the fetch named"""
    NOTHING_STORED = "nothing_stored"
    """the producer's request finished without storing anything under this id (e.g. its engine could not store the blocks)"""
    PEER_LOST = "peer_lost"
    """the peer's session died (silence, disconnect, send failure, restart)"""
    CONSUMER_LOST = "consumer_lost"
    """the id's blocks were released because the consumer whose fetch had bound them was lost (its session died while that fetch waited or its blocks moved); a later fetch of the id is answered this, not peer_lost: the session it came on is alive (decision I40)"""
    DRAINED = "drained"
    """drain_jobs ended the id before any of its blocks was sent: no consumer had fetched it yet, or the fetch that bound it still waited for blocks not stored (a served round: withdrawn before its fetch)"""
    SHUTDOWN = "shutdown"
    """the manager shut down (ours, or the peer's: its goodbye said so)"""
    DUPLICATE_FETCH = "duplicate_fetch"
    """a second fetch for an id that is already bound to another round"""
    TOO_MANY_PENDING = "too_many_pending"
    """the peer already has max_pending_fetches_per_peer fetches waiting for blocks, or, with one waiting already, they would name more than 256 keys per allowed fetch in all"""
    ALREADY_SERVED = "already_served"
    """the id's blocks were already transferred to a consumer"""
    ROUND_FINISHED = "round_finished"
    """a store arrived after the id's transfer completed"""
    ID_IN_USE = "id_in_use"
    """another engine request already parks blocks under this kv_request_id, or the fetch names another life than the blocks parked under it (the two legs of one request carry different life values)"""
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
    CORRUPT = "corrupt"
    """a block landed whose digest differs from the digest taken when it was parked, or the producer sent block data whose payload frames are not the blocks it names (decision I36)"""
    TRANSFER_STALLED = "transfer_stalled"
    """a cancelled transfer was not released by the data plane within transfer_timeout_s; the session is ended to force the release"""
    ABORT_UNACKNOWLEDGED = "abort_unacknowledged"
    """the producer did not answer an abort within abort_ack_timeout_s (of the last data it sent us, while the load's own deadline was ahead), and either its plane is one-sided or it sent us nothing in that time; the session is ended so no write can still land"""
    INSTANCE_DOWN = "instance_down"
    """the producer instance is proven gone (a dial to its address was refused, or the address answers for a new instance) and none of its sessions has been heard from since"""
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    """the session was not ready within handshake_timeout_s"""
    HANDSHAKE_MISMATCH = "handshake_mismatch"
    """protocol version, block layout or hash seed differ between the peers"""
    SESSION_STILL_HELD = "session_still_held"
    """the producer's data plane still holds another session of this consumer's agent: one not ended on its side yet (a later handshake is admitted, decision N25), or the consumer dials it under two names (NIXL admits one session per agent); not a mismatch"""
    SELF_FETCH = "self_fetch"
    """the request names this tier's own address and its data plane cannot load from itself (nixl: a NIXL agent is not its own peer; the zmq plane can); not a mismatch (decision N26)"""
    PEER_TIMEOUT = "peer_timeout"
    """nothing heard from the peer for peer_timeout_s"""
    PEER_DISCONNECTED = "peer_disconnected"
    """the peer said disconnect, did not know our session, or its connection closed"""
    PEER_RESTARTED = "peer_restarted"
    """the peer reconnected with a new generation (or a new session from the same consumer replaced this one)"""
    CONNECT_REFUSED = "connect_refused"
    """the producer's address (each address its host name resolves to, in turn) refused the connection or is unreachable (nothing listens there); nothing was sent"""
    CONNECT_TIMEOUT = "connect_timeout"
    """the producer's address did not answer the connection within connect_timeout_s"""
    UNRESOLVED_HOST = "unresolved_host"
    """the producer's host name did not resolve on this host (no such name, or no DNS answer); nothing was dialled, and it proves nothing about the producer"""
    AUTH_FAILED = "auth_failed"
    """the connection's CURVE handshake failed: only one side runs auth='curve', or a key is not the one expected (our certificate is not in the peer's auth_allowed_keys_dir, or the certificate we hold for its endpoint is not its key); or no certificate we hold names its endpoint, so it was never dialled; nothing was sent"""
    SEND_FAILED = "send_failed"
    """the transport could not send to the peer"""
    PLANE_FAULT = "plane_fault"
    """the data plane's path to the peer broke (NIXL: a remote disconnect at a post or a state check): the session is ended so no fetch waits on a dead path, and the next load dials afresh (the plane adds the peer anew)"""
    TOO_MANY_PEERS = "too_many_peers"
    """this manager already has max_peers sessions"""
    PEER_NOT_ALLOWED = "peer_not_allowed"
    """the request names a producer endpoint outside allowed_peers (or one '*' does not admit: link-local, metadata, multicast, unspecified, loopback from beyond loopback); nothing was dialled"""
    NOT_AUTHORISED = "not_authorised"
    """the peer is not the consumer the producer request named for this id; the refusal changes nothing"""
    IDLE_EVICTED = "idle_evicted"
    """an inbound session with nothing bound to it and no work for handshake_timeout_s was ended to admit a new peer at max_peers"""
    LOCAL = "local"
    """a local-only request: nothing was parked or fetched, so the job succeeded at once"""
    NOT_NEEDED = "not_needed"
    """the consumer needed none of the id's blocks (an empty fetch): the store jobs succeeded and the blocks were released at once"""
    INVALID_PARAMS = "invalid_params"
    """the request's kv_transfer_params were malformed, so the tier hands nothing off for it"""
    NOT_A_CONSUMER = "not_a_consumer"
    """a load for a request that names no remote producer"""
    BAD_JOB = "bad_job"
    """the engine's job was malformed (e.g. keys and slots of different lengths)"""
    JOB_REFUSED = "job_refused"
    """the manager refused the job; its error is logged"""
    PROBE_TIMEOUT = "probe_timeout"
    """the peer did not answer the probe within probe_timeout_s (dialling and the handshake included); the engine computes the blocks"""
    NOT_SERVING = "not_serving"
    """the peer does not serve blocks from its engine's tiers to us (serve_external is off, or our principal is not in its serve_allowed_principals)"""
    SERVE_BUSY = "serve_busy"
    """the peer already serves serve_max_rounds_per_peer rounds for us, or this round had serve_max_probes_per_round probes, or a probe named more keys than its lookup budget (its serve_max_pinned_blocks_per_peer, at least 4,096), or we started a round while our rounds already had four budgets' keys waiting for its engine, or its pinned-block budgets allow no block at all (a full budget answers the keys it cannot pin miss instead)"""
    NOT_OFFERED = "not_offered"
    """a fetch or load named a block that no probe reply of its round offered (or the round had ended)"""
    OFFER_EXPIRED = "offer_expired"
    """the consumer did not fetch the offered blocks within offer_timeout_s; their pins were released"""
    NOT_ANNOUNCED_PROBE = "not_announced_probe"
    """the engine must announce a symmetric request (on_new_request with remote_kv_source) before looking keys up or loading for it"""
    NO_RECORD = "no_record"
    """the id has no record in this machine (never seen or already pruned)"""
    STALE = "stale"
    """a late, duplicate or out-of-order input for this state; counted and dropped"""
    NOT_BOUND = "not_bound"
    """the id is not bound to a peer, so the input does not concern it"""
    PEER_ERROR = "peer_error"
    """the peer refused our message as malformed (e.g. over its size limits), or sent one about this load that did not decode (decision I36)"""
    LATE_DATA = "late_data"
    """block data for a round that is no longer in flight is dropped, never written"""
    NOT_ANNOUNCED = "not_announced"
    """the engine must announce a request (on_new_request) before loading it"""
    IN_GRACE = "in_grace"
    """shutdown lets work in flight finish within shutdown_grace_s; this input changes nothing until then"""
    REFERENCED = "referenced"
    """the data plane still references the blocks; only its release (or closing the plane) ends this state"""


REASON_DOCS: Final = MappingProxyType({
    Reason.REAPED: "the parked blocks waited longer than unbound_store_timeout_s for a fetch and were released",
    Reason.ABORTED: "the consumer aborted the fetch (or cancelled before fetching)",
    Reason.TRANSFER_FAILED: "the data plane failed to move the blocks (its references are released)",
    Reason.TRANSFER_TIMEOUT: "the transfer did not finish within transfer_timeout_s",
    Reason.SUPPLY_TIMEOUT: "a bound fetch waited longer than fetch_supply_timeout_s for blocks that were never stored",
    Reason.INCOMPLETE: "the producer's request finished without storing every block the fetch named",
    Reason.NOTHING_STORED: "the producer's request finished without storing anything under this id (e.g. its engine could not store the blocks)",
    Reason.PEER_LOST: "the peer's session died (silence, disconnect, send failure, restart)",
    Reason.CONSUMER_LOST: "the id's blocks were released because the consumer whose fetch had bound them was lost (its session died while that fetch waited or its blocks moved); a later fetch of the id is answered this, not peer_lost: the session it came on is alive (decision I40)",
    Reason.DRAINED: "drain_jobs ended the id before any of its blocks was sent: no consumer had fetched it yet, or the fetch that bound it still waited for blocks not stored (a served round: withdrawn before its fetch)",
    Reason.SHUTDOWN: "the manager shut down (ours, or the peer's: its goodbye said so)",
    Reason.DUPLICATE_FETCH: "a second fetch for an id that is already bound to another round",
    Reason.TOO_MANY_PENDING: "the peer already has max_pending_fetches_per_peer fetches waiting for blocks, or, with one waiting already, they would name more than 256 keys per allowed fetch in all",
    Reason.ALREADY_SERVED: "the id's blocks were already transferred to a consumer",
    Reason.ROUND_FINISHED: "a store arrived after the id's transfer completed",
    Reason.ID_IN_USE: "another engine request already parks blocks under this kv_request_id, or the fetch names another life than the blocks parked under it (the two legs of one request carry different life values)",
    Reason.LOAD_TIMEOUT: "the consumer's load did not complete within load_timeout_s",
    Reason.CANCELLED: "the consumer's engine finished the request before the load completed",
    Reason.DUPLICATE_LOAD: "a second load for an id while one is live",
    Reason.ONE_FETCH_PER_ID: "an id is fetched at most once; a second load after a terminal one fails",
    Reason.INCOMPLETE_DATA: "transfer_done(ok) arrived but not every block had landed",
    Reason.CORRUPT: "a block landed whose digest differs from the digest taken when it was parked, or the producer sent block data whose payload frames are not the blocks it names (decision I36)",
    Reason.TRANSFER_STALLED: "a cancelled transfer was not released by the data plane within transfer_timeout_s; the session is ended to force the release",
    Reason.ABORT_UNACKNOWLEDGED: "the producer did not answer an abort within abort_ack_timeout_s (of the last data it sent us, while the load's own deadline was ahead), and either its plane is one-sided or it sent us nothing in that time; the session is ended so no write can still land",
    Reason.INSTANCE_DOWN: "the producer instance is proven gone (a dial to its address was refused, or the address answers for a new instance) and none of its sessions has been heard from since",
    Reason.HANDSHAKE_TIMEOUT: "the session was not ready within handshake_timeout_s",
    Reason.HANDSHAKE_MISMATCH: "protocol version, block layout or hash seed differ between the peers",
    Reason.SESSION_STILL_HELD: "the producer's data plane still holds another session of this consumer's agent: one not ended on its side yet (a later handshake is admitted, decision N25), or the consumer dials it under two names (NIXL admits one session per agent); not a mismatch",
    Reason.SELF_FETCH: "the request names this tier's own address and its data plane cannot load from itself (nixl: a NIXL agent is not its own peer; the zmq plane can); not a mismatch (decision N26)",
    Reason.PEER_TIMEOUT: "nothing heard from the peer for peer_timeout_s",
    Reason.PEER_DISCONNECTED: "the peer said disconnect, did not know our session, or its connection closed",
    Reason.PEER_RESTARTED: "the peer reconnected with a new generation (or a new session from the same consumer replaced this one)",
    Reason.CONNECT_REFUSED: "the producer's address (each address its host name resolves to, in turn) refused the connection or is unreachable (nothing listens there); nothing was sent",
    Reason.CONNECT_TIMEOUT: "the producer's address did not answer the connection within connect_timeout_s",
    Reason.UNRESOLVED_HOST: "the producer's host name did not resolve on this host (no such name, or no DNS answer); nothing was dialled, and it proves nothing about the producer",
    Reason.AUTH_FAILED: "the connection's CURVE handshake failed: only one side runs auth='curve', or a key is not the one expected (our certificate is not in the peer's auth_allowed_keys_dir, or the certificate we hold for its endpoint is not its key); or no certificate we hold names its endpoint, so it was never dialled; nothing was sent",
    Reason.SEND_FAILED: "the transport could not send to the peer",
    Reason.PLANE_FAULT: "the data plane's path to the peer broke (NIXL: a remote disconnect at a post or a state check): the session is ended so no fetch waits on a dead path, and the next load dials afresh (the plane adds the peer anew)",
    Reason.TOO_MANY_PEERS: "this manager already has max_peers sessions",
    Reason.PEER_NOT_ALLOWED: "the request names a producer endpoint outside allowed_peers (or one '*' does not admit: link-local, metadata, multicast, unspecified, loopback from beyond loopback); nothing was dialled",
    Reason.NOT_AUTHORISED: "the peer is not the consumer the producer request named for this id; the refusal changes nothing",
    Reason.IDLE_EVICTED: "an inbound session with nothing bound to it and no work for handshake_timeout_s was ended to admit a new peer at max_peers",
    Reason.LOCAL: "a local-only request: nothing was parked or fetched, so the job succeeded at once",
    Reason.NOT_NEEDED: "the consumer needed none of the id's blocks (an empty fetch): the store jobs succeeded and the blocks were released at once",
    Reason.INVALID_PARAMS: "the request's kv_transfer_params were malformed, so the tier hands nothing off for it",
    Reason.NOT_A_CONSUMER: "a load for a request that names no remote producer",
    Reason.BAD_JOB: "the engine's job was malformed (e.g. keys and slots of different lengths)",
    Reason.JOB_REFUSED: "the manager refused the job; its error is logged",
    Reason.PROBE_TIMEOUT: "the peer did not answer the probe within probe_timeout_s (dialling and the handshake included); the engine computes the blocks",
    Reason.NOT_SERVING: "the peer does not serve blocks from its engine's tiers to us (serve_external is off, or our principal is not in its serve_allowed_principals)",
    Reason.SERVE_BUSY: "the peer already serves serve_max_rounds_per_peer rounds for us, or this round had serve_max_probes_per_round probes, or a probe named more keys than its lookup budget (its serve_max_pinned_blocks_per_peer, at least 4,096), or we started a round while our rounds already had four budgets' keys waiting for its engine, or its pinned-block budgets allow no block at all (a full budget answers the keys it cannot pin miss instead)",
    Reason.NOT_OFFERED: "a fetch or load named a block that no probe reply of its round offered (or the round had ended)",
    Reason.OFFER_EXPIRED: "the consumer did not fetch the offered blocks within offer_timeout_s; their pins were released",
    Reason.NOT_ANNOUNCED_PROBE: "the engine must announce a symmetric request (on_new_request with remote_kv_source) before looking keys up or loading for it",
    Reason.NO_RECORD: "the id has no record in this machine (never seen or already pruned)",
    Reason.STALE: "a late, duplicate or out-of-order input for this state; counted and dropped",
    Reason.NOT_BOUND: "the id is not bound to a peer, so the input does not concern it",
    Reason.PEER_ERROR: "the peer refused our message as malformed (e.g. over its size limits), or sent one about this load that did not decode (decision I36)",
    Reason.LATE_DATA: "block data for a round that is no longer in flight is dropped, never written",
    Reason.NOT_ANNOUNCED: "the engine must announce a request (on_new_request) before loading it",
    Reason.IN_GRACE: "shutdown lets work in flight finish within shutdown_grace_s; this input changes nothing until then",
    Reason.REFERENCED: "the data plane still references the blocks; only its release (or closing the plane) ends this state",
})
"""Reason -> what it means (the spec's text; docs/troubleshooting.md and ``kvtier why``)."""


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
    """Bound; every demanded block is stored and the data plane is moving them: it references the blocks."""
    DELIVERING = "delivering"
    """The data plane has moved every block and released them; waits for the consumer's receipt."""
    CONFIRMED = "confirmed"
    """The consumer confirmed every block, but the data plane still references them; waits for the release."""
    CANCELLING = "cancelling"
    """The transfer was given up; the terminal answer waits until the data plane releases every block (no write can land after it)."""
    QUARANTINED = "quarantined"
    """The data plane did not release a given-up transfer in time; the session was ended to force it. The blocks stay out of the engine's hands (the job stays outstanding) until the plane reports the release."""
    DONE = "done"
    """The consumer confirmed receipt; jobs succeeded; retained so a late or duplicate fetch is answered in one round trip."""
    TOMBSTONED = "tombstoned"
    """Ended without a confirmed transfer (reaped, aborted, failed …); retained with its reason so a late fetch or store is refused in one round trip."""
    PRUNED = "pruned"
    """Record deleted (final)."""


class ProducerEvent(enum.StrEnum):
    STORE = "store"
    """the engine submitted a store job (submit_store) for this id"""
    FETCH = "fetch"
    """a consumer's fetch(kv_request_id, round, keys) arrived"""
    RECEIPT = "receipt"
    """the consumer's receipt(kv_request_id, round) arrived: every block landed and matched its digest"""
    TRANSFER_RELEASED = "transfer_released"
    """the data plane moved every block of the transfer (or, after a cancel, stopped) and holds no reference to them"""
    TRANSFER_FAILED = "transfer_failed"
    """the data plane failed the transfer and holds no reference to its blocks"""
    ABORT_FETCH = "abort_fetch"
    """the consumer's abort_fetch(kv_request_id, round, fetched) arrived"""
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
    NAMED_OTHER = "named_other"
    """the producer request named a consumer for this id while a fetch from another peer holds it, bound before any name (fetch-before-store): that binding is refused not_authorised, so the named consumer's fetch finds the id free (decision L17)"""
    NEW_LIFE = "new_life"
    """an input names a life of the id other than the one this retained record ended with (the id is reused): the record is pruned first, and the input then meets a fresh record"""
    PEER_LOST = "peer_lost"
    """the session of the peer this id is bound to died"""
    DRAIN = "drain"
    """the engine called drain_jobs"""
    SHUTDOWN = "shutdown"
    """shutdown() began: no new work; work in flight may finish within shutdown_grace_s"""
    CLOSE = "close"
    """the shutdown grace is over: everything still live ends now, and the data plane is closed next"""


class ProducerGuard(enum.StrEnum):
    STORE_EMPTY = "store_empty"
    """the store job names zero blocks"""
    OTHER_OWNER = "other_owner"
    """the store comes from a different engine request than the one that parked the id"""
    PARK_CLOCK_LAST = "park_clock_last"
    """config park_clock == 'last_store': every store restarts the reap clock"""
    FETCH_EMPTY = "fetch_empty"
    """the fetch names zero keys (the consumer already has every block)"""
    NEEDED_NOTHING = "needed_nothing"
    """the id is done because its consumer needed none of its blocks (not_needed)"""
    NOTHING_PARKED = "nothing_parked"
    """no block of the id is parked: its producer request stored nothing under it (its engine could not store the blocks), not only part of what the fetch named"""
    DEMAND_MET = "demand_met"
    """every key the fetch names is already stored"""
    STORE_MEETS_DEMAND = "store_meets_demand"
    """this store supplies every key of the bound fetch that was still missing"""
    PEER_BUSY = "peer_busy"
    """the fetching peer already has max_pending_fetches_per_peer ids awaiting blocks, or has some and this fetch's keys would take the keys they name past 256 per allowed fetch (decision I34)"""
    SAME_ROUND = "same_round"
    """the input comes from the (peer, generation, round) the id is bound to"""
    NOT_AUTHORISED = "not_authorised"
    """the producer request named the consumer allowed to touch this id, and the input's peer is not it"""
    BINDING_UNAUTHORISED = "binding_unauthorised"
    """the store names a consumer for this id and the fetch already bound to it came from another peer"""
    FETCHED_ROUND = "fetched_round"
    """the abort names a round that sent a fetch: it concerns that fetch's binding, which this life does not have"""
    SUPPLY_COMPLETE = "supply_complete"
    """the engine finished the producer request, so no more stores will come for this id"""
    SHUTTING_DOWN = "shutting_down"
    """shutdown() has begun: no new work is accepted"""
    RECEIPT_SEEN = "receipt_seen"
    """the consumer confirmed receipt of every block before the data plane released them"""
    STALE_ROUND = "stale_round"
    """the fetch's round is below the lowest round its consumer still has open on this session, or one this session already answered: a duplicated or overtaken fetch (decision I11)"""
    OTHER_LIFE = "other_life"
    """the input and the record both name a life of the id, and they differ (decision I20)"""


class ProducerEffect(enum.StrEnum):
    PARK_BLOCKS = "park_blocks"
    """record the store job's (key, block, digest) triples; the engine keeps the blocks pinned until the job result"""
    REPORT_STORE_OK = "report_store_ok"
    """report this store job as succeeded at once (nothing needs to be kept)"""
    FAIL_STORE_JOB = "fail_store_job"
    """report this store job as failed with the reason"""
    BIND = "bind"
    """bind the id to the fetch's (peer, generation, round), its key list and its destination slots"""
    START_TRANSFER = "start_transfer"
    """hand the demanded blocks (fetch key order, with their parked digests) to the data plane for the bound peer"""
    CANCEL_TRANSFER = "cancel_transfer"
    """ask the data plane to stop: it posts nothing more and reports transfer_released once no block is referenced"""
    SEND_NOTICE = "send_notice"
    """tell the bound round's consumer at once that the transfer is given up and why (transfer_done(fail, reason, final=false)): a notice, not the terminal answer, which follows once no write can land"""
    FORCE_RELEASE = "force_release"
    """end the session with the bound peer (transfer_stalled) so the data plane drops every reference it holds to that peer"""
    COMPLETE_JOBS = "complete_jobs"
    """report every store job of the id as succeeded (its blocks may be released)"""
    RELEASE_UNNEEDED = "release_unneeded"
    """report every store job of the id as succeeded because the consumer needed none of its blocks (counted not_needed)"""
    REPORT_STORE_UNNEEDED = "report_store_unneeded"
    """report this store job as succeeded at once: the id's consumer needed none of its blocks (counted not_needed)"""
    FAIL_JOBS = "fail_jobs"
    """report every store job of the id as failed with the reason"""
    REPLY_DONE_OK = "reply_done_ok"
    """send transfer_done(ok) to the fetch's peer and round"""
    REPLY_DONE_FAIL = "reply_done_fail"
    """send transfer_done(fail, reason) to the bound peer and round: the terminal answer, only once no write can land"""
    REPLY_TERMINAL = "reply_terminal"
    """send the bound round its terminal answer now that no write can land: abort_ack if the consumer aborted it, else transfer_done(fail, reason)"""
    REPLY_FETCH_FAILED = "reply_fetch_failed"
    """send transfer_done(fail, reason) to the peer and round of THIS fetch only"""
    REPLY_ABORT_ACK = "reply_abort_ack"
    """send abort_ack to the aborting peer and round"""
    RESTART_TIMER = "restart_timer"
    """restart the current state's timer from now"""
    NOTE_DUPLICATE = "note_duplicate"
    """count an exactly repeated input (network duplicate); nothing else"""
    NOTE_STALE = "note_stale"
    """count an input that names another peer or round; nothing else"""
    NOTE_SUPPLY_COMPLETE = "note_supply_complete"
    """remember that the engine finished the request: every store has been submitted"""
    NOTE_RECEIPT = "note_receipt"
    """remember that the consumer confirmed every block"""
    UNBIND = "unbind"
    """forget the binding (peer, generation, round, keys, slots): the id waits for its named consumer again"""
    NOTE_LIFE = "note_life"
    """remember the life the input names: the record ends that life only, and an input of another life replaces it"""
    NOTE_PREEMPTOR = "note_preemptor"
    """an id no producer request has named a consumer for yet, ended by a peer's fetch or abort before any store: remember that peer's principal as the id's ender; a producer request (or store) naming another consumer replaces the record, so a stranger cannot decide the fate of an id before its engine names who may; any other peer's fetch is answered from the id's state (no consumer was named, so none is refused not_authorised; decision L17)"""


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
    ProducerState.DELIVERING: 'transfer',
    ProducerState.CONFIRMED: 'cancel',
    ProducerState.CANCELLING: 'cancel',
    ProducerState.QUARANTINED: None,
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
        Branch(ProducerGuard.STALE_ROUND, ProducerState.ABSENT, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.ABSENT, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.SHUTTING_DOWN, ProducerState.ABSENT, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.SHUTDOWN),
        Branch(ProducerGuard.FETCH_EMPTY, ProducerState.DONE, (ProducerEffect.NOTE_LIFE, ProducerEffect.NOTE_PREEMPTOR, ProducerEffect.REPLY_DONE_OK, ), Reason.NOT_NEEDED),
        Branch(ProducerGuard.PEER_BUSY, ProducerState.ABSENT, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.TOO_MANY_PENDING),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.BIND, ), None),
    ), None),
    (ProducerState.ABSENT, ProducerEvent.RECEIPT): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.ABSENT, (ProducerEffect.REPLY_ABORT_ACK, ), None),
        Branch(ProducerGuard.FETCHED_ROUND, ProducerState.ABSENT, (ProducerEffect.REPLY_ABORT_ACK, ), None),
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.NOTE_LIFE, ProducerEffect.NOTE_PREEMPTOR, ProducerEffect.REPLY_ABORT_ACK, ), Reason.ABORTED),
    ), None),
    (ProducerState.ABSENT, ProducerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.NOTE_LIFE, ), Reason.NOTHING_STORED),
    ), None),
    (ProducerState.ABSENT, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.ABSENT, ProducerEvent.NEW_LIFE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.ABSENT, ProducerEvent.CLOSE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProducerState.PARKED, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.PARKED, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.PARK_CLOCK_LAST, ProducerState.PARKED, (ProducerEffect.PARK_BLOCKS, ProducerEffect.RESTART_TIMER, ), None),
        Branch(None, ProducerState.PARKED, (ProducerEffect.PARK_BLOCKS, ), None),
    ), None),
    (ProducerState.PARKED, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.PARKED, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.PARKED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.PARKED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.FETCH_EMPTY, ProducerState.DONE, (ProducerEffect.RELEASE_UNNEEDED, ProducerEffect.REPLY_DONE_OK, ), Reason.NOT_NEEDED),
        Branch(ProducerGuard.DEMAND_MET, ProducerState.SERVING, (ProducerEffect.BIND, ProducerEffect.START_TRANSFER, ), None),
        Branch(ProducerGuard.SUPPLY_COMPLETE, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_FETCH_FAILED, ), Reason.INCOMPLETE),
        Branch(ProducerGuard.PEER_BUSY, ProducerState.PARKED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.TOO_MANY_PENDING),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.BIND, ), None),
    ), None),
    (ProducerState.PARKED, ProducerEvent.RECEIPT): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.PARKED, (ProducerEffect.REPLY_ABORT_ACK, ), None),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.PARKED, (ProducerEffect.REPLY_ABORT_ACK, ), None),
        Branch(ProducerGuard.FETCHED_ROUND, ProducerState.PARKED, (ProducerEffect.REPLY_ABORT_ACK, ), None),
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
    (ProducerState.PARKED, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.NEW_LIFE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.PARKED, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.NOT_BOUND),
    (ProducerState.PARKED, ProducerEvent.DRAIN): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), Reason.DRAINED),
    ), None),
    (ProducerState.PARKED, ProducerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.PARKED, ProducerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.AWAITING, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.PARKED, (ProducerEffect.REPLY_DONE_FAIL, ProducerEffect.UNBIND, ProducerEffect.PARK_BLOCKS, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.BINDING_UNAUTHORISED, ProducerState.PARKED, (ProducerEffect.REPLY_DONE_FAIL, ProducerEffect.UNBIND, ProducerEffect.PARK_BLOCKS, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.STORE_MEETS_DEMAND, ProducerState.SERVING, (ProducerEffect.PARK_BLOCKS, ProducerEffect.START_TRANSFER, ), None),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.PARK_BLOCKS, ProducerEffect.RESTART_TIMER, ), None),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.AWAITING, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.AWAITING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.AWAITING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.SAME_ROUND, ProducerState.AWAITING, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.DUPLICATE_FETCH),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.RECEIPT): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_ABORT_ACK, ), Reason.ABORTED),
        Branch(None, ProducerState.AWAITING, (ProducerEffect.NOTE_STALE, ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(ProducerGuard.NOTHING_PARKED, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.NOTHING_STORED),
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.INCOMPLETE),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.SUPPLY_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.SUPPLY_TIMEOUT),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.NAMED_OTHER): Rule(TRANSITION, (
        Branch(ProducerGuard.NOTHING_PARKED, ProducerState.ABSENT, (ProducerEffect.REPLY_DONE_FAIL, ProducerEffect.UNBIND, ), Reason.NOT_AUTHORISED),
        Branch(None, ProducerState.PARKED, (ProducerEffect.REPLY_DONE_FAIL, ProducerEffect.UNBIND, ), Reason.NOT_AUTHORISED),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.NEW_LIFE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.AWAITING, ProducerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), Reason.PEER_LOST),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.DRAIN): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.DRAINED),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.AWAITING, ProducerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.SERVING, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.SERVING, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(None, ProducerState.SERVING, (ProducerEffect.REPORT_STORE_OK, ), None),
    ), None),
    (ProducerState.SERVING, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.SERVING, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.SERVING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.SERVING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.SAME_ROUND, ProducerState.SERVING, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.SERVING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.DUPLICATE_FETCH),
    ), None),
    (ProducerState.SERVING, ProducerEvent.RECEIPT): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.CONFIRMED, (ProducerEffect.NOTE_RECEIPT, ), None),
        Branch(None, ProducerState.SERVING, (ProducerEffect.NOTE_STALE, ), None),
    ), None),
    (ProducerState.SERVING, ProducerEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(None, ProducerState.DELIVERING, (), None),
    ), None),
    (ProducerState.SERVING, ProducerEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.TRANSFER_FAILED),
    ), None),
    (ProducerState.SERVING, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.CANCELLING, (ProducerEffect.CANCEL_TRANSFER, ), Reason.ABORTED),
        Branch(None, ProducerState.SERVING, (ProducerEffect.NOTE_STALE, ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.SERVING, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.TRANSFER_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.CANCEL_TRANSFER, ProducerEffect.SEND_NOTICE, ), Reason.TRANSFER_TIMEOUT),
    ), None),
    (ProducerState.SERVING, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.NEW_LIFE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.CANCEL_TRANSFER, ), Reason.PEER_LOST),
    ), None),
    (ProducerState.SERVING, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.SERVING, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (ProducerState.SERVING, ProducerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.CANCEL_TRANSFER, ProducerEffect.SEND_NOTICE, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.DELIVERING, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.DELIVERING, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(None, ProducerState.DELIVERING, (ProducerEffect.REPORT_STORE_OK, ), None),
    ), None),
    (ProducerState.DELIVERING, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.DELIVERING, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.DELIVERING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.DELIVERING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.SAME_ROUND, ProducerState.DELIVERING, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.DELIVERING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.DUPLICATE_FETCH),
    ), None),
    (ProducerState.DELIVERING, ProducerEvent.RECEIPT): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS, ), None),
        Branch(None, ProducerState.DELIVERING, (ProducerEffect.NOTE_STALE, ), None),
    ), None),
    (ProducerState.DELIVERING, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_ABORT_ACK, ), Reason.ABORTED),
        Branch(None, ProducerState.DELIVERING, (ProducerEffect.NOTE_STALE, ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.DELIVERING, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.TRANSFER_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.TRANSFER_TIMEOUT),
    ), None),
    (ProducerState.DELIVERING, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.NEW_LIFE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ), Reason.PEER_LOST),
    ), None),
    (ProducerState.DELIVERING, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DELIVERING, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (ProducerState.DELIVERING, ProducerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL, ), Reason.SHUTDOWN),
    ), None),
    (ProducerState.CONFIRMED, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.CONFIRMED, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(None, ProducerState.CONFIRMED, (ProducerEffect.REPORT_STORE_OK, ), None),
    ), None),
    (ProducerState.CONFIRMED, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.CONFIRMED, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.CONFIRMED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.CONFIRMED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.SAME_ROUND, ProducerState.CONFIRMED, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.CONFIRMED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.DUPLICATE_FETCH),
    ), None),
    (ProducerState.CONFIRMED, ProducerEvent.RECEIPT): Rule(TRANSITION, (
        Branch(None, ProducerState.CONFIRMED, (ProducerEffect.NOTE_STALE, ), None),
    ), None),
    (ProducerState.CONFIRMED, ProducerEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(None, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS, ), None),
    ), None),
    (ProducerState.CONFIRMED, ProducerEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(None, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS, ), None),
    ), None),
    (ProducerState.CONFIRMED, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.CONFIRMED, (ProducerEffect.NOTE_STALE, ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.CONFIRMED, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CONFIRMED, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CONFIRMED, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CONFIRMED, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CONFIRMED, ProducerEvent.CANCEL_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.QUARANTINED, (ProducerEffect.FORCE_RELEASE, ), None),
    ), None),
    (ProducerState.CONFIRMED, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CONFIRMED, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CONFIRMED, ProducerEvent.NEW_LIFE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CONFIRMED, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.CONFIRMED, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CONFIRMED, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.CONFIRMED, ProducerEvent.CLOSE): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.CANCELLING, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.CANCELLING, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.FAIL_STORE_JOB, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.CANCELLING, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.CANCELLING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.CANCELLING, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.SAME_ROUND, ProducerState.CANCELLING, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.REPLY_FETCH_FAILED, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.RECEIPT): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.CONFIRMED, (ProducerEffect.NOTE_RECEIPT, ), None),
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.NOTE_STALE, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_TERMINAL, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_TERMINAL, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.CANCELLING, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.CANCELLING, (ProducerEffect.NOTE_STALE, ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.CANCEL_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.QUARANTINED, (ProducerEffect.FORCE_RELEASE, ), None),
    ), None),
    (ProducerState.CANCELLING, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.NEW_LIFE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.CANCELLING, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.CANCELLING, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.CANCELLING, ProducerEvent.CLOSE): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.QUARANTINED, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.OTHER_OWNER, ProducerState.QUARANTINED, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ID_IN_USE),
        Branch(None, ProducerState.QUARANTINED, (ProducerEffect.FAIL_STORE_JOB, ), None),
    ), None),
    (ProducerState.QUARANTINED, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.QUARANTINED, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.QUARANTINED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(ProducerGuard.OTHER_LIFE, ProducerState.QUARANTINED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ID_IN_USE),
        Branch(ProducerGuard.SAME_ROUND, ProducerState.QUARANTINED, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.QUARANTINED, (ProducerEffect.REPLY_FETCH_FAILED, ), None),
    ), None),
    (ProducerState.QUARANTINED, ProducerEvent.RECEIPT): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.QUARANTINED, (ProducerEffect.NOTE_RECEIPT, ), None),
        Branch(None, ProducerState.QUARANTINED, (ProducerEffect.NOTE_STALE, ), None),
    ), None),
    (ProducerState.QUARANTINED, ProducerEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(ProducerGuard.RECEIPT_SEEN, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS, ), None),
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_TERMINAL, ), None),
    ), None),
    (ProducerState.QUARANTINED, ProducerEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(ProducerGuard.RECEIPT_SEEN, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS, ), None),
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_TERMINAL, ), None),
    ), None),
    (ProducerState.QUARANTINED, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.SAME_ROUND, ProducerState.QUARANTINED, (ProducerEffect.NOTE_DUPLICATE, ), None),
        Branch(None, ProducerState.QUARANTINED, (ProducerEffect.NOTE_STALE, ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.QUARANTINED, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.PRUNE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.NEW_LIFE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.QUARANTINED, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.QUARANTINED, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.QUARANTINED, ProducerEvent.CLOSE): Rule(IGNORE, (), Reason.REFERENCED),
    (ProducerState.DONE, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(ProducerGuard.NEEDED_NOTHING, ProducerState.DONE, (ProducerEffect.REPORT_STORE_UNNEEDED, ), None),
        Branch(None, ProducerState.DONE, (ProducerEffect.FAIL_STORE_JOB, ), Reason.ROUND_FINISHED),
    ), None),
    (ProducerState.DONE, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.DONE, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.DONE, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(None, ProducerState.DONE, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.ALREADY_SERVED),
    ), None),
    (ProducerState.DONE, ProducerEvent.RECEIPT): Rule(TRANSITION, (
        Branch(None, ProducerState.DONE, (ProducerEffect.NOTE_STALE, ), None),
    ), None),
    (ProducerState.DONE, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.DONE, (ProducerEffect.NOTE_STALE, ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.DONE, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.PRUNE_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
    (ProducerState.DONE, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.NEW_LIFE): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
    (ProducerState.DONE, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.DONE, ProducerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.STORE): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_STORE_JOB, ), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.FETCH): Rule(TRANSITION, (
        Branch(ProducerGuard.STALE_ROUND, ProducerState.TOMBSTONED, (ProducerEffect.NOTE_STALE, ), None),
        Branch(ProducerGuard.NOT_AUTHORISED, ProducerState.TOMBSTONED, (ProducerEffect.REPLY_FETCH_FAILED, ), Reason.NOT_AUTHORISED),
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.REPLY_FETCH_FAILED, ), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.RECEIPT): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.NOTE_STALE, ), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.NOTE_STALE, ProducerEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.REAP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.SUPPLY_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.PRUNE_DEADLINE): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.NAMED_OTHER): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.NEW_LIFE): Rule(TRANSITION, (
        Branch(None, ProducerState.PRUNED, (), None),
    ), None),
    (ProducerState.TOMBSTONED, ProducerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.STALE),
    (ProducerState.TOMBSTONED, ProducerEvent.CLOSE): Rule(TRANSITION, (
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
    """The engine announced the request (remote_prefiller params); lookups HIT; no load yet. A session to its producer that ends after it was up leaves it announced: a load, if one comes, dials afresh (decision I39); a dial that failed answers it."""
    QUEUED = "queued"
    """Load submitted; the fetch waits for the session handshake. Nothing was sent, so nothing can land."""
    IN_FLIGHT = "in_flight"
    """Fetch sent; blocks land in the load's slots and are checked against their digests."""
    ABORTING = "aborting"
    """The load gave up (deadline, corrupt block); abort_fetch sent; waits for the producer's terminal answer, after which no write can land."""
    CANCELLING = "cancelling"
    """The engine finished the request during the load; abort_fetch sent; waits for the producer's terminal answer."""
    GIVEN_UP = "given_up"
    """One-sided planes: the producer gave the transfer up and said why (its notice); writes it already posted may still land, so the slots are held until its terminal answer (or revocation). Every later ending reports the notice's reason."""
    REVOKING = "revoking"
    """The producer cannot answer (session dead or abort unanswered); the data plane withdraws its access; waits until that is certain: the plane says so, or the revoke deadline passes (a plane that withdraws by itself is done by then). A plane that cannot withdraw keeps the slots past it, saying so."""
    SETTLING = "settling"
    """The load has ended (its terminal answer, a revocation or a deadline came), but a landing it started has not answered yet: a copy into its slots may still be running (zmq: on the digest pool). The result waits for every landing's answer, so no byte lands in a slot after the job's result (decision I26). The data plane always answers a landing (its close reports every one)."""
    LOADED = "loaded"
    """Every block landed and matched its digest; success reported, receipt sent; waits for the engine to finish the request."""
    FAILED = "failed"
    """Failure reported (slots safe to reuse); later lookups MISS so the engine recomputes; waits for the engine to finish the request."""
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
    """block_data(kv_request_id, round, first, count, digests) arrived (with payload frames on the zmq plane)"""
    BLOCKS_LANDED = "blocks_landed"
    """the shell landed the blocks of a block_data in their slots and checked them against their digests (ok or corrupt)"""
    TRANSFER_DONE = "transfer_done"
    """transfer_done(kv_request_id, round, ok, reason, final) arrived: the producer's terminal answer, or (final=false) its notice that it gave the transfer up"""
    ABORT_ACK = "abort_ack"
    """abort_ack(kv_request_id, round) arrived: the producer's terminal answer to an abort"""
    ACCESS_REVOKED = "access_revoked"
    """the data plane confirmed that the producer can no longer write into this load's slots"""
    REVOKE_DEADLINE = "revoke_deadline"
    """timer revoke fired"""
    LOAD_DEADLINE = "load_deadline"
    """timer load fired"""
    ABORT_ACK_DEADLINE = "abort_ack_deadline"
    """timer abort_ack fired"""
    REQUEST_FINISHED = "request_finished"
    """the engine finished the request"""
    PEER_LOST = "peer_lost"
    """the session to the producer died (the job fails with the session's reason: peer_timeout, handshake_timeout, handshake_mismatch, peer_disconnected, peer_restarted, send_failed, too_many_peers, abort_unacknowledged, transfer_stalled, connect_refused, connect_timeout, unresolved_host, auth_failed)"""
    SHUTDOWN = "shutdown"
    """shutdown() began: no new work; loads in flight may finish within shutdown_grace_s"""
    CLOSE = "close"
    """the shutdown grace is over: everything still live ends now"""


class ConsumerGuard(enum.StrEnum):
    DIAL_FAILED = "dial_failed"
    """the session ended before it was ever up: the dial the request made failed (connect_refused, connect_timeout, unresolved_host, auth_failed, too_many_peers, handshake_timeout, handshake_mismatch, self_fetch), which answers the request (decision I39)"""
    REFUSED_FOR_NOW = "refused_for_now"
    """the session ended session_still_held (the producer's plane still held another session of ours) and this load has not dialled again for that yet: one more dial may be admitted (decision N25)"""
    LOAD_EMPTY = "load_empty"
    """the load job names zero keys"""
    NEEDS_NOTHING = "needs_nothing"
    """this id's load names zero keys: its fetch only releases the producer's blocks"""
    EMPTY_ON_READY_SESSION = "empty_on_ready_session"
    """the load job names zero keys and the session to the producer is ready (the empty fetch can go now; on a session still in its handshake it queues like any fetch, so it is never sent before the producer can take it)"""
    INSTANCE_DOWN = "instance_down"
    """the session to the producer is ready but belongs to a producer instance proven gone (its address refused a dial, or answers for another instance now) and none of its sessions has been heard from since; a session still dialling waits for the dial's own outcome (decision I30)"""
    SESSION_READY = "session_ready"
    """the session to the producer is ready"""
    ABORTED_CORRUPT = "aborted_corrupt"
    """the load aborted because a landed block did not match its digest (not for its deadline)"""
    PRODUCER_SENDING = "producer_sending"
    """the load's own deadline (load_timeout_s from its submission) is still ahead and the producer sent us work (a message other than a ping or pong, or part of one; on a one-sided plane, whose WRITEs bypass the connection, any message) within the last abort_ack_timeout_s: its answer may be queued behind the data it still sends on the same connection, or wait for WRITEs it had posted to drain, so it is waited for (decision L19)"""
    PRODUCER_BUSY = "producer_busy"
    """a two-sided plane (zmq: the consumer lands every byte itself, so once the load ends nothing of it can land) and the producer sent us work within the last abort_ack_timeout_s: its answer is late behind other loads' data, not lost, so the load ends alone and the session stays (decision L20)"""
    OTHER_ROUND = "other_round"
    """the message names a round other than this id's current round"""
    BLOCKS_VALID = "blocks_valid"
    """first..first+count lies inside the fetch, none of those blocks landed or is landing yet, and one digest per block is given"""
    CORRUPT = "corrupt"
    """a landed block's bytes do not match the digest taken when it was parked"""
    DONE_FAIL = "done_fail"
    """the transfer_done says ok=false"""
    ALL_RECEIVED = "all_received"
    """every block of the fetch has landed"""
    COMPLETES = "completes"
    """these blocks are the last ones of the fetch still missing"""
    ENGINE_FINISHED = "engine_finished"
    """the engine finished the request while the load was ending"""
    FAILED_WHILE_LANDING = "failed_while_landing"
    """the transfer_done says ok=false and a landing this load started has not answered yet"""
    NOTICE = "notice"
    """the transfer_done is the producer's notice that it gave the transfer up (final=false), not its terminal answer"""
    NOTICE_ONE_SIDED = "notice_one_sided"
    """a notice, and the data plane is one-sided: writes the producer already posted may still land"""
    REVOKE_UNBOUNDED = "revoke_unbounded"
    """the data plane cannot withdraw a producer's access by itself (a NIXL pool that is not shared memory): only its report of a proof ends revoking"""
    LANDING = "landing"
    """a landing this load started has not answered yet (a block is unchecked: its copy or check may still be running)"""
    LAST_LANDING = "last_landing"
    """this answer is the last one the load waits for: no other landing of it is unchecked"""
    LAST_LANDING_FINISHED = "last_landing_finished"
    """the last landing's answer, and the engine finished the request meanwhile"""


class ConsumerEffect(enum.StrEnum):
    ACCEPT_LOAD = "accept_load"
    """take the load job: its keys, destination slots and a fresh round number"""
    SEND_FETCH = "send_fetch"
    """send fetch(kv_request_id, round, keys, slots) to the producer"""
    LAND_BLOCKS = "land_blocks"
    """ask the shell to land the blocks first..first+count-1 in their slots (zmq: copy the payload frames; one-sided planes: already written) and check their digests, and mark them landing (a second block_data naming one of them is not valid); it answers blocks_landed, at once or, for a landing on the digest pool, in a later step"""
    NOTE_CHECKED = "note_checked"
    """record the landing's answer: each block of the batch verified (it matched its digest) or, for a corrupt answer, the whole batch failed; a failed load reports as successful keys only the verified prefix of its fetch (decision I21)"""
    REPORT_LOAD_OK = "report_load_ok"
    """report the load job as succeeded (slots hold the parked bytes)"""
    SEND_RECEIPT = "send_receipt"
    """send receipt(kv_request_id, round) so the producer may report its store jobs succeeded"""
    FAIL_JOB = "fail_job"
    """report the live load job as failed with the reason (no write can land in its slots any more)"""
    FAIL_NEW_JOB = "fail_new_job"
    """report the NEW load job as failed with the reason; the live one is untouched"""
    REPORT_NEW_JOB_OK = "report_new_job_ok"
    """report the NEW (empty) load job as succeeded"""
    SEND_ABORT = "send_abort"
    """send abort_fetch(kv_request_id, round, fetched) to the producer (a fresh round and fetched=false if nothing was fetched: the producer may release the id at once)"""
    GIVE_UP_PEER = "give_up_peer"
    """end the session to the producer (abort_unacknowledged): every record bound to it is told peer_lost"""
    REVOKE_ACCESS = "revoke_access"
    """ask the data plane to make sure the producer can no longer write into this load's slots; it answers access_revoked"""
    NOTE_FINISHED = "note_finished"
    """remember that the engine finished the request"""
    NOTE_STALE = "note_stale"
    """count a message for an old round; nothing else"""
    NOTE_NOTICE = "note_notice"
    """remember the reason the producer's notice gives"""
    RECALL_NOTICE = "recall_notice"
    """the job will report the reason the producer's notice gave, not the session's (the notice came first and says why)"""
    NOTE_HELD = "note_held"
    """say that the load's slots are still held, why, and until what (an operator line per revoke_timeout_s)"""
    REDIAL = "redial"
    """dial the producer again if no session to it is open (at most once for a load the producer refused for now): a handshake it accepts proves that none of its earlier WRITEs into our slots is still running, or lets a load refused for now fetch (decision N25)"""
    RESTART_TIMER = "restart_timer"
    """restart the current state's timer from now"""
    DIAL = "dial"
    """dial the producer if no session to it is open: a load submitted after its request's session ended dials afresh, as a first load does (a closed connection, a reset or silence proves nothing, decision I30)"""


CONSUMER_INITIAL: Final = ConsumerState.ABSENT
CONSUMER_FINAL: Final = frozenset({ConsumerState.FINISHED})
CONSUMER_TIMERS: Final = MappingProxyType({
    "load": TimerSpec("load", ConsumerEvent.LOAD_DEADLINE, "load_timeout_s"),
    "abort_ack": TimerSpec("abort_ack", ConsumerEvent.ABORT_ACK_DEADLINE, "abort_ack_timeout_s"),
    "revoke": TimerSpec("revoke", ConsumerEvent.REVOKE_DEADLINE, "revoke_timeout_s"),
})
"""Timer name -> (event it fires, config key that sets its duration in seconds)."""
CONSUMER_STATE_TIMER: Final = MappingProxyType({
    ConsumerState.ABSENT: None,
    ConsumerState.ANNOUNCED: None,
    ConsumerState.QUEUED: 'load',
    ConsumerState.IN_FLIGHT: 'load',
    ConsumerState.ABORTING: 'abort_ack',
    ConsumerState.CANCELLING: 'abort_ack',
    ConsumerState.GIVEN_UP: 'abort_ack',
    ConsumerState.REVOKING: 'revoke',
    ConsumerState.SETTLING: None,
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
    (ConsumerState.ABSENT, ConsumerEvent.BLOCKS_LANDED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.PEER_LOST): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ABSENT, ConsumerEvent.CLOSE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ConsumerState.ANNOUNCED, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ConsumerGuard.EMPTY_ON_READY_SESSION, ConsumerState.LOADED, (ConsumerEffect.ACCEPT_LOAD, ConsumerEffect.SEND_FETCH, ConsumerEffect.REPORT_LOAD_OK, ), None),
        Branch(ConsumerGuard.INSTANCE_DOWN, ConsumerState.FAILED, (ConsumerEffect.ACCEPT_LOAD, ConsumerEffect.FAIL_JOB, ), Reason.INSTANCE_DOWN),
        Branch(ConsumerGuard.SESSION_READY, ConsumerState.IN_FLIGHT, (ConsumerEffect.ACCEPT_LOAD, ConsumerEffect.SEND_FETCH, ), None),
        Branch(None, ConsumerState.QUEUED, (ConsumerEffect.ACCEPT_LOAD, ConsumerEffect.DIAL, ), None),
    ), None),
    (ConsumerState.ANNOUNCED, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.BLOCKS_LANDED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ANNOUNCED, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.SEND_ABORT, ), Reason.CANCELLED),
    ), None),
    (ConsumerState.ANNOUNCED, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(ConsumerGuard.REFUSED_FOR_NOW, ConsumerState.ANNOUNCED, (ConsumerEffect.REDIAL, ), None),
        Branch(ConsumerGuard.DIAL_FAILED, ConsumerState.FAILED, (), None),
        Branch(None, ConsumerState.ANNOUNCED, (), None),
    ), None),
    (ConsumerState.ANNOUNCED, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.ANNOUNCED, ConsumerEvent.CLOSE): Rule(TRANSITION, (
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
    (ConsumerState.QUEUED, ConsumerEvent.BLOCKS_LANDED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.LOAD_DEADLINE): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), Reason.LOAD_TIMEOUT),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.QUEUED, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ConsumerEffect.SEND_ABORT, ), Reason.CANCELLED),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(ConsumerGuard.REFUSED_FOR_NOW, ConsumerState.QUEUED, (ConsumerEffect.REDIAL, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), Reason.SHUTDOWN),
    ), None),
    (ConsumerState.QUEUED, ConsumerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), Reason.SHUTDOWN),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.IN_FLIGHT, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.BLOCK_DATA): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.IN_FLIGHT, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.BLOCKS_VALID, ConsumerState.IN_FLIGHT, (ConsumerEffect.LAND_BLOCKS, ), None),
        Branch(None, ConsumerState.IN_FLIGHT, (ConsumerEffect.NOTE_STALE, ), Reason.INCOMPLETE_DATA),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.BLOCKS_LANDED): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.IN_FLIGHT, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.CORRUPT, ConsumerState.ABORTING, (ConsumerEffect.NOTE_CHECKED, ConsumerEffect.SEND_ABORT, ), Reason.CORRUPT),
        Branch(ConsumerGuard.COMPLETES, ConsumerState.LOADED, (ConsumerEffect.NOTE_CHECKED, ConsumerEffect.REPORT_LOAD_OK, ConsumerEffect.SEND_RECEIPT, ), None),
        Branch(None, ConsumerState.IN_FLIGHT, (ConsumerEffect.NOTE_CHECKED, ), None),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.IN_FLIGHT, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.NOTICE_ONE_SIDED, ConsumerState.GIVEN_UP, (ConsumerEffect.NOTE_NOTICE, ), None),
        Branch(ConsumerGuard.FAILED_WHILE_LANDING, ConsumerState.SETTLING, (), None),
        Branch(ConsumerGuard.NEEDS_NOTHING, ConsumerState.LOADED, (ConsumerEffect.REPORT_LOAD_OK, ), None),
        Branch(ConsumerGuard.DONE_FAIL, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
        Branch(ConsumerGuard.ALL_RECEIVED, ConsumerState.LOADED, (ConsumerEffect.REPORT_LOAD_OK, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), Reason.INCOMPLETE_DATA),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), Reason.INCOMPLETE_DATA),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.LOAD_DEADLINE): Rule(TRANSITION, (
        Branch(None, ConsumerState.ABORTING, (ConsumerEffect.SEND_ABORT, ), Reason.LOAD_TIMEOUT),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.CANCELLING, (ConsumerEffect.SEND_ABORT, ), Reason.CANCELLED),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.REVOKE_ACCESS, ), None),
    ), None),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (ConsumerState.IN_FLIGHT, ConsumerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.SEND_ABORT, ConsumerEffect.REVOKE_ACCESS, ), Reason.SHUTDOWN),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ABORTING, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.ABORTING, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ABORTING, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.LATE_DATA),
    (ConsumerState.ABORTING, ConsumerEvent.BLOCKS_LANDED): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.ABORTING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(None, ConsumerState.ABORTING, (ConsumerEffect.NOTE_CHECKED, ), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.ABORTING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.NOTICE, ConsumerState.ABORTING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.ABORT_ACK): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.ABORTING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ABORTING, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ABORTING, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.ABORTING, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(TRANSITION, (
        Branch(ConsumerGuard.PRODUCER_SENDING, ConsumerState.ABORTING, (ConsumerEffect.RESTART_TIMER, ), None),
        Branch(ConsumerGuard.PRODUCER_BUSY, ConsumerState.REVOKING, (ConsumerEffect.REVOKE_ACCESS, ), None),
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.REVOKE_ACCESS, ConsumerEffect.GIVE_UP_PEER, ), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.CANCELLING, (), None),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(ConsumerGuard.ABORTED_CORRUPT, ConsumerState.REVOKING, (ConsumerEffect.REVOKE_ACCESS, ), Reason.CORRUPT),
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.REVOKE_ACCESS, ), Reason.LOAD_TIMEOUT),
    ), None),
    (ConsumerState.ABORTING, ConsumerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (ConsumerState.ABORTING, ConsumerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.REVOKE_ACCESS, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.CANCELLING, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.LATE_DATA),
    (ConsumerState.CANCELLING, ConsumerEvent.BLOCKS_LANDED): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.CANCELLING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(None, ConsumerState.CANCELLING, (ConsumerEffect.NOTE_CHECKED, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.CANCELLING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.NOTICE, ConsumerState.CANCELLING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (ConsumerEffect.NOTE_FINISHED, ), None),
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.ABORT_ACK): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.CANCELLING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (ConsumerEffect.NOTE_FINISHED, ), None),
        Branch(None, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(TRANSITION, (
        Branch(ConsumerGuard.PRODUCER_SENDING, ConsumerState.CANCELLING, (ConsumerEffect.RESTART_TIMER, ), None),
        Branch(ConsumerGuard.PRODUCER_BUSY, ConsumerState.REVOKING, (ConsumerEffect.NOTE_FINISHED, ConsumerEffect.REVOKE_ACCESS, ), None),
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.NOTE_FINISHED, ConsumerEffect.REVOKE_ACCESS, ConsumerEffect.GIVE_UP_PEER, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.CANCELLING, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.NOTE_FINISHED, ConsumerEffect.REVOKE_ACCESS, ), None),
    ), None),
    (ConsumerState.CANCELLING, ConsumerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (ConsumerState.CANCELLING, ConsumerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.NOTE_FINISHED, ConsumerEffect.REVOKE_ACCESS, ), None),
    ), None),
    (ConsumerState.GIVEN_UP, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.GIVEN_UP, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.GIVEN_UP, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.GIVEN_UP, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.GIVEN_UP, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.LATE_DATA),
    (ConsumerState.GIVEN_UP, ConsumerEvent.BLOCKS_LANDED): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.GIVEN_UP, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(None, ConsumerState.GIVEN_UP, (ConsumerEffect.NOTE_CHECKED, ), None),
    ), None),
    (ConsumerState.GIVEN_UP, ConsumerEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.GIVEN_UP, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.NOTICE, ConsumerState.GIVEN_UP, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), None),
        Branch(ConsumerGuard.ENGINE_FINISHED, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.GIVEN_UP, ConsumerEvent.ABORT_ACK): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.GIVEN_UP, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), None),
        Branch(ConsumerGuard.ENGINE_FINISHED, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.GIVEN_UP, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.GIVEN_UP, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.GIVEN_UP, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.GIVEN_UP, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(TRANSITION, (
        Branch(ConsumerGuard.PRODUCER_SENDING, ConsumerState.GIVEN_UP, (ConsumerEffect.RESTART_TIMER, ), None),
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.REVOKE_ACCESS, ConsumerEffect.GIVE_UP_PEER, ), None),
    ), None),
    (ConsumerState.GIVEN_UP, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.GIVEN_UP, (ConsumerEffect.NOTE_FINISHED, ), None),
    ), None),
    (ConsumerState.GIVEN_UP, ConsumerEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.RECALL_NOTICE, ConsumerEffect.REVOKE_ACCESS, ), None),
    ), None),
    (ConsumerState.GIVEN_UP, ConsumerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (ConsumerState.GIVEN_UP, ConsumerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.REVOKE_ACCESS, ), None),
    ), None),
    (ConsumerState.REVOKING, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.REVOKING, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.REVOKING, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.REVOKING, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.LATE_DATA),
    (ConsumerState.REVOKING, ConsumerEvent.BLOCKS_LANDED): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.REVOKING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.NOTE_CHECKED, ), None),
    ), None),
    (ConsumerState.REVOKING, ConsumerEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.REVOKING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.NOTICE, ConsumerState.REVOKING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), None),
        Branch(ConsumerGuard.ENGINE_FINISHED, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.REVOKING, ConsumerEvent.ABORT_ACK): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.REVOKING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), None),
        Branch(ConsumerGuard.ENGINE_FINISHED, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.REVOKING, ConsumerEvent.ACCESS_REVOKED): Rule(TRANSITION, (
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), None),
        Branch(ConsumerGuard.ENGINE_FINISHED, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.REVOKING, ConsumerEvent.REVOKE_DEADLINE): Rule(TRANSITION, (
        Branch(ConsumerGuard.REVOKE_UNBOUNDED, ConsumerState.REVOKING, (ConsumerEffect.NOTE_HELD, ConsumerEffect.REDIAL, ConsumerEffect.RESTART_TIMER, ), None),
        Branch(ConsumerGuard.LANDING, ConsumerState.SETTLING, (), None),
        Branch(ConsumerGuard.ENGINE_FINISHED, ConsumerState.FINISHED, (ConsumerEffect.FAIL_JOB, ), None),
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB, ), None),
    ), None),
    (ConsumerState.REVOKING, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.REVOKING, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.REVOKING, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.REVOKING, (ConsumerEffect.NOTE_FINISHED, ), None),
    ), None),
    (ConsumerState.REVOKING, ConsumerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.REVOKING, ConsumerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.REFERENCED),
    (ConsumerState.REVOKING, ConsumerEvent.CLOSE): Rule(IGNORE, (), Reason.REFERENCED),
    (ConsumerState.SETTLING, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.SETTLING, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.DUPLICATE_LOAD),
    ), None),
    (ConsumerState.SETTLING, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.LATE_DATA),
    (ConsumerState.SETTLING, ConsumerEvent.BLOCKS_LANDED): Rule(TRANSITION, (
        Branch(ConsumerGuard.OTHER_ROUND, ConsumerState.SETTLING, (ConsumerEffect.NOTE_STALE, ), None),
        Branch(ConsumerGuard.LAST_LANDING_FINISHED, ConsumerState.FINISHED, (ConsumerEffect.NOTE_CHECKED, ConsumerEffect.FAIL_JOB, ), None),
        Branch(ConsumerGuard.LAST_LANDING, ConsumerState.FAILED, (ConsumerEffect.NOTE_CHECKED, ConsumerEffect.FAIL_JOB, ), None),
        Branch(None, ConsumerState.SETTLING, (ConsumerEffect.NOTE_CHECKED, ), None),
    ), None),
    (ConsumerState.SETTLING, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.SETTLING, (ConsumerEffect.NOTE_FINISHED, ), None),
    ), None),
    (ConsumerState.SETTLING, ConsumerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.SETTLING, ConsumerEvent.SHUTDOWN): Rule(IGNORE, (), Reason.REFERENCED),
    (ConsumerState.SETTLING, ConsumerEvent.CLOSE): Rule(IGNORE, (), Reason.REFERENCED),
    (ConsumerState.LOADED, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ConsumerGuard.LOAD_EMPTY, ConsumerState.LOADED, (ConsumerEffect.REPORT_NEW_JOB_OK, ), None),
        Branch(None, ConsumerState.LOADED, (ConsumerEffect.FAIL_NEW_JOB, ), Reason.ONE_FETCH_PER_ID),
    ), None),
    (ConsumerState.LOADED, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.BLOCKS_LANDED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.LOADED, ConsumerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.LOADED, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.LOADED, ConsumerEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.FAILED, ConsumerEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_NEW_JOB, ), None),
    ), None),
    (ConsumerState.FAILED, ConsumerEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.BLOCK_DATA): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.BLOCKS_LANDED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.ABORT_ACK): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.ACCESS_REVOKED): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.REVOKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.LOAD_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.ABORT_ACK_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.FAILED, ConsumerEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ConsumerState.FAILED, ConsumerEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ConsumerState.FINISHED, (), None),
    ), None),
    (ConsumerState.FAILED, ConsumerEvent.CLOSE): Rule(TRANSITION, (
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
    ATTACHING = "attaching"
    """The handshake's fields match (their hello, or their hello_ack to ours); the data plane is taking the peer's descriptor. Nothing but the plane's answer moves it."""
    READY = "ready"
    """Handshake done and the data plane holds the peer's descriptor. Every message notes when the peer was last heard; the heartbeat timer pings (dialled side) and ends a session silent for peer_timeout_s."""
    DEAD = "dead"
    """Session over (final); everything bound to it was told peer_lost. A reconnect is a new generation."""


class SessionEvent(enum.StrEnum):
    DIAL = "dial"
    """a consumer needs this producer and no session exists"""
    TRANSPORT_UP = "transport_up"
    """the transport has a connection object for the peer (zmq connects asynchronously), and the data plane the descriptor this session's hello carries"""
    CONNECT_FAILED = "connect_failed"
    """the dial never connected: the address refused it, is unreachable, or did not answer within connect_timeout_s (or this manager cannot dial it), or the connection's CURVE handshake failed"""
    HELLO = "hello"
    """the peer's hello arrived (version, block layout, hash seed, data plane, generation)"""
    HELLO_ACK = "hello_ack"
    """the peer accepted our hello"""
    HELLO_REJECT = "hello_reject"
    """the peer rejected our hello (names the field that differs, or too_many_peers)"""
    PLANE_ATTACHED = "plane_attached"
    """the data plane took the peer's descriptor"""
    PLANE_REFUSED = "plane_refused"
    """the data plane refused the peer's descriptor (malformed, for another pool, or its agent still in use)"""
    MESSAGE = "message"
    """a valid work message from the peer (fetch, block_data, receipt, transfer_done, abort_ack, error)"""
    RELEASE = "release"
    """the peer's abort_fetch or a fetch naming no keys: it only asks us to release what we hold for an id, which needs no data plane (so it is answered in attaching too)"""
    PLANE_FAULT = "plane_fault"
    """the data plane reports the path to the peer broken (NIXL: a remote disconnect): transfers to it fail until the peer is added anew"""
    PING = "ping"
    """the peer's ping arrived"""
    PONG = "pong"
    """the peer's pong (the answer to our ping) arrived"""
    DISCONNECT = "disconnect"
    """the peer said disconnect, or answered that it does not know our session"""
    CONNECTION_CLOSED = "connection_closed"
    """the transport saw the peer's TCP connection close or reset (socket monitor)"""
    SEND_FAILED = "send_failed"
    """the transport could not send to the peer"""
    GIVE_UP = "give_up"
    """a record bound to this peer gave up on it (a transfer the data plane did not release, an abort the producer did not answer), or an idle inbound session is evicted to admit a new peer at max_peers"""
    HANDSHAKE_DEADLINE = "handshake_deadline"
    """timer handshake fired"""
    HEARTBEAT_DEADLINE = "heartbeat_deadline"
    """timer heartbeat fired"""
    SHUTDOWN = "shutdown"
    """shutdown() began: sessions stay up to carry work in flight and the goodbyes"""
    CLOSE = "close"
    """the shutdown grace is over: every session ends"""


class SessionGuard(enum.StrEnum):
    HELLO_COMPATIBLE = "hello_compatible"
    """the peer's protocol version, block size, layout fingerprint, hash seed and data plane equal ours"""
    TOO_MANY_PEERS = "too_many_peers"
    """this manager already has max_peers sessions (config max_peers)"""
    SAME_GEN = "same_gen"
    """the hello carries the generation this session already serves (a duplicate)"""
    CAPACITY_REFUSAL = "capacity_refusal"
    """the peer refused our hello because it already has max_peers sessions"""
    IS_SELF = "is_self"
    """the refusal names ourselves: the peer's descriptor names our own data-plane agent (plane_refused: we dialled our own address), or its hello_reject says self_fetch"""
    STILL_HELD = "still_held"
    """the refusal is for now: the peer's plane still holds an earlier session of ours (its hello_reject says session_still_held), or ours still holds an earlier session of the peer's agent (plane_refused)"""
    PEER_SHUTTING_DOWN = "peer_shutting_down"
    """the peer's disconnect says it is shutting down (its goodbye)"""
    PEER_GAVE_REASON = "peer_gave_reason"
    """the peer's disconnect names why it ended the session (transfer_stalled, abort_unacknowledged, peer_timeout, idle_evicted, peer_restarted, plane_fault): the session ends with that reason"""
    DIALLED = "dialled"
    """we dialled this peer (we are its consumer; it answers our pings)"""
    SILENT = "silent"
    """nothing had been heard from the peer for peer_timeout_s when this heartbeat fell due: one that fires late because this side stalled judges the peer at its due time, so the silence our stall made (answers still unread, pings never sent) is not counted against it"""
    CONNECT_TIMED_OUT = "connect_timed_out"
    """the dial got no answer within connect_timeout_s (rather than a refusal)"""
    CONNECT_NOT_ALLOWED = "connect_not_allowed"
    """the producer's name resolved to an address allowed_peers '*' does not admit (nothing was dialled)"""
    CONNECT_UNRESOLVED = "connect_unresolved"
    """the producer's host name did not resolve (nothing was dialled)"""
    CONNECT_AUTH_FAILED = "connect_auth_failed"
    """the connection's CURVE handshake failed (a key the other side does not accept, or only one side runs auth='curve'), or no certificate in our auth_allowed_keys_dir names the endpoint (not dialled)"""


class SessionEffect(enum.StrEnum):
    OPEN_CONNECTION = "open_connection"
    """open a transport connection to the peer; the session starts with the instance the peer's address last answered for (a refused dial proves that instance gone)"""
    SEND_HELLO = "send_hello"
    """send our hello (with the data plane's descriptor for this session, and the generation of our previous session to this address, which it replaces)"""
    NOTE_PEER = "note_peer"
    """remember the peer's generation, instance and principal from its hello"""
    NOTE_INSTANCE = "note_instance"
    """remember the instance the peer's hello_ack names (sessions to one instance share fate)"""
    ATTACH_PEER = "attach_peer"
    """hand the peer's descriptor to the data plane (accepted: it came with the peer's hello_ack to our hello); the plane answers plane_attached or plane_refused"""
    SEND_HELLO_ACK = "send_hello_ack"
    """send hello_ack (with our data plane's descriptor)"""
    SEND_HELLO_REJECT = "send_hello_reject"
    """send hello_reject naming the first mismatching field (never the value of a secret field)"""
    FLUSH_QUEUED = "flush_queued"
    """tell every queued load on this peer that the session is ready"""
    REPLY_UNKNOWN_SESSION = "reply_unknown_session"
    """answer disconnect(reason=peer_disconnected): we have no session with this peer"""
    NOTE_HEARD = "note_heard"
    """remember that the peer was heard now"""
    NOTE_ACTIVE = "note_active"
    """remember that the peer did work now (idle eviction at max_peers spares it)"""
    SEND_PING = "send_ping"
    """send ping"""
    SEND_PONG = "send_pong"
    """answer the peer's ping with pong"""
    SEND_DISCONNECT = "send_disconnect"
    """send disconnect"""
    CLOSE_CONNECTION = "close_connection"
    """close the transport connection to the peer (a dialled socket is closed; an inbound connection is shut down), so nothing stays queued to it"""
    CLOSE_AFTER_GOODBYE = "close_after_goodbye"
    """close the transport connection to the peer once the goodbye just sent (and what is queued before it) had up to shutdown_grace_s to leave; nothing more is sent to it meanwhile, so a peer still reading learns why (decision I28)"""
    PEER_DOWN = "peer_down"
    """tell every producer and consumer record bound to this peer: peer_lost; the data plane forgets the peer"""
    RESTART_TIMER = "restart_timer"
    """restart the current state's timer from now"""


SESSION_INITIAL: Final = SessionState.ABSENT
SESSION_FINAL: Final = frozenset({SessionState.DEAD})
SESSION_TIMERS: Final = MappingProxyType({
    "handshake": TimerSpec("handshake", SessionEvent.HANDSHAKE_DEADLINE, "handshake_timeout_s"),
    "heartbeat": TimerSpec("heartbeat", SessionEvent.HEARTBEAT_DEADLINE, "heartbeat_interval_s"),
})
"""Timer name -> (event it fires, config key that sets its duration in seconds)."""
SESSION_STATE_TIMER: Final = MappingProxyType({
    SessionState.ABSENT: None,
    SessionState.CONNECTING: 'handshake',
    SessionState.HANDSHAKING: 'handshake',
    SessionState.ATTACHING: 'handshake',
    SessionState.READY: 'heartbeat',
    SessionState.DEAD: None,
})
"""State -> name of the timer armed while in it (None: no timer)."""
SESSION_TABLE: Final = MappingProxyType({
    (SessionState.ABSENT, SessionEvent.DIAL): Rule(TRANSITION, (
        Branch(SessionGuard.TOO_MANY_PEERS, SessionState.DEAD, (SessionEffect.PEER_DOWN, ), Reason.TOO_MANY_PEERS),
        Branch(None, SessionState.CONNECTING, (SessionEffect.OPEN_CONNECTION, ), None),
    ), None),
    (SessionState.ABSENT, SessionEvent.TRANSPORT_UP): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.CONNECT_FAILED): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.HELLO): Rule(TRANSITION, (
        Branch(SessionGuard.TOO_MANY_PEERS, SessionState.DEAD, (SessionEffect.SEND_HELLO_REJECT, ), Reason.TOO_MANY_PEERS),
        Branch(SessionGuard.HELLO_COMPATIBLE, SessionState.ATTACHING, (SessionEffect.NOTE_PEER, SessionEffect.ATTACH_PEER, ), None),
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_HELLO_REJECT, ), Reason.HANDSHAKE_MISMATCH),
    ), None),
    (SessionState.ABSENT, SessionEvent.HELLO_ACK): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.HELLO_REJECT): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.PLANE_ATTACHED): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.PLANE_REFUSED): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.MESSAGE): Rule(TRANSITION, (
        Branch(None, SessionState.ABSENT, (SessionEffect.REPLY_UNKNOWN_SESSION, ), None),
    ), None),
    (SessionState.ABSENT, SessionEvent.RELEASE): Rule(TRANSITION, (
        Branch(None, SessionState.ABSENT, (SessionEffect.REPLY_UNKNOWN_SESSION, ), None),
    ), None),
    (SessionState.ABSENT, SessionEvent.PLANE_FAULT): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.PING): Rule(TRANSITION, (
        Branch(None, SessionState.ABSENT, (SessionEffect.REPLY_UNKNOWN_SESSION, ), None),
    ), None),
    (SessionState.ABSENT, SessionEvent.PONG): Rule(TRANSITION, (
        Branch(None, SessionState.ABSENT, (SessionEffect.REPLY_UNKNOWN_SESSION, ), None),
    ), None),
    (SessionState.ABSENT, SessionEvent.DISCONNECT): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.CONNECTION_CLOSED): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.SEND_FAILED): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.GIVE_UP): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.HANDSHAKE_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.HEARTBEAT_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.SHUTDOWN): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.ABSENT, SessionEvent.CLOSE): Rule(IGNORE, (), Reason.NO_RECORD),
    (SessionState.CONNECTING, SessionEvent.DIAL): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.TRANSPORT_UP): Rule(TRANSITION, (
        Branch(None, SessionState.HANDSHAKING, (SessionEffect.SEND_HELLO, ), None),
    ), None),
    (SessionState.CONNECTING, SessionEvent.CONNECT_FAILED): Rule(TRANSITION, (
        Branch(SessionGuard.CONNECT_NOT_ALLOWED, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_NOT_ALLOWED),
        Branch(SessionGuard.CONNECT_AUTH_FAILED, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.AUTH_FAILED),
        Branch(SessionGuard.CONNECT_TIMED_OUT, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.CONNECT_TIMEOUT),
        Branch(SessionGuard.CONNECT_UNRESOLVED, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.UNRESOLVED_HOST),
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.CONNECT_REFUSED),
    ), None),
    (SessionState.CONNECTING, SessionEvent.HELLO): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.HELLO_ACK): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.HELLO_REJECT): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.PLANE_ATTACHED): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.PLANE_REFUSED): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.MESSAGE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.RELEASE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.PLANE_FAULT): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.PING): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.PONG): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.DISCONNECT): Rule(TRANSITION, (
        Branch(SessionGuard.PEER_SHUTTING_DOWN, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
        Branch(SessionGuard.PEER_GAVE_REASON, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), None),
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.CONNECTING, SessionEvent.CONNECTION_CLOSED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.CONNECTING, SessionEvent.SEND_FAILED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SEND_FAILED),
    ), None),
    (SessionState.CONNECTING, SessionEvent.GIVE_UP): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_AFTER_GOODBYE, SessionEffect.PEER_DOWN, ), None),
    ), None),
    (SessionState.CONNECTING, SessionEvent.HANDSHAKE_DEADLINE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_TIMEOUT),
    ), None),
    (SessionState.CONNECTING, SessionEvent.HEARTBEAT_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.CONNECTING, SessionEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (SessionState.CONNECTING, SessionEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.DIAL): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.TRANSPORT_UP): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.CONNECT_FAILED): Rule(TRANSITION, (
        Branch(SessionGuard.CONNECT_NOT_ALLOWED, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_NOT_ALLOWED),
        Branch(SessionGuard.CONNECT_AUTH_FAILED, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.AUTH_FAILED),
        Branch(SessionGuard.CONNECT_TIMED_OUT, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.CONNECT_TIMEOUT),
        Branch(SessionGuard.CONNECT_UNRESOLVED, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.UNRESOLVED_HOST),
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.CONNECT_REFUSED),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.HELLO): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.HELLO_ACK): Rule(TRANSITION, (
        Branch(None, SessionState.ATTACHING, (SessionEffect.NOTE_INSTANCE, SessionEffect.ATTACH_PEER, ), None),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.HELLO_REJECT): Rule(TRANSITION, (
        Branch(SessionGuard.CAPACITY_REFUSAL, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.TOO_MANY_PEERS),
        Branch(SessionGuard.STILL_HELD, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SESSION_STILL_HELD),
        Branch(SessionGuard.IS_SELF, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SELF_FETCH),
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_MISMATCH),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.PLANE_ATTACHED): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.PLANE_REFUSED): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.MESSAGE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.RELEASE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.PLANE_FAULT): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.PING): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.PONG): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.DISCONNECT): Rule(TRANSITION, (
        Branch(SessionGuard.PEER_SHUTTING_DOWN, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
        Branch(SessionGuard.PEER_GAVE_REASON, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), None),
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.CONNECTION_CLOSED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.SEND_FAILED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SEND_FAILED),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.GIVE_UP): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_AFTER_GOODBYE, SessionEffect.PEER_DOWN, ), None),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.HANDSHAKE_DEADLINE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_TIMEOUT),
    ), None),
    (SessionState.HANDSHAKING, SessionEvent.HEARTBEAT_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.HANDSHAKING, SessionEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (SessionState.HANDSHAKING, SessionEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
    ), None),
    (SessionState.ATTACHING, SessionEvent.DIAL): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.TRANSPORT_UP): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.CONNECT_FAILED): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.HELLO): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.HELLO_ACK): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.HELLO_REJECT): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.PLANE_ATTACHED): Rule(TRANSITION, (
        Branch(SessionGuard.DIALLED, SessionState.READY, (SessionEffect.NOTE_HEARD, SessionEffect.FLUSH_QUEUED, ), None),
        Branch(None, SessionState.READY, (SessionEffect.NOTE_HEARD, SessionEffect.NOTE_ACTIVE, SessionEffect.SEND_HELLO_ACK, ), None),
    ), None),
    (SessionState.ATTACHING, SessionEvent.PLANE_REFUSED): Rule(TRANSITION, (
        Branch(SessionGuard.DIALLED, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_MISMATCH),
        Branch(SessionGuard.STILL_HELD, SessionState.DEAD, (SessionEffect.SEND_HELLO_REJECT, SessionEffect.PEER_DOWN, ), Reason.SESSION_STILL_HELD),
        Branch(SessionGuard.IS_SELF, SessionState.DEAD, (SessionEffect.SEND_HELLO_REJECT, SessionEffect.PEER_DOWN, ), Reason.SELF_FETCH),
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_HELLO_REJECT, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_MISMATCH),
    ), None),
    (SessionState.ATTACHING, SessionEvent.MESSAGE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.RELEASE): Rule(TRANSITION, (
        Branch(None, SessionState.ATTACHING, (SessionEffect.NOTE_HEARD, SessionEffect.NOTE_ACTIVE, ), None),
    ), None),
    (SessionState.ATTACHING, SessionEvent.PLANE_FAULT): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_AFTER_GOODBYE, SessionEffect.PEER_DOWN, ), Reason.PLANE_FAULT),
    ), None),
    (SessionState.ATTACHING, SessionEvent.PING): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.PONG): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.DISCONNECT): Rule(TRANSITION, (
        Branch(SessionGuard.PEER_SHUTTING_DOWN, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
        Branch(SessionGuard.PEER_GAVE_REASON, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), None),
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.ATTACHING, SessionEvent.CONNECTION_CLOSED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.ATTACHING, SessionEvent.SEND_FAILED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SEND_FAILED),
    ), None),
    (SessionState.ATTACHING, SessionEvent.GIVE_UP): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_AFTER_GOODBYE, SessionEffect.PEER_DOWN, ), None),
    ), None),
    (SessionState.ATTACHING, SessionEvent.HANDSHAKE_DEADLINE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.HANDSHAKE_TIMEOUT),
    ), None),
    (SessionState.ATTACHING, SessionEvent.HEARTBEAT_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.ATTACHING, SessionEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (SessionState.ATTACHING, SessionEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
    ), None),
    (SessionState.READY, SessionEvent.DIAL): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.TRANSPORT_UP): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.CONNECT_FAILED): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.HELLO): Rule(TRANSITION, (
        Branch(SessionGuard.SAME_GEN, SessionState.READY, (SessionEffect.SEND_HELLO_ACK, ), None),
        Branch(None, SessionState.DEAD, (SessionEffect.PEER_DOWN, ), Reason.PEER_RESTARTED),
    ), None),
    (SessionState.READY, SessionEvent.HELLO_ACK): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.HELLO_REJECT): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.PLANE_ATTACHED): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.PLANE_REFUSED): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.MESSAGE): Rule(TRANSITION, (
        Branch(None, SessionState.READY, (SessionEffect.NOTE_HEARD, SessionEffect.NOTE_ACTIVE, ), None),
    ), None),
    (SessionState.READY, SessionEvent.RELEASE): Rule(TRANSITION, (
        Branch(None, SessionState.READY, (SessionEffect.NOTE_HEARD, SessionEffect.NOTE_ACTIVE, ), None),
    ), None),
    (SessionState.READY, SessionEvent.PLANE_FAULT): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_AFTER_GOODBYE, SessionEffect.PEER_DOWN, ), Reason.PLANE_FAULT),
    ), None),
    (SessionState.READY, SessionEvent.PING): Rule(TRANSITION, (
        Branch(None, SessionState.READY, (SessionEffect.NOTE_HEARD, SessionEffect.SEND_PONG, ), None),
    ), None),
    (SessionState.READY, SessionEvent.PONG): Rule(TRANSITION, (
        Branch(None, SessionState.READY, (SessionEffect.NOTE_HEARD, ), None),
    ), None),
    (SessionState.READY, SessionEvent.DISCONNECT): Rule(TRANSITION, (
        Branch(SessionGuard.PEER_SHUTTING_DOWN, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
        Branch(SessionGuard.PEER_GAVE_REASON, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), None),
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.READY, SessionEvent.CONNECTION_CLOSED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_DISCONNECTED),
    ), None),
    (SessionState.READY, SessionEvent.SEND_FAILED): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.SEND_FAILED),
    ), None),
    (SessionState.READY, SessionEvent.GIVE_UP): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_AFTER_GOODBYE, SessionEffect.PEER_DOWN, ), None),
    ), None),
    (SessionState.READY, SessionEvent.HANDSHAKE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (SessionState.READY, SessionEvent.HEARTBEAT_DEADLINE): Rule(TRANSITION, (
        Branch(SessionGuard.SILENT, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.CLOSE_CONNECTION, SessionEffect.PEER_DOWN, ), Reason.PEER_TIMEOUT),
        Branch(SessionGuard.DIALLED, SessionState.READY, (SessionEffect.SEND_PING, SessionEffect.RESTART_TIMER, ), None),
        Branch(None, SessionState.READY, (SessionEffect.RESTART_TIMER, ), None),
    ), None),
    (SessionState.READY, SessionEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (SessionState.READY, SessionEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, SessionState.DEAD, (SessionEffect.SEND_DISCONNECT, SessionEffect.PEER_DOWN, ), Reason.SHUTDOWN),
    ), None),
})


# ------------------------------------------------------------------------------------------
# machine: probe — Consumer side of a symmetric request (remote_kv_source): probing one peer for the blocks of one kv_request_id. A round is the set of keys probed together; the peer pins those its engine holds (HIT) until the round's one fetch (a load, run as a consumer life keyed (kv_request_id, round)) or its release.
# ------------------------------------------------------------------------------------------

class ProbeState(enum.StrEnum):
    ABSENT = "absent"
    """No record."""
    IDLE = "idle"
    """No round is open on the peer. Keys answered MISS answer MISS for the request's life; a lookup of a key without an answer opens a round."""
    COLLECTING = "collecting"
    """Keys looked up since the last probe wait for the end of the engine step (schedule_end) and a ready session; their lookups answer RETRY. Offers already received in the round stay valid."""
    PROBING = "probing"
    """A probe of the open round is out; lookups of its keys answer RETRY."""
    OFFERED = "offered"
    """Every key of the round is answered and the peer pins the HIT ones for us: lookups answer HIT for them and MISS for the others. Waits for the engine's load, a new key or the end of the request (the peer bounds its pins with offer_timeout_s)."""
    FAILED = "failed"
    """Probing failed (deadline, session death, refusal, withdrawal, a suspect instance): every lookup answers MISS, so the engine computes the blocks, until it finishes the request; a load submitted on an earlier HIT fails with the failure's reason."""
    FINISHED = "finished"
    """Record deleted (final)."""


class ProbeEvent(enum.StrEnum):
    ANNOUNCE = "announce"
    """the engine announced a request whose kv_transfer_params carry remote_kv_source (a session to the peer is dialled if none is live)"""
    LOOKUP = "lookup"
    """the engine looked a key up for the request; the answer (RETRY, HIT or MISS) is read from the record after the input"""
    SCHEDULE_END = "schedule_end"
    """the engine step ended (on_schedule_end): keys registered during the step leave in one probe"""
    HANDSHAKE_READY = "handshake_ready"
    """the session to the peer became ready"""
    PROBE_REPLY = "probe_reply"
    """probe_reply(kv_request_id, round, keys, hits) arrived"""
    TRANSFER_DONE = "transfer_done"
    """transfer_done(kv_request_id, round, reason) arrived for a round no load of ours fetched: the peer refused the probe (not_serving, serve_busy, shutdown) or withdrew its offer (offer_expired, drained)"""
    SUBMIT_LOAD = "submit_load"
    """the engine submitted a load job for the request"""
    LOAD_ENDED = "load_ended"
    """the load of one of the request's rounds reported its job (the keys that landed intact come with it)"""
    PROBE_DEADLINE = "probe_deadline"
    """timer probe fired"""
    REQUEST_FINISHED = "request_finished"
    """the engine finished the request"""
    PEER_LOST = "peer_lost"
    """the session to the peer died"""
    SHUTDOWN = "shutdown"
    """shutdown() began"""
    CLOSE = "close"
    """the shutdown grace is over"""


class ProbeGuard(enum.StrEnum):
    INSTANCE_DOWN = "instance_down"
    """the session to the peer is ready but belongs to an instance proven gone (a refused dial, or a restart seen at its address) and none of its sessions has been heard from since (decisions I7, I23); a session still dialling waits for its own outcome (decision I30)"""
    NEW_KEYS = "new_keys"
    """the looked-up key has no answer in this request and is not registered in the open round or loading"""
    SESSION_READY = "session_ready"
    """the session to the peer is ready"""
    OTHER_ROUND = "other_round"
    """the message names a round other than the record's open round"""
    SETTLES_WITH_OFFERS = "settles_with_offers"
    """after this reply no key of the open round waits for an answer, and at least one is offered (HIT)"""
    SETTLES = "settles"
    """after this reply no key of the open round waits for an answer"""
    LOAD_EMPTY = "load_empty"
    """the load job names zero keys"""
    LOAD_OFFERED = "load_offered"
    """every key of the load job was answered HIT in the open round"""
    ROUND_OPEN = "round_open"
    """a probe of the open round was sent, so the peer may hold pins for it"""


class ProbeEffect(enum.StrEnum):
    OPEN_ROUND = "open_round"
    """take a fresh round number (one counter per manager, shared with the consumer's loads)"""
    REGISTER_KEYS = "register_keys"
    """record the looked-up key as unsent in the open round"""
    SEND_PROBE = "send_probe"
    """send probe(kv_request_id, round, unsent keys); they now wait for their answer"""
    NOTE_ANSWERS = "note_answers"
    """record each key the reply answers: HIT (offered: the peer holds a pin for it) or MISS (kept for the request's life)"""
    HAND_TO_LOAD = "hand_to_load"
    """start the round's load: a consumer life keyed (kv_request_id, round) takes the job and sends fetch(offered=true); the round's other offers are forgotten, and keys still unanswered or unsent move to a fresh round"""
    RELEASE_ROUND = "release_round"
    """send abort_fetch(kv_request_id, round, fetched=false, offered=true): the peer releases the round's pins at once"""
    DROP_OFFERS = "drop_offers"
    """forget the open round (the peer released its pins, or will)"""
    NOTE_LOADED = "note_loaded"
    """forget the loaded keys that landed intact; the others answer MISS from now on, so the engine computes them"""
    FAIL_NEW_JOB = "fail_new_job"
    """report the new load job as failed with the reason"""
    NOTE_FAILED = "note_failed"
    """report that the probing failed, with the reason (a counter by reason, the log, the request's record)"""
    REPORT_NEW_JOB_OK = "report_new_job_ok"
    """report the new (empty) load job as succeeded"""
    NOTE_STALE = "note_stale"
    """count a message for another round; nothing else"""
    RESTART_TIMER = "restart_timer"
    """restart the current state's timer from now"""


PROBE_INITIAL: Final = ProbeState.ABSENT
PROBE_FINAL: Final = frozenset({ProbeState.FINISHED})
PROBE_TIMERS: Final = MappingProxyType({
    "probe": TimerSpec("probe", ProbeEvent.PROBE_DEADLINE, "probe_timeout_s"),
})
"""Timer name -> (event it fires, config key that sets its duration in seconds)."""
PROBE_STATE_TIMER: Final = MappingProxyType({
    ProbeState.ABSENT: None,
    ProbeState.IDLE: None,
    ProbeState.COLLECTING: 'probe',
    ProbeState.PROBING: 'probe',
    ProbeState.OFFERED: None,
    ProbeState.FAILED: None,
    ProbeState.FINISHED: None,
})
"""State -> name of the timer armed while in it (None: no timer)."""
PROBE_TABLE: Final = MappingProxyType({
    (ProbeState.ABSENT, ProbeEvent.ANNOUNCE): Rule(TRANSITION, (
        Branch(None, ProbeState.IDLE, (), None),
    ), None),
    (ProbeState.ABSENT, ProbeEvent.LOOKUP): Rule(REJECT, (), Reason.NOT_ANNOUNCED_PROBE),
    (ProbeState.ABSENT, ProbeEvent.SCHEDULE_END): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.PROBE_REPLY): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.SUBMIT_LOAD): Rule(REJECT, (), Reason.NOT_ANNOUNCED_PROBE),
    (ProbeState.ABSENT, ProbeEvent.LOAD_ENDED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.PROBE_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.REQUEST_FINISHED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.PEER_LOST): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.SHUTDOWN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.ABSENT, ProbeEvent.CLOSE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ProbeState.IDLE, ProbeEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.IDLE, ProbeEvent.LOOKUP): Rule(TRANSITION, (
        Branch(ProbeGuard.INSTANCE_DOWN, ProbeState.FAILED, (ProbeEffect.NOTE_FAILED, ), Reason.INSTANCE_DOWN),
        Branch(ProbeGuard.NEW_KEYS, ProbeState.COLLECTING, (ProbeEffect.OPEN_ROUND, ProbeEffect.REGISTER_KEYS, ), None),
        Branch(None, ProbeState.IDLE, (), None),
    ), None),
    (ProbeState.IDLE, ProbeEvent.SCHEDULE_END): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.IDLE, ProbeEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.IDLE, ProbeEvent.PROBE_REPLY): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.IDLE, ProbeEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.IDLE, ProbeEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ProbeGuard.LOAD_EMPTY, ProbeState.IDLE, (ProbeEffect.REPORT_NEW_JOB_OK, ), None),
        Branch(None, ProbeState.IDLE, (ProbeEffect.FAIL_NEW_JOB, ), Reason.NOT_OFFERED),
    ), None),
    (ProbeState.IDLE, ProbeEvent.LOAD_ENDED): Rule(TRANSITION, (
        Branch(None, ProbeState.IDLE, (ProbeEffect.NOTE_LOADED, ), None),
    ), None),
    (ProbeState.IDLE, ProbeEvent.PROBE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.IDLE, ProbeEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.IDLE, ProbeEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProbeState.FAILED, (), None),
    ), None),
    (ProbeState.IDLE, ProbeEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.IDLE, ProbeEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.COLLECTING, ProbeEvent.LOOKUP): Rule(TRANSITION, (
        Branch(ProbeGuard.NEW_KEYS, ProbeState.COLLECTING, (ProbeEffect.REGISTER_KEYS, ), None),
        Branch(None, ProbeState.COLLECTING, (), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.SCHEDULE_END): Rule(TRANSITION, (
        Branch(ProbeGuard.SESSION_READY, ProbeState.PROBING, (ProbeEffect.SEND_PROBE, ), None),
        Branch(None, ProbeState.COLLECTING, (), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.HANDSHAKE_READY): Rule(TRANSITION, (
        Branch(None, ProbeState.PROBING, (ProbeEffect.SEND_PROBE, ), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.PROBE_REPLY): Rule(TRANSITION, (
        Branch(ProbeGuard.OTHER_ROUND, ProbeState.COLLECTING, (ProbeEffect.NOTE_STALE, ), None),
        Branch(None, ProbeState.COLLECTING, (ProbeEffect.NOTE_ANSWERS, ), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ProbeGuard.OTHER_ROUND, ProbeState.COLLECTING, (ProbeEffect.NOTE_STALE, ), None),
        Branch(None, ProbeState.FAILED, (ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ProbeGuard.LOAD_EMPTY, ProbeState.COLLECTING, (ProbeEffect.REPORT_NEW_JOB_OK, ), None),
        Branch(ProbeGuard.LOAD_OFFERED, ProbeState.COLLECTING, (ProbeEffect.HAND_TO_LOAD, ProbeEffect.RESTART_TIMER, ), None),
        Branch(None, ProbeState.COLLECTING, (ProbeEffect.FAIL_NEW_JOB, ), Reason.NOT_OFFERED),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.LOAD_ENDED): Rule(TRANSITION, (
        Branch(None, ProbeState.COLLECTING, (ProbeEffect.NOTE_LOADED, ), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.PROBE_DEADLINE): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FAILED, (ProbeEffect.RELEASE_ROUND, ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), Reason.PROBE_TIMEOUT),
        Branch(None, ProbeState.FAILED, (ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), Reason.PROBE_TIMEOUT),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProbeState.FAILED, (ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.COLLECTING, ProbeEvent.CLOSE): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.PROBING, ProbeEvent.LOOKUP): Rule(TRANSITION, (
        Branch(ProbeGuard.NEW_KEYS, ProbeState.COLLECTING, (ProbeEffect.REGISTER_KEYS, ), None),
        Branch(None, ProbeState.PROBING, (), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.SCHEDULE_END): Rule(TRANSITION, (
        Branch(None, ProbeState.PROBING, (), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.PROBING, ProbeEvent.PROBE_REPLY): Rule(TRANSITION, (
        Branch(ProbeGuard.OTHER_ROUND, ProbeState.PROBING, (ProbeEffect.NOTE_STALE, ), None),
        Branch(ProbeGuard.SETTLES_WITH_OFFERS, ProbeState.OFFERED, (ProbeEffect.NOTE_ANSWERS, ), None),
        Branch(ProbeGuard.SETTLES, ProbeState.IDLE, (ProbeEffect.NOTE_ANSWERS, ), None),
        Branch(None, ProbeState.PROBING, (ProbeEffect.NOTE_ANSWERS, ), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ProbeGuard.OTHER_ROUND, ProbeState.PROBING, (ProbeEffect.NOTE_STALE, ), None),
        Branch(None, ProbeState.FAILED, (ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ProbeGuard.LOAD_EMPTY, ProbeState.PROBING, (ProbeEffect.REPORT_NEW_JOB_OK, ), None),
        Branch(ProbeGuard.LOAD_OFFERED, ProbeState.COLLECTING, (ProbeEffect.HAND_TO_LOAD, ProbeEffect.RESTART_TIMER, ), None),
        Branch(None, ProbeState.PROBING, (ProbeEffect.FAIL_NEW_JOB, ), Reason.NOT_OFFERED),
    ), None),
    (ProbeState.PROBING, ProbeEvent.LOAD_ENDED): Rule(TRANSITION, (
        Branch(None, ProbeState.PROBING, (ProbeEffect.NOTE_LOADED, ), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.PROBE_DEADLINE): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FAILED, (ProbeEffect.RELEASE_ROUND, ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), Reason.PROBE_TIMEOUT),
        Branch(None, ProbeState.FAILED, (ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), Reason.PROBE_TIMEOUT),
    ), None),
    (ProbeState.PROBING, ProbeEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProbeState.FAILED, (ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.PROBING, ProbeEvent.CLOSE): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.OFFERED, ProbeEvent.LOOKUP): Rule(TRANSITION, (
        Branch(ProbeGuard.NEW_KEYS, ProbeState.COLLECTING, (ProbeEffect.REGISTER_KEYS, ), None),
        Branch(None, ProbeState.OFFERED, (), None),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.SCHEDULE_END): Rule(TRANSITION, (
        Branch(None, ProbeState.OFFERED, (), None),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.OFFERED, ProbeEvent.PROBE_REPLY): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.OFFERED, ProbeEvent.TRANSFER_DONE): Rule(TRANSITION, (
        Branch(ProbeGuard.OTHER_ROUND, ProbeState.OFFERED, (ProbeEffect.NOTE_STALE, ), None),
        Branch(None, ProbeState.FAILED, (ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), None),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ProbeGuard.LOAD_EMPTY, ProbeState.OFFERED, (ProbeEffect.REPORT_NEW_JOB_OK, ), None),
        Branch(ProbeGuard.LOAD_OFFERED, ProbeState.IDLE, (ProbeEffect.HAND_TO_LOAD, ), None),
        Branch(None, ProbeState.OFFERED, (ProbeEffect.FAIL_NEW_JOB, ), Reason.NOT_OFFERED),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.LOAD_ENDED): Rule(TRANSITION, (
        Branch(None, ProbeState.OFFERED, (ProbeEffect.NOTE_LOADED, ), None),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.PROBE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.OFFERED, ProbeEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ProbeState.FAILED, (ProbeEffect.DROP_OFFERS, ProbeEffect.NOTE_FAILED, ), None),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.OFFERED, ProbeEvent.CLOSE): Rule(TRANSITION, (
        Branch(ProbeGuard.ROUND_OPEN, ProbeState.FINISHED, (ProbeEffect.RELEASE_ROUND, ), None),
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.FAILED, ProbeEvent.ANNOUNCE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.FAILED, ProbeEvent.LOOKUP): Rule(TRANSITION, (
        Branch(None, ProbeState.FAILED, (), None),
    ), None),
    (ProbeState.FAILED, ProbeEvent.SCHEDULE_END): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.FAILED, ProbeEvent.HANDSHAKE_READY): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.FAILED, ProbeEvent.PROBE_REPLY): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.FAILED, ProbeEvent.TRANSFER_DONE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.FAILED, ProbeEvent.SUBMIT_LOAD): Rule(TRANSITION, (
        Branch(ProbeGuard.LOAD_EMPTY, ProbeState.FAILED, (ProbeEffect.REPORT_NEW_JOB_OK, ), None),
        Branch(None, ProbeState.FAILED, (ProbeEffect.FAIL_NEW_JOB, ), None),
    ), None),
    (ProbeState.FAILED, ProbeEvent.LOAD_ENDED): Rule(TRANSITION, (
        Branch(None, ProbeState.FAILED, (ProbeEffect.NOTE_LOADED, ), None),
    ), None),
    (ProbeState.FAILED, ProbeEvent.PROBE_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.FAILED, ProbeEvent.REQUEST_FINISHED): Rule(TRANSITION, (
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.FAILED, ProbeEvent.PEER_LOST): Rule(IGNORE, (), Reason.STALE),
    (ProbeState.FAILED, ProbeEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
    (ProbeState.FAILED, ProbeEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ProbeState.FINISHED, (), None),
    ), None),
})


# ------------------------------------------------------------------------------------------
# machine: serve — Producer side of one symmetric round: the blocks a peer's probe found in this engine's own tiers, pinned for it and served to the round's fetch. Keyed (peer, kv_request_id, round): a consumer's kv_request_id names only its own exchange, so ids of two peers, and PD ids, never meet.
# ------------------------------------------------------------------------------------------

class ServeState(enum.StrEnum):
    ABSENT = "absent"
    """No record: no probe of this (peer, kv_request_id, round) is live."""
    LOOKING_UP = "looking_up"
    """A probe arrived; its keys are looked up in the engine's tiers at the engine's next serve window (vLLM: serve_external_requests), the found ones pinned; keys the engine reports pending are looked up again at later windows."""
    OFFERED = "offered"
    """The reply went out; the HIT keys are pinned (the engine keeps their blocks until the pins are released) and wait for the consumer's fetch."""
    SERVING = "serving"
    """The fetch named offered keys; the data plane is moving their pinned blocks and references them."""
    DELIVERING = "delivering"
    """The data plane moved every block and released them; waits for the consumer's receipt."""
    CONFIRMED = "confirmed"
    """The receipt arrived while the data plane still references the blocks; waits for the release."""
    CANCELLING = "cancelling"
    """The transfer was given up; the terminal answer and the pins' release wait until the data plane releases every block."""
    QUARANTINED = "quarantined"
    """The data plane did not release a given-up transfer in time; the session was ended to force it. The pins stay held until the plane reports the release."""
    ENDED = "ended"
    """Record deleted (final): every pin of the round was released exactly once. A later fetch of the round meets absent and is refused: with the reason this side withdrew the round with, if it did (withdrawn), else not_offered."""


class ServeEvent(enum.StrEnum):
    PROBE = "probe"
    """probe(kv_request_id, round, keys) arrived from the peer"""
    LOOKUP_RESULT = "lookup_result"
    """the shell looked keys up in the engine's tiers in a serve window: the found ones are pinned by one pin (an engine job), the others are missing or still pending (the engine said so, or the window had asked the engine about the lookup budget's keys already)"""
    FETCH = "fetch"
    """fetch(kv_request_id, round, keys, slots, offered=true) arrived"""
    RECEIPT = "receipt"
    """receipt(kv_request_id, round) arrived: every fetched block landed and matched its digest"""
    TRANSFER_RELEASED = "transfer_released"
    """the data plane moved every block of the round's transfer (or stopped) and holds no reference to them"""
    TRANSFER_FAILED = "transfer_failed"
    """the data plane failed the transfer and holds no reference to its blocks"""
    ABORT_FETCH = "abort_fetch"
    """abort_fetch(kv_request_id, round, offered=true) arrived: the consumer releases the round (nothing fetched) or aborts its fetch"""
    SERVE_LOOKUP_DEADLINE = "serve_lookup_deadline"
    """timer serve_lookup fired"""
    OFFER_DEADLINE = "offer_deadline"
    """timer offer fired"""
    TRANSFER_DEADLINE = "transfer_deadline"
    """timer transfer fired"""
    CANCEL_DEADLINE = "cancel_deadline"
    """timer cancel fired"""
    PEER_LOST = "peer_lost"
    """the session of the peer died"""
    DRAIN = "drain"
    """the engine called drain_jobs"""
    SHUTDOWN = "shutdown"
    """shutdown() began: no new work"""
    CLOSE = "close"
    """the shutdown grace is over"""


class ServeGuard(enum.StrEnum):
    NOT_SERVING = "not_serving"
    """serve_external is off, or the peer's principal is not in serve_allowed_principals"""
    SHUTTING_DOWN = "shutting_down"
    """shutdown() has begun: no new work"""
    OVER_BUDGET = "over_budget"
    """taking this probe would exceed serve_max_rounds_per_peer or serve_max_probes_per_round, or it names more keys than the peer's lookup budget (the larger of its pin reach and 4,096 keys), or it starts a round while the peer's rounds wait on the engine for four times that budget's keys, or it names new keys while the pinned-block budgets (serve_max_pinned_blocks_per_peer, the pool's serve_max_pinned_fraction) allow no block at all; else its lookups pin what the budgets' room holds, counting distinct blocks (one pinned already costs nothing), and the keys past it are answered miss"""
    SETTLES_WITH_OFFERS = "settles_with_offers"
    """after this result no key of the round waits for the engine, and the round pins at least one key"""
    SETTLES = "settles"
    """after this result no key of the round waits for the engine"""
    HAS_OFFERS = "has_offers"
    """the round pins at least one key"""
    FETCH_EMPTY = "fetch_empty"
    """the fetch names zero keys"""
    FETCH_OFFERED = "fetch_offered"
    """every key of the fetch is pinned in this round"""
    RECEIPT_SEEN = "receipt_seen"
    """the consumer confirmed every block before the data plane released them"""
    WITHDRAWN = "withdrawn"
    """this side ended the fetch's round and told the peer why (reply_refused: its offer expired, a drain, a shutdown, a budget) — one of the last 1024 rounds it so withdrew; a fetch that crossed that notice on the wire"""


class ServeEffect(enum.StrEnum):
    LOOK_UP = "look_up"
    """ask the shell to look the probe's new keys up in the engine's tiers at the next serve window and pin the found ones (LookUpBlocks); it answers lookup_result. New keys past four times the peer's lookup budget (keys its rounds wait on the engine for counted) are answered miss, the engine never asked"""
    LOOK_UP_PENDING = "look_up_pending"
    """ask the shell to look the keys the engine reported pending up again at the next serve window"""
    NOTE_FOUND = "note_found"
    """record the result's found keys (pool block, pin) and missing ones; keys still pending stay pending"""
    RELEASE_FOUND = "release_found"
    """release the pin of THIS lookup_result at once, ok (nothing of the round will read its blocks)"""
    REPLY_PROBE = "reply_probe"
    """send probe_reply(kv_request_id, round, keys, hits) for every key not yet answered: hit for pinned keys, miss for missing and still-pending ones (which count as missing from then on: a later probe of the round waits only on its own keys)"""
    REPLY_REFUSED = "reply_refused"
    """send transfer_done(fail, reason) for the round: the probe is refused or the offer withdrawn (no fetch of it was bound)"""
    CLOSE_LOOKUP = "close_lookup"
    """ask the shell to close the engine-side lookup context of the round at the next serve window (vLLM: ParentManager.on_request_finished), if one is open"""
    BIND_FETCH = "bind_fetch"
    """record the fetch's keys (pinned ones, fetch order), its destination slots and generation"""
    START_TRANSFER = "start_transfer"
    """hand the fetched keys' pinned blocks (fetch order) to the data plane for the peer; their digests are taken as the transfer starts (a pinned block does not change)"""
    CANCEL_TRANSFER = "cancel_transfer"
    """ask the data plane to stop: it posts nothing more and reports transfer_released once no block is referenced"""
    FORCE_RELEASE = "force_release"
    """end the session with the peer (transfer_stalled) so the data plane drops every reference it holds to that peer"""
    COMPLETE_PINS = "complete_pins"
    """release every pin of the round, ok (the engine may evict the blocks)"""
    FAIL_PINS = "fail_pins"
    """release every pin of the round, failed with the reason"""
    REPLY_DONE_OK = "reply_done_ok"
    """send transfer_done(ok) for the round"""
    REPLY_DONE_FAIL = "reply_done_fail"
    """send transfer_done(fail, reason) for the round: the terminal answer, only once no write can land"""
    REPLY_TERMINAL = "reply_terminal"
    """send the round its terminal answer now that no write can land: abort_ack if the consumer aborted it, else transfer_done(fail, reason)"""
    REPLY_FETCH_FAILED = "reply_fetch_failed"
    """send transfer_done(fail, reason) for THIS fetch's round"""
    REPLY_FETCH_WITHDRAWN = "reply_fetch_withdrawn"
    """send transfer_done(fail, reason) for THIS fetch's round, the reason this side withdrew the round with (its notice and this answer agree: offer_expired, not not_offered)"""
    REPLY_ABORT_ACK = "reply_abort_ack"
    """send abort_ack for the round"""
    NOTE_DUPLICATE = "note_duplicate"
    """count a repeated fetch of the round; nothing else"""
    NOTE_RECEIPT = "note_receipt"
    """remember that the consumer confirmed every block"""
    NOTE_STALE = "note_stale"
    """count a stale input; nothing else"""


SERVE_INITIAL: Final = ServeState.ABSENT
SERVE_FINAL: Final = frozenset({ServeState.ENDED})
SERVE_TIMERS: Final = MappingProxyType({
    "serve_lookup": TimerSpec("serve_lookup", ServeEvent.SERVE_LOOKUP_DEADLINE, "serve_lookup_timeout_s"),
    "offer": TimerSpec("offer", ServeEvent.OFFER_DEADLINE, "offer_timeout_s"),
    "transfer": TimerSpec("transfer", ServeEvent.TRANSFER_DEADLINE, "transfer_timeout_s"),
    "cancel": TimerSpec("cancel", ServeEvent.CANCEL_DEADLINE, "transfer_timeout_s"),
})
"""Timer name -> (event it fires, config key that sets its duration in seconds)."""
SERVE_STATE_TIMER: Final = MappingProxyType({
    ServeState.ABSENT: None,
    ServeState.LOOKING_UP: 'serve_lookup',
    ServeState.OFFERED: 'offer',
    ServeState.SERVING: 'transfer',
    ServeState.DELIVERING: 'transfer',
    ServeState.CONFIRMED: 'cancel',
    ServeState.CANCELLING: 'cancel',
    ServeState.QUARANTINED: None,
    ServeState.ENDED: None,
})
"""State -> name of the timer armed while in it (None: no timer)."""
SERVE_TABLE: Final = MappingProxyType({
    (ServeState.ABSENT, ServeEvent.PROBE): Rule(TRANSITION, (
        Branch(ServeGuard.NOT_SERVING, ServeState.ABSENT, (ServeEffect.REPLY_REFUSED, ), Reason.NOT_SERVING),
        Branch(ServeGuard.SHUTTING_DOWN, ServeState.ABSENT, (ServeEffect.REPLY_REFUSED, ), Reason.SHUTDOWN),
        Branch(ServeGuard.OVER_BUDGET, ServeState.ABSENT, (ServeEffect.REPLY_REFUSED, ), Reason.SERVE_BUSY),
        Branch(None, ServeState.LOOKING_UP, (ServeEffect.LOOK_UP, ), None),
    ), None),
    (ServeState.ABSENT, ServeEvent.LOOKUP_RESULT): Rule(TRANSITION, (
        Branch(None, ServeState.ABSENT, (ServeEffect.RELEASE_FOUND, ), None),
    ), None),
    (ServeState.ABSENT, ServeEvent.FETCH): Rule(TRANSITION, (
        Branch(ServeGuard.WITHDRAWN, ServeState.ABSENT, (ServeEffect.REPLY_FETCH_WITHDRAWN, ), None),
        Branch(None, ServeState.ABSENT, (ServeEffect.REPLY_FETCH_FAILED, ), Reason.NOT_OFFERED),
    ), None),
    (ServeState.ABSENT, ServeEvent.RECEIPT): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.ABSENT, (ServeEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ServeState.ABSENT, ServeEvent.SERVE_LOOKUP_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.OFFER_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.PEER_LOST): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.DRAIN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.SHUTDOWN): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.ABSENT, ServeEvent.CLOSE): Rule(IGNORE, (), Reason.NO_RECORD),
    (ServeState.LOOKING_UP, ServeEvent.PROBE): Rule(TRANSITION, (
        Branch(ServeGuard.OVER_BUDGET, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ServeEffect.CLOSE_LOOKUP, ), Reason.SERVE_BUSY),
        Branch(None, ServeState.LOOKING_UP, (ServeEffect.LOOK_UP, ), None),
    ), None),
    (ServeState.LOOKING_UP, ServeEvent.LOOKUP_RESULT): Rule(TRANSITION, (
        Branch(ServeGuard.SETTLES_WITH_OFFERS, ServeState.OFFERED, (ServeEffect.NOTE_FOUND, ServeEffect.REPLY_PROBE, ServeEffect.CLOSE_LOOKUP, ), None),
        Branch(ServeGuard.SETTLES, ServeState.ENDED, (ServeEffect.NOTE_FOUND, ServeEffect.REPLY_PROBE, ServeEffect.COMPLETE_PINS, ServeEffect.CLOSE_LOOKUP, ), None),
        Branch(None, ServeState.LOOKING_UP, (ServeEffect.NOTE_FOUND, ServeEffect.LOOK_UP_PENDING, ), None),
    ), None),
    (ServeState.LOOKING_UP, ServeEvent.FETCH): Rule(TRANSITION, (
        Branch(ServeGuard.FETCH_EMPTY, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ServeEffect.REPLY_DONE_OK, ServeEffect.CLOSE_LOOKUP, ), None),
        Branch(ServeGuard.FETCH_OFFERED, ServeState.SERVING, (ServeEffect.BIND_FETCH, ServeEffect.START_TRANSFER, ServeEffect.CLOSE_LOOKUP, ), None),
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_FETCH_FAILED, ServeEffect.CLOSE_LOOKUP, ), Reason.NOT_OFFERED),
    ), None),
    (ServeState.LOOKING_UP, ServeEvent.RECEIPT): Rule(IGNORE, (), Reason.STALE),
    (ServeState.LOOKING_UP, ServeEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ServeState.LOOKING_UP, ServeEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ServeState.LOOKING_UP, ServeEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ServeEffect.REPLY_ABORT_ACK, ServeEffect.CLOSE_LOOKUP, ), None),
    ), None),
    (ServeState.LOOKING_UP, ServeEvent.SERVE_LOOKUP_DEADLINE): Rule(TRANSITION, (
        Branch(ServeGuard.HAS_OFFERS, ServeState.OFFERED, (ServeEffect.REPLY_PROBE, ServeEffect.CLOSE_LOOKUP, ), None),
        Branch(None, ServeState.ENDED, (ServeEffect.REPLY_PROBE, ServeEffect.COMPLETE_PINS, ServeEffect.CLOSE_LOOKUP, ), None),
    ), None),
    (ServeState.LOOKING_UP, ServeEvent.OFFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.LOOKING_UP, ServeEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.LOOKING_UP, ServeEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.LOOKING_UP, ServeEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.CLOSE_LOOKUP, ), Reason.PEER_LOST),
    ), None),
    (ServeState.LOOKING_UP, ServeEvent.DRAIN): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ServeEffect.CLOSE_LOOKUP, ), Reason.DRAINED),
    ), None),
    (ServeState.LOOKING_UP, ServeEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ServeEffect.CLOSE_LOOKUP, ), Reason.SHUTDOWN),
    ), None),
    (ServeState.LOOKING_UP, ServeEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ServeEffect.CLOSE_LOOKUP, ), Reason.SHUTDOWN),
    ), None),
    (ServeState.OFFERED, ServeEvent.PROBE): Rule(TRANSITION, (
        Branch(ServeGuard.OVER_BUDGET, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ServeEffect.CLOSE_LOOKUP, ), Reason.SERVE_BUSY),
        Branch(None, ServeState.LOOKING_UP, (ServeEffect.LOOK_UP, ), None),
    ), None),
    (ServeState.OFFERED, ServeEvent.LOOKUP_RESULT): Rule(TRANSITION, (
        Branch(None, ServeState.OFFERED, (ServeEffect.RELEASE_FOUND, ), None),
    ), None),
    (ServeState.OFFERED, ServeEvent.FETCH): Rule(TRANSITION, (
        Branch(ServeGuard.FETCH_EMPTY, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ServeEffect.REPLY_DONE_OK, ServeEffect.CLOSE_LOOKUP, ), None),
        Branch(ServeGuard.FETCH_OFFERED, ServeState.SERVING, (ServeEffect.BIND_FETCH, ServeEffect.START_TRANSFER, ServeEffect.CLOSE_LOOKUP, ), None),
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_FETCH_FAILED, ServeEffect.CLOSE_LOOKUP, ), Reason.NOT_OFFERED),
    ), None),
    (ServeState.OFFERED, ServeEvent.RECEIPT): Rule(IGNORE, (), Reason.STALE),
    (ServeState.OFFERED, ServeEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ServeState.OFFERED, ServeEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ServeState.OFFERED, ServeEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ServeEffect.REPLY_ABORT_ACK, ServeEffect.CLOSE_LOOKUP, ), None),
    ), None),
    (ServeState.OFFERED, ServeEvent.SERVE_LOOKUP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.OFFERED, ServeEvent.OFFER_DEADLINE): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ), Reason.OFFER_EXPIRED),
    ), None),
    (ServeState.OFFERED, ServeEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.OFFERED, ServeEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.OFFERED, ServeEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.CLOSE_LOOKUP, ), Reason.PEER_LOST),
    ), None),
    (ServeState.OFFERED, ServeEvent.DRAIN): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ServeEffect.CLOSE_LOOKUP, ), Reason.DRAINED),
    ), None),
    (ServeState.OFFERED, ServeEvent.SHUTDOWN): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ServeEffect.CLOSE_LOOKUP, ), Reason.SHUTDOWN),
    ), None),
    (ServeState.OFFERED, ServeEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_REFUSED, ServeEffect.CLOSE_LOOKUP, ), Reason.SHUTDOWN),
    ), None),
    (ServeState.SERVING, ServeEvent.PROBE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.SERVING, ServeEvent.LOOKUP_RESULT): Rule(TRANSITION, (
        Branch(None, ServeState.SERVING, (ServeEffect.RELEASE_FOUND, ), None),
    ), None),
    (ServeState.SERVING, ServeEvent.FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.SERVING, (ServeEffect.NOTE_DUPLICATE, ), None),
    ), None),
    (ServeState.SERVING, ServeEvent.RECEIPT): Rule(TRANSITION, (
        Branch(None, ServeState.CONFIRMED, (ServeEffect.NOTE_RECEIPT, ), None),
    ), None),
    (ServeState.SERVING, ServeEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(None, ServeState.DELIVERING, (), None),
    ), None),
    (ServeState.SERVING, ServeEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_DONE_FAIL, ), Reason.TRANSFER_FAILED),
    ), None),
    (ServeState.SERVING, ServeEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.CANCELLING, (ServeEffect.CANCEL_TRANSFER, ), Reason.ABORTED),
    ), None),
    (ServeState.SERVING, ServeEvent.SERVE_LOOKUP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.SERVING, ServeEvent.OFFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.SERVING, ServeEvent.TRANSFER_DEADLINE): Rule(TRANSITION, (
        Branch(None, ServeState.CANCELLING, (ServeEffect.CANCEL_TRANSFER, ), Reason.TRANSFER_TIMEOUT),
    ), None),
    (ServeState.SERVING, ServeEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.SERVING, ServeEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ServeState.CANCELLING, (ServeEffect.CANCEL_TRANSFER, ), Reason.PEER_LOST),
    ), None),
    (ServeState.SERVING, ServeEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ServeState.SERVING, ServeEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (ServeState.SERVING, ServeEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ServeState.CANCELLING, (ServeEffect.CANCEL_TRANSFER, ), Reason.SHUTDOWN),
    ), None),
    (ServeState.DELIVERING, ServeEvent.PROBE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.DELIVERING, ServeEvent.LOOKUP_RESULT): Rule(TRANSITION, (
        Branch(None, ServeState.DELIVERING, (ServeEffect.RELEASE_FOUND, ), None),
    ), None),
    (ServeState.DELIVERING, ServeEvent.FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.DELIVERING, (ServeEffect.NOTE_DUPLICATE, ), None),
    ), None),
    (ServeState.DELIVERING, ServeEvent.RECEIPT): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ), None),
    ), None),
    (ServeState.DELIVERING, ServeEvent.TRANSFER_RELEASED): Rule(IGNORE, (), Reason.STALE),
    (ServeState.DELIVERING, ServeEvent.TRANSFER_FAILED): Rule(IGNORE, (), Reason.STALE),
    (ServeState.DELIVERING, ServeEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_ABORT_ACK, ), Reason.ABORTED),
    ), None),
    (ServeState.DELIVERING, ServeEvent.SERVE_LOOKUP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.DELIVERING, ServeEvent.OFFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.DELIVERING, ServeEvent.TRANSFER_DEADLINE): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_DONE_FAIL, ), Reason.TRANSFER_TIMEOUT),
    ), None),
    (ServeState.DELIVERING, ServeEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.DELIVERING, ServeEvent.PEER_LOST): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ), Reason.PEER_LOST),
    ), None),
    (ServeState.DELIVERING, ServeEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ServeState.DELIVERING, ServeEvent.SHUTDOWN): Rule(IGNORE, (), Reason.IN_GRACE),
    (ServeState.DELIVERING, ServeEvent.CLOSE): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_DONE_FAIL, ), Reason.SHUTDOWN),
    ), None),
    (ServeState.CONFIRMED, ServeEvent.PROBE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CONFIRMED, ServeEvent.LOOKUP_RESULT): Rule(TRANSITION, (
        Branch(None, ServeState.CONFIRMED, (ServeEffect.RELEASE_FOUND, ), None),
    ), None),
    (ServeState.CONFIRMED, ServeEvent.FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.CONFIRMED, (ServeEffect.NOTE_DUPLICATE, ), None),
    ), None),
    (ServeState.CONFIRMED, ServeEvent.RECEIPT): Rule(TRANSITION, (
        Branch(None, ServeState.CONFIRMED, (ServeEffect.NOTE_STALE, ), None),
    ), None),
    (ServeState.CONFIRMED, ServeEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ), None),
    ), None),
    (ServeState.CONFIRMED, ServeEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ), None),
    ), None),
    (ServeState.CONFIRMED, ServeEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.CONFIRMED, (ServeEffect.REPLY_ABORT_ACK, ), None),
    ), None),
    (ServeState.CONFIRMED, ServeEvent.SERVE_LOOKUP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CONFIRMED, ServeEvent.OFFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CONFIRMED, ServeEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CONFIRMED, ServeEvent.CANCEL_DEADLINE): Rule(TRANSITION, (
        Branch(None, ServeState.QUARANTINED, (ServeEffect.FORCE_RELEASE, ), None),
    ), None),
    (ServeState.CONFIRMED, ServeEvent.PEER_LOST): Rule(IGNORE, (), Reason.REFERENCED),
    (ServeState.CONFIRMED, ServeEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CONFIRMED, ServeEvent.SHUTDOWN): Rule(IGNORE, (), Reason.REFERENCED),
    (ServeState.CONFIRMED, ServeEvent.CLOSE): Rule(IGNORE, (), Reason.REFERENCED),
    (ServeState.CANCELLING, ServeEvent.PROBE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CANCELLING, ServeEvent.LOOKUP_RESULT): Rule(TRANSITION, (
        Branch(None, ServeState.CANCELLING, (ServeEffect.RELEASE_FOUND, ), None),
    ), None),
    (ServeState.CANCELLING, ServeEvent.FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.CANCELLING, (ServeEffect.NOTE_DUPLICATE, ), None),
    ), None),
    (ServeState.CANCELLING, ServeEvent.RECEIPT): Rule(TRANSITION, (
        Branch(None, ServeState.CONFIRMED, (ServeEffect.NOTE_RECEIPT, ), None),
    ), None),
    (ServeState.CANCELLING, ServeEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_TERMINAL, ), None),
    ), None),
    (ServeState.CANCELLING, ServeEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_TERMINAL, ), None),
    ), None),
    (ServeState.CANCELLING, ServeEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.CANCELLING, (), None),
    ), None),
    (ServeState.CANCELLING, ServeEvent.SERVE_LOOKUP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CANCELLING, ServeEvent.OFFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CANCELLING, ServeEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CANCELLING, ServeEvent.CANCEL_DEADLINE): Rule(TRANSITION, (
        Branch(None, ServeState.QUARANTINED, (ServeEffect.FORCE_RELEASE, ), None),
    ), None),
    (ServeState.CANCELLING, ServeEvent.PEER_LOST): Rule(IGNORE, (), Reason.REFERENCED),
    (ServeState.CANCELLING, ServeEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ServeState.CANCELLING, ServeEvent.SHUTDOWN): Rule(IGNORE, (), Reason.REFERENCED),
    (ServeState.CANCELLING, ServeEvent.CLOSE): Rule(IGNORE, (), Reason.REFERENCED),
    (ServeState.QUARANTINED, ServeEvent.PROBE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.QUARANTINED, ServeEvent.LOOKUP_RESULT): Rule(TRANSITION, (
        Branch(None, ServeState.QUARANTINED, (ServeEffect.RELEASE_FOUND, ), None),
    ), None),
    (ServeState.QUARANTINED, ServeEvent.FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.QUARANTINED, (ServeEffect.NOTE_DUPLICATE, ), None),
    ), None),
    (ServeState.QUARANTINED, ServeEvent.RECEIPT): Rule(TRANSITION, (
        Branch(None, ServeState.QUARANTINED, (ServeEffect.NOTE_STALE, ), None),
    ), None),
    (ServeState.QUARANTINED, ServeEvent.TRANSFER_RELEASED): Rule(TRANSITION, (
        Branch(ServeGuard.RECEIPT_SEEN, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ), None),
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_TERMINAL, ), None),
    ), None),
    (ServeState.QUARANTINED, ServeEvent.TRANSFER_FAILED): Rule(TRANSITION, (
        Branch(ServeGuard.RECEIPT_SEEN, ServeState.ENDED, (ServeEffect.COMPLETE_PINS, ), None),
        Branch(None, ServeState.ENDED, (ServeEffect.FAIL_PINS, ServeEffect.REPLY_TERMINAL, ), None),
    ), None),
    (ServeState.QUARANTINED, ServeEvent.ABORT_FETCH): Rule(TRANSITION, (
        Branch(None, ServeState.QUARANTINED, (), None),
    ), None),
    (ServeState.QUARANTINED, ServeEvent.SERVE_LOOKUP_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.QUARANTINED, ServeEvent.OFFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.QUARANTINED, ServeEvent.TRANSFER_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.QUARANTINED, ServeEvent.CANCEL_DEADLINE): Rule(IGNORE, (), Reason.STALE),
    (ServeState.QUARANTINED, ServeEvent.PEER_LOST): Rule(IGNORE, (), Reason.REFERENCED),
    (ServeState.QUARANTINED, ServeEvent.DRAIN): Rule(IGNORE, (), Reason.STALE),
    (ServeState.QUARANTINED, ServeEvent.SHUTDOWN): Rule(IGNORE, (), Reason.REFERENCED),
    (ServeState.QUARANTINED, ServeEvent.CLOSE): Rule(IGNORE, (), Reason.REFERENCED),
})


class Wire(NamedTuple):
    """How one wire message reaches the code that takes it (``[wire.<tag>]`` of the spec)."""

    struct: str
    """The msgspec struct's name in ``kvtier.wire.messages``."""
    receive: str
    """The core's handler: ``TierCore._rx_<receive>``."""
    lands: bool
    """A block_data: its landing may run on the digest pool, a further one is landed beside it."""
    principal: bool
    """The shell attaches the peer's authenticated principal."""
    noted: str
    """The shell's observation when one arrives (log line, counter), or ``""``."""
    sent: str
    """The shell's observation when one is sent, or ``""``."""


WIRE: Final = MappingProxyType({
    "hello": Wire("Hello", "hello", False, True, "name_peer", ""),
    "hello_ack": Wire("HelloAck", "hello_ack", False, False, "name_peer", ""),
    "hello_reject": Wire("HelloReject", "hello_reject", False, False, "rejected", "rejecting"),
    "fetch": Wire("Fetch", "fetch", False, False, "", ""),
    "block_data": Wire("BlockData", "block_data", True, False, "", ""),
    "transfer_done": Wire("TransferDone", "transfer_done", False, False, "", "refused"),
    "abort_fetch": Wire("AbortFetch", "abort_fetch", False, False, "", ""),
    "receipt": Wire("Receipt", "receipt", False, False, "", ""),
    "abort_ack": Wire("AbortAck", "abort_ack", False, False, "", ""),
    "probe": Wire("Probe", "probe", False, False, "", ""),
    "probe_reply": Wire("ProbeReply", "probe_reply", False, False, "probe_answered", "served"),
    "ping": Wire("Ping", "ping", False, False, "chatter", ""),
    "pong": Wire("Pong", "pong", False, False, "chatter", ""),
    "disconnect": Wire("Disconnect", "disconnect", False, False, "", ""),
    "error": Wire("Error", "error", False, False, "peer_error", ""),
})
"""Wire message tag -> its routing: the only table that says which code takes which message."""
PERFORM: Final = MappingProxyType({
    "Send": "send",
    "JobDone": "job_done",
    "SendBlocks": "send_blocks",
    "CancelTransfer": "cancel",
    "LandBlocks": "land",
    "RevokeAccess": "revoke",
    "OpenConnection": "open",
    "CloseConnection": "close",
    "AttachPeer": "attach",
    "DetachPeer": "detach",
    "SessionEnded": "session_ended",
    "ProbeFailed": "probe_failed",
    "SlotsHeld": "slots_held",
    "Ignored": "ignored",
    "LookUpBlocks": "queue_lookup",
    "CloseLookup": "queue_close",
    "ReleasePins": "release_pins",
})
"""Effect record name -> the shell's performer (``Outbound._<performer>``)."""

PROPERTIES: Final = MappingProxyType({
    "exactly_once_job_result": ("safety", "Every store or load job handed to the manager gets exactly one result, on every path."),
    "tombstoned_never_reparks": ("safety", "A tombstoned id never returns to parked; a store for it fails at once and pins nothing (a store naming another life of the id first prunes the tombstone: a new life is a fresh id; so does a producer request or store naming a consumer other than the principal that ended the id before any was named, decision L17)."),
    "no_bytes_for_tombstoned": ("safety", "Blocks are handed to the data plane only when an id enters serving; never for a parked, done, tombstoned or pruned id."),
    "late_fetch_one_rtt": ("safety", "A fetch for a done, tombstoned, cancelling or quarantined id is answered with transfer_done(fail, reason) in the same step that receives it; a duplicate of the fetch a cancelling or quarantined id is bound to gets its terminal answer when the data plane releases the blocks."),
    "every_state_has_deadline_or_exit": ("structural", "Every non-final state other than the initial one has a timer, or names the events that leave it."),
    "bounded_bookkeeping": ("safety", "Producer records <= live ids + retained ids, and retained ids <= tombstone_max."),
    "no_write_after_terminal": ("safety", "No block lands in a load's slots after the load's result was reported: receiver-applied data only while in_flight, one-sided writes only before the producer's terminal answer or the revocation of its access."),
    "fetch_always_answered": ("liveness", "Every fetch eventually gets a terminal answer, or the consumer's own deadlines end the load; nothing waits forever."),
    "no_block_returned_while_referenced": ("safety", "A store job's result (success or failure) is reported only when the data plane holds no reference to its blocks."),
    "no_success_without_receipt": ("safety", "A store job that parked blocks succeeds only after the consumer confirmed, with a receipt, that every demanded block landed intact; a load succeeds only when every block matched its parked digest."),
    "input_before_deadline": ("safety", "A deadline never fires while a message that arrived before it is still unread: the shell fires deadlines at the time its inbound queue was last seen empty."),
    "lives_never_mix": ("safety", "A consumer message that refers to a binding (an abort of a fetched round, a receipt) changes only the life that round bound; producer messages carry the round, so an earlier round's answer never touches a later load; with lives named in the params, no message of one life of an id changes another (an abort of a never-fetched round included)."),
    "probe_answered_in_bound": ("safety", "A lookup of a symmetric request answers RETRY only while its round is in collecting or probing, both bounded by the probe timer (probe_timeout_s from the round's first key, dialling and handshake included); a probe that reached a ready peer is answered (probe_reply or transfer_done(fail)) within serve_lookup_timeout_s of the peer's serve windows."),
    "pin_released_once": ("safety", "Every pin the shell took (one engine job per lookup_result with found keys) is released exactly once on every path (fetch served, empty fetch, release, abort, offer deadline, session death, drain, shutdown, a result arriving after its round ended), and never while the data plane references its blocks."),
    "no_hit_without_pin": ("safety", "A probe_reply says hit for a key only while its serve record holds an unreleased pin covering it, held until the round's fetch is terminal, the consumer released the round or the producer told it transfer_done(fail); the consumer answers HIT only for keys its open round was told hit (or a load of it is in flight) and never after the round failed."),
    "no_block_after_release": ("safety", "Blocks reach the data plane for a serve record only on its step into serving, only blocks of pins it still holds and only keys its replies offered; a fetch of an ended round, or of keys never offered, is answered transfer_done(fail, not_offered — or the reason this side withdrew the round with) in the step that receives it and moves no byte."),
    "lookup_context_closed_once": ("safety", "Every engine-side lookup context the shell opened for a serve record (ParentManager.on_new_request) is closed exactly once (on_request_finished), in a serve window, while the engine lives."),
    "partial_keys_verified": ("safety", "A failed load reports as successful_keys exactly the verified prefix of its fetch: the keys from the first whose blocks landed in its slots and matched their digests (re-checked at reporting on one-sided planes), never a key whose landing failed its check, was not answered yet, or follows a hole; and only once no write can land in its slots; with integrity = none it reports none (decision I21)."),
    "result_after_last_write": ("safety", "A load's job result (success or failure) is reported only once every landing it started has answered: no byte lands in a slot after its job's result, so the engine may reuse the slots the moment it has it (decision I26)."),
    "failed_keys_miss": ("safety", "Once a symmetric round's load failed, every key of it outside its successful prefix answers MISS for the rest of the request: a key is loaded at most twice per request and a failed one is never probed, offered and loaded again (decision I22)."),
    "instance_fate_proven": ("safety", "A producer instance is held gone (its new loads fail instance_down without dialling) only on proof of its end: a dial its address refused, or a hello_ack at its address naming another instance; never on a disconnect, a reset, silence, a failed send or a give-up alone (decision I23)."),
    "release_never_dropped": ("safety", "An abort_fetch, or a fetch naming no keys, that reaches the producer on a session of its generation that is ready or still attaching (its data plane taking the descriptor) is applied in that step, so the blocks it releases are freed within one round trip (decision I24)."),
    "plane_fault_ends_session": ("safety", "A data-plane fault (a path to the peer that broke, e.g. a NIXL remote disconnect) ends the session it was reported for: no transfer is started on that session afterwards, and the next load dials afresh (decision I25)."),
})
"""Property name -> (kind, statement). Verified by tests and `python -m tools check`."""

TIMER_KEYS: Final = (
    "unbound_store_timeout_s",
    "fetch_supply_timeout_s",
    "transfer_timeout_s",
    "tombstone_retention_s",
    "load_timeout_s",
    "abort_ack_timeout_s",
    "revoke_timeout_s",
    "handshake_timeout_s",
    "heartbeat_interval_s",
    "peer_timeout_s",
    "probe_timeout_s",
    "serve_lookup_timeout_s",
    "offer_timeout_s",
)
"""Every config key (seconds) the machines read: their timers' durations, then the durations a guard compares against (``[machines.<m>.durations]``)."""
