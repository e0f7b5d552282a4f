"""Deadlines with O(1) arm and O(expired) expiry: one FIFO lane per timer.

Every timer of a machine runs for one fixed duration (its config key), and the core is fed a
monotonic ``now``, so the deadlines armed on one timer come out in the order they were armed: a
lane is a FIFO of ``(when, seq, key)``, arming is an append, and the earliest deadline of the
machine is the earliest of its lanes' heads (a machine has at most five timers).  An entry that
arrives out of order (a caller's clock stepped back) is put in its place, at O(lane) cost, so a
deadline never fires early nor late.

Re-arming a key does not search a lane: the record remembers the ``seq`` of its live entry and
older entries are skipped when they surface (lazy deletion).  The owner reports each entry it
makes stale (:meth:`DeadlineQueue.retire`), and the queue drops all stale entries once they are
more than half of it (and more than :data:`STALE_FLOOR`), so stale entries never outnumber live ones for long: an
id that moved on (parked → serving → done) does not keep paying for the deadlines of its earlier
states.  (Decision C9 supersedes D5's heap: the lanes halve the cost of a timer change, P4 in
docs/benchmarks.md.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

IsLive = Callable[[Any, int], bool]

#: Stale entries tolerated before a compaction is considered (~100 B each): below this, heads
#: that surface are dropped by the ticks, and a compaction would cost more than it frees.
STALE_FLOOR = 4096

__all__ = ["DeadlineQueue"]

_NEVER = float("inf")


class DeadlineQueue:
    """Deadlines in seconds (the caller's clock), keyed by record key, in lanes (one per timer)."""

    __slots__ = ("_best", "_lanes", "_low", "_seq", "_size", "_stale")

    def __init__(self) -> None:
        self._lanes: dict[Any, deque[tuple[float, int, Any]]] = {}
        self._seq = 0
        self._stale = 0  # entries known to be stale (an estimate: owners may under-report)
        self._size = 0
        # No live entry falls due before _low: lowered by every arm, made exact by each scan of
        # the heads, and never wrong as entries leave (that only raises the earliest).  _best
        # is the lane whose head the last scan found earliest.  Every pass of the I/O loop asks
        # for the next deadline and fires what is due; most find nothing due and the earliest
        # unchanged, and answer from these two without a scan (decision C26).
        self._low = _NEVER
        self._best: deque[tuple[float, int, Any]] | None = None

    def arm(self, when: float, key: Any, lane: Any = None) -> int:
        """Schedule ``key`` at ``when`` on ``lane`` (its timer); return the entry's seq (the
        record keeps it)."""
        self._seq = seq = self._seq + 1
        q = self._lanes.get(lane)
        if q is None:
            q = self._lanes[lane] = deque()
        if q and q[-1][0] > when:  # out of order: keep the lane sorted
            entries = sorted([*q, (when, seq, key)])
            q.clear()
            q.extend(entries)
        else:
            q.append((when, seq, key))
        self._size += 1
        if when < self._low:  # noqa: PLR1730 - a comparison, not a call to min(), on every arm
            self._low = when
        return seq

    def _head(self, is_live: IsLive) -> deque[tuple[float, int, Any]] | None:
        """The lane whose live head is earliest (stale heads are dropped on the way)."""
        best = None
        for q in self._lanes.values():
            while q and not is_live(q[0][2], q[0][1]):
                q.popleft()
                self._size -= 1
                self._stale = max(0, self._stale - 1)
            if q and (best is None or q[0][0] < best[0][0]):
                best = q
        self._best = best
        self._low = best[0][0] if best is not None else _NEVER
        return best

    def next_when(self, is_live: IsLive) -> float | None:
        """Earliest live deadline, discarding stale heads (unless the earliest is known: the head
        the last scan found is still live and nothing earlier was armed since)."""
        if not self._size:  # no entry at all
            return None
        low = self._low
        q = self._best
        if q:
            when, seq, key = q[0]
            if when == low and is_live(key, seq):
                return when
        q = self._head(is_live)
        return q[0][0] if q is not None else None

    def pop_due(self, now: float, is_live: IsLive) -> Any | None:
        """Pop and return the key of the earliest live entry with ``when <= now``, or None."""
        due = self.pop_due_at(now, is_live)
        return None if due is None else due[1]

    def pop_due_at(self, now: float, is_live: IsLive) -> tuple[float, Any] | None:
        """:meth:`pop_due`, returning ``(when, key)``: when it fell due, too."""
        if now < self._low:  # nothing live falls due before _low
            return None
        q = self._head(is_live)
        if q is None or q[0][0] > now:
            return None
        self._size -= 1
        when, _seq, key = q.popleft()
        return when, key

    def retire(self, is_live: IsLive, lane: Any = None) -> None:
        """One live entry of ``lane`` just went stale (its record re-armed or dropped its timer).
        Stale entries at the head of that lane go at once (records usually leave a timer in the
        order they armed it, so this is where the stale entry usually is); once stale entries
        are over half the queue (and over :data:`STALE_FLOOR`), drop them all: O(n) then,
        amortised O(1)."""
        self._stale += 1
        q = self._lanes.get(lane)
        if q:
            while q and not is_live(q[0][2], q[0][1]):
                q.popleft()
                self._size -= 1
                self._stale = max(0, self._stale - 1)
        if self._stale > STALE_FLOOR and 2 * self._stale > self._size:
            self._compact(is_live)

    def maybe_compact(self, live_records: int, is_live: IsLive) -> None:
        """Drop stale entries (O(n)) once they outnumber live records 4:1 (a backstop for stale
        entries nobody reported); amortised O(1)."""
        if self._size > STALE_FLOOR + 4 * live_records:
            self._compact(is_live)

    def _compact(self, is_live: IsLive) -> None:
        size = 0
        for lane, q in self._lanes.items():
            kept = deque(e for e in q if is_live(e[2], e[1]))
            self._lanes[lane] = kept
            size += len(kept)
        self._size = size
        self._stale = 0
        self._best = None

    def when_of(self, key: Any, seq: int) -> float | None:
        """When the entry ``(key, seq)`` falls due, or None (O(n): tests and introspection)."""
        for q in self._lanes.values():
            for when, s, k in q:
                if k == key and s == seq:
                    return when
        return None

    def live(self, is_live: IsLive) -> list[tuple[float, int, Any, Any]]:
        """Every live entry as ``(when, seq, key, lane)``, in firing order (when, then arm order):
        O(n), for snapshots and introspection."""
        out = [(when, seq, key, lane) for lane, q in self._lanes.items() for when, seq, key in q
               if is_live(key, seq)]
        out.sort(key=lambda e: (e[0], e[1]))
        return out

    def clear(self) -> None:
        """Forget every entry (in place: the owner's compiled timer operations hold this queue)."""
        self._lanes.clear()
        self._seq = 0
        self._stale = 0
        self._size = 0
        self._low = _NEVER
        self._best = None

    def __len__(self) -> int:
        return self._size
