"""Serve windows: where the core's questions about the engine's own blocks meet a
:class:`~kvtier.blocksource.BlockSource`.

The serve machine (``kvtier/lifecycle/serve.py``) asks, as effects, to look keys up in the engine's
tiers (``LookUpBlocks``), to close a round's engine lookup context (``CloseLookup``) and to release
pins (``ReleasePins``).  An engine may be asked about its blocks only inside a serve window (vLLM:
``serve_external_requests(parent)``, under its lock), so lookups and closes wait in this module's
queues until the engine opens one; releases are performed at once (they only hand a result back).

One window, in order: the closes queued since the last window; then every round's lookup queued
*before* the window opened (those queued during it — the re-polls of pending keys — wait for the
next window), each answered with one ``LookupAnswered`` input that the caller applies before the
next lookup; then the closes queued during the window.  A round's lookups queued between windows
are one lookup, and a round's close drops what it still had queued (nothing of a round that
stopped looking is ever performed, or kept).  A window asks the engine about at most the keys the
caller allows (``TierCore.serve_lookup_budget``): the keys of a lookup past them are answered
pending (the core asks them again), and rounds not reached keep their place for the next window
(decision Y25).  It takes first the rounds of the peers with the fewest keys asked of the engine
lately (each window halves the count) plus keys still waiting, a peer's rounds in queue order: a
peer that keeps full rounds waiting, in many rounds or one at a time, does not hold back one that
asks about a few keys (decision Y27).  A lookup whose
round stopped looking (``TierCore.serve_room`` None) is skipped; one pins at most what its peer's
room holds when it is performed — blocks pinned already cost nothing again — the keys after that
answered missing (decision Y23).  Every pin is released
exactly once, through the source that made it (property ``pin_released_once``); every context
opened is closed exactly once (property ``lookup_context_closed_once``), or dropped with the engine
at shutdown.
"""

from __future__ import annotations

import logging
import operator
import sys
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from kvtier.blocksource import BlockSource, Presence
from kvtier.lifecycle import Reason
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix

__all__ = ["ServeWindows"]

log = logging.getLogger("kvtier.manager")

_NO_ID = object()  # a "pin" with no pin_id attribute: nothing to release it by

RoundKey = tuple[str, str, int]


