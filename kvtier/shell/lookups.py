"""Name lookups off the I/O loop: a dial to a producer named by host name waits for its lookup on
a thread of its own, never on the loop (decision T19).

``getaddrinfo`` blocks for as long as the resolver takes — seconds when a DNS server drops a
packet (its retry timer), longer when none answers — and the I/O loop serves every session and
every request of its manager: a lookup on it would hold all of them, and their deadlines, for
that long.  So :class:`Lookups` runs each lookup on a short-lived daemon thread and wakes the loop
when it ends; the loop finishes the dial in its next pass (:meth:`Lookups.take`).  The session
meanwhile is ``connecting``: its handshake deadline bounds the wait, as it bounds a connection
that does not come up.  A lookup whose dial was closed, or superseded by a newer dial of the same
peer, is dropped when it ends: a dial is never opened for a session that no longer wants it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Lookups"]

Addresses = tuple[str, ...]
"""What a lookup answers: the addresses a name resolves to, in the order they are dialled (T20)."""


class Lookups:
    """The name lookups in progress of one manager's dials.

    Args:
        wake: called (from the lookup's thread) when a lookup ended: the loop's wake-up.
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._wanted: dict[str, int] = {}  # peer -> the dial (generation) whose lookup runs
        self._ended: list[tuple[str, int, Addresses | None, Exception | None]] = []
        self.ready = False
        """A lookup ended since the last :meth:`take` (read without the lock: a stale False only
        delays it to the pass its wake-up brings)."""

    def start(self, peer: str, gen: int, lookup: Callable[[], Addresses]) -> None:
        """Run ``lookup()`` (blocking: the addresses to dial, in order) for dial ``gen`` of ``peer`` on a
        thread of its own; a running lookup of an earlier dial of ``peer`` is superseded."""
        with self._lock:
            self._wanted[peer] = gen
        threading.Thread(target=self._run, args=(peer, gen, lookup), name="kvtier-lookup", daemon=True).start()

    def _run(self, peer: str, gen: int, lookup: Callable[[], Addresses]) -> None:
        try:
            out: tuple[Addresses | None, Exception | None] = (lookup(), None)
        except Exception as exc:  # noqa: BLE001 - the loop reports it as the dial's failure
            out = (None, exc)
        with self._lock:
            self._ended.append((peer, gen, *out))
            self.ready = True
        self._wake()

    def cancel(self, peer: str) -> bool:
        """Drop ``peer``'s lookup (its dial was closed): its end is ignored.  True if one ran."""
        with self._lock:
            return self._wanted.pop(peer, None) is not None

    def take(self) -> list[tuple[str, int, Addresses | None, Exception | None]]:
        """The lookups that ended for dials still wanted: ``(peer, gen, addresses, error)``,
        one of ``addresses`` (what to dial, in order) and ``error`` (why not) set."""
        with self._lock:
            ended, self._ended, self.ready = self._ended, [], False
            out = []
            for peer, gen, addresses, error in ended:
                if self._wanted.get(peer) == gen:
                    del self._wanted[peer]
                    out.append((peer, gen, addresses, error))
            return out
