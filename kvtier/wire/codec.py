"""Encode and decode kvtier wire messages to and from zmq multipart frames.

Framing: frame 0 is the msgpack header (one :data:`~kvtier.wire.messages.Message`). Frames 1..n
are raw payloads. Only ``block_data`` has payloads: exactly ``count`` frames of exactly
``block_bytes`` bytes each on the zmq data plane, or none at all on a one-sided plane (the blocks
were written into the consumer's slots; the data plane that lands them checks which it expects).
Every other message has none.

:func:`decode` raises only :class:`WireError`, whatever the bytes, and checks in this order:
1. frame shape (at least one frame, each one a contiguous buffer) → ``malformed``
2. header size <= ``max_message_bytes``, before any parsing → ``oversize``
3. msgpack + schema + ``__post_init__`` field rules → ``malformed`` / ``unknown_type`` /
   ``version_mismatch`` / ``bad_field``
4. configured counts (fetch keys, block_data ``first + count``) → ``oversize``
5. payload frames: count and size → ``bad_payload``

No pickle anywhere. Pure: no sockets. It accepts ``bytes``, ``bytearray``, ``memoryview``, and
zmq ``Frame`` (or anything else with the buffer protocol or a ``.buffer`` memoryview) without
importing zmq.
"""

from __future__ import annotations

import enum

import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs
import msgspec

from kvtier.errors import KvTierError
from kvtier.wire.messages import (
    KV_REQUEST_ID_RE,
    BuiltBlockData,
    MAX_ID_CHARS,
    MAX_U63,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    BlockData,
    Fetch,
    Message,
    Probe,
    ProbeReply,
)

__all__ = [
    "PROTOCOL_VERSION",  # re-exported for callers that only import the codec
    "WireReason",
    "WIRE_REASON_DOCS",
    "WireError",
    "WireLimits",
    "DEFAULT_LIMITS",
    "Decoder",
    "encode",
    "encode_frames",
    "decode",
]

# -- reason codes ---------------------------------------------------------------------------------


class WireReason(enum.StrEnum):
    """Why a message was refused by the codec (stable on the wire: the ``reason`` of an
    ``error`` reply, and a metric label)."""

    MALFORMED = "malformed"
    UNKNOWN_TYPE = "unknown_type"
    OVERSIZE = "oversize"
    BAD_FIELD = "bad_field"
    BAD_PAYLOAD = "bad_payload"
    VERSION_MISMATCH = "version_mismatch"


#: What each :class:`WireReason` means (docs/troubleshooting.md renders its table from it).
WIRE_REASON_DOCS: dict[WireReason, str] = {
    WireReason.MALFORMED: "Not a kvtier header: bad msgpack, not a map, no string `type`, frames not buffers.",
    WireReason.UNKNOWN_TYPE: "A well-formed map whose `type` names no known message.",
    WireReason.OVERSIZE: "Header larger than `max_message_bytes`, or a count beyond `max_blocks_per_fetch`.",
    WireReason.BAD_FIELD: "A known message with a missing, unknown, mistyped or out-of-range field.",
    WireReason.BAD_PAYLOAD: "Wrong number or size of payload frames for the message.",
    WireReason.VERSION_MISMATCH: "A `hello` whose `version` differs from the protocol version this kvtier speaks.",
}


class WireError(KvTierError):
    """A peer sent something that is not a valid kvtier message.

    The caller counts it and answers with an ``error`` message or drops it. It never ends the
    session for other requests.

    Attributes:
        reason: one of :class:`WireReason` (a ``str`` enum; distinct from the lifecycle's
            :class:`kvtier.lifecycle.Reason`, the codes a request or session ends with).
        detail: human-readable explanation, at most 512 chars (safe to echo in ``Error.detail``).
        kv_request_id: the message's ``kv_request_id`` if it could be read and is valid, else
            ``""``. Lets the receiver fail just that request.
        msg_type: the ``type`` tag if it could be read and is known, else ``""``.
        field: the offending field's name when known (``bad_field``), else ``""``.
        theirs: for ``version_mismatch``, the peer's version as a string, else ``""``.
        gen: the sender's ``gen`` if it could be read and is a valid u63, else ``None``. With
            ``theirs`` it lets a producer answer a version mismatch with a proper
            ``hello_reject`` rather than an ``error``.
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        kv_request_id: str = "",
        *,
        msg_type: str = "",
        field: str = "",
        theirs: str = "",
        gen: int | None = None,
    ) -> None:
        detail = detail[:512]
        super().__init__(f"{reason}: {detail}")
        self.reason = WireReason(reason)
        self.detail = detail
        self.kv_request_id = kv_request_id
        self.msg_type = msg_type
        self.field = field
        self.theirs = theirs
        self.gen = gen


# -- limits ---------------------------------------------------------------------------------------


def _positive_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


@attrs.frozen(kw_only=True)
class WireLimits:
    """Receiver-side limits, set from configuration. Senders must stay inside the peer's."""

    max_message_bytes: int = attrs.field(default=1 << 20, validator=_positive_int)
    """Largest header frame accepted, in bytes (payload frames are not counted)."""
    max_blocks_per_fetch: int = attrs.field(default=65536, validator=_positive_int)
    """Most keys in one ``fetch``. Also bounds ``block_data.first + count``."""


