"""kvtier's exception root.

Every exception class kvtier defines derives from :class:`KvTierError`, so callers can catch
"anything kvtier decided to refuse" in one clause; those that refuse a value also derive from
``ValueError`` (``TierConfigError``, ``UnknownRequest``, ``DuplicateJob``, ``PeerNotAllowed``).
Module-specific errors live next to the code that raises them (``kvtier.memory.PoolExhausted``,
``kvtier.wire.WireError``, ``kvtier.transport.TransportError``).  An API call's wrong argument
type or value is a plain ``TypeError`` / ``ValueError`` naming it, and a call after ``shutdown``
a ``RuntimeError`` (each method's docstring lists them); anything else raised is a bug.
"""

from __future__ import annotations

__all__ = ["KvTierError"]


class KvTierError(Exception):
    """Base class of every error kvtier raises deliberately."""
