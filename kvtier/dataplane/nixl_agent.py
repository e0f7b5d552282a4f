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
(docs/nixl.md has the experiments.)

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

Where the parts live: this module holds the agent's life (creation, registration, windows, peers,
close); :mod:`~kvtier.dataplane.nixl_xfer` posting and reaping transfers (a base of the agent);
:mod:`~kvtier.dataplane.nixl_types` the errors, the descriptor and the results, all importable
from here as well; :mod:`~kvtier.dataplane.nixl_region` the checks of the region and of index lists.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Final

import msgspec

from kvtier.dataplane.nixl_region import block_descs, region_layout
# the values the agent speaks in live in nixl_types; named here too, where callers import them
from kvtier.dataplane.nixl_types import (
    DESCRIPTOR_VERSION,
    MAX_AGENT_CHARS,
    MAX_BLOCKS,  # noqa: F401  (re-exported)
    MAX_DESCRIPTOR_BYTES,  # noqa: F401  (re-exported)
    MAX_METADATA_BYTES,  # noqa: F401  (re-exported)
    MAX_NOTIF_BYTES,  # noqa: F401  (re-exported)
    MAX_PEER_CHARS,
    WRITER_GROUP,  # noqa: F401  (re-exported)
    BadDescriptor,
    LayoutMismatch,
    NixlDescriptor,
    NixlError,
    NixlUnavailable,
    Notification,
    PeerFault,
    XferResult,
    check_name,
    decode_descriptor,
    describe,
    layout_fingerprint,
)
from kvtier.dataplane.nixl_xfer import NixlTransfers, Peer, Xfer

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

# -- loading NIXL ---------------------------------------------------------------------------------

# The meta package first (it picks the CUDA 12/13 build from the torch it finds), then the
# single-CUDA builds directly: kvtier's extra depends on nixl-cu12 only, because the meta package
# pulls both builds and, without a torch, a CUDA torch (docs/dataplane.md, Install).
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
    # NIXL prints INFO lines to stdout unless told otherwise, and UCX writes its warnings there
    # (a request left in its pool after a peer died mid-WRITE): an engine's stdout is not a log,
    # and a host that speaks a protocol on it would read them as its own lines (decision N24)
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    errors = []
    for name in _API_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise NixlUnavailable(f"NIXL is not installed ({'; '.join(errors)}); {INSTALL_HINT}")



# -- the agent ------------------------------------------------------------------------------------


class NixlBlockAgent(NixlTransfers):
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
        check_name("name", name, MAX_AGENT_CHARS)
        if type(layout) is not str or len(layout) > 4096:
            raise ValueError("layout must be a str of at most 4096 chars")
        if isinstance(backends, str) or not backends or not all(type(b) is str and b for b in backends):
            raise ValueError(f"backends must be a non-empty sequence of backend names, got {backends!r}")
        addr, num_blocks, block_bytes, keep = region_layout(region)
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
        self._peers: dict[str, Peer] = {}  # live peers by kvtier name
        # live and draining peers by (NIXL agent name, group); one remote agent is loaded once
        # however many groups hold it (``_loads`` counts them)
        self._by_agent: dict[tuple[str, str], Peer] = {}
        self._loads: dict[str, int] = {}
        self._inflight: dict[int, Xfer] = {}
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
            raise NixlError(f"could not create NIXL agent {name!r}: {describe(e)}") from e
        try:
            plugins = self._agent.get_plugin_list()
            for b in backends:
                if b not in plugins:
                    raise NixlError(f"NIXL backend plugin {b!r} is not available (have: {', '.join(plugins)})")
                try:
                    self._agent.create_backend(b, params.get(b, {}))
                except Exception as e:
                    hint = (f"UCX needs a transport with peer-failure handling, so keep tcp in UCX_TLS "
                            f"(UCX_TLS={os.environ.get('UCX_TLS', '<unset>')!r})" if b == "UCX" else
                            "kvtier's NIXL plane is tested with the UCX backend: try backends ['UCX']")
                    raise NixlError(f"NIXL backend {b!r} could not start: {describe(e)}. {hint}") from e
            try:
                self._reg = self._agent.register_memory([(addr, num_blocks * block_bytes, 0, "")], mem_type="DRAM")
                self._local = self._agent.prep_xfer_dlist(
                    "NIXL_INIT_AGENT", block_descs(addr, num_blocks, block_bytes), mem_type="DRAM"
                )
                metadata = self._agent.get_agent_metadata()
            except Exception as e:
                raise NixlError(f"could not register the pool's host memory (DRAM) with NIXL backends "
                                f"{list(backends)}: {describe(e)}; a backend that cannot register host memory "
                                f"(e.g. POSIX, for files) cannot carry kvtier's blocks: use backends ['UCX']") from e
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
            raise NixlError(f"could not register a window of the region with NIXL: {describe(e)}") from e
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
            log.warning("nixl agent %s: deregistering a window failed: %s", self.name, describe(e))

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
        check_name("peer", peer, MAX_PEER_CHARS)
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
                log.debug("nixl agent %s: reloading %s's metadata: %s", self.name, d.agent, describe(e))
        else:
            try:
                loaded = self._agent.add_remote_agent(d.metadata)
            except Exception as e:
                raise BadDescriptor(f"NIXL rejected peer {peer!r}'s agent metadata: {describe(e)}") from None
            loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        try:
            if loaded != d.agent:  # guarded by metadata_agent; a changed metadata format lands here
                raise BadDescriptor(f"NIXL loaded agent {loaded!r} from metadata naming {d.agent!r}")
            try:
                dlist = self._agent.prep_xfer_dlist(
                    d.agent, block_descs(d.base_addr, d.num_blocks, d.block_bytes, warm=True), mem_type="DRAM"
                )
            except Exception as e:
                raise BadDescriptor(
                    f"peer {peer!r}'s region ({d.num_blocks} x {d.block_bytes} bytes at {d.base_addr:#x}) "
                    f"is not registered in its metadata: {describe(e)}"
                ) from None
        except BadDescriptor:
            if not shared:
                self._forget_agent(loaded)
            raise
        p = Peer(peer, d.agent, d.num_blocks, dlist, group)
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
                log.warning("nixl agent %s: progress failed while closing: %s", self.name, describe(e))
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
                log.warning("nixl agent %s: releasing the warm-up scratch block failed: %s", self.name, describe(e))
            self._scratch = None
        for what, f in (("local dlist", lambda: self._local.release()), ("region", lambda: self._agent.deregister_memory(self._reg))):
            try:
                f()
            except Exception as e:
                log.warning("nixl agent %s: releasing the %s failed: %s", self.name, what, describe(e))
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

    def _release_peer(self, p: Peer) -> None:
        """Drop a peer's prepared slots and its remote agent (only with nothing in flight to it)."""
        if self._by_agent.get((p.agent, p.group)) is not p:
            return  # released already
        del self._by_agent[(p.agent, p.group)]
        if p.dlist is not None:
            try:
                p.dlist.release()
            except Exception as e:
                log.warning("nixl agent %s: releasing peer %s's dlist failed: %s", self.name, p.name, describe(e))
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
            log.warning("nixl agent %s: removing remote agent %s failed: %s", self.name, agent, describe(e))
