"""Serve machine (producer side of the symmetric path): one round of one peer, answered from the
engine's own tiers.

Theory of operation: a peer's ``probe`` asks which of some keys this engine holds.  The core
cannot look into the engine: it asks the shell (``LookUpBlocks``) to look the keys up at the
engine's next *serve window* (vLLM: ``serve_external_requests(parent)``, the only time the tier
may call its ``ParentManager``), where the found ones are *pinned* — the engine keeps their blocks
until the pin is released — and the answer comes back as ``lookup_result``.  Keys the engine
reports pending (a write into its primary, a promotion from its own disk tier) are looked up
again at later windows until ``serve_lookup_timeout_s``; then they are answered miss.  The
``probe_reply`` says hit for pinned keys only (property ``no_hit_without_pin``).

The round's one fetch (``fetch(offered=true)``) is served from the pinned blocks with the
producer's transfer tail, verbatim (``serving`` → ``delivering`` → receipt; ``cancelling`` →
``quarantined``; decisions I1, I2, I4): a pin is released only once the data plane holds no
reference to its blocks.  Every way out — fetch served, empty fetch, the consumer's release,
abort, no fetch within ``offer_timeout_s``, session death, ``drain_jobs``, shutdown — releases
every pin of the round exactly once (property ``pin_released_once``); a lookup result that arrives
after its round stopped looking is released at once.

Records are keyed ``(peer, kv_request_id, round)``: the consumer chose ``kv_request_id`` for its
own exchange, so two peers' ids, or a peer's id and a PD id parked here, never meet (decision
Y5).  Transfers go to the data plane under :func:`transfer_key`, for the same reason.

All decisions come from ``_table.SERVE_TABLE``; this module supplies guards and effects only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from kvtier.config import DEFAULTS
from kvtier.lifecycle._machine import Record, TableMachine
from kvtier.lifecycle._table import (
    SERVE_FINAL,
    SERVE_INITIAL,
    SERVE_STATE_TIMER,
    SERVE_TABLE,
    SERVE_TIMERS,
    Reason,
    ServeEffect,
    ServeEvent,
    ServeGuard,
    ServeState,
)
from kvtier.lifecycle.batches import Batcher
from kvtier.lifecycle.effects import (
    CancelTransfer,
    CloseLookup,
    Effect,
    Ignored,
    LookUpBlocks,
    ReleasePins,
    Send,
)
from kvtier.lifecycle.inputs import LookupAnswered
from kvtier.lifecycle.notes import GiveUp, Notes
from kvtier.lifecycle.probe import MAX_KEYS_PER_MESSAGE
from kvtier.lifecycle.producer_records import FetchInput
from kvtier.wire import messages as wm

__all__ = ["ServeLimits", "ServeMachine", "ServeRecord", "ServeRoom", "is_transfer_key", "transfer_key"]

ServeKey = tuple[str, str, int]

WITHDRAWN_KEPT = 1024
"""Rounds withdrawn with a notice that are remembered (oldest forgotten first): a fetch crossing the
notice comes within a round trip, so a window far shorter suffices; bounded memory either way."""

AWAIT_WINDOWS = 4
"""One peer's rounds may have this many serve windows' keys (its lookup budget each) waiting for the
engine at once (decision Y25): several honest requests of one engine step fit, while one peer's
probes can hold another peer's lookup back for a few windows at most."""

#: states whose blocks the data plane may reference
REFERENCED = frozenset({ServeState.SERVING, ServeState.CONFIRMED, ServeState.CANCELLING, ServeState.QUARANTINED})


def transfer_key(peer: str, kv_request_id: str) -> str:
    """The data-plane key of a served round's transfer (with its round): ``kv_request_id`` never
    contains ``|``, so no PD id and no other peer's round has the same key."""
    return f"{kv_request_id}|{peer}"


def is_transfer_key(key: str) -> bool:
    """True for a key made by :func:`transfer_key` (a PD transfer's key is its ``kv_request_id``)."""
    return "|" in key


