"""The NIXL data plane: the producer WRITEs blocks straight into the consumer's slots (one-sided).

Built on :class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent` (one agent per manager, the whole
block pool registered once).  What travels where (docs/dataplane.md):

* **Control connection** (the manager's transport, unchanged): ``hello``/``hello_ack`` carry this
  plane's descriptor (:meth:`NixlPlane.descriptor`: the agent's NIXL metadata and region, plus the
  process identity revocation needs); the consumer's ``fetch`` names its destination slots; after
  a batch's WRITE completed, the batch's ``block_data`` header (digests, no payload frames) tells
  the consumer that those blocks are in its slots, and the consumer checks them.
* **Data** (NIXL/UCX): one WRITE per batch (``MAX_BATCH_BYTES`` of blocks), from the producer's
  registered pool into the slots the fetch named; over CMA on one host, UCX tcp or RDMA across
  hosts.

Producer side.  :meth:`NixlPlane.post` checks every slot against the consumer's descriptor (a
bad slot fails the transfer; nothing raises) and posts WRITEs, at most :data:`WINDOW_BYTES` of a
transfer in flight, so that :meth:`~NixlPlane.cancel` (post nothing more) bounds what a given-up
transfer still moves.  ``Released`` is reported only once every posted WRITE of the transfer is
terminal (NIXL said DONE or failed): the wrapper never releases a handle still in ``PROC``, and a
posted WRITE keeps reading the source blocks until it ends (docs/nixl.md, experiment 2).

Consumer side.  :meth:`~NixlPlane.land` lands nothing: the bytes are already in the slots (the
manager then checks their digests); a ``block_data`` with payload frames is refused.
:meth:`~NixlPlane.revoke` — make sure a producer can no longer write into our slots — cannot be
done by anything a NIXL target does (measured: deregistering, re-registering and removing the
initiator all left later WRITEs landing over CMA and tcp).  The rule here: **access is revoked
once the producer's agent is proven unable to write into us**, by one of two proofs, each followed
by a short drain of our own progress (over tcp our worker applies what the producer had already
put in our sockets):

1. *its process is gone*: it ran on this host, in this PID namespace, and ``/proc/<pid>`` is
   gone, a zombie, or another process (start time differs).  A dead process writes nothing.
2. *it accepted a fresh handshake from us* (its ``hello_ack`` to a later hello of ours): its
   plane refuses our descriptor while any peer entry holds our agent, live or with a WRITE into us
   still in flight (:meth:`NixlPlane.add_peer`), so at that moment every WRITE it ever posted
   into us had ended, and its core posts only for bindings of the new session.

Until then (a wedged producer, one on another host that no request dials again) the load stays
in ``revoking`` and its slots stay out of the engine's hands, counted by
``kvtier_quarantined_blocks{role="consumer"}``.  :meth:`~NixlPlane.close` destroys the agent,
which stops WRITEs over UCX tcp and RDMA (not over CMA: docs/dataplane.md), and reports every
pending revocation done.

Target-side progress: over UCX tcp a WRITE into us advances only while our agent is called, so
:meth:`~NixlPlane.poll` calls it every tick and :meth:`~NixlPlane.max_wait_s` asks the manager not
to sleep longer than ``nixl_progress_interval_s`` while any peer could be writing.

A plane never decides (kvtier/dataplane/base.py): it reports releases and revocations; the
lifecycle core alone decides what they mean for a job or a session.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import time
from collections.abc import Sequence
from typing import Any, Final

import attrs
import msgspec

from kvtier.dataplane.base import Batch, PlaneError, Released, Revoked
from kvtier.dataplane.nixl_agent import NixlBlockAgent, NixlError, PeerFault, XferResult, decode_descriptor
from kvtier.transport import Transport

__all__ = ["DRAIN_S", "NixlPlane", "ProcessId", "WINDOW_BYTES", "process_gone", "this_process"]

log = logging.getLogger("kvtier.dataplane.nixl")

WINDOW_BYTES: Final = 64 << 20
"""Block bytes one transfer may have in posted, unfinished WRITEs at once (8 batches of 8 MiB)."""

DRAIN_S: Final = 0.05
"""After a producer's death is proven, keep progressing this long (and at least
:data:`DRAIN_CALLS` times) before reporting the revocation: over UCX tcp our own worker applies
the bytes the producer had already put in our socket buffers."""
DRAIN_CALLS: Final = 5
CHECK_EVERY_S: Final = 0.01
"""How often a pending revocation re-reads ``/proc`` (each check is one small file read)."""
CLOSE_WAIT_S: Final = 0.1
"""How long :meth:`NixlPlane.close` lets WRITEs in flight finish before the agent is destroyed
(shutdown already gave them its grace; destroying the agent stops the rest)."""


# -- process identity (revocation) ------------------------------------------------------------------


class ProcessId(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Who owns an agent: enough to prove, from the same host, that the process is gone.

    ``host``: ``<boot_id>/<pid namespace inode>`` (empty where ``/proc`` does not tell);
    ``pid``: its pid in that namespace; ``started``: its start time (clock ticks since boot,
    field 22 of ``/proc/<pid>/stat``), so a recycled pid is not mistaken for it."""

    host: str
    pid: int
    started: int


