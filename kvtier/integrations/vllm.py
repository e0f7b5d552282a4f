"""vLLM 0.33.0 adapter: :class:`KvTierSecondaryTier`, a ``SecondaryTierManager`` backed by kvtier.

vLLM loads it from a ``kv_connector_extra_config.secondary_tiers[]`` entry (docs/integrations/vllm.md)::

    {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm",
     "host": "10.0.0.5", "port": 5710, "unbound_store_timeout_s": 180}

vLLM's ``SecondaryTierFactory`` pops ``type`` (passed on as ``tier_type``), ``module_path`` and
``backpressure`` (turned into ``backpressure_detector``), and passes every other key verbatim as a
keyword argument.  The adapter validates them all with :meth:`kvtier.config.TierConfig.from_dict`
*before* it builds anything (unknown keys, bools, NaN/inf, out-of-range values and a back-pressure
detector are refused with a message naming the key).

What the adapter does, and nothing more:

* wraps vLLM's primary CPU tier (the ``(num_chunks, row_bytes)`` int8 memoryview over
  ``/dev/shm/vllm_offload_<engine_id>.mmap``) in a :class:`~kvtier.memory.BlockPool` **without a
  copy**: one kvtier block = one primary chunk row, a kvtier slot = a vLLM ``chunk_id``;
* maps vLLM's types onto a :class:`~kvtier.manager.KvTierManager` (``TransferJob.keys`` zipped
  positionally with ``chunk_ids``, ``JobResult``, ``LookupResult``, ``ReqContext``);
* keeps vLLM's scheduler safe from kvtier and from clients: malformed ``kv_transfer_params`` are
  logged (rate-limited) and the request gets no kvtier role, any exception is turned into a failed
  job or a MISS, and every job id is reported exactly once (a duplicate or unknown result is
  dropped with an error instead of tripping vLLM's ``assert``);
* resolves vLLM's block-hash seed lazily (vLLM builds the tier before ``init_none_hash`` runs);
* binds ``port + data_parallel_index`` like vLLM's built-in ``p2p`` tier (and serves metrics on
  ``metrics_port + data_parallel_index``);
* publishes kvtier's series through vLLM's own tier-metrics path (``build_metric_definitions`` /
  ``get_stats``), so they appear on vLLM's ``/metrics`` as ``vllm:kvtier_*``;
* runs the symmetric path (``remote_kv_source``, decisions Y1-Y16): ``lookup`` answers vLLM's
  ``RETRY`` while a probe is out, ``on_schedule_end`` sends the step's probes, and
  ``serve_external_requests(parent)`` answers peers' probes from this engine's own tiers through
  vLLM's ``ParentManager`` (a pin is a store job of vLLM's tiering manager, released by that job's
  ``JobResult``); failed loads report the blocks that landed as ``successful_keys``.

Threading: vLLM calls every method under ``TieringOffloadingManager.lock`` — from the scheduler
thread, and ``get_finished_jobs`` and ``serve_external_requests`` also from its
``vllm_offload_tier_poll`` thread (this tier sets ``tolerates_off_thread_polling``) — except
``shutdown``, which it calls after that thread stopped.  kvtier's I/O runs on its own thread
(``background_poll`` defaults to true here): each engine call hands one command over and returns,
sharing no lock with it.  The adapter never takes vLLM's lock; the ``ParentManager`` is used only
inside ``serve_external_requests`` (by kvtier's loop, while that call waits for it).

This module is the only place kvtier imports vLLM; :mod:`kvtier.integrations` imports nothing.
"""

from __future__ import annotations

import gc
import logging
import traceback
import weakref
from collections.abc import Iterable
from typing import Any, ClassVar

