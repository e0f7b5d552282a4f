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

from kvtier.dataplane import Batch, DataPlane, PlaneError
from kvtier.integrity import block_digests, check_blocks
from kvtier.lifecycle import Reason
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.metrics import TierMetrics
from kvtier.shell.jobs import JobLedger
from kvtier.shell.logs import RateLimitedLog
from kvtier.shell.serving import ServeWindows
from kvtier.transport import Transport, TransportError
from kvtier.wire import messages as wm
from kvtier.wire.codec import encode, encode_frames

__all__ = ["MAX_BATCH_BYTES", "Outbound"]

#: Largest block_data message we build (bytes of payload); limits.md: keep zmq messages ≤ 16 MiB.
MAX_BATCH_BYTES = 8 << 20

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
        integrity: the digest algorithm both peers agreed on (``none``: no check).
        clock: seconds (the manager's clock).
    """

    def __init__(self, *, transport: Transport, plane: DataPlane, pool: Any, jobs: JobLedger, metrics: TierMetrics,
                 logs: RateLimitedLog, integrity: str, clock: Callable[[], float],
                 serving: ServeWindows | None = None) -> None:
        self.transport = transport
        self.plane = plane
        self.pool = pool
        self.jobs = jobs
        self.metrics = metrics
        self.logs = logs
        self.integrity = integrity
        self.clock = clock
        self.serving = serving if serving is not None else ServeWindows(on_error=metrics.internal_error)
        """The serve windows (the symmetric path's lookups, contexts and pins)."""
        self.posted: dict[tuple[str, int], float] = {}
        """transfer -> when it was handed to the plane (the producer's transfer-time histogram)."""
        self._per_batch = max(1, MAX_BATCH_BYTES // pool.block_bytes)
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
        if not msg.ok:
            self.metrics.fetch_refused(msg.reason)

    def _note_reject(self, peer: str, msg: wm.HelloReject) -> None:
        self.metrics.session_ended(msg.reason)
        if msg.field == "max_peers":
            self.logs(peer, msg.reason, "kvtier: refusing a session from %s: max_peers=%s reached",
                      self.logs.who(peer), msg.ours)
        else:
            self.logs(peer, msg.reason, "kvtier: rejecting hello from %s: %s differs (ours %s, theirs %s)",
                      self.logs.who(peer), msg.field, msg.ours or "(withheld)", msg.theirs or "(not shown)",
                      level=logging.ERROR)
        self.logs.forget(peer)

    # -- jobs ----------------------------------------------------------------------------------
    def _job_done(self, e: fx.JobDone) -> None:
        keys = self._verified(e) if e.successful_keys else None
        done = self.jobs.finish(e.job_id, e.ok, e.reason, self.clock(), successful_keys=keys)
        if done is None:  # the core guarantees exactly once; count instead of crashing the engine
            self.metrics.internal_error()
            return
        store, nbytes, elapsed = done
        self.metrics.job_done("store" if store else "load", e.ok, None if e.ok else (e.reason or Reason.TRANSFER_FAILED))
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
        """Cut the transfer into block_data batches (≤ ``MAX_BATCH_BYTES`` each) for the plane.
        A served round's blocks get their digests here (``take_digests``): pinned blocks do not
        change while pinned, and the engine's serve window stays free of hashing."""
        per, one_sided = self._per_batch, self.plane.one_sided
        digests = e.digests
        if e.take_digests:
            digests = block_digests([self.pool.buffer(b) for b in e.blocks], self.integrity)
        batches = []
        for first in range(0, len(e.blocks), per):
            blocks = e.blocks[first : first + per]
            header = encode(wm.BlockData(gen=e.gen, kv_request_id=e.kv_request_id, round=e.round, first=first,
                                         count=len(blocks), digests=list(digests[first : first + per])))
            batches.append(Batch(first, blocks, e.slots[first : first + per] if one_sided else (), header))
        key = e.transfer or e.kv_request_id
        self.posted[(key, e.round)] = self.clock()
        self.plane.post(e.peer, key, e.round, batches)

    def _cancel(self, e: fx.CancelTransfer) -> None:
        self.plane.cancel(e.kv_request_id, e.round)

    def _land(self, e: fx.LandBlocks) -> Inputs:
        """Land one block_data's blocks and check each against its parked digest."""
        count = len(e.slots)
        try:
            self.plane.land(e.slots, e.payloads)
        except PlaneError as exc:
            self.metrics.wire_error("bad_payload")
            self.logs(e.peer, "bad_payload", "kvtier: bad block_data from %s: %s", self.logs.who(e.peer), exc)
            return [ix.BlocksLanded(e.peer, e.kv_request_id, e.round, e.first, count, False, Reason.CORRUPT)]
        pool = self.pool
        bad = check_blocks([pool.buffer(s) for s in e.slots], e.digests, self.integrity)
        if bad < 0:
            self.metrics.landed(count * pool.block_bytes)
            return [ix.BlocksLanded(e.peer, e.kv_request_id, e.round, e.first, count, True)]
        self.logs(e.peer, "corrupt",
                  "kvtier: block %d of %s round %d from %s does not match its parked digest; the load fails",
                  e.first + bad, e.kv_request_id, e.round, self.logs.who(e.peer))
        return [ix.BlocksLanded(e.peer, e.kv_request_id, e.round, e.first, count, False, Reason.CORRUPT)]

    def _revoke(self, e: fx.RevokeAccess) -> Inputs | None:
        return [ix.AccessRevoked(e.peer)] if self.plane.revoke(e.peer) else None

    def _attach(self, e: fx.AttachPeer) -> Inputs:
        try:
            self.plane.add_peer(e.peer, e.descriptor, accepted=e.accepted)
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
            self.transport.connect(e.peer)
        except (TransportError, ValueError) as exc:
            self.logs(e.peer, "connect", "kvtier: cannot connect to %s: %s", e.peer, exc)
            return [ix.ConnectFailed(e.peer, str(exc))]
        return [ix.ConnectionUp(e.peer)]

    def _close(self, e: fx.CloseConnection) -> None:
        self.transport.drop_peer(e.peer)

    # -- observations --------------------------------------------------------------------------
    def _session_ended(self, e: fx.SessionEnded) -> None:
        self.metrics.session_ended(e.reason)
        # a goodbye (ours or the peer's) is routine; every other ending is a fault
        level = logging.INFO if e.reason in (Reason.SHUTDOWN, Reason.PEER_DISCONNECTED) else logging.WARNING
        self.logs(e.peer, e.reason, "kvtier: session with %s ended: %s", self.logs.who(e.peer, e.instance), e.reason,
                  level=level)
        self.logs.forget(e.peer)

    def _ignored(self, e: fx.Ignored) -> None:
        self.metrics.ignored(e.machine, e.reason)
