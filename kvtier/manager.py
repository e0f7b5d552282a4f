"""``KvTierManager``: the I/O shell around :class:`~kvtier.lifecycle.TierCore`.

It turns engine calls, decoded wire messages and clock readings into core inputs, and performs the
core's effects: socket sends, block copies between the pool and the wire, job results.  It makes
no lifecycle decision of its own — every "may I send / write / report" question is answered by the
core (tables generated from ``spec/lifecycle.toml``).

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
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvtier.api import DuplicateJob, JobResult, LookupResult, RequestContext, TransferJob, UnknownRequest
from kvtier.config import TierConfig
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
from kvtier.lifecycle._table import Reason as SpecReason
from kvtier.lifecycle._table import SessionState
from kvtier.memory import BlockPool
from kvtier.params import PeerNotAllowed, PeerPolicy, TransferParams, clip, parse_params
from kvtier.transport import SendHandle, Transport, TransportError
from kvtier.wire import messages as wm
from kvtier.wire.codec import PROTOCOL_VERSION, Decoder, Reason, WireError, WireLimits, encode_frames

log = logging.getLogger("kvtier.manager")

#: Largest block_data message we build (bytes of payload); limits.md: keep zmq messages ≤ 16 MiB.
MAX_BATCH_BYTES = 8 << 20


@attrs.define(slots=True)
class _Job:
    kind: str  # "store" | "load"
    kv_request_id: str | None
    submitted: float
    nbytes: int


@attrs.define(slots=True)
class _Transfer:
    peer: str
    handles: list[SendHandle]
    cancelled: bool = False
    nbytes: int = 0


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


_JOB_LABELS = frozenset({r.value for r in SpecReason} | {"", "failed", "shutdown", "local", "peer_not_allowed"})


def _label(reason: str) -> str:
    """A metric label for a job's failure reason. A failed transfer_done carries the producer's
    reason string, so anything outside kvtier's own vocabulary is counted as ``other``."""
    return reason if reason in _JOB_LABELS else "other"


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
        self.pool = pool
        self.clock = clock
        self._lock = threading.RLock()
        self.instance = secrets.token_hex(6)
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
            raise

    def _init_rest(self, cfg: TierConfig, pool: BlockPool, layout: str) -> None:
        self._peer_policy = PeerPolicy.from_entries(cfg.allowed_peers)
        self.local_hello = HelloInput(PROTOCOL_VERSION, pool.block_bytes, layout, cfg.hash_seed)
        self.core = TierCore(CoreSettings.from_config(cfg), self.local_hello, gen_base=secrets.randbits(62))
        self._decoder = Decoder(
            limits=WireLimits(max_message_bytes=cfg.max_message_bytes, max_blocks_per_fetch=cfg.max_blocks_per_fetch),
            block_bytes=pool.block_bytes,
        )
        self._requests: dict[str, TransferParams] = {}
        self._jobs: dict[int, _Job] = {}
        self._results: list[JobResult] = []
        self._transfers: dict[tuple[str, int], _Transfer] = {}
        self._next_ping: dict[str, float] = {}
        self._payloads: list[memoryview] = []
        self._ratelog = _RateLimitedLog()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._init_metrics()
        if not pool.pinned:
            log.info("kvtier: block pool is pageable (no accelerator): transfers still work, without DMA pinning")
        if cfg.background_poll:
            self._thread = threading.Thread(target=self._poll_loop, name="kvtier-poll", daemon=True)
            self._thread.start()

    # -- metrics ---------------------------------------------------------------------------------
    def _init_metrics(self) -> None:
        self.metrics = CollectorRegistry(auto_describe=True)
        r = self.metrics
        self.m_jobs = Counter("kvtier_jobs", "Job results reported", ["kind", "outcome", "reason"], registry=r)
        self.m_ignored = Counter("kvtier_ignored_inputs", "Inputs dropped by spec ignore rules", ["machine", "reason"], registry=r)
        self.m_wire = Counter("kvtier_wire_errors", "Malformed or invalid messages from peers", ["reason"], registry=r)
        self.m_bytes_sent = Counter("kvtier_block_bytes_sent", "Block payload bytes handed to the transport", registry=r)
        self.m_bytes_landed = Counter("kvtier_block_bytes_landed", "Block payload bytes written into slots", registry=r)
        self.m_late = Counter("kvtier_late_fetch_rejected", "Fetches answered transfer_done(fail)", ["reason"], registry=r)
        self.m_peer_down = Counter("kvtier_peer_down", "Sessions that ended", ["reason"], registry=r)
        self.m_rejected_peer = Counter(
            "kvtier_rejected_peer", "Requests whose producer endpoint is not in allowed_peers (nothing dialled)",
            registry=r)
        self.m_internal = Counter("kvtier_internal_errors", "Unexpected exceptions caught in the poll loop", registry=r)
        self.g_records = Gauge("kvtier_records", "Live lifecycle records", ["machine"], registry=r)
        # evaluated when scraped, so the poll loop pays nothing for them. They capture the core,
        # not self: a manager -> registry -> lambda -> manager cycle would keep the manager (and
        # the block pool, i.e. an engine's memory) alive until the cyclic GC runs.
        core = self.core
        self.g_records.labels("producer").set_function(lambda: len(core.producer.records))
        self.g_records.labels("consumer").set_function(lambda: len(core.consumer.records))
        self.g_records.labels("session").set_function(lambda: len(core.sessions.records))
        self._children: dict[tuple[Any, ...], Any] = {}

    def _count(self, metric: Any, *labels: str, amount: float = 1.0) -> None:
        """Increment a labelled counter; children are cached (``labels()`` takes a lock)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        child.inc(amount)

    def stats(self) -> dict[str, Any]:
        """A snapshot of counters for humans and the demo (not a stable API)."""
        with self._lock:
            out: dict[str, Any] = {}
            for metric in self.metrics.collect():
                for s in metric.samples:
                    if s.name.endswith("_created"):
                        continue
                    label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                    out[s.name + (f"{{{label}}}" if label else "")] = s.value
            return out

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
        with self._lock:
            self._check_open()
            try:
                info = parse_params(req.kv_transfer_params, self._peer_policy)
            except PeerNotAllowed as exc:
                # No socket, no state: the request recomputes (lookup MISS; a load fails).
                self.m_rejected_peer.inc()
                self._ratelog(self.clock(), "", "peer_not_allowed",
                              "kvtier: request %s: refusing to dial %s (not in allowed_peers)",
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
            return info.role

    def lookup(self, key: bytes, req: RequestContext) -> LookupResult:
        """HIT if ``key`` can be loaded for ``req`` from its remote producer; MISS otherwise
        (including after the id's load failed, so the engine recomputes)."""
        with self._lock:
            info = self._requests.get(req.req_id)
            if info is None or info.role != "consumer":
                return LookupResult.MISS
            return LookupResult.MISS if self.core.load_failed(info.kv_request_id) else LookupResult.HIT

    def submit_store(self, job: TransferJob) -> None:
        """Park ``job``'s blocks for the request's remote decoder (or report success at once for a
        local-only request).  The engine must keep the blocks unchanged until the job result.

        Raises:
            UnknownRequest: the request was never passed to :meth:`on_new_request`.
            DuplicateJob: ``job.job_id`` is outstanding.
            ValueError: keys/slots lengths differ, duplicate keys, or a slot outside the pool.
        """
        with self._lock:
            self._check_open()
            info = self._job_request(job)
            self._check_job(job)
            now = self.clock()
            if info.role != "producer":
                self._results.append(JobResult(job_id=job.job_id, success=True))
                self._count(self.m_jobs, "store", "ok", "local")
                return
            inp = StoreInput(info.kv_request_id, job.req.req_id, job.job_id, tuple(job.keys), tuple(job.slots))
            effects = self.core.store(inp, now)
            # registered after the core accepted the input, before its effects (which may report it)
            self._jobs[job.job_id] = _Job("store", info.kv_request_id, now, len(job.slots) * self.pool.block_bytes)
            self._run(effects)

    def submit_load(self, job: TransferJob) -> None:
        """Fetch ``job.keys`` from the request's producer into pool slots ``job.slots``.

        Raises:
            UnknownRequest: the request was never announced, or is not a consumer request.
            DuplicateJob: ``job.job_id`` is outstanding.
            ValueError: keys/slots lengths differ, duplicate keys, or a slot outside the pool.
        """
        with self._lock:
            self._check_open()
            info = self._job_request(job)
            if info.role == "refused":  # its producer is not in allowed_peers: nothing to load
                self._check_job(job)
                self._results.append(JobResult(job_id=job.job_id, success=False, reason="peer_not_allowed"))
                self._count(self.m_jobs, "load", "fail", "peer_not_allowed")
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
        """Poll once, then hand over every job result produced since the last call."""
        with self._lock:
            if not self._closed:
                self._poll_once()
            out, self._results = self._results, []
            return out

    def on_request_finished(self, req: RequestContext) -> None:
        """The engine is done with ``req``. Producer: blocks not yet fetched wait for a fetch or
        the reap (an unmet bound fetch fails at once). Consumer: an unfinished load is aborted and
        its job fails with reason ``cancelled``."""
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
            return bool(self._jobs or self._transfers or self._results) or (
                not self._closed and self.transport.pending_sends() > 0
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

    def shutdown(self) -> None:
        """Fail every outstanding job with reason ``shutdown`` (collect them with
        get_finished_jobs), tell peers, close sockets and stop the poll thread. Idempotent."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
            self._thread = None
        with self._lock:
            if self._closed:
                return
            try:
                self._run(self.core.shutdown(self.clock()))
                # whatever the core ended without a JobDone (should be nothing) is failed here
                for job_id in list(self._jobs):
                    log.error("kvtier: job %d had no result at shutdown; failing it", job_id)
                    self._finish_job(job_id, False, "shutdown")
                self.transport.flush()
            finally:
                self._closed = True
                self._transfers.clear()
                self.transport.close()

    # -- helpers: API checks ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("kvtier manager is shut down")

    def _job_request(self, job: TransferJob) -> TransferParams:
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
                self._count(self.m_internal)
                log.exception("kvtier: poll thread error")
                self._stop.wait(interval)
            time.sleep(0)  # yield the GIL so a thread blocked on the lock gets in

    def _wait_budget(self) -> float:
        nd = self.core.next_deadline()
        now = self.clock()
        budget = 0.05
        if nd is not None:
            budget = min(budget, max(0.0, nd - now))
        return budget

    def _poll_once(self) -> None:
        """Inbound first (so a fetch that arrives in the same tick as its reap wins), then
        transfer completions, heartbeats and deadlines."""
        for peer, frames in self.transport.recv(1000):
            try:
                self._receive(peer, frames)
            except Exception:
                self.m_internal.inc()
                log.exception("kvtier: error while handling a message from %s", peer)
        self._check_transfers()
        now = self.clock()
        self._heartbeats(now)
        self._run(self.core.tick(now))
        self.transport.flush()

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

    def _check_transfers(self) -> None:
        for key, tr in list(self._transfers.items()):
            if not all(h.done for h in tr.handles):
                continue
            del self._transfers[key]
            kid, rnd = key
            now = self.clock()
            if tr.cancelled:
                self._run(self.core.transfer_released(kid, rnd, now))
            elif any(h.failed for h in tr.handles):
                self._run(self.core.transfer_failed(kid, rnd, now))
            else:
                self.m_bytes_sent.inc(tr.nbytes)
                self._run(self.core.transfer_complete(kid, rnd, now))

    # -- inbound ---------------------------------------------------------------------------------
    def _receive(self, peer: str, frames: list[Any]) -> None:
        now = self.clock()
        try:
            msg, payloads = self._decoder.decode(frames)
        except WireError as err:
            self._count(self.m_wire, err.reason)
            if err.reason == "version_mismatch" and err.msg_type == "hello" and err.gen is not None:
                # answer a hello from another protocol version as a handshake mismatch, at once
                log.error("kvtier: %s speaks protocol version %s, we speak %s", peer, err.theirs, PROTOCOL_VERSION)
                self._send(peer, wm.HelloReject(gen=err.gen, reason="handshake_mismatch", field="version",
                                                ours=str(PROTOCOL_VERSION), theirs=err.theirs or "?"))
                return
            logged = self._ratelog(now, peer, err.reason, "kvtier: bad message from %s: %s", peer, err)
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
            self._payloads = payloads
            try:
                self._run(effects)
            finally:
                self._payloads = []
        elif t is wm.Fetch:
            self._run(core.fetch(peer, msg.gen, FetchInput(peer, msg.kv_request_id, msg.round, tuple(msg.keys)), now))
        elif t is wm.TransferDone:
            inp = MessageInput(msg.kv_request_id, msg.round, ok=msg.ok, reason=(msg.reason or None) if not msg.ok else None)
            self._run(core.transfer_done(peer, msg.gen, inp, now))
        elif t is wm.AbortFetch:
            self._run(core.abort_fetch(peer, msg.gen, FetchInput(peer, msg.kv_request_id, msg.round), now))
        elif t is wm.AbortAck:
            self._run(core.abort_ack(peer, msg.gen, MessageInput(msg.kv_request_id, msg.round), now))
        elif t is wm.Ping:
            self._run(core.ping(peer, msg.gen, now))
            if core.session_ready(peer):
                self._send(peer, wm.Pong(gen=msg.gen, t=msg.t))
        elif t is wm.Pong:
            self._run(core.ping(peer, msg.gen, now))
        elif t is wm.Hello:
            hello = HelloInput(msg.version, msg.block_bytes, msg.layout, msg.hash_seed, gen=msg.gen)
            self._run(core.hello(peer, hello, now))
        elif t is wm.HelloAck:
            self._run(core.hello_ack(peer, msg.gen, now))
        elif t is wm.HelloReject:
            if msg.field == "max_peers":
                log.error("kvtier: %s refused the session: it already has max_peers=%s sessions", peer, msg.ours)
            else:
                log.error(
                    "kvtier: %s rejected our hello: %s differs (ours %s, theirs %s)",
                    peer, msg.field, msg.theirs, msg.ours or "(withheld)",
                )
            self._run(core.hello_reject(peer, msg.gen, now))
        elif t is wm.Disconnect:
            self._run(core.disconnect(peer, msg.gen, now))
        elif t is wm.Error:
            # Label values come from our own vocabulary only: a peer inventing reasons must not
            # mint Prometheus label sets (one time series each).
            self._count(self.m_wire, "peer_reported_" + (msg.reason if msg.reason in Reason.ALL else "other"))
            self._ratelog(now, peer, "peer_error", "kvtier: %s reports an error: %.64s %.200s", peer, msg.reason, msg.detail)
            if msg.kv_request_id:
                self._run(core.peer_error(peer, msg.gen, msg.kv_request_id, now))

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
        elif t is fx.WriteBlocks:
            payloads = self._payloads
            pool = self.pool
            for slot, data in zip(e.slots, payloads):
                pool.buffer(slot)[:] = data
            self.m_bytes_landed.inc(len(e.slots) * pool.block_bytes)
        elif t is fx.SendBlocks:
            return self._start_transfer(e)
        elif t is fx.CancelTransfer:
            tr = self._transfers.get((e.kv_request_id, e.round))
            if tr is not None:
                tr.cancelled = True
            else:  # nothing in flight: released right away
                return self.core.transfer_released(e.kv_request_id, e.round, self.clock())
        elif t is fx.SendTransferDone:
            if not e.ok:
                self._count(self.m_late, e.reason or "")
            return self._send_ctl(e.peer, wm.TransferDone(
                gen=self._gen(e.peer), kv_request_id=e.kv_request_id, round=e.round,
                ok=e.ok, reason=e.reason or "",
            ))
        elif t is fx.SendAbortAck:
            return self._send_ctl(e.peer, wm.AbortAck(
                gen=self._gen(e.peer), kv_request_id=e.kv_request_id, round=e.round))
        elif t is fx.SendFetch:
            return self._send_ctl(e.peer, wm.Fetch(
                gen=self._gen(e.peer), kv_request_id=e.kv_request_id, round=e.round,
                keys=list(e.keys)))
        elif t is fx.SendAbortFetch:
            return self._send_ctl(e.peer, wm.AbortFetch(
                gen=self._gen(e.peer), kv_request_id=e.kv_request_id, round=e.round))
        elif t is fx.OpenConnection:
            try:
                self.transport.connect(e.peer)
            except (TransportError, ValueError) as exc:
                log.warning("kvtier: cannot connect to %s: %s", e.peer, exc)
                return self.core.send_failed(e.peer, self.clock())
            return self.core.transport_up(e.peer, self.clock())
        elif t is fx.SendHello:
            h = self.local_hello
            return self._send_ctl(e.peer, wm.Hello(
                gen=e.gen, version=h.version, instance=self.instance, block_bytes=h.block_bytes,
                layout=h.layout, hash_seed=h.hash_seed))
        elif t is fx.SendHelloAck:
            self._send(e.peer, wm.HelloAck(gen=e.gen, instance=self.instance))
        elif t is fx.SendHelloReject:
            self._count(self.m_peer_down, e.reason)
            if e.field == "max_peers":
                log.warning("kvtier: refusing a session from %s: max_peers=%s reached", e.peer, e.ours)
            else:
                log.error("kvtier: rejecting hello from %s: %s differs (ours %s, theirs %s)",
                          e.peer, e.field, e.ours or "(withheld)", e.theirs)
            self._send(e.peer, wm.HelloReject(gen=e.gen, reason=e.reason, field=e.field, ours=e.ours, theirs=e.theirs))
        elif t is fx.SendDisconnect:
            self._send(e.peer, wm.Disconnect(gen=e.gen, reason=e.reason))
        elif t is fx.CloseConnection:
            self.transport.disconnect(e.peer)
            self._next_ping.pop(e.peer, None)
        elif t is fx.PeerDown:
            self._count(self.m_peer_down, e.reason)
            level = logging.INFO if e.reason == "shutdown" else logging.WARNING
            log.log(level, "kvtier: session with %s ended: %s", e.peer, e.reason)
        elif t is fx.Ignored:
            self._count(self.m_ignored, e.machine, e.reason)
        else:  # pragma: no cover - a new effect type without a performer is a bug
            raise TypeError(f"no performer for effect {e!r}")
        return None

    def _start_transfer(self, e: fx.SendBlocks) -> list[fx.Effect] | None:
        pool = self.pool
        gen = self._gen(e.peer)
        per_msg = max(1, MAX_BATCH_BYTES // pool.block_bytes)
        handles: list[SendHandle] = []
        blocks = e.blocks
        for first in range(0, len(blocks), per_msg):
            chunk = blocks[first : first + per_msg]
            msg = wm.BlockData(gen=gen, kv_request_id=e.kv_request_id, round=e.round, first=first, count=len(chunk))
            handles.append(self._send(e.peer, msg, [pool.buffer(b) for b in chunk], track=True))
        self._transfers[(e.kv_request_id, e.round)] = _Transfer(e.peer, handles, nbytes=len(blocks) * pool.block_bytes)
        return None

    def _finish_job(self, job_id: int, ok: bool, reason: str | None) -> None:
        job = self._jobs.pop(job_id, None)
        if job is None:  # the core guarantees exactly once; count instead of crashing the engine
            self.m_internal.inc()
            log.error("kvtier: duplicate or unknown job result %d dropped", job_id)
            return
        reason = None if ok else str(reason or "failed")
        self._count(self.m_jobs, job.kind, "ok" if ok else "fail", _label(reason or ""))
        if ok and job.kind == "load":
            res = JobResult(job_id=job_id, success=True, transfer_bytes=job.nbytes,
                            transfer_time_s=self.clock() - job.submitted)
        else:
            res = JobResult(job_id=job_id, success=ok, reason=reason)
        self._results.append(res)
