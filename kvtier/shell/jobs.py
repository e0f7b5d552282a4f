"""The job book: every job the engine handed the manager, until its one result is collected.

The core decides *when* a job ends and how (its ``JobDone`` effect); this book makes the
engine-facing promise hold: exactly one :class:`~kvtier.api.JobResult` per submitted job id, and an
id stays taken until :meth:`JobBook.take` handed that result over (so a resubmission before then
is a ``DuplicateJob``, not a second result).  It also keeps what a result reports besides success:
bytes moved and seconds from submit to result.

Two threads use it: the engine's (:meth:`~JobBook.check_new`, :meth:`~JobBook.open`,
:meth:`~JobBook.take` and the reads) and the I/O loop's (:meth:`~JobBook.finish`, which queues a
result).  One small lock guards the three maps for the length of a dictionary operation; it is
never held while anything waits (decision C12).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

import msgspec

from kvtier.api import DuplicateJob, JobResult
from kvtier.lifecycle import ConsumerState, Reason

__all__ = ["JobBook"]

log = logging.getLogger("kvtier.manager")


class _Job(msgspec.Struct, gc=False):
    store: bool
    kv_request_id: str | None
    submitted: float
    nbytes: int
    internal: bool = False  # the manager's own job (load_nothing): its result is not handed over
    slots: tuple[int, ...] = ()  # a load's slots, taken until its result (decision A9)


class JobBook:
    """Outstanding jobs and uncollected results of one manager."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, _Job] = {}
        self._internal = 0  # open internal jobs
        self._results: deque[JobResult] = deque()
        self._reported: set[int] = set()
        self._loading: set[int] = set()  # the slots open load jobs write into
        self.held = False
        """While True, :meth:`take` hands nothing over: shutdown's last results wait until the
        data plane is closed, so no slot is reused while a peer may still write into it (I41)."""

    # -- the engine's side -----------------------------------------------------------------------
    def check_new(self, job_id: int) -> None:
        """Raises :class:`~kvtier.api.DuplicateJob` if ``job_id`` is outstanding or its result was
        not collected yet."""
        if job_id in self._open:
            raise DuplicateJob(f"job {job_id} is already outstanding")
        if job_id in self._reported:
            raise DuplicateJob(f"job {job_id} is already outstanding (its result has not been collected yet)")

    def open(self, job_id: int, *, store: bool, kv_request_id: str | None, now: float, nbytes: int,
             internal: bool = False, slots: tuple[int, ...] = ()) -> None:
        """Register a job before its command reaches the loop (which reports its one result).
        ``internal``: the manager's own job; its result is counted, never handed over.  ``slots``:
        a load's slots, which no other load may name until this job's result (decision A9).

        Raises:
            DuplicateJob: as :meth:`check_new` — checked under the lock, so two engine threads
                submitting one id cannot both register it (nothing is registered).
            ValueError: a slot of ``slots`` belongs to a load job without a result yet (nothing is
                registered).
        """
        with self._lock:
            if job_id in self._open or job_id in self._reported:
                self.check_new(job_id)
            if slots:
                if not self._loading.isdisjoint(slots):
                    raise ValueError(_taken(job_id, slots, self._open))
                self._loading.update(slots)
            self._open[job_id] = _Job(store, kv_request_id, now, nbytes, internal, slots)
            self._internal += internal

    def take(self) -> list[JobResult]:
        """Hand over every queued result; their ids are free again."""
        out: list[JobResult] = []
        results = self._results
        if not results or self.held:
            return out
        with self._lock:
            while results:
                r = results.popleft()
                self._reported.discard(r.job_id)
                out.append(r)
        return out

    # -- the loop's side -------------------------------------------------------------------------
    def finish(self, job_id: int, ok: bool, reason: Reason | None, now: float, *,
               successful_keys: tuple[bytes, ...] | None = None) -> tuple[bool, int, float, bool] | None:
        """Record the result of open job ``job_id`` (``successful_keys``: a failed load's blocks
        that landed verified).  Returns ``(store, nbytes, seconds, internal)`` for metrics
        (``internal``: the manager's own job, whose result no engine sees, so no series counts it),
        or None for an unknown id (a bug, logged; never a second result)."""
        with self._lock:
            job = self._open.get(job_id)
            if job is None:
                log.error("kvtier: duplicate or unknown job result %d dropped", job_id)
                return None
            elapsed = now - job.submitted
            if job.slots:  # a load's result is final: no write into its slots can still land
                self._loading.difference_update(job.slots)
            if job.internal:
                del self._open[job_id]
                self._internal -= 1
                return job.store, job.nbytes, elapsed, True
            if ok and not job.store and reason is not Reason.LOCAL:
                r = JobResult(job_id=job_id, success=True, transfer_bytes=job.nbytes, transfer_time_s=elapsed)
            else:
                keys = successful_keys if (successful_keys and not ok and not job.store) else None
                r = JobResult(job_id=job_id, success=ok, reason=None if ok else (reason or Reason.TRANSFER_FAILED),
                              successful_keys=keys)
            # reported before it leaves the open map: a lock-free is_outstanding never misses it
            self._reported.add(job_id)
            self._results.append(r)
            del self._open[job_id]
        return job.store, job.nbytes, elapsed, False

    # -- reads (any thread) ----------------------------------------------------------------------
    def info(self, job_id: int, *, own: bool = False) -> tuple[bool, str | None, float, int] | None:
        """``(store, kv_request_id, submitted, nbytes)`` of open engine job ``job_id``; None for an
        unknown id or — unless ``own`` — the manager's own job (``own``: the request forensics,
        :mod:`kvtier.forensics`, for which a ``load_nothing`` ends its request's story)."""
        job = self._open.get(job_id)
        if job is None or (job.internal and not own):
            return None
        return job.store, job.kv_request_id, job.submitted, job.nbytes

    @property
    def ready(self) -> bool:
        """True when results wait to be collected (and may be: not :attr:`held`)."""
        return bool(self._results) and not self.held

    def open_ids(self, kv_request_id: str | None = None) -> list[int]:
        """Engine jobs without a result yet (all, or those of ``kv_request_id``)."""
        with self._lock:
            if kv_request_id is None:
                if not self._internal:
                    return list(self._open)
                return [j for j, job in self._open.items() if not job.internal]
            return [j for j, job in self._open.items() if job.kv_request_id == kv_request_id and not job.internal]

    def is_outstanding(self, job_id: int) -> bool:
        """Whether ``job_id`` has no collected result yet (O(1))."""
        return job_id in self._open or job_id in self._reported

    def outstanding(self) -> frozenset[int]:
        """Every engine job id that has no collected result yet (open, or reported but not taken)."""
        with self._lock:
            if not self._internal:
                return frozenset(self._open) | frozenset(self._reported)
            return frozenset(j for j, job in self._open.items() if not job.internal) | frozenset(self._reported)

    def __len__(self) -> int:
        return len(self._open) - self._internal

    def still_writable(self, core: Any, peers: tuple[str, ...]) -> set[int]:
        """The open load jobs whose slots ``peers`` may still write at shutdown (the plane could not
        revoke their access, decision N27): they get no result, so the engine never reuses those
        slots; each is logged with its slots and producer."""
        if not peers:
            return set()
        with self._lock:
            kids = {job.kv_request_id for job in self._open.values() if not job.store and job.kv_request_id}
        views = [v for v in (*core.round_loads(), *(core.consumer(k) for k in sorted(kids)))
                 if v is not None and v.peer in peers and v.state is ConsumerState.REVOKING and v.job_id is not None]
        for v in views:
            log.error("kvtier: load job %d (%s) gets no result: its %d slots %s may still be written by %s, which "
                      "runs on this host and could not be revoked at shutdown (a pool in private memory: only "
                      "its end proves it done); do not reuse them while that process lives (decision N27)",
                      v.job_id, v.kv_request_id, len(v.slots), list(v.slots[:8]), v.peer)
        return {v.job_id for v in views}


def _taken(job_id: int, slots: tuple[int, ...], open_jobs: dict[int, _Job]) -> str:
    owner = {s: j for j, job in open_jobs.items() for s in job.slots}  # the error path only
    taken = [s for s in slots if s in owner]
    owners = sorted({owner[s] for s in taken})
    shown = ", ".join(map(str, taken[:8])) + (f", … ({len(taken)} in all)" if len(taken) > 8 else "")
    jobs = ", ".join(map(str, owners[:4])) + (", …" if len(owners) > 4 else "")
    return (f"submit_load job {job_id}: slot{'s' if len(taken) > 1 else ''} {shown} "
            f"{'are' if len(taken) > 1 else 'is'} still being loaded by job{'s' if len(owners) > 1 else ''} {jobs}: "
            "a slot takes one load at a time, so submit this load after that job's result "
            "(get_finished_jobs), or into other slots")
