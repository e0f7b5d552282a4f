"""``KvTierManager``: the engine-facing façade over the I/O loop (:mod:`kvtier.shell.loop`).

Each engine call checks its arguments (raising at once, naming what was wrong), hands the loop
one command (a core input, :mod:`kvtier.lifecycle.inputs`) and returns; it makes no lifecycle
decision and reports no job result of its own — a local store or a refused load is a core input
too (``JobSettled``).  The loop owns the sockets, the data plane and the core; the façade imports
neither a transport nor a plane (decision C12).

Threading: with ``background_poll=True`` the loop runs on its own thread (``kvtier-io``): engine
calls queue a command and wake it (or let it ride the loop's next pass when nothing waits for it,
decisions C34, C40), and share no lock with any wait; results reach :meth:`get_finished_jobs`
through a queue, ``lookup`` answers from what the loop published after its last pass.  With
``background_poll=False`` (caller-driven) the loop runs on the caller's thread: an engine call's
command is applied at once, and :meth:`poll` / :meth:`get_finished_jobs` run passes.  The API
mirrors vLLM 0.33.0's ``SecondaryTierManager`` (with ``on_schedule_end`` and
``serve_external_requests`` for the symmetric path).  Nothing a peer sends can raise out of
:meth:`poll`: malformed messages are counted, answered (rate-limited) by the core and dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import msgspec

from kvtier.api import JobResult, LookupResult, RequestContext, TransferJob, UnknownRequest
from kvtier.blocksource import BlockSource, check_source
from kvtier.config import TierConfig
from kvtier.lifecycle import Reason
from kvtier.lifecycle import inputs as ix
from kvtier.memory import BlockPool
from kvtier.metrics import TierMetrics
from kvtier.params import PeerNotAllowed, PeerPolicy, TransferParams, clip, in_use_message, parse_params, unread_role
from kvtier.shell import abandon
from kvtier.shell.build import build_parts
from kvtier.shell.checks import (MAX_JOB_ID, check_fetch_size, check_finish, check_job, check_job_id, check_job_type,
                                 check_req, check_seconds, store_input)
from kvtier.shell.loop import IoLoop
from kvtier.shell.outbound import MAX_BATCH_BYTES
from kvtier.view import TierView

__all__ = ["KvTierManager", "MAX_BATCH_BYTES"]

log = logging.getLogger("kvtier.manager")

#: The least a shutdown gives its goodbyes to flush, even when a drain used the whole budget.
_MIN_GOODBYE_S = 0.05


class KvTierManager(TierView):
    """One kvtier tier instance: producer and consumer at once, over one block pool.

    Args:
        config: a :class:`~kvtier.config.TierConfig` or the dict a user writes in vLLM's
            ``secondary_tiers[]`` entry (validated; ``ValueError`` names a bad key).
        pool: the host block pool blocks are stored in and loaded into (``block_bytes`` per
            block; pinned iff an accelerator exists).
        layout: the block layout fingerprint; peers must agree (checked in the handshake).
        clock: returns seconds (monotonic); injectable for virtual-time tests.
        transport: defaults to a :class:`~kvtier.transport.ZmqTransport` listening on
            ``config.host:config.port`` (the loop builds and owns it).

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
        transport: Any = None,
    ) -> None:
        if config is None:
            config = {}
        if not isinstance(config, (TierConfig, Mapping)):
            raise TypeError(f"config must be a TierConfig or a mapping of its keys, got {type(config).__name__}")
        self.config = config if isinstance(config, TierConfig) else TierConfig.from_dict(dict(config))
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a kvtier.memory.BlockPool, got {type(pool).__name__}")
        self.pool = pool
        self._num_blocks, self._block_bytes = pool.num_blocks, pool.block_bytes  # read per job
        self.clock = clock
        cfg = self.config
        self._peer_policy = PeerPolicy.from_entries(cfg.allowed_peers, listen_host=cfg.host)
        if (warning := self._peer_policy.open_warning()) is not None:
            log.warning(warning)
        self._lock = threading.RLock()
        parts = build_parts(cfg, pool, layout=layout, clock=clock, lock=self._lock, transport=transport,
                            vet=self._peer_policy.vet_resolved if self._peer_policy.open else None)
        self.instance, self._fetch_slots = parts.instance, parts.plane.one_sided  # a fetch names slots (NIXL)
        self._loop = IoLoop(parts, config=cfg, clock=clock, lock=self._lock)
        self._hello = parts.core.local  # what our handshakes announce (the loop's copy follows it)
        self._jobs = self._loop.jobs
        self._metrics: TierMetrics = parts.metrics
        self.forensics = parts.forensics
        """The recently finished requests (:mod:`kvtier.forensics`; ``GET /kvtier/requests``)."""
        self._internal_jobs = 1 << 62  # ids of the manager's own jobs (above any engine's)
        self._requests: dict[str, TransferParams] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()  # the last 4096 finished: an error says so
        # consumer requests that submitted a load (or load_nothing) -> the keys the first one named;
        # none after a second (an id is fetched once: lookups of other keys MISS, decision L8)
        self._loading: dict[str, frozenset[bytes]] = {}
        # symmetric requests' keys looked up in this engine step: handed over together at its end,
        # so they leave in one probe per (peer, id) per step (decision Y4)
        self._step_keys: dict[str, dict[bytes, None]] = {}
        self._closing = False  # shutdown() began: no new work
        self._shutting = threading.RLock()  # held by the shutdown that runs: another thread's waits for its end
        # when an unfinished drain_jobs(timeout_s) had to end: a shutdown() after it shares its budget (A6)
        self._drain_deadline: float | None = None
        self._closed = False
        # a manager dropped (or left at exit) without shutdown() closes its sockets then, or pyzmq's
        # context would wait for sockets it can no longer close, for ever (decision A7)
        self._abandon = abandon.watch(self, self._loop, self._metrics)
        if cfg.background_poll:
            self._loop.start()

    def set_hash_seed(self, hash_seed: str) -> None:
        """Set the block-hash seed our handshakes advertise and require from peers.

        For engines that know their seed only after the tier is built (vLLM runs
        ``init_none_hash`` after constructing its scheduler).  Sessions already established keep
        the hash seed they were checked with; every later handshake uses the new one.

        Raises:
            kvtier.config.TierConfigError: ``hash_seed`` is not a valid ``hash_seed`` value.
            RuntimeError: :meth:`shutdown` began (no handshake will use it).
        """
        self._check_open()
        self.config = attrs.evolve(self.config, hash_seed=hash_seed)
        hello = self._hello = msgspec.structs.replace(self._hello, hash_seed=self.config.hash_seed)
        self._loop.call(lambda _: self._loop.core.set_local(hello))

    # -- engine API ------------------------------------------------------------------------------
    def on_new_request(self, req: RequestContext) -> str:
        """Register a request; returns its role: ``"producer"``, ``"consumer"``, ``"source"``
        (symmetric: its blocks are probed for on the peer ``remote_kv_source`` names) or
        ``"local"``.

        A consumer or source request opens (or reuses) the session to its peer.

        Raises:
            TypeError: ``req`` is not a :class:`~kvtier.api.RequestContext`.
            ValueError: malformed or unreadable ``kv_transfer_params`` (the message names the field), the same
                request announced twice with different params, or a consumer ``kv_request_id``
                whose earlier load is still winding down.
            RuntimeError: :meth:`shutdown` began.
        """
        check_req(req, "on_new_request")
        self._check_open()
        refused: PeerNotAllowed | None = None
        try:
            info = parse_params(req.kv_transfer_params, self._peer_policy)
        except PeerNotAllowed as exc:
            refused, info = exc, TransferParams("refused", exc.kv_request_id or None, exc.endpoint)
        except Exception as exc:  # a ValueError names the field; anything else came from the params object itself
            self._metrics.rejected_params()
            why = exc if isinstance(exc, ValueError) else f"kv_transfer_params could not be read ({type(exc).__name__})"
            raise ValueError(f"request {clip(req.req_id)}: {why}") from None
        prev = self._requests.get(req.req_id)
        if prev is not None:  # a refused peer too: replacing a registration would orphan its id
            if prev != info:
                raise ValueError(f"request {req.req_id!r} announced twice with different kv_transfer_params")
            return "local" if info.role == "refused" else info.role
        if refused is not None:  # no socket, no state: the request recomputes (lookup MISS; a load fails)
            self._metrics.rejected_peer()
            named, where = clip(refused.kv_request_id) if refused.kv_request_id else "none", clip(refused.endpoint)
            self._loop.logs(where, "peer_not_allowed", "kvtier: request %s (kv_request_id %s): refusing to dial %s "
                            "(%s)", clip(req.req_id), named, where, refused.why)  # a line per endpoint (S15)
            if info.kv_request_id:  # its record for `kvtier why`, now: under vLLM no load follows
                self._loop.call(lambda _, i=info: self.forensics.refused(i.kv_request_id, i.peer, "peer_not_allowed"))
            self._requests[req.req_id] = info
            return "local"
        if info.role in ("consumer", "source"):
            kid = info.kv_request_id
            assert kid is not None and info.peer is not None
            in_use = self._loop.fresh().in_use
            if kid in in_use and self._loop.query(lambda: self._loop.holds_consumer(kid)):
                raise ValueError(in_use_message(req.req_id, kid, self._requests))
            in_use.add(kid)
            self._requests[req.req_id] = info
            self._loop.input(ix.LoadAnnounced(kid, info.peer, info.life) if info.role == "consumer"
                             else ix.ProbeAnnounced(kid, info.peer))
        else:
            self._requests[req.req_id] = info
            if info.role == "local" and (hint := unread_role(req.kv_transfer_params)) is not None:
                self._loop.logs("", "unread_role", "kvtier: request %s: %s", clip(req.req_id), hint)
            if info.role == "producer" and info.consumer is not None:
                self._loop.defer(self._loop.apply, ix.ConsumerNamed(info.kv_request_id, info.consumer),
                                 info.kv_request_id)
        return info.role

    def lookup(self, key: bytes, req: RequestContext) -> LookupResult:
        """HIT if ``key`` can be loaded for ``req`` from its remote producer; MISS otherwise
        (including after the id's load failed, so the engine recomputes; once a load of the id was
        submitted, for a key it did not name, and after a second load of it: an id is fetched once,
        decision L8; and once :meth:`shutdown` began, when a new load would raise).

        A symmetric (``source``) request registers ``key`` with its probe and answers RETRY until
        the peer said whether it holds the block — bounded by ``probe_timeout_s`` from the round's
        first key — then HIT (pinned for us until our load) or MISS (kept for the request's life).
        Keys looked up during one engine step are handed to the I/O loop together at
        :meth:`on_schedule_end` and leave in one probe.  Answers come from what the loop published
        after its last pass: a key it has not seen yet answers RETRY.  ``ValueError``: ``key`` is not 1..256 bytes."""
        check_req(req, "lookup")
        if not isinstance(key, bytes) or not 0 < len(key) <= 256:
            raise ValueError(f"lookup: key must be 1..256 bytes, got {key!r:.40}")
        info = self._requests.get(req.req_id)
        if info is None or self._closed or self._closing:
            return LookupResult.MISS  # (shutting down: a load submitted now would raise)
        kid = info.kv_request_id
        if info.role == "source":
            return self._loop.fresh().probe_answer(kid, key, self._step_keys)
        if info.role != "consumer" or key not in self._loading.get(req.req_id, (key,)):
            return LookupResult.MISS  # (a key no load of the id named once one was submitted: L8)
        return LookupResult.MISS if kid in self._loop.fresh().ended_loads else LookupResult.HIT

    def on_schedule_end(self) -> None:
        """The engine step ended (vLLM's ``on_schedule_end``): every symmetric request's keys
        looked up during the step leave in one probe per (peer, ``kv_request_id``).  Engines
        other than vLLM call it once after each batch of lookups."""
        if self._closed:
            return
        step = tuple((kid, tuple(keys)) for kid, keys in self._step_keys.items())
        self._step_keys = {}
        self._loop.call(self._loop.schedule_end, step)

    def serve_external_requests(self, source: BlockSource) -> int:
        """A serve window: answer peers' probes from the engine's own blocks through ``source``
        (:class:`~kvtier.blocksource.BlockSource`; vLLM: its ``ParentManager``).  Call it when the
        engine's blocks may be pinned safely (vLLM calls it once per step and between steps, under
        its lock); ``source`` is used only during the call (by the I/O loop, while this call
        waits for it), except its ``release`` (a pin's end), which may come at any later time, on
        the loop's thread.  Returns how many lookups were performed; returns at once, 0, when no
        peer's lookup or context close waits for a window.

        Raises:
            TypeError: ``source`` does not implement :class:`~kvtier.blocksource.BlockSource`.
        """
        check_source(source)
        if self._closed or (self._loop.threaded and not self._loop.fresh().serve_wanted):
            return 0
        return int(self._loop.query(lambda: self._loop.serve(source)))

    def serve_from(self, source: BlockSource | None) -> None:
        """Serve peers' probes from ``source`` at every pass and step end, without the engine
        opening windows itself (for engines whose blocks live in kvtier's pool:
        :class:`~kvtier.blocksource.BlockIndex`, guarded by :attr:`lock`); ``None`` stops.

        Raises:
            TypeError: ``source`` does not implement :class:`~kvtier.blocksource.BlockSource`.
        """
        if source is not None:
            check_source(source)
        serving = self._loop.serving
        self._loop.call(lambda _: setattr(serving, "standing", source))

    def submit_store(self, job: TransferJob) -> None:
        """Park ``job``'s blocks for the request's remote decoder (or report success at once for a
        local-only request).  The engine must keep the blocks unchanged until the job result: it
        comes only once the consumer confirmed receipt (success) or the id ended, and never while
        the data plane may still read the blocks.  A digest of each block (config ``integrity``) is
        taken by the I/O loop before anything can read the blocks and before anything else about
        the id is applied — on the digest pool's threads for a large store, inline for a small
        one — so bytes changed later can never reach a consumer as a success (decision I14).  A key
        names its block's content (vLLM's block hashes do): a key already parked under the id keeps
        its first block, and a later job naming it again succeeds with the id's transfer without
        replacing it (decision I31).  With the loop on its own thread, a producer request's store
        of at most 64 KiB wakes it only if a peer's fetch already awaits the id; else the loop
        takes it on its next pass — the next message, deadline or :meth:`get_finished_jobs`,
        within 0.25 s — and the engine's thread pays no wake-up (decision C34).

        Raises:
            TypeError: ``job`` is not a :class:`~kvtier.api.TransferJob` (or has mistyped fields).
            UnknownRequest: the request was never passed to :meth:`on_new_request`, or has finished.
            DuplicateJob: ``job.job_id`` is outstanding (submitted, and its result not yet handed over
                by :meth:`get_finished_jobs`).
            ValueError: keys/slots lengths differ, duplicate keys, a slot outside the pool, or a
                key that is not ``bytes`` / a slot that is not an ``int`` (a numpy or torch integer
                is named with its fix, ``int(slot)``).
            RuntimeError: :meth:`shutdown` began.
        """
        if self._closed or self._closing:  # one flat path: the engine pays it per store, cold (C25)
            self._check_open()
        info = self._job_request(job)
        inp = store_input(job, info, num_blocks=self._num_blocks, max_blocks=self.config.max_blocks_per_fetch)
        if self._book_store(job.job_id, info, len(job.slots)) is None:  # local-only: its result, now
            self._loop.input(ix.JobSettled(job.job_id, True, Reason.LOCAL))
        else:
            self._loop.store(inp)

    def hand_over_store(self, job_id: int, req: RequestContext, keys: tuple[bytes, ...], slots: list[int]) -> None:
        """:meth:`submit_store` for an engine whose submit must not raise on a malformed job (vLLM's
        ``SecondaryTierManager``): the engine's thread checks only what needs no pass over the
        blocks; the keys and slots are checked on the I/O loop, and a job they fail gets its one
        result there, failed ``bad_job``, with an error log naming what was wrong (decision C29).
        ``keys`` and ``slots`` must not change after the call.  Raises as :meth:`submit_store`
        (``ValueError`` for ``job_id``, ``TypeError`` for ``req``, or for ``slots`` without a
        length), never for the contents of ``keys`` and ``slots``."""
        # vLLM's scheduler thread runs this per store: one flat path, no helper calls on success (C25)
        if self._closed or self._closing:
            self._check_open()
        if type(job_id) is not int or not 0 <= job_id <= MAX_JOB_ID:
            check_job_id(job_id)
        try:
            info = self._requests.get(req.req_id) if type(req) is RequestContext else None
        except TypeError:  # an unhashable req_id: _request_of names it
            info = None
        if info is None:
            info = self._request_of(job_id, req)  # raises, naming what was wrong
        try:
            n = len(slots)
        except TypeError:
            raise TypeError(f"hand_over_store job {job_id}: slots must be a list or tuple of ints, "
                            f"got {type(slots).__name__}") from None
        kid = info.kv_request_id if info.role == "producer" else None
        self._jobs.open(job_id, store=True, kv_request_id=kid, now=self.clock(), nbytes=n * self._block_bytes)
        self._loop.hand_over_store(self._take_store, (job_id, keys, slots, req, info), kid, n)

    def _book_store(self, job_id: int, info: TransferParams, blocks: int) -> str | None:
        """Book store job ``job_id`` of ``blocks`` blocks; its kv_request_id (None: local-only)."""
        kid = info.kv_request_id if info.role == "producer" else None
        self._jobs.open(job_id, store=True, kv_request_id=kid, now=self.clock(), nbytes=blocks * self._block_bytes)
        return kid

    def _take_store(self, arg: tuple[int, Sequence[bytes], Sequence[int], RequestContext, TransferParams]) -> None:
        """On the I/O loop: check a handed-over store, then park it (a local-only request's is
        done) or settle it failed — whatever the check raises, the job gets its one result (C29)."""
        job_id, keys, slots, req, info = arg
        try:
            inp = store_input(TransferJob(job_id=job_id, keys=keys, slots=slots, req=req), info,
                              num_blocks=self._num_blocks, max_blocks=self.config.max_blocks_per_fetch)
        except Exception as exc:
            if isinstance(exc, (TypeError, ValueError)):  # the job's shape: check_job names the field
                self._loop.logs("", "bad_job", "kvtier: store refused: %s", exc, level=logging.ERROR)
                reason = Reason.BAD_JOB
            else:  # anything else is ours (or a key whose hash raises): counted, and still one result
                self._metrics.internal_error()
                log.exception("kvtier: store job %d could not be checked", job_id)
                reason = Reason.JOB_REFUSED
            self._loop.apply(ix.JobSettled(job_id, False, reason))
            return
        if info.role == "producer":
            self._loop.park(inp)
        else:
            self._loop.apply(ix.JobSettled(job_id, True, Reason.LOCAL))

    def submit_load(self, job: TransferJob) -> None:
        """Fetch ``job.keys`` from the request's producer into pool slots ``job.slots``.

        Raises:
            TypeError: ``job`` is not a :class:`~kvtier.api.TransferJob` (or has mistyped fields).
            UnknownRequest: the request was never announced, has finished, or is not a consumer one.
            DuplicateJob: ``job.job_id`` is outstanding (submitted, and its result not yet handed over
                by :meth:`get_finished_jobs`).
            ValueError: keys/slots lengths differ, duplicate keys, a slot outside the pool or still
                being loaded by a job without a result (decision A9), a key that is not ``bytes`` /
                a slot that is not an ``int``, or a fetch too large for one message.
            RuntimeError: :meth:`shutdown` began.
        """
        self._check_open()
        info = self._job_request(job)
        if info.role == "refused":  # its producer is not in allowed_peers: nothing to load
            self._check_job(job)
            # no kv_request_id: the request's record was made when it was refused, not a second one
            self._jobs.open(job.job_id, store=False, kv_request_id=None, now=self.clock(), nbytes=0)
            self._loop.input(ix.JobSettled(job.job_id, False, Reason.PEER_NOT_ALLOWED))
            return
        if info.role not in ("consumer", "source"):
            raise UnknownRequest(f"submit_load job {job.job_id}: request {job.req.req_id!r} has no "
                                 "remote_prefiller or remote_kv_source params")
        self._check_job(job)
        check_fetch_size(job, self.config.max_message_bytes, info.kv_request_id, info.life, self._fetch_slots)
        self._jobs.open(job.job_id, store=False, kv_request_id=info.kv_request_id, now=self.clock(),
                        nbytes=len(job.slots) * self._block_bytes, slots=tuple(job.slots))
        self._loading[job.req.req_id] = frozenset() if job.req.req_id in self._loading else frozenset(job.keys)
        self._loop.input(ix.LoadSubmitted(info.kv_request_id, job.job_id, tuple(job.keys), tuple(job.slots)))

    def load_nothing(self, req: RequestContext) -> bool:
        """The consumer request ``req`` needs none of its producer's blocks (every one is already
        here, e.g. a local prefix-cache hit): tell the producer now — an empty fetch, so it
        releases what it parked for the id in one round trip (its store jobs succeed,
        ``not_needed``) instead of at ``unbound_store_timeout_s``.  A no-op (False) for a request
        that is not a consumer's, or that already submitted a load (or called this).  The
        manager's own job for it produces no result for the engine.

        Raises:
            TypeError: ``req`` is not a :class:`~kvtier.api.RequestContext`.
        """
        check_req(req, "load_nothing")
        info = self._requests.get(req.req_id)
        if (info is None or info.role != "consumer" or self._closed or self._closing
                or req.req_id in self._loading):
            return False
        self._loading[req.req_id] = frozenset()
        self._internal_jobs += 1
        job_id = self._internal_jobs
        kid = info.kv_request_id
        self._jobs.open(job_id, store=False, kv_request_id=kid, now=self.clock(), nbytes=0, internal=True)
        self._loop.call(self._loop.load_nothing, (kid, job_id))
        return True

    def get_finished_jobs(self, *, poll: bool = True) -> list[JobResult]:
        """Hand over every job result produced since the last call.  Caller-driven: when there is
        none yet, one pass of the loop runs first (``poll=False``: never).  Threaded: drains the
        results queue, and wakes the loop if a command waits for its next pass (C34, C40)."""
        if poll and not self._closed and not self._jobs.ready and not self._loop.threaded:
            self._loop.poll(0.0)
        self._loop.kick()  # stores an engine call deferred (C34); vLLM calls this from its tier-poll thread
        return self._jobs.take()

    def finish_job(self, job_id: int, *, store: bool, success: bool, reason: Reason | None = None) -> None:
        """Report a result for job ``job_id`` that the caller decided itself and never submitted
        (an adapter refusing a job it cannot map, or one that needs nothing): the core reports
        it (``JobSettled``), handed over by a later :meth:`get_finished_jobs`, exactly once, like
        any other.  Works after :meth:`shutdown` too.

        Raises:
            ValueError: ``job_id`` is not an int from 0 to 2**62 - 1, or ``reason`` is not a
                :class:`~kvtier.lifecycle.Reason` (or its code).
            TypeError: ``store`` or ``success`` is not a bool.
            DuplicateJob: ``job_id`` is outstanding.
        """
        check_job_id(job_id)
        reason = check_finish(store, success, reason)
        self._jobs.open(job_id, store=store, kv_request_id=None, now=self.clock(), nbytes=0)
        self._loop.input(ix.JobSettled(job_id, success, Reason.LOCAL if success else (reason or Reason.JOB_REFUSED)))

    def outstanding_jobs(self) -> frozenset[int]:
        """Ids of every job submitted whose result :meth:`get_finished_jobs` has not handed over
        yet (each gets exactly one result; an id in this set cannot be submitted again)."""
        return self._jobs.outstanding()

    def is_outstanding(self, job_id: int) -> bool:
        """Whether job ``job_id`` is in :meth:`outstanding_jobs` (O(1), for a caller that asks per
        submitted job)."""
        return self._jobs.is_outstanding(job_id)

    def jobs_in_flight(self, kv_request_id: str | None = None) -> frozenset[int]:
        """Ids of the submitted jobs that have no result yet (the core still works on them), all
        or only those of ``kv_request_id``."""
        return frozenset(self._jobs.open_ids(kv_request_id))

    def on_request_finished(self, req: RequestContext) -> None:
        """The engine is done with ``req``. Producer: blocks not yet fetched wait for a fetch or
        the reap (an unmet bound fetch fails at once). Consumer: an unfinished load is aborted and
        its job fails with reason ``cancelled``."""
        check_req(req, "on_request_finished")
        info = self._requests.pop(req.req_id, None)
        self._loading.pop(req.req_id, None)
        self._finished[req.req_id] = None
        if len(self._finished) > 4096:
            self._finished.popitem(last=False)  # O(1): a dict's first key after many deletions is not
        if info is None or self._closed or info.role not in ("producer", "consumer", "source"):
            return
        self._step_keys.pop(info.kv_request_id, None)
        inp = ix.RequestFinished(info.kv_request_id, info.role == "producer", info.life)
        if inp.producer:  # no wake-up unless a fetch awaits it (C34)
            self._loop.defer(self._loop.apply, inp, inp.kv_request_id)
        elif info.role == "consumer" and inp.kv_request_id in self._loop.fresh().ended_loads:
            self._loop.defer(self._loop.apply, inp, None)  # its load ended: nothing to abort or tell (C40)
        else:  # a load to abort, or a producer to release
            self._loop.input(inp)

    def has_pending_work(self) -> bool:
        """True while any job lacks a collected result, a transfer is in flight, sends are queued,
        or symmetric work waits (a probe round, a peer's round, a pin, a queued engine lookup): the
        engine must keep stepping (and opening serve windows) while it is.  A queued command with
        no job (a producer request's naming or finish, C34; a consumer's finish once its load
        ended, C40) is not: the loop takes it on its own within 0.25 s, and nothing waits for it."""
        return bool(self._jobs) or self._jobs.ready or (
            not self._closed and (self._loop.fresh().pending or bool(self._step_keys)))

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
            ValueError: ``timeout_s`` is not None or a finite number ≥ 0.
        """
        start = time.monotonic()
        timeout_s = None if timeout_s is None else check_seconds("timeout_s", timeout_s)
        self._check_open()
        self._drain_deadline = None if timeout_s is None else start + timeout_s
        self._loop.drain(start, timeout_s)
        self._drain_deadline = None

    def poll(self, timeout_s: float = 0.0) -> None:
        """Caller-driven: wait up to ``timeout_s`` seconds for network input, then process
        everything due.  With the loop on its own thread: wait up to ``timeout_s`` for its next
        pass (it needs no polling).  Raises ``ValueError`` unless ``timeout_s`` is a number ≥ 0."""
        if not self._closed:
            self._loop.poll(check_seconds("timeout_s", timeout_s))

    def quarantined(self) -> tuple[int, int]:
        """(ids, blocks) held in ``quarantined``: the data plane never confirmed their release, so
        their store jobs stay outstanding (decision I1)."""
        return self._loop.fresh().quarantined

    def shutdown(self, grace_s: float | None = None) -> None:
        """Shut down gracefully within ``grace_s`` seconds (default: config ``shutdown_grace_s``).

        1. No new work: ``on_new_request``, ``submit_store`` and ``submit_load`` raise
           ``RuntimeError`` from now on.  Parked and awaiting ids end (their jobs fail
           ``shutdown``; a bound consumer is told, with its session's generation); queued loads
           fail; a fetch for an unknown id is refused ``shutdown``.
        2. Transfers and loads in flight get the grace to finish (they may still succeed).
        3. Whatever is still live is given up, every peer gets a goodbye, and the transport is
           closed after letting queued messages flush for what is left of the grace (a dial that
           never completed its handshake can take none: it is closed at once, decision T13).
        4. Closing the transport drops every reference the data plane held, so the store jobs of
           transfers given up in step 3 are reported (failed) only then — never while a send may
           still read their blocks (decision I1).
        Every job gets exactly one result (collect them with :meth:`get_finished_jobs`), but for
        a NIXL load into a pool in private memory whose producer runs on this host and may still
        write its slots: it gets none, and an error names it (decision N27).  Returns within the
        grace, even when a peer is wedged, plus every open job's result (~25 µs per parked id), a
        plane's post already running and libzmq's teardown (A13).  Right after a :meth:`drain_jobs`
        that timed out, the grace is what is left of the drain's budget (at least 50 ms for the
        goodbyes): one budget for both (decision A6).  Idempotent: a call from another thread
        while one runs returns when that one has ended (decision A12).

        Raises:
            ValueError: ``grace_s`` is not None or a finite number ≥ 0 (checked first, always).
        """
        start = time.monotonic()
        grace = self.config.shutdown_grace_s if grace_s is None else check_seconds("grace_s", grace_s)
        drained_until = self._drain_deadline
        if drained_until is not None and start - drained_until <= self.config.shutdown_grace_s:
            # a drain that did not finish just used (part of) the budget: share it (A6)
            grace = min(grace, max(_MIN_GOODBYE_S, drained_until - start))
        with self._shutting:  # a second call returns once the first has ended (its own thread's: at once)
            if self._closed or self._closing:
                return
            self._closing = True
            self._abandon.detach()
            try:
                self._loop.shutdown(start, grace)
            finally:
                self._closed = True
            self._metrics.close()  # outside the loop's lock: a scrape in progress waits for that lock

    def close_abruptly(self) -> None:
        """Close the sockets now, with no goodbye, no grace and no further results: what a crash
        looks like to the peers (fault injection in tests and benchmarks; an engine calls
        :meth:`shutdown`).  The manager does nothing afterwards.  Idempotent."""
        self._abandon.detach()
        self._loop.stop()
        self._closed = True
        self._loop.close_abruptly()

    # -- helpers: API checks ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise RuntimeError("kvtier manager is shut down" if self._closed else "kvtier manager is shutting down")

    def _job_request(self, job: TransferJob) -> TransferParams:
        if type(job) is not TransferJob or type(job.req) is not RequestContext:
            check_job_type(job)  # raises, unless subclasses
        return self._request_of(job.job_id, job.req)

    def _request_of(self, job_id: int, req: RequestContext) -> TransferParams:
        if type(req) is not RequestContext:
            check_req(req, f"job {job_id}")
        try:
            info = self._requests.get(req.req_id)
        except TypeError:
            info = None
        if info is None:
            check_req(req, f"job {job_id}")  # a req_id that is no str is named as such, not as unknown
            raise UnknownRequest(f"job {job_id}: request {req.req_id!r} " + (
                "already finished (on_request_finished): submit a request's jobs before finishing it"
                if req.req_id in self._finished else "was never announced with on_new_request"))
        return info

    def _check_job(self, job: TransferJob) -> None:
        check_job(job, num_blocks=self._num_blocks, max_blocks=self.config.max_blocks_per_fetch)
        self._jobs.check_new(job.job_id)
