"""What every property checker shares: the violation it raises and how it names where it broke."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.modelcheck.trace import PRODUCER

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep
    from tools.modelcheck.system import System

__all__ = ["Fail", "lane_of", "read", "who"]


class Fail(Exception):
    """A property is violated (raised by a hook; the search reports it with a counterexample)."""

    def __init__(self, prop: str, message: str, lane: str | None = None) -> None:
        super().__init__(message)
        self.prop = prop
        self.message = message
        self.lane = lane
        """the trace lane (:mod:`.trace`) where it broke, for the structured trace"""


def who(system: System, c: int | None) -> str:
    """The core a step belongs to, for a message: the producer, or the consumer's name."""
    return "the producer" if c is None else system.cnames[c]


def lane_of(system: System, c: int | None) -> str:
    """The trace lane of the core a step belongs to."""
    return PRODUCER if c is None else system.lanes[c]


def read(system: System, step: CoreStep) -> tuple:
    """The messages a core step reads: the one it delivers, or those a tick read before its
    deadlines (a ``fire`` input names them last)."""
    inp = step.inp
    msgs = system.cores.msgs
    if inp[0] == "deliver":
        return (msgs[inp[1]],)
    if inp[0] == "fire":
        return tuple(msgs[m] for m in inp[-1])
    return ()


NO_REC = ("absent", (), None, -1)
"""A producer id's summary when it has no record: (state, jobs, bound peer, round)."""
