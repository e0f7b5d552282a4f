"""The interpreter's thread switch interval while a manager runs (config ``gil_switch_interval_s``,
decision C28).

A manager's I/O loop and digest pool are threads of the engine's process and share its interpreter
lock.  Each of their blocking calls — a wait in the loop's poll, one block's digest — takes the lock
back when it returns, and while the engine's thread runs Python that takes up to the switch
interval (``sys.getswitchinterval()``, 5 ms by default).  A manager configured with an interval sets
it while it runs; the setting is the process's, so managers of one process share it: the shortest
interval any live manager asked for holds (never longer than the process's own), and when the last
one closes the interval goes back to what it was before the first — unless the process set another
meanwhile, which stays.  A manager garbage-collected without a shutdown lets go of its claim then.
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
_applied: float | None = None  # what kvtier last set


def claim(interval_s: float | None) -> int | None:
    """Hold the switch interval at ``interval_s`` seconds (or shorter: another claim's, or the
    process's own when it was shorter already — a claim never lengthens it) until
    :func:`release` of the returned token; ``None`` asks for nothing (returns ``None``)."""
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
    """Drop a claim (``None`` and a token already released: nothing).  The last one puts back the
    interval from before the first claim — unless the process set another meanwhile, which stays."""
    global _before, _applied
    with _lock:
        if token is None or _held.pop(token, None) is None:
            return
        if _held:
            _apply()
        elif _before is not None:
            if sys.getswitchinterval() == _applied:
                _set(_before)
            _before = _applied = None


def _apply() -> None:
    global _before, _applied
    current = sys.getswitchinterval()
    if _applied is not None and current != _applied:
        _before = current  # the process set its own meanwhile: that is what the last release keeps
    want = min(min(_held.values()), _before if _before is not None else current)
    if abs(current - want) >= 1e-7:
        log.info("kvtier: the interpreter's thread switch interval is %.2g ms while this manager runs "
                 "(gil_switch_interval_s; process-wide, was %.2g ms)", want * 1e3, current * 1e3)
        _set(want)
    _applied = sys.getswitchinterval()  # as the interpreter keeps it (whole microseconds)


def _set(interval_s: float) -> None:
    # the interpreter truncates to whole microseconds: a value read back (0.0002 reads
    # 0.00019999999999999998) would lose one each time it is set again
    sys.setswitchinterval(round(interval_s * 1e6) / 1e6 + 1e-12)