DEFAULT_LIMITS: Final = WireLimits()

# -- encode ---------------------------------------------------------------------------------------

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(Message)
# and the block_data headers our core builds (encoded as BlockData: a peer decodes one)
_MESSAGE_CLASSES: Final = frozenset((*MESSAGE_TYPES.values(), BuiltBlockData))


def encode(msg: Message) -> bytes:
    """Encode a message's header frame.

    Returns:
        msgpack bytes.

    Raises:
        TypeError: ``msg`` is not a kvtier message.
    """
    if type(msg) not in _MESSAGE_CLASSES:
        raise TypeError(f"not a kvtier wire message: {type(msg).__name__}")
    return _encoder.encode(msg)


def encode_frames(msg: Message, payloads: Iterable[Any] = ()) -> list[Any]:
    """Build the multipart frame list ``[header, *payloads]`` for a transport send.

    Payload objects are passed through untouched, with no copy, so zero-copy sends keep working.
    Their sizes are the sender's responsibility (the receiver checks ``block_bytes``).

    Raises:
        ValueError: payload count does not match: ``block_data`` needs exactly ``count`` payloads,
            every other message needs none.
        TypeError: ``msg`` is not a kvtier message.
    """
    frames: list[Any] = [encode(msg)]
    frames.extend(payloads)
    n = len(frames) - 1
    if isinstance(msg, BlockData):
        if n and n != msg.count:
            raise ValueError(f"block_data count={msg.count} but {n} payloads given")
    elif n:
        raise ValueError(f"{msg.TYPE} carries no payloads, got {n}")
    return frames

# -- decode ---------------------------------------------------------------------------------------


def _as_buffer(frame: Any, index: int) -> memoryview:
    """A flat byte memoryview over one frame, without copying."""
    try:
        mv = frame if isinstance(frame, memoryview) else memoryview(frame)
    except TypeError:
        buf = getattr(frame, "buffer", None)  # zmq.Frame-like objects
        if not isinstance(buf, memoryview):
            raise WireError(
                WireReason.MALFORMED, f"frame {index} is not a buffer ({type(frame).__name__})"
            ) from None
        mv = buf
    if not mv.c_contiguous:
        raise WireError(WireReason.MALFORMED, f"frame {index} is not contiguous")
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


