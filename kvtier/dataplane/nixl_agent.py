"""One NIXL agent over one block pool: one-sided WRITEs of whole blocks into a peer's slots.

:class:`NixlBlockAgent` is the thin layer between kvtier and NIXL's Python API (``nixl_agent``,
NIXL 1.5.x, UCX 1.23 underneath). It knows blocks, slots and peers; it knows nothing of
``kv_request_id``, fetches or the lifecycle. A data plane is built on it.

What it does
------------
* **Registers the whole region once** (``register_memory``) and prepares one local descriptor
  list over every block (``prep_xfer_dlist``), so a transfer is only ``make_prepped_xfer`` +
  ``transfer`` by block index.
* :meth:`NixlBlockAgent.descriptor` is what the peer needs to write into us: the agent metadata,
  the region's base address, ``num_blocks``, ``block_bytes`` and a layout fingerprint, encoded
  with msgspec (:class:`NixlDescriptor`). kvtier carries it in its own handshake: no NIXL
  listener thread, no etcd.
* :meth:`~NixlBlockAgent.add_peer` validates a descriptor strictly (it comes from the network),
  loads the peer's metadata and prepares a remote descriptor list over all its slots.
* :meth:`~NixlBlockAgent.post_write` posts a WRITE and returns a transfer id. It never raises
  for a peer condition; the outcome comes out of :meth:`~NixlBlockAgent.poll` exactly once.

Measured NIXL 1.5.1 / UCX 1.23 behaviour this module is built around
--------------------------------------------------------------------
(docs/nixl.md has the experiments; shared/design/data-planes.md the earlier ones.)

* **Nothing a target does revokes a peer's WRITE access.** ``deregister_memory``, re-registering,
  and ``remove_remote_agent`` of the initiator all left later WRITEs landing, over CMA and over
  UCX tcp alike. Destroying the target's agent stops WRITEs over tcp, but over CMA a WRITE
  posted after it still landed. So :meth:`~NixlBlockAgent.remove_peer` on a consumer does **not**
  revoke anything: a consumer slot is safe to reuse only after the producer's terminal answer
  for every WRITE into it (or after the producer process is gone).
* **Nothing an initiator does short of destroying its agent stops a posted WRITE.** Releasing a
  handle still in ``PROC`` returned without error, yet the WRITE ran on and kept *reading the
  source blocks* (bytes changed after the release reached the target). ``remove_remote_agent``
  did the same and made ``check_xfer_state`` raise ``nixlNotFoundError`` for ever after, so the
  transfer could never be seen to end. Hence: a handle is released only once terminal, and a
  peer's remote agent is removed only when it has no transfer in flight (:meth:`remove_peer`
  defers the removal until then).
* A WRITE whose post raised ``nixlRemoteDisconnectError`` had nevertheless landed in full over
  CMA. A failed transfer's slots hold garbage, never "untouched" bytes.
* Once a WRITE to a peer reports a remote disconnect, NIXL invalidates that peer, and the state
  check of every other transfer to it raises ``nixlNotFoundError`` instead of reaching a state.
  Such a transfer is terminal (its endpoint is dead), so it is reported failed here.
* Over UCX tcp (no CMA, no RDMA) the *target* must call into its agent for WRITEs to progress:
  call :meth:`~NixlBlockAgent.progress` every tick. NIXL's progress thread would do it, but it
  spins about 80 % of a core even when idle, so it is off by default.

Threading: none of its own. NIXL runs with ``NIXL_THREAD_SYNC_NONE`` (no listener thread), so
every call must come from one thread at a time; kvtier's manager loop is that thread.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import logging
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Final, Literal

import attrs
import msgspec
import numpy as np

from kvtier.errors import KvTierError

__all__ = [
    "BadDescriptor",
    "DESCRIPTOR_VERSION",
    "LayoutMismatch",
    "NixlBlockAgent",
    "NixlDescriptor",
    "NixlError",
    "NixlUnavailable",
    "Notification",
    "PeerFault",
    "XferResult",
    "decode_descriptor",
    "layout_fingerprint",
    "load_nixl_api",
]

log = logging.getLogger("kvtier.dataplane.nixl")

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


# -- loading NIXL ---------------------------------------------------------------------------------

# The meta package first (it picks the CUDA 12/13 build from the torch it finds), then the
# single-CUDA builds directly: kvtier's extra depends on nixl-cu12 only, because the meta package
# pulls both builds and, without a torch, a CUDA torch (shared/design/data-planes.md §1.1).
_API_MODULES: Final = ("nixl._api", "nixl_cu13._api", "nixl_cu12._api")

INSTALL_HINT: Final = (
    "install it with `pip install --no-deps nixl-cu12==1.5.1` next to an installed torch, "
    "or `pip install 'kvtier[nixl]'` on a host whose torch is already installed"
)


def load_nixl_api() -> ModuleType:
    """Import and return NIXL's ``_api`` module (``nixl_agent``, ``nixl_agent_config``).

    Tries ``nixl._api``, ``nixl_cu13._api`` then ``nixl_cu12._api``.

    Raises:
        NixlUnavailable: none imports; the message names each attempt and how to install.
    """
    # NIXL prints INFO lines to stdout unless told otherwise: an engine's stdout is not a log
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    errors = []
    for name in _API_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise NixlUnavailable(f"NIXL is not installed ({'; '.join(errors)}); {INSTALL_HINT}")


# NIXL's bindings raise one exception class per status. Matched by name so that the three
# packages' distinct classes all classify alike.
_DISCONNECT: Final = "nixlRemoteDisconnectError"
_NOT_FOUND: Final = "nixlNotFoundError"


def _describe(exc: BaseException) -> str:
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


def _check_name(what: str, v: object, max_chars: int) -> None:
    if type(v) is not str:
        raise TypeError(f"{what} must be str, got {type(v).__name__}")
    if not 1 <= len(v) <= max_chars or not _NAME_RE.fullmatch(v):
        raise ValueError(f"{what} must be 1..{max_chars} chars of [A-Za-z0-9._:@+=-], got {v!r:.80}")


def _metadata_agent(md: bytes) -> str:
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
        _check_name("agent", self.agent, MAX_AGENT_CHARS)
        if type(self.metadata) is not bytes:
            raise TypeError(f"metadata must be bytes, got {type(self.metadata).__name__}")
        if not 1 <= len(self.metadata) <= MAX_METADATA_BYTES:
            raise ValueError(f"metadata must be 1..{MAX_METADATA_BYTES} bytes, got {len(self.metadata)}")
        if _metadata_agent(self.metadata) != self.agent:
            raise ValueError(f"metadata names agent {_metadata_agent(self.metadata)!r}, not {self.agent!r}")
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
    """The one outcome of a :meth:`NixlBlockAgent.post_write`.

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
    """A peer's data path is judged unusable (reported once, by :meth:`NixlBlockAgent.poll`).

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


class _Peer:
    __slots__ = ("name", "agent", "group", "num_blocks", "dlist", "fault", "fault_reported", "disconnected", "inflight",
                 "removed")

    def __init__(self, name: str, agent: str, num_blocks: int, dlist: Any, group: str = "") -> None:
        self.name = name
        self.agent = agent
        self.group = group
        self.num_blocks = num_blocks
        self.dlist = dlist
        self.fault: str | None = None
        self.fault_reported = False
        self.disconnected = False  # a remote disconnect was seen: its endpoint is dead
        self.inflight = 0
        self.removed = False


class _Xfer:
    __slots__ = ("peer", "handle")

    def __init__(self, peer: _Peer, handle: Any) -> None:
        self.peer = peer
        self.handle = handle


# -- the region -----------------------------------------------------------------------------------


def _region_layout(region: object) -> tuple[int, int, int, object]:
    """``(address, num_blocks, block_bytes, keep_alive)`` of a 2-D uint8 CPU region."""
    torch = sys.modules.get("torch")  # a tensor implies torch is loaded; never import it here
    if torch is not None and isinstance(region, torch.Tensor):
        if region.dtype != torch.uint8 or region.dim() != 2:
            raise ValueError(f"region must be a 2-D uint8 tensor, got {region.dtype} with shape {tuple(region.shape)}")
        if region.device.type != "cpu":
            raise ValueError(f"region must be host memory, got a tensor on {region.device}")
        if not region.is_contiguous():
            raise ValueError("region tensor must be C-contiguous")
        rows, cols = region.shape
        addr = region.data_ptr()
    else:
        try:
            mv = memoryview(region)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"region must be a 2-D uint8 torch tensor or a writable 2-D byte buffer, got {type(region).__name__}"
            ) from None
        if mv.ndim != 2 or mv.format != "B":
            raise ValueError(f"region must be 2-D uint8 (num_blocks x block_bytes), got format {mv.format!r} ndim {mv.ndim}")
        if mv.readonly:
            raise ValueError("region must be writable")
        if not mv.c_contiguous:
            raise ValueError("region must be C-contiguous")
        rows, cols = mv.shape  # type: ignore[misc]
        addr = np.asarray(mv).ctypes.data
        region = mv
    if rows < 1 or cols < 1:
        raise ValueError(f"region must have >= 1 block of >= 1 byte, got shape ({rows}, {cols})")
    if rows > MAX_BLOCKS:
        raise ValueError(f"region has {rows} blocks; NIXL indices are int32 (at most {MAX_BLOCKS})")
    return int(addr), int(rows), int(cols), region


def _block_descs(base: int, num_blocks: int, block_bytes: int) -> np.ndarray:
    """NIXL's Nx3 descriptor array ``(address, length, device id)`` over every block."""
    d = np.empty((num_blocks, 3), dtype=np.uint64)
    d[:, 0] = np.uint64(base) + np.arange(num_blocks, dtype=np.uint64) * np.uint64(block_bytes)
    d[:, 1] = block_bytes
    d[:, 2] = 0
    return d


