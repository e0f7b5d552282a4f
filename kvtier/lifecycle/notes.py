"""Notes: what one machine tells another, queued for the core to route.

A machine never calls another machine (or the core) from inside a transition: its effect builder
appends a note to the core's :class:`Notes` queue, and :class:`~kvtier.lifecycle.TierCore` routes
every note, oldest first, once the transition that made it has finished (one table in the core
maps each note type to the machine input it becomes).  Notes never leave the core.
"""

from __future__ import annotations

from collections import deque

import msgspec

from kvtier.lifecycle._table import Reason

__all__ = ["GiveUp", "Note", "Notes", "PeerLost", "SessionReady"]


class GiveUp(msgspec.Struct, frozen=True, gc=False):
    """A record bound to ``peer`` gave up on it (``reason``): end the session."""

    peer: str
    reason: Reason


class PeerLost(msgspec.Struct, frozen=True, gc=False):
    """The session with ``peer`` ended with ``reason``: tell every record bound to it."""

    peer: str
    reason: Reason


class SessionReady(msgspec.Struct, frozen=True, gc=False):
    """The session with ``peer`` is ready: loads queued behind its handshake may fetch."""

    peer: str


Note = GiveUp | PeerLost | SessionReady
Notes = deque
"""The queue type: a ``deque`` of :data:`Note` records."""
