"""Building a manager's I/O loop from its config: the transport, the digest pool, the data plane,
the core, the metrics and the shell parts between them (:func:`build_parts`).

One job: construction and its failure messages.  Nothing here runs after construction.
"""

from __future__ import annotations

import errno
import logging
import secrets
from collections.abc import Callable
from typing import Any, NamedTuple

from kvtier.config import TierConfig
from kvtier.forensics import Forensics
from kvtier.dataplane import DataPlane, make_plane
from kvtier.dataplane.settings import PlaneSettings
from kvtier.integrity import DigestPool, default_threads
from kvtier.lifecycle import CoreSettings, HelloInput, TierCore
from kvtier.metrics import TierMetrics
from kvtier.params import PeerPolicy, exposures
from kvtier.shell.inbound import Inbound
from kvtier.shell.jobs import JobBook
from kvtier.shell.logs import RateLimitedLog
from kvtier.shell.outbound import Outbound
from kvtier.shell.perbyte import ByteWork
from kvtier.transport import Transport, TransportError
from kvtier.wire.codec import PROTOCOL_VERSION, Decoder, WireLimits

log = logging.getLogger("kvtier.manager")

#: Frames of at least this many bytes are sent zero-copy (with a tracker); smaller ones are copied.
ZERO_COPY_BYTES = 256 << 10

__all__ = ["Parts", "build_parts", "local_hello", "make_core", "make_transport", "warn_if_serving_open"]


def _warn(cfg: TierConfig, kind: str) -> None:
    """The SECURITY warnings of ``kind`` a manager with ``cfg`` logs at start (params.exposures)."""
    policy = PeerPolicy.from_entries(cfg.allowed_peers, listen_host=cfg.host)
    for exposure in exposures(host=cfg.host, auth=cfg.auth, serve_external=cfg.serve_external, policy=policy):
        if exposure.kind == kind:
            log.warning(exposure.line)


def make_transport(cfg: TierConfig, block_bytes: int) -> Transport:
    """The ZeroMQ transport listening on ``cfg.host:cfg.port`` (CURVE when ``auth='curve'``).

    Raises:
        TransportError: the port is taken or the host cannot be bound (the message names the
            config key to change).
    """
    from kvtier.transport.curve import curve_settings

    curve = curve_settings(cfg.auth_secret_key_file, cfg.auth_allowed_keys_dir) if cfg.auth == "curve" else None
    _warn(cfg, "listen")
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
        # no ZMTP heartbeats: libzmq 4.3.5 aborts the process when their timer fires on a
        # connection stopped by backpressure that then failed (decision T18); the core's pings
        # carry liveness, and it cuts the connection of a session it ends
        heartbeat_ivl_s=0.0,
        # libzmq cuts a peer whose frame exceeds the largest legal one before receiving it
        # (consumers send us only control headers; producers also send blocks). Up to 2x the
        # header cap still arrives, to be answered "oversize": a misconfigured peer learns why
        # instead of seeing its connection vanish.
        max_accepted_frame_bytes=2 * cfg.max_message_bytes,
        max_frame_bytes=max(2 * cfg.max_message_bytes, block_bytes),
        # frames under 256 KiB are copied as they are sent: zero-copy pays for itself only from
        # 256 KiB up (measured with raw pyzmq here), and a tracked frame costs a tracker, pyzmq's garbage-collector
        # thread and a later release report (decision C21)
        zero_copy_threshold=ZERO_COPY_BYTES,
        # libzmq's cut of a connection that never completes ZMTP is a backstop after the core's
        # hello timer, which names the session's end (handshake_timeout): at the same instant
        # they raced, and a silent listener read as a peer that disconnected (decision T14)
        handshake_ivl_s=2 * cfg.handshake_timeout_s,
        connect_timeout_s=cfg.connect_timeout_s,
        idle_timeout_s=cfg.handshake_timeout_s,
        curve=curve,
    )


def local_hello(cfg: TierConfig, *, block_bytes: int, layout: str, instance: str, plane: Any) -> HelloInput:
    """Our hello: what every handshake compares, plus our instance and data-plane descriptor."""
    return HelloInput(PROTOCOL_VERSION, block_bytes, layout, cfg.hash_seed, data_plane=plane.name,
                      digest=cfg.integrity, instance=instance, descriptor=plane.descriptor())


def make_core(cfg: TierConfig, hello: HelloInput, *, one_sided: bool, gen_base: int,
              revoke_bounded: bool = True, pool_blocks: int | None = None, block_bytes: int | None = None,
              max_header_bytes: int | None = None) -> TierCore:
    settings = CoreSettings.from_config(cfg, one_sided=one_sided, revoke_bounded=revoke_bounded,
                                        pool_blocks=pool_blocks, block_bytes=block_bytes,
                                        max_header_bytes=max_header_bytes)
    return TierCore(settings, hello, gen_base=gen_base)


