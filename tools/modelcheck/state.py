"""One global state of the composed system, and the working copy a step edits.

A global state is a flat :class:`State` tuple (cheap to hash and compare): the interned snapshot
ids of the cores, then the environment's part, field by field.  Each field has one owner, the
module that changes it:

==================  ===================================================================
field               owner
==================  ===================================================================
``p``, ``c``        the cores (:mod:`.encoding`), changed only by a core step
``chans``           :mod:`.network` (channels; ``arrived``: whether each channel's oldest message
``arrived``         waits in the receiver's socket, unread)
``transfers``       :mod:`.transport` (the data plane's references; ``revokes``: revocations a
``revokes``         one-sided plane has not confirmed yet; ``attaches``: descriptors a plane has
``attaches``        not taken or refused yet)
``stores`` ...      :mod:`.engines` (``stores``, ``p_finished``, ``lives``, ``loads``,
                    ``outstanding``, ``drained``, ``shut``)
``retired``         :mod:`.properties` (history of ``tombstoned_never_reparks``)
``receipted``       :mod:`.properties` (history of ``no_success_without_receipt``)
``corrupted``       :mod:`.network` (the rounds whose blocks it made land corrupt)
``faults``          :mod:`.network` (fault budgets: loss, duplication, a corrupt landing)
``crashes``         :mod:`.network` (crash budget; a silent session's heartbeat spends it too)
``pins`` ...        :mod:`.symmetric` (``pins``: engine pins the producer's serve window gave
                    out and that were not released; ``lookups``: ``LookUpBlocks`` queued for its
                    next window; ``sym``: the consumer engine's symmetric request and the next pin id)
==================  ===================================================================

A new kind of environment state is a new field here (keep the tuple flat) plus, when the field has
a per-id part, a slice in its owner's ``project`` (partial-order reduction compares projections:
a field missing from them makes the reduction unsound).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["FIELDS", "Draft", "State", "put"]


class State(NamedTuple):
    """One global state (a plain tuple: cheap to hash)."""

    p: int
    """the producer's core snapshot id"""
    c: tuple[int, ...]
    """each consumer's core snapshot id"""
    chans: tuple[tuple[int, ...], ...]
    """message ids, oldest first; index 2*c: producer -> consumer c; 2*c+1: consumer c -> producer"""
    arrived: tuple[int, ...]
    """per channel: 1 when its oldest message arrived in the receiver's socket and waits unread"""
    transfers: tuple[tuple, ...]
    """transfers whose blocks the data plane references, sorted (:class:`.transport.Transfer`)"""
    revokes: tuple[int, ...]
    """consumers whose one-sided plane has not confirmed the producer's access revoked yet, sorted"""
    attaches: tuple[tuple[int, str, int], ...]
    """(manager, peer, generation) of every descriptor a data plane has not taken or refused yet,
    sorted (manager 0 the producer, 1+c consumer c)"""
    stores: tuple[int, ...]
    """per id: chunks the prefill engine has stored in the id's current life"""
    p_finished: tuple[bool, ...]
    """per id: the prefill engine finished the current life's request"""
    lives: tuple[int, ...]
    """per id: the current life (0: the first; the prefill engine stores a pruned id again)"""
    loads: tuple[tuple[int, ...], ...]
    """per consumer, per id: 0 never loaded; 2k-1 the k-th load submitted; 2k its request finished"""
    outstanding: frozenset[int]
    """jobs submitted that have no result yet"""
    retired: tuple[bool, ...]
    """per id: the id ended and was not pruned since"""
    receipted: tuple[bool, ...]
    """per id: the current life's binding received its consumer's receipt"""
    corrupted: frozenset[tuple[int, int, int]]
    """(consumer, id, round) of every round a block of which landed corrupt"""
    faults: tuple[int, ...]
    """fault budgets left (per consumer connection, or one in total)"""
    crashes: int
    """session deaths left"""
    drained: bool
    shut: tuple[int, ...]
    """per manager (0 the producer, 1+c consumer c): 0 running, 1 shutting down, 2 closed"""
    pins: tuple[tuple[int, str, int, tuple[int, ...]], ...] = ()
    """(pin, kv_request_id, round, pool blocks) of every engine pin the producer's serve window
    gave out and nobody released yet, sorted (the symmetric path)"""
    lookups: tuple[tuple[str, str, int, tuple[bytes, ...]], ...] = ()
    """(peer, kv_request_id, round, keys) of every ``LookUpBlocks`` queued for the producer's next
    serve window, oldest first"""
    sym: tuple[int, int, int] = (0, 0, 1)
    """the consumer engine's symmetric request: (0 not announced, 1 live, 2 finished; loads
    submitted; the next pin id the producer's engine gives out)"""


FIELDS = State._fields


def put(t: tuple, i: int, v: Any) -> tuple:
    """``t`` with item ``i`` replaced by ``v``."""
    return t[:i] + (v,) + t[i + 1 :]


class Draft:
    """A working copy of a :class:`State`: fields are replaced, channels copied on first write."""

    __slots__ = ("_copied", *FIELDS)

    def __init__(self, g: State) -> None:
        # unpacked by hand: this runs once per transition
        (
            self.p, self.c, self.chans, self.arrived, self.transfers, self.revokes, self.attaches, self.stores,
            self.p_finished,
            self.lives, self.loads, self.outstanding, self.retired, self.receipted, self.corrupted, self.faults,
            self.crashes, self.drained, self.shut, self.pins, self.lookups, self.sym,
        ) = g
        self._copied: set[int] | None = None
        """the channels copied to edit; None: none, and ``chans`` is still the state's tuple"""

    def chan(self, ch: int) -> list[int]:
        """Channel ``ch`` as a list this draft may edit."""
        copied = self._copied
        if copied is None:
            self.chans = list(self.chans)
            copied = self._copied = set()
        if ch not in copied:
            self.chans[ch] = list(self.chans[ch])
            copied.add(ch)
        return self.chans[ch]

    def freeze(self) -> State:
        chans = self.chans
        if self._copied is not None:
            for i in self._copied:
                chans[i] = tuple(chans[i])
            chans = tuple(chans)
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (this runs once per transition)
        return tuple.__new__(State, (
            self.p, self.c, chans, self.arrived, self.transfers, self.revokes, self.attaches, self.stores,
            self.p_finished,
            self.lives, self.loads, self.outstanding, self.retired, self.receipted, self.corrupted, self.faults,
            self.crashes, self.drained, self.shut, self.pins, self.lookups, self.sym,
        ))