class ServeLimits:
    """Who may probe, and how much one peer (and all of them) may hold (config keys of the same
    names; ``principals`` None: any authenticated peer)."""

    __slots__ = ("serve_external", "principals", "max_rounds_per_peer", "max_probes_per_round",
                 "max_pinned_per_peer", "max_pinned_total")

    def __init__(self, *, serve_external: bool = DEFAULTS["serve_external"], principals: frozenset[str] | None = None,
                 max_rounds_per_peer: int = DEFAULTS["serve_max_rounds_per_peer"],
                 max_probes_per_round: int = DEFAULTS["serve_max_probes_per_round"],
                 max_pinned_per_peer: int = DEFAULTS["serve_max_pinned_blocks_per_peer"],
                 max_pinned_total: int = 1 << 62) -> None:
        self.serve_external = serve_external
        self.principals = principals
        self.max_rounds_per_peer = max_rounds_per_peer
        self.max_probes_per_round = max_probes_per_round
        self.max_pinned_per_peer = max_pinned_per_peer
        self.max_pinned_total = max_pinned_total


class ServeRoom:
    """What one lookup for ``peer``'s round may pin now (decision Y23): a block already pinned for
    the peer costs nothing again, one pinned for another peer costs only the peer's own budget.
    :attr:`reach`: the most found keys that could fit (the smaller budget: blocks pinned already
    fit again); :meth:`fits`: how many of a pin's blocks, from the first, fit."""

    __slots__ = ("_mine", "_holds", "_free_peer", "_free_total", "reach")

    def __init__(self, serve: ServeMachine, peer: str) -> None:
        lim = serve.limits
        self._mine, self._holds = serve.holds_per_peer.get(peer, {}), serve.holds
        self._free_peer = lim.max_pinned_per_peer - len(self._mine)
        self._free_total = lim.max_pinned_total - len(self._holds)
        self.reach = serve.reach

    def fits(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (a pin's, in key order), from the first, fit the room."""
        free_peer, free_total, seen = self._free_peer, self._free_total, set()
        for n, b in enumerate(blocks):
            if b not in seen:
                seen.add(b)
                free_peer -= b not in self._mine
                free_total -= b not in self._holds
                if free_peer < 0 or free_total < 0:
                    return n
        return len(blocks)


class ServeRecord(Record):
    __slots__ = ("peer", "kv_request_id", "round", "gen", "keys", "todo", "found", "missing", "answered", "pins",
                 "held", "probes", "demand", "slots", "receipt")

    def __init__(self, key: ServeKey) -> None:
        super().__init__(key, SERVE_INITIAL)
        self.peer, self.kv_request_id, self.round = key
        self.gen = 0
        self.keys: dict[bytes, None] = {}  # every key the round's probes named, in order
        self.todo: set[bytes] = set()  # asked of the engine, no found/missing answer yet
        self.found: dict[bytes, int] = {}  # key -> pool block, held by one of ``pins``
        self.missing: set[bytes] = set()
        self.answered: set[bytes] = set()  # keys a probe_reply already answered
        self.pins: list[int] = []  # engine pins held for the round (released together)
        self.held: list[int] = []  # the pool blocks those pins hold
        self.probes = 0
        self.demand: tuple[bytes, ...] = ()  # the fetch's keys
        self.slots: tuple[int, ...] = ()
        self.receipt = False


class ServeMachine(TableMachine):
    """All serve records of one manager, keyed ``(peer, kv_request_id, round)``."""

    batcher: Batcher = Batcher(0, None, True)
    """Builds transfers and their headers (the core installs one sized for its pool)."""
    NAME = "serve"
    TABLE = SERVE_TABLE
    STATE_TIMER = SERVE_STATE_TIMER
    TIMERS = SERVE_TIMERS
    INITIAL = SERVE_INITIAL
    FINAL = SERVE_FINAL
    GUARD_ENUM = ServeGuard
    EFFECT_ENUM = ServeEffect

    def __init__(self, durations: Mapping[str, float], notes: Notes, limits: ServeLimits) -> None:
        """``notes``: the core's queue (``force_release`` asks through it to end a session);
        ``limits``: who may probe and how much they may pin."""
        super().__init__(durations)
        self._notes = notes
        self.limits = limits
        self.by_peer: dict[str, set[ServeKey]] = {}
        # pins per pool block, over every round and per peer: a block several rounds pin (a shared
        # prefix) takes its room in the pool once, so the budgets count distinct blocks (Y23)
        self.holds: dict[int, int] = {}
        self.holds_per_peer: dict[str, dict[int, int]] = {}
        self.closing = False
        self.transfers: dict[tuple[str, int], ServeKey] = {}  # (plane key, round) -> record
        # the rounds this side withdrew with a notice (the last WITHDRAWN_KEPT): a fetch that crossed
        # the notice is answered with the notice's reason, not not_offered (the two sides agree)
        self.withdrawn: OrderedDict[ServeKey, Reason] = OrderedDict()

    def new_record(self, key: ServeKey) -> ServeRecord:
        return ServeRecord(key)

    # -- inputs --------------------------------------------------------------------------------
    def message(self, event: ServeEvent, inp: FetchInput, now: float, out: list[Effect]) -> None:
        """probe / fetch / abort_fetch / receipt from ``inp.peer`` for its round."""
        self.apply(self.record((inp.peer, inp.kv_request_id, inp.round)), event, inp, now, out)

    def lookup_result(self, inp: LookupAnswered, now: float, out: list[Effect]) -> None:
        self.apply(self.record((inp.peer, inp.kv_request_id, inp.round)), ServeEvent.LOOKUP_RESULT, inp, now, out)

    def transfer_event(self, key: str, round: int, event: ServeEvent, now: float, out: list[Effect]) -> None:
        """transfer_released / transfer_failed from the data plane (``key``: the plane key)."""
        rk = self.transfers.get((key, round))
        rec = self.records.get(rk) if rk is not None else None
        if rec is None or rec.state not in _TRANSFERRING:
            state = rec.state if rec is not None else ServeState.ABSENT
            out.append(Ignored(self.NAME, key, state, event, Reason.STALE))
            return
        self.apply(rec, event, None, now, out)

    def peer_lost(self, peer: str, now: float, out: list[Effect]) -> None:
        for key in [k for k in self.withdrawn if k[0] == peer]:  # its next session starts afresh
            del self.withdrawn[key]
        for key in sorted(self.by_peer.get(peer, ())):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, ServeEvent.PEER_LOST, None, now, out)

    def broadcast(self, event: ServeEvent, now: float, out: list[Effect]) -> None:
        """drain / shutdown / close, to every live record (in key order)."""
        if event is ServeEvent.SHUTDOWN:
            self.closing = True
        for key in sorted(self.records):
            rec = self.records.get(key)
            if rec is not None:
                self.apply(rec, event, None, now, out)

    # -- reads ---------------------------------------------------------------------------------
    def state_of(self, key: ServeKey) -> ServeState:
        rec = self.records.get(key)
        return rec.state if rec is not None else ServeState.ABSENT

    def pins_held(self) -> list[int]:
        return [p for r in self.records.values() for p in r.pins]

    def referenced(self) -> list[ServeRecord]:
        return [r for r in self.records.values() if r.state in REFERENCED]

    @property
    def pinned_total(self) -> int:
        """Distinct pool blocks pinned for every peer's rounds."""
        return len(self.holds)

    @property
    def reach(self) -> int:
        """The most blocks one peer's lookup could ever pin: the smaller pinned-block budget."""
        return max(0, min(self.limits.max_pinned_per_peer, self.limits.max_pinned_total))

    def room(self, peer: str) -> ServeRoom:
        """What a lookup for ``peer`` may pin now: the room ``serve_max_pinned_blocks_per_peer`` and
        the pool's ``serve_max_pinned_fraction`` leave (decision Y23)."""
        return ServeRoom(self, peer)

    # -- indexes -------------------------------------------------------------------------------
    def index_ops(self, old: Any, new: Any) -> tuple:
        ops: list = []
        if old is ServeState.ABSENT:
            ops.append(self._by_peer_add)
        return (*ops, *super().index_ops(old, new))

    def _by_peer_add(self, rec: ServeRecord) -> None:
        self.by_peer.setdefault(rec.peer, set()).add(rec.key)

    def on_delete(self, rec: ServeRecord) -> None:
        peers = self.by_peer.get(rec.peer)
        if peers is not None:
            peers.discard(rec.key)
            if not peers:
                del self.by_peer[rec.peer]
        self.transfers.pop((transfer_key(rec.peer, rec.kv_request_id), rec.round), None)
        if rec.held:  # every way into ``ended`` released the pins first; never leak the count
            self._unpin(rec)

    def _unpin(self, rec: ServeRecord) -> None:
        holds, mine = self.holds, self.holds_per_peer.get(rec.peer, {})
        for counts in (holds, mine):
            for b in rec.held:
                left = counts[b] - 1
                if left:
                    counts[b] = left
                else:
                    del counts[b]
        if not mine:
            self.holds_per_peer.pop(rec.peer, None)
        rec.held = []

    # -- guards --------------------------------------------------------------------------------
    def guard_not_serving(self, rec: ServeRecord, inp: FetchInput, now: float) -> bool:
        lim = self.limits
        return not lim.serve_external or (lim.principals is not None and inp.principal not in lim.principals)

    def guard_shutting_down(self, rec: ServeRecord, inp: FetchInput, now: float) -> bool:
        return self.closing

    def guard_over_budget(self, rec: ServeRecord, inp: FetchInput, now: float) -> bool:
        lim = self.limits
        if rec.state is ServeState.ABSENT and len(self.by_peer.get(inp.peer, ())) >= lim.max_rounds_per_peer:
            return True
        if rec.probes >= lim.max_probes_per_round:
            return True
        # the probe's lookups pin what the room holds (the window reads it): refused only when
        # nothing could be pinned, not for naming more keys than there is room for (Y23)
        if self.reach <= 0:
            return any(k not in rec.keys for k in inp.keys)
        if len(inp.keys) > self.lookup_budget:  # one message naming more than the peer could be offered (Y25)
            return True
        # a new round waits for none: refused while the peer's rounds wait on the engine for
        # AWAIT_WINDOWS windows' keys (a round's later probes are cut to that instead, Y25)
        return rec.state is ServeState.ABSENT and self.waiting_room(inp.peer) <= 0

    @property
    def lookup_budget(self) -> int:
        """Keys one serve window asks the engine about at most, and one probe may name (Y25): the
        most blocks one peer could be offered (:attr:`reach`), at least one probe message's keys.
        A peer's rounds may have :data:`AWAIT_WINDOWS` times as many waiting for the engine."""
        return max(self.reach, MAX_KEYS_PER_MESSAGE)

    def waiting_room(self, peer: str) -> int:
        """Keys ``peer``'s rounds may still have asked of the engine: :data:`AWAIT_WINDOWS` lookup
        budgets less those asked and not yet answered (Y25)."""
        records, looking = self.records, ServeState.LOOKING_UP
        waiting = sum(len(r.todo) for k in self.by_peer.get(peer, ()) if (r := records.get(k)) is not None
                      and r.state is looking)
        return AWAIT_WINDOWS * self.lookup_budget - waiting

    def _left(self, rec: ServeRecord, inp: LookupAnswered) -> set[bytes]:
        return rec.todo.difference(inp.found, inp.missing)

    def guard_settles_with_offers(self, rec: ServeRecord, inp: LookupAnswered, now: float) -> bool:
        if self._left(rec, inp):
            return False
        return bool(rec.found) or any(k in rec.todo for k in inp.found)

    def guard_settles(self, rec: ServeRecord, inp: LookupAnswered, now: float) -> bool:
        return not self._left(rec, inp)

    def guard_has_offers(self, rec: ServeRecord, inp: object, now: float) -> bool:
        return bool(rec.found)

    def guard_fetch_empty(self, rec: ServeRecord, inp: FetchInput, now: float) -> bool:
        return not inp.keys

    def guard_fetch_offered(self, rec: ServeRecord, inp: FetchInput, now: float) -> bool:
        found = rec.found
        return all(k in found for k in inp.keys)

    def guard_receipt_seen(self, rec: ServeRecord, inp: object, now: float) -> bool:
        return rec.receipt

    # -- effects -------------------------------------------------------------------------------
    def effect_look_up(self, rec: ServeRecord, inp: FetchInput, reason, now, out) -> None:
        rec.gen = inp.gen
        rec.probes += 1
        new = [k for k in inp.keys if k not in rec.keys]
        rec.keys.update(dict.fromkeys(new))
        room = self.waiting_room(rec.peer)
        if len(new) > room:  # past what the peer may have waiting: answered miss, the engine never asked (Y25)
            rec.missing.update(new[max(room, 0):])
            del new[max(room, 0):]
        rec.todo.update(new)
        out.append(LookUpBlocks(rec.peer, rec.kv_request_id, rec.round, tuple(new)))

    def effect_look_up_pending(self, rec: ServeRecord, inp: LookupAnswered, reason, now, out) -> None:
        pending = tuple(k for k in inp.pending if k in rec.todo)
        if pending:
            out.append(LookUpBlocks(rec.peer, rec.kv_request_id, rec.round, pending))

    def effect_note_found(self, rec: ServeRecord, inp: LookupAnswered, reason, now, out) -> None:
        todo = rec.todo
        for k, b in zip(inp.found, inp.blocks):
            if k in todo:
                todo.discard(k)
                rec.found[k] = b
        for k in inp.missing:
            if k in todo:
                todo.discard(k)
                rec.missing.add(k)
        if inp.pin is not None:
            rec.pins.append(inp.pin)
            rec.held.extend(inp.blocks)
            holds, mine = self.holds, self.holds_per_peer.setdefault(rec.peer, {})
            for b in inp.blocks:
                holds[b] = holds.get(b, 0) + 1
                mine[b] = mine.get(b, 0) + 1

    def effect_release_found(self, rec: ServeRecord, inp: LookupAnswered, reason, now, out) -> None:
        if inp.pin is not None:
            out.append(ReleasePins((inp.pin,), True, None))

    def effect_reply_probe(self, rec: ServeRecord, inp, reason, now, out) -> None:
        if rec.todo:  # the lookup deadline: keys still pending are answered miss, and stay so (Y25)
            rec.missing.update(rec.todo)
            rec.todo.clear()
        keys = [k for k in rec.keys if k not in rec.answered]
        if not keys:
            return
        rec.answered.update(keys)
        found = rec.found
        for i in range(0, len(keys), MAX_KEYS_PER_MESSAGE):
            part = keys[i : i + MAX_KEYS_PER_MESSAGE]
            out.append(Send(rec.peer, wm.ProbeReply(gen=rec.gen, kv_request_id=rec.kv_request_id, round=rec.round,
                                                    keys=part, hits=[k in found for k in part])))

    def effect_reply_refused(self, rec: ServeRecord, inp, reason, now, out) -> None:
        gen = inp.gen if isinstance(inp, FetchInput) else rec.gen
        out.append(Send(rec.peer, _done(gen, rec.kv_request_id, rec.round, False, reason)))
        withdrawn = self.withdrawn
        withdrawn[rec.key] = reason
        if len(withdrawn) > WITHDRAWN_KEPT:
            withdrawn.popitem(last=False)

    def guard_withdrawn(self, rec: ServeRecord, inp: FetchInput, now: float) -> bool:
        return (inp.peer, inp.kv_request_id, inp.round) in self.withdrawn

    def effect_reply_fetch_withdrawn(self, rec: ServeRecord, inp: FetchInput, reason, now, out) -> None:
        why = self.withdrawn[(inp.peer, inp.kv_request_id, inp.round)]
        out.append(Send(inp.peer, _done(inp.gen, inp.kv_request_id, inp.round, False, why)))

    def effect_close_lookup(self, rec: ServeRecord, inp, reason, now, out) -> None:
        out.append(CloseLookup(rec.peer, rec.kv_request_id, rec.round))

    def effect_bind_fetch(self, rec: ServeRecord, inp: FetchInput, reason, now, out) -> None:
        rec.demand = inp.keys
        rec.slots = inp.slots
        rec.gen = inp.gen

    def effect_start_transfer(self, rec: ServeRecord, inp, reason, now, out) -> None:
        key = transfer_key(rec.peer, rec.kv_request_id)
        self.transfers[(key, rec.round)] = rec.key
        blocks = tuple(rec.found[k] for k in rec.demand)
        out.append(self.batcher.send_blocks(rec.peer, rec.kv_request_id, rec.round, blocks, rec.gen, (), rec.slots,
                                            key, take_digests=True))

    def effect_cancel_transfer(self, rec: ServeRecord, inp, reason, now, out) -> None:
        out.append(CancelTransfer(transfer_key(rec.peer, rec.kv_request_id), rec.round))

    def effect_force_release(self, rec: ServeRecord, inp, reason, now, out) -> None:
        self._notes.append(GiveUp(rec.peer, Reason.TRANSFER_STALLED))

    def _release(self, rec: ServeRecord, ok: bool, reason: Reason | None, out: list[Effect]) -> None:
        if rec.pins:
            out.append(ReleasePins(tuple(rec.pins), ok, None if ok else reason))
            rec.pins = []
        self._unpin(rec)
        rec.found = {}

    def effect_complete_pins(self, rec: ServeRecord, inp, reason, now, out) -> None:
        self._release(rec, True, None, out)

    def effect_fail_pins(self, rec: ServeRecord, inp, reason, now, out) -> None:
        self._release(rec, False, reason or Reason.TRANSFER_FAILED, out)

    def effect_reply_done_ok(self, rec: ServeRecord, inp, reason, now, out) -> None:
        gen = inp.gen if isinstance(inp, FetchInput) else rec.gen
        out.append(Send(rec.peer, _done(gen, rec.kv_request_id, rec.round, True, None)))

    def effect_reply_done_fail(self, rec: ServeRecord, inp, reason, now, out) -> None:
        out.append(Send(rec.peer, _done(rec.gen, rec.kv_request_id, rec.round, False, reason)))

    def effect_reply_terminal(self, rec: ServeRecord, inp, reason, now, out) -> None:
        if reason is Reason.ABORTED:
            out.append(Send(rec.peer, wm.AbortAck(gen=rec.gen, kv_request_id=rec.kv_request_id, round=rec.round)))
        else:
            out.append(Send(rec.peer, _done(rec.gen, rec.kv_request_id, rec.round, False, reason)))

    def effect_reply_fetch_failed(self, rec: ServeRecord, inp: FetchInput, reason, now, out) -> None:
        out.append(Send(inp.peer, _done(inp.gen, inp.kv_request_id, inp.round, False, reason)))

    def effect_reply_abort_ack(self, rec: ServeRecord, inp: FetchInput, reason, now, out) -> None:
        out.append(Send(inp.peer, wm.AbortAck(gen=inp.gen, kv_request_id=inp.kv_request_id, round=inp.round)))

    def effect_note_duplicate(self, rec: ServeRecord, inp, reason, now, out) -> None:
        out.append(Ignored(self.NAME, rec.kv_request_id, rec.state, "duplicate", Reason.STALE))

    def effect_note_receipt(self, rec: ServeRecord, inp, reason, now, out) -> None:
        rec.receipt = True

    def effect_note_stale(self, rec: ServeRecord, inp, reason, now, out) -> None:
        out.append(Ignored(self.NAME, rec.kv_request_id, rec.state, "stale", Reason.STALE))


_TRANSFERRING = frozenset({ServeState.SERVING, ServeState.DELIVERING, ServeState.CONFIRMED, ServeState.CANCELLING,
                           ServeState.QUARANTINED})


def _done(gen: int, kv_request_id: str, round: int, ok: bool, reason: Reason | None) -> wm.TransferDone:
    return wm.TransferDone(gen=gen, kv_request_id=kv_request_id, round=round, ok=ok,
                           reason=reason.value if reason is not None else "")
