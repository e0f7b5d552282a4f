"""The data-plane seam: what the manager asks of a plane, and what a plane reports.

Contract (the safety argument in docs/lifecycle.md rests on it):

* **References.** From :meth:`DataPlane.post` until the plane reports :class:`Released` for that
  transfer, the plane may read the producer's blocks.  It reports ``Released`` exactly once per
  posted transfer, and only when it holds no reference to any of its blocks — whether it moved
  them all (``failed=False``) or gave up (``failed=True``).  Nothing else returns blocks to the
  engine (decision I1).
* **Cancel** stops posting; what is already posted runs to completion (no engine can be trusted to
  cancel a posted transfer).  A transfer whose references outlive the producer's patience is
  forced out by ending the session: the transport drops the connection and the plane's references
  with it.
* **Landing** (consumer): on a receiver-applied plane (``one_sided=False``) block bytes reach a
  slot only through :meth:`DataPlane.land`, which the core asks for only while the load is in
  flight.  On a one-sided plane the producer writes into the slots itself, so the consumer must
  not hand a slot back until the producer's terminal answer — or until :meth:`DataPlane.revoke`
  confirmed that the producer can no longer write (:class:`Revoked`).  ``land`` also checks every
  block against its parked digest.  A landing too large to do on the caller's thread runs on the
  manager's :class:`~kvtier.integrity.DigestPool` and is reported by :meth:`DataPlane.poll`
  (:class:`Landed`); a receiver-applied plane's ``revoke`` is true only once no landing into a
  load of that peer is still copying (the shell holds every later input of the peer behind its
  landings, so a load's slots are handed back only after its copies ended: decision I14).
* **Notifications** (one-sided planes): a batch's ``block_data`` header may reach the consumer
  with the data itself instead of on the control connection (NIXL: the WRITE's notification,
  delivered after its bytes); the plane reports it as :class:`Notified` and the shell hands it to
  the core as if the transport had delivered it.
* **Faults**: a plane whose path to a peer broke reports it once (:class:`Faulted`) instead of
  failing that peer's transfers one by one for as long as the session lives; the core ends the
  session, and a new one adds the peer anew.
* A plane never decides: it never fails a job, never ends a session, never answers a peer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from kvtier.errors import KvTierError

__all__ = ["AttachFailed", "Attached", "Batch", "DataPlane", "Faulted", "Landed", "Notified", "PlaneError",
           "Released", "Report", "Revoked"]


class PlaneError(KvTierError):
    """A data plane cannot start, or a peer's descriptor or payload does not fit it."""


class PeerIsSelf(PlaneError):
    """The peer's descriptor names this plane's own agent: the tier dialled its own address (a
    request naming the instance that serves it). A NIXL agent cannot be its own remote; the zmq
    plane has no agent and loads it."""


class PeerStillHeld(PlaneError):
    """A consumer's new session names the agent an earlier session of it still holds here (that
    session has not ended on this side yet): refused for now, not a mismatch; the consumer's next
    handshake is admitted once the earlier session ended."""


@attrs.frozen(slots=True)
class Batch:
    """One ``block_data`` message worth of a transfer.

    ``blocks``: producer pool blocks (fetch key order); ``slots``: the consumer's destination slots
    for them (used by one-sided planes; empty on zmq); ``header``: the encoded ``block_data``
    header the plane sends when the blocks are on their way (zmq: with the payload frames;
    one-sided: after the WRITE completed).
    """

    first: int
    blocks: tuple[int, ...]
    slots: tuple[int, ...]
    header: bytes


@attrs.frozen(slots=True)
class Released:
    """The plane holds no reference to the blocks of transfer ``(kv_request_id, round)`` any more.

    ``failed``: it could not move every block (send failed, connection dropped before the bytes
    left, WRITE error).  ``nbytes``: block bytes it moved."""

    kv_request_id: str
    round: int
    failed: bool
    nbytes: int = 0
    detail: str = ""


@attrs.frozen(slots=True)
class Revoked:
    """The producer ``peer`` can no longer write into this manager's slots (one-sided planes)."""

    peer: str


@attrs.frozen(slots=True)
class Landed:
    """A landing :meth:`DataPlane.land` started (it returned ``None``) has ended: the blocks are
    in their slots and were checked; ``bad`` is the index (in the landing) of the first block that
    did not match its digest, ``-1`` when all matched.  ``key`` is the caller's, unchanged."""

    peer: str
    key: Any
    bad: int


@attrs.frozen(slots=True)
class Notified:
    """A ``block_data`` header (``frames``, as the transport would deliver them) that ``peer``'s
    one-sided plane sent along with the data it wrote into our slots, which were complete when it
    arrived."""

    peer: str
    frames: tuple[bytes, ...]


@attrs.frozen(slots=True)
class Attached:
    """A deferred :meth:`DataPlane.add_peer` for ``peer``'s session ``gen`` is done."""

    peer: str
    gen: int


@attrs.frozen(slots=True)
class AttachFailed:
    """A deferred :meth:`DataPlane.add_peer` for ``peer``'s session ``gen`` failed (``detail``)."""

    peer: str
    gen: int
    detail: str = ""


@attrs.frozen(slots=True)
class Faulted:
    """The plane's path to ``peer`` (added for its session generation ``gen``) broke: every later
    transfer to it would fail until the peer is added anew (NIXL: a remote disconnect at a post
    or a state check).  Reported once per added peer; the core ends the session (decision I25)."""

    peer: str
    gen: int
    detail: str = ""


