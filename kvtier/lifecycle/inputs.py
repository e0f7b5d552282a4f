"""Inputs: every fact the shell hands the core, as small frozen records (past tense).

:meth:`~kvtier.lifecycle.TierCore.handle` takes these one at a time; one table in the core maps each
input type to the code that applies it, and for :class:`Received` a second table maps the wire
message type to the machine event it becomes.  Four sources:

* the **engine** (through the manager's API): :class:`StoreSubmitted`, :class:`LoadAnnounced`, :class:`Dial`,
  :class:`LoadSubmitted`, :class:`ConsumerNamed`, :class:`RequestFinished`, the symmetric path's
  :class:`ProbeAnnounced`, :class:`KeyLookedUp`, :class:`ScheduleEnded` and, from a serve window,
  :class:`LookupAnswered`; and the operator's :class:`DrainStarted`, :class:`ShutdownStarted`,
  :class:`GraceEnded`;
* **peers**: :class:`Received` (a decoded wire message, with its payload frames) and
  :class:`Malformed` (a message that did not decode);
* the **transport**: :class:`ConnectionUp`, :class:`ConnectFailed`, :class:`ConnectionClosed`,
  :class:`SendFailed`;
* the **data plane**: :class:`TransferReleased`, :class:`AccessRevoked`, :class:`BlocksLanded`,
  :class:`PeerAttached`, :class:`AttachRefused`.

Time is not an input: every step is given ``now``, and deadlines fire inside the step (the
``input_before_deadline`` contract of :func:`~kvtier.lifecycle.driver.drive`).

msgspec Structs for the same reason as the effects (decision C3 in docs/decisions.md).
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvtier.lifecycle._table import Reason

__all__ = [
    "AccessRevoked",
    "AttachRefused",
    "PlaneFaulted",
    "BlocksLanded",
    "ConnectFailed",
    "ConnectionClosed",
    "ConnectionUp",
    "ConsumerNamed",
    "Dial",
    "DrainStarted",
    "GraceEnded",
    "Input",
    "PeerProgress",
    "JobSettled",
    "KeyLookedUp",
    "LoadAnnounced",
    "LoadSubmitted",
    "LookupAnswered",
    "Malformed",
    "PeerAttached",
    "ProbeAnnounced",
    "Received",
    "RequestFinished",
    "ScheduleEnded",
    "SendFailed",
    "ShutdownStarted",
    "StoreSubmitted",
    "TransferReleased",
]


class _Input(msgspec.Struct, frozen=True, gc=False):
    pass


# -- engine ---------------------------------------------------------------------------------------
class StoreSubmitted(_Input):
    """A store job: ``keys[i]`` is stored in pool block ``blocks[i]`` whose bytes had digest
    ``digests[i]`` when they were parked (``digests`` is empty when integrity checking is off);
    ``owner`` is the engine's request id (two requests may not park under one kv_request_id);
    ``consumer`` the principal the producer request named as the only consumer of the id."""

    kv_request_id: str
    owner: str
    job_id: int
    keys: tuple[bytes, ...]
    blocks: tuple[int, ...]
    digests: tuple[int, ...] = ()
    consumer: str | None = None
    life: str = ""
    """The pairing's life (the request's ``kv_transfer_params``; ``""``: none named)."""


class LoadAnnounced(_Input):
    """The engine announced a request that fetches ``kv_request_id`` from producer ``peer``
    (``host:port``); a session is dialled if none is live.  ``life``: the pairing's life."""

    kv_request_id: str
    peer: str
    life: str = ""


class Dial(_Input):
    """Open a session to producer ``peer`` (``host:port``) ahead of any request (a consumer that
    knows its prefill instances; tests).  Nothing happens if a session exists."""

    peer: str


class LoadSubmitted(_Input):
    """A load job: fetch ``keys`` into pool slots ``slots`` (same length, same order)."""

    kv_request_id: str
    job_id: int
    keys: tuple[bytes, ...]
    slots: tuple[int, ...]


class ConsumerNamed(_Input):
    """A producer request names ``consumer`` (a principal) as the only peer allowed to fetch,
    abort or otherwise touch ``kv_request_id`` (docs/security.md)."""

    kv_request_id: str
    consumer: str