class Decoder:
    """A reusable decoder bound to one set of limits and one ``block_bytes``.

    Args:
        limits: receiver limits (header size, blocks per fetch).
        block_bytes: payload frame size this receiver expects for ``block_data``. ``None``
            means this side never accepts block payloads (a producer): every ``block_data`` is
            then rejected with ``bad_payload``.

    Raises:
        ValueError: ``block_bytes`` is not ``None`` or an int >= 1.
    """

    __slots__ = ("limits", "block_bytes")

    def __init__(self, *, limits: WireLimits = DEFAULT_LIMITS, block_bytes: int | None = None):
        if block_bytes is not None and (
            isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < 1
        ):
            raise ValueError(f"block_bytes must be None or an int >= 1, got {block_bytes!r}")
        if not isinstance(limits, WireLimits):
            raise TypeError(f"limits must be WireLimits, got {type(limits).__name__}")
        self.limits = limits
        self.block_bytes = block_bytes

    def decode(self, frames: Sequence[Any]) -> tuple[Message, list[memoryview]]:
        """Decode one multipart message.

        Args:
            frames: ``[header, *payloads]`` as bytes, memoryview, or zmq Frame buffers.

        Returns:
            ``(message, payloads)``. The payloads are flat ``memoryview`` objects aliasing the
            input frames (no copy), in order: one per block for ``block_data``, else ``[]``.

        Raises:
            WireError: always and only, for anything invalid (see the module docstring).
        """
        try:
            return self._decode(frames)
        except WireError:
            raise
        except Exception as exc:  # defence in depth: a decoder bug must not escape as a crash
            raise WireError(WireReason.MALFORMED, f"undecodable: {type(exc).__name__}: {exc}") from None

    def _decode(self, frames: Sequence[Any]) -> tuple[Message, list[memoryview]]:
        if isinstance(frames, (bytes, bytearray, memoryview, str)):
            raise WireError(WireReason.MALFORMED, "frames must be a list of frames, not one buffer")
        frames = list(frames)
        if not frames:
            raise WireError(WireReason.MALFORMED, "no frames")
        header = _as_buffer(frames[0], 0)
        # Size first: msgspec never builds a message from a header larger than the limit.  Only
        # its id is read, by the probe (bounded: PROBE_MAX_BYTES), so the reply names the request
        # and its sender fails that load at once, not at its deadline (decision I36).
        if header.nbytes > self.limits.max_message_bytes:
            probe = _probe(header)
            rid, gen = _ids(probe) if probe is not None else ("", None)
            raise WireError(
                WireReason.OVERSIZE,
                f"header is {header.nbytes} bytes > max_message_bytes "
                f"{self.limits.max_message_bytes}",
                rid,
                gen=gen,
            )
        try:
            msg = _decoder.decode(header)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise _classify(header, exc) from None
        payloads = [_as_buffer(f, i) for i, f in enumerate(frames[1:], start=1)]
        self._check_limits(msg)
        self._check_payloads(msg, payloads)
        return msg, payloads

    def _check_limits(self, msg: Message) -> None:
        cap = self.limits.max_blocks_per_fetch
        if isinstance(msg, (Fetch, Probe, ProbeReply)) and len(msg.keys) > cap:
            raise WireError(
                WireReason.OVERSIZE,
                f"{msg.TYPE} has {len(msg.keys)} keys > max_blocks_per_fetch {cap}",
                msg.kv_request_id,
                msg_type=msg.TYPE,
                field="keys",
                gen=msg.gen,
            )
        if isinstance(msg, BlockData) and msg.first + msg.count > cap:
            raise WireError(
                WireReason.OVERSIZE,
                f"block_data first+count={msg.first + msg.count} > max_blocks_per_fetch {cap}",
                msg.kv_request_id,
                msg_type=msg.TYPE,
                field="count",
                gen=msg.gen,
            )

    def _check_payloads(self, msg: Message, payloads: list[memoryview]) -> None:
        if not isinstance(msg, BlockData):
            if payloads:
                raise WireError(
                    WireReason.BAD_PAYLOAD,
                    f"{msg.TYPE} carries no payloads, got {len(payloads)} frames",
                    getattr(msg, "kv_request_id", ""),
                    msg_type=msg.TYPE,
                    gen=msg.gen,
                )
            return
        rid = msg.kv_request_id
        if self.block_bytes is None:
            raise WireError(
                WireReason.BAD_PAYLOAD,
                "this side does not accept block_data",
                rid,
                msg_type=msg.TYPE,
                gen=msg.gen,
            )
        if payloads and len(payloads) != msg.count:  # none: a one-sided plane wrote the blocks
            raise WireError(
                WireReason.BAD_PAYLOAD,
                f"block_data count={msg.count} but {len(payloads)} payload frames",
                rid,
                msg_type=msg.TYPE,
                gen=msg.gen,
            )
        for i, p in enumerate(payloads):
            if p.nbytes != self.block_bytes:
                raise WireError(
                    WireReason.BAD_PAYLOAD,
                    f"payload {i} is {p.nbytes} bytes, block_bytes is {self.block_bytes}",
                    rid,
                    msg_type=msg.TYPE,
                    gen=msg.gen,
                )


def decode(
    frames: Sequence[Any],
    *,
    block_bytes: int | None = None,
    limits: WireLimits = DEFAULT_LIMITS,
) -> tuple[Message, list[memoryview]]:
    """Decode one multipart message. A convenience wrapper over :meth:`Decoder.decode`.

    Raises:
        WireError: for anything invalid. ``ValueError`` only for a bad ``block_bytes`` argument
            (a local bug, not a peer's).
    """
    return Decoder(limits=limits, block_bytes=block_bytes).decode(frames)


# -- error classification (slow path only) --------------------------------------------------------

_PATH_RE: Final = re.compile(r"at `\$\.([A-Za-z_][A-Za-z0-9_]*)")
_UNKNOWN_FIELD_RE: Final = re.compile(r"unknown field `([^`]{0,64})`")
_MISSING_FIELD_RE: Final = re.compile(r"missing required field `([^`]{0,64})`")
_LEADING_NAME_RE: Final = re.compile(r"([a-z_]+)\b")


class _Probe(msgspec.Struct):
    """The few header fields an error reply needs. Decoding into it skips every other field
    without building objects for them (no lists of keys, no nested maps)."""

    type: Any = None
    gen: Any = None
    kv_request_id: Any = None
    version: Any = None


