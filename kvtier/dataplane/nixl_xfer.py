"""The transfers of a NIXL agent: posting WRITEs (and the warm-up READ) by block index, and
reaping each one's outcome exactly once.

:class:`NixlTransfers` is a base of :class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent`, kept
apart so that the agent's module holds its life (creation, registration, peers, close) and this
one what happens to a transfer between post and outcome: when a handle may be released and when
a peer is faulted (the measured NIXL behaviour in the agent's module docstring; decision N15
for the warm-up).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtier.dataplane.nixl_region import block_descs, indices, warm_bytes
from kvtier.dataplane.nixl_types import (
    DISCONNECT,
    MAX_NOTIF_BYTES,
    NOT_FOUND,
    WRITER_GROUP,
    NixlError,
    Notification,
    PeerFault,
    XferResult,
    describe,
)

log = logging.getLogger("kvtier.dataplane.nixl")


class Peer:
    """An added peer: its prepared slots, its fault, its transfers in flight."""

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


class Xfer:
    """A transfer in flight: its peer and NIXL handle (released only once terminal)."""

    __slots__ = ("peer", "handle")

    def __init__(self, peer: Peer, handle: Any) -> None:
        self.peer = peer
        self.handle = handle


class NixlTransfers:
    """Posting and reaping transfers. The state it uses is made by ``NixlBlockAgent.__init__``, and
    ``_check_open`` and ``_release_peer`` are the agent's."""

    name: str
    num_blocks: int
    block_bytes: int
    _agent: Any
    _local: Any
    _peers: dict[str, Peer]
    _by_agent: dict[tuple[str, str], Peer]
    _inflight: dict[int, Xfer]
    _ready: list[XferResult]
    _ids: itertools.count[int]
    _progress_errors: set[str]
    _scratch: Any

    def warm(self, peer: str) -> int:
        """Post a READ of the first :data:`~kvtier.dataplane.nixl_region.WARM_BYTES` of ``peer``'s
        slot 0 into a private scratch buffer (never a pool block) and return its transfer id; its
        outcome comes from :meth:`poll` like a WRITE's.

        Why: measured (NIXL 1.5.1, UCX 1.23, CMA and tcp), a transfer's completion waits for the
        target's worker to progress whenever this endpoint sent anything (UCX's own wire-up
        messages, a notification) since its last completed transfer: NIXL flushes the endpoint
        before it reports a transfer done.  The first transfer on a new endpoint meets the
        wire-up; the next ones may meet its last messages.  Doing harmless READs one after the
        other while both sides are in the handshake (both progressing; the plane posts
        ``WARM_READS``) means a WRITE posted later completes even if the target then stalls — so
        its ``block_data`` header is not held back until the target wakes, by when its load
        deadline may have passed (decision N15).

        Raises:
            ValueError: unknown peer.  NixlError: the agent is closed or the scratch block cannot
                be registered.
        """
        self._check_open()
        p = self._peers.get(peer)
        if p is None:
            raise ValueError(f"unknown peer {peer!r} (not added, or removed)")
        if self._scratch is None:
            size = warm_bytes(self.block_bytes)
            arr = np.zeros((1, size), dtype=np.uint8)
            addr = int(arr.ctypes.data)
            try:
                reg = self._agent.register_memory([(addr, size, 0, "")], mem_type="DRAM")
                dl = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", block_descs(addr, 1, size), mem_type="DRAM")
            except Exception as e:
                raise NixlError(f"could not register the warm-up scratch block: {describe(e)}") from e
            self._scratch = (arr, reg, dl)
        xid = next(self._ids)
        handle = None
        try:
            handle = self._agent.make_prepped_xfer("READ", self._scratch[2], [0], p.dlist, [p.num_blocks], b"")
            state = self._agent.transfer(handle)
        except Exception as e:
            self._release_handle(handle)
            self._classify(p, e, at_post=True)
            self._ready.append(XferResult(xid, peer, "failed", f"warm-up READ failed: {describe(e)}"))
            return xid
        if state == "PROC":
            self._inflight[xid] = Xfer(p, handle)
            p.inflight += 1
        else:
            self._release_handle(handle)
            ok = state == "DONE"
            self._ready.append(XferResult(xid, peer, "done" if ok else "failed", "" if ok else f"state {state}"))
        return xid

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
        loc = indices("local_blocks", local_blocks, self.num_blocks)
        rem = indices("remote_slots", remote_slots, p.num_blocks)
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
            self._ready.append(XferResult(xid, peer, "failed", f"post failed: {describe(e)}"))
            return xid
        if state == "PROC":
            self._inflight[xid] = Xfer(p, handle)
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
                if not (name == DISCONNECT or (name == NOT_FOUND and p.disconnected)):
                    # It may still be moving bytes: keep it (and its handle) until it ends.
                    if p.fault is None:
                        p.fault = f"state check raised {describe(e)}; transfer kept in flight"
                    continue
                state = f"raised {describe(e)}"
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
                log.warning("nixl agent %s: get_new_notifs failed: %s", self.name, describe(e))
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

    # -- internals --------------------------------------------------------------------------------

    def _classify(self, p: Peer, e: BaseException, at_post: bool = False) -> None:
        """Fault the peer for a peer-scope error: remote disconnect or an invalidated remote.

        A post refused with ``nixlNotFoundError`` means NIXL invalidated the peer, and this
        agent never removes a peer it can still post to, so only a disconnect did that.
        """
        name = type(e).__name__
        if name == DISCONNECT or (at_post and name == NOT_FOUND):
            p.disconnected = True
        if p.fault is None and name in (DISCONNECT, NOT_FOUND):
            p.fault = f"{describe(e)}"

    def _release_handle(self, handle: Any) -> None:
        if handle is None:
            return
        try:
            handle.release()
        except Exception as e:
            log.warning("nixl agent %s: releasing a transfer handle failed: %s", self.name, describe(e))
