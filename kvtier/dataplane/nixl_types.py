"""The values a NIXL agent speaks in: its errors, the descriptor a peer sends to be written into,
and the results :class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent` reports.

Pure data and validation, no NIXL call: a descriptor comes from the network, so it is checked
strictly here before anything of it reaches NIXL (docs/nixl.md).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final, Literal

import attrs
import msgspec

from kvtier.errors import KvTierError


# -- errors ---------------------------------------------------------------------------------------


class NixlError(KvTierError):
    """NIXL could not do what was asked (agent or backend creation, registration, a closed agent)."""


class NixlUnavailable(NixlError, ImportError):
    """No NIXL Python package can be imported."""


class BadDescriptor(NixlError, ValueError):
    """A peer's descriptor is malformed or unusable. The agent is left as it was."""


class LayoutMismatch(BadDescriptor):
    """A well-formed descriptor whose block layout differs from ours.

    Attributes:
        field: ``"block_bytes"`` or ``"layout"``.
        ours, theirs: the two values, as text.
    """

    def __init__(self, field: str, ours: object, theirs: object) -> None:
        super().__init__(f"peer's {field} {theirs!r} differs from ours {ours!r}")
        self.field = field
        self.ours = str(ours)
        self.theirs = str(theirs)


# NIXL's bindings raise one exception class per status. Matched by name so that the three
# packages' distinct classes all classify alike.
DISCONNECT: Final = "nixlRemoteDisconnectError"
NOT_FOUND: Final = "nixlNotFoundError"


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- the descriptor -------------------------------------------------------------------------------

DESCRIPTOR_VERSION: Final = 1
"""Bumped on any incompatible change to :class:`NixlDescriptor`."""

MAX_DESCRIPTOR_BYTES: Final = 256 * 1024
"""Largest encoded descriptor accepted, checked before parsing. One UCX agent's metadata with
one region measured 333–473 bytes; RDMA NICs add a few hundred bytes each."""

MAX_METADATA_BYTES: Final = MAX_DESCRIPTOR_BYTES - 4096
MAX_AGENT_CHARS: Final = 256
MAX_PEER_CHARS: Final = 256
MAX_NOTIF_BYTES: Final = 4096
"""Longest notification message :meth:`NixlBlockAgent.post_write` accepts (a tag, not a payload)."""

MAX_BLOCKS: Final = 2**31 - 1
"""NIXL takes block indices as int32."""

_NAME_RE: Final = re.compile(r"[A-Za-z0-9._:@+=\-]+")
_FINGERPRINT_RE: Final = re.compile(r"[0-9a-f]{16}")
# NIXL's serialised metadata starts with its serdes tag, then the "Agent" field: an 8-byte
# little-endian length and the agent name (nixl serdes.cpp). Read so that a descriptor cannot
# smuggle in metadata for an agent other than the one it names (NIXL would silently reload it).
_MD_PREFIX: Final = b"nixlSerDes|Agent"


def layout_fingerprint(block_bytes: int, layout: str) -> str:
    """16 hex chars identifying what a block holds: ``sha256("kvtier-nixl/1|<block_bytes>|<layout>")``.

    ``layout`` is the same free text kvtier's handshake compares (``Hello.layout``).
    """
    return hashlib.sha256(f"kvtier-nixl/1|{block_bytes}|{layout}".encode()).hexdigest()[:16]


def _check_int(name: str, v: object, lo: int, hi: int) -> None:
    if type(v) is not int:  # not bool
        raise TypeError(f"{name} must be int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")


def check_name(what: str, v: object, max_chars: int) -> None:
    if type(v) is not str:
        raise TypeError(f"{what} must be str, got {type(v).__name__}")
    if not 1 <= len(v) <= max_chars or not _NAME_RE.fullmatch(v):
        raise ValueError(f"{what} must be 1..{max_chars} chars of [A-Za-z0-9._:@+=-], got {v!r:.80}")


def metadata_agent(md: bytes) -> str:
    n = len(_MD_PREFIX)
    if not md.startswith(_MD_PREFIX) or len(md) < n + 8:
        raise ValueError("metadata is not NIXL agent metadata (no 'nixlSerDes|Agent' header)")
    size = int.from_bytes(md[n : n + 8], "little")
    end = n + 8 + size
    if not 1 <= size <= MAX_AGENT_CHARS or len(md) <= end or md[end : end + 1] != b"|":
        raise ValueError("metadata has a malformed agent name field")
    try:
        return md[n + 8 : end].decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("metadata's agent name is not ASCII") from None


