"""Building a manager's parts from its config: the transport, the data plane, the core.

One job: construction and its failure messages.  Nothing here runs after ``__init__``.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from typing import Any

from kvtier.config import TierConfig
from kvtier.lifecycle import CoreSettings, HelloInput, TierCore
from kvtier.transport import Transport, TransportError
from kvtier.wire.codec import PROTOCOL_VERSION

log = logging.getLogger("kvtier.manager")

__all__ = ["local_hello", "make_core", "make_transport", "warn_if_serving_open"]


def _warn_if_open(cfg: TierConfig) -> None:
    """One loud WARNING when the listener is reachable beyond this host without authentication."""
    try:
        loopback = ipaddress.ip_address(cfg.host.strip("[]")).is_loopback
    except ValueError:
        loopback = cfg.host == "localhost"
    if cfg.auth == "none" and not loopback:
        log.warning(
            "kvtier: SECURITY: listening on %s with auth='none': anyone who can reach this port can "
            "fetch, abort or probe parked KV blocks (users' prompts). Set auth='curve' (docs/security.md).",
            cfg.host,
        )


def make_transport(cfg: TierConfig, block_bytes: int) -> Transport:
    """The ZeroMQ transport listening on ``cfg.host:cfg.port`` (CURVE when ``auth='curve'``).

    Raises:
        TransportError: the port is taken or the host cannot be bound (the message names the
            config key to change).
    """
    from kvtier.transport.curve import curve_settings

    curve = curve_settings(cfg.auth_secret_key_file, cfg.auth_allowed_keys_dir) if cfg.auth == "curve" else None
    _warn_if_open(cfg)
    try:
        return _zmq_transport(cfg, block_bytes, curve)
    except TransportError as exc:
        raise TransportError(_bind_error(cfg, exc)) from exc


def _bind_error(cfg: TierConfig, exc: TransportError) -> str:
    """The listener's bind failure, naming the config key to change (``port`` or ``host``)."""
    code = getattr(exc.__cause__, "errno", None)
    if code == errno.EADDRINUSE:
        return (f"port={cfg.port}: {exc} (another process listens there: choose a free port, or 0 for an "
                "ephemeral one)")
    if code in (errno.EADDRNOTAVAIL, errno.EINVAL, errno.ENODEV):
        return f"host={cfg.host!r}: {exc} (not an address of this machine: use one of its addresses, or 0.0.0.0)"
    return f"host={cfg.host!r}, port={cfg.port}: {exc}"


def _zmq_transport(cfg: TierConfig, block_bytes: int, curve: Any) -> Transport:
    from kvtier.transport import ZmqTransport

    return ZmqTransport(
        cfg.host,
        cfg.port,
        heartbeat_ivl_s=cfg.heartbeat_interval_s,
        # libzmq's own silence cut-off stays behind the core's (peer_timeout_s, then a heartbeat):
        # a silent peer then ends its session as peer_timeout, never as a closed connection,
        # which a fresh dial to its instance would take for a gone process (decision I18)
        heartbeat_timeout_s=3 * cfg.peer_timeout_s + 1.0,
        heartbeat_ttl_s=3 * cfg.peer_timeout_s + 1.0,
        # libzmq cuts a peer whose frame exceeds the largest legal one before receiving it
        # (consumers send us only control headers; producers also send blocks). Up to 2x the
        # header cap still arrives, to be answered "oversize": a misconfigured peer learns why
        # instead of seeing its connection vanish.
        max_accepted_frame_bytes=2 * cfg.max_message_bytes,
        max_frame_bytes=max(2 * cfg.max_message_bytes, block_bytes),
        handshake_ivl_s=cfg.handshake_timeout_s,
        connect_timeout_s=cfg.connect_timeout_s,
        idle_timeout_s=cfg.handshake_timeout_s,
        curve=curve,
    )


def local_hello(cfg: TierConfig, *, block_bytes: int, layout: str, instance: str, plane: Any) -> HelloInput:
    """Our hello: what every handshake compares, plus our instance and data-plane descriptor."""
    return HelloInput(PROTOCOL_VERSION, block_bytes, layout, cfg.hash_seed, data_plane=plane.name,
                      digest=cfg.integrity, instance=instance, descriptor=plane.descriptor())


def make_core(cfg: TierConfig, hello: HelloInput, *, one_sided: bool, gen_base: int,
              revoke_bounded: bool = True, pool_blocks: int | None = None) -> TierCore:
    settings = CoreSettings.from_config(cfg, one_sided=one_sided, revoke_bounded=revoke_bounded,
                                        pool_blocks=pool_blocks)
    return TierCore(settings, hello, gen_base=gen_base)


def warn_if_serving_open(cfg: TierConfig) -> None:
    """One loud WARNING when peers' probes are answered without authentication beyond this host:
    a probe is a membership test on this engine's prefix cache and reads its KV (decision Y7)."""
    if not cfg.serve_external or cfg.auth != "none":
        return
    try:
        loopback = ipaddress.ip_address(cfg.host.strip("[]")).is_loopback
    except ValueError:
        loopback = cfg.host == "localhost"
    if not loopback:
        log.warning(
            "kvtier: SECURITY: serve_external is on with auth='none' on %s: anyone who can reach this port can "
            "learn which prompts this engine served and read their KV blocks. Set auth='curve' and "
            "serve_allowed_principals (docs/security.md).", cfg.host,
        )
