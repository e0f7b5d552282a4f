"""Typed errors of the lifecycle core.

Two families, as in h11: :class:`InvalidTransition` means *our caller* broke the contract (an
engine API misuse or a bug in the shell) and is raised; a misbehaving *peer* never raises here —
its inputs are ignored or answered according to the spec's ignore rules and reason codes.
"""

from __future__ import annotations

from kvtier.errors import KvTierError


class LifecycleError(KvTierError):
    """Base class of lifecycle-core errors."""


class InvalidTransition(LifecycleError):
    """An input the spec declares ``reject`` for the record's current state.

    The record is left unchanged. ``machine``, ``state``, ``event``, ``key`` and ``reason`` (a
    spec reason code) say exactly what was refused.
    """

    def __init__(self, machine: str, key: str, state: str, event: str, reason: str) -> None:
        super().__init__(
            f"{machine} {key!r}: input {event!r} is not allowed in state {state!r} ({reason})"
        )
        self.machine = machine
        self.key = key
        self.state = state
        self.event = event
        self.reason = reason
