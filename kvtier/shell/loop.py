"""The tick: one service pass, one core step, the performers, and the core again with what they
learned — plus the optional background poll thread that runs ticks.

Picture of one tick (docs/design.md has it with one request's path)::

    transport.service ─┐                     for each input:  core.handle ─► outbound.perform ─┐
    plane.poll ────────┴─► inbound inputs ──►                     ▲                            │
                                                                  └──── inputs they reported ◄─┘
                                             then:  core.fire(quiet_since) ─► perform ─► ...

(the order is :func:`kvtier.lifecycle.driver.drive`'s contract)

The inputs pass through the per-byte work (:mod:`kvtier.shell.perbyte`) on their way: it adds the
stores whose digests are done and the landings that ended, holds what must wait for them, and
lowers the time deadlines may fire up to below what it still holds.

Nothing happens when nothing is due: with no input and no deadline at or before the last quiet
time, the core is not called at all (an idle tick is one poll of the sockets and the plane).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kvtier.lifecycle import TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.driver import drive, settle
from kvtier.shell.inbound import Inbound
from kvtier.shell.outbound import Outbound
from kvtier.shell.perbyte import ByteWork, is_block_data

__all__ = ["Loop", "PollThread"]

log = logging.getLogger("kvtier.manager")

#: Longest a wait for input may block (seconds): engine calls and the poll thread share a lock.
MAX_WAIT_S = 0.05

#: Longest a tick waits for a load's landings on the digest pool once its last blocks landed
#: (seconds): they are a few MiB of hashing already under way; waiting here hands the result over
#: in this tick instead of one poll interval later (decision I16).
SETTLE_S = 0.005

_GLOBAL = (ix.DrainStarted, ix.ShutdownStarted, ix.GraceEnded)


class Loop:
    """Drives one manager's core (callers hold the manager's lock)."""

    def __init__(self, *, core: TierCore, inbound: Inbound, outbound: Outbound, work: ByteWork,
                 clock: Callable[[], float], metrics: Any, logs: Any) -> None:
        self.core = core
        self.inbound = inbound
        self.outbound = outbound
        self.work = work
        self.clock = clock
        self.metrics = metrics
        self.logs = logs

    def apply(self, inp: ix.Input) -> None:
        """Apply one engine input now and perform everything it leads to — unless it must wait
        behind a store whose digests are being taken (then it is applied in its turn).  An input
        about everything (drain, shutdown) first waits for every store in progress.  Misuse
        errors of the core (``InvalidTransition``, ``ValueError``) propagate with nothing
        performed."""
        if isinstance(inp, _GLOBAL):
            for held in self.work.flush():
                self.run(self.core.handle(held, self.clock()))
        elif self.work.holds(inp):
            return
        self.run(self.core.handle(inp, self.clock()))

    def run(self, effects: list) -> None:
        """Perform ``effects``; feed what the performers learned back to the core, until quiet."""
        settle(self.core, effects, self.clock(), self.outbound.perform)

    def tick(self) -> None:
        """One service pass over the network and the plane, then whatever is due (and, with a
        standing block source, a serve window)."""
        before = self.inbound.quiet_since  # everything read in this pass arrived after it
        inputs = self.inbound.collect()
        work = self.work
        # deadlines fire no later than the arrival of anything still held, nor of a block_data
        # read now (its landing may still run when they would fire)
        until = min(self.inbound.quiet_since, work.floor())
        if any(map(is_block_data, inputs)):
            until = min(until, before)
        core = self.core
        due = core.next_deadline()
        firing = due is not None and due <= until
        if inputs or firing or work.ready():
            now = self.clock()
            if firing:
                self.metrics.tick_lag(now - due)
            drive(core, work.inputs(inputs, before), now, deadlines_at=until, perform=self.outbound.perform)
            if work.settle:
                work.settle = False
                plane = self.outbound.plane
                if plane.finish_landings(SETTLE_S):
                    reports = self.inbound.reports(plane.poll())
                    drive(core, work.inputs(reports, before), self.clock(), deadlines_at=None,
                          perform=self.outbound.perform)
        serving = self.outbound.serving
        if serving.standing is not None and serving.pending():
            self.serve(serving.standing)
        if core.quarantined_count():
            self._report_quarantine()

    def serve(self, source: Any) -> int:
        """One serve window with ``source`` (:mod:`kvtier.shell.serving`): each lookup's answer is
        applied, and what it leads to performed, before the next lookup."""
        core = self.core

        def apply(inp: ix.Input) -> None:
            self.run(core.handle(inp, self.clock()))

        return self.outbound.serving.run(source, core.serve_wants, apply)

    def _report_quarantine(self) -> None:
        """Blocks held back from the engine because the plane never released them: say so, loudly
        and rate-limited (the gauge ``kvtier_quarantined_blocks`` counts them)."""
        ids, blocks = self.core.quarantined_count(), self.core.quarantined_blocks()
        self.logs("*", "quarantined",
                  "kvtier: %d ids (%d blocks) quarantined: the data plane has not released them; their store "
                  "jobs stay outstanding so the engine cannot reuse blocks a send may still read", ids, blocks)

    def wait_budget(self) -> float:
        """How long a wait for input may block: until the next deadline, at most
        :data:`MAX_WAIT_S`, and no longer than the data plane's progress allows."""
        nd = self.core.next_deadline()
        budget = MAX_WAIT_S
        # a deadline held back by work still running (a landing on the pool) cannot fire before
        # that work ends: the plane's wait below bounds the sleep, not the deadline (else: a spin)
        if nd is not None and nd <= self.work.floor():
            budget = min(budget, max(0.0, nd - self.clock()))
        # e.g. a UCX tcp target must progress WRITEs into it, but only while a load is out
        plane = self.outbound.plane.max_wait_s(receiving=self.core.loading())
        if plane is not None:
            budget = min(budget, plane)
        digests = self.work.max_wait_s()
        return budget if digests is None else min(budget, digests)


class PollThread:
    """``background_poll``: a daemon thread that waits for input and ticks every
    ``interval_s`` at most, under the manager's lock (as vLLM's own tier-poll thread does); the
    yield between rounds lets engine calls in."""

    def __init__(self, *, lock: threading.RLock, loop: Loop, wait: Callable[[float], Any], interval_s: float,
                 closed: Callable[[], bool], on_error: Callable[[], None]) -> None:
        self._lock = lock
        self._loop = loop
        self._wait = wait
        self._interval = interval_s
        self._closed = closed
        self._on_error = on_error
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kvtier-poll", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        interval = self._interval
        while not self.stop.is_set():
            try:
                with self._lock:
                    if self._closed():
                        return
                    self._wait(min(interval, self._loop.wait_budget()))
                    self._loop.tick()
            except Exception:  # never let the thread die silently
                self._on_error()
                log.exception("kvtier: poll thread error")
                self.stop.wait(interval)
            time.sleep(0)  # yield the GIL so a thread blocked on the lock gets in

    def join(self, timeout_s: float = 5.0) -> None:
        self.stop.set()
        self.thread.join(timeout=timeout_s)

    def is_current(self) -> bool:
        return threading.current_thread() is self.thread