class NixlDescriptor(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What a peer needs to WRITE into an agent's region (msgpack map on the wire).

    Fields:
        v: :data:`DESCRIPTOR_VERSION`.
        agent: the NIXL agent name; must equal the name inside ``metadata``.
        metadata: ``nixl_agent.get_agent_metadata()`` after the region was registered (bytes).
        base_addr: virtual address of block 0 in the owner's process.
        num_blocks: slots in the region, 1..2**31-1.
        block_bytes: bytes per block, >= 1.
        fingerprint: :func:`layout_fingerprint` of the owner's ``block_bytes`` and layout.

    Construction and decoding both validate types, ranges, lengths and that the region fits a
    64-bit address space (``ValueError`` / ``TypeError``; msgspec's ``ValidationError`` on decode).
    """

    v: int
    agent: str
    metadata: bytes
    base_addr: int
    num_blocks: int
    block_bytes: int
    fingerprint: str

    def __post_init__(self) -> None:
        _check_int("v", self.v, 0, 2**63 - 1)
        if self.v != DESCRIPTOR_VERSION:
            raise ValueError(f"descriptor version {self.v} != {DESCRIPTOR_VERSION}")
        check_name("agent", self.agent, MAX_AGENT_CHARS)
        if type(self.metadata) is not bytes:
            raise TypeError(f"metadata must be bytes, got {type(self.metadata).__name__}")
        if not 1 <= len(self.metadata) <= MAX_METADATA_BYTES:
            raise ValueError(f"metadata must be 1..{MAX_METADATA_BYTES} bytes, got {len(self.metadata)}")
        if metadata_agent(self.metadata) != self.agent:
            raise ValueError(f"metadata names agent {metadata_agent(self.metadata)!r}, not {self.agent!r}")
        _check_int("base_addr", self.base_addr, 1, 2**64 - 1)
        _check_int("num_blocks", self.num_blocks, 1, MAX_BLOCKS)
        _check_int("block_bytes", self.block_bytes, 1, 2**63 - 1)
        if self.base_addr + self.num_blocks * self.block_bytes > 2**64:
            raise ValueError("base_addr + num_blocks * block_bytes exceeds the 64-bit address space")
        if type(self.fingerprint) is not str or not _FINGERPRINT_RE.fullmatch(self.fingerprint):
            raise ValueError(f"fingerprint must be 16 lowercase hex chars, got {self.fingerprint!r:.40}")


_DECODER: Final = msgspec.msgpack.Decoder(NixlDescriptor)


def decode_descriptor(data: object) -> NixlDescriptor:
    """Parse and validate descriptor bytes received from a peer.

    Raises:
        BadDescriptor: not bytes-like, larger than :data:`MAX_DESCRIPTOR_BYTES`, not msgpack,
            wrong or missing fields, or a field out of range; the message names what was wrong.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadDescriptor(f"descriptor must be bytes, got {type(data).__name__}")
    if len(data) > MAX_DESCRIPTOR_BYTES:
        raise BadDescriptor(f"descriptor is {len(data)} bytes, more than {MAX_DESCRIPTOR_BYTES}")
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BadDescriptor(f"malformed NIXL descriptor: {e}") from None


# -- results --------------------------------------------------------------------------------------


@attrs.frozen
class XferResult:
    """The one outcome of a :meth:`~kvtier.dataplane.nixl_agent.NixlBlockAgent.post_write`.

    ``done``: every byte is in the peer's slots (NIXL reported ``DONE``).
    ``failed``: the WRITE ended without completing; ``detail`` says why. Nothing more of it will
    land, but some or all of its bytes may already have, so the slots hold garbage.
    """

    xfer_id: int
    peer: str
    status: Literal["done", "failed"]
    detail: str = ""


@attrs.frozen
class PeerFault:
    """A peer's data path is judged unusable (reported once, by :meth:`~kvtier.dataplane.nixl_agent.NixlBlockAgent.poll`).

    Later posts to it fail at once. The agent never repairs a peer: the caller removes it and
    adds it again from a fresh handshake (a restarted peer brings a new agent name).
    """

    peer: str
    cause: str


@attrs.frozen
class Notification:
    """A NIXL notification that arrived with a peer's WRITE (``notif`` of its post_write).

    ``peer`` is the kvtier peer name when the sending agent is one of our peers, else ``None``.
    """

    peer: str | None
    agent: str
    message: bytes


#: the :meth:`NixlBlockAgent.add_peer` group of peers that WRITE into us (the peers a consumer
#: dialled): notifications from an agent held by two groups belong to this one's entry
WRITER_GROUP = "dialled"
