"""Effects: what the lifecycle core asks the I/O shell to do, as small frozen records.

The core never performs I/O; every input method returns a list of these, in the order the shell
must carry them out.  Peers are transport identity strings; ``round`` is the consumer's fetch
number; block and slot numbers index a :class:`~kvtier.memory.BlockPool`.
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
    """Producer: send ``blocks`` (pool block numbers, in the fetch's key order) to ``peer`` as
    ``block_data`` messages, zero-copy; feed ``transfer_complete`` once every block is released
    by the transport, or ``transfer_failed`` if sending fails."""

    peer: str
    kv_request_id: str
    round: int
    blocks: tuple[int, ...]


@attrs.frozen(slots=True)
class CancelTransfer:
    """Producer: stop sending this transfer; feed ``transfer_released`` once the transport holds
    no reference to its blocks."""

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


@attrs.frozen(slots=True)
class SendAbortAck:
    """Producer: send ``abort_ack(kv_request_id, round)`` to ``peer``."""

    peer: str
    kv_request_id: str
    round: int


@attrs.frozen(slots=True)
class SendFetch:
    """Consumer: send ``fetch(kv_request_id, round, keys)`` to ``peer``."""

    peer: str
    kv_request_id: str
    round: int
    keys: tuple[bytes, ...]


@attrs.frozen(slots=True)
class WriteBlocks:
    """Consumer: copy the payload frames of the block_data being processed into ``slots``
    (one frame per slot, in order).  Only ever emitted for a load in ``in_flight``."""

    kv_request_id: str
    slots: tuple[int, ...]


@attrs.frozen(slots=True)
class SendAbortFetch:
    """Consumer: send ``abort_fetch(kv_request_id, round)`` to ``peer``."""

    peer: str
    kv_request_id: str
    round: int


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
    | WriteBlocks
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
