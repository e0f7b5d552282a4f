"""kvtier wire messages: frozen msgspec Structs, one tagged union on ``type``.

Each class is one row of the message table in docs/protocol.md. The header frame is a msgpack map
``{"type": <tag>, <field>: <value>, ...}``. KV bytes never go inside it; ``block_data`` is followed
by raw payload frames (see :mod:`kvtier.wire.codec`).

Validation that needs no configuration runs in ``__post_init__``. msgspec calls it on
construction *and* after decoding, so a message object that exists is well-formed on both sides:
- every int is an ``int`` (never ``bool``) in ``[0, 2**63)``
- floats are finite
- ``kv_request_id`` is 1..256 chars of ``[A-Za-z0-9._:/@+=-]``
- keys are 1..256 bytes each and unique
- text fields are bounded (:data:`MAX_TEXT_CHARS`, :data:`MAX_LONG_TEXT_CHARS`)
- ``hello.version == PROTOCOL_VERSION``
On construction these raise ``ValueError`` or ``TypeError``. On decode msgspec turns them into
``ValidationError``, which the codec maps to :class:`~kvtier.wire.codec.WireError`. Limits that
depend on configuration (header size, blocks per fetch, ``block_bytes``) are checked by the codec.

This module is pure: no sockets, no torch, no zmq.
"""

from __future__ import annotations

import math
import re
from typing import ClassVar, Final, Union

import msgspec

PROTOCOL_VERSION: Final = 3
"""Bumped on any incompatible change to a message's fields, meaning or channel (3: lives, watermarks,
notices, ``replaces``, the NIXL plane's ``block_data`` as its WRITE's notification, and the
symmetric path's ``probe``, ``probe_reply`` and ``offered``; docs/protocol.md)."""

MAX_U63: Final = 2**63
"""Exclusive upper bound of every integer field. Ints must fit a signed 64-bit value everywhere."""

MAX_ID_CHARS: Final = 256
"""Longest ``kv_request_id`` (characters)."""

MAX_KEY_BYTES: Final = 256
"""Longest block key (bytes)."""

MAX_TEXT_CHARS: Final = 256
"""Longest short text field: reason codes, ``instance``, ``field``."""

MAX_LONG_TEXT_CHARS: Final = 4096
"""Longest free-form text field: ``layout``, ``hash_seed``, ``ours``/``theirs``, ``detail``."""

MAX_LIFE_CHARS: Final = 64
"""Longest ``life`` (characters): an opaque per-pairing id, e.g. a router's request uuid."""

MAX_DESCRIPTOR_BYTES: Final = 65536
"""Longest data-plane descriptor in ``hello``/``hello_ack`` (NIXL agent metadata is ~0.5-4 KiB)."""

KV_REQUEST_ID_RE: Final = re.compile(r"[A-Za-z0-9._:/@+=\-]+")
"""Allowed ``kv_request_id`` characters (matched with ``fullmatch``; ASCII only)."""


# -- field checks (shared by __post_init__ of every message) --------------------------------------


def _u63(name: str, v: object) -> None:
    # type() rather than isinstance(): bool is an int subclass and must not pass as 0/1.
    if type(v) is not int:
        raise TypeError(f"{name} must be int, got {type(v).__name__}")
    if not 0 <= v < MAX_U63:
        raise ValueError(f"{name} must be in [0, 2**63), got {v}")


def _flag(name: str, v: object) -> None:
    if type(v) is not bool:
        raise TypeError(f"{name} must be bool, got {type(v).__name__}")


def _finite(name: str, v: object) -> None:
    if type(v) not in (float, int):  # excludes bool
        raise TypeError(f"{name} must be float, got {type(v).__name__}")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v!r}")


def _text(name: str, v: object, max_chars: int, *, min_chars: int = 0) -> None:
    if type(v) is not str:
        raise TypeError(f"{name} must be str, got {type(v).__name__}")
    if not min_chars <= len(v) <= max_chars:
        raise ValueError(f"{name} must be {min_chars}..{max_chars} chars, got {len(v)}")


def _kv_request_id(v: object, *, allow_empty: bool = False) -> None:
    if allow_empty and v == "":
        return
    _text("kv_request_id", v, MAX_ID_CHARS, min_chars=1)
    if not KV_REQUEST_ID_RE.fullmatch(v):  # type: ignore[arg-type]
        raise ValueError(f"kv_request_id has characters outside [A-Za-z0-9._:/@+=-]: {v!r:.80}")


