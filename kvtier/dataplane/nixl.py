"""The NIXL data plane: the producer WRITEs blocks straight into the consumer's slots (one-sided).

Built on :class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent` (one agent per manager, the whole
block pool registered once).  What travels where (docs/dataplane.md):

* **Control connection** (the manager's transport, unchanged): ``hello``/``hello_ack`` carry this
  plane's descriptor (:meth:`NixlPlane.descriptor`: the agent's NIXL metadata and region, plus the
  process identity revocation needs); the consumer's ``fetch`` names its destination slots; the
  producer's terminal answers (``transfer_done``, ``abort_ack``) and the consumer's ``receipt``.
* **Data** (NIXL/UCX): WRITEs from the producer's registered pool into the slots the fetch named
  (a transfer's full-size batches packed into WRITEs of up to 16 MiB, decision N18); over CMA on
  one host, UCX tcp or RDMA across hosts.  Each WRITE carries its batches' ``block_data`` headers
  (digests, no payload frames) as its NIXL *notification*, which NIXL delivers after the WRITE's
  bytes: the consumer's :meth:`~NixlPlane.poll` reports one per header
  (:class:`~kvtier.dataplane.base.Notified`) and the blocks are checked as soon as the manager
  sees it — no control message, no tick of the producer's manager between a WRITE's end and the
  consumer's check (decision I14).  NIXL sends a notification when the producer's agent learns
  that its WRITE completed, i.e. when the producer polls it; :meth:`~NixlPlane.poll` does at every
  tick and :meth:`~NixlPlane.max_wait_s` keeps those ticks ``nixl_progress_interval_s`` apart while
  a WRITE is in flight.  A notification carries at most :data:`MAX_NOTIF_BYTES`, so a batch names
  at most ~400 blocks (8 bytes of digest each).

Producer side.  :meth:`NixlPlane.post` hands the transfer to the write pipeline
(:mod:`~kvtier.dataplane.nixl_pipeline`), which checks every slot against the consumer's
descriptor (a bad slot fails the transfer; nothing raises) and posts WRITEs, at most what the
peer's link drains in half ``abort_ack_timeout_s`` (:data:`WINDOW_BYTES` at most) of a transfer in
flight, so that :meth:`~NixlPlane.cancel` (post nothing more) bounds what a given-up transfer
still moves.  ``Released`` is reported only once every posted WRITE of the transfer is
terminal (NIXL said DONE or failed): the wrapper never releases a handle still in ``PROC``, and a
posted WRITE keeps reading the source blocks until it ends (docs/nixl.md, experiment 2).

Consumer side.  :meth:`~NixlPlane.land` copies nothing: the bytes are already in the slots; it
checks their digests (on the digest pool when the batch is large,
:mod:`kvtier.dataplane.landing`); a ``block_data`` with payload frames is refused.
:meth:`~NixlPlane.revoke` — make sure a producer can no longer write into our slots — cannot be
done by anything a NIXL target does to a registration (measured: deregistering, re-registering
and removing the initiator all left later WRITEs landing over CMA and tcp).  What the target
*can* withdraw is the address a producer writes to (decision N14): when the pool lives in shared
memory (:attr:`kvtier.memory.BlockPool.backing`), every session we dial gets a **window** of its
own — a second mapping of the pool's pages, registered separately, named by the descriptor that
session's hello carries (:meth:`NixlPlane.session_descriptor`).  When the session ends, or a
load of it needs its slots back, the window is **withdrawn**: deregistered (an RDMA NIC then
refuses its key) and overmapped with fresh anonymous pages (CMA and UCX tcp write by virtual
address: a late WRITE lands in that *sink*, never in the pool).  The engine's own mapping is
untouched, and no other session is disturbed.  :class:`Revoked` follows after a short drain of
our own progress (:data:`DRAIN_S`: a ``process_vm_writev`` already inside the kernel when the
window was overmapped finishes into the old pages; over tcp our worker applies what was already
in its socket), so a load is answered within ``revoke_timeout_s`` of needing its slots back,
whatever the producer does — stopped, partitioned, on another host.

A sink's addresses stay mapped until the producer's agent is proven unable to write there (its
process is gone on this host, or it accepted a fresh handshake from us: its plane admits our
agent again only once no WRITE of its old entry is in flight), then they are unmapped.

A pool without shared backing (private memory) cannot be windowed: revocation then waits for one
of those two proofs (``revocation_bounded`` is False and the core keeps such a load's slots,
logging it and dialling the producer again at every ``revoke_timeout_s``, decision N25) — a
producer that stays wedged, or one on another host that cannot be reached, holds them until then.

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

import msgspec

from kvtier.dataplane.base import (
    Attached,
    AttachFailed,
    Batch,
    Faulted,
    Notified,
    PeerIsSelf,
    PeerStillHeld,
    PlaneError,
    Report,
    Revoked,
)
from kvtier.dataplane.landing import Landings
from kvtier.dataplane.settings import PlaneSettings
from kvtier.dataplane.nixl_agent import (
    MAX_NOTIF_BYTES,
    WRITER_GROUP,
    NixlBlockAgent,
    NixlError,
    PeerFault,
    XferResult,
    decode_descriptor,
)
from kvtier.dataplane.nixl_pipeline import WINDOW_BYTES, WritePipeline, unpack_notification
from kvtier.dataplane.nixl_revoke import (
    CHECK_EVERY_S,
    DRAIN_S,
    SINKS_WARN,
    ProcessId,
    Revocation,
    Window,
    check_revocations,
    ended_by_close,
    process_gone,
    reclaim_sinks,
    this_process,
)
from kvtier.integrity import DigestPool
from kvtier.memory import shared
from kvtier.transport import Transport

__all__ = ["DRAIN_S", "NixlPlane", "ProcessId", "WINDOW_BYTES", "process_gone", "this_process"]

log = logging.getLogger("kvtier.dataplane.nixl")

CLOSE_WAIT_S: Final = 0.1
"""How long :meth:`NixlPlane.close` lets WRITEs in flight finish before the agent is destroyed
(shutdown already gave them its grace; destroying the agent stops the rest)."""

WARM_READS: Final = 3
"""Warm-up READs a consumer's session waits for, each posted when the one before completed
(decision N15).  A transfer completes without the consumer only if the endpoint sent nothing
since its last completed transfer; the first READ completes with the endpoint's wire-up, whose
last messages may still leave after the second.  Measured with a fresh producer whose consumer
stalls right after its fetch: the first WRITE waited for the consumer in 14 of 40 trials after
one READ, 3-4 of 30 after two, 0 of 75 after three."""


class _Hello(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The plane's descriptor on the wire: the agent's descriptor and its owner; ``packed``: its
    plane reads notifications that carry several headers (:mod:`~kvtier.dataplane.nixl_pipeline`,
    decision N18; a descriptor without it gets one header per WRITE)."""

    agent: bytes
    owner: ProcessId
    packed: bool = False


