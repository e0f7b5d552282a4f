"""The core's settings: everything it needs from the config — timer durations keyed by config key,
limits, the data plane's shape and the pool's block size (:class:`CoreSettings`).

Which durations the core reads is the spec's to say (``TIMER_KEYS``, generated from
``spec/lifecycle.toml``); every default is the config's (:data:`kvtier.config.DEFAULTS`), so a
test that builds settings by hand gets what an unconfigured manager gets (decision C23)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from kvtier.config import DEFAULTS
from kvtier.lifecycle._table import TIMER_KEYS

if TYPE_CHECKING:
    from kvtier.config import TierConfig

__all__ = ["CoreSettings", "TIMER_KEYS"]


class CoreSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the core needs from the config (durations in seconds, keyed by config key)."""

    durations: Mapping[str, float]
    """Seconds per key of ``TIMER_KEYS``; a key left out takes its config default, a key that is
    not one raises ``ValueError``."""
    park_clock: str = DEFAULTS["park_clock"]
    tombstone_max: int = DEFAULTS["tombstone_max"]
    max_pending_fetches_per_peer: int = DEFAULTS["max_pending_fetches_per_peer"]
    max_peers: int = DEFAULTS["max_peers"]
    shutdown_grace_s: float = DEFAULTS["shutdown_grace_s"]
    """How long a goodbye that names why may take to leave before its connection is cut (the
    bound a goodbye has at shutdown too: decision A2)."""
    one_sided: bool = False
    """The data plane writes into the consumer's slots (fetches name them)."""
    revoke_bounded: bool = True
    """The data plane withdraws a producer's access by itself within ``revoke_timeout_s``
    (zmq; NIXL over a shared-memory pool), so a load in ``revoking`` is answered at its revoke
    deadline at the latest."""
    error_reply_interval_s: float = 10.0
    """At most one unsolicited ``error`` answer per (peer, reason) per this many seconds (a malformed message
    that names no ``kv_request_id``): a flood of garbage gets a bounded echo."""
    integrity: bool = DEFAULTS["integrity"] != "none"
    """Blocks carry digests checked as they land (config ``integrity`` is not ``none``): only then does a
    failed load report the blocks that landed (``successful_keys``)."""
    serve_external: bool = DEFAULTS["serve_external"]
    """Serve peers' probes from the engine's tiers (the symmetric path's producer side)."""
    serve_allowed_principals: frozenset[str] | None = None
    """Principals allowed to probe (None: any peer with a ready session)."""
    serve_max_rounds_per_peer: int = DEFAULTS["serve_max_rounds_per_peer"]
    serve_max_probes_per_round: int = DEFAULTS["serve_max_probes_per_round"]
    serve_max_pinned_blocks_per_peer: int = DEFAULTS["serve_max_pinned_blocks_per_peer"]
    serve_max_pinned_blocks: int = 1 << 62
    """All peers together (the pool's ``serve_max_pinned_fraction``)."""
    block_bytes: int = 0
    """The pool's block size (bytes): the core cuts a transfer into ``block_data`` batches by it
    (0: one block per batch, for callers that never send blocks)."""
    max_header_bytes: int | None = None
    """The largest ``block_data`` header the data plane carries (NIXL: a notification), or None."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.durations) - set(TIMER_KEYS))
        if unknown:
            raise ValueError(f"durations names keys the core does not read: {unknown} (TIMER_KEYS: {TIMER_KEYS})")
        full = {k: float(self.durations.get(k, DEFAULTS[k])) for k in TIMER_KEYS}
        msgspec.structs.force_setattr(self, "durations", full)

    @classmethod
    def from_config(cls, config: TierConfig, *, one_sided: bool = False, revoke_bounded: bool = True,
                    pool_blocks: int | None = None, block_bytes: int | None = None,
                    max_header_bytes: int | None = None) -> CoreSettings:
        """Build from a validated config (``pool_blocks``: the block pool's size, which
        ``serve_max_pinned_fraction`` is a fraction of)."""
        c = config
        total = 1 << 62 if pool_blocks is None else max(1, int(pool_blocks * c.serve_max_pinned_fraction))
        return cls(
            durations={k: getattr(c, k) for k in TIMER_KEYS},  # the spec's keys, all TierConfig fields
            park_clock=c.park_clock,
            tombstone_max=c.tombstone_max,
            max_pending_fetches_per_peer=c.max_pending_fetches_per_peer,
            max_peers=c.max_peers,
            shutdown_grace_s=c.shutdown_grace_s,
            one_sided=one_sided,
            revoke_bounded=revoke_bounded,
            integrity=c.integrity != "none",
            serve_external=c.serve_external,
            serve_allowed_principals=(None if "*" in c.serve_allowed_principals
                                      else frozenset(c.serve_allowed_principals)),
            serve_max_rounds_per_peer=c.serve_max_rounds_per_peer,
            serve_max_probes_per_round=c.serve_max_probes_per_round,
            serve_max_pinned_blocks_per_peer=c.serve_max_pinned_blocks_per_peer,
            serve_max_pinned_blocks=total,
            block_bytes=int(block_bytes or 0),
            max_header_bytes=max_header_bytes,
        )
