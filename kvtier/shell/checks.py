"""Checks of engine API arguments: a clear ``TypeError``/``ValueError`` naming what was wrong,
before anything reaches the core (whose own misuse errors are for states, not shapes)."""

from __future__ import annotations

import numbers
from typing import Any

from kvtier.api import RequestContext, TransferJob
from kvtier.lifecycle import Reason
from kvtier.lifecycle.inputs import StoreSubmitted
from kvtier.params import TransferParams

__all__ = ["MAX_JOB_ID", "check_fetch_size", "check_finish", "check_job", "check_job_id", "check_req", "check_seconds",
           "store_input"]


def check_req(req: Any, where: str) -> None:
    """The engine's request handle must be a :class:`~kvtier.api.RequestContext` whose ``req_id``
    is a non-empty str (the key of every per-request record)."""
    if not isinstance(req, RequestContext):
        raise TypeError(f"{where}: req must be a kvtier.api.RequestContext, got {type(req).__name__}")
    if not isinstance(req.req_id, str) or not req.req_id:
        raise TypeError(f"{where}: req.req_id must be a non-empty str, got {req.req_id!r:.40}")


def check_job_type(job: Any) -> None:
    if not isinstance(job, TransferJob):
        raise TypeError(f"expected a kvtier.api.TransferJob, got {type(job).__name__}")
    if not isinstance(job.req, RequestContext):
        raise TypeError(f"job {job.job_id!r:.40}: req must be a RequestContext, got {type(job.req).__name__}")


#: Engine job ids are ints in ``0 .. MAX_JOB_ID``; the ids above are the manager's own jobs
#: (``load_nothing``), so an engine id can never collide with one and lose its result.
MAX_JOB_ID = (1 << 62) - 1