def _indices(what: str, seq: object, bound: int) -> np.ndarray:
    """A 1-D int32 array of indices in ``[0, bound)``; ``ValueError``/``TypeError`` otherwise."""
    if isinstance(seq, np.ndarray):
        if seq.ndim != 1 or seq.dtype.kind not in "iu":
            raise TypeError(f"{what} must be a 1-D integer array, got {seq.dtype} with {seq.ndim} dims")
        arr = seq
    else:
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence):
            raise TypeError(f"{what} must be a sequence of ints, got {type(seq).__name__}")
        for i, x in enumerate(seq):
            if type(x) is not int and not isinstance(x, np.integer):  # bool is refused
                raise TypeError(f"{what}[{i}] must be int, got {type(x).__name__}")
        arr = np.asarray(seq, dtype=np.int64) if len(seq) else np.empty(0, np.int64)
    if arr.size == 0:
        raise ValueError(f"{what} is empty")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= bound:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} has index {bad} outside [0, {bound})")
    return arr.astype(np.int32, copy=False)


# -- the agent ------------------------------------------------------------------------------------


class NixlBlockAgent:
    """One NIXL agent serving one block region: registers it, describes it, WRITEs between regions.

    Args:
        name: this agent's NIXL name, 1..256 chars of ``[A-Za-z0-9._:@+=-]``. Peers key our
            metadata by it, so make it unique per process incarnation (e.g. instance + pid +
            random suffix): a restarted process must not reuse a name a peer still holds.
        region: the block pool, ``num_blocks x block_bytes`` bytes, C-contiguous, host memory:
            a 2-D ``torch.uint8`` CPU tensor (pinned or not), or anything exposing a writable 2-D
            byte buffer (``memoryview``, numpy array). It must stay allocated until :meth:`close`
            returns *and* until no peer can still write into it (see the module docstring:
            over CMA a peer holding our descriptor can write into this process while it lives).
        layout: free text naming what a block holds (kvtier's handshake ``layout``); peers must
            agree on it and on ``block_bytes`` (:func:`layout_fingerprint`).
        backends: NIXL backend plugins to create, by NIXL's names (default ``("UCX",)``).
        progress_thread: NIXL's own progress thread. Off by default: it spins ~80 % of a core
            even when idle. Without it a target over UCX tcp must call :meth:`progress`.
        backend_params: init parameters per backend. Default for UCX:
            ``{"engine_config": "TLS=^rc_gda"}`` (host memory only; keeps UCX from wiring GPU
            lanes, which vLLM's p2p tier found unreachable after a peer stalled). ``UCX_*``
            environment variables override it.

    Raises:
        NixlUnavailable: NIXL is not installed.
        NixlError: a backend plugin is missing or cannot start (e.g. ``UCX_TLS`` without ``tcp``:
            NIXL needs a transport with peer-failure handling), or registration failed.
        TypeError, ValueError: a bad argument, named in the message.

    Costs (2-core VM): constructor 0.4–0.5 s (NIXL loads every plugin); :meth:`add_peer` about
    8 ms plus ~0.06 µs per remote block.
    """

    def __init__(
        self,
        name: str,
        region: object,
        *,
        layout: str = "",
        backends: Sequence[str] = ("UCX",),
        progress_thread: bool = False,
        backend_params: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        _check_name("name", name, MAX_AGENT_CHARS)
        if type(layout) is not str or len(layout) > 4096:
            raise ValueError("layout must be a str of at most 4096 chars")
        if isinstance(backends, str) or not backends or not all(type(b) is str and b for b in backends):
            raise ValueError(f"backends must be a non-empty sequence of backend names, got {backends!r}")
        addr, num_blocks, block_bytes, keep = _region_layout(region)
        params: dict[str, dict[str, str]] = {"UCX": {"engine_config": "TLS=^rc_gda"}}
        if backend_params is not None:
            params = {k: dict(v) for k, v in backend_params.items()}

        api = load_nixl_api()
        self.name = name
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self.fingerprint = layout_fingerprint(block_bytes, layout)
        self._region = keep
        self._base = addr
        self._closed = False
        self._peers: dict[str, _Peer] = {}  # live peers by kvtier name
        # live and draining peers by (NIXL agent name, group); one remote agent is loaded once
        # however many groups hold it (``_loads`` counts them)
        self._by_agent: dict[tuple[str, str], _Peer] = {}
        self._loads: dict[str, int] = {}
        self._inflight: dict[int, _Xfer] = {}
        self._ready: list[XferResult] = []  # outcomes known at post time, reported by poll()
        self._ids = itertools.count(1)
        self._progress_errors: set[str] = set()
        self._scratch: Any = None  # (array, registration, dlist) for warm-up READs, made on first use

        # backends=[]: create each backend ourselves so that its params apply and a missing
        # plugin is an error (NIXL only logs a warning and skips it).
        cfg = api.nixl_agent_config(enable_prog_thread=bool(progress_thread), enable_listen_thread=False, backends=[])
        try:
            self._agent = api.nixl_agent(name, cfg)
        except Exception as e:
            raise NixlError(f"could not create NIXL agent {name!r}: {_describe(e)}") from e
        try:
            plugins = self._agent.get_plugin_list()
            for b in backends:
                if b not in plugins:
                    raise NixlError(f"NIXL backend plugin {b!r} is not available (have: {', '.join(plugins)})")
                try:
                    self._agent.create_backend(b, params.get(b, {}))
                except Exception as e:
                    raise NixlError(
                        f"NIXL backend {b!r} could not start: {_describe(e)}. UCX needs a transport with "
                        f"peer-failure handling, so keep tcp in UCX_TLS (UCX_TLS={os.environ.get('UCX_TLS', '<unset>')!r})"
                    ) from e
            try:
                self._reg = self._agent.register_memory([(addr, num_blocks * block_bytes, 0, "")], mem_type="DRAM")
                self._local = self._agent.prep_xfer_dlist(
                    "NIXL_INIT_AGENT", _block_descs(addr, num_blocks, block_bytes), mem_type="DRAM"
                )
                metadata = self._agent.get_agent_metadata()
            except Exception as e:
                raise NixlError(f"could not register the region with NIXL: {_describe(e)}") from e
        except BaseException:
            self._agent = None  # dropping the last reference destroys the agent
            raise
        self._descriptor = msgspec.msgpack.encode(
            NixlDescriptor(
                v=DESCRIPTOR_VERSION,
                agent=name,
                metadata=bytes(metadata),
                base_addr=addr,
                num_blocks=num_blocks,
                block_bytes=block_bytes,
                fingerprint=self.fingerprint,
            )
        )

    # -- setup ------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def peers(self) -> tuple[str, ...]:
        """Names of the peers added and not removed."""
        return tuple(self._peers)

    def descriptor(self) -> bytes:
        """Encoded :class:`NixlDescriptor` of this agent and region (a few hundred bytes)."""
        return self._descriptor

    def open_window(self, addr: int) -> tuple[Any, bytes]:
        """Register a second mapping of the region at ``addr`` (a *window*: the same
        ``num_blocks x block_bytes`` pages at another address) and describe it for a peer.

        Returns ``(registration, descriptor)``: the descriptor names the window's address as
        ``base_addr`` and carries the agent metadata (partial: this registration and the
        connection information) a peer needs to WRITE into it.  :meth:`close_window` withdraws
        the registration (an RDMA NIC then refuses its key; CMA and UCX tcp write by virtual
        address, which the caller withdraws itself: :mod:`kvtier.memory.shared`).

        Raises:
            NixlError: NIXL refused the registration, or the agent is closed.
        """
        self._check_open()
        size = self.num_blocks * self.block_bytes
        try:
            reg = self._agent.register_memory([(addr, size, 0, "")], mem_type="DRAM")
        except Exception as e:
            raise NixlError(f"could not register a window of the region with NIXL: {_describe(e)}") from e
        try:
            try:
                metadata = self._agent.get_partial_agent_metadata(reg, True)
            except Exception:  # an older NIXL: the whole metadata (every registration)
                metadata = self._agent.get_agent_metadata()
            desc = msgspec.msgpack.encode(NixlDescriptor(
                v=DESCRIPTOR_VERSION, agent=self.name, metadata=bytes(metadata), base_addr=addr,
                num_blocks=self.num_blocks, block_bytes=self.block_bytes, fingerprint=self.fingerprint))
        except BaseException:
            self.close_window(reg)
            raise
        return reg, desc

    def close_window(self, registration: Any) -> None:
        """Deregister a window made by :meth:`open_window` (best effort; idempotent per handle)."""
        if self._closed or registration is None:
            return
        try:
            self._agent.deregister_memory(registration)
        except Exception as e:
            log.warning("nixl agent %s: deregistering a window failed: %s", self.name, _describe(e))

    def warm(self, peer: str) -> int:
        """Post a READ of ``peer``'s slot 0 into a private scratch block (never a pool block) and
        return its transfer id; its outcome comes from :meth:`poll` like a WRITE's.

        Why: measured (NIXL 1.5.1, UCX 1.23, CMA and tcp), the *first* transfer on a new peer's
        endpoint stays ``PROC`` until the target's worker progresses, although its bytes already
        moved; every later one completes without the target.  Doing one harmless transfer while
        both sides are in the handshake (both progressing) means a WRITE posted later completes
        even if the target then stalls — so its ``block_data`` header is not held back until the
        target wakes, by when its load deadline may have passed (decision N15).

        Raises:
            ValueError: unknown peer.  NixlError: the agent is closed or the scratch block cannot
                be registered.
        """
        self._check_open()
        p = self._peers.get(peer)
        if p is None:
            raise ValueError(f"unknown peer {peer!r} (not added, or removed)")
        if self._scratch is None:
            arr = np.zeros((1, self.block_bytes), dtype=np.uint8)
            addr = int(arr.ctypes.data)
            try:
                reg = self._agent.register_memory([(addr, self.block_bytes, 0, "")], mem_type="DRAM")
                dl = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", _block_descs(addr, 1, self.block_bytes),
                                                 mem_type="DRAM")
            except Exception as e:
                raise NixlError(f"could not register the warm-up scratch block: {_describe(e)}") from e
            self._scratch = (arr, reg, dl)
        xid = next(self._ids)
        handle = None
        try:
            handle = self._agent.make_prepped_xfer("READ", self._scratch[2], [0], p.dlist, [0], b"")
            state = self._agent.transfer(handle)
        except Exception as e:
            self._release_handle(handle)
            self._classify(p, e, at_post=True)
            self._ready.append(XferResult(xid, peer, "failed", f"warm-up READ failed: {_describe(e)}"))
            return xid
        if state == "PROC":
            self._inflight[xid] = _Xfer(p, handle)
            p.inflight += 1
        else:
            self._release_handle(handle)
            ok = state == "DONE"
            self._ready.append(XferResult(xid, peer, "done" if ok else "failed", "" if ok else f"state {state}"))
        return xid

    def holder(self, agent: str, group: str = "") -> tuple[str, bool, int] | None:
        """Who of ``group`` (see :meth:`add_peer`) holds NIXL agent ``agent``: ``(peer, removed,
        WRITEs in flight)``, or None.  A removed holder still draining WRITEs keeps the agent
        until the last one ends."""
        p = self._by_agent.get((agent, group))
        return None if p is None else (p.name, p.removed, p.inflight)

    def add_peer(self, peer: str, descriptor: bytes, *, group: str = "") -> None:
        """Make ``peer``'s region a WRITE target: load its metadata, prepare all its slots once.

        Both sides add each other: the producer to write, the consumer to name the sender of
        notifications. Cost: O(peer's num_blocks) descriptor preparation.

        ``group``: peers of one group exclude each other (one NIXL agent is held by at most one
        live or draining peer of a group); peers of different groups may hold the same agent,
        loaded once (two managers with a session each way between them: the symmetric path,
        decision Y13).

        Raises:
            BadDescriptor: the descriptor is malformed, names this agent, names a NIXL agent that
                another peer of the group (or a removed one still draining) holds, or NIXL rejects
                its metadata or its region; the agent is unchanged.
            LayoutMismatch: ``block_bytes`` or the layout fingerprint differ from ours.
            ValueError: ``peer`` is already added (remove it first) or not a valid name.
            NixlError: the agent is closed.
        """
        self._check_open()
        _check_name("peer", peer, MAX_PEER_CHARS)
        if peer in self._peers:
            raise ValueError(f"peer {peer!r} is already added; remove_peer() it first")
        d = decode_descriptor(descriptor)
        if d.block_bytes != self.block_bytes:
            raise LayoutMismatch("block_bytes", self.block_bytes, d.block_bytes)
        if d.fingerprint != self.fingerprint:
            raise LayoutMismatch("layout", self.fingerprint, d.fingerprint)
        if d.agent == self.name:
            raise BadDescriptor(f"descriptor names this agent itself ({d.agent!r})")
        other = self._by_agent.get((d.agent, group))
        if other is not None:
            state = f"removed, {other.inflight} transfer(s) still in flight" if other.removed else "live"
            raise BadDescriptor(f"NIXL agent {d.agent!r} is already registered for peer {other.name!r} ({state})")
        shared = d.agent in self._loads
        if shared:
            # the agent is loaded for the other group; this descriptor's metadata may name a
            # registration (a per-session window) the first did not: load it too (NIXL merges
            # partial metadata into the agent it already knows)
            loaded = d.agent
            try:
                self._agent.add_remote_agent(d.metadata)
            except Exception as e:
                log.debug("nixl agent %s: reloading %s's metadata: %s", self.name, d.agent, _describe(e))
        else:
            try:
                loaded = self._agent.add_remote_agent(d.metadata)
            except Exception as e:
                raise BadDescriptor(f"NIXL rejected peer {peer!r}'s agent metadata: {_describe(e)}") from None
            loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        try:
            if loaded != d.agent:  # guarded by _metadata_agent; a changed metadata format lands here
                raise BadDescriptor(f"NIXL loaded agent {loaded!r} from metadata naming {d.agent!r}")
            try:
                dlist = self._agent.prep_xfer_dlist(
                    d.agent, _block_descs(d.base_addr, d.num_blocks, d.block_bytes), mem_type="DRAM"
                )
            except Exception as e:
                raise BadDescriptor(
                    f"peer {peer!r}'s region ({d.num_blocks} x {d.block_bytes} bytes at {d.base_addr:#x}) "
                    f"is not registered in its metadata: {_describe(e)}"
                ) from None
        except BadDescriptor:
            if not shared:
                self._forget_agent(loaded)
            raise
        p = _Peer(peer, d.agent, d.num_blocks, dlist, group)
        self._peers[peer] = p
        self._by_agent[(d.agent, group)] = p
        self._loads[d.agent] = self._loads.get(d.agent, 0) + 1

    def remove_peer(self, peer: str) -> None:
        """Stop using ``peer``. Idempotent; an unknown name is ignored.

        New posts to it raise ``ValueError``. Its remote agent is removed from NIXL at once when
        none of our WRITEs to it is in flight, else when the last one ends (removing it earlier
        would leave those WRITEs running, unobservable). Their outcomes still come from
        :meth:`poll`.

        This does **not** revoke the peer's access to *our* region: NIXL offers no revocation
        (measured; module docstring).
        """
        p = self._peers.pop(peer, None)
        if p is None or self._closed:
            return
        p.removed = True
        if p.inflight == 0:
            self._release_peer(p)

    def peer_fault(self, peer: str) -> str | None:
        """The cause if ``peer`` is faulted (see :class:`PeerFault`), else ``None``."""
        p = self._peers.get(peer)
        return p.fault if p is not None else None

    # -- transfers --------------------------------------------------------------------------------

    def post_write(
        self,
        peer: str,
        local_blocks: Sequence[int] | np.ndarray,
        remote_slots: Sequence[int] | np.ndarray,
        notif: bytes | None = None,
    ) -> int:
        """Post one WRITE of ``local_blocks[i]`` into ``remote_slots[i]`` of ``peer``; non-blocking.

        Args:
            peer: an added peer.
            local_blocks: our block indices, in ``[0, num_blocks)``; repeats allowed.
            remote_slots: the peer's slot indices, in ``[0, peer's num_blocks)``, unique, same
                length as ``local_blocks`` (>= 1).
            notif: optional message (<= 4096 bytes) NIXL delivers to the peer after the data;
                the peer reads it from :meth:`progress`.

        Returns:
            A transfer id, unique for this agent. Its outcome comes from :meth:`poll` exactly
            once. Until then our ``local_blocks`` may still be read: do not modify them.

        Raises:
            ValueError, TypeError: a caller bug (unknown peer, index out of range, lengths
            differ, duplicate slot, bad ``notif``); nothing was posted.
            NixlError: the agent is closed.
            A peer condition never raises: a faulted or vanished peer yields a failed result.
        """
        self._check_open()
        p = self._peers.get(peer)
        if p is None:
            raise ValueError(f"unknown peer {peer!r} (not added, or removed)")
        loc = _indices("local_blocks", local_blocks, self.num_blocks)
        rem = _indices("remote_slots", remote_slots, p.num_blocks)
        if loc.size != rem.size:
            raise ValueError(f"local_blocks has {loc.size} entries, remote_slots {rem.size}")
        if rem.size > 1 and np.unique(rem).size != rem.size:
            raise ValueError("remote_slots has duplicate slots")
        if notif is not None and (type(notif) is not bytes or len(notif) > MAX_NOTIF_BYTES):
            raise ValueError(f"notif must be None or bytes of at most {MAX_NOTIF_BYTES}")
        xid = next(self._ids)
        if p.fault is not None:
            self._ready.append(XferResult(xid, peer, "failed", f"peer fault: {p.fault}"))
            return xid
        handle = None
        try:
            handle = self._agent.make_prepped_xfer("WRITE", self._local, loc, p.dlist, rem, notif or b"")
            state = self._agent.transfer(handle)
        except Exception as e:
            # NIXL does not own a request whose post failed, and it is not in flight: release it.
            # (A post that raised a remote disconnect had still landed in full over CMA.)
            self._release_handle(handle)
            self._classify(p, e, at_post=True)
            self._ready.append(XferResult(xid, peer, "failed", f"post failed: {_describe(e)}"))
            return xid
        if state == "PROC":
            self._inflight[xid] = _Xfer(p, handle)
            p.inflight += 1
        else:
            self._release_handle(handle)
            ok = state == "DONE"
            self._ready.append(XferResult(xid, peer, "done" if ok else "failed", "" if ok else f"post state {state}"))
        return xid

    def poll(self) -> list[XferResult | PeerFault]:
        """Outcomes of transfers that ended since the last poll, and newly faulted peers.

        A handle is released only once NIXL reports it terminal. A state check that raises a
        remote disconnect is terminal (failed, and the peer is faulted); ``nixlNotFoundError`` is
        terminal once the peer is known disconnected. Any other raise faults the peer but keeps
        the transfer in flight, since it may still be moving bytes; it ends by its peer's death
        or at :meth:`close`.
        """
        if self._closed:
            return []
        out: list[XferResult | PeerFault] = list(self._ready)
        self._ready.clear()
        for xid, x in list(self._inflight.items()):
            p = x.peer
            try:
                state = self._agent.check_xfer_state(x.handle)
            except Exception as e:
                name = type(e).__name__
                self._classify(p, e)
                if not (name == _DISCONNECT or (name == _NOT_FOUND and p.disconnected)):
                    # It may still be moving bytes: keep it (and its handle) until it ends.
                    if p.fault is None:
                        p.fault = f"state check raised {_describe(e)}; transfer kept in flight"
                    continue
                state = f"raised {_describe(e)}"
            if state == "PROC":
                continue
            del self._inflight[xid]
            self._release_handle(x.handle)
            p.inflight -= 1
            ok = state == "DONE"
            out.append(XferResult(xid, p.name, "done" if ok else "failed", "" if ok else f"state {state}"))
            if p.removed and p.inflight == 0:
                self._release_peer(p)
        for p in self._by_agent.values():
            if p.fault is not None and not p.fault_reported:
                p.fault_reported = True
                out.append(PeerFault(p.name, p.fault))
        return out

    def pending(self, peer: str | None = None) -> int:
        """Transfers posted and not yet reported by :meth:`poll` (for ``peer``, or all)."""
        if peer is None:
            return len(self._inflight) + len(self._ready)
        return sum(x.peer.name == peer for x in self._inflight.values()) + sum(r.peer == peer for r in self._ready)

    def progress(self) -> list[Notification]:
        """Let NIXL make progress and return the notifications that arrived.

        A WRITE target over UCX tcp must call this every tick: a WRITE into us waits for it (it
        stalled about 2 s without), and a 1-block WRITE's latency is about the calling interval.
        Over CMA and RDMA WRITEs need nothing from the target. Cheap when idle (one
        ``get_new_notifs`` call). Never raises for a peer condition (a failure is logged once
        per kind and yields ``[]``); raises nothing after :meth:`close`.
        """
        if self._closed:
            return []
        try:
            notifs = self._agent.get_new_notifs()
        except Exception as e:
            # NIXL reports a backend's failure to fetch notifications here (e.g. around a
            # peer's disconnect); the transfers themselves report through poll(). Log each
            # kind once rather than at every tick.
            kind = type(e).__name__
            if kind not in self._progress_errors:
                self._progress_errors.add(kind)
                log.warning("nixl agent %s: get_new_notifs failed: %s", self.name, _describe(e))
            return []
        out = []
        for agent, msgs in notifs.items():
            agent = agent.decode() if isinstance(agent, bytes) else str(agent)
            # a notification comes with a WRITE into us: from the entry of the group that writes
            # into us when one agent is held by both (WRITER_GROUP), else from its one entry
            p = self._by_agent.get((agent, WRITER_GROUP)) or next(
                (q for (a, _), q in self._by_agent.items() if a == agent), None)
            for m in msgs:
                out.append(Notification(p.name if p is not None else None, agent, bytes(m)))
        return out

    def close(self, timeout_s: float = 2.0) -> list[XferResult | PeerFault]:
        """Wait up to ``timeout_s`` seconds for in-flight WRITEs to end, then destroy the agent.

        Idempotent (a second call returns ``[]``). Returns every outcome not yet reported by
        :meth:`poll`, so each posted transfer still gets exactly one. A WRITE still in flight at
        the deadline is reported failed: releasing its handle would not stop it, destroying the
        agent does (the UCX worker and its endpoints go), so after close() returns nothing reads
        our region any more. Whether a peer can still write *into* it is the peer's business:
        see the module docstring.
        """
        if self._closed:
            return []
        out = self.poll()
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        while self._inflight and time.monotonic() < deadline:
            try:
                self.progress()
            except Exception as e:  # best effort: the deadline still bounds the wait
                log.warning("nixl agent %s: progress failed while closing: %s", self.name, _describe(e))
            out += self.poll()
            time.sleep(0.0005)
        for xid, x in self._inflight.items():
            out.append(XferResult(xid, x.peer.name, "failed", "agent closed with the WRITE in flight"))
            self._release_handle(x.handle)
        self._inflight.clear()
        out += self._ready
        self._ready.clear()
        for p in list(self._by_agent.values()):
            self._release_peer(p)
        self._peers.clear()
        if self._scratch is not None:
            _, sreg, sdl = self._scratch
            try:
                sdl.release()
                self._agent.deregister_memory(sreg)
            except Exception as e:
                log.warning("nixl agent %s: releasing the warm-up scratch block failed: %s", self.name, _describe(e))
            self._scratch = None
        for what, f in (("local dlist", lambda: self._local.release()), ("region", lambda: self._agent.deregister_memory(self._reg))):
            try:
                f()
            except Exception as e:
                log.warning("nixl agent %s: releasing the %s failed: %s", self.name, what, _describe(e))
        self._closed = True
        self._local = self._reg = None
        self._agent = None  # the last reference: NIXL destroys the agent, UCX its worker
        self._region = None  # and the region is the caller's again (no reference kept)
        return out

    def __enter__(self) -> NixlBlockAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise NixlError(f"NIXL agent {self.name!r} is closed")

    def _classify(self, p: _Peer, e: BaseException, at_post: bool = False) -> None:
        """Fault the peer for a peer-scope error: remote disconnect or an invalidated remote.

        A post refused with ``nixlNotFoundError`` means NIXL invalidated the peer, and this
        agent never removes a peer it can still post to, so only a disconnect did that.
        """
        name = type(e).__name__
        if name == _DISCONNECT or (at_post and name == _NOT_FOUND):
            p.disconnected = True
        if p.fault is None and name in (_DISCONNECT, _NOT_FOUND):
            p.fault = f"{_describe(e)}"

    def _release_handle(self, handle: Any) -> None:
        if handle is None:
            return
        try:
            handle.release()
        except Exception as e:
            log.warning("nixl agent %s: releasing a transfer handle failed: %s", self.name, _describe(e))

    def _release_peer(self, p: _Peer) -> None:
        """Drop a peer's prepared slots and its remote agent (only with nothing in flight to it)."""
        if self._by_agent.get((p.agent, p.group)) is not p:
            return  # released already
        del self._by_agent[(p.agent, p.group)]
        if p.dlist is not None:
            try:
                p.dlist.release()
            except Exception as e:
                log.warning("nixl agent %s: releasing peer %s's dlist failed: %s", self.name, p.name, _describe(e))
            p.dlist = None
        left = self._loads.get(p.agent, 1) - 1
        if left > 0:
            self._loads[p.agent] = left
            return  # another group still holds the remote agent
        self._loads.pop(p.agent, None)
        self._forget_agent(p.agent)

    def _forget_agent(self, agent: str) -> None:
        try:
            self._agent.remove_remote_agent(agent)
        except Exception as e:
            log.warning("nixl agent %s: removing remote agent %s failed: %s", self.name, agent, _describe(e))
