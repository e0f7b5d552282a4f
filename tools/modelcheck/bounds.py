"""The size of the explored system: how many ids, consumers, faults, crashes... (``python -m tools check`` options),
and the named configurations (:data:`PROFILES`) a plain ``python -m tools check`` explores one after another."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import attrs

__all__ = ["PROFILES", "Bounds"]


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
    """lost or duplicated messages, or blocks landing corrupt (per consumer connection, or in total:
    see fault_scope)."""
    fault_scope: str = "per_peer"
    """"per_peer": each consumer's connection may suffer ``faults`` faults; "total": all together."""
    chunks: int = 1
    """stores (one key each) per id; the fetch names every key."""
    loads_per_id: int = 1
    """how many consumers may load the same id (2 exercises duplicate_fetch)."""
    lives: int = 1
    """lives per id: after an id's tombstone or done record is pruned, the prefill engine may store it
    again and a decode engine load it again (up to this many times), while messages of the earlier
    life are still in flight (``lives_never_mix``)."""
    crashes: int = 0
    """session deaths (two-sided disconnect, connection close, or one side's heartbeat finding
    the peer silent for peer_timeout_s)."""
    pings: bool = False
    """a ready session's heartbeat may fire without silence: the dialled side (the consumer) pings,
    the producer answers pong (at most one in flight per session)."""
    connected: bool = True
    """sessions are ready before the search starts; False: a consumer's first load dials, and the
    handshake (hello, hello_ack, the planes taking the descriptors) is explored."""
    attach_later: bool = False
    """a data plane takes (or, not as a completion step, refuses) a peer's descriptor in a later
    step than the one that handed it over, so sessions wait in ``attaching``."""
    tombstone_max: int = 2
    """the producer's retained-id cap (below ``ids`` the count bound evicts; that couples the ids and
    defeats most of the partial-order reduction, so keep the depth small then)."""
    max_pending: int = 1
    """max_pending_fetches_per_peer (1: too_many_pending is exercised)."""
    park_clock: str = "last_store"
    transfer_failures: bool = True
    """the data plane may fail a transfer (``transfer_failed``) instead of releasing it."""
    corruption: bool = True
    """a fault may be a block_data whose blocks land corrupt (a digest mismatch)."""
    batching: bool = True
    """receive batching: a message first arrives in the receiver's socket, then is read and applied;
    a deadline fires only when the manager's sockets hold no arrived-but-unread message
    (``input_before_deadline``).  Off: a message is applied the moment it arrives."""
    one_sided: bool = False
    """a one-sided data plane: a consumer's ``RevokeAccess`` is confirmed (``access_revoked``) by a
    later step, not at once as on a receiver-applied plane."""
    reduce: bool = True
    """partial-order reduction (persistent sets over ids; needs routing="fixed", ids == consumers)."""
    routing: str = "fixed"
    """"any": every consumer may load every id; "fixed": id i goes to consumer i % consumers."""
    abandon: bool = True
    """the producer's request may finish before all its chunks are stored (request_finished early)."""
    prune_timers: bool = True
    """let the prune deadline of done/tombstoned ids fire (a later fetch then meets a fresh id)."""
    drain: bool = False
    """the operator may call ``drain_jobs()`` on the producer once."""
    shutdown: bool = False
    """each manager may shut down: ``shutdown()`` begins (no new work), then the grace ends
    (``close``), with traffic in flight; after close the process is gone (messages to it are lost)
    and its data plane closes (every reference is released)."""
    reorder: bool = False
    """deliver any message of a channel, not only the oldest (zmq keeps per-connection order)."""
    symmetric: bool = False
    """the symmetric path instead of PD hand-offs (decision M14): the consumer's engine probes the
    producer for a request of ``sym_keys`` keys (announce, lookups, the step's end, a load of the
    offered keys, request_finished), the producer serves it from its engine's tiers
    (``serve_external``: the serve window answers lookups found, missing or pending and pins,
    pins are released); needs ``ids == consumers == 1``."""
    sym_keys: int = 2
    """keys of the symmetric request (1 or 2)."""
    max_states: int = 2_000_000
    """give up (exit 3) beyond this many states."""


PROFILES: Mapping[str, Bounds] = MappingProxyType({
    # two ids, two consumers, a lost, duplicated or corrupt message per connection, receive batching,
    # transfer failures, references that outlive a cancel, the producer's request finishing early
    "core": Bounds(),
    # an id stored and loaded again after its tombstone was pruned, while the earlier life's messages
    # are still in flight (no faults: a fault budget spanning two lives multiplies the states 20x)
    "reuse": Bounds(ids=1, consumers=1, faults=0, lives=2),
    # the session's life: the first load dials and the handshake runs (hello, hello_ack, each data
    # plane taking -- or refusing -- the peer's descriptor in a later step), heartbeats ping and
    # pong, and the session dies under the traffic: both sides see disconnect, or both transports
    # see the connection close, or one side's heartbeat finds the peer silent
    "sessions": Bounds(ids=1, consumers=1, faults=0, crashes=1, pings=True, connected=False, attach_later=True),
    # both managers shut down (begin, then the grace ends) with traffic in flight, and drain_jobs
    "shutdown": Bounds(ids=1, consumers=1, faults=0, shutdown=True, drain=True),
    # a one-sided data plane: a consumer's revocation of the producer's access completes later
    "one-sided": Bounds(ids=1, consumers=1, faults=0, one_sided=True),
    # the symmetric path (decision M14): one request of two keys probed, each key found, missing or
    # pending in the producer's engine, pinned, loaded and released, with transfer failures; no
    # faults (with them two keys take ~2M states; --sym-keys 1 --faults 1 explores them in ~21k)
    # and no receive batching (the serve records' deadlines are keyed by round, which no message
    # names alone); one pair, so no partial-order reduction
    "symmetric": Bounds(ids=1, consumers=1, faults=0, symmetric=True, batching=False, reduce=False),
})
"""The configurations a plain ``python -m tools check`` explores, each to exhaustion, in this order (``--profile
NAME`` runs one; any bound option runs one configuration: the ``core`` profile with that change).
``core`` is :class:`Bounds`' defaults; the others add one behaviour each to one id and one consumer,
without faults, so that together they run in seconds (docs/modelcheck.md gives the figures)."""
