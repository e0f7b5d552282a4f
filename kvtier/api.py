"""Engine-facing records of kvtier's manager API.

Shaped like vLLM's ``SecondaryTierManager`` types (vLLM 0.33.0 ``kv_offload/tiering/base.py``:
``TransferJob``, ``JobResult``, ``LookupResult``; ``kv_offload/base.py``: ``ReqContext``) so the
vLLM adapter (:mod:`kvtier.integrations.vllm`) is a thin mapping, but with no vLLM dependency.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from kvtier.errors import KvTierError


class LookupResult(enum.Enum):
    """Answer to :meth:`KvTierManager.lookup` for one key."""

    MISS = "miss"
    """kvtier cannot supply the block: compute it (or the id's load failed: recompute)."""
    HIT = "hit"
    """The block can be loaded from the remote producer with :meth:`KvTierManager.submit_load`."""
    RETRY = "retry"
    """Symmetric requests only: the peer has not answered yet (a probe is out); ask again at a later
    step.  Bounded: within ``probe_timeout_s`` of the round's first key the answer is HIT or MISS."""


@attrs.frozen(kw_only=True)
class RequestContext:
    """An engine request as kvtier sees it.

    ``kv_transfer_params`` uses vLLM's shapes: a producer (prefill) request carries
    ``{"remote_decoder": {"kv_request_id": K}}``; a consumer (decode) request carries
    ``{"remote_prefiller": {"kv_request_id": K, "remote_host": H, "remote_port": P}}``; a
    symmetric request (fetch whatever blocks the peer's engine holds) carries
    ``{"remote_kv_source": {"kv_request_id": K, "remote_host": H, "remote_port": P}}``.
    Anything else (or ``None``) is a local-only request.
    """

    req_id: str
    kv_transfer_params: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class TransferJob:
    """A store (producer) or load (consumer) job over pool blocks.

    ``keys[i]`` names the content of pool block ``slots[i]`` (for a store: where it already is;
    for a load: where it must land).  ``job_id`` must be unique among the manager's outstanding
    jobs.
    """

    job_id: int
    keys: tuple[bytes, ...]
    slots: tuple[int, ...]
    req: RequestContext


@attrs.frozen(kw_only=True)
class JobResult:
    """Exactly one per submitted job.

    ``reason`` is a spec reason code (``reaped``, ``load_timeout``, ``shutdown`` …) when
    ``success`` is False.  ``transfer_bytes``/``transfer_time_s`` are set for successful loads
    (bytes landed in slots; seconds from submit to result).  ``successful_keys``: a failed load
    whose blocks partly landed names the keys whose slots hold their verified bytes (a subset of
    the job's keys, ``None`` when there are none or integrity checking is off); the engine keeps
    those and computes only the rest.
    """

    job_id: int
    success: bool
    reason: str | None = None
    transfer_bytes: int | None = None
    transfer_time_s: float | None = None
    successful_keys: tuple[bytes, ...] | None = None


class UnknownRequest(KvTierError, ValueError):
    """A job names a request the manager was never told about (``on_new_request``)."""


class DuplicateJob(KvTierError, ValueError):
    """A job id is already outstanding."""