_HELLO: Final = msgspec.msgpack.Decoder(_Hello)

def _agent_name(instance: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._:@+=\-]", "_", instance or "kvtier")[:160]
    return f"{base}-{os.getpid()}-{secrets.token_hex(4)}"  # unique per process incarnation


class NixlPlane:
    """One-sided WRITEs through one NIXL agent over the whole block pool (see the module doc).

    Args:
        transport: the control transport (``block_data`` headers go out on it).
        pool: the block pool (``tensor``: a ``num_blocks x block_bytes`` uint8 CPU tensor, or
            ``region``/a 2-D writable buffer; registered once).
        settings: what the plane takes from the config (``backends``, ``nixl_progress_interval_s``,
            ``instance``, ``integrity``, ``revoke_timeout_s``).
        layout: the handshake's layout string (part of the descriptor's fingerprint).
        digest_pool: where large batches are checked; ``None``: on the caller's thread.

    Raises:
        PlaneError: NIXL is not installed, or its agent or backend cannot start here (the message
            says why and how to install).

    Costs: construction 0.4–0.5 s (NIXL loads its plugins); once per manager.
    """

    name = "nixl"
    one_sided = True
    max_header_bytes = MAX_NOTIF_BYTES

    def __init__(self, *, transport: Transport, pool: Any, settings: PlaneSettings = PlaneSettings(), layout: str = "",
                 digest_pool: DigestPool | None = None, **_: Any) -> None:
        self._transport = transport
        self._block_bytes = int(pool.block_bytes)
        self._landings = Landings(pool, settings.integrity, digest_pool)
        backends = settings.backends
        self._interval = settings.nixl_progress_interval_s
        region = getattr(pool, "tensor", None)
        if region is None:
            region = getattr(pool, "region", pool)
        try:
            self._agent = NixlBlockAgent(_agent_name(settings.instance), region,
                                         layout=layout, backends=backends)
        except (NixlError, ValueError, TypeError) as exc:
            raise PlaneError(f"data_plane 'nixl' cannot start: {exc}") from exc
        self._me = this_process()
        self._descriptor = msgspec.msgpack.encode(_Hello(self._agent.descriptor(), self._me, packed=True))
        self._peers: dict[str, bytes] = {}  # peer -> the descriptor it was added with
        self._gens: dict[str, int] = {}  # peer -> the session generation it was added for
        self._faults: list[Faulted] = []  # paths to added peers that broke, not reported yet
        self._agents: dict[str, tuple[str, ProcessId]] = {}  # peer -> (its agent, owner); kept after removal
        self._writes = WritePipeline(self._agent, self._block_bytes, self._outcome,
                                     horizon_s=settings.abort_ack_timeout_s / 2)
        self._packed: set[str] = set()  # peers whose plane reads packed notifications (decision N18)
        self._revoking: dict[str, Revocation] = {}
        self._backing: shared.Backing | None = getattr(pool, "backing", None)
        self.revocation_bounded = self._backing is not None
        self.unrevoked: tuple[str, ...] = ()
        revoke_s = settings.revoke_timeout_s
        if self.revocation_bounded and revoke_s < 2 * DRAIN_S:
            self._agent.close(timeout_s=0)
            raise PlaneError(f"revoke_timeout_s={revoke_s} is too short for the nixl plane: a withdrawn window needs "
                             f"{DRAIN_S} s of drain, so it must be at least {2 * DRAIN_S} s")
        """Whether :meth:`revoke` withdraws access by itself (a shared-memory pool: windows)."""
        self._windows: dict[str, Window] = {}  # dialled peer -> its session's live window
        self._dialling: set[str] = set()  # dialled peers of a pool without windows, in their handshake
        self._sinks: list[Window] = []  # withdrawn windows whose addresses are still mapped
        self._sinks_checked = 0.0
        self._sinks_warned = SINKS_WARN
        # peer -> (descriptor, accepted, gen): a hello whose agent a removed entry still holds
        # (WRITEs in flight); admitted by poll() once they ended
        self._pending: dict[str, tuple[bytes, bool, int]] = {}
        self._attach_reports: list[Attached | AttachFailed] = []
        # warm-up READ id -> (peer, gen it admits, READs still to post after this one)
        self._warming: dict[int, tuple[str, int, int]] = {}
        if self._backing is None:
            log.warning("kvtier: the block pool is not shared memory, so the NIXL plane cannot withdraw a producer's "
                        "access to it: a load whose producer cannot answer keeps its slots until that producer is "
                        "proven gone (use a BlockPool of pageable memory, or wrap a /dev/shm region)")
        self._closed = False

    @property
    def agent(self) -> NixlBlockAgent:
        """The underlying agent (tests, benchmarks)."""
        return self._agent

    # -- handshake -----------------------------------------------------------------------------
    def descriptor(self) -> bytes:
        return self._descriptor

    def session_descriptor(self, peer: str, gen: int) -> bytes:
        """A window of its own for the session of generation ``gen`` we dial to ``peer`` (see
        the module docstring); ``b""`` (the plane's one descriptor) when the pool cannot be
        windowed.  A window still live for ``peer`` (an earlier session) is withdrawn first.

        Raises:
            PlaneError: the window could not be mapped or registered (the session must not go
                ahead: its producer's access could not be withdrawn)."""
        if self._backing is None or self._closed:
            if not self._closed:
                self._dialling.add(peer)  # its producer's warm-up READ needs our progress too
            return b""
        old = self._windows.pop(peer, None)
        if old is not None:
            self._withdraw(old)
        try:
            addr = self._backing.map_window()
        except OSError as exc:
            raise PlaneError(f"cannot map a NIXL window of the pool for {peer}: {exc}") from None
        try:
            reg, desc = self._agent.open_window(addr)
        except NixlError as exc:
            shared.unmap(addr, self._backing.size)
            raise PlaneError(f"cannot register a NIXL window of the pool for {peer}: {exc}") from None
        self._windows[peer] = Window(peer, gen, addr, reg)
        return msgspec.msgpack.encode(_Hello(desc, self._me, packed=True))

    def add_peer(self, peer: str, descriptor: bytes, *, accepted: bool = False, gen: int = 0) -> bool:
        """Load ``peer``'s agent from its descriptor (from its hello or hello_ack).

        The same peer sending the descriptor it was added with is a no-op; a different one
        replaces the old (a restarted process brings a new agent).  An agent that another
        (removed) peer entry still holds with WRITEs in flight is **deferred**: this returns
        False and :meth:`poll` reports :class:`Attached` (or :class:`AttachFailed`) for ``gen``
        once those WRITEs ended — so a producer admits a consumer's fresh session only when none
        of its WRITEs into that consumer is in flight (the session stays ``attaching``, bounded by
        its handshake deadline).  ``accepted`` (the peer's hello_ack to our hello) is that proof
        for every earlier window of ours the same agent held.

        Returns:
            True when the peer was added now.

        Raises:
            PlaneError: the descriptor is malformed, is for another block size or layout, names
                an agent a *live* entry of another peer holds, or NIXL refuses it (the message
                says which); nothing changed.
        """
        if self._peers.get(peer) == descriptor:
            return True
        try:
            hello = _HELLO.decode(descriptor)
            agent = decode_descriptor(hello.agent).agent  # validate before touching the live peer
        except (msgspec.DecodeError, msgspec.ValidationError, NixlError, ValueError, TypeError) as exc:
            raise PlaneError(f"{peer}'s NIXL descriptor: {exc}") from None
        if agent == self._agent.name:
            raise PeerIsSelf(f"{peer}'s NIXL descriptor names our own agent {agent!r}: it is this tier itself")
        holder = self._agent.holder(agent, _group(accepted))
        if holder is not None and holder[1]:
            self._pending[peer] = (descriptor, accepted, gen)  # its old entry still drains transfers
            return False
        if holder is not None and holder[0] != peer:
            raise PeerStillHeld(f"{peer}'s NIXL agent is still held by our session {holder[0]} with that consumer: "
                                "an earlier one not ended here yet, or the consumer dials us under two names")
        self._add(peer, descriptor, hello, agent, accepted)
        self._gens[peer] = gen
        return self._warm(peer, gen, accepted)

    def _warm(self, peer: str, gen: int, accepted: bool, after: int | None = None) -> bool:
        """A consumer's hello (not ``accepted``): admit it once :data:`WARM_READS` warm-up READs
        of its window completed one after the other, while it is still in its handshake
        (NixlBlockAgent.warm, decision N15); ``after``: READs still to post once this one is done."""
        if accepted:
            return True
        if after is None:
            after = WARM_READS - 1
        try:
            self._warming[self._agent.warm(peer)] = (peer, gen, after)
        except (NixlError, ValueError) as exc:
            log.warning("kvtier: no warm-up READ for %s (%s): its first WRITE may wait for it to progress", peer, exc)
            return True
        return False

    def _add(self, peer: str, descriptor: bytes, hello: _Hello, agent: str, accepted: bool) -> None:
        if peer in self._peers:
            self._drop_entry(peer)
        try:
            # an inbound peer (its hello) is one we write into; a dialled one (its hello_ack)
            # writes into us.  Only inbound peers exclude each other (the refusal the revocation
            # proof above rests on); two managers with a session each way hold each other's agent
            # once per direction (the symmetric path, decision Y13)
            self._agent.add_peer(peer, hello.agent, group=_group(accepted))
        except (NixlError, ValueError, TypeError) as exc:
            raise PlaneError(f"{peer}'s NIXL descriptor: {exc}") from None
        self._peers[peer] = descriptor
        if hello.packed:
            self._packed.add(peer)
        else:
            self._packed.discard(peer)
        self._agents[peer] = (agent, hello.owner)
        if len(self._agents) > 4 * len(self._peers) + 1024:  # forget agents nobody revokes
            keep = self._peers.keys() | self._revoking.keys()
            self._agents = {p: a for p, a in self._agents.items() if p in keep}
        w = self._windows.get(peer)
        if w is not None:
            w.agent, w.owner = agent, hello.owner
        if accepted:
            now = time.monotonic()
            for rev in self._revoking.values():
                if rev.agents.pop(agent, None) is not None and not rev.agents and rev.proven_at is None:
                    rev.proven_at = now
            for sink in self._sinks:  # that agent's earlier WRITEs into us are over
                if sink.agent == agent and sink.proven_at is None:
                    sink.proven_at = now

    def remove_peer(self, peer: str) -> None:
        """``peer``'s session ended: stop posting to it (WRITEs already posted run to their end
        and are reported) and withdraw the window that session was given, so nothing it still
        writes can land in our slots (:meth:`revoke` reports when that is certain)."""
        self._pending.pop(peer, None)
        self._gens.pop(peer, None)
        self._dialling.discard(peer)
        self._writes.forget(peer)
        self._drop_entry(peer)
        w = self._windows.pop(peer, None)
        if w is not None:
            self._withdraw(w)

    def _drop_entry(self, peer: str) -> None:
        self._packed.discard(peer)
        if self._peers.pop(peer, None) is not None and not self._closed:
            self._agent.remove_peer(peer)

    def _withdraw(self, w: Window) -> None:
        """Deregister ``w`` and overmap it with a sink (module docstring); keep its addresses."""
        if w.withdrawn_at is not None:
            return
        self._agent.close_window(w.registration)
        w.registration = None
        try:
            shared.withdraw(w.addr, self._backing.size)  # type: ignore[union-attr]
        except OSError as exc:  # pragma: no cover - MAP_FIXED over our own mapping does not fail
            log.critical("kvtier: withdrawing %s's NIXL window failed (%s): its late WRITEs may still land", w.peer, exc)
        w.withdrawn_at = time.monotonic()
        self._sinks.append(w)
        if len(self._sinks) >= self._sinks_warned:
            self._sinks_warned *= 2
            log.warning("kvtier: %d withdrawn NIXL windows still mapped (%d MiB of address space each): their "
                        "producers were never proven unable to write into them", len(self._sinks),
                        self._backing.size >> 20)  # type: ignore[union-attr]

    # -- producer ------------------------------------------------------------------------------
    def post(self, peer: str, kv_request_id: str, round: int, batches: Sequence[Batch]) -> None:
        self._writes.start((kv_request_id, round), peer, batches, known=peer in self._peers,
                           packed=peer in self._packed)

    def _outcome(self, ev: XferResult | PeerFault) -> None:
        """An agent outcome that is not a transfer's WRITE (the pipeline hands it over)."""
        if isinstance(ev, PeerFault):
            # every later WRITE to this entry would fail at its post (the agent keeps the fault):
            # report it once, so the core ends the session and a new one adds the peer anew
            # (decision I25); an entry already removed has no session left to end
            log.info("kvtier: NIXL path to %s failed: %s", ev.peer, ev.cause)
            if ev.peer in self._peers:
                self._faults.append(Faulted(ev.peer, self._gens.get(ev.peer, 0), ev.cause))
        else:  # a warm-up READ (decision N15)
            self._warmed(ev)

    def _warmed(self, ev: XferResult) -> None:
        who = self._warming.pop(ev.xfer_id, None)
        if who is None:  # pragma: no cover - every transfer id is registered when posted
            return
        peer, gen, after = who
        if peer not in self._peers:
            return  # its session ended meanwhile
        if ev.status == "done":
            if after and self._gens.get(peer) == gen and not self._warm(peer, gen, False, after - 1):
                return  # the next READ is posted on the endpoint the last one wired up
            self._attach_reports.append(Attached(peer, gen))
        else:
            self._attach_reports.append(AttachFailed(peer, gen, f"the warm-up READ of its window failed: {ev.detail}"))

    def cancel(self, kv_request_id: str, round: int) -> None:
        self._writes.cancel((kv_request_id, round))

    def referenced(self) -> int:
        return self._writes.referenced()

    @property
    def posts(self) -> int:
        """WRITEs posted since start (tests and benchmarks count them)."""
        return self._writes.posts

    # -- both ----------------------------------------------------------------------------------
    def poll(self) -> list[Report]:
        if self._closed:
            return []
        # a UCX tcp target must call in for WRITEs into it to advance; what arrived complete
        # comes with its notification
        # comes with its notification, which may carry several batches' headers (decision N18)
        out: list[Report] = [Notified(n.peer, (h,)) for n in self._agent.progress() if n.peer is not None
                             for h in unpack_notification(n.message)]
        out.extend(self._landings.poll())
        self._writes.drive()
        if self._faults:  # before the transfers they failed: the core ends the session plane_fault first (I25)
            out.extend(f for f in self._faults if f.peer in self._peers)
            self._faults = []
        if self._writes:
            out.extend(self._writes.released())
        if self._revoking or self._sinks:
            now = time.monotonic()
            if self._revoking:
                out.extend(check_revocations(self._revoking, now, self._me))
            if self._sinks:
                check = now - self._sinks_checked >= CHECK_EVERY_S
                if check:
                    self._sinks_checked = now
                self._sinks = reclaim_sinks(self._sinks, now, check, self._me,
                                            self._backing.size)  # type: ignore[union-attr]
        if self._pending:
            self._retry_pending()
        if self._attach_reports:
            out.extend(self._attach_reports)
            self._attach_reports = []
        if self._faults:
            out.extend(f for f in self._faults if f.peer in self._peers)
            self._faults = []
        return out

    def _retry_pending(self) -> None:
        for peer, (descriptor, accepted, gen) in list(self._pending.items()):
            hello = _HELLO.decode(descriptor)
            agent = decode_descriptor(hello.agent).agent
            holder = self._agent.holder(agent, _group(accepted))
            if holder is not None and holder[1]:
                continue  # its old entry still has transfers in flight
            del self._pending[peer]
            self._gens[peer] = gen
            try:
                self._add(peer, descriptor, hello, agent, accepted)
            except PlaneError as exc:
                self._attach_reports.append(AttachFailed(peer, gen, str(exc)))
            else:
                if self._warm(peer, gen, accepted):
                    self._attach_reports.append(Attached(peer, gen))

    def max_wait_s(self, receiving: bool = True) -> float | None:
        """While a WRITE of ours is in flight, a revocation is pending, a peer could be writing
        into us (``receiving``: a load of ours is outstanding), or a session we dialled is still in
        its handshake (its producer reads our window to warm the endpoint): the progress interval
        (``nixl_progress_interval_s``); otherwise ``None``, so an idle manager is not woken every
        interval (waking 1,000 times a second per connected peer takes the core from the
        manager that is working); no wait at all while a transfer has a WRITE to post that the
        last poll left for after the loop's inputs (decision N22)."""
        if self._writes.backlog:
            return 0.0
        if self._writes or self._revoking or self._pending or self._warming or (receiving and self._peers):
            return self._interval
        if any(p not in self._peers for p in self._windows) or self._dialling.difference(self._peers):
            # a session we dialled is in its handshake: the producer's warm-up READ of our window
            # (or pool) completes only when we progress (N15); nothing else would wake the loop
            return self._interval
        return self._landings.max_wait_s()

    # -- consumer ------------------------------------------------------------------------------
    def land(self, peer: str, key: Any, slots: Sequence[int], payloads: Sequence[Any],
             digests: Sequence[int]) -> int | None:
        """Nothing to copy: the producer's WRITE already put the blocks in ``slots``; check them
        (see :meth:`DataPlane.land <kvtier.dataplane.base.DataPlane.land>`).

        Raises:
            PlaneError: the ``block_data`` carried payload frames (never on a one-sided plane)."""
        if payloads:
            raise PlaneError(f"block_data carries {len(payloads)} payload frames; the nixl plane takes none")
        return self._landings.land(peer, key, slots, None, digests)

    def finish_landings(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the landings running on the digest pool (see
        :meth:`DataPlane.finish_landings <kvtier.dataplane.base.DataPlane.finish_landings>`)."""
        return self._landings.wait(timeout_s)

    def revoke(self, peer: str) -> bool:
        """Make sure ``peer`` can no longer write into our slots; never done on return.

        Windowed pool: ``peer``'s live window is withdrawn now (if its session's end did not do
        it already), and :class:`Revoked` follows from :meth:`poll` once our own progress ran
        for :data:`DRAIN_S` (and :data:`DRAIN_CALLS` polls) since the last withdrawal.
        Otherwise: reported once the agent ``peer`` handshook with is proven unable to write —
        its owner process is gone (:func:`process_gone`), or it accepted a fresh handshake from
        us — and the drain ran since.  See the module docstring."""
        rev = self._revoking.get(peer)
        if rev is None:
            rev = self._revoking[peer] = Revocation()
        if self._backing is not None:
            w = self._windows.pop(peer, None)
            if w is not None:
                self._withdraw(w)
            rev.agents.clear()
            rev.proven_at, rev.drained = time.monotonic(), 0
            return False
        known = self._agents.get(peer)
        if known is not None and known[0] not in rev.agents:
            rev.agents[known[0]] = known[1]
            rev.proven_at = None
        if not rev.agents:
            log.warning("kvtier: cannot revoke %s's NIXL access: its agent is unknown; its slots stay held", peer)
        return False

    def sinks(self) -> int:
        """Withdrawn windows whose addresses are still mapped (tests, metrics)."""
        return len(self._sinks)

    def windows(self) -> dict[str, int]:
        """Live windows: peer -> the session generation it was made for (tests)."""
        return {p: w.gen for p, w in self._windows.items()}

    def revoking(self) -> tuple[str, ...]:
        """Peers whose revocation is pending."""
        return tuple(self._revoking)

    # -- teardown ------------------------------------------------------------------------------
    def close(self, wait_s: float | None = None) -> list[Report]:
        """Destroy the agent (after at most :data:`CLOSE_WAIT_S`, or ``wait_s`` if less, for WRITEs
        in flight: destroying it stops them, so a shutdown's grace bounds the wait) and report
        a ``Released`` for every transfer and a ``Revoked`` for every pending revocation.  Called
        after the transport closed: no header goes out any more, so a transfer not fully
        reported is released as failed.  Idempotent."""
        if self._closed:
            return []
        wait = CLOSE_WAIT_S if wait_s is None else min(CLOSE_WAIT_S, max(0.0, wait_s))
        out: list[Report] = list(self._writes.close(self._agent.close(timeout_s=wait)))
        self._closed = True
        # the agent is gone: over UCX tcp and RDMA nothing reaches our region any more; over CMA
        # a stale WRITE lands in a sink (every window is withdrawn here: their addresses stay
        # mapped, the manager's process may live on); without windows see docs/dataplane.md
        for w in self._windows.values():
            w.registration = None  # deregistered with the agent
            if w.withdrawn_at is None and self._backing is not None:
                shared.withdraw(w.addr, self._backing.size)
                w.withdrawn_at = time.monotonic()
        self._windows.clear()
        self._dialling.clear()
        self._sinks.clear()
        self._pending.clear()
        self._warming.clear()
        # a window's withdrawal revokes; without windows, only an agent that cannot write once ours
        # is gone does (N27): a producer on this host that runs on still writes by CMA
        self.unrevoked = tuple(p for p, rev in self._revoking.items()
                               if self._backing is None and not ended_by_close(rev, self._me))
        out.extend(Revoked(p) for p in self._revoking if p not in self.unrevoked)
        self._revoking.clear()
        self._peers.clear()
        self._gens.clear()
        self._faults.clear()
        out.extend(self._landings.close())  # checks only read the pool; let them end first
        return out


def _group(accepted: bool) -> str:
    """The agent group of a peer entry: one we dialled (its hello_ack: it writes into us) or an
    inbound one (its hello: we write into it); only entries of one group exclude each other."""
    return WRITER_GROUP if accepted else "inbound"
