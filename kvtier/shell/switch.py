"""The interpreter's thread switch interval while a manager runs (config ``gil_switch_interval_s``,
decision C28).

A manager's I/O loop and digest pool are threads of the engine's process and share its interpreter
lock.  Each of their blocking calls — a wait in the loop's poll, one block's digest — takes the lock
back when it returns, and while the engine's thread runs Python that takes up to the switch
interval (``sys.getswitchinterval()``, 5 ms by default).  A manager configured with an interval sets
it while it runs; the setting is the process's, so managers of one process share it: the shortest
interval any live manager asked for holds, and when the last one closes the interval goes back to
what it was before the first.
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["claim", "release"]

log = logging.getLogger("kvtier.manager")

_lock = threading.Lock()
_held: dict[int, float] = {}  # claim token -> interval asked for (seconds)
_tokens = iter(range(1, 1 << 62))
_before: float | None = None  # the interval before the first live claim


def claim(interval_s: float | None) -> int | None:
    """Hold the switch interval at ``interval_s`` seconds (or shorter, if another claim asks for
    less) until :func:`release` of the returned token; ``None`` asks for nothing (returns ``None``)."""
    global _before
    if interval_s is None:
        return None
    with _lock:
        if not _held:
            _before = sys.getswitchinterval()
        token = next(_tokens)
        _held[token] = interval_s
        _apply()
    return token


def release(token: int | None) -> None:
    """Drop a claim (``None`` and a token already released: nothing)."""
    global _before
    with _lock:
        if token is None or _held.pop(token, None) is None:
            return
        if _held:
            _apply()
        elif _before is not None:
            sys.setswitchinterval(_before)
            _before = None


def _apply() -> None:
    want = min(_held.values())
    if sys.getswitchinterval() != want:
        log.info("kvtier: the interpreter's thread switch interval is %.2g ms while this manager runs "
                 "(gil_switch_interval_s; process-wide, was %.2g ms)", want * 1e3, sys.getswitchinterval() * 1e3)
        sys.setswitchinterval(want)
