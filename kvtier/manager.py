"""``KvTierManager``: the I/O shell around :class:`~kvtier.lifecycle.TierCore`.

It turns engine calls, decoded wire messages, transport events, data-plane reports and clock
readings into core inputs, and performs the core's effects: socket sends, posts to the data plane
(:mod:`kvtier.dataplane`), landing and checking blocks, job results.  It makes no lifecycle
decision of its own — every "may I send / land / report" question is answered by the core (tables
generated from ``spec/lifecycle.toml``).

Time rule (``input_before_deadline``, bug-scenarios B24): each poll drains the inbound queue and
fires deadlines at the time the queue was last seen *empty*, so a deadline never beats a message
that was already waiting in the socket when it fell due — a stalled loop reaps nothing and
declares no peer dead because of its own stall.

Threading: every public method takes one re-entrant lock, so the manager may be driven from the
engine thread alone (call :meth:`poll` or :meth:`get_finished_jobs` regularly), or with
``background_poll=True`` from an internal daemon thread as well (it polls every
``poll_interval_s`` and takes the same lock); both are safe.  The API mirrors vLLM 0.33.0's
``SecondaryTierManager`` (``on_new_request``, ``lookup``, ``submit_store``, ``submit_load``,
``get_finished_jobs``, ``on_request_finished``, ``has_pending_work``, ``drain_jobs``,
``shutdown``).

Nothing a peer sends can raise out of :meth:`poll`: malformed messages are counted, answered
with an ``error`` message (rate-limited) and dropped.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry

from kvtier.api import DuplicateJob, JobResult, LookupResult, RequestContext, TransferJob, UnknownRequest
from kvtier.config import TierConfig
from kvtier.dataplane import Batch, DataPlane, PlaneError, Released, Revoked, make_plane
from kvtier.integrity import block_digests, check_blocks
from kvtier.lifecycle import (
    ConsumerState,
    CoreSettings,
    InvalidTransition,
    FetchInput,
    HelloInput,
    LoadInput,
    MessageInput,
    StoreInput,
    TierCore,
)
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle._table import ProducerState, SessionState
from kvtier.memory import BlockPool
from kvtier.metrics import TierMetrics
from kvtier.params import PeerNotAllowed, PeerPolicy, TransferParams, clip, parse_params
from kvtier.transport import CloseReason, SendHandle, Transport, TransportError
from kvtier.wire import messages as wm
from kvtier.wire.codec import PROTOCOL_VERSION, Decoder, WireError, WireLimits, encode, encode_frames

log = logging.getLogger("kvtier.manager")

#: Largest block_data message we build (bytes of payload); limits.md: keep zmq messages ≤ 16 MiB.
MAX_BATCH_BYTES = 8 << 20

#: Messages read per recv() call while draining, and at most per poll: the budget keeps engine
#: calls from waiting behind a flood; deadlines then wait for the queue to be seen empty.
RECV_BATCH = 256
RECV_BUDGET = 8192


@attrs.define(slots=True)
class _Job:
    kind: str  # "store" | "load"
    kv_request_id: str | None
    submitted: float
    nbytes: int


class _RateLimitedLog:
    """At most one log line per (peer, reason) per ``interval_s``, and at most ``budget`` lines
    per ``interval_s`` in all: a flood from ever-new peer ids cannot flood the log either."""

    def __init__(self, interval_s: float = 10.0, budget: int = 50) -> None:
        self.interval_s = interval_s
        self.budget = budget
        self._last: dict[tuple[str, str], float] = {}
        self._window = float("-inf")
        self._used = 0
        self._suppressed = 0

    def __call__(self, now: float, peer: str, reason: str, msg: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Log unless this (peer, reason) logged within the interval or the budget is spent;
        return whether it logged."""
        if now - self._window >= self.interval_s:
            if self._suppressed:
                log.warning("kvtier: %d more log lines about bad peer input suppressed in the last %.0f s",
                            self._suppressed, self.interval_s)
            self._window, self._used, self._suppressed = now, 0, 0
        key = (peer, reason)
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        if self._used >= self.budget:
            self._suppressed += 1
            return False
        self._last[key] = now
        if len(self._last) > 4096:
            self._last.clear()
        self._used += 1
        log.log(level, msg, *args)
        return True


def _check_req(req: Any, where: str) -> None:
    """The engine's request handle must be a RequestContext (a clear TypeError, not an
    AttributeError from deep inside)."""
    if not isinstance(req, RequestContext):
        raise TypeError(f"{where}: req must be a kvtier.api.RequestContext, got {type(req).__name__}")


def _quarantined(core: TierCore, jobs: Mapping[int, _Job], block_bytes: int) -> tuple[int, int]:
    recs = [core.producer.records[k] for k in core.producer.quarantined]
    return len(recs), sum(jobs[j].nbytes for r in recs for j in r.jobs if j in jobs) // block_bytes


def _warn_if_open(cfg: TierConfig) -> None:
    """One loud WARNING when the listener is reachable beyond this host without authentication."""
    import ipaddress

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


