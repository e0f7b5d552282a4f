"""Serving a peer's probes from the engine's own blocks: the :class:`BlockSource` seam.

On the symmetric path (``remote_kv_source``, docs/integrations/vllm.md) a peer asks which of some
blocks this engine holds.  The manager never reaches into an engine: at a *serve window* — a call
the engine makes when its blocks may be pinned safely (between steps, under whatever lock guards
its cache) — it asks a :class:`BlockSource`:

* :meth:`BlockSource.open` a lookup context for one peer round (may return ``None``);
* :meth:`BlockSource.lookup` each key: :attr:`Presence.FOUND`, :attr:`Presence.PENDING` (on its way
  into memory: asked again at later windows, up to ``serve_lookup_timeout_s``) or
  :attr:`Presence.MISSING`;
* :meth:`BlockSource.pin` the found keys of one lookup at once: the engine must keep those blocks
  unchanged, at the pool blocks it names, until :meth:`BlockSource.release` of that pin;
* :meth:`BlockSource.close` the context (in the same or a later window).

``release`` is called exactly once per pin (``ok`` False with a reason code when the round did not
end well), possibly outside a serve window and from the manager's poll thread: it must not block
and must not call back into the manager.  Everything else is called only inside
:meth:`kvtier.manager.KvTierManager.serve_external_requests`.

Two implementations: the vLLM adapter wraps vLLM's ``ParentManager`` (a pin is a store job of
vLLM's tiering manager, released by that job's result); :class:`BlockIndex` is a ready-made source
for engines whose KV lives in kvtier's own :class:`~kvtier.memory.BlockPool` (the demo's).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = ["BlockIndex", "BlockSource", "Pin", "Presence", "check_source"]


class Presence(enum.Enum):
    """Whether the engine holds a block (the answer of :meth:`BlockSource.lookup`)."""

    FOUND = "found"
    PENDING = "pending"
    MISSING = "missing"


@attrs.frozen(slots=True)
class Pin:
    """An engine pin: ``blocks[i]`` (pool block numbers) holds the i-th pinned key, unchanged until
    the pin's release.  ``pin_id`` (not None, hashable) must be unique among the manager's
    outstanding pins; ``blocks`` has one integer per pinned key (numpy integers are taken as
    ints), each in ``0 .. num_blocks - 1`` of the pool and each once.  A pin that breaks either is
    released at once by its own id (``ok`` False, ``job_refused``; except an id still outstanding
    from the same source, which cannot be told apart from the first and is left to it), its keys
    answer the peer MISS and the log names what was wrong (decision Y21)."""

    pin_id: int
    blocks: tuple[int, ...]


@runtime_checkable
class BlockSource(Protocol):
    """What a serve window asks of the engine (see the module docstring)."""

    def open(self, ctx_id: str) -> Any:
        """A lookup context for one peer round (``ctx_id`` is unique per context)."""
        ...

    def lookup(self, key: bytes, ctx: Any) -> Presence:
        """Whether the engine holds ``key``'s block."""
        ...

    def pin(self, keys: Sequence[bytes], ctx: Any) -> Pin:
        """Pin the blocks of ``keys`` (each just answered FOUND in this window)."""
        ...

    def release(self, pin_id: int, ok: bool, reason: str | None) -> None:
        """Release pin ``pin_id`` (exactly once; may run outside a window; must not block)."""
        ...

    def close(self, ctx: Any) -> None:
        """Close a context :meth:`open` returned (once)."""
        ...


_CHECKED: set[type] = set()


def check_source(source: Any) -> None:
    """Raise unless ``source`` implements :class:`BlockSource`.  A class that passed once is not
    checked again: vLLM hands its source in every millisecond (each tier poll), and a
    runtime-checkable protocol's ``isinstance`` walks every method each time (~5 µs warm, more on
    a cold thread).

    Raises:
        TypeError: ``source`` lacks one of :class:`BlockSource`'s methods.
    """
    kind = type(source)
    if kind in _CHECKED:
        return
    if not isinstance(source, BlockSource):
        raise TypeError(f"source must implement kvtier.blocksource.BlockSource, got {kind.__name__}")
    _CHECKED.add(kind)


class BlockIndex:
    """A :class:`BlockSource` for blocks in kvtier's own pool: the engine :meth:`publish`\\ es each
    cached block's key and pool block, :meth:`retract`\\ s it before reusing the block, and must
    not overwrite a block while :meth:`pinned` says so.

    Not thread-safe on its own: call it under the manager's lock (``KvTierManager.lock``), which
    every manager method (and so every serve window and release) holds.

    Args:
        num_blocks: the pool's size (blocks are checked against it).
    """

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._where: dict[bytes, int] = {}
        self._refs: dict[int, int] = {}  # pool block -> pins holding it
        self._pins: dict[int, tuple[int, ...]] = {}
        self._next_pin = 1
        self.released: dict[int, bool] = {}
        """pin id -> ok, for every pin released (bounded: the last 4096)."""

    # -- the engine's side -----------------------------------------------------------------------
    def publish(self, key: bytes, block: int) -> None:
        """``block`` holds ``key``'s bytes from now on (until :meth:`retract`).

        Raises:
            ValueError: ``key`` is not 1..256 bytes or ``block`` is outside the pool.
        """
        if not isinstance(key, bytes) or not 0 < len(key) <= 256:
            raise ValueError(f"key must be 1..256 bytes, got {key!r:.40}")
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block!r} is outside the pool (0..{self.num_blocks - 1})")
        self._where[key] = block

    def retract(self, key: bytes) -> None:
        """Forget ``key`` (its block is about to be reused); unknown keys are ignored.  A pin taken
        before keeps the block until its release: check :meth:`pinned` before reusing it."""
        self._where.pop(key, None)

    def pinned(self, block: int) -> bool:
        """True while a peer's round pins ``block``: the engine must not overwrite it."""
        return self._refs.get(block, 0) > 0

    def pins_outstanding(self) -> int:
        return len(self._pins)

    def __contains__(self, key: bytes) -> bool:
        return key in self._where

    # -- BlockSource -----------------------------------------------------------------------------
    def open(self, ctx_id: str) -> None:
        return None

    def lookup(self, key: bytes, ctx: Any) -> Presence:
        return Presence.FOUND if key in self._where else Presence.MISSING

    def pin(self, keys: Sequence[bytes], ctx: Any) -> Pin:
        blocks = tuple(self._where[k] for k in keys)
        pin_id = self._next_pin
        self._next_pin += 1
        for b in blocks:
            self._refs[b] = self._refs.get(b, 0) + 1
        self._pins[pin_id] = blocks
        return Pin(pin_id, blocks)

    def release(self, pin_id: int, ok: bool, reason: str | None) -> None:
        blocks = self._pins.pop(pin_id, None)
        if blocks is None:
            raise KeyError(f"pin {pin_id} is not outstanding (released twice?)")
        for b in blocks:
            left = self._refs[b] - 1
            if left:
                self._refs[b] = left
            else:
                del self._refs[b]
        if len(self.released) >= 4096:
            self.released.pop(next(iter(self.released)))
        self.released[pin_id] = ok

    def close(self, ctx: Any) -> None:
        return None
