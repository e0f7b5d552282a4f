"""What the vLLM adapter (:mod:`kvtier.integrations.vllm`) reads from and hands to vLLM's engine
objects: the layout fingerprint of its offloading spec and its data-parallel index, the state a
request keeps in its ``ReqContext``, the :class:`~kvtier.blocksource.BlockSource` over the tiering
manager's ``ParentManager`` (the symmetric path's serve windows), and the throttle on log lines
that client-controlled input can cause.

Imports without vLLM: the adapter module is the one that needs the ``vllm`` extra.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from kvtier.api import RequestContext
from kvtier.blocksource import Pin, Presence

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import JobResult as VllmJobResult
    from vllm.v1.kv_offload.tiering.base import ParentManager

__all__ = ["VllmParentSource", "vllm_layout"]

log = logging.getLogger("kvtier.integrations.vllm")


class _Throttled:
    """At most one log line per ``interval_s``; the next line says how many were suppressed.

    Client-controlled input (``kv_transfer_params``) must not be able to flood the log.
    """

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._next = 0.0
        self._suppressed = 0

    def __call__(self, level: int, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            return
        self._next = now + self.interval_s
        if self._suppressed:
            msg += " (%d similar messages suppressed)"
            args = (*args, self._suppressed)
            self._suppressed = 0
        log.log(level, msg, *args, exc_info=exc_info)


class _Req:
    """What the adapter knows about one vLLM request (kept in its ``ReqContext``).

    ``role``: ``producer`` | ``consumer`` | ``local`` (from kvtier) or ``invalid`` (malformed
    ``kv_transfer_params``) or ``closed`` (announced after shutdown).
    """

    __slots__ = ("role", "rc", "load_failed", "loading")

    def __init__(self, role: str, rc: RequestContext) -> None:
        self.role = role
        self.rc = rc
        self.load_failed = False
        self.loading = False  # a load job was submitted for it


class _ReqStates:
    """The value stored with ``ReqContext.set_state`` (keyed by type there), one ``_Req`` per
    kvtier tier instance so that two kvtier tiers in one engine do not share state."""

    __slots__ = ("by_tier",)

    def __init__(self) -> None:
        self.by_tier: dict[int, _Req] = {}


class VllmParentSource:
    """A :class:`~kvtier.blocksource.BlockSource` over vLLM's ``ParentManager``: what this engine's
    tiering manager holds, excluding this tier.

    A lookup context is a fresh ``ReqContext`` (``parent.on_new_request`` … ``on_request_finished``,
    as ``ParentManager``'s docstring requires); a pin is ``parent.create_store_job(keys, ctx)``: the
    primary rows' ref-counts are raised and the job is registered in the tiering manager under this
    tier, so the pin's release is that job's ``JobResult``, handed back by the tier's next
    ``get_finished_jobs()`` (exactly once; ``reset_cache`` asserts that none is left after
    ``drain_jobs``).  ``parent`` is set only for the duration of a ``serve_external_requests``
    call; ``release`` needs none.
    """

    def __init__(self) -> None:
        # vLLM's names are imported when the adapter builds a source, so this module imports
        # without vLLM (only kvtier.integrations.vllm needs the extra)
        from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext
        from vllm.v1.kv_offload.tiering.base import JobResult

        self._key, self._ctx, self._result = OffloadKey, ReqContext, JobResult
        self._presence = {LookupResult.HIT: Presence.FOUND, LookupResult.HIT_PENDING: Presence.PENDING,
                          LookupResult.RETRY: Presence.PENDING, LookupResult.MISS: Presence.MISSING}
        self.parent: ParentManager | None = None
        # releases come from kvtier's I/O loop thread, takes from vLLM's threads: a deque's append
        # and popleft are atomic, so no lock is shared with the loop
        self.results: deque[VllmJobResult] = deque()
        self.outstanding: set[int] = set()

    def _p(self) -> ParentManager:
        if self.parent is None:  # only a kvtier bug could get here: the manager calls inside windows
            raise RuntimeError("the vLLM ParentManager is used outside serve_external_requests")
        return self.parent

    def open(self, ctx_id: str) -> ReqContext:
        ctx = self._ctx(req_id=ctx_id, kv_transfer_params=None)
        self._p().on_new_request(ctx)
        return ctx

    def lookup(self, key: bytes, ctx: ReqContext) -> Presence:
        return self._presence.get(self._p().lookup(self._key(key), ctx), Presence.MISSING)

    def pin(self, keys: Any, ctx: ReqContext) -> Pin:
        job = self._p().create_store_job([self._key(k) for k in keys], ctx)
        self.outstanding.add(job.job_id)
        return Pin(job.job_id, tuple(int(c) for c in job.chunk_ids.tolist()))

    def release(self, pin_id: int, ok: bool, reason: str | None) -> None:
        if pin_id not in self.outstanding:  # vLLM asserts on an unknown or repeated job id
            log.error("kvtier: pin %d released twice or never taken; not reported to vLLM", pin_id)
            return
        self.outstanding.discard(pin_id)
        self.results.append(self._result(job_id=pin_id, success=ok))

    def close(self, ctx: ReqContext) -> None:
        self._p().on_request_finished(ctx)

    def take(self) -> list[VllmJobResult]:
        out = []
        results = self.results
        while results:
            out.append(results.popleft())
        return out


def _truncate(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dp_index(offloading_spec: Any) -> int:
    """Global data-parallel index of this engine (what vLLM's p2p tier adds to its port)."""
    try:
        idx = offloading_spec.config.parallel.data_parallel_index
    except AttributeError:
        return 0
    return idx if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0 else 0


def _dp_size(offloading_spec: Any) -> int:
    """How many data-parallel ranks the deployment has (1 when vLLM does not say)."""
    parallel = getattr(getattr(offloading_spec, "config", None), "parallel", None)
    n = getattr(parallel, "data_parallel_size", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


def vllm_layout(offloading_spec: Any, row_bytes: int) -> str:
    """The layout fingerprint kvtier's handshake compares (both engines must produce the same).

    Readable on purpose, so a ``hello_reject`` log line shows what differs: the primary row
    geometry, KV dtype, tokens per hash, blocks per chunk, parallel sizes, host-layout flags, the
    attention backend's KV cache layout (``NHD``/``HND``: the same bytes in another order), a
    digest of the KV-cache groups (ids, tokens per block, layer names, sliding windows) and the
    model name.  (``block_bytes`` is compared separately by the handshake.)
    """
    try:
        cfg = offloading_spec.config
        groups = [
            [g.group_id, g.tokens_per_block, list(g.layer_names), g.sliding_window_size_in_chunks]
            for g in cfg.groups
        ]
        digest = hashlib.sha256(json.dumps(groups, default=str).encode()).hexdigest()[:16]
        par = cfg.parallel
        parts = {
            "row_bytes": row_bytes,
            "kv_bytes_per_block": cfg.worker_kv_bytes_per_block,
            "dtype": cfg.model.dtype,
            "tokens_per_hash": cfg.cache.tokens_per_hash,
            "blocks_per_chunk": cfg.cache.blocks_per_chunk,
            "world": par.world_size,
            "tp": par.tp_size,
            "pp": par.pp_size,
            "pcp": par.pcp_size,
            "dcp": par.dcp_size,
            "replicated": int(bool(getattr(cfg, "replicated_layout", False))),
            "canonical": int(bool(getattr(cfg, "canonical_layout", False))),
            "kv_layout": getattr(cfg, "kv_cache_layout", None) or "-",  # NHD and HND order a block's bytes apart
            "groups": digest,
            "model": _truncate(str(cfg.model.name), 512),
        }
    except AttributeError:  # a spec without an OffloadingConfig (e.g. a unit-test stub)
        return f"vllm-offload/2 row_bytes={row_bytes}"
    return "vllm-offload/2 " + " ".join(f"{k}={v}" for k, v in parts.items())
