"""One global state of the composed system, and the working copy a step edits.

A global state is a flat :class:`State` tuple (cheap to hash and compare): the interned snapshot
ids of the cores, then the environment's part, field by field.  Each field has one owner, the
module that changes it:

==================  ===================================================================
field               owner
==================  ===================================================================
``p``, ``c``        the cores (:mod:`.encoding`), changed only by a core step
``chans``           :mod:`.network` (channels)
``transfers``       :mod:`.transport` (the data plane)
``stores`` ...      :mod:`.engines` (``stores``, ``p_finished``, ``loads``, ``outstanding``,
                    ``drained``, ``shut``)
``retired``         :mod:`.properties` (history of ``tombstoned_never_reparks``)
``faults``          :mod:`.network` (fault budgets)
``crashes``         :mod:`.network` (crash budget; a session's liveness deadline spends it too)
==================  ===================================================================

A new kind of environment state is a new field here (keep the tuple flat) plus, when the field has
a per-id part, a slice in its owner's ``project`` (partial-order reduction compares projections:
a field missing from them makes the reduction unsound).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Draft", "State", "put"]


class State(NamedTuple):
    """One global state (a plain tuple: cheap to hash)."""

    p: int
    """the producer's core snapshot id"""
    c: tuple[int, ...]
    """each consumer's core snapshot id"""
    chans: tuple[tuple[int, ...], ...]
    """message ids; index 2*c: producer -> consumer c; 2*c+1: consumer c -> producer"""
    transfers: tuple[tuple[int, str, int, bool], ...]
    """transfers in progress, sorted (:class:`.transport.Transfer`)"""
    stores: tuple[int, ...]
    """per id: chunks the prefill engine has stored"""
    p_finished: tuple[bool, ...]
    """per id: the prefill engine finished the request"""
    loads: tuple[tuple[int, ...], ...]
    """per consumer, per id: 0 not loaded, 1 load submitted, 2 request finished"""
    outstanding: frozenset[int]
    """jobs submitted that have no result yet"""
    retired: tuple[bool, ...]
    """per id: the id ended and was not pruned since"""
    faults: tuple[int, ...]
    """fault budgets left (per consumer connection, or one in total)"""
    crashes: int
    """session deaths left"""
    drained: bool
    shut: bool


def put(t: tuple, i: int, v: Any) -> tuple:
    """``t`` with item ``i`` replaced by ``v``."""
    return t[:i] + (v,) + t[i + 1 :]


class Draft:
    """A working copy of a :class:`State`: fields are replaced, channels copied on first write."""

    __slots__ = (
        "_copied", "c", "chans", "crashes", "drained", "faults", "loads", "outstanding", "p", "p_finished", "retired",
        "shut", "stores", "transfers",
    )

    def __init__(self, g: State) -> None:
        (
            self.p, self.c, chans, self.transfers, self.stores, self.p_finished, self.loads, self.outstanding,
            self.retired, self.faults, self.crashes, self.drained, self.shut,
        ) = g
        self.chans: list = list(chans)
        self._copied: set[int] = set()

    def chan(self, ch: int) -> list[int]:
        """Channel ``ch`` as a list this draft may edit."""
        if ch not in self._copied:
            self.chans[ch] = list(self.chans[ch])
            self._copied.add(ch)
        return self.chans[ch]

    def freeze(self) -> State:
        chans = self.chans
        for i in self._copied:
            chans[i] = tuple(chans[i])
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (this runs once per transition)
        return tuple.__new__(State, (
            self.p, self.c, tuple(chans), self.transfers, self.stores, self.p_finished, self.loads, self.outstanding,
            self.retired, self.faults, self.crashes, self.drained, self.shut,
        ))