def warn_if_serving_open(cfg: TierConfig) -> None:
    """One loud WARNING when peers' probes are answered without authentication beyond this host:
    a probe is a membership test on this engine's prefix cache and reads its KV (decision Y7)."""
    _warn(cfg, "serve")


class Parts(NamedTuple):
    """Everything one manager's I/O loop owns (built by :func:`build_parts`)."""

    transport: Transport
    plane: DataPlane
    core: TierCore
    digest_pool: DigestPool | None
    metrics: TierMetrics
    logs: RateLimitedLog
    work: ByteWork
    inbound: Inbound
    outbound: Outbound
    jobs: JobBook
    instance: str
    forensics: Forensics


def build_parts(cfg: TierConfig, pool: object, *, layout: str, clock: Callable[[], float], lock: object,
                transport: Transport | None, vet: object = None) -> Parts:
    """Build the loop's parts; on failure close whatever was built (a bound listener, a metrics
    server) and re-raise.

    Raises:
        TransportError: the port cannot be bound, or ``metrics_port`` cannot be served.
        kvtier.dataplane.PlaneError: the configured data plane cannot start here.
    """
    own_transport = transport is None
    transport = transport if transport is not None else make_transport(cfg, pool.block_bytes)  # type: ignore[attr-defined]
    metrics: TierMetrics | None = None
    digest_pool: DigestPool | None = None
    try:
        instance = cfg.instance or secrets.token_hex(6)
        # digests and landings that grow with bytes run here, off the loop's thread (decision I14);
        # its threads start with the first large store or landing
        threads = default_threads() if cfg.digest_threads is None else cfg.digest_threads
        digest_pool = (DigestPool(threads, name=f"kvtier-digest-{instance}")
                       if threads and cfg.integrity != "none" else None)
        plane = make_plane(cfg.data_plane, transport=transport, pool=pool, settings=PlaneSettings.from_config(cfg),
                           layout=layout, digest_pool=digest_pool)
        hello = local_hello(cfg, block_bytes=pool.block_bytes, layout=layout, instance=instance,  # type: ignore[attr-defined]
                            plane=plane)
        core = make_core(cfg, hello, one_sided=plane.one_sided, gen_base=secrets.randbits(62),
                         revoke_bounded=plane.revocation_bounded, pool_blocks=pool.num_blocks,  # type: ignore[attr-defined]
                         block_bytes=pool.block_bytes,  # type: ignore[attr-defined]
                         max_header_bytes=plane.max_header_bytes)
        jobs = JobBook()
        where = getattr(transport, "peer_address", None)
        metrics = TierMetrics(tier=cfg.type, listener=transport.address, core=core, lock=lock, clock=clock,
                              block_bytes=pool.block_bytes)  # type: ignore[attr-defined]
        forensics = Forensics(core=core, job_info=lambda job_id: jobs.info(job_id, own=True), clock=clock,
                              block_bytes=pool.block_bytes,  # type: ignore[attr-defined]
                              where=where, lock=lock, parked_since=metrics.parked_since)
        if cfg.metrics_port is not None:
            try:
                metrics.serve(cfg.host, cfg.metrics_port, requests=forensics)
            except OSError as exc:
                raise TransportError(
                    f"metrics_port={cfg.metrics_port}: cannot serve metrics on {cfg.host}: {exc} (choose a free "
                    "port, 0 for an ephemeral one, or null for no endpoint)") from exc
            log.info("kvtier: metrics on http://%s/metrics", metrics.address)
        logs = RateLimitedLog(clock, where if where is not None else (lambda p: ""))
        decoder = Decoder(
            limits=WireLimits(max_message_bytes=cfg.max_message_bytes, max_blocks_per_fetch=cfg.max_blocks_per_fetch),
            block_bytes=pool.block_bytes,  # type: ignore[attr-defined]
        )
        work = ByteWork(algorithm=cfg.integrity, digest_pool=digest_pool, block_bytes=pool.block_bytes,  # type: ignore[attr-defined]
                        metrics=metrics, logs=logs)
        outbound = Outbound(transport=transport, plane=plane, pool=pool, jobs=jobs, metrics=metrics, logs=logs,
                            work=work, clock=clock, loads=core.consumer, vet=vet)
        outbound.forensics = forensics
        inbound = Inbound(transport=transport, plane=plane, decoder=decoder, metrics=metrics, logs=logs, clock=clock,
                          posted=outbound.posted, work=work)
    except BaseException:
        if own_transport:  # never leak a bound listener (and its zmq threads) from a failed build
            transport.close()
        if metrics is not None:
            metrics.close()
        if digest_pool is not None:
            digest_pool.close()
        raise
    if not getattr(pool, "pinned", False):
        log.info("kvtier: block pool is pageable (no accelerator): transfers still work, without DMA pinning")
    warn_if_serving_open(cfg)
    return Parts(transport, plane, core, digest_pool, metrics, logs, work, inbound, outbound, jobs, instance, forensics)
