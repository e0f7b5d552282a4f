"""A deadline queue with O(log n) arm and O(expired) expiry.

Entries are ``(when, seq, key)`` in a heap.  Re-arming a key does not search the heap: the record
remembers the ``seq`` of its live entry and older entries are skipped when they surface (lazy
deletion).  The owner reports each entry it makes stale (:meth:`DeadlineQueue.retire`), and the
queue drops all stale entries once they are more than half of it (and more than 64), so stale
entries never outnumber live ones for long: an id that moved on (parked → serving → done) does not
keep paying for the deadlines of its earlier states.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

IsLive = Callable[[Any, int], bool]


class DeadlineQueue:
    """Deadlines in seconds (the caller's clock), keyed by record key."""

    __slots__ = ("_heap", "_seq", "_stale")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = 0
        self._stale = 0  # entries known to be stale (an estimate: owners may under-report)

    def arm(self, when: float, key: Any) -> int:
        """Schedule ``key`` at ``when``; return the entry's seq (the record keeps it)."""
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, key))
        return self._seq

    def next_when(self, is_live: IsLive) -> float | None:
        """Earliest live deadline, discarding stale heads."""
        heap = self._heap
        while heap and not is_live(heap[0][2], heap[0][1]):
            heapq.heappop(heap)
            self._stale = max(0, self._stale - 1)
        return heap[0][0] if heap else None

    def pop_due(self, now: float, is_live: IsLive) -> Any | None:
        """Pop and return the key of the earliest live entry with ``when <= now``, or None."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, seq, key = heapq.heappop(heap)
            if is_live(key, seq):
                return key
            self._stale = max(0, self._stale - 1)
        return None

    def retire(self, is_live: IsLive) -> None:
        """One live entry just went stale (its record re-armed or dropped its timer).  Once stale
        entries are over half the heap (and over 64), drop them all: O(n) then, amortised O(1)."""
        self._stale += 1
        if self._stale > 64 and 2 * self._stale > len(self._heap):
            self._compact(is_live)

    def maybe_compact(self, live_records: int, is_live: IsLive) -> None:
        """Drop stale entries (O(n)) once they outnumber live records 4:1 (a backstop for stale
        entries nobody reported); amortised O(1)."""
        if len(self._heap) > 64 + 4 * live_records:
            self._compact(is_live)

    def _compact(self, is_live: IsLive) -> None:
        self._heap = [e for e in self._heap if is_live(e[2], e[1])]
        heapq.heapify(self._heap)
        self._stale = 0

    def when_of(self, key: Any, seq: int) -> float | None:
        """When the entry ``(key, seq)`` falls due, or None (O(n): tests and introspection)."""
        for when, s, k in self._heap:
            if k == key and s == seq:
                return when
        return None

    def __len__(self) -> int:
        return len(self._heap)
