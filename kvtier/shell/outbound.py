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

import msgspec

from kvtier.advice import differs, handshake_hint
from kvtier.dataplane import Batch, DataPlane, PeerIsSelf, PeerStillHeld, PlaneError
from kvtier.integrity import block_digests, check_blocks
from kvtier.lifecycle import Reason
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle._table import PERFORM, WIRE
from kvtier.lifecycle.batches import MAX_BATCH_BYTES, TAIL_BYTES, Batcher, plan_batches
from kvtier.metrics import TierMetrics
from kvtier.shell.jobs import JobBook
from kvtier.shell.logs import RateLimitedLog
from kvtier.shell.lookups import Lookups
from kvtier.shell.perbyte import ByteWork
from kvtier.shell.serving import ServeWindows
from kvtier.transport import DialNotAllowed, NameNotResolved, NoServerKey, Transport, TransportError
from kvtier.wire import messages as wm
from kvtier.wire.codec import WireReason, encode, encode_frames

log = logging.getLogger("kvtier.manager")

_ROUTINE = frozenset({Reason.SHUTDOWN, Reason.PEER_DISCONNECTED})  # session ends that follow a goodbye

__all__ = ["MAX_BATCH_BYTES", "Outbound", "TAIL_BYTES", "plan_batches"]


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

    def __init__(self, *, transport: Transport, plane: DataPlane, pool: Any, jobs: JobBook, metrics: TierMetrics,
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
        self.serving = serving if serving is not None else ServeWindows(
            on_error=metrics.internal_error, num_blocks=getattr(pool, "num_blocks", None))
        """The serve windows (the symmetric path's lookups, contexts and pins)."""
        self.lookups: Lookups | None = None
        """The dials' name lookups, off the loop (T19); None: looked up inline, as the dial."""
        self.forensics: Any = None
        """The request forensics (:class:`kvtier.forensics.Forensics`): shown every batch of
        effects around performing it, and each input the core applied (decisions E3, E10); None: off."""
        self.posted: dict[tuple[str, int], float] = {}
        """transfer -> when it was handed to the plane (the producer's transfer-time histogram)."""
        self.changed = False
        """A session ended (or a load of no known id failed) since the loop last published its
        answers: every id's load is looked at again."""
        self.ended: set[str] = set()
        """Ids whose load job ended (failed, or loaded) since the loop last published: only these
        are looked at."""
        self.load_ending: Callable[[str], None] | None = None
        """Told a consumer id whose load job's result is queued next (the loop's publisher)."""
        self.sent_at = float("-inf")
        """When a message or a transfer last left (the manager's clock): a one-sided plane's answer
        to it comes only through the plane's progress (:data:`kvtier.shell.loop.EAGER_S`)."""
        self.posted_at = float("-inf")
        """When a transfer was last handed to the plane: its header goes out only as the plane is
        progressed, on our side too."""
        # effect record -> performer, message struct -> observation when sent: both from the
        # spec's routing tables (kvtier.lifecycle._table.PERFORM, WIRE)
        self.PERFORMERS: dict[type, Callable[[Any], Inputs | None]] = {
            getattr(fx, cls): getattr(self, f"_{name}") for cls, name in PERFORM.items()}
        notes: dict[str, Callable[[str, Any], None]] = {
            "refused": self._note_done,
            "rejecting": self._note_reject,
            "served": lambda peer, m: self.metrics.served(sum(m.hits), len(m.hits) - sum(m.hits)),
        }
        self.SEND_NOTES: dict[type, Callable[[str, Any], None]] = {
            getattr(wm, w.struct): notes[w.sent] for w in WIRE.values() if w.sent}
        self.hooks: dict[str, Callable[[Any], Any]] = {"perform": self.perform, "applied": self.applied}
        """What :func:`kvtier.lifecycle.driver.drive` and ``settle`` are handed: each batch of effects to
        perform, and each input the core applied (:meth:`applied`)."""

    def perform(self, effects: Sequence[fx.Effect]) -> Inputs:
        """Carry out ``effects`` in order; return the inputs they produced, in order."""
        produced: Inputs = []
        table = self.PERFORMERS
        fz = self.forensics
        noted = fz.before(effects) if fz is not None else 0
        try:
            for e in effects:
                try:
                    more = table[type(e)](e)
                except Exception:  # an internal error: the step's other effects still happen (they
                    # may be another job's result), as the core, which decided them all, assumes
                    self.metrics.internal_error()
                    log.exception("kvtier: performing %s failed; the rest of its step goes on", type(e).__name__)
                    continue
                if more:
                    produced.extend(more)
        finally:  # a performer that raised (an internal error): the batch is noted all the same
            if fz is not None:
                try:
                    fz.after(effects, noted)
                except Exception as exc:  # noqa: BLE001 - the ring is a diagnostic: the batch's work stands
                    self.metrics.internal_error()
                    self.logs("*", "forensics_failed", "kvtier: the request forensics failed on a batch of "
                              "effects: %r", exc, level=logging.ERROR)
        return produced

    def applied(self, inp: ix.Input) -> None:
        """The core applied ``inp``; its effects are performed next: the request forensics read the
        state it left its id in (decision E10).  A failing ring costs the pass nothing."""
        fz = self.forensics
        if fz is not None:
            try:
                fz.applied(inp)
            except Exception as exc:  # noqa: BLE001 - the ring is a diagnostic
                self.metrics.internal_error()
                self.logs("*", "forensics_failed", "kvtier: the request forensics failed on an input: %r", exc,
                          level=logging.ERROR)

    # -- messages ------------------------------------------------------------------------------
    def _send(self, e: fx.Send) -> Inputs | None:
        msg = e.msg
        note = self.SEND_NOTES.get(type(msg))
        if note is not None:
            note(e.peer, msg)
        self.sent_at = self.clock()
        handle = self.transport.send(e.peer, encode_frames(msg))
        if handle.failed and e.ends_session:
            return [ix.SendFailed(e.peer)]
        return None

    def _note_done(self, peer: str, msg: wm.TransferDone) -> None:
        if not msg.ok and msg.final:  # a notice refuses nothing: the terminal answer follows
            self.metrics.fetch_refused(msg.reason)
            if msg.reason == Reason.NOT_AUTHORISED:
                self.logs(peer, msg.reason, "kvtier: refused %s's fetch of %s: it is not the consumer the producer "
                          "request named for this id (nothing changed)", self.logs.who(peer), msg.kv_request_id)

    def _note_reject(self, peer: str, msg: wm.HelloReject) -> None:
        if msg.field != "descriptor":  # a refused descriptor ends a session: its SessionEnded counts it
            self.metrics.session_ended(msg.reason)
        if msg.field == "max_peers":
            self.logs(peer, msg.reason, "kvtier: refusing a session from %s: max_peers=%s reached",
                      self.logs.who(peer), msg.ours)
        elif msg.field != "descriptor":  # a refused descriptor: the plane's refusal was logged with its cause
            self.logs(peer, msg.reason, "kvtier: rejecting hello from %s: %s%s", self.logs.who(peer),
                      differs(msg.field, msg.ours or "(withheld)", msg.theirs or "(not shown)"),
                      handshake_hint(msg.field), level=logging.ERROR)
        self.logs.forget(peer)

    # -- jobs ----------------------------------------------------------------------------------
    def _job_done(self, e: fx.JobDone) -> None:
        keys = self._verified(e) if e.successful_keys else None
        info = self.jobs.info(e.job_id)
        if info is not None and not info[0] and info[1] is not None and self.load_ending is not None:
            self.load_ending(info[1])  # the engine may take the result the moment it is queued
        done = self.jobs.finish(e.job_id, e.ok, e.reason, self.clock(), successful_keys=keys)
        if done is None:  # the core guarantees exactly once; count instead of crashing the engine
            self.metrics.internal_error()
            return
        store, nbytes, elapsed, internal = done
        if not store:  # lookups of the id MISS now: its load failed (L11), or it loaded (fetched once, L8)
            if info is not None and info[1] is not None:
                self.ended.add(info[1])
            elif not e.ok:
                self.changed = True
        if e.reason is Reason.NOT_AUTHORISED:
            self.logs("*", e.reason, "kvtier: %s job %d refused: not_authorised (the producer request named another "
                      "consumer for this id; check remote_decoder.consumer and this manager's CURVE principal)",
                      "store" if store else "load", e.job_id)
        if internal:  # a load_nothing: no engine job, no transfer (L16)
            return
        # an ok result carries a reason only when it says why nothing moved (not_needed)
        self.metrics.job_done("store" if store else "load", e.ok, e.reason if e.ok else (e.reason or Reason.TRANSFER_FAILED))
        if e.ok and not store and e.reason is not Reason.LOCAL:
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

    def _queue_lookup(self, e: fx.LookUpBlocks) -> None:
        self.serving.queue_lookup(e)

    def _queue_close(self, e: fx.CloseLookup) -> None:
        self.serving.queue_close(e)

    def _release_pins(self, e: fx.ReleasePins) -> None:
        self.serving.release(e)
        self.metrics.pins_released(len(e.pins), e.ok, e.reason)

    # -- data plane ----------------------------------------------------------------------------
    def _send_blocks(self, e: fx.SendBlocks) -> None:
        """Hand the transfer to the plane: each ``block_data`` header the core built, encoded,
        with the blocks (and, one-sided, the slots) it names.  A served round's blocks get their
        digests here (``take_digests``, decision Y9): pinned blocks do not change while pinned, so
        the engine's serve window stays free of hashing; the digest pool spreads them over cores."""
        headers = e.headers
        if not headers:  # an effect made without the core's batcher (a planted bug, a test's own)
            headers = Batcher(self.pool.block_bytes, self.plane.max_header_bytes, self.integrity != "none").send_blocks(
                e.peer, e.kv_request_id, e.round, e.blocks, e.gen, e.digests, e.slots, e.transfer,
                e.take_digests).headers
        if e.take_digests and self.integrity != "none":
            buffers = [self.pool.buffer(b) for b in e.blocks]
            dp = self.work.digest_pool
            digests = (dp.submit_digests(buffers, self.integrity).result() if dp is not None
                       else block_digests(buffers, self.integrity))
            headers = tuple(msgspec.structs.replace(h, digests=list(digests[h.first:h.first + h.count]))
                            for h in headers)
        one_sided, blocks, slots = self.plane.one_sided, e.blocks, e.slots
        batches = [Batch(h.first, blocks[h.first:h.first + h.count],
                         slots[h.first:h.first + h.count] if one_sided else (), encode(h)) for h in headers]
        key = e.transfer or e.kv_request_id
        self.posted[(key, e.round)] = self.sent_at = self.posted_at = self.clock()
        self.plane.post(e.peer, key, e.round, batches)

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
            self.metrics.wire_error(WireReason.BAD_PAYLOAD)
            self.logs(e.peer, WireReason.BAD_PAYLOAD, "kvtier: bad block_data from %s: %s", self.logs.who(e.peer), exc)
            return [ix.BlocksLanded(e.peer, e.kv_request_id, e.round, e.first, count, False, Reason.CORRUPT)]
        work = self.work
        view = self.loads(e.kv_request_id)
        if view is not None and work.last(key, view.landed, len(view.keys)) and (bad is None or work.held()):
            work.settle = True  # the load's result can go out in this tick (Loop.tick)
        if bad is None:
            work.landing(e.peer, key)
            return None
        return work.results(e.peer, key, bad)

    def _revoke(self, e: fx.RevokeAccess) -> Inputs | None:
        return [ix.AccessRevoked(e.peer)] if self.plane.revoke(e.peer) else None

    def _attach(self, e: fx.AttachPeer) -> Inputs | None:
        try:
            if not self.plane.add_peer(e.peer, e.descriptor, accepted=e.accepted, gen=e.gen):
                return None  # deferred: the plane reports Attached / AttachFailed later
        except PeerStillHeld as exc:  # not a mismatch: it is admitted once the earlier session ended
            self.logs(e.peer, "descriptor", "kvtier: refusing %s's handshake for now: %s", self.logs.who(e.peer), exc,
                      level=logging.WARNING)
            return [ix.AttachRefused(e.peer, e.gen, ix.STILL_HELD)]
        except PeerIsSelf as exc:  # a request naming this instance: not a mismatch either (N26)
            self.logs(e.peer, "descriptor", "kvtier: refusing %s's handshake: %s; the %s data plane cannot load from "
                      "its own instance (zmq can)", self.logs.who(e.peer), exc, self.plane.name, level=logging.WARNING)
            return [ix.AttachRefused(e.peer, e.gen, ix.SELF)]
        except PlaneError as exc:
            self.metrics.wire_error(WireReason.BAD_FIELD)
            self.logs(e.peer, "descriptor", "kvtier: %s sent a data-plane descriptor we cannot use: %s",
                      self.logs.who(e.peer), exc, level=logging.ERROR)
            return [ix.AttachRefused(e.peer, e.gen, str(exc))]
        return [ix.PeerAttached(e.peer, e.gen)]

    def _detach(self, e: fx.DetachPeer) -> None:
        self.plane.remove_peer(e.peer)

    # -- transport -----------------------------------------------------------------------------
    def _open(self, e: fx.OpenConnection) -> Inputs:
        needs = getattr(self.transport, "needs_lookup", None)  # optional in a transport of one's own
        if self.lookups is not None and needs is not None and needs(e.peer):
            # a name: looked up on a thread of its own, the dial finished when it ends (T19)
            peer, vet, transport = e.peer, self.vet, self.transport
            self.lookups.start(peer, e.gen, lambda: transport.lookup(peer, vet))
            return []
        return self._dial(e.peer, e.gen, None)

    def looked_up(self) -> Inputs:
        """The dials whose name lookup ended (:class:`~kvtier.shell.lookups.Lookups`): dialled
        now, or failed as a dial the name refused."""
        out: Inputs = []
        for peer, gen, address, error in self.lookups.take() if self.lookups is not None else ():
            out += self._dial(peer, gen, address) if error is None else self._dial_failed(peer, error)
        return out

    def _dial(self, peer: str, gen: int, resolved: tuple[str, ...] | None) -> Inputs:
        try:
            # fail_fast: a refused dial is reported at once (ConnectFailed), never retried
            if resolved is None:
                self.transport.connect(peer, fail_fast=True, vet=self.vet)
            else:
                self.transport.connect(peer, fail_fast=True, vet=self.vet, resolved=resolved)
            descriptor = self.plane.session_descriptor(peer, gen)
        except (TransportError, ValueError, PlaneError) as exc:
            return self._dial_failed(peer, exc)
        return [ix.ConnectionUp(peer, descriptor)]

    def _dial_failed(self, peer: str, exc: Exception) -> Inputs:
        if isinstance(exc, DialNotAllowed):
            self.metrics.rejected_peer()
            self.logs(peer, "peer_not_allowed", "kvtier: refusing to dial %s: %s", peer, exc)
            return [ix.ConnectFailed(peer, str(exc), not_allowed=True)]
        if isinstance(exc, NoServerKey):  # a CURVE setting (auth_failed), not a producer that is down
            self.logs(peer, "auth_failed", "kvtier: %s", exc)
            return [ix.ConnectFailed(peer, str(exc), auth_failed=True)]
        if isinstance(exc, NameNotResolved):  # a name or resolver setting: proves nothing about the producer
            self.logs(peer, "unresolved_host", "kvtier: cannot connect to %s: %s", peer, exc)
            return [ix.ConnectFailed(peer, str(exc), unresolved=True)]
        if not isinstance(exc, (TransportError, ValueError, PlaneError)):  # a lookup that raised oddly
            log.error("kvtier: looking up %s failed", peer, exc_info=exc)
        self.logs(peer, "connect", "kvtier: cannot connect to %s: %s", peer, exc)
        return [ix.ConnectFailed(peer, str(exc))]

    def _close(self, e: fx.CloseConnection) -> None:
        if self.lookups is not None and self.lookups.cancel(e.peer):
            self.logs(e.peer, "lookup", "kvtier: the dial of %s ended before its name lookup answered: this "
                      "host's DNS resolver is slow or unreachable (check /etc/resolv.conf), or give the "
                      "producer's address as an IP", e.peer, level=logging.WARNING)
        self.transport.drop_peer(e.peer, linger_s=e.linger_s)

    # -- observations --------------------------------------------------------------------------
    def _session_ended(self, e: fx.SessionEnded) -> None:
        self.changed = True
        self.metrics.session_ended(e.reason)
        # a goodbye (ours or the peer's) is routine; a connection that closed without one (a crash,
        # a kill) and every other ending is a fault (O8)
        level = logging.INFO if e.reason in _ROUTINE and not e.closed else logging.WARNING
        self.logs(e.peer, e.reason, "kvtier: session with %s ended: %s", self.logs.who(e.peer, e.instance), e.reason,
                  level=level)
        self.logs.forget(e.peer)

    def _slots_held(self, e: fx.SlotsHeld) -> None:
        self.logs(e.peer, "slots_held",
                  "kvtier: load %s: %d slots still held: the data plane cannot withdraw %s's access to them by itself "
                  "(the pool is not shared memory); held until that producer is proven gone or accepts a fresh "
                  "handshake (kvtier dials it again now and at every revoke_timeout_s)", e.kv_request_id, e.slots,
                  self.logs.who(e.peer), level=logging.WARNING)

    def _probe_failed(self, e: fx.ProbeFailed) -> None:
        self.metrics.probe_failed(e.reason)
        self.logs(e.peer, "probe_failed", "kvtier: request %.64s: probing %s failed (%s); its blocks are computed",
                  e.kv_request_id, self.logs.who(e.peer), e.reason, level=logging.INFO)

    def _ignored(self, e: fx.Ignored) -> None:
        self.metrics.ignored(e.machine, e.reason)