class ServeWindows:
    """The serve windows of one manager (under its lock).

    Args:
        on_error: counts an internal error (a source that raised, a pin released twice, a bad pin).
        num_blocks: the pool's blocks: a pin's block numbers must be below it (None: unchecked).
    """

    def __init__(self, *, on_error: Callable[[], None], num_blocks: int | None = None) -> None:
        self._num_blocks = num_blocks
        self._lookups: OrderedDict[RoundKey, fx.LookUpBlocks] = OrderedDict()  # one per round, queue order
        self._closes: deque[fx.CloseLookup] = deque()
        self._contexts: dict[RoundKey, tuple[BlockSource, Any]] = {}
        self._pins: dict[int, BlockSource] = {}
        self._asked: dict[str, float] = {}  # peer -> keys windows asked for it lately, halved each window (Y27)
        self._seq = 0
        self._on_error = on_error
        self.standing: BlockSource | None = None
        """A source the manager serves from at every tick (:class:`~kvtier.blocksource.BlockIndex`)."""
        self.windows = 0
        self.opened = 0
        self.closed = 0

    # -- performers (the outbound table points here) ----------------------------------------------
    def queue_lookup(self, e: fx.LookUpBlocks) -> None:
        key = (e.peer, e.kv_request_id, e.round)
        queued = self._lookups.get(key)
        self._lookups[key] = e if queued is None else fx.LookUpBlocks(*key, queued.keys + e.keys)

    def queue_close(self, e: fx.CloseLookup) -> None:
        # the round stopped looking: what it still had queued is never performed (Y25)
        self._lookups.pop((e.peer, e.kv_request_id, e.round), None)
        self._closes.append(e)

    def release(self, e: fx.ReleasePins) -> None:
        reason = None if e.ok else (e.reason or Reason.TRANSFER_FAILED).value
        for pin in e.pins:
            source = self._pins.pop(pin, None)
            if source is None:  # the core releases each pin once: a second release is a bug, never passed on
                self._on_error()
                log.error("kvtier: pin %d released twice or never taken; dropped", pin)
                continue
            try:
                source.release(pin, e.ok, reason)
            except Exception:
                self._on_error()
                log.exception("kvtier: the block source failed to release pin %d", pin)

    # -- reads ------------------------------------------------------------------------------------
    def pending(self) -> bool:
        """True while lookups or closes wait for a window, or pins are held."""
        return bool(self._lookups or self._closes or self._pins or self._contexts)

    def wanted(self) -> bool:
        """True while lookups or closes wait for a window (a window with none does nothing)."""
        return bool(self._lookups or self._closes)

    def pin_count(self) -> int:
        return len(self._pins)

    def pins(self) -> frozenset[int]:
        return frozenset(self._pins)

    def contexts(self) -> int:
        return len(self._contexts)

    # -- a window ---------------------------------------------------------------------------------
    def run(self, source: BlockSource, room: Callable[[str, str, int], Any],
            apply: Callable[[ix.Input], None], budget: int | None = None) -> int:
        """One serve window with ``source``: performs what is queued (see the module docstring),
        applying each lookup's answer with ``apply`` before the next.  ``room(peer, id, round)``:
        what the round's lookup may pin now (a :class:`~kvtier.lifecycle.serve.ServeRoom`: at most
        ``reach`` found keys, then of a pin's blocks the first ``fits(blocks)``), None when the core
        no longer waits for its lookups.  ``budget``: keys the window may ask the engine about
        (None: all).  Returns how many lookups it performed."""
        self.windows += 1
        self._close_queued(len(self._closes))
        done, lookups, asked_of = 0, self._lookups, self._asked
        budget = sys.maxsize if budget is None else budget
        # the rounds queued before the window; first the peers whose keys asked lately and still
        # waiting are fewest, a peer's rounds in queue order (Y27)
        cost = dict(asked_of)
        for (peer, _, _), e in lookups.items():
            cost[peer] = cost.get(peer, 0.0) + len(e.keys)
        for key in sorted(lookups, key=lambda k: cost[k[0]]):
            if budget <= 0:  # the rest wait, ahead of the re-polls queued meanwhile among equal costs
                break
            e = lookups.pop(key, None)
            if e is None:  # closed meanwhile
                continue
            fit = room(e.peer, e.kv_request_id, e.round)
            if fit is None:
                continue
            answer, asked = self._look_up(source, e, fit, budget)
            budget -= asked
            asked_of[e.peer] = asked_of.get(e.peer, 0.0) + asked
            apply(answer)
            done += 1
        self._close_queued(len(self._closes))
        # a peer's cost halves every window and is forgotten under 2 keys (so bounded by the peers)
        self._asked = {p: n / 2 for p, n in asked_of.items() if n >= 2}
        return done

    def _look_up(self, source: BlockSource, e: fx.LookUpBlocks, room: Any,
                 budget: int) -> tuple[ix.LookupAnswered, int]:
        """The answer to ``e`` and how many keys the engine was asked: at most ``budget``, the
        keys after them answered pending (asked again at a later window, decision Y25)."""
        key = (e.peer, e.kv_request_id, e.round)
        keys = e.keys
        found: list[bytes] = []
        pending: list[bytes] = []
        missing: list[bytes] = []
        asked = 0
        try:
            held = self._contexts.get(key)
            if held is None or held[0] is not source:
                if held is not None:  # opened through another source: close it there first
                    self._close(key)
                self._seq += 1
                ctx = source.open(f"kvtier-serve:{self._seq}:{e.peer}:{e.kv_request_id}:{e.round}")
                self._contexts[key] = (source, ctx)
                self.opened += 1
            ctx = self._contexts[key][1]
            for i, k in enumerate(keys):
                if len(found) >= room.reach:  # more could not fit, even blocks pinned already: not offered
                    missing.extend(keys[i:])
                    break
                if asked >= budget:
                    pending.extend(keys[i:])
                    break
                asked += 1
                p = source.lookup(k, ctx)
                (found if p is Presence.FOUND else pending if p is Presence.PENDING else missing).append(k)
            got = self._pin(source, ctx, found) if found else None
            if got is not None and (n := room.fits(got[1])) < len(found):
                # blocks new to the budget past its room: pin again only the keys before them (Y23)
                self._pins.pop(got[0])
                source.release(got[0], True, None)
                missing.extend(found[n:])
                del found[n:]
                got = self._pin(source, ctx, found) if found else None
        except Exception:
            # an engine that cannot answer: its blocks are computed by the peer (all missing)
            self._on_error()
            log.exception("kvtier: looking blocks up in the engine failed; answering miss")
            return ix.LookupAnswered(e.peer, e.kv_request_id, e.round, missing=tuple(keys)), asked
        if not found:
            return ix.LookupAnswered(e.peer, e.kv_request_id, e.round, (), (), None, tuple(pending),
                                     tuple(missing)), asked
        if got is None:  # a bad pin: logged and released; its blocks are not served
            return ix.LookupAnswered(e.peer, e.kv_request_id, e.round, missing=tuple(keys)), asked
        return ix.LookupAnswered(e.peer, e.kv_request_id, e.round, tuple(found), got[1], got[0],
                                 tuple(pending), tuple(missing)), asked

    def _pin(self, source: BlockSource, ctx: Any, found: list[bytes]) -> tuple[Any, tuple[int, ...]] | None:
        """Pin ``found``: ``(pin id, its blocks)``, recorded for its one release; None for a bad pin
        (logged, released through its source unless another owner holds its id)."""
        pin = source.pin(tuple(found), ctx)
        pin_id = getattr(pin, "pin_id", _NO_ID)
        outstanding = False
        try:
            blocks, bad = self._blocks(pin.blocks, len(found))
        except Exception:  # not a Pin: no blocks to read
            blocks, bad = (), f": not a Pin ({type(pin).__name__})"
        try:
            outstanding = pin_id in self._pins
        except TypeError:  # it could not be released by id: refused, released by the source's own id
            bad = bad or f": pin id {pin_id!r} is not hashable"
        if pin_id is None or pin_id is _NO_ID:  # a pin of no id would read as no pin at all: never released
            bad = bad or ": pin id None"
        elif outstanding:
            bad = bad or f": pin id {pin_id!r} is outstanding"
        if bad:
            self._on_error()
            log.error("kvtier: the block source returned a bad pin %r for %d keys%s; its blocks are not served",
                      pin, len(found), bad)
            try:  # an id outstanding from this source cannot be told apart: leave it to its first owner;
                # one another source made is this source's own pin, released through it
                if pin_id is not _NO_ID and (not outstanding or self._pins[pin_id] is not source):
                    source.release(pin_id, False, Reason.JOB_REFUSED.value)
            except Exception:
                log.exception("kvtier: releasing a bad pin failed")
            return None
        self._pins[pin_id] = source
        return pin_id, blocks

    def _blocks(self, given: Any, keys: int) -> tuple[tuple[int, ...], str]:
        """A pin's block numbers as ints (an engine's numpy integers are taken: ``operator.index``),
        and what is wrong with them ("" when nothing): a count other than the keys', a block that is
        not an integer (a bool, a float) or one outside the pool would make the transfer fail in
        the I/O loop, the peer's load wait for its timeout and the pin never be released; a block
        pinned for two keys would load one key's bytes into the other's slot, and they would check.

        Raises:
            TypeError: ``given`` is not iterable."""
        items = tuple(given)
        if len(items) != keys:
            return (), f": {len(items)} blocks"
        out = []
        for b in items:
            try:
                n = operator.index(b)
            except TypeError:
                n = None
            if n is None or isinstance(b, bool):
                return (), f": block {b!r} ({type(b).__name__}) is not an integer; return ints"
            if n < 0 or (self._num_blocks is not None and n >= self._num_blocks):
                return (), f": block {n} is outside the pool (0..{(self._num_blocks or 1) - 1})"
            out.append(n)
        if len(set(out)) != len(out):  # two keys cannot hold one block: one would load the other's bytes
            return (), f": block {next(b for b in out if out.count(b) > 1)} is pinned for two keys"
        return tuple(out), ""

    def _close_queued(self, n: int) -> None:
        for _ in range(n):
            e = self._closes.popleft()
            self._close((e.peer, e.kv_request_id, e.round))

    def _close(self, key: RoundKey) -> None:
        held = self._contexts.pop(key, None)
        if held is None:
            return
        source, ctx = held
        self.closed += 1
        try:
            source.close(ctx)
        except Exception:
            self._on_error()
            log.exception("kvtier: closing an engine lookup context failed")

    def drop_contexts(self) -> int:
        """Shutdown: the engine is going away, no window will come; forget every open context
        and queued lookup (the pins were released by the core's shutdown)."""
        n = len(self._contexts)
        self._contexts.clear()
        self._lookups.clear()
        self._closes.clear()
        return n
