"""Effects: what the lifecycle core asks the I/O shell to do, as small frozen records.

The core never performs I/O; :meth:`~kvtier.lifecycle.TierCore.handle` returns a list of these, in
the order the shell must carry them out.  The shell performs each with the performer its
outbound table names for the effect's type (``kvtier/shell/outbound.py``); a performer that learns
something (a connection came up, the plane took a descriptor, a landing was checked) reports it
as an input for the next step, never by calling the core itself.

Messages to peers are one effect, :class:`Send`, which carries the wire message itself
(:mod:`kvtier.wire.messages`), built by the core with the session generation it must carry
(captured when the effect is made, so it stays right even if the session ends later in the same
step).  Peers are transport identity strings; ``round`` is the consumer's fetch number; block and
slot numbers index a :class:`~kvtier.memory.BlockPool`; digests are the 64-bit block digests of
:mod:`kvtier.integrity` (0 when integrity checking is off).

The records are msgspec Structs rather than attrs classes because the core makes several per
message: building one costs ~0.15 µs against ~1.2 µs for a frozen attrs class (decision C3 in
docs/decisions.md).  Like the wire messages, they are frozen.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvtier.lifecycle._table import Reason

__all__ = [
    "AttachPeer",
    "CancelTransfer",
    "CloseConnection",
    "CloseLookup",
    "DetachPeer",
    "Effect",
    "Ignored",
    "JobDone",
    "LandBlocks",
    "LookUpBlocks",
    "OpenConnection",
    "ProbeFailed",
    "ReleasePins",
    "RevokeAccess",
    "Send",
    "SendBlocks",
    "SessionEnded",
    "SlotsHeld",
]


class _Effect(msgspec.Struct, frozen=True, gc=False):
    pass


class Send(_Effect):
    """Send wire message ``msg`` to ``peer`` (a control message: no payload frames).

    ``ends_session`` says what a failed send means: True (a fetch, an answer, a receipt, a
    handshake: losing it would leave a record waiting for a deadline), the shell reports it as a
    ``SendFailed`` input and the session ends; False (a goodbye, a refusal, a heartbeat, an error
    answer to a peer that may already be gone), nothing is reported."""

    peer: str
    msg: Any
    ends_session: bool = True


class JobDone(_Effect):
    """Report the result of store or load job ``job_id`` to the engine (exactly once per job).

    For a store job, success or failure both mean the engine may release the job's blocks.
    For a load job, ``ok`` means the slots hold the blocks; failure means they hold nothing
    useful and no write into them can still land."""

    job_id: int
    ok: bool
    reason: Reason | None = None
    successful_keys: tuple[bytes, ...] | None = None
    """A failed load only: the keys whose blocks landed in their slots and matched their digests
    (a partial load; the engine keeps them).  None: nothing to keep."""
    verify: tuple[tuple[int, int], ...] = ()
    """One-sided planes: ``(slot, digest)`` of each successful key, re-checked by the shell before
    the result is reported (a key whose slot no longer matches is dropped from
    ``successful_keys``)."""
    at_submission: bool = False
    """A store job ended by the step that submitted it — refused (``id_in_use``, a tombstone, an
    abort, a finished round) or needing nothing (empty, ``not_needed``): none of its blocks were
    ever parked (what ``kvtier why`` tells, decision E11)."""


class SendBlocks(_Effect):
    """Producer: hand ``blocks`` (pool block numbers, in the fetch's key order) with their parked
    ``digests`` to the data plane for ``peer`` (``slots``: the consumer's destination slots, for
    one-sided planes), as round ``round`` of ``kv_request_id`` tagged with generation ``gen``.
    The plane reports ``TransferReleased`` once it moved every block (or gave up) and holds no
    reference to them."""

    peer: str
    kv_request_id: str
    round: int
    blocks: tuple[int, ...]
    gen: int = 0
    digests: tuple[int, ...] = ()
    slots: tuple[int, ...] = ()
    transfer: str = ""
    """The transfer's key on the data plane (its ``Released`` names it): empty for a PD transfer
    (the ``kv_request_id``), :func:`~kvtier.lifecycle.serve.transfer_key` for a served round,
    so rounds of two peers, or a served round and a PD id, never share a plane key."""
    take_digests: bool = False
    """Serve transfers: ``digests`` is empty and the shell takes each block's digest as it hands
    the transfer to the plane (a pinned block does not change while pinned), filling them into
    ``headers`` (decision Y9)."""
    headers: tuple[Any, ...] = ()
    """The transfer's ``block_data`` messages, in order, built by the core
    (:mod:`kvtier.lifecycle.batches`): header ``i`` names blocks ``first .. first+count-1`` of
    ``blocks``; the shell sends each with those blocks."""


class CancelTransfer(_Effect):
    """Producer: ask the data plane to stop this transfer (post nothing more); it reports
    ``TransferReleased`` once it holds no reference to the blocks.  ``kv_request_id`` is the
    transfer's plane key (:attr:`SendBlocks.transfer` when one was given)."""

    kv_request_id: str
    round: int


class LandBlocks(_Effect):
    """Consumer: land blocks ``first..first+len(slots)-1`` of the load's round in ``slots`` and
    check each against its parked digest; then report ``BlocksLanded``.  ``payloads`` are the
    ``block_data``'s payload frames (zmq plane: copied into the slots; one-sided planes: none,
    the producer already wrote them).  Only ever emitted for a load in ``in_flight``."""

    peer: str
    kv_request_id: str
    round: int
    first: int
    slots: tuple[int, ...]
    digests: tuple[int, ...] = ()
    payloads: tuple[Any, ...] = ()


class RevokeAccess(_Effect):
    """Consumer: make sure the producer ``peer`` can no longer write into this manager's slots
    (receiver-applied planes: true at once; one-sided planes: the plane proves it), then report
    ``AccessRevoked``."""

    peer: str


class OpenConnection(_Effect):
    """Session: open a transport connection to ``peer`` (a ``host:port``) for session generation
    ``gen``; report ``ConnectionUp`` (with the data plane's descriptor for this session) or
    ``ConnectFailed``."""

    peer: str
    gen: int = 0


class CloseConnection(_Effect):
    """Session: close the transport connection to ``peer`` (if we own one) — at once, or, with
    ``linger_s`` > 0, once the goodbye just sent had up to that many seconds to leave (nothing
    more is sent to ``peer`` meanwhile; decision I28)."""

    peer: str
    linger_s: float = 0.0


class AttachPeer(_Effect):
    """Session: give the data plane ``peer``'s ``descriptor`` (from its hello, or from its
    hello_ack to our hello of generation ``gen`` when ``accepted``); report ``PeerAttached`` or
    ``AttachRefused``."""

    peer: str
    gen: int
    descriptor: bytes
    accepted: bool


class DetachPeer(_Effect):
    """Session: the data plane forgets ``peer`` (its session ended); writes it already posted
    run to their end and are reported."""

    peer: str


class SessionEnded(_Effect):
    """Session: the session with ``peer`` ended with ``reason`` (for metrics and the log; the
    core already told every record bound to it).  ``closed``: it ended because its connection
    closed with no goodbye (a crash, a kill, a reset: a fault, not routine; decision O8)."""

    peer: str
    reason: Reason
    dialled: bool = False
    instance: str = ""
    closed: bool = False


class ProbeFailed(_Effect):
    """Symmetric: the probing of ``peer`` for ``kv_request_id`` failed with ``reason``; its
    lookups answer MISS, so the engine computes the blocks (for the metrics, the log and the
    request's record: a request that never loads leaves no job behind to say why, decision I32)."""

    kv_request_id: str
    peer: str
    reason: Reason


class SlotsHeld(_Effect):
    """Consumer: ``slots`` slots of load ``kv_request_id`` are still held past the revoke
    deadline, because the data plane cannot withdraw ``peer``'s access by itself; for the
    operator's log (repeated every ``revoke_timeout_s`` while it lasts)."""

    peer: str
    kv_request_id: str
    slots: int


class LookUpBlocks(_Effect):
    """Serve: at the engine's next serve window, look ``keys`` up in the engine's tiers for round
    ``round`` of ``peer``'s ``kv_request_id``, pin the found ones with one pin and report
    ``LookupAnswered`` (an engine lookup context for the round is opened if none is)."""

    peer: str
    kv_request_id: str
    round: int
    keys: tuple[bytes, ...]


class CloseLookup(_Effect):
    """Serve: close the engine lookup context of the round at the next serve window, if one is
    open (vLLM: ``ParentManager.on_request_finished``); a second close is a no-op."""

    peer: str
    kv_request_id: str
    round: int


class ReleasePins(_Effect):
    """Serve: release engine pins ``pins`` (each exactly once): ``ok`` or failed with ``reason``
    (vLLM: the pin's store job gets its ``JobResult``).  After it the engine may evict or reuse the
    pinned blocks."""

    pins: tuple[int, ...]
    ok: bool
    reason: Reason | None = None


class Ignored(_Effect):
    """An input dropped by an ignore rule, or a duplicate/stale note; for metrics and
    rate-limited logs only."""

    machine: str
    key: str
    state: str
    event: str
    reason: Reason


Effect = (
    Send
    | JobDone
    | SendBlocks
    | CancelTransfer
    | LandBlocks
    | RevokeAccess
    | OpenConnection
    | CloseConnection
    | AttachPeer
    | DetachPeer
    | SessionEnded
    | ProbeFailed
    | SlotsHeld
    | LookUpBlocks
    | CloseLookup
    | ReleasePins
    | Ignored
)