class RequestFinished(_Input):
    """The engine finished the request that parks (``producer=True``) or loads
    ``kv_request_id``."""

    kv_request_id: str
    producer: bool
    life: str = ""


class ProbeAnnounced(_Input):
    """The engine announced a symmetric request (``remote_kv_source``): its blocks are probed for
    on peer ``peer`` (``host:port``) under ``kv_request_id``, which names only this consumer's
    probe/fetch exchange; a session is dialled if none is live."""

    kv_request_id: str
    peer: str


class KeyLookedUp(_Input):
    """The engine looked ``key`` up for the symmetric request ``kv_request_id``; the answer
    (:meth:`~kvtier.lifecycle.TierCore.probe_answers`) is read after the input."""

    kv_request_id: str
    key: bytes


class ScheduleEnded(_Input):
    """The engine step ended (vLLM's ``on_schedule_end``): keys looked up during the step leave in
    one probe per (peer, ``kv_request_id``).  ``keys``: the step's lookups, ``(kv_request_id, keys)``
    per symmetric request, each applied as a :class:`KeyLookedUp` first — except keys the request's
    probe holds while it collects, probes or offers, a no-op there (decision Y26)."""

    keys: tuple[tuple[str, tuple[bytes, ...]], ...] = ()


class LookupAnswered(_Input):
    """A serve window looked the keys of a ``LookUpBlocks`` up in the engine's tiers: ``found[i]``
    is in pool block ``blocks[i]``, all of them held by engine pin ``pin`` (None when nothing was
    found), ``pending`` keys are still on their way into the engine's primary tier, ``missing``
    keys are not held."""

    peer: str
    kv_request_id: str
    round: int
    found: tuple[bytes, ...] = ()
    blocks: tuple[int, ...] = ()
    pin: int | None = None
    pending: tuple[bytes, ...] = ()
    missing: tuple[bytes, ...] = ()


class JobSettled(_Input):
    """A job the engine handed over that no machine takes, reported like any other: a store of a
    local-only request (``ok``, reason ``local``), a load whose producer ``allowed_peers`` refused
    (``peer_not_allowed``), a job an adapter could not map (``job_refused``, ``bad_job`` …), or an
    engine input the core rejected after it was queued (the reject rule's reason).  The core
    answers ``JobDone(job_id, ok, reason)``: the façade never reports a result itself."""

    job_id: int
    ok: bool
    reason: Reason | None = None


class DrainStarted(_Input):
    """``drain_jobs()``: parked and awaiting ids end now (jobs fail ``drained``)."""


class ShutdownStarted(_Input):
    """``shutdown()`` began: no new work; work in flight may finish within the grace."""


class GraceEnded(_Input):
    """The shutdown grace is over: everything still live ends; every session says goodbye."""


# -- peers ----------------------------------------------------------------------------------------
class Received(_Input):
    """A decoded wire message ``msg`` from ``peer``, with the ``block_data`` payload frames
    (``payloads``) and, for a ``hello``, the peer's authenticated ``principal`` (CURVE; None when
    authentication is off).  ``after``: the shell's stamp — the message arrived after this time
    (when the shell last saw its inbound queue empty before the read that returned it); no
    deadline due at or after it may fire before this input is applied (decision I3)."""

    peer: str
    msg: Any
    payloads: tuple[Any, ...] = ()
    principal: str | None = None
    after: float = float("-inf")


class Malformed(_Input):
    """A message from ``peer`` that did not decode: ``reason`` is the wire error code
    (:class:`kvtier.wire.codec.WireReason`, a ``str`` enum), the rest what could be read of it."""

    peer: str
    reason: str
    detail: str = ""
    msg_type: str | None = None
    kv_request_id: str = ""
    gen: int | None = None
    theirs: str | None = None
    after: float = float("-inf")
    """Arrival stamp, as :attr:`Received.after`."""


# -- transport ------------------------------------------------------------------------------------
class ConnectionUp(_Input):
    """The transport has a connection object for dialled ``peer``; ``descriptor`` is the data
    plane's descriptor for this session (``b""``: the plane's one descriptor, ``HelloInput``'s)."""

    peer: str
    descriptor: bytes = b""