_probe_decoder: Final = msgspec.msgpack.Decoder(_Probe)

PROBE_MAX_BYTES: Final = 64 << 10
"""A rejected header up to this size is scanned once more, for its ``type``/``gen``/
``kv_request_id`` (so the reply can name the request). A larger one is classified from the
decoder's error alone: rejecting it costs one pass over its bytes, whatever it holds."""


def _probe(header: memoryview) -> _Probe | None:
    """The few fields an error reply needs, from a header of at most :data:`PROBE_MAX_BYTES`
    that is a msgpack map; else None."""
    if header.nbytes > PROBE_MAX_BYTES:
        return None
    try:
        return _probe_decoder.decode(header)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def _ids(probe: _Probe) -> tuple[str, int | None]:
    """The probed header's ``kv_request_id`` (``""`` unless valid) and ``gen`` (None unless a u63)."""
    rid = probe.kv_request_id if _valid_id(probe.kv_request_id) else ""
    return rid, probe.gen if type(probe.gen) is int and 0 <= probe.gen < MAX_U63 else None


def _classify(header: memoryview, exc: Exception) -> WireError:
    """Turn a msgspec failure into the most specific WireError, reading what we cheaply can."""
    text = str(exc)
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return WireError(WireReason.MALFORMED, f"not msgpack: {text}")
    if header.nbytes > PROBE_MAX_BYTES:
        return _classify_text(text)
    try:
        probe = _probe_decoder.decode(header)
    except msgspec.ValidationError:  # not a map (or a map with non-string keys)
        return WireError(WireReason.MALFORMED, "header is not a msgpack map with string keys")
    except msgspec.DecodeError as exc2:
        return WireError(WireReason.MALFORMED, f"not msgpack: {exc2}")
    tag = probe.type
    if not isinstance(tag, str):
        return WireError(WireReason.MALFORMED, "header has no string 'type'")
    rid, gen = _ids(probe)
    if tag not in MESSAGE_TYPES:
        return WireError(WireReason.UNKNOWN_TYPE, f"unknown message type {tag[:64]!r}", rid, gen=gen)
    # Check the version before any other field: a newer peer's hello may carry fields we do not
    # know, and it should get "version_mismatch", not "unknown field".
    if tag == "hello":
        version = probe.version
        if version != PROTOCOL_VERSION or type(version) is not int:
            return WireError(
                WireReason.VERSION_MISMATCH,
                f"peer protocol version {str(version)[:32]}, ours {PROTOCOL_VERSION}",
                msg_type=tag,
                field="version",
                theirs=str(version)[:32],
                gen=gen,
            )
    return WireError(WireReason.BAD_FIELD, f"{tag}: {text}", rid, msg_type=tag, field=_field_of(tag, text), gen=gen)


def _classify_text(text: str) -> WireError:
    """A big rejected header: msgspec's message says which tag failed, if it got that far.

    That message quotes the peer's own words (a tag's value, an unknown field's name: ``Object
    contains unknown field `...` ``), so each rule matches a whole message in msgspec's words,
    never a part of one a peer could have written."""
    m = re.fullmatch(r"Invalid value '([a-z_]{1,32})' - at `\$\.type`", text)
    if m and m.group(1) not in MESSAGE_TYPES:
        return WireError(WireReason.UNKNOWN_TYPE, f"unknown message type {m.group(1)!r}")
    if re.fullmatch(r"Expected `object`, got `\w+`", text):
        return WireError(WireReason.MALFORMED, "header is not a msgpack map")
    if re.fullmatch(r"Object missing required field `type`|(Expected `str`, got `\w+`|Invalid value '.*') - at `\$\.type`",
                    text, re.DOTALL):
        return WireError(WireReason.MALFORMED, "header has no string 'type'")
    return WireError(WireReason.BAD_FIELD, f"header: {text}")


def _field_of(tag: str, text: str) -> str:
    m = _PATH_RE.search(text) or _UNKNOWN_FIELD_RE.search(text) or _MISSING_FIELD_RE.search(text)
    if m:
        return m.group(1)
    # __post_init__ messages start with the field's name ("round must be ...").
    m = _LEADING_NAME_RE.match(text)
    if m and m.group(1) in MESSAGE_TYPES[tag].__struct_fields__:
        return m.group(1)
    return ""


def _valid_id(v: object) -> bool:
    return (
        isinstance(v, str)
        and 1 <= len(v) <= MAX_ID_CHARS
        and KV_REQUEST_ID_RE.fullmatch(v) is not None
    )
