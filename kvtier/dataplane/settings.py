"""What a data plane takes from the config (:class:`PlaneSettings`), built once from a validated
:class:`~kvtier.config.TierConfig`; every default is the config's (decision C24)."""

from __future__ import annotations

import msgspec

from kvtier.config import DEFAULTS, TierConfig

__all__ = ["PlaneSettings"]


class PlaneSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A data plane's settings (config keys of the same names)."""

    integrity: str = DEFAULTS["integrity"]
    """The digest checked as blocks land (``xxh3_64`` or ``none``)."""
    backends: tuple[str, ...] = DEFAULTS["backends"]
    """NIXL only: the backend plugins to create, by NIXL's names."""
    nixl_progress_interval_s: float = DEFAULTS["nixl_progress_interval_s"]
    """NIXL only: the longest wait (seconds) between two calls into NIXL while a transfer may be
    in flight."""
    instance: str = DEFAULTS["instance"]
    """This manager's instance name (NIXL: part of the agent's name); empty: none given."""
    revoke_timeout_s: float = DEFAULTS["revoke_timeout_s"]
    """The bound (seconds) on revoking a producer's access to a load's slots."""
    abort_ack_timeout_s: float = DEFAULTS["abort_ack_timeout_s"]
    """How long a consumer waits for an abort's answer (seconds): a transfer commits at most half
    of it, at its peer's measured rate, to the link (decision T23)."""

    @classmethod
    def from_config(cls, config: TierConfig) -> PlaneSettings:
        return cls(integrity=config.integrity, backends=config.backends,
                   nixl_progress_interval_s=config.nixl_progress_interval_s, instance=config.instance,
                   revoke_timeout_s=config.revoke_timeout_s, abort_ack_timeout_s=config.abort_ack_timeout_s)