def check_kv_request_id(v: object) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``v`` is a valid ``kv_request_id``: a ``str`` of
    1..256 characters from ``[A-Za-z0-9._:/@+=-]`` (the rule every wire message enforces)."""
    _kv_request_id(v)


def _life(v: object) -> None:
    if type(v) is not str:
        raise TypeError(f"life must be str, got {type(v).__name__}")
    if len(v) > MAX_LIFE_CHARS or (v and not KV_REQUEST_ID_RE.fullmatch(v)):
        raise ValueError(f"life must be 0..{MAX_LIFE_CHARS} chars of [A-Za-z0-9._:/@+=-], got {v!r:.80}")


def check_life(v: object) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``v`` is a valid ``life``: a ``str`` of at most
    64 characters from ``[A-Za-z0-9._:/@+=-]`` (empty: the pairing names no life)."""
    _life(v)


def _keys(v: object) -> None:
    if type(v) is not list:
        raise TypeError(f"keys must be list, got {type(v).__name__}")
    for i, k in enumerate(v):  # an empty list is a valid fetch: "I need none of the blocks"
        if type(k) is not bytes:
            raise TypeError(f"keys[{i}] must be bytes, got {type(k).__name__}")
        if not 1 <= len(k) <= MAX_KEY_BYTES:
            raise ValueError(f"keys[{i}] must be 1..{MAX_KEY_BYTES} bytes, got {len(k)}")
    if len(set(v)) != len(v):
        seen: set[bytes] = set()
        for i, k in enumerate(v):
            if k in seen:
                raise ValueError(f"keys[{i}] duplicates an earlier key {k.hex()[:32]}")
            seen.add(k)


def _u63_list(name: str, v: object) -> None:
    if type(v) is not list:
        raise TypeError(f"{name} must be list, got {type(v).__name__}")
    for i, x in enumerate(v):
        if type(x) is not int or not 0 <= x < MAX_U63:
            raise ValueError(f"{name}[{i}] must be an int in [0, 2**63), got {x!r:.40}")


def _u64_list(name: str, v: object) -> None:
    if type(v) is not list:
        raise TypeError(f"{name} must be list, got {type(v).__name__}")
    for i, x in enumerate(v):
        if type(x) is not int or not 0 <= x < 2**64:
            raise ValueError(f"{name}[{i}] must be an int in [0, 2**64), got {x!r:.40}")


def _blob(name: str, v: object, max_bytes: int) -> None:
    if type(v) is not bytes:
        raise TypeError(f"{name} must be bytes, got {type(v).__name__}")
    if len(v) > max_bytes:
        raise ValueError(f"{name} must be at most {max_bytes} bytes, got {len(v)}")


# -- messages -------------------------------------------------------------------------------------


class _Msg(
    msgspec.Struct,
    frozen=True,
    forbid_unknown_fields=True,
    tag_field="type",
    kw_only=True,
):
    """Common config. Every message declares ``gen`` first: the session generation nonce (u63),
    picked by the dialling side for its ``hello`` and stamped by both sides on every message of
    that session, so a receiver can drop messages from an earlier incarnation of the peer.
    ``0`` is used where no session exists (e.g. ``disconnect`` answering an unknown peer)."""

    TYPE: ClassVar[str]


class Hello(_Msg, tag="hello"):
    """consumer→producer: open a session; every field must equal the producer's (``instance``,
    ``descriptor`` and ``replaces`` excepted); ``descriptor`` (≤ 64 KiB) is what a one-sided producer
    needs to write into our slots (NIXL: this session's window of our pool; empty on zmq); ``replaces``
    the generation of our previous session to this address (0: none), which the producer ends first."""

    TYPE: ClassVar[str] = "hello"
    gen: int
    version: int
    instance: str
    block_bytes: int
    layout: str
    hash_seed: str
    data_plane: str = "zmq"
    digest: str = "xxh3_64"
    descriptor: bytes = b""
    replaces: int = 0
    """The generation of the sender's previous session to this address (0: none): a producer
    still holding an inbound session of that generation from the same instance ends it
    (``peer_restarted``) before admitting this one (decision N14)."""

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _u63("replaces", self.replaces)
        _u63("version", self.version)
        if self.version != PROTOCOL_VERSION:
            raise ValueError(f"version {self.version} != {PROTOCOL_VERSION}")
        _text("instance", self.instance, MAX_TEXT_CHARS, min_chars=1)
        _u63("block_bytes", self.block_bytes)
        if self.block_bytes == 0:
            raise ValueError("block_bytes must be >= 1")
        _text("layout", self.layout, MAX_LONG_TEXT_CHARS)
        _text("hash_seed", self.hash_seed, MAX_LONG_TEXT_CHARS)
        _text("data_plane", self.data_plane, MAX_TEXT_CHARS, min_chars=1)
        _text("digest", self.digest, MAX_TEXT_CHARS, min_chars=1)
        _blob("descriptor", self.descriptor, MAX_DESCRIPTOR_BYTES)


