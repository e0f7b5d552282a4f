"""Notes: what one machine tells another, queued for the core to route.

A machine never calls another machine (or the core) from inside a transition: its effect builder
appends a note to the core's :class:`Notes` queue, and :class:`~kvtier.lifecycle.TierCore` routes
every note, oldest first, once the transition that made it has finished (one table in the core
maps each note type to the machine input it becomes).  Notes never leave the core.  A machine
that needs a session opened notes the engine's own :class:`~kvtier.lifecycle.inputs.Dial`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec

from kvtier.lifecycle._table import Reason

__all__ = ["GiveUp", "LoadRound", "Note", "Notes", "PeerLost", "RoundLoadEnded", "SessionReady"]


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


class LoadRound(msgspec.Struct, frozen=True, gc=False):
    """A probe hands the engine's load ``job`` (a :class:`~kvtier.lifecycle.inputs.LoadSubmitted`)
    of round ``round`` of ``kv_request_id`` to a consumer life of its own, on ``peer``."""

    kv_request_id: str
    round: int
    peer: str
    job: Any


class RoundLoadEnded(msgspec.Struct, frozen=True, gc=False):
    """The load of round ``round`` of symmetric request ``kv_request_id`` reported its job:
    ``keys`` it fetched, ``landed`` those that landed intact (all of them when ``ok``)."""

    kv_request_id: str
    round: int
    ok: bool
    keys: tuple[bytes, ...]
    landed: tuple[bytes, ...]


Note = GiveUp | PeerLost | SessionReady | LoadRound | RoundLoadEnded
Notes = deque
"""The queue type: a ``deque`` of :data:`Note` records."""
