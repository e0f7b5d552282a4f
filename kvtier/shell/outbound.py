"""Outbound: one table from effect type to the performer that carries it out.

A performer does I/O (a socket send, a data-plane call, a copy into a slot and its digest check,
a job result) and returns what it learned as *inputs* for the core's next step — a failed send,
a connection that came up, a descriptor the plane took or refused, blocks landed and checked.
It never calls the core.  The shell applies those inputs after the effects of the current step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kvtier.advice import handshake_hint
from kvtier.dataplane import Batch, DataPlane, PlaneError
from kvtier.integrity import block_digests, check_blocks
from kvtier.lifecycle import Reason
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.metrics import TierMetrics
from kvtier.shell.jobs import JobLedger
from kvtier.shell.logs import RateLimitedLog
from kvtier.shell.perbyte import ByteWork
from kvtier.shell.serving import ServeWindows
from kvtier.transport import DialNotAllowed, Transport, TransportError
from kvtier.wire import messages as wm
from kvtier.wire.codec import encode, encode_frames

__all__ = ["MAX_BATCH_BYTES", "Outbound", "TAIL_BYTES", "plan_batches"]

#: Largest block_data message we build (bytes of payload); P1 in docs/benchmarks.md compares the zmq
#: plane with raw pyzmq sending the same messages.
MAX_BATCH_BYTES = 8 << 20

#: The last batch of a transfer holds at most this many bytes (at least one block), the one before
#: it twice as many, and so on up to MAX_BATCH_BYTES: the consumer checks each batch while the
#: next one travels, so what it still has to check once the last bytes arrived is small
#: (decision I14).
TAIL_BYTES = 1 << 20


def plan_batches(n: int, per: int, tail: int) -> list[int]:
    """Batch sizes (in blocks) for a transfer of ``n`` blocks: batches of ``per`` blocks, ending
    in a taper that halves down to two of ``tail`` (``n=256, per=8, tail=1``: 31 × 8, 4, 2, 1,
    1); a transfer of at most ``tail`` blocks is one batch.  Sizes sum to ``n``, none is empty.

    Raises:
        ValueError: ``per`` or ``tail`` is not positive.
    """
    if per < 1 or tail < 1:
        raise ValueError(f"per and tail must be positive, got {per} and {tail}")
    tail = min(tail, per)
    if n <= tail:
        return [n] if n > 0 else []
    sizes: list[int] = []
    size, second = tail, False
    while n > 0:  # built from the end
        take = min(size, n)
        sizes.append(take)
        n -= take
        if second:
            size = min(per, size * 2)
        second = True
    sizes.reverse()
    return sizes

#: Messages whose failed send ends the session (a lost fetch, answer or receipt would otherwise
#: wait for a deadline); goodbyes, refusals and heartbeats to a peer that is already gone do not.
_FAILURE_ENDS_SESSION = frozenset({wm.Hello, wm.HelloAck, wm.Fetch, wm.AbortFetch, wm.Receipt, wm.TransferDone,
                                   wm.AbortAck, wm.Probe, wm.ProbeReply})

Inputs = list[ix.Input]


class Outbound:
    """Performs effects for one manager (under its lock).

    Args:
        transport, plane, pool: what effects act on.
        jobs: the job ledger (``JobDone`` goes there).
        metrics, logs: counters and rate-limited lines.
        work: the per-byte work (landings on the digest pool, and what waits for them).
        clock: seconds (the manager's clock).
        loads: the core's consumer view by ``kv_request_id`` (how many blocks a load has landed).
    """

    def __init__(self, *, transport: Transport, plane: DataPlane, pool: Any, jobs: JobLedger, metrics: TierMetrics,
                 logs: RateLimitedLog, work: ByteWork, clock: Callable[[], float],
                 loads: Callable[[str], Any] = lambda kv_request_id: None, vet: Any = None,
                 serving: ServeWindows | None = None) -> None:
        self.transport = transport
        self.plane = plane
        self.pool = pool
        self.jobs = jobs
        self.metrics = metrics
        self.logs = logs
        self.work = work
        self.clock = clock
        self.integrity = work.algorithm
        self.loads = loads  # kv_request_id -> the core's ConsumerView (read API), for a load's last batch
        self.vet = vet
        """``allowed_peers``' check of what a hostname resolves to (None: the policy lists names only)."""
        self.serving = serving if serving is not None else ServeWindows(on_error=metrics.internal_error)
        """The serve windows (the symmetric path's lookups, contexts and pins)."""
        self.forensics: Any = None
        """The request forensics (:class:`kvtier.forensics.Forensics`): shown every batch of
        effects before it is performed (its one feed, decision E3); None: off."""
        self.posted: dict[tuple[str, int], float] = {}
        """transfer -> when it was handed to the plane (the producer's transfer-time histogram)."""
        self._per_batch = max(1, MAX_BATCH_BYTES // pool.block_bytes)
        self._tail = max(1, TAIL_BYTES // pool.block_bytes)
        self.PERFORMERS: dict[type, Callable[[Any], Inputs | None]] = {
            fx.Send: self._send,
            fx.JobDone: self._job_done,
            fx.SendBlocks: self._send_blocks,
            fx.CancelTransfer: self._cancel,
            fx.LandBlocks: self._land,
            fx.RevokeAccess: self._revoke,
            fx.OpenConnection: self._open,
            fx.CloseConnection: self._close,
            fx.AttachPeer: self._attach,
            fx.DetachPeer: self._detach,
            fx.SessionEnded: self._session_ended,
            fx.SlotsHeld: self._slots_held,
            fx.Ignored: self._ignored,
            fx.LookUpBlocks: self.serving.queue_lookup,
            fx.CloseLookup: self.serving.queue_close,
            fx.ReleasePins: self._release_pins,
        }
        self.SEND_NOTES: dict[type, Callable[[str, Any], None]] = {
            wm.TransferDone: self._note_done,
            wm.HelloReject: self._note_reject,
            wm.ProbeReply: lambda peer, m: self.metrics.served(sum(m.hits), len(m.hits) - sum(m.hits)),
        }

    def perform(self, effects: Sequence[fx.Effect]) -> Inputs:
        """Carry out ``effects`` in order; return the inputs they produced, in order."""
        produced: Inputs = []
        table = self.PERFORMERS
        if self.forensics is not None:
            self.forensics.observe(effects)
        for e in effects:
            more = table[type(e)](e)
            if more:
                produced.extend(more)
        return produced

    # -- messages ------------------------------------------------------------------------------
    def _send(self, e: fx.Send) -> Inputs | None:
        msg = e.msg
        note = self.SEND_NOTES.get(type(msg))
        if note is not None:
            note(e.peer, msg)
        handle = self.transport.send(e.peer, encode_frames(msg))
        if handle.failed and type(msg) in _FAILURE_ENDS_SESSION:
            return [ix.SendFailed(e.peer)]
        return None

    def _note_done(self, peer: str, msg: wm.TransferDone) -> None:
        if not msg.ok and msg.final:  # a notice refuses nothing: the terminal answer follows
            self.metrics.fetch_refused(msg.reason)
            if msg.reason == Reason.NOT_AUTHORISED:
                self.logs(peer, msg.reason, "kvtier: refused %s's fetch of %s: it is not the consumer the producer "
                          "request named for this id (nothing changed)", self.logs.who(peer), msg.kv_request_id)

    def _note_reject(self, peer: str, msg: wm.HelloReject) -> None:
        self.metrics.session_ended(msg.reason)
        if msg.field == "max_peers":
            self.logs(peer, msg.reason, "kvtier: refusing a session from %s: max_peers=%s reached",
                      self.logs.who(peer), msg.ours)
        else:
            self.logs(peer, msg.reason, "kvtier: rejecting hello from %s: %s differs (ours %s, theirs %s)%s",
                      self.logs.who(peer), msg.field, msg.ours or "(withheld)", msg.theirs or "(not shown)",
                      handshake_hint(msg.field), level=logging.ERROR)
        self.logs.forget(peer)

    # -- jobs ----------------------------------------------------------------------------------
    def _job_done(self, e: fx.JobDone) -> None:
        keys = self._verified(e) if e.successful_keys else None
        done = self.jobs.finish(e.job_id, e.ok, e.reason, self.clock(), successful_keys=keys)
        if done is None:  # the core guarantees exactly once; count instead of crashing the engine
            self.metrics.internal_error()
            return
        store, nbytes, elapsed = done
        if e.reason is Reason.NOT_AUTHORISED:
            self.logs("*", e.reason, "kvtier: %s job %d refused: not_authorised (the producer request named another "
                      "consumer for this id; check remote_decoder.consumer and this manager's CURVE principal)",
                      "store" if store else "load", e.job_id)
        # an ok result carries a reason only when it says why nothing moved (not_needed)
        self.metrics.job_done("store" if store else "load", e.ok, e.reason if e.ok else (e.reason or Reason.TRANSFER_FAILED))
        if e.ok and not store:
            self.metrics.transfer("consumer", nbytes, elapsed)

    def _verified(self, e: fx.JobDone) -> tuple[bytes, ...] | None:
        """A failed load's ``successful_keys``, re-checked where the peer wrote the slots itself
        (one-sided planes: ``verify``), so no key is reported whose bytes do not match now
        (property ``partial_keys_verified``); never any with integrity checking off."""
        if self.integrity == "none":
            return None
        if not e.verify:
            return e.successful_keys
        pool = self.pool
        keep = tuple(k for k, (slot, d) in zip(e.successful_keys, e.verify)
                     if check_blocks([pool.buffer(slot)], (d,), self.integrity) < 0)
        if len(keep) != len(e.verify):
            self.logs("*", "corrupt", "kvtier: job %d: %d landed blocks no longer match their digests; not reported",
                      e.job_id, len(e.verify) - len(keep))
        return keep or None

    def _release_pins(self, e: fx.ReleasePins) -> None:
        self.serving.release(e)
        self.metrics.pins_released(len(e.pins), e.ok, e.reason)

    # -- data plane ----------------------------------------------------------------------------
    def _send_blocks(self, e: fx.SendBlocks) -> None:
        """Cut the transfer into block_data batches for the plane (:func:`plan_batches`: at most
        ``MAX_BATCH_BYTES`` each — and no larger than the plane's header limit allows — tapering
        to ``TAIL_BYTES``).  A served round's blocks get their digests here (``take_digests``,
        decision Y9): pinned blocks do not change while pinned, so the engine's serve window stays
        free of hashing; the digest pool spreads them over cores."""
        per, one_sided = self._per_batch, self.plane.one_sided
        digests = e.digests
        if e.take_digests and self.integrity != "none":
            buffers = [self.pool.buffer(b) for b in e.blocks]
            dp = self.work.digest_pool
            digests = (dp.submit_digests(buffers, self.integrity).result() if dp is not None
                       else block_digests(buffers, self.integrity))
        if self.plane.max_header_bytes is not None:
            per = min(per, self._header_fits(e))
        batches = []
        first = 0
        for count in plan_batches(len(e.blocks), per, self._tail):
            end = first + count
            header = encode(wm.BlockData(gen=e.gen, kv_request_id=e.kv_request_id, round=e.round, first=first,
                                         count=count, digests=list(digests[first:end])))
            batches.append(Batch(first, e.blocks[first:end], e.slots[first:end] if one_sided else (), header))
            first = end
        key = e.transfer or e.kv_request_id
        self.posted[(key, e.round)] = self.clock()
        self.plane.post(e.peer, key, e.round, batches)

    def _header_fits(self, e: fx.SendBlocks) -> int:
        """Blocks per batch whose ``block_data`` header fits the plane's ``max_header_bytes``."""
        limit = self.plane.max_header_bytes or 0
        if not e.digests and not (e.take_digests and self.integrity != "none"):
            return self._per_batch
        one = len(encode(wm.BlockData(gen=e.gen, kv_request_id=e.kv_request_id, round=e.round, first=len(e.blocks),
                                      count=1, digests=[2**64 - 1])))
        # each further digest takes at most 9 bytes (a msgpack uint64); 4 more for a longer
        # count and the digest array's longer length prefix
        return max(1, 1 + (limit - one - 4) // 9)

    def _cancel(self, e: fx.CancelTransfer) -> None:
        self.plane.cancel(e.kv_request_id, e.round)

    def _land(self, e: fx.LandBlocks) -> Inputs | None:
        """Land one block_data's blocks and check each against its parked digest (the plane does
        both; a large landing ends on the digest pool, and its ``blocks_landed`` comes from the
        per-byte work in a later tick)."""
        count = len(e.slots)
        key = (e.kv_request_id, e.round, e.first, count)
        try:
            bad = self.plane.land(e.peer, key, e.slots, e.payloads, e.digests)
        except PlaneError as exc:
            self.metrics.wire_error("bad_payload")
            self.logs(e.peer, "bad_payload", "kvtier: bad block_data from %s: %s", self.logs.who(e.peer), exc)
            return [ix.BlocksLanded(e.peer, e.kv_request_id, e.round, e.first, count, False, Reason.CORRUPT)]
        work = self.work
        view = self.loads(e.kv_request_id)
        if view is not None and work.last(key, view.landed, len(view.keys)) and (bad is None or work.held()):
            work.settle = True  # the load's result can go out in this tick (Loop.tick)
        if bad is None:
            work.landing(e.peer, key)
            return None
        return [work.result(e.peer, key, bad)]

    def _revoke(self, e: fx.RevokeAccess) -> Inputs | None:
        return [ix.AccessRevoked(e.peer)] if self.plane.revoke(e.peer) else None

    def _attach(self, e: fx.AttachPeer) -> Inputs | None:
        try:
            if not self.plane.add_peer(e.peer, e.descriptor, accepted=e.accepted, gen=e.gen):
                return None  # deferred: the plane reports Attached / AttachFailed later
        except PlaneError as exc:
            self.metrics.wire_error("bad_field")
            self.logs(e.peer, "descriptor", "kvtier: %s sent a data-plane descriptor we cannot use: %s",
                      self.logs.who(e.peer), exc, level=logging.ERROR)
            return [ix.AttachRefused(e.peer, e.gen, str(exc))]
        return [ix.PeerAttached(e.peer, e.gen)]

    def _detach(self, e: fx.DetachPeer) -> None:
        self.plane.remove_peer(e.peer)

    # -- transport -----------------------------------------------------------------------------
    def _open(self, e: fx.OpenConnection) -> Inputs:
        try:
            # fail_fast: a refused dial is reported at once (ConnectFailed), never retried
            self.transport.connect(e.peer, fail_fast=True, vet=self.vet)
            descriptor = self.plane.session_descriptor(e.peer, e.gen)
        except DialNotAllowed as exc:
            self.metrics.rejected_peer()
            self.logs(e.peer, "peer_not_allowed", "kvtier: refusing to dial %s: %s", e.peer, exc)
            return [ix.ConnectFailed(e.peer, str(exc), not_allowed=True)]
        except (TransportError, ValueError, PlaneError) as exc:
            self.logs(e.peer, "connect", "kvtier: cannot connect to %s: %s", e.peer, exc)
            return [ix.ConnectFailed(e.peer, str(exc))]
        return [ix.ConnectionUp(e.peer, descriptor)]

    def _close(self, e: fx.CloseConnection) -> None:
        self.transport.drop_peer(e.peer, linger_s=e.linger_s)

    # -- observations --------------------------------------------------------------------------
    def _session_ended(self, e: fx.SessionEnded) -> None:
        self.metrics.session_ended(e.reason)
        # a goodbye (ours or the peer's) is routine; every other ending is a fault
        level = logging.INFO if e.reason in (Reason.SHUTDOWN, Reason.PEER_DISCONNECTED) else logging.WARNING
        self.logs(e.peer, e.reason, "kvtier: session with %s ended: %s", self.logs.who(e.peer, e.instance), e.reason,
                  level=level)
        self.logs.forget(e.peer)

    def _slots_held(self, e: fx.SlotsHeld) -> None:
        self.logs(e.peer, "slots_held",
                  "kvtier: load %s: %d slots still held: the data plane cannot withdraw %s's access to them by itself "
                  "(the pool is not shared memory); held until that producer is proven gone or accepts a fresh "
                  "handshake", e.kv_request_id, e.slots, self.logs.who(e.peer), level=logging.WARNING)

    def _ignored(self, e: fx.Ignored) -> None:
        self.metrics.ignored(e.machine, e.reason)
