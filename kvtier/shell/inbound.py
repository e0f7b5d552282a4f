"""Inbound: what arrived since the last tick, as core inputs.

One service pass over the transport (only what its poller reports readable is read), then the
data plane's reports.  Three small tables turn them into inputs: decoded wire messages become
:class:`~kvtier.lifecycle.inputs.Received` (undecodable ones :class:`~kvtier.lifecycle.inputs.Malformed`),
transport events and plane reports their own input types.  Nothing here decides: the core answers
a malformed message, ends a session, fails a load.

A connection's close is applied only after a pass that read every socket to empty: whatever the
connection delivered before it closed (a goodbye, a notice, a terminal answer) is applied first,
so its reason is the one the core keeps (decision I19).

The pass also says when the inbound queue was last seen empty (``quiet_since``): the time before
a read pass that emptied every socket.  The core fires deadlines only up to that time, so a
deadline never beats a message that was already waiting (decision I3).  A pass that runs more
than :data:`LATE_S` after a deadline fell due first crosses the transport's barrier: after a stall
(a stopped process) the transport's own threads may not yet have taken in what the kernel holds,
and empty sockets would prove nothing (decision T17).  The wait is bounded: once passes have read
for :data:`HOLD_MAX_S` without seeing the queue empty (a peer sending faster than we read), deadlines
that fell due more than that long ago fire (:meth:`Inbound.deadlines_at`, decision C37).

Two plane reports are not inputs themselves: a ``block_data`` header that came with a NIXL WRITE
(:class:`~kvtier.dataplane.Notified`) is decoded like one the transport delivered, and a landing
that ended on the digest pool (:class:`~kvtier.dataplane.Landed`) goes to the per-byte work
(:mod:`kvtier.shell.perbyte`), which releases it, and what waited behind it, in order.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from kvtier.advice import differs, handshake_hint
from kvtier.dataplane import AttachFailed, Attached, DataPlane, Faulted, Landed, Notified, Released, Revoked
from kvtier.lifecycle import Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle._table import WIRE
from kvtier.metrics import TierMetrics
from kvtier.shell.logs import RateLimitedLog
from kvtier.shell.perbyte import ByteWork
from kvtier.transport import CloseReason, Transport
from kvtier.wire import messages as wm
from kvtier.wire.codec import Decoder, WireError, WireReason

__all__ = ["BARRIER_WAIT_S", "HOLD_MAX_S", "Inbound", "LATE_S", "PROGRESS_S", "RECV_BATCH", "RECV_BUDGET",
           "RECV_TIME_S"]

#: Messages read per service pass, and at most per tick: the budget keeps engine calls from
#: waiting behind a flood; deadlines then wait for the queue to be seen empty.
RECV_BATCH = 256
RECV_BUDGET = 8192
#: Longest one pass decodes messages (seconds): what a pass read beyond it waits, undecoded and in
#: order, for the next pass, so a peer whose messages are costly to decode (a flood of big fetches:
#: ~0.2 µs per key, 11 ms for 60,000 keys) cannot hold a pass — and everyone else's requests — for seconds
#: (decision C36).  Measured on the manager's clock: a virtual clock never ends a pass early.
RECV_TIME_S = 0.005

#: Longest the deadlines wait for a queue that passes keep reading without ever seeing it empty
#: (seconds): a message that arrived before a deadline fell due has been read within it — the
#: ROUTER's fair queue gives every connection its turn, and a pass reads and decodes for at most
#: RECV_TIME_S — so only a peer sending faster than we read is still queued (decision C37).
HOLD_MAX_S = 1.0

#: A pass this late after a deadline fell due (seconds) crosses the transport's barrier before it
#: reads: far beyond a running loop's wake-up lag, well below any timeout a peer is judged by.
LATE_S = 0.02
#: Longest wait for the barrier (seconds), a backlog in the kernel included: a crossing that does not
#: prove the backlog taken in within it leaves the deadlines to the next pass.
BARRIER_WAIT_S = 0.1
#: While a load of ours is out, how often (seconds) the dials' byte counts are read: a producer
#: still sending one large message is heard by them (decision T22), far inside any peer_timeout_s.
PROGRESS_S = 0.25


class Inbound:
    """Collects one tick's inputs for one manager (under its lock)."""

    def __init__(self, *, transport: Transport, plane: DataPlane, decoder: Decoder, metrics: TierMetrics,
                 logs: RateLimitedLog, clock: Callable[[], float], posted: dict[tuple[str, int], float],
                 work: ByteWork) -> None:
        self.transport = transport
        self.plane = plane
        self.work = work
        self.decoder = decoder
        self.metrics = metrics
        self.logs = logs
        self.clock = clock
        self._posted = posted
        self.quiet_since = clock()
        """When the inbound queue was last seen empty (seconds, the manager's clock)."""
        self._closes: list[ix.Input] = []  # connection ends held until a pass read everything
        self._undecoded: deque[tuple[str, list[Any]]] = deque()  # read, left for the next pass (C36)
        self._busy_since: float | None = None  # the first pass since the queue was last seen empty (C37)
        self._after = float("-inf")  # the stamp of the reports being turned into inputs
        self._crossed = float("-inf")  # when the last crossing of the transport's barrier ended
        self._held: float | None = None  # the deadline a crossing that proved nothing held back
        self._progress_at = float("-inf")  # when the dials' byte counts were last read (T22)
        self._progress_live = False  # read at every window since: growth is recent (a first read is a baseline)
        # peers a whole ping or pong came from since the byte counts were last read: their growth
        # may be that chatter, heard as such, not part of a message still crossing (T22, L20)
        self._chatter: set[str] = set()
        self.reported = 0
        """The plane's reports turned into inputs since start (the loop's eager window follows them)."""
        self.PLANE_REPORTS: dict[type, Callable[[Any, float], ix.Input | None]] = {
            Released: self._released,
            Revoked: lambda r, now: ix.AccessRevoked(r.peer),
            Notified: lambda r, now: self._decode(r.peer, list(r.frames), self._after),
            Landed: lambda r, now: self.work.landed(r.peer, r.key, r.bad),
            Attached: lambda r, now: ix.PeerAttached(r.peer, r.gen),
            AttachFailed: lambda r, now: ix.AttachRefused(r.peer, r.gen, r.detail),
            Faulted: lambda r, now: ix.PlaneFaulted(r.peer, r.gen, r.detail),
        }
        notes: dict[str, Callable[[str, Any], None]] = {
            "name_peer": lambda peer, m: self.logs.name(peer, m.instance, self._principal(peer)),
            "rejected": self._note_rejected,
            "peer_error": self._note_error,
            "probe_answered": lambda peer, m: self.metrics.probe_answered(sum(m.hits), len(m.hits) - sum(m.hits)),
            "chatter": lambda peer, m: self._chatter.add(peer),
        }
        # per message struct: (the observation when one arrives, whether it needs the principal),
        # from the spec's routing table (kvtier.lifecycle._table.WIRE)
        self._received = {getattr(wm, w.struct): (notes[w.noted] if w.noted else None, w.principal)
                          for w in WIRE.values()}

    def collect(self, budget: int | None = None, *, receiving: bool = True, due: float | None = None) -> list[ix.Input]:
        """Read up to ``budget`` messages (default :data:`RECV_BUDGET`) and every connection
        event, then the plane's reports.  Advances :attr:`quiet_since` when a pass emptied every
        socket.  ``receiving``: a load of ours is out (a peer may be writing into our pool).
        ``due``: the core's next deadline; a pass more than :data:`LATE_S` after it crosses the
        transport's barrier first, and dates :attr:`quiet_since` no later than the crossing (not at
        all when the crossing proved nothing: the next pass may, without one)."""
        if budget is None:
            budget = RECV_BUDGET
        out: list[ix.Input] = []
        read = 0
        after = self.quiet_since  # what this pass reads arrived after it: every input's stamp
        proven = float("inf")  # the latest time up to which an emptied socket proves quiet
        if due is not None:
            start = self.clock()
            # late for it, and not crossed since: a deadline held back (a landing still running)
            # does not make every pass cross again.  A crossing that proved nothing (a backlog
            # that did not move: a full queue) holds this pass's deadlines, once: it reads first
            if start - max(due, self._crossed) > LATE_S and due != self._held:
                barrier = getattr(self.transport, "barrier", None)  # optional in a transport of one's own
                if barrier is not None:
                    ok = barrier(BARRIER_WAIT_S)
                    proven = start if ok else float("-inf")
                    self._held = None if ok else due  # held once: the next pass fires it, uncrossed
                    self._crossed = self.clock()
        if receiving and self.plane.one_sided:
            # progress first: what our progress lets complete now (a WRITE into us, and the header
            # the producer sends once it is done) is then read before the time that dates
            # quiet_since, so it counts as input that came before a deadline due then (N15).  With
            # no load out nothing can be written into us: the progress after the read serves
            # (a producer reads a fetch one progress call sooner, decision C26)
            early = self.plane.poll()
            if early:
                out.extend(self.reports(early, after))
        undecoded = self._undecoded
        start_read = self.clock()
        until = start_read + RECV_TIME_S
        while True:
            t0 = self.clock()
            if undecoded and not self._decode_until(until, out, after):
                break  # still behind on what was read: nothing new this pass, the queue is not empty
            messages, events, drained = self.transport.service(min(RECV_BATCH, budget - read))
            undecoded.extend(messages)
            caught_up = self._decode_until(until, out, after)
            closes = self._closes
            for ev in events:
                if ev.reason in CloseReason.DIAL_FAILED:  # the dial never connected
                    closes.append(ix.ConnectFailed(ev.peer, ev.reason, ev.reason == CloseReason.CONNECT_TIMEOUT))
                elif ev.reason == CloseReason.AUTH_FAILED:  # our dial's CURVE handshake failed
                    closes.append(ix.ConnectFailed(ev.peer, ev.detail, auth_failed=True))
                elif ev.reason == CloseReason.AUTH_REFUSED:  # no peer id, no session: count and say so
                    self.metrics.session_ended(Reason.AUTH_FAILED)
                    self.logs("*", "auth_refused", "kvtier: refused an inbound connection%s (auth_failed): %s",
                              f" from {ev.peer}" if ev.peer else "", ev.detail, level=logging.WARNING)
                elif ev.reason != CloseReason.DROPPED:  # our own drop: its session already ended
                    closes.append(ix.ConnectionClosed(ev.peer, after))
            read += len(messages)
            if not caught_up:
                break
            if drained:
                if closes:  # everything delivered before these closes has been read now
                    out.extend(closes)
                    self._closes = []
                t0 = min(t0, proven)
                if t0 > self.quiet_since:
                    self.quiet_since = t0
                self._busy_since = None
                break
            if read >= budget or self.clock() >= until:
                break
        if self._busy_since is None and self.quiet_since < start_read:
            self._busy_since = start_read  # this pass did not see the queue empty
        reports = self.plane.poll()
        if reports:
            out.extend(self.reports(reports, after))
        if not receiving:
            self._progress_live = False  # unread from now on: what the next read counts may be old (I43)
        elif start_read - self._progress_at >= PROGRESS_S:
            self._progress_at = start_read
            progress = getattr(self.transport, "progress", None)  # optional in a transport of one's own
            if progress is not None:
                grew, chatter = progress(), self._chatter
                if self._progress_live:
                    out.extend(ix.PeerProgress(peer) for peer in grew if peer not in chatter)
                self._progress_live = True
            self._chatter.clear()
        return out

    def deadlines_at(self, now: float) -> float:
        """Up to when deadlines may fire at ``now`` (seconds): when the queue was last seen empty
        (:attr:`quiet_since`, decision I3) — or, once passes have read for :data:`HOLD_MAX_S`
        without seeing it empty, ``now - HOLD_MAX_S``: a flood cannot hold every deadline, and
        every job's result, for as long as it lasts (C37).  A loop that resumes after a stall
        reads its backlog first: the bound counts from the first pass that did not empty it."""
        busy = self._busy_since
        if busy is None or now - busy <= HOLD_MAX_S:
            return self.quiet_since
        return max(self.quiet_since, now - HOLD_MAX_S)

    @property
    def behind(self) -> bool:
        """Messages were read but left undecoded by a pass that ran out of time (:data:`RECV_TIME_S`):
        the loop runs its next pass at once, without waiting."""
        return bool(self._undecoded)

    def _decode_until(self, until: float, out: list[ix.Input], after: float) -> bool:
        """Decode what was read, in order, into ``out`` until the clock passes ``until``; whether
        nothing is left."""
        undecoded, clock = self._undecoded, self.clock
        while undecoded:
            peer, frames = undecoded.popleft()
            out.append(self._decode(peer, frames, after))
            if clock() >= until:
                return not undecoded
        return True

    def reports(self, reports: list[Any], after: float = float("-inf")) -> list[ix.Input]:
        """The inputs the plane's ``reports`` make (a landing's goes to the per-byte work); a
        notification's header is stamped ``after``."""
        self._after = after
        self.reported += len(reports)
        now = self.clock()
        table = self.PLANE_REPORTS
        return [i for i in (table[type(r)](r, now) for r in reports) if i is not None]

    def _decode(self, peer: str, frames: list[Any], after: float) -> ix.Input:
        try:
            msg, payloads = self.decoder.decode(frames)
        except WireError as err:
            self.metrics.wire_error(err.reason)
            if err.reason == WireReason.VERSION_MISMATCH:
                self.logs(peer, err.reason, "kvtier: %s speaks protocol version %s, we speak %s", self.logs.who(peer),
                          err.theirs, wm.PROTOCOL_VERSION, level=logging.ERROR)
            else:
                self.logs(peer, err.reason, "kvtier: bad message from %s%s: %s", self.logs.who(peer),
                          f" about {err.kv_request_id}" if err.kv_request_id else "", err)
            return ix.Malformed(peer, err.reason, err.detail, err.msg_type or None, err.kv_request_id, err.gen,
                                err.theirs or None, after)
        note, wants_principal = self._received[type(msg)]
        if note is not None:
            note(peer, msg)
        principal = self._principal(peer) if wants_principal else None
        return ix.Received(peer, msg, tuple(payloads) if payloads else (), principal, after)

    def _principal(self, peer: str) -> str | None:
        """The principal ``peer``'s connection proved (CURVE), or None."""
        info = self.transport.peer_info(peer)
        return info.principal if info is not None else None

    def _released(self, r: Released, now: float) -> ix.Input:
        posted = self._posted.pop((r.kv_request_id, r.round), now)
        if r.failed:
            self.logs(r.kv_request_id, "transfer_failed", "kvtier: transfer %s round %d failed in the data plane: %s",
                      r.kv_request_id, r.round, r.detail, level=logging.DEBUG)
        else:
            self.metrics.transfer("producer", r.nbytes, now - posted)
        return ix.TransferReleased(r.kv_request_id, r.round, r.failed)

    def _note_rejected(self, peer: str, msg: wm.HelloReject) -> None:
        if msg.field == "max_peers":
            self.logs(peer, "hello_reject", "kvtier: %s refused the session: it already has max_peers=%s sessions",
                      self.logs.who(peer), msg.ours, level=logging.ERROR)
        elif msg.field == "descriptor" and msg.ours == ix.STILL_HELD:  # N25's redial meets its old session
            self.logs(peer, "hello_reject", "kvtier: %s still holds another session of ours: one ended here but not "
                      "yet there (a later handshake is admitted), or we dial it under two names (e.g. localhost and "
                      "127.0.0.1: NIXL admits one session per agent; use one name)", self.logs.who(peer),
                      level=logging.WARNING)
        elif msg.field == "descriptor" and msg.ours == ix.SELF:  # a request naming this instance (N26)
            self.logs(peer, "hello_reject", "kvtier: %s is this tier itself (self_fetch): its data plane cannot load "
                      "from its own instance (a NIXL agent is not its own peer; zmq can). A request served by the "
                      "instance that holds its blocks needs no remote_prefiller / remote_kv_source",
                      self.logs.who(peer), level=logging.ERROR)
        elif msg.field == "descriptor":  # its plane could not admit ours: the reason is in its log
            self.logs(peer, "hello_reject", "kvtier: %s refused our data-plane descriptor (its log says why)%s",
                      self.logs.who(peer), handshake_hint(msg.field), level=logging.ERROR)
        else:  # the refusal names our value first ("theirs" from its side); a secret field names none
            self.logs(peer, "hello_reject", "kvtier: %s rejected our hello: %s%s", self.logs.who(peer),
                      differs(msg.field, msg.theirs or "(not shown)", msg.ours or "(withheld)"),
                      handshake_hint(msg.field), level=logging.ERROR)

    def _note_error(self, peer: str, msg: wm.Error) -> None:
        self.metrics.wire_error(msg.reason, reported_by_peer=True)
        self.logs(peer, "peer_error", "kvtier: %s reports an error%s: %.64s %.200s", self.logs.who(peer),
                  f" about {msg.kv_request_id}" if msg.kv_request_id else "", msg.reason, msg.detail)
