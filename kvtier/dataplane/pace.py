"""How much of a transfer a producer commits to a peer's link at once (decision T23).

Bytes handed to the link — zmq frames queued in libzmq, NIXL WRITEs posted — cannot be called
back: a cancelled transfer's committed bytes still cross the link, and on zmq every later message
to that peer (another load's blocks, the abort's answer) queues behind them.  So a transfer
commits no more than the link drains in :attr:`Pace.horizon_s`: a per-peer rate, measured from
the releases (posted bytes and when the link let go of them), sets the window, never
above the plane's fixed largest one (its module's ``WINDOW_BYTES``, read at each call).  Until
bytes to a peer were released its rate is unknown and a transfer has one batch in flight at a
time (a slow start: on a fast link the first released batch comes within milliseconds and the
window opens to its largest).

Pure bookkeeping: times are passed in (seconds, one monotonic clock).
"""

from __future__ import annotations

__all__ = ["MIN_SAMPLE_S", "Pace"]

#: A rate sample spans at least this long (seconds): several releases one pass sees come together.
MIN_SAMPLE_S = 0.001


class Pace:
    """Per-peer drain rates and the windows they allow.

    A peer's rate is an average (each new sample weighs half) of samples, each the bytes released
    over at least :data:`MIN_SAMPLE_S` while something was in flight to it — idle time between
    transfers is not counted, and after a stall (a stopped consumer) the rate comes back within a
    few samples.

    Args:
        horizon_s: what a transfer may commit, in seconds of its peer's measured rate.
    """

    __slots__ = ("_busy", "_rate", "horizon_s")

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self._busy: dict[str, list[float]] = {}  # peer -> [bytes in flight, sample start (s), bytes released since]
        self._rate: dict[str, float] = {}  # peer -> bytes per second, as its releases showed it

    def posted(self, peer: str, nbytes: int, now: float) -> None:
        """``nbytes`` were handed to ``peer``'s link at ``now``."""
        b = self._busy.get(peer)
        if b is None:  # in flight from now: the next sample starts here
            self._busy[peer] = [nbytes, now, 0.0]
        else:
            b[0] += nbytes

    def released(self, peer: str, nbytes: int, now: float) -> None:
        """The link let go of ``nbytes`` of what was posted to ``peer`` (seen at ``now``)."""
        b = self._busy.get(peer)
        if b is None:  # nothing of ours in flight (a session forgotten meanwhile)
            return
        b[0] -= nbytes
        b[2] += nbytes
        if now - b[1] >= MIN_SAMPLE_S or b[0] <= 0 < now - b[1]:
            sample = b[2] / (now - b[1])
            old = self._rate.get(peer)
            self._rate[peer] = sample if old is None else (old + sample) / 2
            b[1], b[2] = now, 0.0
        if b[0] <= 0:
            del self._busy[peer]

    def window(self, peer: str, largest: int) -> int:
        """Bytes a transfer to ``peer`` may have in flight, at most ``largest``; 0 while its rate
        is unknown (the caller still posts one batch when it has none in flight)."""
        rate = self._rate.get(peer)
        if rate is None:
            return 0
        return min(largest, int(rate * self.horizon_s))

    def rate(self, peer: str) -> float | None:
        """The measured rate to ``peer`` (bytes per second), None before bytes to it were released."""
        return self._rate.get(peer)

    def forget(self, peer: str) -> None:
        """``peer``'s session ended: a later one measures afresh (it may take another path)."""
        self._busy.pop(peer, None)
        self._rate.pop(peer, None)