class KvTierManager:
    """One kvtier tier instance: producer and consumer at once, over one block pool.

    Args:
        config: a :class:`~kvtier.config.TierConfig` or the dict a user writes in vLLM's
            ``secondary_tiers[]`` entry (validated; ``ValueError`` names a bad key).
        pool: the host block pool blocks are stored in and loaded into (``block_bytes`` per
            block; pinned iff an accelerator exists).
        layout: the block layout fingerprint; peers must agree (checked in the handshake).
        clock: returns seconds (monotonic); injectable for virtual-time tests.
        transport: defaults to a :class:`~kvtier.transport.ZmqTransport` listening on
            ``config.host:config.port``.
    """

    def __init__(
        self,
        config: TierConfig | Mapping[str, Any] | None,
        pool: BlockPool,
        *,
        layout: str = "raw",
        clock: Callable[[], float] = time.monotonic,
        transport: Transport | None = None,
    ) -> None:
        if config is None:
            config = {}
        if not isinstance(config, (TierConfig, Mapping)):
            raise TypeError(f"config must be a TierConfig or a mapping of its keys, got {type(config).__name__}")
        self.config = config if isinstance(config, TierConfig) else TierConfig.from_dict(dict(config))
        cfg = self.config
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a kvtier.memory.BlockPool, got {type(pool).__name__}")
        self.pool = pool
        self.clock = clock
        self._lock = threading.RLock()
        own_transport = transport is None
        if transport is None:
            from kvtier.transport import ZmqTransport
            from kvtier.transport.curve import curve_settings

            curve = curve_settings(cfg.auth_secret_key_file, cfg.auth_allowed_keys_dir) if cfg.auth == "curve" else None
            _warn_if_open(cfg)

            transport = ZmqTransport(
                cfg.host,
                cfg.port,
                heartbeat_ivl_s=cfg.heartbeat_interval_s,
                heartbeat_timeout_s=cfg.peer_timeout_s,
                heartbeat_ttl_s=cfg.peer_timeout_s,
                # libzmq cuts a peer whose frame exceeds the largest legal one before receiving
                # it (consumers send us only control headers; producers also send blocks). Up
                # to 2x the header cap still arrives, to be answered "oversize": a misconfigured
                # peer learns why instead of seeing its connection vanish.
                max_accepted_frame_bytes=2 * cfg.max_message_bytes,
                max_frame_bytes=max(2 * cfg.max_message_bytes, pool.block_bytes),
                handshake_ivl_s=cfg.handshake_timeout_s,
                idle_timeout_s=cfg.handshake_timeout_s,
                curve=curve,
            )
        self.transport = transport
        try:
            self._init_rest(cfg, pool, layout)
        except BaseException:
            if own_transport:  # never leak a bound listener (and its zmq threads) from a failed constructor
                transport.close()
            if hasattr(self, "_metrics"):
                self._metrics.close()
            raise

    def _init_rest(self, cfg: TierConfig, pool: BlockPool, layout: str) -> None:
        self.instance = cfg.instance or secrets.token_hex(6)
        self._peer_policy = PeerPolicy.from_entries(cfg.allowed_peers)
        self.plane: DataPlane = make_plane(cfg.data_plane, transport=self.transport, pool=pool, config=cfg, layout=layout)
        self.local_hello = HelloInput(
            PROTOCOL_VERSION, pool.block_bytes, layout, cfg.hash_seed,
            data_plane=self.plane.name, digest=cfg.integrity,
        )
        self.core = TierCore(CoreSettings.from_config(cfg), self.local_hello, gen_base=secrets.randbits(62))
        self._decoder = Decoder(
            limits=WireLimits(max_message_bytes=cfg.max_message_bytes, max_blocks_per_fetch=cfg.max_blocks_per_fetch),
            block_bytes=pool.block_bytes,
        )
        self._requests: dict[str, TransferParams] = {}
        self._jobs: dict[int, _Job] = {}
        self._results: list[JobResult] = []
        # ids of the results in _results: a job is outstanding until get_finished_jobs hands its
        # result over, so its id cannot be submitted again before then (exactly one result per id)
        self._reported: set[int] = set()
        self._next_ping: dict[str, float] = {}
        # the block_data being processed: its digests and payload frames (LandBlocks reads them)
        self._landing: tuple[list[int], list[memoryview]] = ([], [])
        self._revoking: dict[str, list[tuple[str, int]]] = {}  # peer -> loads waiting for Revoked
        self._t_empty = self.clock()  # when the inbound queue was last seen empty
        self._ratelog = _RateLimitedLog()
        self._closing = False  # shutdown() began: no new work
        self._peer_names: dict[str, str] = {}  # peer id -> "address instance <hex>" for log lines
        self._posted: dict[tuple[str, int], float] = {}  # transfer -> when it was handed to the plane
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._init_metrics(cfg, pool)
        if not pool.pinned:
            log.info("kvtier: block pool is pageable (no accelerator): transfers still work, without DMA pinning")
        if cfg.background_poll:
            self._thread = threading.Thread(target=self._poll_loop, name="kvtier-poll", daemon=True)
            self._thread.start()

    # -- metrics ---------------------------------------------------------------------------------
    def _init_metrics(self, cfg: TierConfig, pool: BlockPool) -> None:
        self._metrics = TierMetrics(tier=cfg.type, listener=self.transport.address, core=self.core,
                                    lock=self._lock, clock=self.clock, block_bytes=pool.block_bytes)
        if cfg.metrics_port is not None:
            try:
                self._metrics.serve(cfg.host, cfg.metrics_port)
            except OSError as exc:
                raise TransportError(
                    f"metrics_port={cfg.metrics_port}: cannot serve metrics on {cfg.host}: {exc}") from exc
            log.info("kvtier: metrics on http://%s/metrics", self._metrics.address)
        # the callbacks capture the core and the job table, never the manager: an engine may keep
        # the registry after shutdown, and it must not keep the block pool (its memory) alive
        core, jobs, bb = self.core, self._jobs, pool.block_bytes
        self._metrics.watch_quarantined("producer", lambda: _quarantined(core, jobs, bb)[1])
        self._metrics.watch_quarantined(
            "consumer",
            lambda: sum(len(r.slots) for r in core.consumer.records.values() if r.state is ConsumerState.REVOKING),
        )
        self._metrics.watch_awaiting_receipt(
            lambda: sum(len(r.jobs) for r in core.producer.records.values()
                        if r.state in (ProducerState.SERVING, ProducerState.DELIVERING))
        )

    @property
    def metrics(self) -> CollectorRegistry:
        """This manager's Prometheus registry (its series: docs/metrics.md)."""
        return self._metrics.registry

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` of the metrics endpoint (config ``metrics_port``), or ``None`` when off."""
        return self._metrics.address

    def stats(self) -> dict[str, Any]:
        """A snapshot of every series for humans and the demo (not a stable API): keys are
        ``name{label=value,...}`` without the per-manager ``tier``/``listener`` labels."""
        with self._lock:
            return self._metrics.samples()

    # -- properties ------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``host:port`` this manager listens on (give it to consumers as remote_host/port)."""
        return self.transport.address

    @property
    def host(self) -> str:
        return self.transport.address.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.transport.address.rpartition(":")[2])

    def set_hash_seed(self, hash_seed: str) -> None:
        """Set the block-hash seed our handshakes advertise and require from peers.

        For engines that know their seed only after the tier is built (vLLM runs
        ``init_none_hash`` after constructing its scheduler).  Sessions already established keep
        the seed they were checked with; every later handshake uses the new one.

        Raises:
            kvtier.config.TierConfigError: ``hash_seed`` is not a valid ``hash_seed`` value.
        """
        with self._lock:
            self.config = attrs.evolve(self.config, hash_seed=hash_seed)
            self.local_hello = attrs.evolve(self.local_hello, hash_seed=self.config.hash_seed)
            self.core.sessions.local = self.local_hello

    # -- engine API ------------------------------------------------------------------------------
    def on_new_request(self, req: RequestContext) -> str:
        """Register a request; returns its role: ``"producer"``, ``"consumer"`` or ``"local"``.

        A consumer request opens (or reuses) the session to its producer.
        Raises ValueError for malformed ``kv_transfer_params`` (the message names the field).
        """
        _check_req(req, "on_new_request")
        with self._lock:
            self._check_open()
            try:
                info = parse_params(req.kv_transfer_params, self._peer_policy)
            except PeerNotAllowed as exc:
                # No socket, no state: the request recomputes (lookup MISS; a load fails).
                self._metrics.rejected_peer()
                self._plog("", "peer_not_allowed", "kvtier: request %s: refusing to dial %s (not in allowed_peers)",
                           clip(req.req_id), clip(exc.endpoint))
                info = TransferParams("refused")
            except ValueError as exc:
                raise ValueError(f"request {clip(req.req_id)}: {exc}") from None
            if info.role == "refused":
                self._requests[req.req_id] = info
                return "local"
            prev = self._requests.get(req.req_id)
            if prev is not None:
                if prev != info:
                    raise ValueError(f"request {req.req_id!r} announced twice with different kv_transfer_params")
                return info.role
            if info.role == "consumer":
                if self.core.consumer.state_of(info.kv_request_id) is not ConsumerState.ABSENT:
                    # an earlier request's load of this id is still winding down (abort in flight)
                    raise ValueError(
                        f"request {req.req_id!r}: kv_request_id {info.kv_request_id!r} is still in use by an "
                        "earlier request on this consumer"
                    )
                self._requests[req.req_id] = info
                self._run(self.core.announce(info.kv_request_id, info.peer, self.clock()))
            else:
                self._requests[req.req_id] = info
                if info.role == "producer" and info.consumer is not None:
                    self.core.producer_announce(info.kv_request_id, info.consumer)
            return info.role

    def lookup(self, key: bytes, req: RequestContext) -> LookupResult:
        """HIT if ``key`` can be loaded for ``req`` from its remote producer; MISS otherwise
        (including after the id's load failed, so the engine recomputes, and once :meth:`shutdown`
        began, when a new load would raise)."""
        _check_req(req, "lookup")
        with self._lock:
            info = self._requests.get(req.req_id)
            if info is None or info.role != "consumer" or self._closed or self._closing:
                return LookupResult.MISS  # (shutting down: a load submitted now would raise)
            return LookupResult.MISS if self.core.load_failed(info.kv_request_id) else LookupResult.HIT

    def submit_store(self, job: TransferJob) -> None:
        """Park ``job``'s blocks for the request's remote decoder (or report success at once for a
        local-only request).  The engine must keep the blocks unchanged until the job result: it
        comes only once the consumer confirmed receipt (success) or the id ended, and never while
        the data plane may still read the blocks.  A digest of each block is taken here (config
        ``integrity``), so bytes changed later can never reach a consumer as a success.

        Raises:
            UnknownRequest: the request was never passed to :meth:`on_new_request`.
            DuplicateJob: ``job.job_id`` is outstanding (submitted, and its result not yet handed over
                by :meth:`get_finished_jobs`).
            ValueError: keys/slots lengths differ, duplicate keys, or a slot outside the pool.
        """
        with self._lock:
            self._check_open()
            info = self._job_request(job)
            self._check_job(job)
            now = self.clock()
            if info.role != "producer":
                self._report(JobResult(job_id=job.job_id, success=True))
                self._metrics.job_done("store", True, "local")
                return
            digests = block_digests([self.pool.buffer(b) for b in job.slots], self.config.integrity)
            inp = StoreInput(info.kv_request_id, job.req.req_id, job.job_id, tuple(job.keys), tuple(job.slots), digests,
                             consumer=info.consumer)
            self._metrics.parked(info.kv_request_id, now)  # before the store: the first one starts the age
            effects = self.core.store(inp, now)
            # registered after the core accepted the input, before its effects (which may report it)
            self._jobs[job.job_id] = _Job("store", info.kv_request_id, now, len(job.slots) * self.pool.block_bytes)
            self._run(effects)

    def submit_load(self, job: TransferJob) -> None:
        """Fetch ``job.keys`` from the request's producer into pool slots ``job.slots``.

        Raises:
            UnknownRequest: the request was never announced, or is not a consumer request.
            DuplicateJob: ``job.job_id`` is outstanding (submitted, and its result not yet handed over
                by :meth:`get_finished_jobs`).
            ValueError: keys/slots lengths differ, duplicate keys, or a slot outside the pool.
        """
        with self._lock:
            self._check_open()
            info = self._job_request(job)
            if info.role == "refused":  # its producer is not in allowed_peers: nothing to load
                self._check_job(job)
                self._report(JobResult(job_id=job.job_id, success=False, reason="peer_not_allowed"))
                self._metrics.job_done("load", False, "peer_not_allowed")
                return
            if info.role != "consumer":
                raise UnknownRequest(
                    f"submit_load job {job.job_id}: request {job.req.req_id!r} has no remote_prefiller params"
                )
            self._check_job(job)
            now = self.clock()
            self._check_fetch_size(job)
            inp = LoadInput(info.kv_request_id, job.job_id, tuple(job.keys), tuple(job.slots))
            try:
                effects = self.core.submit_load(inp, now)
            except InvalidTransition as exc:
                raise UnknownRequest(f"submit_load job {job.job_id}: {exc}") from exc
            self._jobs[job.job_id] = _Job("load", info.kv_request_id, now, len(job.slots) * self.pool.block_bytes)
            self._run(effects)

    def get_finished_jobs(self) -> list[JobResult]:
        """Hand over every job result produced since the last call; when there is none yet,
        poll once first (results already produced go out without another network poll: a poll
        costs tens of µs, issue 11 item 6)."""
        with self._lock:
            if not self._closed and not self._results:
                self._poll_once()
            out, self._results = self._results, []
            self._reported.clear()
            return out

    def on_request_finished(self, req: RequestContext) -> None:
        """The engine is done with ``req``. Producer: blocks not yet fetched wait for a fetch or
        the reap (an unmet bound fetch fails at once). Consumer: an unfinished load is aborted and
        its job fails with reason ``cancelled``."""
        _check_req(req, "on_request_finished")
        with self._lock:
            info = self._requests.pop(req.req_id, None)
            if info is None or self._closed:
                return
            now = self.clock()
            if info.role == "producer":
                self._run(self.core.producer_finished(info.kv_request_id, now))
            elif info.role == "consumer":
                self._run(self.core.consumer_finished(info.kv_request_id, now))

    def has_pending_work(self) -> bool:
        """True while any job lacks a result, a transfer is in flight or sends are queued."""
        with self._lock:
            return bool(self._jobs or self._results) or (
                not self._closed and (self.plane.referenced() > 0 or self.transport.pending_sends() > 0)
            )

    def drain_jobs(self, timeout_s: float | None = None) -> None:
        """Return once every submitted job has a result (collect them with get_finished_jobs).

        Parked and awaiting producer ids are ended at once (jobs fail with reason ``drained``);
        transfers and loads in flight finish or hit their deadlines, so this terminates.
        Raises TimeoutError if ``timeout_s`` (wall seconds) passes first.
        """
        start = time.monotonic()
        with self._lock:
            self._check_open()
            self._run(self.core.drain(self.clock()))
        while True:
            with self._lock:
                self._poll_once()
                if not self._jobs:
                    return
                wait = self._wait_budget()
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"drain_jobs: {len(self._jobs)} jobs still outstanding after {timeout_s} s")
            self._idle_wait(min(wait, 0.01))

    def poll(self, timeout_s: float = 0.0) -> None:
        """Wait up to ``timeout_s`` seconds for network input, then process everything due."""
        if timeout_s > 0:
            self._idle_wait(timeout_s)
        with self._lock:
            if not self._closed:
                self._poll_once()

    def _idle_wait(self, seconds: float) -> None:
        """Block up to ``seconds`` for network input.

        libzmq sockets are not thread-safe, so every transport call — a wait included — happens
        under the manager lock.  With ``background_poll`` the poll thread does the waiting; any
        other caller just sleeps (the poll thread handles the input meanwhile)."""
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._stop.wait(seconds)
            return
        with self._lock:
            if not self._closed:
                self.transport.wait(min(seconds, self._wait_budget()))

    def shutdown(self, grace_s: float | None = None) -> None:
        """Shut down gracefully within ``grace_s`` seconds (default: config ``shutdown_grace_s``).

        1. No new work: ``on_new_request``, ``submit_store`` and ``submit_load`` raise
           ``RuntimeError`` from now on.  Parked and awaiting ids end (their jobs fail
           ``shutdown``; a bound consumer is told, with its session's generation); queued loads
           fail; a fetch for an unknown id is refused ``shutdown``.
        2. Transfers and loads in flight get the grace to finish (they may still succeed).
        3. Whatever is still live is given up, every peer gets a goodbye, and the transport is
           closed after letting queued messages flush for what is left of the grace.
        4. Closing the transport drops every reference the data plane held, so the store jobs of
           transfers given up in step 3 are reported (failed) only then — never while a send may
           still read their blocks (B21).
        Every job gets exactly one result (collect them with :meth:`get_finished_jobs`).  Returns
        within the grace plus a few milliseconds, even when a peer is wedged.  Idempotent.
        """
        start = time.monotonic()
        grace = self.config.shutdown_grace_s if grace_s is None else max(0.0, float(grace_s))
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
            self._thread = None
        with self._lock:
            if self._closed or self._closing:
                return
            self._closing = True
            self._run(self.core.shutdown(self.clock()))
            self.transport.flush()
        # leave a slice of the grace for the goodbyes to flush
        work_until = start + 0.8 * grace
        while time.monotonic() < work_until:
            with self._lock:
                self._poll_once()
                if not self.core.busy():
                    break
            self._idle_wait(min(0.005, max(0.0, work_until - time.monotonic())))
        with self._lock:
            try:
                self._run(self.core.close(self.clock()))
                self.transport.flush()
            finally:
                self._closed = True
                linger = max(0.05, grace - (time.monotonic() - start))
                self.transport.close(linger_s=linger)
                self._finish_plane()
        # outside the lock: a scrape in progress waits for that lock
        self._metrics.close()

    def _finish_plane(self) -> None:
        """After the transport closed: the plane holds nothing any more; report its releases so
        the last store jobs get their result, then fail anything the core still holds."""
        now = self.clock()
        for r in self.plane.close():
            self._run(self._released(r, now) if isinstance(r, Released) else self._revoked(r, now))
        for job_id in list(self._jobs):  # nothing should remain; never leave a job without a result
            log.error("kvtier: job %d had no result at shutdown; failing it", job_id)
            self._finish_job(job_id, False, "shutdown")

    # -- helpers: API checks ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise RuntimeError("kvtier manager is shut down" if self._closed else "kvtier manager is shutting down")

    def _job_request(self, job: TransferJob) -> TransferParams:
        if not isinstance(job, TransferJob):
            raise TypeError(f"expected a kvtier.api.TransferJob, got {type(job).__name__}")
        if not isinstance(job.req, RequestContext):
            raise TypeError(f"job {job.job_id!r:.40}: req must be a RequestContext, got {type(job.req).__name__}")
        info = self._requests.get(job.req.req_id)
        if info is None:
            raise UnknownRequest(
                f"job {job.job_id}: request {job.req.req_id!r} was never announced with on_new_request"
            )
        return info

    def _check_job(self, job: TransferJob) -> None:
        if isinstance(job.job_id, bool) or not isinstance(job.job_id, int) or job.job_id < 0:
            raise ValueError(f"job_id must be a non-negative int, got {job.job_id!r:.40}")
        if job.job_id in self._jobs:
            raise DuplicateJob(f"job {job.job_id} is already outstanding")
        if job.job_id in self._reported:
            raise DuplicateJob(f"job {job.job_id} is already outstanding (its result has not been collected yet)")
        for name in ("keys", "slots"):  # sized and re-iterable: a generator would be consumed by the checks
            if not isinstance(getattr(job, name), (tuple, list)):
                raise TypeError(f"job {job.job_id}: {name} must be a tuple or list, got {type(getattr(job, name)).__name__}")
        if len(job.keys) != len(job.slots):
            raise ValueError(f"job {job.job_id}: {len(job.keys)} keys but {len(job.slots)} slots")
        if len(set(job.keys)) != len(job.keys):
            raise ValueError(f"job {job.job_id}: duplicate keys")
        if len(set(job.slots)) != len(job.slots):
            raise ValueError(f"job {job.job_id}: duplicate slots (two blocks cannot share a slot)")
        if len(job.keys) > self.config.max_blocks_per_fetch:
            raise ValueError(f"job {job.job_id}: {len(job.keys)} blocks > max_blocks_per_fetch")
        n = self.pool.num_blocks
        for s in job.slots:
            if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < n:
                raise ValueError(f"job {job.job_id}: slot {s!r} is outside the pool (0..{n - 1})")
        for k in job.keys:
            if not isinstance(k, bytes) or not 0 < len(k) <= 256:
                raise ValueError(f"job {job.job_id}: keys must be 1..256 bytes, got {k!r:.40}")

    def _check_fetch_size(self, job: TransferJob) -> None:
        # the fetch header must fit the producer's max_message_bytes (assumed equal to ours);
        # msgpack: ~3 bytes of framing per key plus the fixed fields
        size = 256 + sum(len(k) + 3 for k in job.keys)
        if size > self.config.max_message_bytes:
            raise ValueError(
                f"job {job.job_id}: a fetch of {len(job.keys)} keys ({size} bytes) exceeds max_message_bytes="
                f"{self.config.max_message_bytes} (a fetch is one message); raise max_message_bytes on both sides"
            )

    # -- the poll loop ---------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        # Holds the lock while waiting on the sockets (at most poll_interval_s), as vLLM's own
        # tier-poll thread does; the short sleep between rounds lets engine calls in.
        interval = self.config.poll_interval_s
        while not self._stop.is_set():
            try:
                with self._lock:
                    if self._closed:
                        return
                    self.transport.wait(min(interval, self._wait_budget()))
                    self._poll_once()
            except Exception:  # never let the thread die silently
                self._metrics.internal_error()
                log.exception("kvtier: poll thread error")
                self._stop.wait(interval)
            time.sleep(0)  # yield the GIL so a thread blocked on the lock gets in

    def _wait_budget(self) -> float:
        nd = self.core.next_deadline()
        now = self.clock()
        budget = 0.05
        if nd is not None:
            budget = min(budget, max(0.0, nd - now))
        # e.g. a UCX tcp target must progress WRITEs into it, but only while a load is out
        plane = self.plane.max_wait_s(receiving=bool(self.core.consumer.by_peer))
        return budget if plane is None else min(budget, plane)

    def _poll_once(self) -> None:
        """Inbound first, then data-plane reports, heartbeats, and the deadlines that fell due
        before the inbound queue was last seen empty (``input_before_deadline``)."""
        t_empty = self._drain_inbound()
        now = self.clock()
        for r in self.plane.poll():
            self._run(self._released(r, now) if isinstance(r, Released) else self._revoked(r, now))
        self._heartbeats(now)
        due = self.core.next_deadline()
        if due is not None and due <= t_empty:
            self._metrics.tick_lag(now - due)
        self._run(self.core.tick(t_empty))
        self._report_quarantine(now)
        self.transport.flush()

    def _drain_inbound(self) -> float:
        """Apply inbound messages and transport events until the queue is seen empty or
        ``RECV_BUDGET`` messages were applied.  Returns the time the queue was last seen empty:
        every message that arrived before it has been applied."""
        applied = 0
        while True:
            t0 = self.clock()
            batch = self.transport.recv(RECV_BATCH)
            for peer, frames in batch:
                try:
                    self._receive(peer, frames)
                except Exception:
                    self._metrics.internal_error()
                    log.exception("kvtier: error while handling a message from %s", self._who(peer))
            for ev in self.transport.events():
                if ev.reason != CloseReason.DROPPED:  # our own drop: its session already ended
                    self._run(self.core.connection_closed(ev.peer, self.clock()))
            applied += len(batch)
            if len(batch) < RECV_BATCH:  # every socket was read to empty after t0
                self._t_empty = max(self._t_empty, t0)
                return self._t_empty
            if applied >= RECV_BUDGET:
                return self._t_empty

    def _released(self, r: Released, now: float) -> list[fx.Effect]:
        posted = self._posted.pop((r.kv_request_id, r.round), now)
        if not r.failed:
            self._metrics.transfer("producer", r.nbytes, now - posted)
        if r.failed:
            log.debug("kvtier: transfer %s round %d failed in the data plane: %s", r.kv_request_id, r.round, r.detail)
            return self.core.transfer_failed(r.kv_request_id, r.round, now)
        return self.core.transfer_released(r.kv_request_id, r.round, now)

    def _revoked(self, r: Revoked, now: float) -> list[fx.Effect]:
        out: list[fx.Effect] = []
        for kid, rnd in self._revoking.pop(r.peer, ()):
            out.extend(self.core.access_revoked(r.peer, kid, rnd, now))
        return out

    def _report_quarantine(self, now: float) -> None:
        """Blocks held back from the engine because the plane never released them: say so, loudly
        and rate-limited (the gauge ``kvtier_quarantined_blocks`` counts them)."""
        if not self.core.producer.quarantined:  # O(1): this runs on every poll
            return
        ids, blocks = self.quarantined()
        self._plog("*", "quarantined",
                   "kvtier: %d ids (%d blocks) quarantined: the data plane has not released them; their store "
                   "jobs stay outstanding so the engine cannot reuse blocks a send may still read", ids, blocks)

    def quarantined(self) -> tuple[int, int]:
        """(ids, store-job blocks) held in ``quarantined``: the data plane never confirmed their
        release, so their jobs stay outstanding (architecture decision 11)."""
        with self._lock:
            return _quarantined(self.core, self._jobs, self.pool.block_bytes)

    def _heartbeats(self, now: float) -> None:
        interval = self.config.heartbeat_interval_s
        for peer, rec in list(self.core.sessions.records.items()):
            if rec.state is not SessionState.READY or not rec.dialled:
                continue
            due = self._next_ping.get(peer, 0.0)
            if now >= due:
                self._next_ping[peer] = now + interval
                self._send(peer, wm.Ping(gen=rec.gen, t=now))
        if len(self._next_ping) > len(self.core.sessions.records) + 64:
            self._next_ping = {p: t for p, t in self._next_ping.items() if p in self.core.sessions.records}

    # -- inbound ---------------------------------------------------------------------------------
    def _receive(self, peer: str, frames: list[Any]) -> None:
        now = self.clock()
        try:
            msg, payloads = self._decoder.decode(frames)
        except WireError as err:
            self._metrics.wire_error(err.reason)
            if err.reason == "version_mismatch" and err.msg_type == "hello" and err.gen is not None:
                # answer a hello from another protocol version as a handshake mismatch, at once
                self._plog(peer, err.reason, "kvtier: %s speaks protocol version %s, we speak %s",
                           self._who(peer), err.theirs, PROTOCOL_VERSION, level=logging.ERROR)
                self._send(peer, wm.HelloReject(gen=err.gen, reason="handshake_mismatch", field="version",
                                                ours=str(PROTOCOL_VERSION), theirs=err.theirs or "?"))
                return
            logged = self._plog(peer, err.reason, "kvtier: bad message from %s: %s", self._who(peer), err)
            if err.kv_request_id or logged:
                # a reply that names an id lets the sender fail just that request at once; other
                # replies are as rate-limited as the log
                gen = self._gen(peer)
                self._send(peer, wm.Error(gen=gen, reason=err.reason, detail=err.detail,
                                          kv_request_id=err.kv_request_id))
            return
        core = self.core
        t = type(msg)
        if t is wm.BlockData:
            effects = core.block_data(peer, msg.gen, MessageInput(msg.kv_request_id, msg.round, msg.first, msg.count), now)
            self._landing = (msg.digests, payloads)
            try:
                self._run(effects)
            finally:
                self._landing = ([], [])
        elif t is wm.Fetch:
            inp = FetchInput(peer, msg.kv_request_id, msg.round, tuple(msg.keys), slots=tuple(msg.slots))
            self._run(core.fetch(peer, msg.gen, inp, now))
        elif t is wm.Receipt:
            self._run(core.receipt(peer, msg.gen, FetchInput(peer, msg.kv_request_id, msg.round), now))
        elif t is wm.TransferDone:
            inp = MessageInput(msg.kv_request_id, msg.round, ok=msg.ok, reason=(msg.reason or None) if not msg.ok else None)
            self._run(core.transfer_done(peer, msg.gen, inp, now))
        elif t is wm.AbortFetch:
            inp = FetchInput(peer, msg.kv_request_id, msg.round, fetched=msg.fetched)
            self._run(core.abort_fetch(peer, msg.gen, inp, now))
        elif t is wm.AbortAck:
            self._run(core.abort_ack(peer, msg.gen, MessageInput(msg.kv_request_id, msg.round), now))
        elif t is wm.Ping:
            self._run(core.ping(peer, msg.gen, now))
            if core.session_ready(peer):
                self._send(peer, wm.Pong(gen=msg.gen, t=msg.t))
        elif t is wm.Pong:
            self._run(core.ping(peer, msg.gen, now))
        elif t is wm.Hello:
            self._name_peer(peer, msg.instance)
            info = self.transport.peer_info(peer)
            hello = HelloInput(msg.version, msg.block_bytes, msg.layout, msg.hash_seed, gen=msg.gen,
                               data_plane=msg.data_plane, digest=msg.digest, instance=msg.instance,
                               principal=(info.principal if info is not None else None) or msg.instance)
            # a hello the core refuses (a field differs) gets no plane entry: the core names the field
            if self.local_hello.first_mismatch(hello) or self._plane_peer(peer, msg.gen, msg.descriptor):
                self._run(core.hello(peer, hello, now))
        elif t is wm.HelloAck:
            self._name_peer(peer, msg.instance)
            rec = self.core.sessions.records.get(peer)
            accepted = rec is not None and rec.gen == msg.gen and rec.state is SessionState.HANDSHAKING
            if self._plane_peer(peer, msg.gen, msg.descriptor, accepted):
                self._run(core.hello_ack(peer, msg.gen, now, msg.instance))
        elif t is wm.HelloReject:
            if msg.field == "max_peers":
                self._plog(peer, "hello_reject", "kvtier: %s refused the session: it already has "
                           "max_peers=%s sessions", self._who(peer), msg.ours, level=logging.ERROR)
            else:
                self._plog(peer, "hello_reject", "kvtier: %s rejected our hello: %s differs (ours %s, "
                           "theirs %s)", self._who(peer), msg.field, msg.theirs, msg.ours or "(withheld)",
                           level=logging.ERROR)
            self._run(core.hello_reject(peer, msg.gen, now, msg.reason))
        elif t is wm.Disconnect:
            self._run(core.disconnect(peer, msg.gen, now, msg.reason))
        elif t is wm.Error:
            self._metrics.wire_error(msg.reason, reported_by_peer=True)
            self._plog(peer, "peer_error", "kvtier: %s reports an error: %.64s %.200s", self._who(peer),
                       msg.reason, msg.detail)
            if msg.kv_request_id:
                self._run(core.peer_error(peer, msg.gen, msg.kv_request_id, now))

    def _plane_peer(self, peer: str, gen: int, descriptor: bytes, accepted: bool = False) -> bool:
        """Give the data plane the peer's descriptor before the handshake can complete. A
        descriptor our plane cannot use is a handshake mismatch, answered at once."""
        try:
            self.plane.add_peer(peer, descriptor, accepted=accepted)
        except PlaneError as exc:
            self._metrics.wire_error("bad_field")
            log.error("kvtier: %s sent a data-plane descriptor we cannot use: %s", peer, exc)
            self._send(peer, wm.HelloReject(gen=gen, reason="handshake_mismatch", field="descriptor", ours="", theirs=""))
            self._run(self.core.hello_reject(peer, gen, self.clock()))
            return False
        return True

    # -- effects ---------------------------------------------------------------------------------
    def _run(self, effects: list[fx.Effect]) -> None:
        """Perform effects in order; effects that produce more inputs (send failures) append."""
        queue = deque(effects)
        while queue:
            e = queue.popleft()
            more = self._perform(e)
            if more:
                queue.extend(more)

    def _send(self, peer: str, msg: Any, payloads: list[Any] | tuple = (), *, track: bool = False) -> SendHandle:
        return self.transport.send(peer, encode_frames(msg, payloads), track=track)

    def _plog(self, peer: str, reason: str, msg: str, *args: Any, level: int = logging.WARNING) -> bool:
        """Log about ``peer``, at most once per (peer, reason) per 10 s; returns whether it logged."""
        return self._ratelog(self.clock(), peer, reason, msg, *args, level=level)

    def _where(self, peer: str) -> str:
        """``host:port`` of a peer we dialled, the IP of one that dialled us (or ``""``)."""
        return getattr(self.transport, "peer_address", lambda p: p)(peer)

    def _who(self, peer: str) -> str:
        """``peer`` for a log line: its address and instance once its hello named them (an inbound
        ``in:<hex>`` routing id alone means nothing to an operator)."""
        return self._peer_names.get(peer) or self._name_peer(peer, "")

    def _name_peer(self, peer: str, instance: str) -> str:
        where = self._where(peer) or "unknown address"
        name = where if where == peer else f"{where} ({peer})"
        if instance:
            name += f" instance {instance}"
            if len(self._peer_names) > 2 * self.config.max_peers + 64:
                live = self.core.sessions.records
                self._peer_names = {p: n for p, n in self._peer_names.items() if p in live}
            self._peer_names[peer] = name
        return name

    def _gen(self, peer: str) -> int:
        """The generation our messages to ``peer`` carry (0 when there is no session)."""
        return self.core.session_gen(peer) or 0

    def _send_ctl(self, peer: str, msg: Any) -> list[fx.Effect] | None:
        handle = self._send(peer, msg)
        if handle.failed:
            return self.core.send_failed(peer, self.clock())
        return None

    def _perform(self, e: fx.Effect) -> list[fx.Effect] | None:
        t = type(e)
        if t is fx.JobDone:
            self._finish_job(e.job_id, e.ok, e.reason)
        elif t is fx.LandBlocks:
            return self._land(e)
        elif t is fx.SendBlocks:
            self._post(e)
        elif t is fx.CancelTransfer:
            self.plane.cancel(e.kv_request_id, e.round)
        elif t is fx.RevokeAccess:
            if self.plane.revoke(e.peer):
                return self.core.access_revoked(e.peer, e.kv_request_id, e.round, self.clock())
            self._revoking.setdefault(e.peer, []).append((e.kv_request_id, e.round))
        elif t is fx.SendTransferDone:
            if not e.ok:
                self._metrics.fetch_refused(e.reason)
            return self._send_ctl(e.peer, wm.TransferDone(
                gen=e.gen, kv_request_id=e.kv_request_id, round=e.round, ok=e.ok, reason=e.reason or ""))
        elif t is fx.SendAbortAck:
            return self._send_ctl(e.peer, wm.AbortAck(gen=e.gen, kv_request_id=e.kv_request_id, round=e.round))
        elif t is fx.SendFetch:
            slots = list(e.slots) if self.plane.one_sided else []
            return self._send_ctl(e.peer, wm.Fetch(
                gen=e.gen, kv_request_id=e.kv_request_id, round=e.round, keys=list(e.keys), slots=slots))
        elif t is fx.SendAbortFetch:
            return self._send_ctl(e.peer, wm.AbortFetch(
                gen=e.gen, kv_request_id=e.kv_request_id, round=e.round, fetched=e.fetched))
        elif t is fx.SendReceipt:
            return self._send_ctl(e.peer, wm.Receipt(gen=e.gen, kv_request_id=e.kv_request_id, round=e.round))
        elif t is fx.OpenConnection:
            try:
                self.transport.connect(e.peer)
            except (TransportError, ValueError) as exc:
                self._plog(e.peer, "connect", "kvtier: cannot connect to %s: %s", e.peer, exc)
                return self.core.send_failed(e.peer, self.clock())
            return self.core.transport_up(e.peer, self.clock())
        elif t is fx.SendHello:
            h = self.local_hello
            return self._send_ctl(e.peer, wm.Hello(
                gen=e.gen, version=h.version, instance=self.instance, block_bytes=h.block_bytes,
                layout=h.layout, hash_seed=h.hash_seed, data_plane=h.data_plane, digest=h.digest,
                descriptor=self.plane.descriptor()))
        elif t is fx.SendHelloAck:
            self._send(e.peer, wm.HelloAck(gen=e.gen, instance=self.instance, descriptor=self.plane.descriptor()))
        elif t is fx.SendHelloReject:
            self._metrics.session_ended(e.reason)
            if e.field == "max_peers":
                self._plog(e.peer, e.reason, "kvtier: refusing a session from %s: max_peers=%s reached",
                           self._who(e.peer), e.ours)
            else:
                self._plog(e.peer, e.reason, "kvtier: rejecting hello from %s: %s differs (ours %s, theirs %s)",
                           self._who(e.peer), e.field, e.ours or "(withheld)", e.theirs, level=logging.ERROR)
            self._peer_names.pop(e.peer, None)
            self._send(e.peer, wm.HelloReject(gen=e.gen, reason=e.reason, field=e.field, ours=e.ours, theirs=e.theirs))
        elif t is fx.SendDisconnect:
            self._send(e.peer, wm.Disconnect(gen=e.gen, reason=e.reason))
        elif t is fx.CloseConnection:
            self.transport.drop_peer(e.peer)
            self._next_ping.pop(e.peer, None)
        elif t is fx.PeerDown:
            self._metrics.session_ended(e.reason)
            if not self.core.session_ready(e.peer):  # else a restart's new session already took it
                self.plane.remove_peer(e.peer)
            # a goodbye (ours or the peer's) is routine; every other ending is a fault
            level = logging.INFO if e.reason in ("shutdown", "peer_disconnected") else logging.WARNING
            self._plog(e.peer, e.reason, "kvtier: session with %s ended: %s", self._who(e.peer), e.reason,
                       level=level)
            self._peer_names.pop(e.peer, None)
        elif t is fx.Ignored:
            self._metrics.ignored(e.machine, e.reason)
        else:  # pragma: no cover - a new effect type without a performer is a bug
            raise TypeError(f"no performer for effect {e!r}")
        return None

    def _post(self, e: fx.SendBlocks) -> None:
        """Cut the transfer into block_data batches (≤ ``MAX_BATCH_BYTES`` each) for the plane."""
        per = max(1, MAX_BATCH_BYTES // self.pool.block_bytes)
        one_sided = self.plane.one_sided
        batches = []
        for first in range(0, len(e.blocks), per):
            blocks = e.blocks[first : first + per]
            header = encode(wm.BlockData(
                gen=e.gen, kv_request_id=e.kv_request_id, round=e.round, first=first, count=len(blocks),
                digests=list(e.digests[first : first + per])))
            batches.append(Batch(first, blocks, e.slots[first : first + per] if one_sided else (), header))
        self._posted[(e.kv_request_id, e.round)] = self.clock()
        self.plane.post(e.peer, e.kv_request_id, e.round, batches)

    def _land(self, e: fx.LandBlocks) -> list[fx.Effect]:
        """Land one block_data's blocks and check each against its parked digest."""
        digests, payloads = self._landing
        try:
            self.plane.land(e.slots, payloads)
        except PlaneError as exc:
            self._metrics.wire_error("bad_payload")
            self._plog(e.peer, "bad_payload", "kvtier: bad block_data from %s: %s", self._who(e.peer), exc)
            bad = 0
        else:
            pool = self.pool
            bad = check_blocks([pool.buffer(s) for s in e.slots], digests, self.config.integrity)
        if bad < 0:
            self._metrics.landed(len(e.slots) * self.pool.block_bytes)
        else:
            self._plog(e.peer, "corrupt",
                       "kvtier: block %d of %s round %d from %s does not match its parked digest; the load fails",
                       e.first + bad, e.kv_request_id, e.round, self._who(e.peer))
        inp = MessageInput(e.kv_request_id, e.round, e.first, e.count, ok=bad < 0, reason=None if bad < 0 else "corrupt")
        return self.core.blocks_landed(e.peer, inp, self.clock())

    def _finish_job(self, job_id: int, ok: bool, reason: str | None) -> None:
        job = self._jobs.pop(job_id, None)
        if job is None:  # the core guarantees exactly once; count instead of crashing the engine
            self._metrics.internal_error()
            log.error("kvtier: duplicate or unknown job result %d dropped", job_id)
            return
        reason = None if ok else str(reason or "failed")
        self._metrics.job_done(job.kind, ok, reason)
        if ok and job.kind == "load":
            elapsed = self.clock() - job.submitted
            self._metrics.transfer("consumer", job.nbytes, elapsed)
            res = JobResult(job_id=job_id, success=True, transfer_bytes=job.nbytes, transfer_time_s=elapsed)
        else:
            res = JobResult(job_id=job_id, success=ok, reason=reason)
        self._report(res)

    def _report(self, res: JobResult) -> None:
        self._results.append(res)
        self._reported.add(res.job_id)
