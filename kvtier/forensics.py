"""Request forensics: a bounded ring of the ``kv_request_id``\\ s that finished most recently.

"Why did this load fail?" is a question about one request, after the fact.  The log has the
answer scattered over lines of both engines, and ``kvtier_jobs_total{reason}`` has only its
count.  Like gRPC's channelz and Envoy's admin page, each manager keeps the last
:data:`CAPACITY` finished requests with what an operator asks first — the state path, the
reason, when each step happened, the peer, the bytes — and serves them as JSON on its metrics
endpoint (``GET /kvtier/requests``, :mod:`kvtier.metrics`), shown by ``kvtier top`` and
``kvtier why KV_REQUEST_ID`` (:mod:`kvtier.explain`).

Fed by the I/O shell (decisions E3, E10): every batch of effects the core asked for, through
:meth:`Forensics.before` and :meth:`Forensics.after` around performing them (what needs the job
ledger's record before, the rest after: a message leaves before its bookkeeping, decision C26),
and every input, through :meth:`Forensics.applied` right after the core applied it — some moves
show in no effect: a fetch that binds an id waiting for its blocks, the data plane's release of a
transfer, a receipt; only a landing's answer says which blocks matched.  Nothing is recorded
that the core does not report: effects and inputs name the id, the peer and the step; the job
ledger knows each job's id, submit time and size; the core's read API tells the state the id is
in after the step.  The cost on the loop's thread is a type lookup per effect and per input.

Bounded memory (decision E3): at most :data:`CAPACITY` finished entries and :data:`MAX_OPEN`
requests in progress, each a few hundred bytes (``tests/test_forensics.py``: a million finished ids).

What an entry is
----------------
* **consumer** — one load job of a PD request (its ``kv_request_id``): from ``submit_load`` to its
  result.  Milestones: ``fetch`` (the fetch left), ``first_block`` (the first block arrived),
  ``abort`` (an abort left), ``receipt`` (every block landed and was confirmed), ``result``.  Its
  blocks landed are those the checks answered matched their digests: a corrupt batch counts the
  blocks before its first mismatch (decision I21).
* **producer** — the blocks parked under an id: from its first store (or the fetch that bound it)
  to the result of its last store job.  Milestones: ``bound`` (a fetch bound the id), ``sending``
  (the data plane took the blocks), ``released`` (the plane let go of them), ``cancelled``,
  ``session_ended`` (the bound consumer's session ended: the path shows where that left the id,
  ``quarantined`` included), ``answered`` (our ``transfer_done`` to the bound fetch left),
  ``result``.  A store refused when it was submitted (``id_in_use``, a tombstone, an abort) is an
  entry of its own (path ``refused``, no blocks): nothing of it was parked (decision E11).
* **fetch** — a peer's fetch this producer refused: at once (milestone ``refused``) for an id with
  no live blocks here or bound to another fetch; or after it bound the id and waited (``bound``,
  then ``refused``: ``supply_timeout``, ``nothing_stored``, ``incomplete``, a drain, a transfer
  given up); or aborted by its consumer before any block moved (``aborted``), or left by a lost
  consumer's session (``lost``, reason ``peer_lost``).
* **probe** — a symmetric request whose probing of its peer failed (a deadline, the peer's loss,
  its refusal or withdrawal): its lookups answer MISS and the engine computes the blocks; one
  milestone, ``failed``.  **offer** — the serving side's: an offer withdrawn unfetched (``withdrawn``).
Times are seconds on the manager's clock; milestones are offsets from the entry's start.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from kvtier.finished import Finished, InProgress, to_json
from kvtier.lifecycle import ConsumerState, ProbeState, ProducerState, Reason
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.wire import messages as wm

__all__ = ["CAPACITY", "MAX_OPEN", "Finished", "Forensics", "to_json"]

CAPACITY = 1024
"""Finished requests kept per manager (the oldest is dropped first)."""

MAX_OPEN = 65536
"""Requests in progress tracked at once; beyond it the oldest is forgotten (far above one engine's)."""

MAX_NAMED = 4096  # peers whose address is remembered for naming entries (forgotten all at once beyond it)
#: Effects whose performing changes what a note reads (see :meth:`Forensics.before`).
_CHANGES_WHAT_IS_READ = frozenset({fx.JobDone, fx.CloseConnection})

_FINAL_PRODUCER = frozenset({ProducerState.DONE, ProducerState.TOMBSTONED, ProducerState.ABSENT,
                             ProducerState.PRUNED})
_PROBE_IDLE = f"probe:{ProbeState.IDLE.value}"
#: Why a serving peer withdraws a symmetric round's offer (its notice; a crossing fetch's answer too).
_WITHDRAWN = frozenset({Reason.OFFER_EXPIRED, Reason.DRAINED, Reason.SHUTDOWN})
#: Producer states a fetch leaves an id in when it bound it (it waits for blocks, or they move).
_BOUND_BY_FETCH = frozenset({ProducerState.AWAITING, ProducerState.SERVING})
#: Consumer and probe states (as :meth:`Forensics._state` names them) of a request no longer in progress.
_FINAL_CONSUMER = frozenset({ConsumerState.LOADED.value, ConsumerState.FAILED.value, ConsumerState.FINISHED.value,
                             f"probe:{ProbeState.FAILED.value}", f"probe:{ProbeState.FINISHED.value}"})


def _untracked(peer: str, msg: Any) -> None:
    """A received message that says nothing the ring follows."""


class Forensics:
    """The ring of one manager.

    Args:
        core: the manager's :class:`~kvtier.lifecycle.TierCore` (read: the state of an id).
        job_info: ``job_id -> (store, kv_request_id, submitted, nbytes)`` or ``None`` (the job
            ledger's record of an open job).
        clock: the manager's clock (seconds).
        block_bytes: bytes per pool block.
        capacity: finished entries kept.
        where: ``peer id -> "host:port"`` (the transport's view), to name a peer that dialled us.
        lock: the manager's pass lock: :meth:`open_json` reads the core's state of an id under it
            (from the metrics endpoint's thread).
        parked_since: ``kv_request_id -> when its first store was applied`` (or ``None``).
    """

    def __init__(self, *, core: Any, job_info: Callable[[int], tuple[bool, str | None, float, int] | None],
                 clock: Callable[[], float], block_bytes: int, capacity: int = CAPACITY,
                 where: Callable[[str], str] | None = None, lock: Any = None,
                 parked_since: Callable[[str], float | None] | None = None) -> None:
        self._core = core
        self._lock = lock
        self._parked_since = parked_since
        self._where = where
        self._job_info = job_info
        self._clock = clock
        self._block_bytes = block_bytes
        self._ring: collections.deque[Finished] = collections.deque(maxlen=capacity)
        self._open: dict[tuple[str, str], InProgress] = {}
        self._last_store: tuple[str, float] | None = None  # the producer entry added last, and when
        self._named: dict[str, str] = {}  # peer id -> where (asking the transport builds a record)
        self._probed: dict[str, str] = {}  # kv_request_id -> the peer its last probe went to
        # what the last entries told ((kv_request_id, role), a fetch's (kv_request_id, peer, reason)),
        # and served rounds: a story is told once (a notice and the answer that crossed it), in O(1)
        self._told: collections.OrderedDict[tuple[str, ...], None] = collections.OrderedDict()
        # bound traces whose store jobs ended in this batch, and peers lost in it: what its later notes read
        self._ended: dict[str, InProgress] = {}
        self._lost: list[str] = []
        self.finished_total = 0
        """Requests finished since the manager started (the ring keeps the last ``capacity``)."""
        self._on: dict[type, Callable[[Any, float], None]] = {
            fx.Send: self._send,
            fx.SendBlocks: self._send_blocks,
            fx.CancelTransfer: self._cancel,
            fx.LandBlocks: self._land,
            fx.JobDone: self._job_done,
            fx.ProbeFailed: self._probe_failed,
            fx.SessionEnded: lambda e, now: self._lost.append(e.peer),
        }
        # by the type of an input the core applied: the moves it made that no effect shows
        self._on_input: dict[type, Callable[[Any], None]] = {
            ix.Received: lambda inp: self._on_received.get(type(inp.msg), _untracked)(inp.peer, inp.msg),
            ix.TransferReleased: lambda inp: self._moved(inp.kv_request_id, "released"),
            ix.BlocksLanded: self._checked,
        }
        # by the type of the message a Send carries (or a Received: a fetch may bind, a receipt moves)
        self._on_sent: dict[type, Callable[[str, Any, float], None]] = {
            wm.Fetch: self._sent_fetch,
            wm.AbortFetch: self._sent_abort,
            wm.Receipt: self._sent_receipt,
            wm.TransferDone: self._answered,
            wm.AbortAck: self._acked_abort,
            wm.Probe: self._sent_probe,
        }
        self._on_received: dict[type, Callable[[str, Any], None]] = {
            wm.Fetch: lambda peer, msg: None if msg.offered else self._bound(peer, msg),  # offered: a served round
            wm.Receipt: lambda peer, msg: self._moved(msg.kv_request_id, None),
        }

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0

    # -- the hooks ----------------------------------------------------------------------------
    def observe(self, effects: Sequence[Any]) -> None:
        """Note what ``effects`` (one batch the core returned) say about each id, all before the
        batch is performed.  Never raises for an effect it does not know."""
        self._observe(effects, 0, len(effects))
        self._batch_end()

    def applied(self, inp: Any) -> None:
        """The core applied ``inp`` (its effects are noted next): note the state it left the id it
        names in — a fetch that bound the id, a transfer the plane let go of, a receipt — and the
        blocks a landing's check answered matched (decision E10).  Never raises for an input it
        does not know."""
        f = self._on_input.get(type(inp))
        if f is not None:
            f(inp)

    def before(self, effects: Sequence[Any]) -> int:
        """The shell is about to perform ``effects``: note those up to the batch's last effect
        whose performing changes what the notes read — a ``JobDone`` closes the job ledger's
        record, a ``CloseConnection`` may take the transport's name of a peer — and return how
        many were noted; the shell hands the rest to :meth:`after` once the batch is performed,
        so a message leaves before its bookkeeping (decision C26).  The core's state, which the
        notes read too, does not change while a batch is performed: what performers report is
        applied after it."""
        last = 0
        for i, e in enumerate(effects, 1):
            if type(e) in _CHANGES_WHAT_IS_READ:
                last = i
        if last:
            self._observe(effects, 0, last)
        return last

    def after(self, effects: Sequence[Any], start: int) -> None:
        """The shell performed ``effects``: note those from ``start`` on (see :meth:`before`)."""
        if start < len(effects):
            self._observe(effects, start, len(effects))
        self._batch_end()

    def _batch_end(self) -> None:
        self._ended.clear()
        if self._lost:
            lost, self._lost = set(self._lost), []
            now = self._clock()
            for (role, kid), t in list(self._open.items()):
                if role != "producer" or t.peer not in lost:
                    continue
                self._state(role, kid, t)  # what the session's end moved it to (quarantined): on its path
                t.mark("session_ended", now)
                if t.bound is not None and self._core.producer_state(kid) in _FINAL_PRODUCER:
                    # bound with nothing stored: no job's result will end its trace
                    self._fetch_ended(kid, t.peer, t.round, str(Reason.PEER_LOST), "lost", now)

    def _observe(self, effects: Sequence[Any], start: int, stop: int) -> None:
        on = self._on
        now = None
        for i in range(start, stop):
            e = effects[i]
            f = on.get(type(e))
            if f is not None:
                if now is None:
                    now = self._clock()
                f(e, now)

    # -- reading ------------------------------------------------------------------------------
    def recent(self, kv_request_id: str | None = None, limit: int | None = None) -> list[Finished]:
        """The finished entries, newest first: all, or those of ``kv_request_id``; at most
        ``limit``.  Safe from any thread (a snapshot of the ring)."""
        for _ in range(3):
            try:
                entries = tuple(self._ring)
                break
            except RuntimeError:  # appended to while copied (another thread): copy again
                continue
        else:  # pragma: no cover - three appends in a row during one copy
            entries = ()
        out = [e for e in reversed(entries) if kv_request_id is None or e.kv_request_id == kv_request_id]
        return out if limit is None else out[:limit]

    def as_json(self, kv_request_id: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """:meth:`recent` as JSON-ready dicts (:func:`to_json`, with ``ago``)."""
        return to_json(self.recent(kv_request_id, limit), self._clock())

    def in_progress(self) -> int:
        """Fetches (ours out, or a peer's bound here) and transfers being traced now, across all ids
        (an id that has only parked blocks or a queued load is not one: :meth:`open_json` lists it
        from the core's state)."""
        return len(self._open)

    def open_json(self, kv_request_id: str) -> list[dict[str, Any]]:
        """The entries of ``kv_request_id`` still in progress, one per role (consumer, producer):
        as :func:`to_json` writes finished ones, with ``seconds`` so far (``None``: not known) and
        no outcome — a fetch out or bound, a transfer being served, with its milestones so far; else the
        core's state of the id, if live (parked blocks no consumer fetched yet, a load waiting for
        its session, a probe), read under the manager's lock.  Safe from any thread; a peer is
        named only from what :meth:`_name` remembered."""
        now = self._clock()
        out = []
        for role in ("consumer", "producer"):
            t = self._open.get((role, kv_request_id))
            if t is None:
                t = self._untraced(role, kv_request_id)
                if t is None:
                    continue
            start = t.started
            if role == "producer" and start is not None and self._parked_since is not None:
                parked = self._parked_since(kv_request_id)  # its first store, where its record will start
                start = start if parked is None else min(start, parked)
            out.append({"kv_request_id": kv_request_id, "role": role, "peer": self._named.get(t.peer, t.peer),
                        "path": list(t.path), "marks": {m: max(0.0, at - start) for m, at in list(t.marks)},
                        "started": start, "seconds": None if start is None else max(0.0, now - start),
                        "blocks": t.blocks, "landed": t.landed})
        return out

    def _untraced(self, role: str, kid: str) -> InProgress | None:
        """A live id no effect or input has traced yet, from the core's state (None when not live)."""
        if self._lock is None or not self._lock.acquire(timeout=1.0):
            return None
        try:
            t = InProgress(None)  # type: ignore[arg-type]
            self._state(role, kid, t)
            if role == "producer":
                if self._core.producer_state(kid) in _FINAL_PRODUCER:
                    return None
                t.started = self._parked_since(kid) if self._parked_since is not None else None
            elif t.path and (t.path[-1] in _FINAL_CONSUMER or t.path[-1] == _PROBE_IDLE):
                return None  # (a symmetric request with no round open: nothing in progress)
            return t if t.path else None
        finally:
            self._lock.release()

    # -- effects ------------------------------------------------------------------------------
    def _trace(self, role: str, kv_request_id: str, now: float) -> InProgress:
        key = (role, kv_request_id)
        t = self._open.get(key)
        if t is None:
            if len(self._open) >= MAX_OPEN:
                del self._open[next(iter(self._open))]
            t = self._open[key] = InProgress(now)
        return t

    def _state(self, role: str, kv_request_id: str, t: InProgress) -> None:
        core = self._core
        if role == "consumer":
            state = core.consumer_state(kv_request_id)
            if state is ConsumerState.ABSENT:
                probe = core.probe_state(kv_request_id)
                name = "" if probe is ProbeState.ABSENT else f"probe:{probe.value}"
            else:
                name = state.value
        else:
            state = core.producer_state(kv_request_id)
            name = "" if state is ProducerState.ABSENT else state.value
        if name and (not t.path or t.path[-1] != name):
            t.path.append(name)

    def _send(self, e: fx.Send, now: float) -> None:
        f = self._on_sent.get(type(e.msg))
        if f is not None:
            f(e.peer, e.msg, now)

    def _sent_fetch(self, peer: str, msg: wm.Fetch, now: float) -> None:
        self._probed.pop(msg.kv_request_id, None)  # the load's own trace names its peer from here on
        t = self._trace("consumer", msg.kv_request_id, now)
        t.peer = peer
        t.mark("fetch", now)
        self._state("consumer", msg.kv_request_id, t)

    def _sent_abort(self, peer: str, msg: wm.AbortFetch, now: float) -> None:
        t = self._open.get(("consumer", msg.kv_request_id))  # only about a fetch we are tracking
        if t is not None:
            t.mark("abort", now)
            self._state("consumer", msg.kv_request_id, t)

    def _sent_receipt(self, peer: str, msg: wm.Receipt, now: float) -> None:
        t = self._open.get(("consumer", msg.kv_request_id))
        if t is not None:
            t.mark("receipt", now)
            self._state("consumer", msg.kv_request_id, t)
        else:
            self._late_receipt(msg.kv_request_id, now)

    def _late_receipt(self, kid: str, now: float) -> None:
        """A load's receipt leaves after its result, in the same step: the mark goes to that entry."""
        ring = self._ring
        last = ring[-1] if ring else None
        if last is not None and last.kv_request_id == kid and last.role == "consumer" and last.ok:
            at = min(max(0.0, now - last.started), last.seconds)  # the same step: at the result
            ring[-1] = msgspec.structs.replace(last, marks=(*last.marks[:-1], ("receipt", at), last.marks[-1]))

    def _answered(self, peer: str, msg: wm.TransferDone, now: float) -> None:
        kid = msg.kv_request_id
        t = self._open.get(("producer", kid))
        if t is not None and t.peer == peer and t.round == msg.round:  # the fetch that bound the id
            t.mark("answered", now)
            self._state("producer", kid, t)
        served = t if t is not None else self._ended.get(kid)
        if served is not None and served.peer == peer and served.round == msg.round and \
                any(m == "sending" for m, _ in served.marks):
            return  # its transfer had started: the parked blocks' entry tells how it ended, not a refusal
        if not msg.ok and msg.final:
            if msg.reason in _WITHDRAWN and self._core.producer_state(kid) is ProducerState.ABSENT:
                # no parked id: a round's offer withdrawn (a notice, a crossing fetch's answer), unless served
                if (kid, peer, "served", str(msg.round)) not in self._told and \
                        not self._tell_once(kid, peer, str(msg.reason)):
                    self._add(Finished(kid, "offer", False, str(msg.reason), peer, (), (("withdrawn", 0.0),), now, 0.0))
                return
            self._fetch_ended(kid, peer, msg.round, str(msg.reason), "refused", now)

    def _acked_abort(self, peer: str, msg: wm.AbortAck, now: float) -> None:
        """An abort_ack left: a fetch aborted before any block moved ends its story here too, once."""
        kid = msg.kv_request_id
        t = self._open.get(("producer", kid))
        if t is not None:
            if t.peer != peer or t.round != msg.round:
                return  # an abort of another round: the bound fetch's story goes on
        elif (kid, "producer") in self._told:
            return  # the parked blocks' entry tells it
        self._fetch_ended(kid, peer, msg.round, str(Reason.ABORTED), "aborted", now)

    def _fetch_ended(self, kid: str, peer: str, rnd: int, reason: str, mark: str, now: float) -> None:
        """``peer``'s fetch of round ``rnd`` ends (``mark``: refused, aborted, lost): a ``fetch`` entry,
        from when it bound the id if it did, else at once — once per id, peer and reason."""
        t = self._open.get(("producer", kid))
        if t is not None and t.bound is not None and t.peer == peer and t.round == rnd:
            self._state("producer", kid, t)
            since, path = t.bound, tuple(t.path)
            if self._core.producer_state(kid) in _FINAL_PRODUCER:
                del self._open[("producer", kid)]  # nothing was parked: no job's result will end it
            else:  # unbound: its blocks wait for another fetch
                t.peer, t.bound, t.round = "", None, -1
        else:
            t = self._ended.get(kid)  # the store jobs' result ended the bound trace in this batch
            bound = t is not None and t.peer == peer and t.round == rnd
            since, path = (t.bound, tuple(t.path)) if bound else (None, ())  # type: ignore[union-attr]
        if self._tell_once(kid, peer, reason):
            return
        if since is None:
            state = self._core.producer_state(kid)
            path = () if state is ProducerState.ABSENT else (state.value,)
            self._add(Finished(kid, "fetch", False, reason, peer, path, ((mark, 0.0),), now, 0.0))
            return
        waited = max(0.0, now - since)
        self._add(Finished(kid, "fetch", False, reason, peer, path, (("bound", 0.0), (mark, waited)), since, waited))

    def _send_blocks(self, e: fx.SendBlocks, now: float) -> None:
        if e.transfer:  # a served symmetric round: no parked id behind it; its end is no withdrawal
            self._remember((e.kv_request_id, e.peer, "served", str(e.round)))
            return
        t = self._trace("producer", e.kv_request_id, now)
        if t.bound is None:  # a fetch bound the id in this very step (noted there when shown)
            t.bound, t.round = now, e.round
        t.peer = e.peer
        self._name(e.peer)  # while its connection is up
        t.mark("sending", now)
        self._state("producer", e.kv_request_id, t)

    # -- inputs (applied: their effects are noted next) -----------------------------------------
    def _bound(self, peer: str, msg: wm.Fetch) -> None:
        kid = msg.kv_request_id
        if self._core.producer_state(kid) not in _BOUND_BY_FETCH:
            return  # answered at once (its refusal is noted) or dropped
        now = self._clock()
        t = self._trace("producer", kid, now)
        if t.bound is None:  # this fetch bound it (another, while it is bound, is refused or dropped)
            t.peer, t.round, t.bound = peer, msg.round, now
            self._name(peer)  # while its connection is up
            t.mark("bound", now)
        self._state("producer", kid, t)

    def _moved(self, kid: str, mark: str | None) -> None:
        t = self._open.get(("producer", kid))  # a served round's plane key names no trace here
        if t is not None:
            if mark is not None:
                t.mark(mark, self._clock())
            self._state("producer", kid, t)

    def _checked(self, inp: ix.BlocksLanded) -> None:
        if inp.ok:  # the blocks its check matched (a corrupt batch: those before the mismatch, I21)
            t = self._open.get(("consumer", inp.kv_request_id))
            if t is not None:
                t.landed += inp.count

    def _cancel(self, e: fx.CancelTransfer, now: float) -> None:
        t = self._open.get(("producer", e.kv_request_id))
        if t is not None:
            t.mark("cancelled", now)
            self._state("producer", e.kv_request_id, t)

    def _land(self, e: fx.LandBlocks, now: float) -> None:
        t = self._trace("consumer", e.kv_request_id, now)
        t.peer = t.peer or e.peer
        t.mark("first_block", now)  # arrived: what matched is the check's answer (_checked)

    def _job_done(self, e: fx.JobDone, now: float) -> None:
        info = self._job_info(e.job_id)
        if info is None or info[1] is None:
            return
        store, kid, submitted, nbytes = info
        role = "producer" if store else "consumer"
        key = (role, kid)
        if store and e.at_submission:  # ended by the step that submitted it: none of it was parked
            nbytes = 0
            if not e.ok:  # refused (id_in_use, tombstoned, aborted): its own entry; the id's record is untouched
                took = max(now - submitted, 0.0)
                self._add(Finished(kid, role, False, e.reason or "", "", ("refused",), (("refused", took),),
                                   submitted, took))
                return
        if not store and self._another_load_runs(kid, e.job_id):
            # a further load refused while the id's load runs: its own entry; the running load's stays open
            took = max(now - submitted, 0.0)
            self._add(Finished(kid, role, e.ok, e.reason or "", self._peer_of(kid), (), (("result", took),),
                               submitted, took, 0, 0, nbytes))
            return
        t = self._open.pop(key, None)
        if t is None:
            t = InProgress(submitted)
            if not store:
                t.peer = self._peer_of(kid)
        elif submitted < t.started:
            t.started = submitted
        t.blocks += nbytes // self._block_bytes
        t.nbytes += nbytes
        self._state(role, kid, t)
        if not store and self._core.consumer_state(kid) is ConsumerState.ABSENT:  # a symmetric round's load
            t.path.append((ConsumerState.LOADED if e.ok else ConsumerState.FAILED).value)
        if store and self._core.producer_state(kid) not in _FINAL_PRODUCER:
            self._open[key] = t  # more store jobs of the id are still outstanding
            return
        if store and t.bound is not None:
            self._ended[kid] = t  # the answer to the fetch that bound it may follow in this batch
        reason = e.reason or ""
        if store and self._merge(kid, e.ok, reason, t, now):
            return
        start = t.started
        t.marks.append(("result", now))
        if store:
            self._last_store = (kid, now)
        self._add(Finished(kid, role, e.ok, reason, t.peer, tuple(t.path),
                           tuple([(m, at - start if at > start else 0.0) for m, at in t.marks]), start,
                           now - start if now > start else 0.0, t.blocks, t.landed, t.nbytes))

    def _another_load_runs(self, kid: str, job_id: int) -> bool:
        """Whether a load of ``kid`` other than job ``job_id`` runs (the id's, or a symmetric round's):
        ``job_id`` was refused beside it (duplicate_load, not_offered)."""
        return any(v is not None and v.job_id not in (None, job_id) and v.state.value not in _FINAL_CONSUMER
                   for v in (self._core.consumer(kid), *self._core.round_loads(kid)))

    def _merge(self, kid: str, ok: bool, reason: str, t: InProgress, now: float) -> bool:
        """Several store jobs of one id end in one step (a receipt, a reap, a drain): one entry."""
        ring = self._ring
        if self._last_store != (kid, now) or not ring:
            return False
        last = ring[-1]
        if last.role != "producer" or last.ok != ok or last.reason != reason:
            return False
        ring[-1] = msgspec.structs.replace(last, blocks=last.blocks + t.blocks, nbytes=last.nbytes + t.nbytes)
        return True

    def _peer_of(self, kid: str) -> str:
        view = self._core.consumer(kid)
        # a symmetric load that failed before its fetch (its probing had failed): the probed peer
        return view.peer if view is not None else self._probed.pop(kid, "")

    def _probe_failed(self, e: fx.ProbeFailed, now: float) -> None:
        # a symmetric request that may never load: its record says why its blocks were computed
        self._add(Finished(e.kv_request_id, "probe", False, str(e.reason), e.peer, ("probe:failed",),
                           (("failed", 0.0),), now, 0.0))

    def _sent_probe(self, peer: str, msg: wm.Probe, now: float) -> None:
        self.peer_of_request(msg.kv_request_id, peer)

    def refused(self, kv_request_id: str, peer: str, reason: str) -> None:
        """Record consumer request ``kv_request_id`` refused before anything was dialled (``reason``:
        ``peer_not_allowed``, its producer endpoint ``peer``): under vLLM no load follows (its
        lookups miss), so this is the request's only record for ``kvtier why``."""
        self._add(Finished(kv_request_id, "consumer", False, reason, peer, ("refused",), (("refused", 0.0),),
                           self._clock(), 0.0))

    def peer_of_request(self, kv_request_id: str, peer: str) -> None:
        """Name ``peer`` in the record of the load of ``kv_request_id`` should it end before any
        fetch names one: a probed peer, or the endpoint a refused request named (``peer_not_allowed``)."""
        if len(self._probed) >= MAX_OPEN:  # requests that never loaded: forget them all
            self._probed.clear()
        self._probed[kv_request_id] = peer

    def _name(self, peer: str) -> str:
        """Where ``peer`` is (an inbound ``in:<hex>`` id means nothing to a person), remembered
        from the first time it is asked while the connection is up: a peer id names one
        connection for good (its routing id never binds again), and once the session ended the
        transport can no longer tell."""
        where = self._named.get(peer)
        if where is None and self._where is not None:
            where = self._where(peer)
            if where:
                if len(self._named) >= MAX_NAMED:
                    self._named.clear()
                self._named[peer] = where
        return where or peer

    def _tell_once(self, kid: str, peer: str, reason: str) -> bool:
        """Whether a fetch entry of ``kid`` from ``peer`` with ``reason`` was told already (else
        it is noted as told now)."""
        key = (kid, peer, reason)
        if key in self._told:
            return True
        self._remember(key)
        return False

    def _remember(self, key: tuple[str, ...]) -> None:
        told = self._told
        told[key] = None
        if len(told) > 2 * (self._ring.maxlen or 0):  # two keys per entry at most
            told.popitem(last=False)

    def _add(self, entry: Finished) -> None:
        self._remember((entry.kv_request_id, entry.role))
        if entry.peer:
            where = self._name(entry.peer)
            if where != entry.peer:
                entry = msgspec.structs.replace(entry, peer=where)
        self._ring.append(entry)
        self.finished_total += 1