def check_job_id(job_id: object) -> None:
    """Raises ``ValueError`` naming ``job_id`` unless it is an int in ``0 .. MAX_JOB_ID``."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 <= job_id <= MAX_JOB_ID:
        raise ValueError(f"job_id must be an int from 0 to 2**62 - 1 (the ids above are the manager's own "
                         f"jobs), got {job_id!r:.40}")


def check_seconds(name: str, value: object) -> float:
    """``value`` as seconds: a finite real number ≥ 0 (an int, a float, a numpy scalar of either;
    not a bool), else ``ValueError`` naming ``name`` (an API call's ``timeout_s`` or ``grace_s``)
    and what it got.  A value too large for a float (``10**400``) is refused the same way."""
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            seconds = float(value)
        except (OverflowError, ValueError):
            seconds = float("nan")
        if 0 <= seconds < float("inf"):
            return seconds
    raise ValueError(f"{name} must be a finite number of seconds >= 0 (an int or a float), "
                     f"got {value!r:.40} ({type(value).__name__})")


_INT = {int}
_BYTES = {bytes}


def check_job(job: TransferJob, *, num_blocks: int, max_blocks: int) -> None:
    """Shape of a store or load job: an id in ``0 .. MAX_JOB_ID``, equal-length key and slot
    sequences without duplicates, at most ``max_blocks`` blocks, slots inside the pool, keys of
    1..256 bytes.  Raises ``TypeError``/``ValueError`` naming the field.

    This runs on the engine's thread for every job, usually cold (decision C25): the common case
    is a few C-level passes with no call per block; only a failure looks for the culprit, to
    name it."""
    job_id, keys, slots = job.job_id, job.keys, job.slots
    if type(job_id) is not int or not 0 <= job_id <= MAX_JOB_ID:
        check_job_id(job_id)  # raises, unless an int subclass in range
    tk, ts = type(keys), type(slots)
    if not ((tk is tuple or tk is list) and (ts is tuple or ts is list)):
        # sized and re-iterable: a generator would be consumed by the checks
        for name, value in (("keys", keys), ("slots", slots)):
            if not isinstance(value, (tuple, list)):
                raise TypeError(f"job {job_id}: {name} must be a tuple or list, got {type(value).__name__}")
    n = len(keys)
    if n != len(slots):
        raise ValueError(f"job {job_id}: {n} keys but {len(slots)} slots")
    if n == 1:  # the one-block job: no set, no pass
        slot, key = slots[0], keys[0]
        if type(slot) is int and 0 <= slot < num_blocks and type(key) is bytes and 0 < len(key) <= 256 \
                and max_blocks >= 1:
            return
    # element types before the duplicate checks: a set of unhashable keys or slots would raise a
    # bare "unhashable type" naming neither the job nor the field
    if {*map(type, slots)} != _INT:
        for slot in slots:
            _check_slot_type(job_id, slot)
    if {*map(type, keys)} != _BYTES:
        for key in keys:
            _check_key_type(job_id, key)
    if len(set(keys)) != n:
        raise ValueError(f"job {job_id}: duplicate keys")
    if len(set(slots)) != n:
        raise ValueError(f"job {job_id}: duplicate slots (two blocks cannot share a slot)")
    if n > max_blocks:
        raise ValueError(f"job {job_id}: {n} blocks > max_blocks_per_fetch={max_blocks}: split the job, or raise "
                         f"max_blocks_per_fetch on both sides (a producer refuses a fetch over its own)")
    if not n:
        return
    if not (min(slots) >= 0 and max(slots) < num_blocks):
        for slot in slots:
            if not 0 <= slot < num_blocks:
                raise ValueError(f"job {job_id}: slot {slot!r} is outside the pool (0..{num_blocks - 1})")
    lens = {*map(len, keys)}
    if min(lens) > 0 and max(lens) <= 256:
        return
    for key in keys:
        if not 0 < len(key) <= 256:
            raise ValueError(f"job {job_id}: keys must be 1..256 bytes, got {key!r:.40}")


def _check_slot_type(job_id: int, slot: object) -> None:
    """A slot is a Python ``int`` (an engine's numpy or torch integers are refused by name, with
    the conversion that fixes them; a bool is not a slot number)."""
    if type(slot) is int or (isinstance(slot, int) and not isinstance(slot, bool)):
        return
    what = type(slot).__module__ + "." + type(slot).__qualname__ if type(slot).__module__ != "builtins" \
        else type(slot).__qualname__
    fix = "" if isinstance(slot, bool) else " (pass int(slot))" if hasattr(slot, "__index__") else ""
    raise ValueError(f"job {job_id}: slot {slot!r:.40} is a {what}, not an int slot number{fix}")


def _check_key_type(job_id: int, key: object) -> None:
    """A key is ``bytes`` of 1..256 (a str, bytearray or memoryview is refused by name, with the
    conversion that fixes it)."""
    if isinstance(key, bytes):
        return
    fix = (" (pass key.encode())" if isinstance(key, str)
           else " (pass bytes(key))" if isinstance(key, (bytearray, memoryview)) else "")
    raise ValueError(f"job {job_id}: key {key!r:.40} is a {type(key).__qualname__}; "
                     f"keys must be 1..256 bytes{fix}")


def check_fetch_size(job: TransferJob, max_message_bytes: int, kv_request_id: str, life: str, slots: bool) -> None:
    """The fetch header must fit the producer's ``max_message_bytes`` (assumed equal to ours): an
    upper bound of its msgpack encoding — the fixed fields (128 bytes at most), the id and the
    life, each key with its framing (2 bytes, 3 from 256 bytes), and each slot in msgpack's width
    for it (``slots``: one-sided planes send them) — so a fetch this passes is never refused
    ``oversize``, and one within the fixed fields' few bytes of the limit is not refused here."""
    if 128 + 4 * (len(kv_request_id) + len(life)) + 268 * len(job.keys) <= max_message_bytes:
        return  # fits with the longest keys (check_job: ≤ 256 bytes), slots and UTF-8: the engine's usual fetch, O(1)
    size = 128 + len(kv_request_id.encode()) + len(life.encode()) + sum(len(k) + 2 + (len(k) > 255) for k in job.keys)
    if slots:
        size += sum(1 if s < 128 else 2 if s < 256 else 3 if s < 65536 else 5 if s < 2**32 else 9 for s in job.slots)
    if size > max_message_bytes:
        raise ValueError(
            f"job {job.job_id}: a fetch of {len(job.keys)} keys (up to {size} bytes) exceeds max_message_bytes="
            f"{max_message_bytes} (a fetch is one message); raise max_message_bytes on both sides"
        )


def store_input(job: TransferJob, info: TransferParams, *, num_blocks: int, max_blocks: int) -> StoreSubmitted:
    """The core's input for store ``job`` of a producer request ``info``, once :func:`check_job`
    passed (it raises as that does).  Lists become tuples (``tuple()`` of a tuple: no copy)."""
    check_job(job, num_blocks=num_blocks, max_blocks=max_blocks)
    return StoreSubmitted(info.kv_request_id, job.req.req_id, job.job_id, tuple(job.keys), tuple(job.slots), (),
                          info.consumer, info.life)


def check_finish(store: object, success: object, reason: object) -> Reason | None:
    """``finish_job``'s ``store`` and ``success`` (bools: ``TypeError`` naming the argument) and
    its ``reason`` as a :class:`~kvtier.lifecycle.Reason` (a member or its code; anything else a
    ``ValueError`` naming it: a result's reason is always a spec reason code)."""
    for name, value in (("store", store), ("success", success)):
        if type(value) is not bool:
            raise TypeError(f"finish_job: {name} must be a bool, got {value!r:.40} ({type(value).__name__})")
    if reason is None or type(reason) is Reason:
        return reason
    try:
        return Reason(reason)
    except ValueError:
        raise ValueError(f"finish_job: reason must be a kvtier.lifecycle.Reason (a spec reason code), "
                         f"got {reason!r:.40}") from None