import attrs

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.v1.core import kv_cache_utils as _vllm_kv_cache_utils
    from vllm.v1.kv_offload.base import (
        LookupResult as VllmLookupResult,
    )
    from vllm.v1.kv_offload.base import (
        OffloadingMetricMetadata,
        OffloadKey,
        OffloadPolicy,
        ReqContext,
        RequestOffloadingContext,
        ScheduleEndContext,
    )
    from vllm.v1.kv_offload.tiering.base import (
        JobResult as VllmJobResult,
    )
    from vllm.v1.kv_offload.tiering.base import (
        ParentManager,
        SecondaryTierManager,
    )
    from vllm.v1.kv_offload.tiering.base import (
        TransferJob as VllmTransferJob,
    )
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except Exception as _exc:  # any failure: a half-installed stack raises TypeError, PackageNotFoundError…
    raise ImportError(
        "kvtier.integrations.vllm needs vLLM 0.33.0 (vllm.v1.kv_offload.tiering); importing it "
        f"failed: {_exc!r}. Install it as docs/integrations/vllm.md describes (make setup)."
    ) from _exc

from kvtier.api import DuplicateJob, JobResult, LookupResult, RequestContext, TransferJob
from kvtier.config import TierConfig, TierConfigError
from kvtier.integrations.vllm_engine import (
    VllmParentSource,
    _dp_index,
    _dp_size,
    _Req,
    _ReqStates,
    _Throttled,
    _truncate,
    vllm_layout,
)
from kvtier.integrations.vllm_stats import StatsBridge, vllm_metric_definitions
from kvtier.lifecycle import Reason
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.transport import TransportError
from kvtier.version import TESTED_VLLM_VERSION

__all__ = ["KvTierSecondaryTier", "TESTED_VLLM_VERSION", "vllm_layout"]

log = logging.getLogger("kvtier.integrations.vllm")


def _share_vllm_logging() -> None:
    """Write kvtier's log lines through vLLM's handlers when nothing else would show them.

    vLLM configures only its own ``vllm`` logger (its handlers, ``propagate`` off); with no root
    handler either, kvtier's INFO lines (the tier's "listening on" line the docs point to) were
    dropped and its warnings printed bare by Python's last-resort handler.  A ``kvtier`` logger or
    root logger the application configured is left alone."""
    ours, theirs = logging.getLogger("kvtier"), logging.getLogger("vllm")
    configured = any(name.startswith("kvtier.") and getattr(lg, "handlers", None)  # an application's own
                     for name, lg in list(logging.Logger.manager.loggerDict.items()))
    if ours.handlers or configured or logging.getLogger().handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(theirs.getEffectiveLevel())
    ours.propagate = False


_DRAIN_MARGIN_S = 5.0

_STATS_INTERVAL_S = 1.0
"""vLLM asks for stats at every engine step; the live gauges walk every record, so at most this often."""


_BYTES = {bytes}

_LOOKUP = {LookupResult.HIT: VllmLookupResult.HIT, LookupResult.MISS: VllmLookupResult.MISS,
           LookupResult.RETRY: VllmLookupResult.RETRY}

def _clear_chain(exc: BaseException) -> None:
    """Clear the frames of ``exc``'s traceback and of every exception chained to it."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        if (e := todo.pop()) is not None and id(e) not in seen:
            seen.add(id(e))
            traceback.clear_frames(e.__traceback__)
            todo += [e.__cause__, e.__context__]


def _vllm_seed_ready() -> bool:
    """True once vLLM's ``init_none_hash`` has run in this process."""
    return getattr(_vllm_kv_cache_utils, "_NONE_HASH_SEED", None) is not None