Report = Released | Revoked | Landed | Notified | Attached | AttachFailed | Faulted
"""What :meth:`DataPlane.poll` reports."""


@runtime_checkable
class DataPlane(Protocol):
    """How block bytes travel. Not thread-safe: the manager calls it under its lock."""

    name: str
    """``"zmq"`` or ``"nixl"``: compared in the handshake."""
    one_sided: bool
    """True when the producer writes into the consumer's slots (the fetch must name them)."""
    posts: int
    """Sends (zmq: ``block_data`` messages; NIXL: WRITEs) posted since start."""

    def descriptor(self) -> bytes:
        """What a peer needs to reach our memory (``b""`` for zmq), sent in hello/hello_ack."""
        ...

    def session_descriptor(self, peer: str, gen: int) -> bytes:
        """The descriptor the session of generation ``gen`` that we dial to ``peer`` announces in
        its hello: ``b""`` for :meth:`descriptor`; a plane that withdraws access per session
        (NIXL windows) makes one for this session here."""
        ...

    revocation_bounded: bool
    """True when :meth:`revoke` withdraws a peer's access by itself, within ``revoke_timeout_s``
    (receiver-applied planes; NIXL over a shared-memory pool); False when it waits for proof
    about the peer (then the core holds a load's slots past its revoke deadline, and says so)."""
    unrevoked: tuple[str, ...]
    """Peers whose pending revocation :meth:`close` could not complete: they may still write into
    their loads' slots (NIXL, a private pool, a producer on this host that runs on, decision N27)."""

    def add_peer(self, peer: str, descriptor: bytes, *, accepted: bool = False, gen: int = 0) -> bool:
        """Prepare to move blocks to/from ``peer`` (its session generation ``gen``).  Returns
        True when done now; False when deferred (then :meth:`poll` reports :class:`Attached` or
        :class:`AttachFailed` for ``gen`` later).  Raises PlaneError for a bad descriptor.

        ``accepted``: the descriptor came with the peer's ``hello_ack`` to our current hello, so
        the peer's plane took our descriptor in this handshake (a one-sided plane may learn from
        that that the peer's earlier writes into us are over)."""
        ...

    def remove_peer(self, peer: str) -> None:
        """Forget ``peer`` (its session ended). Idempotent."""
        ...

    def post(self, peer: str, kv_request_id: str, round: int, batches: Sequence[Batch]) -> None:
        """Start moving a transfer's batches to ``peer``; never blocks, never raises for peer
        conditions (a failure is reported as ``Released(failed=True)``)."""
        ...

    def cancel(self, kv_request_id: str, round: int) -> None:
        """Post nothing more for this transfer; ``Released`` follows once nothing is referenced.
        Unknown transfers are ignored."""
        ...

    def poll(self) -> list[Report]:
        """What happened since the last call."""
        ...

    def land(self, peer: str, key: Any, slots: Sequence[int], payloads: Sequence[Any],
             digests: Sequence[int]) -> int | None:
        """Put the blocks of one ``block_data`` from ``peer`` into ``slots`` and check each against
        its digest (``digests[i]`` for ``slots[i]``; the manager's ``integrity`` algorithm).

        Returns the index of the first mismatching block, or ``-1`` when all match, when done on
        return (small landings: handing them to another thread would cost more than doing them);
        else ``None``, and :meth:`poll` reports :class:`Landed` with ``key`` once done.

        Raises:
            PlaneError: the payload frames do not fit this plane (wrong count or size); nothing
                was landed."""
        ...

    def finish_landings(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for every landing running on the digest pool; whether
        they all ended (:meth:`poll` reports them).  For a load whose last blocks have landed:
        its result then goes out in this tick instead of the next."""
        ...

    def revoke(self, peer: str) -> bool:
        """Make sure ``peer`` can no longer write into our slots. True when that already holds on
        return; otherwise :class:`Revoked` is reported by :meth:`poll` later."""
        ...

    def referenced(self) -> int:
        """Posted transfers whose blocks the plane still references."""
        ...

    def max_wait_s(self, receiving: bool = True) -> float | None:
        """The longest the manager may wait for network input before calling :meth:`poll` again
        (seconds), or ``None`` when the plane's own progress needs no calls (its data arrives on
        the transport, whose wait wakes for it).  ``receiving``: whether any load of this manager
        is outstanding, i.e. whether a peer may be writing into the pool at all (the core knows;
        an idle consumer need not be woken for WRITEs nobody was asked for)."""
        ...

    max_header_bytes: int | None
    """The largest encoded ``block_data`` header the plane can carry (a NIXL notification is at
    most 4 KiB), or ``None`` (no limit beyond the wire's)."""

    def close(self, wait_s: float | None = None) -> list[Report]:
        """Release everything (the transport is closed first, so nothing can be in flight) and
        report a ``Released`` for every transfer not reported yet, a ``Landed`` for every landing
        not reported yet (waiting for it to end: nothing may write into the pool after close) and
        a ``Revoked`` for every peer whose revocation was still pending.  ``wait_s``: at most this
        many seconds for work in flight that may still end by itself (NIXL: WRITEs), what is left
        of a shutdown's grace; ``None``: the plane's own bound.  Landings end first whatever it is."""
        ...
