"""kvtier's exception root.

Every exception kvtier raises on purpose derives from :class:`KvTierError`, so callers can catch
"anything kvtier decided to refuse" in one clause. Module-specific errors live next to the code
that raises them (``kvtier.memory.PoolExhausted``, ``kvtier.wire.WireError``,
``kvtier.transport.TransportError``) and subclass this one. Anything else raised is a bug.
"""

from __future__ import annotations

__all__ = ["KvTierError"]


class KvTierError(Exception):
    """Base class of every error kvtier raises deliberately."""