class HelloAck(_Msg, tag="hello_ack"):
    """producer→consumer: session accepted; ``instance`` names the producer instance (sessions to one
    instance share fate); ``descriptor``: the producer's data-plane descriptor."""

    TYPE: ClassVar[str] = "hello_ack"
    gen: int
    instance: str
    descriptor: bytes = b""

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _text("instance", self.instance, MAX_TEXT_CHARS, min_chars=1)
        _blob("descriptor", self.descriptor, MAX_DESCRIPTOR_BYTES)


class HelloReject(_Msg, tag="hello_reject"):
    """producer→consumer: session refused: ``reason`` is ``handshake_mismatch``, ``too_many_peers``,
    ``session_still_held`` (for now: an earlier session of the consumer still holds its agent) or
    ``self_fetch`` (the consumer is the producer itself, and its plane cannot load from itself); ``field``
    names the first mismatch; ``ours`` and ``theirs`` are empty for ``hash_seed``; for a refused
    ``descriptor`` ``ours`` is ``still_held``, ``self`` (it names the producer's own agent: a tier
    that dialled itself) or empty."""

    TYPE: ClassVar[str] = "hello_reject"
    gen: int
    reason: str
    field: str
    ours: str
    theirs: str

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _text("reason", self.reason, MAX_TEXT_CHARS, min_chars=1)
        _text("field", self.field, MAX_TEXT_CHARS)
        _text("ours", self.ours, MAX_LONG_TEXT_CHARS)
        _text("theirs", self.theirs, MAX_LONG_TEXT_CHARS)


class Fetch(_Msg, tag="fetch"):
    """consumer→producer: send these blocks, in this order, for this round; ``slots`` (one per key) are
    our destination slots, for one-sided planes (empty on zmq); ``offered``: false fetches the blocks
    parked under ``kv_request_id`` (PD), true the blocks this round's ``probe_reply`` offered
    (symmetric; a key not offered is refused ``not_offered``, and an offered fetch never reaches parked
    PD blocks); ``low`` (PD) the lowest round we still have open on this session: a fetch below it, or
    of a round already answered, is dropped unbound. At most ``max_blocks_per_fetch`` keys (checked by
    the codec)."""

    TYPE: ClassVar[str] = "fetch"
    gen: int
    kv_request_id: str
    round: int
    keys: list[bytes]
    slots: list[int] = []
    life: str = ""
    """The pairing's life, as both legs' ``kv_transfer_params`` name it (empty: none named)."""
    low: int = 0
    """The lowest round the consumer still has open on this session (decision I11): a fetch of
    a round below it, or of a round the producer already answered, is refused unbound."""
    offered: bool = False
    """True: the blocks a ``probe_reply`` of this round offered (served from the producer's engine
    tiers, the symmetric path); False: the blocks parked under ``kv_request_id`` (PD)."""

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _kv_request_id(self.kv_request_id)
        _u63("round", self.round)
        _life(self.life)
        _u63("low", self.low)
        _keys(self.keys)
        _u63_list("slots", self.slots)
        if self.slots and len(self.slots) != len(self.keys):
            raise ValueError(f"slots has {len(self.slots)} entries for {len(self.keys)} keys")
        _flag("offered", self.offered)


