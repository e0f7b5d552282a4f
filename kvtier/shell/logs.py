"""The shell's log lines: rate-limited per (peer, reason), with peers named for an operator.

One job: turning what happened into at most a few readable lines.  A flood of bad input from
ever-new peers can neither flood the log nor grow this module's memory without bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("kvtier.manager")

#: Characters of a peer's transport name a log line shows (an inbound `in:<hex>` id can be 513).
_SHOWN = 40

__all__ = ["RateLimitedLog", "log"]


class RateLimitedLog:
    """At most one log line per (peer, reason) per ``interval_s`` seconds, and at most ``budget``
    lines per ``interval_s`` in all.

    Args:
        clock: seconds (the manager's clock).
        where: ``peer -> "host:port"`` (the transport's view of a peer), for :meth:`who`.
    """

    def __init__(self, clock: Callable[[], float], where: Callable[[str], str], interval_s: float = 10.0,
                 budget: int = 50) -> None:
        self._clock = clock
        self._where = where
        self.interval_s = interval_s
        self.budget = budget
        self._last: dict[tuple[str, str], float] = {}
        self._window = float("-inf")
        self._used = 0
        self._suppressed = 0
        self._names: dict[str, str] = {}

    def __call__(self, peer: str, reason: str, msg: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Log ``msg % args`` unless this (peer, reason) logged within the interval or the budget
        is spent; return whether it logged."""
        now = self._clock()
        if now - self._window >= self.interval_s:
            if self._suppressed:
                log.warning("kvtier: %d more log lines about bad peer input suppressed in the last %.0f s",
                            self._suppressed, self.interval_s)
            self._window, self._used, self._suppressed = now, 0, 0
        key = (peer, str(reason))
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        if self._used >= self.budget:
            self._suppressed += 1
            return False
        self._last[key] = now
        if len(self._last) > 4096:
            self._last.clear()
        self._used += 1
        log.log(level, msg, *args)
        return True

    def who(self, peer: str, instance: str = "") -> str:
        """``peer`` for a log line: where it is and, once known, its manager instance (an inbound
        ``in:<hex>`` routing id alone means nothing to an operator).  An address the transport
        cannot tell is left out rather than printed as "unknown"."""
        named = self._names.get(peer)
        if named is None and instance:
            self.name(peer, instance)
            named = self._names.get(peer)
        return named or self._place(peer)

    def _place(self, peer: str) -> str:
        """Where ``peer`` is, with its transport name — at most :data:`_SHOWN` characters of it:
        a peer picks its own routing id (up to 255 bytes)."""
        where = self._where(peer)
        short = peer if len(peer) <= _SHOWN else peer[:_SHOWN - 1] + "…"
        return short if not where or where == peer else f"{where} ({short})"

    def name(self, peer: str, instance: str, principal: str | None = None) -> None:
        """Remember ``peer``'s instance — what its hello claims — for later lines (bounded), and its
        CURVE principal when the connection proved one that differs: an operator must see who
        holds the key, not only the name it gave."""
        if len(self._names) > 4096:
            self._names.clear()
        proven = f" (principal {principal})" if principal and principal != instance else ""
        self._names[peer] = f"{self._place(peer)} instance {instance}{proven}"

    def forget(self, peer: str) -> None:
        self._names.pop(peer, None)
