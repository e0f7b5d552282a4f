"""A virtual clock for deterministic tests of the sans-I/O core.

The lifecycle core never reads a clock: every entry point takes ``now``.  Tests keep one
:class:`VirtualClock` and pass ``clock.now()``; time moves only when the test says so.  Moving time
does **not** fire deadlines: a test (or the shell under test) fires them separately
(``core.fire(clock.now())``, or a tick through :func:`kvtier.lifecycle.driver.drive`), so the
window between "a deadline passed" and "the deadline was handled" stays explorable.
"""

from __future__ import annotations

import math

__all__ = ["VirtualClock"]


class VirtualClock:
    """Seconds as a float, starting at ``start``. Time never goes backwards.

    Args:
        start: the initial reading (default 0.0).

    Raises:
        ValueError: ``start`` is not a finite number.
    """

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = _finite("start", start)

    def now(self) -> float:
        """The current reading."""
        return self._now

    def advance(self, dt: float) -> float:
        """Move forward by ``dt`` seconds and return the new reading.

        Raises:
            ValueError: ``dt`` is negative or not finite (time can't go backwards); the clock is
                left unchanged.
        """
        dt = _finite("dt", dt)
        if dt < 0:
            raise ValueError(f"time can't go backwards: advance({dt!r})")
        self._now += dt
        return self._now

    def set(self, t: float) -> float:
        """Jump to the absolute reading ``t`` (not earlier than now) and return it.

        Raises:
            ValueError: ``t`` is earlier than the current reading or not finite.
        """
        t = _finite("t", t)
        if t < self._now:
            raise ValueError(f"time can't go backwards: set({t!r}) at {self._now!r}")
        self._now = t
        return self._now

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now!r})"


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return f
