"""``KvTierManager``: the engine-facing façade over the I/O shell (:mod:`kvtier.shell`).

It checks each engine call's arguments, turns the call into a core input
(:mod:`kvtier.lifecycle.inputs`) and hands it to the shell's :class:`~kvtier.shell.loop.Loop`,
which applies it and performs what the core decides.  It makes no lifecycle decision of its own.

Threading: every public method takes one re-entrant lock, so the manager may be driven from the
engine thread alone (call :meth:`poll` or :meth:`get_finished_jobs` regularly), or with
``background_poll=True`` from an internal daemon thread as well (it polls every
``poll_interval_s`` and takes the same lock); both are safe.  The API mirrors vLLM 0.33.0's
``SecondaryTierManager`` (``on_new_request``, ``lookup``, ``submit_store``, ``submit_load``,
``get_finished_jobs``, ``on_request_finished``, ``has_pending_work``, ``drain_jobs``,
``shutdown``, and for the symmetric path ``on_schedule_end`` and ``serve_external_requests``).

Nothing a peer sends can raise out of :meth:`poll`: malformed messages are counted, answered
(rate-limited) by the core and dropped.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import msgspec
from prometheus_client import CollectorRegistry

from kvtier.api import JobResult, LookupResult, RequestContext, TransferJob, UnknownRequest
from kvtier.blocksource import BlockSource
from kvtier.config import TierConfig
from kvtier.dataplane import DataPlane, Released, make_plane
from kvtier.explain import TierStats
from kvtier.forensics import Forensics
from kvtier.integrity import DigestPool, block_digests, default_threads
from kvtier.lifecycle import Answer, ConsumerState, InvalidTransition, ProbeState, Reason, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.driver import drive
from kvtier.memory import BlockPool
from kvtier.metrics import TierMetrics
from kvtier.params import PeerNotAllowed, PeerPolicy, TransferParams, clip, parse_params
from kvtier.shell.build import local_hello, make_core, make_transport, warn_if_serving_open
from kvtier.shell.checks import check_fetch_size, check_job, check_job_type, check_req
from kvtier.shell.inbound import Inbound
from kvtier.shell.jobs import JobLedger
from kvtier.shell.logs import RateLimitedLog
from kvtier.shell.loop import Loop, PollThread
from kvtier.shell.outbound import MAX_BATCH_BYTES, Outbound
from kvtier.shell.perbyte import ByteWork
from kvtier.transport import Transport, TransportError
from kvtier.wire.codec import Decoder, WireLimits

__all__ = ["KvTierManager", "MAX_BATCH_BYTES"]

log = logging.getLogger("kvtier.manager")

#: The least a shutdown gives its goodbyes to flush, even when a drain used the whole budget.
_MIN_GOODBYE_S = 0.05
_ANSWERS = {Answer.RETRY: LookupResult.RETRY, Answer.HIT: LookupResult.HIT, Answer.MISS: LookupResult.MISS}


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

    Raises:
        TypeError: ``config`` or ``pool`` has the wrong type.
        kvtier.config.TierConfigError: a config value is invalid (the message names the key).
        TransportError: the port cannot be bound, or ``metrics_port`` cannot be served.
        kvtier.dataplane.PlaneError: the configured data plane cannot start here.
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
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a kvtier.memory.BlockPool, got {type(pool).__name__}")
        self.pool = pool
        self.clock = clock
        self._lock = threading.RLock()
        own_transport = transport is None
        self.transport: Transport = transport if transport is not None else make_transport(self.config, pool.block_bytes)
        self._metrics: TierMetrics | None = None
        try:
            self._assemble(layout)
        except BaseException:
            if own_transport:  # never leak a bound listener (and its zmq threads) from a failed constructor
                self.transport.close()
            if self._metrics is not None:
                self._metrics.close()
            raise

    def _assemble(self, layout: str) -> None:
        cfg, pool = self.config, self.pool
        self.instance = cfg.instance or secrets.token_hex(6)
        self._peer_policy = PeerPolicy.from_entries(cfg.allowed_peers, listen_host=cfg.host)
        if self._peer_policy.open:
            log.warning(
                "kvtier: SECURITY: allowed_peers is open ('*'): a request's kv_transfer_params may make this engine "
                "dial any producer address (link-local, metadata, multicast and unspecified addresses%s excepted). "
                "List your prefill endpoints or networks in allowed_peers (docs/security.md).",
                ", and loopback," if self._peer_policy.beyond_loopback else "")
        # digests and landings that grow with bytes run here, off the thread that holds the lock
        # (decision I14); its threads start with the first large store or landing
        threads = default_threads() if cfg.digest_threads is None else cfg.digest_threads
        self._digest_pool: DigestPool | None = (
            DigestPool(threads, name=f"kvtier-digest-{self.instance}") if threads and cfg.integrity != "none" else None)
        self.plane: DataPlane = make_plane(cfg.data_plane, transport=self.transport, pool=pool, config=cfg,
                                           layout=layout, digest_pool=self._digest_pool)
        hello = local_hello(cfg, block_bytes=pool.block_bytes, layout=layout, instance=self.instance, plane=self.plane)
        self.core: TierCore = make_core(cfg, hello, one_sided=self.plane.one_sided, gen_base=secrets.randbits(62),
                                        revoke_bounded=self.plane.revocation_bounded, pool_blocks=pool.num_blocks)
        """The lifecycle core (its read API: sessions, states, quarantine, snapshots)."""
        self._jobs = JobLedger()
        self.forensics = Forensics(core=self.core, job_info=self._jobs.info, clock=self.clock,
                                   block_bytes=pool.block_bytes, where=getattr(self.transport, "peer_address", None))
        """The recently finished requests (:mod:`kvtier.forensics`; ``GET /kvtier/requests``)."""
        self._internal_jobs = 1 << 62  # ids of the manager's own jobs (above any engine's)
        self._requests: dict[str, TransferParams] = {}
        self._closing = False  # shutdown() began: no new work
        # when a drain_jobs(timeout_s) that did not finish had to be over: a shutdown() that
        # follows it shares that one budget (decision A6)
        self._drain_deadline: float | None = None
        self._closed = False
        self._metrics = TierMetrics(tier=cfg.type, listener=self.transport.address, core=self.core,
                                    lock=self._lock, clock=self.clock, block_bytes=pool.block_bytes)
        if cfg.metrics_port is not None:
            try:
                self._metrics.serve(cfg.host, cfg.metrics_port, requests=self.forensics)
            except OSError as exc:
                raise TransportError(
                    f"metrics_port={cfg.metrics_port}: cannot serve metrics on {cfg.host}: {exc} (choose a free "
                    "port, 0 for an ephemeral one, or null for no endpoint)") from exc
            log.info("kvtier: metrics on http://%s/metrics", self._metrics.address)
        where = getattr(self.transport, "peer_address", None)
        self._logs = RateLimitedLog(self.clock, where if where is not None else (lambda p: ""))
        decoder = Decoder(
            limits=WireLimits(max_message_bytes=cfg.max_message_bytes, max_blocks_per_fetch=cfg.max_blocks_per_fetch),
            block_bytes=pool.block_bytes,
        )
        self._work = ByteWork(algorithm=cfg.integrity, digest_pool=self._digest_pool, block_bytes=pool.block_bytes,
                              metrics=self._metrics, logs=self._logs)
        outbound = Outbound(transport=self.transport, plane=self.plane, pool=pool, jobs=self._jobs,
                            metrics=self._metrics, logs=self._logs, work=self._work, clock=self.clock,
                            loads=self.core.consumer,
                            vet=self._peer_policy.vet_resolved if self._peer_policy.open else None)
        outbound.forensics = self.forensics
        inbound = Inbound(transport=self.transport, plane=self.plane, decoder=decoder, metrics=self._metrics,
                          logs=self._logs, clock=self.clock, posted=outbound.posted, work=self._work)
        self._loop = Loop(core=self.core, inbound=inbound, outbound=outbound, work=self._work, clock=self.clock,
                          metrics=self._metrics, logs=self._logs)
        if not pool.pinned:
            log.info("kvtier: block pool is pageable (no accelerator): transfers still work, without DMA pinning")
        warn_if_serving_open(cfg)
        self._thread: PollThread | None = None
        if cfg.background_poll:
            self._thread = PollThread(lock=self._lock, loop=self._loop, wait=self.transport.wait,
                                      interval_s=cfg.poll_interval_s, closed=lambda: self._closed,
                                      on_error=self._metrics.internal_error)

    @property
    def digest_pool(self) -> DigestPool | None:
        """The pool that takes large stores' digests and does large landings (config
        ``digest_threads``; ``None`` with ``digest_threads=0`` or ``integrity="none"``); closed,
        its threads joined, by :meth:`shutdown` and :meth:`close_abruptly`."""
        return self._digest_pool

    @property
    def lock(self) -> threading.RLock:
        """The manager's re-entrant lock: every public method takes it (and the poll thread, while
        it ticks).  Hold it to read :attr:`core` consistently while ``background_poll`` runs, or
        to make several calls atomic."""
        return self._lock

    # -- metrics ---------------------------------------------------------------------------------
    @property
    def metrics(self) -> CollectorRegistry:
        """This manager's Prometheus registry (its series: docs/metrics.md)."""
        return self._metrics.registry

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` of the metrics endpoint (config ``metrics_port``), or ``None`` when off."""
        return self._metrics.address

    def stats(self) -> TierStats:
        """A snapshot of every series (not a stable API): a ``dict`` whose keys are
        ``name{label=value,...}`` without the per-manager ``tier``/``listener`` labels; printed, a
        dozen readable lines with the last finished requests (:class:`kvtier.explain.TierStats`)."""
        with self._lock:
            samples = self._metrics.samples()
        return TierStats(samples, title=f"{self.config.type} @ {self.address}", recent=self.forensics.as_json(limit=5))

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

    @property
    def local_hello(self) -> Any:
        """What our handshakes announce (:class:`~kvtier.lifecycle.HelloInput`)."""
        return self.core.local

    def set_hash_seed(self, hash_seed: str) -> None:
        """Set the block-hash seed our handshakes advertise and require from peers.

        For engines that know their seed only after the tier is built (vLLM runs
        ``init_none_hash`` after constructing its scheduler).  Sessions already established keep
        the hash seed they were checked with; every later handshake uses the new one.

        Raises:
            kvtier.config.TierConfigError: ``hash_seed`` is not a valid ``hash_seed`` value.
        """
        with self._lock:
            self.config = attrs.evolve(self.config, hash_seed=hash_seed)
            self.core.set_local(msgspec.structs.replace(self.core.local, hash_seed=self.config.hash_seed))

    # -- engine API ------------------------------------------------------------------------------
    def on_new_request(self, req: RequestContext) -> str:
        """Register a request; returns its role: ``"producer"``, ``"consumer"``, ``"source"``
        (symmetric: its blocks are probed for on the peer ``remote_kv_source`` names) or
        ``"local"``.

        A consumer or source request opens (or reuses) the session to its peer.

        Raises:
            TypeError: ``req`` is not a :class:`~kvtier.api.RequestContext`.
            ValueError: malformed ``kv_transfer_params`` (the message names the field), the same
                request announced twice with different params, or a consumer ``kv_request_id``
                whose earlier load is still winding down.
            RuntimeError: :meth:`shutdown` began.
        """
        check_req(req, "on_new_request")
        with self._lock:
            self._check_open()
            try:
                info = parse_params(req.kv_transfer_params, self._peer_policy)
            except PeerNotAllowed as exc:
                # No socket, no state: the request recomputes (lookup MISS; a load fails).
                self._metrics.rejected_peer()
                self._logs("", "peer_not_allowed", "kvtier: request %s: refusing to dial %s (not in allowed_peers)",
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
            if info.role in ("consumer", "source"):
                kid = info.kv_request_id
                if (self.core.consumer_state(kid) is not ConsumerState.ABSENT
                        or self.core.probe_state(kid) is not ProbeState.ABSENT or self.core.round_loads(kid)):
                    # an earlier request's load of this id is still winding down (abort in flight)
                    raise ValueError(
                        f"request {req.req_id!r}: kv_request_id {kid!r} is still in use by an "
                        "earlier request on this consumer"
                    )
                self._requests[req.req_id] = info
                if info.role == "consumer":
                    self._loop.apply(ix.LoadAnnounced(kid, info.peer, info.life))
                else:
                    self._loop.apply(ix.ProbeAnnounced(kid, info.peer))
            else:
                self._requests[req.req_id] = info
                if info.role == "producer" and info.consumer is not None:
                    self._loop.apply(ix.ConsumerNamed(info.kv_request_id, info.consumer))
            return info.role

    def lookup(self, key: bytes, req: RequestContext) -> LookupResult:
        """HIT if ``key`` can be loaded for ``req`` from its remote producer; MISS otherwise
        (including after the id's load failed, so the engine recomputes, and once :meth:`shutdown`
        began, when a new load would raise).

        A symmetric (``source``) request registers ``key`` with its probe and answers RETRY until
        the peer said whether it holds the block — bounded by ``probe_timeout_s`` from the round's
        first key — then HIT (pinned for us until our load) or MISS (kept for the request's life).
        Keys looked up during one engine step leave in one probe at :meth:`on_schedule_end`."""
        check_req(req, "lookup")
        with self._lock:
            info = self._requests.get(req.req_id)
            if info is None or self._closed or self._closing:
                return LookupResult.MISS  # (shutting down: a load submitted now would raise)
            if info.role == "source":
                if not isinstance(key, bytes) or not 0 < len(key) <= 256:
                    raise ValueError(f"lookup: key must be 1..256 bytes, got {key!r:.40}")
                self._loop.apply(ix.KeyLookedUp(info.kv_request_id, key))
                return _ANSWERS[self.core.probe_answer(info.kv_request_id, key)]
            if info.role != "consumer":
                return LookupResult.MISS
            return LookupResult.MISS if self.core.load_failed(info.kv_request_id) else LookupResult.HIT

    def on_schedule_end(self) -> None:
        """The engine step ended (vLLM's ``on_schedule_end``): every symmetric request's keys
        looked up during the step leave in one probe per (peer, ``kv_request_id``).  Engines
        other than vLLM call it once after each batch of lookups."""
        with self._lock:
            if not self._closed:
                self._loop.apply(ix.ScheduleEnded())
                if self._loop.outbound.serving.standing is not None:
                    self._loop.serve(self._loop.outbound.serving.standing)

    def serve_external_requests(self, source: BlockSource) -> int:
        """A serve window: answer peers' probes from the engine's own blocks through ``source``
        (:class:`~kvtier.blocksource.BlockSource`; vLLM: its ``ParentManager``).  Call it when the
        engine's blocks may be pinned safely (vLLM calls it once per step and between steps, under
        its lock); ``source`` is used only during the call, except its ``release`` (a pin's end),
        which may come at any later manager call.  Returns how many lookups were performed.

        Raises:
            TypeError: ``source`` does not implement :class:`~kvtier.blocksource.BlockSource`.
        """
        if not isinstance(source, BlockSource):
            raise TypeError(f"source must implement kvtier.blocksource.BlockSource, got {type(source).__name__}")
        with self._lock:
            if self._closed:
                return 0
            return self._loop.serve(source)

    def serve_from(self, source: BlockSource | None) -> None:
        """Serve peers' probes from ``source`` at every tick and step end, without the engine
        opening windows itself (for engines whose blocks live in kvtier's pool and are guarded by
        the manager's lock: :class:`~kvtier.blocksource.BlockIndex`); ``None`` stops.

        Raises:
            TypeError: ``source`` does not implement :class:`~kvtier.blocksource.BlockSource`.
        """
        if source is not None and not isinstance(source, BlockSource):
            raise TypeError(f"source must implement kvtier.blocksource.BlockSource, got {type(source).__name__}")
        with self._lock:
            self._loop.outbound.serving.standing = source

    def submit_store(self, job: TransferJob) -> None:
        """Park ``job``'s blocks for the request's remote decoder (or report success at once for a
        local-only request).  The engine must keep the blocks unchanged until the job result: it
        comes only once the consumer confirmed receipt (success) or the id ended, and never while
        the data plane may still read the blocks.  A digest of each block (config ``integrity``) is
        taken before anything can read the blocks and before anything else about the id is
        applied — on the digest pool's threads for a large store (this call does O(blocks) work
        then), on this thread for a small one — so bytes changed later can never reach a consumer
        as a success (decision I14).

        Raises:
            TypeError: ``job`` is not a :class:`~kvtier.api.TransferJob` (or has mistyped fields).
            UnknownRequest: the request was never passed to :meth:`on_new_request`.
            DuplicateJob: ``job.job_id`` is outstanding (submitted, and its result not yet handed over
                by :meth:`get_finished_jobs`).
            ValueError: keys/slots lengths differ, duplicate keys, or a slot outside the pool.
            RuntimeError: :meth:`shutdown` began.
        """
        with self._lock:
            self._check_open()
            info = self._job_request(job)
            self._check_job(job)
            now = self.clock()
            if info.role != "producer":
                self._jobs.report(JobResult(job_id=job.job_id, success=True))
                self._metrics.job_done("store", True, Reason.LOCAL)
                return
            slots = tuple(job.slots)
            pool = self.pool
            inp = self._work.store(
                ix.StoreSubmitted(info.kv_request_id, job.req.req_id, job.job_id, tuple(job.keys), slots, (),
                                  info.consumer, info.life),
                [pool.buffer(b) for b in slots])
            self._metrics.parked(info.kv_request_id, now)  # before the store: the first one starts the age
            nbytes = len(slots) * pool.block_bytes
            if inp is None:  # held for its digests: applied in its turn, by a later tick
                self._jobs.open(job.job_id, store=True, kv_request_id=info.kv_request_id, now=now, nbytes=nbytes)
                return
            effects = self.core.handle(inp, now)
            # registered after the core accepted the input, before its effects (which may report it)
            self._jobs.open(job.job_id, store=True, kv_request_id=info.kv_request_id, now=now, nbytes=nbytes)
            self._loop.run(effects)

    def submit_load(self, job: TransferJob) -> None:
        """Fetch ``job.keys`` from the request's producer into pool slots ``job.slots``.

        Raises:
            TypeError: ``job`` is not a :class:`~kvtier.api.TransferJob` (or has mistyped fields).
            UnknownRequest: the request was never announced, or is not a consumer request.
            DuplicateJob: ``job.job_id`` is outstanding (submitted, and its result not yet handed over
                by :meth:`get_finished_jobs`).
            ValueError: keys/slots lengths differ, duplicate keys, a slot outside the pool, or a
                fetch too large for one message.
            RuntimeError: :meth:`shutdown` began.
        """
        with self._lock:
            self._check_open()
            info = self._job_request(job)
            if info.role == "refused":  # its producer is not in allowed_peers: nothing to load
                self._check_job(job)
                self._jobs.report(JobResult(job_id=job.job_id, success=False, reason=Reason.PEER_NOT_ALLOWED))
                self._metrics.job_done("load", False, Reason.PEER_NOT_ALLOWED)
                return
            if info.role not in ("consumer", "source"):
                raise UnknownRequest(
                    f"submit_load job {job.job_id}: request {job.req.req_id!r} has no remote_prefiller or "
                    "remote_kv_source params"
                )
            self._check_job(job)
            now = self.clock()
            check_fetch_size(job, self.config.max_message_bytes)
            inp = ix.LoadSubmitted(info.kv_request_id, job.job_id, tuple(job.keys), tuple(job.slots))
            try:
                effects = self.core.handle(inp, now)
            except InvalidTransition as exc:
                raise UnknownRequest(f"submit_load job {job.job_id}: {exc}") from exc
            self._jobs.open(job.job_id, store=False, kv_request_id=info.kv_request_id, now=now,
                            nbytes=len(job.slots) * self.pool.block_bytes)
            self._loop.run(effects)

    def load_nothing(self, req: RequestContext) -> bool:
        """The consumer request ``req`` needs none of its producer's blocks (every one is already
        here, e.g. a local prefix-cache hit): tell the producer now — an empty fetch, so it
        releases what it parked for the id in one round trip (its store jobs succeed,
        ``not_needed``) instead of at ``unbound_store_timeout_s``.  A no-op (False) for a request
        that is not a consumer's, or whose load was already submitted.  The manager's own job
        for it produces no result for the engine.

        Raises:
            TypeError: ``req`` is not a :class:`~kvtier.api.RequestContext`.
        """
        check_req(req, "load_nothing")
        with self._lock:
            info = self._requests.get(req.req_id)
            if (info is None or info.role != "consumer" or self._closed or self._closing
                    or self.core.consumer_state(info.kv_request_id) is not ConsumerState.ANNOUNCED):
                return False
            self._internal_jobs += 1
            job_id = self._internal_jobs
            now = self.clock()
            effects = self.core.handle(ix.LoadSubmitted(info.kv_request_id, job_id, (), ()), now)
            self._jobs.open(job_id, store=False, kv_request_id=info.kv_request_id, now=now, nbytes=0, internal=True)
            self._loop.run(effects)
            return True

    def get_finished_jobs(self, *, poll: bool = True) -> list[JobResult]:
        """Hand over every job result produced since the last call; when there is none yet,
        tick once first (results already produced go out without another network pass).
        ``poll=False``: only results already produced, no network pass at all."""
        with self._lock:
            if poll and not self._closed and not self._jobs.ready:
                self._loop.tick()
            return self._jobs.take()

    def finish_job(self, job_id: int, *, store: bool, success: bool, reason: Reason | None = None) -> None:
        """Report a result for job ``job_id`` that the caller decided itself and never submitted
        (an adapter refusing a job it cannot map, or one that needs nothing): it is handed over by
        the next :meth:`get_finished_jobs`, exactly once, like any other.  Works after
        :meth:`shutdown` too.

        Raises:
            ValueError: ``job_id`` is not a non-negative int.
            DuplicateJob: ``job_id`` is outstanding.
        """
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 0:
            raise ValueError(f"job_id must be a non-negative int, got {job_id!r:.40}")
        with self._lock:
            self._jobs.check_new(job_id)
            why = None if success else (reason or Reason.JOB_REFUSED)
            self._jobs.report(JobResult(job_id=job_id, success=success, reason=why))
            self._metrics.job_done("store" if store else "load", success, why if not success else Reason.LOCAL)

    @property
    def tier_metrics(self) -> TierMetrics:
        """This manager's :class:`~kvtier.metrics.TierMetrics` (its registry, taps, labels)."""
        return self._metrics

    def outstanding_jobs(self) -> frozenset[int]:
        """Ids of every job submitted whose result :meth:`get_finished_jobs` has not handed over
        yet (each gets exactly one result; an id in this set cannot be submitted again)."""
        with self._lock:
            return self._jobs.outstanding()

    def is_outstanding(self, job_id: int) -> bool:
        """Whether job ``job_id`` is in :meth:`outstanding_jobs` (O(1), for a caller that asks per
        submitted job)."""
        with self._lock:
            return self._jobs.is_outstanding(job_id)

    def jobs_in_flight(self, kv_request_id: str | None = None) -> frozenset[int]:
        """Ids of the submitted jobs that have no result yet (the core still works on them), all
        or only those of ``kv_request_id``."""
        with self._lock:
            return frozenset(self._jobs.open_ids(kv_request_id))

    def on_request_finished(self, req: RequestContext) -> None:
        """The engine is done with ``req``. Producer: blocks not yet fetched wait for a fetch or
        the reap (an unmet bound fetch fails at once). Consumer: an unfinished load is aborted and
        its job fails with reason ``cancelled``."""
        check_req(req, "on_request_finished")
        with self._lock:
            info = self._requests.pop(req.req_id, None)
            if info is None or self._closed or info.role not in ("producer", "consumer", "source"):
                return
            self._loop.apply(ix.RequestFinished(info.kv_request_id, info.role == "producer", info.life))

    def has_pending_work(self) -> bool:
        """True while any job lacks a collected result, a transfer is in flight, sends are queued,
        or symmetric work waits (a probe round, a peer's round, a pin, a queued engine lookup): the
        engine must keep stepping (and opening serve windows) while it is."""
        with self._lock:
            return bool(self._jobs) or self._jobs.ready or (
                not self._closed and (self.plane.referenced() > 0 or self.transport.pending_sends() > 0
                                      or self.core.symmetric_work() or self._loop.outbound.serving.pending())
            )

    def drain_jobs(self, timeout_s: float | None = None) -> None:
        """Return once every submitted job has a result (collect them with get_finished_jobs).

        Parked and awaiting producer ids are ended at once (jobs fail with reason ``drained``), and
        so are peers' symmetric rounds not fetched yet (their pins are released, ``drained``);
        transfers and loads in flight finish or hit their deadlines, so this terminates.  Returns
        only once no pin is held either (vLLM's ``reset_cache`` asserts that no job of its is
        outstanding, and a pin is one).

        ``timeout_s`` is also the budget of a :meth:`shutdown` that follows a drain that did not
        finish: it gets only what is left of it (and at least the goodbyes' flush), so the two
        together take ``timeout_s``, not ``timeout_s + shutdown_grace_s`` (decision A6).

        Raises:
            TimeoutError: ``timeout_s`` (wall seconds) passed first.
            RuntimeError: :meth:`shutdown` began.
        """
        start = time.monotonic()
        with self._lock:
            self._check_open()
            self._loop.apply(ix.DrainStarted())
            self._drain_deadline = None if timeout_s is None else start + timeout_s
        while True:
            with self._lock:
                self._loop.tick()
                if not self._jobs and not self._loop.outbound.serving.pins():
                    self._drain_deadline = None
                    return
                wait = self._loop.wait_budget()
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"drain_jobs: {len(self._jobs)} jobs and {len(self._loop.outbound.serving.pins())} "
                                   f"pins still outstanding after {timeout_s} s")
            self._idle_wait(min(wait, 0.01))

    def poll(self, timeout_s: float = 0.0) -> None:
        """Wait up to ``timeout_s`` seconds for network input, then process everything due."""
        if timeout_s > 0:
            self._idle_wait(timeout_s)
        with self._lock:
            if not self._closed:
                self._loop.tick()

    def _idle_wait(self, seconds: float) -> None:
        """Block up to ``seconds`` for network input.

        libzmq sockets are not thread-safe, so every transport call — a wait included — happens
        under the manager lock.  With ``background_poll`` the poll thread does the waiting; any
        other caller just sleeps (the poll thread handles the input meanwhile)."""
        if self._thread is not None and not self._thread.is_current():
            self._thread.stop.wait(seconds)
            return
        with self._lock:
            if not self._closed:
                self.transport.wait(min(seconds, self._loop.wait_budget()))

    def quarantined(self) -> tuple[int, int]:
        """(ids, blocks) held in ``quarantined``: the data plane never confirmed their release, so
        their store jobs stay outstanding (decision I1)."""
        with self._lock:
            return self.core.quarantined_count(), self.core.quarantined_blocks()

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
           still read their blocks (decision I1).
        Every job gets exactly one result (collect them with :meth:`get_finished_jobs`).  Returns
        within the grace plus a few milliseconds, even when a peer is wedged.  Right after a
        :meth:`drain_jobs` that timed out, the grace is what is left of the drain's budget (at
        least 50 ms for the goodbyes): one budget for both (decision A6).  Idempotent.
        """
        start = time.monotonic()
        grace = self.config.shutdown_grace_s if grace_s is None else max(0.0, float(grace_s))
        drained_until = self._drain_deadline
        if drained_until is not None and start - drained_until <= self.config.shutdown_grace_s:
            # a drain that did not finish just used (part of) the budget: share it (A6)
            grace = min(grace, max(_MIN_GOODBYE_S, drained_until - start))
        if self._thread is not None:
            self._thread.join(timeout_s=5.0)
            self._thread = None
        with self._lock:
            if self._closed or self._closing:
                return
            self._closing = True
            self._loop.apply(ix.ShutdownStarted())
            self.transport.flush()
        # leave a slice of the grace for the goodbyes to flush
        work_until = start + 0.8 * grace
        while time.monotonic() < work_until:
            with self._lock:
                self._loop.tick()
                if not self.core.busy():
                    break
            self._idle_wait(min(0.005, max(0.0, work_until - time.monotonic())))
        with self._lock:
            try:
                self._loop.apply(ix.GraceEnded())
                self.transport.flush()
            finally:
                self._closed = True
                linger = max(0.05, grace - (time.monotonic() - start))
                self.transport.close(linger_s=linger)
                self._finish_plane()
            # a shut-down manager never touches its pool again: only the engine's own reference
            # (``self.pool``, the engine's object) may keep it alive
            self._loop.outbound.pool = None
            if self._digest_pool is not None:
                self._digest_pool.close()
        # outside the lock: a scrape in progress waits for that lock
        self._metrics.close()

    def close_abruptly(self) -> None:
        """Close the sockets now, with no goodbye, no grace and no further results: what a crash
        looks like to the peers (fault injection in tests and benchmarks; an engine calls
        :meth:`shutdown`).  The manager does nothing afterwards.  Idempotent."""
        if self._thread is not None:
            self._thread.join(timeout_s=5.0)
            self._thread = None
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.transport.close()
            if self._digest_pool is not None:
                self._digest_pool.close()  # lets its running digests and landings end: none starts again

    def _finish_plane(self) -> None:
        """After the transport closed: the plane holds nothing any more; report its releases so
        the last store jobs get their result, then fail anything the core still holds."""
        inputs = self._loop.inbound.reports(self.plane.close())  # landings still running end first
        drive(self.core, self._work.inputs(inputs, float("inf")), self.clock(), deadlines_at=None,
              perform=self._loop.outbound.perform)
        drive(self.core, self._work.drain(), self.clock(), deadlines_at=None, perform=self._loop.outbound.perform)
        for job_id in self._jobs.open_ids():  # nothing should remain; never leave a job without a result
            log.error("kvtier: job %d had no result at shutdown; failing it", job_id)
            self._jobs.finish(job_id, False, Reason.SHUTDOWN, self.clock())
        # no serve window comes after shutdown: engine lookup contexts go with the engine
        self._loop.outbound.serving.drop_contexts()

    # -- helpers: API checks ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise RuntimeError("kvtier manager is shut down" if self._closed else "kvtier manager is shutting down")

    def _job_request(self, job: TransferJob) -> TransferParams:
        check_job_type(job)
        info = self._requests.get(job.req.req_id)
        if info is None:
            raise UnknownRequest(
                f"job {job.job_id}: request {job.req.req_id!r} was never announced with on_new_request"
            )
        return info

    def _check_job(self, job: TransferJob) -> None:
        check_job(job, num_blocks=self.pool.num_blocks, max_blocks=self.config.max_blocks_per_fetch)
        self._jobs.check_new(job.job_id)
