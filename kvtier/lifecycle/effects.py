"""Effects: what the lifecycle core asks the I/O shell to do, as small frozen records.

The core never performs I/O; every input method returns a list of these, in the order the shell
must carry them out.  Peers are transport identity strings; ``gen`` is the session generation a
message must carry (captured when the effect is made, so it stays valid even if the session ends
later in the same step); ``round`` is the consumer's fetch number; block and slot numbers index a
:class:`~kvtier.memory.BlockPool`; digests are the 64-bit block digests of
:mod:`kvtier.integrity` (0 when integrity checking is off).
"""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class JobDone:
    """Report the result of store or load job ``job_id`` to the engine (exactly once per job).

    For a store job, success or failure both mean the engine may release the job's blocks.
    For a load job, ``ok`` means the slots hold the blocks; failure means they hold nothing
    useful and no write into them can still land.
    """

    job_id: int
    ok: bool
    reason: str | None = None


@attrs.frozen(slots=True)
class SendBlocks:
    """Producer: hand ``blocks`` (pool block numbers, in the fetch's key order) with their parked
    ``digests`` to the data plane for ``peer`` (``slots``: the consumer's destination slots, for
    one-sided planes).  Feed ``transfer_released`` once the plane moved every block and holds no
    reference to them, or ``transfer_failed`` if it failed (references dropped)."""

    peer: str
    kv_request_id: str
    round: int
    blocks: tuple[int, ...]
    gen: int = 0
    digests: tuple[int, ...] = ()
    slots: tuple[int, ...] = ()


@attrs.frozen(slots=True)
class CancelTransfer:
    """Producer: ask the data plane to stop this transfer (post nothing more); feed
    ``transfer_released`` once it holds no reference to the blocks."""

    peer: str
    kv_request_id: str
    round: int


@attrs.frozen(slots=True)
class SendTransferDone:
    """Producer: send ``transfer_done(kv_request_id, round, ok, reason)`` to ``peer``."""

    peer: str
    kv_request_id: str
    round: int
    ok: bool
    reason: str | None = None
    gen: int = 0


@attrs.frozen(slots=True)
class SendAbortAck:
    """Producer: send ``abort_ack(kv_request_id, round)`` to ``peer``."""

    peer: str
    kv_request_id: str
    round: int
    gen: int = 0


@attrs.frozen(slots=True)
class SendFetch:
    """Consumer: send ``fetch(kv_request_id, round, keys, slots)`` to ``peer``."""

    peer: str
    kv_request_id: str
    round: int
    keys: tuple[bytes, ...]
    gen: int = 0
    slots: tuple[int, ...] = ()


@attrs.frozen(slots=True)
class LandBlocks:
    """Consumer: land blocks ``first..first+count-1`` of the load's round in ``slots`` (zmq plane:
    copy the payload frames of the block_data being processed; one-sided planes: the producer
    already wrote them) and check them against the digests the block_data carried; then feed
    ``blocks_landed`` with the outcome.  Only ever emitted for a load in ``in_flight``."""

    peer: str
    kv_request_id: str
    round: int
    first: int
    count: int
    slots: tuple[int, ...]


@attrs.frozen(slots=True)
class SendReceipt:
    """Consumer: send ``receipt(kv_request_id, round)``: every block landed and matched."""

    peer: str
    kv_request_id: str
    round: int
    gen: int = 0


@attrs.frozen(slots=True)
class RevokeAccess:
    """Consumer: make sure the producer ``peer`` can no longer write into this load's slots
    (receiver-applied planes: nothing to do; one-sided planes: drop the producer's access), then
    feed ``access_revoked``."""

    peer: str
    kv_request_id: str
    round: int


@attrs.frozen(slots=True)
class SendAbortFetch:
    """Consumer: send ``abort_fetch(kv_request_id, round, fetched)`` to ``peer``."""

    peer: str
    kv_request_id: str
    round: int
    gen: int = 0
    fetched: bool = True


@attrs.frozen(slots=True)
class OpenConnection:
    """Session: open a transport connection to ``peer`` (a ``host:port``), then feed
    ``transport_up``."""

    peer: str


@attrs.frozen(slots=True)
class CloseConnection:
    """Session: close the transport connection to ``peer`` (if we own one)."""

    peer: str


@attrs.frozen(slots=True)
class SendHello:
    """Session: send our hello, tagged with this session's generation ``gen``."""

    peer: str
    gen: int


@attrs.frozen(slots=True)
class SendHelloAck:
    """Session: accept the peer's hello; ``gen`` is the peer's generation we now serve."""

    peer: str
    gen: int


@attrs.frozen(slots=True)
class SendHelloReject:
    """Session: refuse the peer's hello; names the first mismatching field and both values."""

    peer: str
    gen: int
    reason: str
    field: str
    ours: str
    theirs: str


@attrs.frozen(slots=True)
class SendDisconnect:
    """Session: tell ``peer`` the session is over."""

    peer: str
    gen: int
    reason: str


@attrs.frozen(slots=True)
class PeerDown:
    """Session: the session with ``peer`` died (informational; the core already told every
    record bound to it)."""

    peer: str
    reason: str


@attrs.frozen(slots=True)
class Ignored:
    """An input dropped by an ignore rule or a duplicate/stale note; for metrics and rate-limited
    logs only."""

    machine: str
    key: str
    state: str
    event: str
    reason: str


Effect = (
    JobDone
    | SendBlocks
    | CancelTransfer
    | SendTransferDone
    | SendAbortAck
    | SendFetch
    | LandBlocks
    | SendReceipt
    | RevokeAccess
    | SendAbortFetch
    | OpenConnection
    | CloseConnection
    | SendHello
    | SendHelloAck
    | SendHelloReject
    | SendDisconnect
    | PeerDown
    | Ignored
)