class BlockData(_Msg, tag="block_data"):
    """producer→consumer: blocks for key indexes ``first .. first+count-1`` of that fetch, with the
    XXH3-64 digest of each taken when the producer parked it (empty with ``digest="none"``); on a
    one-sided plane sent once those blocks' WRITE completed. On the zmq plane it is followed by exactly
    ``count`` payload frames of ``block_bytes`` each; on a one-sided plane by none (the data plane
    already wrote the blocks into the fetch's slots)."""

    TYPE: ClassVar[str] = "block_data"
    gen: int
    kv_request_id: str
    round: int
    first: int
    count: int
    digests: list[int] = []
    life: str = ""

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _kv_request_id(self.kv_request_id)
        _u63("round", self.round)
        _life(self.life)
        _u63("first", self.first)
        _u63("count", self.count)
        if self.count == 0:
            raise ValueError("count must be >= 1")
        _u64_list("digests", self.digests)
        if self.digests and len(self.digests) != self.count:
            raise ValueError(f"digests has {len(self.digests)} entries for count={self.count}")


class BuiltBlockData(BlockData):
    """A ``block_data`` header our own core built (:mod:`kvtier.lifecycle.batches`) from values it
    had already checked — the session's generation, a checked ``kv_request_id`` and round, the
    digests it took.  Encoded exactly as :class:`BlockData` (a peer decodes a ``BlockData``); only
    its construction skips the checks a decoded header gets, which cost more than the rest of a
    1-block transfer's start in the core (P4)."""

    def __post_init__(self) -> None:
        return


class TransferDone(_Msg, tag="transfer_done"):
    """producer→consumer: the round is over (``ok=false`` carries a lifecycle reason code); a terminal
    answer is sent only once the producer's data plane holds no reference to the round's blocks, so no
    write can land after it. ``final=false`` (with ``ok=false``): a *notice* that the producer gave the
    transfer up and why, sent at once; the terminal answer follows."""

    TYPE: ClassVar[str] = "transfer_done"
    gen: int
    kv_request_id: str
    round: int
    ok: bool
    reason: str
    life: str = ""
    final: bool = True

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _kv_request_id(self.kv_request_id)
        _u63("round", self.round)
        _flag("ok", self.ok)
        _text("reason", self.reason, MAX_TEXT_CHARS)
        _life(self.life)
        _flag("final", self.final)
        if self.ok and not self.final:
            raise ValueError("a notice (final=false) cannot say ok")


class AbortFetch(_Msg, tag="abort_fetch"):
    """consumer→producer: stop this round; ``fetched`` says whether the round sent a fetch (an abort of
    a fetched round concerns only the binding that fetch made, never a later life of a reused id);
    ``offered`` names a symmetric round: with ``fetched=false`` the producer releases the round's pins
    at once (answered ``abort_ack``). Applied while the producer's session is still ``attaching`` too,
    like a ``fetch`` naming no keys (decision I24); a repeated abort is acknowledged again and counted
    (I27)"""

    TYPE: ClassVar[str] = "abort_fetch"
    gen: int
    kv_request_id: str
    round: int
    fetched: bool = True
    life: str = ""
    low: int = 0
    offered: bool = False
    """True: the round is a symmetric one (``probe``); with ``fetched=false`` the producer releases
    the round's pins at once."""

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _kv_request_id(self.kv_request_id)
        _u63("round", self.round)
        _flag("fetched", self.fetched)
        _life(self.life)
        _u63("low", self.low)
        _flag("offered", self.offered)


class AbortAck(_Msg, tag="abort_ack"):
    """producer→consumer: no more blocks for this round will be sent or written (a terminal answer)"""

    TYPE: ClassVar[str] = "abort_ack"
    gen: int
    kv_request_id: str
    round: int
    life: str = ""

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _kv_request_id(self.kv_request_id)
        _u63("round", self.round)
        _life(self.life)


class Receipt(_Msg, tag="receipt"):
    """consumer→producer: every block of this round landed and matched its digest: only now may the
    producer report its store jobs succeeded."""

    TYPE: ClassVar[str] = "receipt"
    gen: int
    kv_request_id: str
    round: int
    life: str = ""

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _kv_request_id(self.kv_request_id)
        _u63("round", self.round)
        _life(self.life)


class Probe(_Msg, tag="probe"):
    """consumer→producer (symmetric path): which of these blocks does your engine hold? Pin
    those for this round. The round is this consumer's (a producer keys it by ``(peer, kv_request_id,
    round)``); a round may carry several probes (``serve_max_probes_per_round``)"""

    TYPE: ClassVar[str] = "probe"
    gen: int
    kv_request_id: str
    round: int
    keys: list[bytes]

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _kv_request_id(self.kv_request_id)
        _u63("round", self.round)
        _keys(self.keys)
        if not self.keys:
            raise ValueError("keys must name at least one key")


