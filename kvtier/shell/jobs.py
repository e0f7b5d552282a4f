"""The job ledger: every job the engine handed the manager, until its one result is collected.

The core decides *when* a job ends (its ``JobDone`` effect); this ledger makes the engine-facing
promise hold: exactly one :class:`~kvtier.api.JobResult` per submitted job id, and an id stays
taken until :meth:`JobLedger.take` handed that result over (so a resubmission before then is a
``DuplicateJob``, not a second result).  It also keeps what the result reports besides success:
bytes moved and seconds from submit to result.
"""

from __future__ import annotations

import logging

import msgspec

from kvtier.api import DuplicateJob, JobResult
from kvtier.lifecycle import Reason

__all__ = ["JobLedger"]

log = logging.getLogger("kvtier.manager")


class _Job(msgspec.Struct, gc=False):
    store: bool
    kv_request_id: str | None
    submitted: float
    nbytes: int
    internal: bool = False  # the manager's own job (load_nothing): its result is not handed over


class JobLedger:
    """Outstanding jobs and uncollected results of one manager (not thread-safe: the manager
    holds its lock)."""

    def __init__(self) -> None:
        self._open: dict[int, _Job] = {}
        self._internal = 0  # open internal jobs (an empty load ends in the call that made it)
        self._results: list[JobResult] = []
        self._reported: set[int] = set()

    def check_new(self, job_id: int) -> None:
        """Raises :class:`~kvtier.api.DuplicateJob` if ``job_id`` is outstanding or its result was
        not collected yet."""
        if job_id in self._open:
            raise DuplicateJob(f"job {job_id} is already outstanding")
        if job_id in self._reported:
            raise DuplicateJob(f"job {job_id} is already outstanding (its result has not been collected yet)")

    def open(self, job_id: int, *, store: bool, kv_request_id: str | None, now: float, nbytes: int,
             internal: bool = False) -> None:
        """Register a job the core accepted (before its effects, which may already end it).
        ``internal``: the manager's own job; its result is counted, never handed over."""
        self._open[job_id] = _Job(store, kv_request_id, now, nbytes, internal)
        self._internal += internal

    def finish(self, job_id: int, ok: bool, reason: Reason | None, now: float, *,
               successful_keys: tuple[bytes, ...] | None = None) -> tuple[bool, int, float] | None:
        """Record the result of open job ``job_id`` (``successful_keys``: a failed load's blocks
        that landed verified).  Returns ``(store, nbytes, seconds)`` for metrics, or None for an
        unknown id (a bug, logged; never a second result)."""
        job = self._open.pop(job_id, None)
        if job is None:
            log.error("kvtier: duplicate or unknown job result %d dropped", job_id)
            return None
        elapsed = now - job.submitted
        if job.internal:
            self._internal -= 1
            return job.store, job.nbytes, elapsed
        if ok and not job.store:
            self.report(JobResult(job_id=job_id, success=True, transfer_bytes=job.nbytes, transfer_time_s=elapsed))
        else:
            keys = successful_keys if (successful_keys and not ok and not job.store) else None
            self.report(JobResult(job_id=job_id, success=ok, reason=None if ok else (reason or Reason.TRANSFER_FAILED),
                                  successful_keys=keys))
        return job.store, job.nbytes, elapsed

    def info(self, job_id: int) -> tuple[bool, str | None, float, int] | None:
        """``(store, kv_request_id, submitted, nbytes)`` of open engine job ``job_id``; None for an
        unknown id or the manager's own job (read by the request forensics, :mod:`kvtier.forensics`)."""
        job = self._open.get(job_id)
        if job is None or job.internal:
            return None
        return job.store, job.kv_request_id, job.submitted, job.nbytes

    def report(self, result: JobResult) -> None:
        """Queue ``result`` for the engine (also for jobs that never reached the core)."""
        self._results.append(result)
        self._reported.add(result.job_id)

    def take(self) -> list[JobResult]:
        """Hand over every queued result; their ids are free again."""
        out, self._results = self._results, []
        self._reported.clear()
        return out

    @property
    def ready(self) -> bool:
        """True when results wait to be collected."""
        return bool(self._results)

    def open_ids(self, kv_request_id: str | None = None) -> list[int]:
        """Engine jobs without a result yet (all, or those of ``kv_request_id``)."""
        if kv_request_id is None:
            if not self._internal:
                return list(self._open)
            return [j for j, job in self._open.items() if not job.internal]
        return [j for j, job in self._open.items() if job.kv_request_id == kv_request_id and not job.internal]

    def is_outstanding(self, job_id: int) -> bool:
        """Whether ``job_id`` has no collected result yet (O(1); :meth:`outstanding` builds a set)."""
        return job_id in self._open or job_id in self._reported

    def outstanding(self) -> frozenset[int]:
        """Every engine job id that has no collected result yet (open, or reported but not taken)."""
        if not self._internal:
            return frozenset(self._open) | frozenset(self._reported)
        return frozenset(j for j, job in self._open.items() if not job.internal) | frozenset(self._reported)

    def __len__(self) -> int:
        return len(self._open) - self._internal
