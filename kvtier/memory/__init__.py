"""Host memory for KV blocks: :class:`BlockPool` (torch only, no zmq)."""

from kvtier.memory.pool import BlockPool, PoolExhausted

__all__ = ["BlockPool", "PoolExhausted"]