class ProbeReply(_Msg, tag="probe_reply"):
    """producer→consumer (symmetric path): one answer per key not answered yet, once none is pending in
    the engine: ``hit`` = pinned for this round until its fetch is terminal or the consumer releases
    it. A refusal (``not_serving``, ``serve_busy``, ``shutdown``) or a withdrawn offer
    (``offer_expired``, ``drained``) is a ``transfer_done(fail)`` of the round instead. Repeats the
    keys, so a reply is self-describing whatever probe of the round it answers."""

    TYPE: ClassVar[str] = "probe_reply"
    gen: int
    kv_request_id: str
    round: int
    keys: list[bytes]
    hits: list[bool]

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _kv_request_id(self.kv_request_id)
        _u63("round", self.round)
        _keys(self.keys)
        if type(self.hits) is not list:
            raise TypeError(f"hits must be list, got {type(self.hits).__name__}")
        for i, h in enumerate(self.hits):
            _flag(f"hits[{i}]", h)
        if len(self.hits) != len(self.keys):
            raise ValueError(f"hits has {len(self.hits)} entries for {len(self.keys)} keys")


class _Liveness(_Msg):
    """The liveness pair's one body: ``t`` is the pinging side's clock (seconds), echoed by the
    answer.  Two tags, because the session machine tells a ping (answer it) from a pong (only
    note the peer was heard) by type (decision C23)."""

    gen: int
    t: float

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _finite("t", self.t)


class Ping(_Liveness, tag="ping"):
    """either way: liveness probe; ``t`` is the sender's clock in seconds."""

    TYPE: ClassVar[str] = "ping"


class Pong(_Liveness, tag="pong"):
    """either way: answer to ``ping``, echoing ``t``."""

    TYPE: ClassVar[str] = "pong"


class Disconnect(_Msg, tag="disconnect"):
    """either way: the sender is ending the session; a reason that says why (``transfer_stalled``,
    ``abort_unacknowledged``, ``plane_fault``, …) ends the receiver's session with it, and the sender
    cuts the connection only once this goodbye had ``shutdown_grace_s`` to leave (decision I28)"""

    TYPE: ClassVar[str] = "disconnect"
    gen: int
    reason: str

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _text("reason", self.reason, MAX_TEXT_CHARS)


class Error(_Msg, tag="error"):
    """either way: answer to a message that could not be accepted; ``reason`` is a wire reason code;
    ``kv_request_id`` is ``""`` when it could not be read."""

    TYPE: ClassVar[str] = "error"
    gen: int
    reason: str
    detail: str
    kv_request_id: str

    def __post_init__(self) -> None:
        _u63("gen", self.gen)
        _text("reason", self.reason, MAX_TEXT_CHARS, min_chars=1)
        _text("detail", self.detail, MAX_LONG_TEXT_CHARS)
        _kv_request_id(self.kv_request_id, allow_empty=True)


_MESSAGES: Final = tuple(
    cls for cls in list(globals().values()) if isinstance(cls, type) and issubclass(cls, _Msg) and "TYPE" in vars(cls)
)
"""Every message class, in the order this module declares them: declaring a class here is the
whole of adding a message to the codec (the union below), to :mod:`kvtier.wire`'s names and to
docs/protocol.md's message table (``python -m tools docs``); its routing is its ``[wire.<tag>]``
row in spec/lifecycle.toml (decision C1)."""

Message = Union[_MESSAGES]  # type: ignore[valid-type]
"""Any kvtier wire message."""

MESSAGE_TYPES: Final[dict[str, type[_Msg]]] = {cls.TYPE: cls for cls in _MESSAGES}
"""Tag → class, for every message type."""

__all__ = [
    "BuiltBlockData",
    "PROTOCOL_VERSION",
    "MAX_U63",
    "MAX_ID_CHARS",
    "MAX_KEY_BYTES",
    "MAX_TEXT_CHARS",
    "MAX_LONG_TEXT_CHARS",
    "KV_REQUEST_ID_RE",
    *(cls.__name__ for cls in _MESSAGES),
    "Message",
    "MESSAGE_TYPES",
]