class ConnectFailed(_Input):
    """The dial to ``peer`` never connected: refused or unreachable, or (``timed_out``) no
    answer within ``connect_timeout_s``, or (``unresolved``) its host name did not resolve, or
    (``auth_failed``) its CURVE handshake failed; or the transport could not dial it (``detail``)."""

    peer: str
    detail: str = ""
    timed_out: bool = False
    not_allowed: bool = False
    """The address the name resolved to is one ``allowed_peers`` does not admit."""
    unresolved: bool = False
    """The producer's host name did not resolve (nothing was dialled)."""
    auth_failed: bool = False
    """The connection's CURVE handshake failed (only one side runs ``auth='curve'``, or a key is
    not the one expected)."""


class ConnectionClosed(_Input):
    """The transport saw ``peer``'s connection close or reset."""

    peer: str
    after: float = float("-inf")
    """Arrival stamp, as :attr:`Received.after` (a close is ordered after what the connection
    delivered before it)."""


class SendFailed(_Input):
    """The transport could not send to ``peer``."""

    peer: str


class PeerProgress(_Input):
    """Bytes from ``peer`` arrived on its connection, not yet a whole message (a large one still
    crossing a slow link): its side is alive, as a message would prove (decision T22)."""

    peer: str


# -- data plane -----------------------------------------------------------------------------------
class TransferReleased(_Input):
    """The plane holds no reference to the blocks of round ``round`` of ``kv_request_id`` any
    more: it moved every one (``failed`` False) or gave up.  ``kv_request_id`` is the transfer's
    plane key: the id for a PD transfer, :func:`~kvtier.lifecycle.serve.transfer_key` for a round
    served from the engine's tiers."""

    kv_request_id: str
    round: int
    failed: bool = False


class AccessRevoked(_Input):
    """The producer ``peer`` can no longer write into this manager's slots."""

    peer: str


class BlocksLanded(_Input):
    """The shell landed blocks ``first..first+count-1`` of round ``round`` of ``kv_request_id``
    from ``peer`` and checked them: ``ok`` False when one did not match its parked digest (or the
    payload did not fit the plane)."""

    peer: str
    kv_request_id: str
    round: int
    first: int
    count: int
    ok: bool
    reason: Reason | None = None


class PeerAttached(_Input):
    """The data plane took the descriptor of ``peer``'s session generation ``gen``."""

    peer: str
    gen: int


#: :class:`AttachRefused` detail: the peer's agent is still held by an earlier session of it here
STILL_HELD = "still_held"
#: :class:`AttachRefused` detail: the peer's descriptor names our own agent (a tier dialled itself)
SELF = "self"


class AttachRefused(_Input):
    """The data plane refused the descriptor of ``peer``'s session generation ``gen``
    (``detail`` :data:`STILL_HELD`: for now, an earlier session of that peer still holds its agent;
    :data:`SELF`: the descriptor names our own agent, the tier dialled itself)."""

    peer: str
    gen: int
    detail: str = ""


class PlaneFaulted(_Input):
    """The data plane's path to ``peer`` (its session generation ``gen``, as the plane took it
    with the descriptor) broke — NIXL: a remote disconnect at a post or a state check — so
    transfers to it fail until the peer is added anew.  The core ends the session
    (``plane_fault``); the next load dials afresh (decision I25)."""

    peer: str
    gen: int
    detail: str = ""


Input = (
    StoreSubmitted
    | LoadAnnounced
    | Dial
    | LoadSubmitted
    | ConsumerNamed
    | RequestFinished
    | ProbeAnnounced
    | KeyLookedUp
    | ScheduleEnded
    | LookupAnswered
    | JobSettled
    | DrainStarted
    | ShutdownStarted
    | GraceEnded
    | Received
    | Malformed
    | ConnectionUp
    | ConnectFailed
    | ConnectionClosed
    | SendFailed
    | TransferReleased
    | AccessRevoked
    | BlocksLanded
    | PeerAttached
    | AttachRefused
    | PlaneFaulted
)
