"""The core's settings: everything it needs from the config — timer durations keyed by config key,
limits, the data plane's shape and the pool's block size (:class:`CoreSettings`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = ["CoreSettings", "SYMMETRIC_TIMER_DEFAULTS", "TIMER_KEYS"]

TIMER_KEYS = (
    "unbound_store_timeout_s",
    "fetch_supply_timeout_s",
    "transfer_timeout_s",
    "tombstone_retention_s",
    "load_timeout_s",
    "abort_ack_timeout_s",
    "revoke_timeout_s",
    "handshake_timeout_s",
    "heartbeat_interval_s",
    "peer_timeout_s",
    "probe_timeout_s",
    "serve_lookup_timeout_s",
    "offer_timeout_s",
)
#: the symmetric path's timers, defaulted for callers that build durations by hand (config: Y6)
SYMMETRIC_TIMER_DEFAULTS = {"probe_timeout_s": 1.0, "serve_lookup_timeout_s": 0.25, "offer_timeout_s": 10.0}


class CoreSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the core needs from the config (durations in seconds, keyed by config key)."""

    durations: Mapping[str, float]
    park_clock: str = "last_store"
    tombstone_max: int = 65536
    max_pending_fetches_per_peer: int = 1024
    max_peers: int = 128
    one_sided: bool = False
    """The data plane writes into the consumer's slots (fetches name them)."""
    revoke_bounded: bool = True
    """The data plane withdraws a producer's access by itself within ``revoke_timeout_s``
    (zmq; NIXL over a shared-memory pool), so a load in ``revoking`` is answered at its revoke
    deadline at the latest."""
    error_reply_interval_s: float = 10.0
    """At most one unsolicited ``error`` answer per (peer, reason) per this many seconds (a malformed message
    that names no ``kv_request_id``): a flood of garbage gets a bounded echo."""
    integrity: bool = True
    """Blocks carry digests checked as they land (config ``integrity`` is not ``none``): only then does a
    failed load report the blocks that landed (``successful_keys``)."""
    serve_external: bool = False
    """Serve peers' probes from the engine's tiers (the symmetric path's producer side)."""
    serve_allowed_principals: frozenset[str] | None = None
    """Principals allowed to probe (None: any peer with a ready session)."""
    serve_max_rounds_per_peer: int = 256
    serve_max_probes_per_round: int = 8
    serve_max_pinned_blocks_per_peer: int = 16384
    serve_max_pinned_blocks: int = 1 << 62
    """All peers together (the pool's ``serve_max_pinned_fraction``)."""
    block_bytes: int = 0
    """The pool's block size (bytes): the core cuts a transfer into ``block_data`` batches by it
    (0: one block per batch, for callers that never send blocks)."""
    max_header_bytes: int | None = None
    """The largest ``block_data`` header the data plane carries (NIXL: a notification), or None."""

    @classmethod
    def from_config(cls, config: object, *, one_sided: bool = False, revoke_bounded: bool = True,
                    pool_blocks: int | None = None, block_bytes: int | None = None,
                    max_header_bytes: int | None = None) -> CoreSettings:
        """Build from any object with the TierConfig attribute names (``pool_blocks``: the block
        pool's size, which ``serve_max_pinned_fraction`` is a fraction of)."""
        c: Any = config
        principals = tuple(getattr(c, "serve_allowed_principals", ("*",)))
        total = 1 << 62
        if pool_blocks is not None:
            total = max(1, int(pool_blocks * float(getattr(c, "serve_max_pinned_fraction", 0.5))))
        return cls(
            durations={**{k: float(getattr(c, k, SYMMETRIC_TIMER_DEFAULTS.get(k, 0.0))) for k in TIMER_KEYS},
                       "shutdown_grace_s": float(getattr(c, "shutdown_grace_s", 3.0))},
            park_clock=c.park_clock,
            tombstone_max=c.tombstone_max,
            max_pending_fetches_per_peer=c.max_pending_fetches_per_peer,
            max_peers=c.max_peers,
            one_sided=one_sided,
            revoke_bounded=revoke_bounded,
            integrity=getattr(c, "integrity", "xxh3_64") != "none",
            serve_external=bool(getattr(c, "serve_external", False)),
            serve_allowed_principals=None if "*" in principals else frozenset(principals),
            serve_max_rounds_per_peer=int(getattr(c, "serve_max_rounds_per_peer", 256)),
            serve_max_probes_per_round=int(getattr(c, "serve_max_probes_per_round", 8)),
            serve_max_pinned_blocks_per_peer=int(getattr(c, "serve_max_pinned_blocks_per_peer", 16384)),
            serve_max_pinned_blocks=total,
            block_bytes=int(block_bytes or 0),
            max_header_bytes=max_header_bytes,
        )