class KvTierSecondaryTier(SecondaryTierManager):
    """kvtier as a vLLM 0.33.0 secondary tier (PD disaggregation, and symmetric P2P: any instance
    fetches cached blocks from a peer that holds them).

    A request whose ``kv_transfer_params`` carry ``{"remote_decoder": {"kv_request_id": K}}`` is a
    **producer** leg: its chunks are parked (pinned in vLLM's primary tier) until the decoder
    fetches them or ``unbound_store_timeout_s`` reaps them.  A request with
    ``{"remote_prefiller": {"kv_request_id": K, "remote_host": H, "remote_port": P}}`` is a
    **consumer** leg: ``lookup`` answers HIT until a load of it ended (then MISS, a key it did not
    name from its submission: fetched once, L8) and loads fetch the chunks from ``H:P`` straight
    into the primary rows vLLM allocated.  A request with ``{"remote_kv_source": {...same keys...}}`` is **symmetric**: its
    lookups answer RETRY until ``H:P`` (a peer running this tier with ``serve_external``) said
    which chunks its own tiers hold (pinned for us), then HIT or MISS, and vLLM loads the HITs.
    Anything else is local: stores succeed at once, lookups MISS.

    Args:
        offloading_spec: vLLM's ``TieringOffloadingSpec`` (layout and data-parallel index).
        primary_kv_view: vLLM's primary tier, ``(num_chunks, row_bytes)`` int8, wrapped in place.
        tier_type: the entry's ``type`` (vLLM pops it); also its metrics label.
        backpressure_detector: must be ``None`` (kvtier does its own flow control).
        **options: the other keys of the ``secondary_tiers[]`` entry (see docs/configuration.md).

    Raises:
        kvtier.config.TierConfigError: a bad key or value (nothing has been built yet).
        kvtier.transport.TransportError: the listener cannot bind ``host:port(+dp index)``.
    """

    medium: ClassVar = None  # a remote peer is neither host memory nor disk
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.P2P
    tolerates_off_thread_polling: ClassVar[bool] = True

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str = "KvTierSecondaryTier",
        backpressure_detector: Any = None,
        **options: Any,
    ) -> None:
        _share_vllm_logging()
        # 1. Validate everything before building anything (vLLM does not call shutdown() on a
        #    tier whose __init__ raised).
        # kvtier's I/O runs on its own thread unless the entry says otherwise: vLLM's scheduler
        # thread only hands each call over (decision C18)
        config = TierConfig.from_dict({"type": tier_type, "background_poll": True, **options,
                                       "backpressure": backpressure_detector})
        dp = _dp_index(offloading_spec)
        ranks = _dp_size(offloading_spec)
        # rank r binds port + r and metrics_port + r: ranks sharing a host may take each other's (said
        # if a bind fails; ranks on separate hosts do not clash, and vLLM does not say which share one)
        overlap = (f"port={config.port} and metrics_port={config.metrics_port} are {abs(config.metrics_port - config.port)} "
                   f"apart and each of the {ranks} data-parallel ranks binds both plus its index, so ranks on one "
                   f"host take each other's ports: put them at least {ranks} apart"
                   if config.port and config.metrics_port and abs(config.metrics_port - config.port) < ranks else "")
        shifted = {}
        for key in ("port", "metrics_port"):  # the listener and the metrics endpoint
            base = getattr(config, key)
            if base and dp:
                if base + dp > 65535:
                    raise TierConfigError(
                        f"{key}={base} plus data_parallel_index {dp} is {base + dp}, above 65535; "
                        "pick a lower base port",
                        keys=(key,),
                    )
                shifted[key] = base + dp
        if shifted:  # both at once: a config half shifted may relate them falsely (port+r == metrics_port)
            config = attrs.evolve(config, **shifted)
        explicit_seed = config.hash_seed
        if not explicit_seed:
            # Until vLLM has run init_none_hash, advertise what it reports now (its deterministic
            # default); _resolve_seed() switches to the real seed as soon as it is known.
            config = attrs.evolve(config, hash_seed=_vllm_kv_cache_utils.get_none_hash_seed())
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=None,
        )
        self._check_version()
        self._key = id(self)
        self._explicit_seed = explicit_seed
        self._seed = config.hash_seed  # what our handshakes advertise now
        self._seed_done = False
        self._warn_params = _Throttled()
        self._warn_internal = _Throttled()
        self._drain_timeout_s = (
            max(config.load_timeout_s + config.abort_ack_timeout_s, config.transfer_timeout_s) + _DRAIN_MARGIN_S
        )
        layout = vllm_layout(offloading_spec, self.block_size_bytes)

        # 2. Build: the pool aliases vLLM's primary memory (no copy), then the manager binds its
        #    listener. On failure, drop every reference to the pool before re-raising, so vLLM's
        #    cleanup can unmap the region.
        pool: BlockPool | None = BlockPool.wrap(primary_kv_view)
        self._pool_tensor_ref = weakref.ref(pool.tensor)
        try:
            self._mgr: KvTierManager | None = KvTierManager(config, pool, layout=layout)
        except BaseException as exc:
            pool = None
            # The failed constructor's frames (its traceback's, its chained errors') still reference the pool.
            _clear_chain(exc)
            self._mgr = None
            self._release_check("constructor failure")
            if overlap and isinstance(exc, (TransportError, OSError)):  # our listener or metrics port is taken
                raise TierConfigError(f"{exc}. {overlap}", keys=("port", "metrics_port")) from exc
            raise
        del pool
        self._ledger: KvTierManager = self._mgr
        """The manager, kept after shutdown for its job ledger (it drops the pool then)."""
        self.config = self._mgr.config
        self._stats = StatsBridge(self._mgr, _STATS_INTERVAL_S)
        # consumer requests announced and not yet seen scheduled (on_schedule_end): one that is
        # scheduled without a load needs nothing from its producer, which is told at once
        self._unscheduled: dict[str, _Req] = {}
        self._source = VllmParentSource()
        log.info(
            "kvtier tier %r: listening on %s (data_parallel_index %d), pool %d blocks x %d bytes, layout %s",
            tier_type, self._mgr.address, dp, self._mgr.pool.num_blocks, self._mgr.pool.block_bytes, layout,
        )

    # -- metrics: kvtier's series on vLLM's /metrics ------------------------------------------------
    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """Declare kvtier's series to vLLM's Prometheus logger (see docs/metrics.md)."""
        return vllm_metric_definitions()

    def get_stats(self) -> OffloadingConnectorStats | None:
        """kvtier's series since the last call (vLLM calls this at every engine step, under its
        lock; at most once per second something is returned)."""
        if self._mgr is None:
            return None
        try:
            return self._stats.take()
        except Exception:
            self._warn_internal(logging.ERROR, "kvtier: collecting metrics for vLLM failed", exc_info=True)
            return None

    # -- small helpers ----------------------------------------------------------------------------
    @staticmethod
    def _check_version() -> None:
        try:
            import vllm

            version = getattr(vllm, "__version__", "?")
        except Exception:  # pragma: no cover - vllm imported fine above
            version = "?"
        if version != TESTED_VLLM_VERSION:
            log.warning(
                "kvtier's vLLM adapter is tested with vLLM %s, this is %s: the tiering API is "
                "experimental and may have changed", TESTED_VLLM_VERSION, version,
            )

    @property
    def kvtier(self) -> KvTierManager | None:
        """The wrapped :class:`KvTierManager` (``None`` after :meth:`shutdown`)."""
        return self._mgr

    @property
    def address(self) -> str | None:
        """``host:port`` the producer side listens on (what the PD proxy sends as
        ``remote_host``/``remote_port``); ``None`` after :meth:`shutdown`."""
        return self._mgr.address if self._mgr is not None else None

    def _state(self, ctx: ReqContext) -> _Req | None:
        holder = ctx.get_state(_ReqStates)
        return None if holder is None else holder.by_tier.get(self._key)

    def _resolve_seed(self, force: bool = False) -> None:
        """Use vLLM's NONE_HASH seed in handshakes once it is known, with the first bytes of
        ``NONE_HASH`` (that seed hashed: two ``--prefix-caching-hash-algo`` share a seed, not it; A11).
        vLLM builds this tier before ``init_none_hash`` runs, so vLLM's seed is read lazily: at every
        poll until vLLM has initialised it (then never again), and at each new request until then.
        An explicit ``hash_seed`` key wins (with a warning if it differs from vLLM's)."""
        if self._seed_done:
            return
        ready = _vllm_seed_ready()
        if not (ready or force):
            return
        self._seed_done = ready
        try:
            seed = _vllm_kv_cache_utils.get_none_hash_seed()
            if self._explicit_seed:
                if ready and seed != self._explicit_seed:
                    log.warning(
                        "kvtier: hash_seed is set explicitly and differs from vLLM's NONE_HASH seed; "
                        "peers will agree in the handshake but block hashes may not match: remove hash_seed "
                        "from this tier's entry (kvtier then takes vLLM's own seed)"
                    )
                return
            if ready:
                seed = f"{seed}/{bytes(_vllm_kv_cache_utils.NONE_HASH)[:8].hex()}"
            mgr = self._mgr
            if mgr is not None and seed != self._seed:
                mgr.set_hash_seed(seed)
                self._seed = seed
        except Exception:
            self._seed_done = True  # do not retry (and log) at every poll
            self._warn_internal(logging.ERROR, "kvtier: could not resolve vLLM's hash seed", exc_info=True)

    def _fail_locally(self, job_id: int, reason: Reason, *, load: bool, req: _Req | None = None) -> None:
        """Report ``job_id`` failed at the next poll (a job kvtier's manager never took); a
        failed load makes the request's lookups MISS."""
        if load and req is not None:
            req.load_failed = True
        try:
            self._ledger.finish_job(job_id, store=not load, success=False, reason=reason)
        except DuplicateJob:
            log.error("kvtier: job %d submitted twice; ignoring the second submission", job_id)

    def _release_check(self, when: str) -> None:
        """Warn if anything still references the pool over vLLM's primary memory."""
        if self._pool_tensor_ref() is None:
            return
        gc.collect()
        if self._pool_tensor_ref() is not None:
            log.warning(
                "kvtier: the block pool over vLLM's primary memory is still referenced after %s; "
                "vLLM will keep the /dev/shm region mapped", when,
            )

    # -- SecondaryTierManager API -----------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        req = self._announce(req_context)
        if req.role == "producer":
            # Hand over every chunk of a producer leg, prefix hits included.
            return RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL)
        return RequestOffloadingContext(policy=OffloadPolicy.CHUNK_LEVEL)

    def _announce(self, ctx: ReqContext) -> _Req:
        req = self._state(ctx)
        if req is not None:
            return req
        self._resolve_seed(force=True)
        rc = RequestContext(req_id=ctx.req_id, kv_transfer_params=ctx.kv_transfer_params)
        mgr = self._mgr
        if mgr is None:
            role = "closed"
        else:
            try:
                role = mgr.on_new_request(rc)
            except ValueError as exc:  # malformed or refused kv_transfer_params (names the field)
                self._warn_params(
                    logging.WARNING,
                    "kvtier: ignoring the kv_transfer_params of request %r, no KV hand-off for it "
                    "(its stores and loads fail, its lookups miss): %s",
                    _truncate(str(ctx.req_id), 128), _truncate(str(exc)),
                )
                role = "invalid"
            except Exception:
                self._warn_internal(
                    logging.ERROR, "kvtier: on_new_request(%r) failed", _truncate(str(ctx.req_id), 128),
                    exc_info=True,
                )
                role = "invalid"
        req = _Req(role, rc)
        holder = ctx.get_state(_ReqStates)
        if holder is None:
            holder = _ReqStates()
            ctx.set_state(holder)
        holder.by_tier[self._key] = req
        if role == "consumer":
            self._unscheduled[rc.req_id] = req
        return req

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> VllmLookupResult:
        req = self._state(req_context)
        if req is None or req.role not in ("consumer", "source") or req.load_failed:
            return VllmLookupResult.MISS
        mgr = self._mgr
        if mgr is None:
            return VllmLookupResult.MISS
        try:
            answer = mgr.lookup(key if type(key) is bytes else bytes(key), req.rc)
        except Exception:
            self._warn_internal(logging.ERROR, "kvtier: lookup failed; answering MISS", exc_info=True)
            return VllmLookupResult.MISS
        return _LOOKUP.get(answer, VllmLookupResult.MISS)

    def serve_external_requests(self, parent: ParentManager) -> None:
        """Answer peers' probes from this engine's own tiers (vLLM calls it once per step, before
        the step's promotions are submitted, and once per tier-poll round, under its lock).  Does
        nothing unless ``serve_external`` is on and a peer asked: lookups wait for this call, and
        ``parent`` is used only during it."""
        mgr = self._mgr
        if mgr is None:
            return
        self._source.parent = parent
        try:
            mgr.serve_external_requests(self._source)
        except Exception:
            self._warn_internal(logging.ERROR, "kvtier: serving peers' probes failed", exc_info=True)
        finally:
            self._source.parent = None

    def submit_store(self, job_metadata: VllmTransferJob) -> None:
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: VllmTransferJob) -> None:
        self._submit(job_metadata, load=True)

    def _submit(self, job: VllmTransferJob, *, load: bool) -> None:
        job_id = job.job_id
        if self._ledger.is_outstanding(job_id):  # vLLM never reuses an id; never report one twice
            log.error("kvtier: job %d submitted twice; ignoring the second submission", job_id)
            return
        req = self._state(job.req_context) or self._announce(job.req_context)
        mgr = self._mgr
        if mgr is None or req.role == "closed":
            return self._fail_locally(job_id, Reason.SHUTDOWN, load=load, req=req)
        if req.role == "invalid":
            return self._fail_locally(job_id, Reason.INVALID_PARAMS, load=load, req=req)
        if load and req.role not in ("consumer", "source"):
            return self._fail_locally(job_id, Reason.NOT_A_CONSUMER, load=load, req=req)
        if load:
            req.loading = True
        # keys may be a set (connector-driven stores): iterate it exactly once and pair it
        # positionally with chunk_ids, as vLLM built chunk_ids by iterating the same collection.
        keys = tuple(job.keys)
        if {*map(type, keys)} != _BYTES:  # one C-level pass for the common case (decision C25)
            keys = tuple(k if type(k) is bytes else bytes(k) for k in keys)
        slots = job.chunk_ids.tolist()  # a copy: vLLM may reuse its array once this returns
        if len(keys) != len(slots):
            log.error("kvtier: job %d has %d keys but %d chunk_ids; failing it", job_id, len(keys), len(slots))
            return self._fail_locally(job_id, Reason.BAD_JOB, load=load, req=req)
        if not keys and not load:
            mgr.finish_job(job_id, store=True, success=True)
            return
        try:
            if load:
                mgr.submit_load(TransferJob(job_id=job_id, keys=keys, slots=tuple(slots), req=req.rc))
            else:  # its blocks are checked on the loop: the scheduler's thread pays no pass over them (C29)
                mgr.hand_over_store(job_id, req.rc, keys, slots)
        except Exception as exc:
            if mgr.is_outstanding(job_id):
                # The manager took the job and its core may be acting on it (sending from or
                # writing into these rows): only the manager's own result may release them.
                self._warn_internal(logging.ERROR, "kvtier: error after job %d was accepted", job_id, exc_info=True)
                return
            # Refused before the manager registered it (nothing is sent from or written into
            # these rows): fail it here.
            self._warn_internal(
                logging.WARNING, "kvtier: %s job %d refused: %s", "load" if load else "store", job_id,
                _truncate(str(exc)),
            )
            self._fail_locally(job_id, Reason.JOB_REFUSED, load=load, req=req)

    def get_finished_jobs(self) -> Iterable[VllmJobResult]:
        self._resolve_seed()
        try:
            results: list[JobResult] = self._ledger.get_finished_jobs()
        except Exception:
            self._warn_internal(logging.ERROR, "kvtier: poll failed", exc_info=True)
            return []
        out: list[VllmJobResult] = []
        for r in results:
            if not r.success:
                log.debug("kvtier: job %d failed: %s", r.job_id, r.reason)
            keys = [OffloadKey(k) for k in r.successful_keys] if r.successful_keys else None
            out.append(VllmJobResult(job_id=r.job_id, success=r.success, successful_keys=keys,
                                     transfer_time=r.transfer_time_s, transfer_bytes=r.transfer_bytes))
        out.extend(self._source.take())  # the pins' releases: their store jobs' results
        return out

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Called by vLLM at the end of every scheduler step, after the step's loads were
        submitted (one method for everything kvtier does at a step's end):

        * a consumer request scheduled for the first time without a load needs nothing from its
          producer (every block hit locally): kvtier tells the producer so now (an empty fetch,
          :meth:`KvTierManager.load_nothing`), and the producer releases the blocks it parked for
          the request in one round trip instead of at ``unbound_store_timeout_s`` (decision L12);
        * the symmetric requests' keys looked up during the step leave in one probe per (peer,
          ``kv_request_id``) (decision Y4)."""
        mgr = self._mgr
        for req_id in getattr(context, "new_req_ids", ()):
            req = self._unscheduled.pop(req_id, None)
            if req is None or req.loading or req.load_failed or mgr is None:
                continue
            try:
                mgr.load_nothing(req.rc)
            except Exception:
                self._warn_internal(logging.ERROR, "kvtier: telling the producer of %r that nothing is needed failed",
                                    _truncate(str(req_id), 128), exc_info=True)
        if mgr is None:
            return
        try:
            mgr.on_schedule_end()
        except Exception:
            self._warn_internal(logging.ERROR, "kvtier: on_schedule_end failed", exc_info=True)

    def on_request_finished(self, req_context: ReqContext) -> None:
        holder = req_context.get_state(_ReqStates)
        req = None if holder is None else holder.by_tier.pop(self._key, None)
        if req is None:
            return
        self._unscheduled.pop(req.rc.req_id, None)
        mgr = self._mgr
        if mgr is None:
            return
        try:
            mgr.on_request_finished(req.rc)
        except Exception:
            self._warn_internal(logging.ERROR, "kvtier: on_request_finished failed", exc_info=True)

    def has_pending_work(self) -> bool:
        try:
            if self._source.results or self._source.outstanding:
                return True
            return self._ledger.has_pending_work()
        except Exception:
            return False

    def drain_jobs(self) -> None:
        """Make every outstanding job's result available to the next ``get_finished_jobs``.

        Parked and supply-waiting producer ids end at once (their store jobs fail with reason
        ``drained``); transfers and loads in flight finish or hit their deadlines — a copy in
        progress is never abandoned.  Raises TimeoutError (from kvtier) only if that takes longer
        than the configured deadlines allow, which would be a kvtier bug.
        """
        mgr = self._mgr
        if mgr is None:
            return
        mgr.drain_jobs(timeout_s=self._drain_timeout_s)

    def shutdown(self) -> None:
        """Fail outstanding jobs, say goodbye to peers, close sockets, and drop every reference to
        vLLM's primary memory (so vLLM can unmap it). Idempotent."""
        mgr, self._mgr = self._mgr, None
        if mgr is None:  # another thread's shutdown may still run: this one returns once it has ended (A12)
            return self._ledger.shutdown()
        try:
            mgr.shutdown()
        finally:
            # A shut-down manager never touches its pool again; drop the reference now rather
            # than wait for the cyclic GC (the manager can sit in a reference cycle).
            try:
                mgr.pool = None
            except Exception:  # pragma: no cover - a manager that refuses: _release_check collects
                pass
            del mgr
            self._release_check("shutdown")