def _proc_start(pid: int) -> int | None:
    """Start time of live process ``pid`` (not a zombie), else ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ..." where comm may hold spaces and parentheses
    rest = data[data.rindex(b")") + 2 :].split()
    if rest[0] in (b"Z", b"X"):  # a zombie has no memory left to write from
        return None
    return int(rest[19])


def this_process() -> ProcessId:
    """The calling process's :class:`ProcessId`."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            host = f"{f.read().strip()}/{os.stat('/proc/self/ns/pid').st_ino}"
        started = _proc_start(os.getpid()) or 0
    except OSError:
        host, started = "", 0
    return ProcessId(host, os.getpid(), started)


def process_gone(pid: ProcessId, here: ProcessId) -> bool:
    """True only if process ``pid`` provably no longer exists: it ran on this host in this PID
    namespace (``here``) and ``/proc`` no longer shows it (or shows another process, or a
    zombie).  False when it lives or when nothing can be proven (another host)."""
    if not pid.host or pid.host != here.host:
        return False
    return _proc_start(pid.pid) != pid.started


class _Hello(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The plane's descriptor on the wire: the agent's descriptor and its owner."""

    agent: bytes
    owner: ProcessId


_HELLO: Final = msgspec.msgpack.Decoder(_Hello)

# -- transfers --------------------------------------------------------------------------------------


@attrs.define(slots=True, eq=False)
class _Xfer:
    key: tuple[str, int]
    peer: str
    batches: Sequence[Batch]
    next: int = 0
    inflight: dict[int, tuple[int, int]] = attrs.Factory(dict)  # WRITE id -> (batch index, bytes)
    cancelled: bool = False
    failed: bool = False
    moved: int = 0
    detail: str = ""

    def fail(self, detail: str) -> None:
        if not self.failed:
            self.failed, self.detail = True, detail


@attrs.define(slots=True)
class _Revocation:
    """Pending revocation of one peer's access: the agents it wrote through, each with its
    owner, until each one is proven done (its owner dead, or it accepted a fresh handshake)."""

    agents: dict[str, ProcessId] = attrs.Factory(dict)
    checked: float = 0.0
    proven_at: float | None = None
    drained: int = 0


def _agent_name(instance: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._:@+=\-]", "_", instance or "kvtier")[:160]
    return f"{base}-{os.getpid()}-{secrets.token_hex(4)}"  # unique per process incarnation


class NixlPlane:
    """One-sided WRITEs through one NIXL agent over the whole block pool (see the module doc).

    Args:
        transport: the control transport (``block_data`` headers go out on it).
        pool: the block pool (``tensor``: a ``num_blocks x block_bytes`` uint8 CPU tensor, or
            ``region``/a 2-D writable buffer; registered once).
        config: the :class:`~kvtier.config.TierConfig` (``backends``,
            ``nixl_progress_interval_s``, ``instance``); ``None``: defaults.
        layout: the handshake's layout string (part of the descriptor's fingerprint).

    Raises:
        PlaneError: NIXL is not installed, or its agent or backend cannot start here (the message
            says why and how to install).

    Costs: construction 0.4–0.5 s (NIXL loads its plugins); once per manager.
    """

    name = "nixl"
    one_sided = True

    def __init__(self, *, transport: Transport, pool: Any, config: Any = None, layout: str = "", **_: Any) -> None:
        self._transport = transport
        self._block_bytes = int(pool.block_bytes)
        backends = tuple(getattr(config, "backends", ("UCX",)))
        self._interval = float(getattr(config, "nixl_progress_interval_s", 0.001))
        region = getattr(pool, "tensor", None)
        if region is None:
            region = getattr(pool, "region", pool)
        try:
            self._agent = NixlBlockAgent(_agent_name(getattr(config, "instance", "")), region,
                                         layout=layout, backends=backends)
        except (NixlError, ValueError, TypeError) as exc:
            raise PlaneError(f"data_plane 'nixl' cannot start: {exc}") from exc
        self._me = this_process()
        self._descriptor = msgspec.msgpack.encode(_Hello(self._agent.descriptor(), self._me))
        self._peers: dict[str, bytes] = {}  # peer -> the descriptor it was added with
        self._agents: dict[str, tuple[str, ProcessId]] = {}  # peer -> (its agent, owner); kept after removal
        self._xfers: dict[tuple[str, int], _Xfer] = {}
        self._by_write: dict[int, _Xfer] = {}
        self._revoking: dict[str, _Revocation] = {}
        self._closed = False
        self.posts = 0
        """WRITEs posted since start (tests and benchmarks count them)."""

    @property
    def agent(self) -> NixlBlockAgent:
        """The underlying agent (tests, benchmarks)."""
        return self._agent

    # -- handshake -----------------------------------------------------------------------------
    def descriptor(self) -> bytes:
        return self._descriptor

    def add_peer(self, peer: str, descriptor: bytes, *, accepted: bool = False) -> None:
        """Load ``peer``'s agent from its descriptor (from its hello or hello_ack).

        The same peer sending the descriptor it was added with is a no-op; a different one
        replaces the old (a restarted process brings a new agent).  The wrapper refuses an agent
        that another peer entry holds, live or still draining WRITEs: so a producer's plane
        accepts a consumer's fresh hello only once none of its WRITEs into that consumer is in
        flight, and ``accepted`` (the peer's hello_ack to our hello) completes a pending
        revocation of the same agent (see :meth:`revoke`).

        Raises:
            PlaneError: the descriptor is malformed, is for another block size or layout, names
                an agent still in use by another of our peers, or NIXL refuses it (the message
                says which); nothing changed.
        """
        if self._peers.get(peer) == descriptor:
            return
        try:
            hello = _HELLO.decode(descriptor)
            agent = decode_descriptor(hello.agent).agent  # validate before touching the live peer
        except (msgspec.DecodeError, msgspec.ValidationError, NixlError, ValueError, TypeError) as exc:
            raise PlaneError(f"{peer}'s NIXL descriptor: {exc}") from None
        if peer in self._peers:
            self.remove_peer(peer)
        try:
            # an inbound peer (its hello) is one we write into; a dialled one (its hello_ack)
            # writes into us.  Only inbound peers exclude each other (the refusal the revocation
            # proof above rests on); two managers with a session each way hold each other's agent
            # once per direction (the symmetric path, decision Y13)
            self._agent.add_peer(peer, hello.agent, group="dialled" if accepted else "inbound")
        except (NixlError, ValueError, TypeError) as exc:
            raise PlaneError(f"{peer}'s NIXL descriptor: {exc}") from None
        self._peers[peer] = descriptor
        self._agents[peer] = (agent, hello.owner)
        if len(self._agents) > 4 * len(self._peers) + 1024:  # forget agents nobody revokes
            keep = self._peers.keys() | self._revoking.keys()
            self._agents = {p: a for p, a in self._agents.items() if p in keep}
        if accepted:
            now = time.monotonic()
            for rev in self._revoking.values():
                if rev.agents.pop(agent, None) is not None and not rev.agents and rev.proven_at is None:
                    rev.proven_at = now

    def remove_peer(self, peer: str) -> None:
        """Stop posting to ``peer`` (its session ended). WRITEs already posted run to their end
        and are reported; ``peer``'s access to *our* slots is not revoked by this (see
        :meth:`revoke`)."""
        if self._peers.pop(peer, None) is not None and not self._closed:
            self._agent.remove_peer(peer)

    # -- producer ------------------------------------------------------------------------------
    def post(self, peer: str, kv_request_id: str, round: int, batches: Sequence[Batch]) -> None:
        key = (kv_request_id, round)
        x = _Xfer(key, peer, batches)
        self._xfers[key] = x
        if peer not in self._peers:
            x.fail(f"no NIXL descriptor from {peer}")
            return
        self._drive((x,))

    def _drive(self, xs: Sequence[_Xfer]) -> None:
        """Post one batch at a time per transfer and take finished WRITEs right after each post,
        so a batch's header leaves as soon as its WRITE is done (over CMA a WRITE often ends
        inside its post) and the consumer checks it while the next one is written."""
        while True:
            posted = False
            for x in xs:
                posted |= self._post_next(x)
            if not self._reap() and not posted:
                return
            xs = [x for x in xs if x.key in self._xfers]

    def _post_next(self, x: _Xfer) -> bool:
        """Post ``x``'s next batch if its window has room; whether one was posted."""
        if x.next >= len(x.batches) or x.cancelled or x.failed:
            return False
        b = x.batches[x.next]
        n = len(b.blocks) * self._block_bytes
        if x.inflight and sum(m for _, m in x.inflight.values()) + n > WINDOW_BYTES:
            return False
        i = x.next
        x.next += 1
        if len(b.slots) != len(b.blocks):
            x.fail(f"batch {i}: {len(b.blocks)} blocks but {len(b.slots)} slots")
            return False
        try:
            wid = self._agent.post_write(x.peer, b.blocks, b.slots)
        except (ValueError, TypeError, NixlError) as exc:  # a bad slot, an unknown peer
            x.fail(f"batch {i} not posted: {exc}")
            return False
        self.posts += 1
        x.inflight[wid] = (i, n)
        self._by_write[wid] = x
        return True

    def _reap(self) -> bool:
        """Take the agent's outcomes (a finished WRITE's header goes out); whether there were any."""
        events = self._agent.poll()
        for ev in events:
            if isinstance(ev, PeerFault):
                log.info("kvtier: NIXL path to %s failed: %s", ev.peer, ev.cause)
                continue
            assert isinstance(ev, XferResult)
            x = self._by_write.pop(ev.xfer_id, None)
            if x is None:  # pragma: no cover - every WRITE is registered when posted
                continue
            i, n = x.inflight.pop(ev.xfer_id)
            if ev.status != "done":
                x.fail(f"batch {i}: WRITE failed: {ev.detail}")
            elif not x.failed:
                h = self._transport.send(x.peer, [x.batches[i].header])
                if h.failed:
                    x.fail(f"batch {i}: block_data not sent: {h.error}")
                else:
                    x.moved += n
        return bool(events)

    def cancel(self, kv_request_id: str, round: int) -> None:
        x = self._xfers.get((kv_request_id, round))
        if x is not None:
            x.cancelled = True

    def referenced(self) -> int:
        return sum(1 for x in self._xfers.values() if x.inflight)

    # -- both ----------------------------------------------------------------------------------
    def poll(self) -> list[Released | Revoked]:
        if self._closed:
            return []
        self._agent.progress()  # a UCX tcp target must call in for WRITEs into it to advance
        self._drive(list(self._xfers.values()))
        out: list[Released | Revoked] = []
        for key, x in list(self._xfers.items()):
            if not x.inflight and (x.cancelled or x.failed or x.next == len(x.batches)):
                del self._xfers[key]
                out.append(Released(key[0], key[1], x.failed, x.moved, x.detail))
        if self._revoking:
            out.extend(self._check_revocations(time.monotonic()))
        return out

    def max_wait_s(self, receiving: bool = True) -> float | None:
        """While a WRITE of ours is in flight, a revocation is pending, or a peer could be writing
        into us (``receiving``: a load of ours is outstanding): the progress interval
        (``nixl_progress_interval_s``); otherwise ``None``, so an idle manager is not woken every
        interval (waking 1,000 times a second per connected peer takes the core from the
        manager that is working)."""
        if self._xfers or self._revoking or (receiving and self._peers):
            return self._interval
        return None

    # -- consumer ------------------------------------------------------------------------------
    def land(self, slots: Sequence[int], payloads: Sequence[Any]) -> None:
        """Nothing to copy: the producer's WRITE already put the blocks in ``slots``.

        Raises:
            PlaneError: the ``block_data`` carried payload frames (never on a one-sided plane)."""
        if payloads:
            raise PlaneError(f"block_data carries {len(payloads)} payload frames; the nixl plane takes none")

    def revoke(self, peer: str) -> bool:
        """Start revoking ``peer``'s access to our slots; never done on return.

        Reported done (:class:`Revoked` from :meth:`poll`) once the agent ``peer`` handshook
        with is proven unable to write — its owner process is gone (:func:`process_gone`), or it
        accepted a fresh handshake from us (its plane then had no WRITE into us in flight, and
        posts only for the new session) — and our own progress has run for :data:`DRAIN_S`
        since.  See the module docstring."""
        rev = self._revoking.get(peer)
        if rev is None:
            rev = self._revoking[peer] = _Revocation()
        known = self._agents.get(peer)
        if known is not None and known[0] not in rev.agents:
            rev.agents[known[0]] = known[1]
            rev.proven_at = None
        if not rev.agents:
            log.warning("kvtier: cannot revoke %s's NIXL access: its agent is unknown; its slots stay held", peer)
        return False

    def _check_revocations(self, now: float) -> list[Revoked]:
        out: list[Revoked] = []
        for peer, rev in list(self._revoking.items()):
            if rev.proven_at is None:
                if now - rev.checked < CHECK_EVERY_S or not rev.agents:
                    continue
                rev.checked = now
                for agent, owner in list(rev.agents.items()):
                    if process_gone(owner, self._me):
                        del rev.agents[agent]
                if not rev.agents:
                    rev.proven_at = now
                continue
            rev.drained += 1  # poll() progressed once more since the proof
            if rev.drained >= DRAIN_CALLS and now - rev.proven_at >= DRAIN_S:
                del self._revoking[peer]
                out.append(Revoked(peer))
        return out

    def revoking(self) -> tuple[str, ...]:
        """Peers whose revocation is pending."""
        return tuple(self._revoking)

    # -- teardown ------------------------------------------------------------------------------
    def close(self) -> list[Released | Revoked]:
        """Destroy the agent (after at most :data:`CLOSE_WAIT_S` for WRITEs in flight) and report
        a ``Released`` for every transfer and a ``Revoked`` for every pending revocation.  Called
        after the transport closed: no header goes out any more, so a transfer not fully
        reported is released as failed.  Idempotent."""
        if self._closed:
            return []
        for x in self._xfers.values():
            x.cancelled = True
        out: list[Released | Revoked] = []
        for ev in self._agent.close(timeout_s=CLOSE_WAIT_S):
            if isinstance(ev, XferResult):
                x = self._by_write.pop(ev.xfer_id, None)
                if x is not None:
                    x.inflight.pop(ev.xfer_id, None)
                    x.fail("closed" if ev.status == "done" else f"WRITE failed: {ev.detail}")
        self._closed = True
        for (kid, rnd), x in self._xfers.items():
            out.append(Released(kid, rnd, x.failed or x.next < len(x.batches), x.moved, x.detail or "closed"))
        self._xfers.clear()
        self._by_write.clear()
        # the agent is gone: over UCX tcp and RDMA nothing reaches our region any more (CMA:
        # docs/dataplane.md); the manager is shutting down and hands every slot back
        out.extend(Revoked(p) for p in self._revoking)
        self._revoking.clear()
        self._peers.clear()
        return out
