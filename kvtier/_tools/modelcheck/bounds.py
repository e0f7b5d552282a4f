"""The size of the explored system: how many ids, consumers, faults, crashes... (``kvtier check`` options)."""

from __future__ import annotations

import attrs

__all__ = ["Bounds"]


@attrs.frozen(kw_only=True)
class Bounds:
    """The size of the explored system."""

    ids: int = 2
    """kv_request_ids the producer stores."""
    consumers: int = 2
    """consumer peers (each its own TierCore)."""
    depth: int = 40
    """BFS depth bound (the default state space is exhausted well before it: deepest path ~27)."""
    faults: int = 1
    """lost or duplicated messages (per consumer connection, or in total: see fault_scope)."""
    fault_scope: str = "per_peer"
    """"per_peer": each consumer's connection may suffer ``faults`` faults; "total": all together."""
    chunks: int = 1
    """stores (one key each) per id; the fetch names every key."""
    loads_per_id: int = 1
    """how many consumers may load the same id (2 exercises duplicate_fetch)."""
    crashes: int = 0
    """session deaths (two-sided disconnect, or one side's liveness timer)."""
    tombstone_max: int = 2
    """the producer's retained-id cap (below ``ids`` the count bound evicts; that couples the ids and
    defeats most of the partial-order reduction, so keep the depth small then)."""
    max_pending: int = 1
    """max_pending_fetches_per_peer (1: too_many_pending is exercised)."""
    park_clock: str = "last_store"
    transfer_failures: bool = True
    """the transport may fail a transfer."""
    reduce: bool = True
    """partial-order reduction (persistent sets over ids; needs routing="fixed", ids == consumers)."""
    routing: str = "fixed"
    """"any": every consumer may load every id; "fixed": id i goes to consumer i % consumers."""
    abandon: bool = True
    """the producer's request may finish before all its chunks are stored (request_finished early)."""
    prune_timers: bool = True
    """let the prune deadline of done/tombstoned ids fire (a later fetch then meets a fresh id)."""
    drain: bool = False
    shutdown: bool = False
    reorder: bool = False
    """deliver any message of a channel, not only the oldest (zmq keeps per-connection order)."""
    max_states: int = 2_000_000
    """give up (exit 3) beyond this many states."""
