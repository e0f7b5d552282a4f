"""What each slot of a load holds: a typed state per fetch position, never a truth value.

A load's fetch names its keys in order; each position's slot goes through::

    EMPTY ──land_blocks──► UNCHECKED ──blocks_landed(ok)──────► VERIFIED
                                      └─blocks_landed(corrupt)─► FAILED

``UNCHECKED`` means a landing was started (zmq: a copy into the slot may be running on the digest
pool; one-sided planes: the peer wrote the slot, its check may be running) and its answer has not
come.  Only ``VERIFIED`` bytes are the parked bytes.  The states are an :class:`enum.Enum` whose
members refuse ``bool()``: ``if states[i]:`` raises ``TypeError`` instead of reading a landing that
was never checked — or one that failed its check — as good (decision I21).  What a failed load may
report as ``successful_keys`` is :meth:`BlockStates.prefix`: the leading run of verified
positions, because vLLM keeps a prefix of a request's blocks and recomputes from the first hole.

The states live in one ``bytearray`` (one byte per position: a load of 2,000 blocks costs 2 KB);
:meth:`BlockStates.raw` and :meth:`BlockStates.from_raw` give the model checker's export those bytes.
"""

from __future__ import annotations

import enum

__all__ = ["BlockState", "BlockStates"]


class BlockState(enum.Enum):
    """What one slot of a load holds (see the module docstring)."""

    EMPTY = 0
    """Nothing was landed in it by this load."""
    UNCHECKED = 1
    """A landing started; its check has not answered (the slot may still be being written)."""
    VERIFIED = 2
    """Landed and matched the digest taken when the block was parked."""
    FAILED = 3
    """Landed and did not match its digest (or its landing could not be done)."""

    def __bool__(self) -> bool:
        raise TypeError("a BlockState is not a truth value: compare it with BlockState.VERIFIED (decision I21)")


_STATES = tuple(BlockState)
_EMPTY, _UNCHECKED, _VERIFIED, _FAILED = (s.value for s in _STATES)


class BlockStates:
    """The :class:`BlockState` of every position of one load's fetch, with the counts the
    consumer's guards read in O(1): ``verified`` and ``unchecked``."""

    __slots__ = ("_b", "verified", "unchecked")

    def __init__(self, n: int = 0) -> None:
        self._b = bytearray(n)
        self.verified = 0
        self.unchecked = 0

    @classmethod
    def from_raw(cls, raw: bytes) -> BlockStates:
        """The states :meth:`raw` gave (the model checker's export).

        Raises:
            ValueError: a byte that is not a state."""
        s = cls()
        s._b = bytearray(raw)
        for v in s._b:
            if v > _FAILED:
                raise ValueError(f"{v} is not a block state")
        s.verified = s._b.count(_VERIFIED)
        s.unchecked = s._b.count(_UNCHECKED)
        return s

    def raw(self) -> bytes:
        """One byte per position, the state's value."""
        return bytes(self._b)

    def __len__(self) -> int:
        return len(self._b)

    def __getitem__(self, i: int) -> BlockState:
        return _STATES[self._b[i]]

    def __bool__(self) -> bool:
        raise TypeError("BlockStates is not a truth value: ask prefix(), verified or unchecked")

    def __repr__(self) -> str:
        return f"BlockStates({''.join('.uvx'[v] for v in self._b)})"

    def untouched(self, first: int, count: int) -> bool:
        """Whether no landing was started for positions ``first..first+count-1``."""
        return not any(self._b[first : first + count])

    def start(self, first: int, count: int) -> None:
        """A landing of positions ``first..first+count-1`` started (they must be untouched)."""
        self._b[first : first + count] = bytes((_UNCHECKED,)) * count
        self.unchecked += count

    def settle(self, first: int, count: int, ok: bool) -> None:
        """The landing of positions ``first..first+count-1`` answered: every block matched its
        digest (``ok``), or at least one did not (the whole batch is then ``FAILED``: its answer
        names no block).  Positions that were not ``UNCHECKED`` are left alone (a stale answer)."""
        to = _VERIFIED if ok else _FAILED
        b = self._b
        for i in range(first, min(first + count, len(b))):
            if b[i] == _UNCHECKED:
                b[i] = to
                self.unchecked -= 1
                if ok:
                    self.verified += 1

    def prefix(self) -> int:
        """How many positions from the first are ``VERIFIED`` (a failed load's successful keys
        are exactly that many keys of its fetch)."""
        if self.verified == len(self._b):
            return self.verified
        n = 0
        for v in self._b:
            if v != _VERIFIED:
                break
            n += 1
        return n
