"""The I/O loop: the one owner of a manager's sockets, data plane and core (decision C12).

Engine calls never touch them.  The façade (:mod:`kvtier.manager`) checks a call's arguments,
hands the loop one *command* (:meth:`IoLoop.input`, :meth:`IoLoop.store`, …: a function and its
argument on a queue), wakes it if it sleeps, and returns; results come back through the job book
(:mod:`kvtier.shell.jobs`), answers to ``lookup`` from what the loop publishes after each pass
(:mod:`kvtier.shell.published`).

One pass::

    commands ──► core ──► performers ─┐        (each engine input, in the order the engine made them)
    transport.service ─┐              │
    plane.poll ────────┴► inputs ──► drive(core, inputs, now, deadlines_at=quiet_since,
                                            held=work.floor, **outbound.hooks)
                                     └► serve window (standing source) ─► publish

and between passes one wait: ``transport.wait`` polls the sockets, the monitors *and* the loop's
wake-up eventfd (written by an engine call that queued a command while the loop slept, and by the
digest pool when a digest or landing it ran is done), until input arrives or the next deadline
(the core's, or a plane's progress interval) is due: no fixed cadence.

Two ways to run it, one code path:

* **thread** (``background_poll``): :meth:`IoLoop.start` runs passes on the ``kvtier-io`` thread;
* **caller-driven**: an engine call's command runs at once on the caller's thread, after what the
  network delivered before it, and :meth:`IoLoop.poll` runs one pass there (the suites step it so).

:attr:`IoLoop.lock` is held for the length of a pass, never while the loop waits; engine calls do
not take it; readers that want a consistent view of the core (metrics at scrape, tests) take it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from kvtier.config import TierConfig
from kvtier.lifecycle import ConsumerState, ProbeState, Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.driver import drive, settle
from kvtier.lifecycle.errors import InvalidTransition
from kvtier.shell import switch
from kvtier.shell.build import Parts
from kvtier.shell.lookups import Lookups
from kvtier.shell.published import Published
from kvtier.shell.serving import ServeWindows
from kvtier.shell.waker import Waker

__all__ = ["EAGER_S", "EAGER_WAIT_S", "IoLoop", "PlaneActivity", "eager"]

log = logging.getLogger("kvtier.manager")

#: Longest one wait for input when nothing is due (seconds): a bound, not a cadence.  While a
#: standing block source's keys are pending, it is looked up again every REPOLL_S (decision Y24).
MAX_WAIT_S, REPOLL_S = 0.25, 0.001

#: For this long after a message or a transfer left, or the plane's last post or report, a one-sided
#: plane is progressed every :data:`EAGER_WAIT_S` (seconds): its answer — a WRITE's completion, the
#: notification that carries a batch's header — is seen only when the plane is progressed, on both
#: sides (decisions C20, C27; :func:`eager`).
EAGER_S = 0.002
EAGER_WAIT_S = 0.0001

#: Longest a pass waits for a load's landings on the digest pool once its last blocks landed (s):
#: hashing already under way, this hands the result over in the pass that read them (I16).
SETTLE_S = 0.005

_GLOBAL = (ix.DrainStarted, ix.ShutdownStarted, ix.GraceEnded)

Command = tuple[Callable[[Any], Any], Any]


def eager(now: float, transfer_at: float, message_at: float, plane_at: float, wants_progress: bool) -> bool:
    """Whether a one-sided plane is progressed every :data:`EAGER_WAIT_S` now (times in seconds,
    the manager's clock): for :data:`EAGER_S` after a transfer left (its header leaves only as our
    side progresses, C25); after a message left or the plane's own last activity (a WRITE posted,
    or a report: a notification, a transfer released, a landing — the next WRITE's end, and its
    header, come the same way, C27) only while the plane wants progress (``wants_progress``: a
    load of ours or a WRITE is out) — after a refusal or a receipt nothing comes through it."""
    if now - transfer_at < EAGER_S:
        return True
    return wants_progress and (now - message_at < EAGER_S or now - plane_at < EAGER_S)


class PlaneActivity:
    """When a pass last saw the data plane post or report something (:attr:`at`, manager clock)."""

    __slots__ = ("_seen", "at")

    def __init__(self) -> None:
        self.at = float("-inf")
        self._seen = (0, 0)

    def saw(self, posts: int, reports: int, clock: Callable[[], float]) -> None:
        """A pass saw the plane's ``posts`` since start and the ``reports`` turned into inputs
        since start: either moved since the last pass, the plane was active now."""
        if (posts, reports) != self._seen:
            self._seen = (posts, reports)
            self.at = clock()


class IoLoop:
    """One manager's I/O loop (see the module docstring).

    Args:
        parts: what it owns (:func:`kvtier.shell.build.build_parts`).
        config: the manager's config.
        clock: seconds (the manager's clock).
        lock: the pass lock (an ``RLock``; the metrics scrape takes it too).
    """

    def __init__(self, parts: Parts, *, config: TierConfig, clock: Callable[[], float],
                 lock: threading.RLock) -> None:
        self.transport = parts.transport
        self.plane = parts.plane
        self.core = parts.core
        self.digest_pool = parts.digest_pool
        self.metrics = parts.metrics
        self.logs = parts.logs
        self.work = parts.work
        self.inbound = parts.inbound
        self.outbound = parts.outbound
        self.jobs = parts.jobs
        self.serving: ServeWindows = parts.outbound.serving
        self.config = config
        self.clock = clock
        self.lock = lock
        self.passes = 0
        """Passes that applied something to the core (commands, inputs, deadlines): a request's
        cost in passes (tests count them; decision C13)."""
        self.plane_activity = PlaneActivity()
        self.published = Published()
        self.outbound.load_ending = lambda kid: self.published.load_ended(self.core, kid)  # before its result
        self._stale = False
        self._cmds: deque[Command] = deque()
        self._waker = Waker()
        self.transport.set_wake(self._waker.fd)
        if self.digest_pool is not None:
            self.digest_pool.notify = self._waker.wake
        self.outbound.lookups = Lookups(self._waker.wake)
        self._thread: threading.Thread | None = None
        self._stop = False
        self._sleeping = False
        self._pass_done = threading.Condition(threading.Lock())
        self._waiters = 0
        self.closed = False
        # last: nothing after it can fail; a loop collected without a close lets go of it then
        self._switch = weakref.finalize(self, switch.release, switch.claim(config.gil_switch_interval_s))

    # =========================================================================================
    # The engine's side: hand a command over, wake the loop, return
    # =========================================================================================
    def call(self, fn: Callable[[Any], Any], arg: Any = None) -> None:
        """Queue ``fn(arg)`` for the loop.  Threaded: wakes the loop if it sleeps and returns;
        caller-driven (or closed): applies what the network delivered before this call, then runs
        it and whatever it leads to, now on this thread (arrival order, decision C33)."""
        self._cmds.append((fn, arg))
        if self._thread is not None:
            if self._sleeping:
                self._waker.wake()
            return
        self._inline()

    def defer(self, fn: Callable[[Any], Any], arg: Any, kv_request_id: str | None) -> None:
        """Queue ``fn(arg)`` for the loop, waking it only if a fetch awaits the producer id
        ``kv_request_id`` (decision C34): anything else about a producer id — a store, its naming,
        its finish — waits for the loop's next pass (the next message, deadline or wake-up, a
        :meth:`kick` from ``get_finished_jobs``, at most :data:`MAX_WAIT_S`), and the engine's
        thread pays no wake-up.  Caller-driven: as :meth:`call`."""
        self._cmds.append((fn, arg))
        if self._thread is None:
            self._inline()
        # both reads after the append: an id a fetch awaits is seen here, or this command by the loop's last look (C34)
        elif self._sleeping and kv_request_id in self.published.awaiting:
            self._waker.wake()

    def hand_over_store(self, fn: Callable[[Any], Any], arg: Any, kv_request_id: str | None, blocks: int) -> None:
        """Queue a store command of ``blocks`` blocks (C34): a local-only one (``kv_request_id``
        None: the engine waits for its result) or one whose digests go to the pool (they should
        start at once) wakes the loop; any other is deferred (:meth:`defer`, whose reads after the
        append this repeats: the engine's thread pays one flat call per store, C25)."""
        self._cmds.append((fn, arg))
        if self._thread is None:
            self._inline()
        elif self._sleeping and (kv_request_id is None or kv_request_id in self.published.awaiting
                                 or blocks >= self.work.pool_from):
            self._waker.wake()

    def kick(self) -> None:
        """Wake a sleeping loop that has commands queued (deferred ones, :meth:`defer`)."""
        if self._cmds and self._sleeping:
            self._waker.wake()

    def _inline(self) -> None:
        with self.lock:
            self._catch_up()
            self.run_commands()
            self._stale = True

    def _catch_up(self) -> None:
        """Caller-driven, under the lock: apply what the network delivered before the engine's
        call (one tick), so the call sees the core the I/O thread would have shown it (C33).  A
        failed tick is counted and logged, never raised from the engine's call."""
        if not self.closed:
            try:
                self.tick()
            except Exception:
                self.metrics.internal_error()
                log.exception("kvtier: I/O loop error")

    def fresh(self) -> Published:
        """What the loop published, current: threaded, as of its last pass (the engine's thread
        must not read the core); caller-driven, brought up to date now on this thread (which is
        the loop's) if a command or a pass applied something since — publishing after every
        inline command would cost each engine call a full refresh."""
        if self._stale and self._thread is None:
            with self.lock:
                self._stale = False
                self._publish()
        return self.published

    def input(self, inp: ix.Input) -> None:
        """Queue one engine input for the core."""
        self.call(self.apply, inp)

    def store(self, inp: ix.StoreSubmitted) -> None:
        """Queue a store: the loop takes its blocks' digests (inline or on the pool) before the
        core sees it (decision I14); deferred unless a fetch awaits its id or its digests go to
        the pool, which should start at once (C34)."""
        self.hand_over_store(self.park, inp, inp.kv_request_id, len(inp.blocks))

    def query(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the loop with every command queued before it applied, and return its
        value (or raise its exception).  Threaded: the caller waits for the loop to get to it —
        only for rare calls that need the core's word at once (a serve window, an id reused
        while its previous load winds down); caller-driven: after what the network delivered
        before it (C33)."""
        if self._thread is None or self._thread is threading.current_thread():
            with self.lock:
                if self._thread is None:
                    self._catch_up()
                self.run_commands()
                try:
                    return fn()
                finally:
                    self._publish()
        done = threading.Event()
        box: list[Any] = []

        def run(_: Any) -> None:
            try:
                box.append((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box.append((False, exc))
            finally:
                done.set()

        self._cmds.append((run, None))
        self._waker.wake()
        while not done.wait(1.0):
            if self._thread is None or not self._thread.is_alive():
                raise RuntimeError("the kvtier I/O loop stopped")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def wait_pass(self, timeout_s: float) -> None:
        """Threaded: block until the loop finished another pass, at most ``timeout_s`` (capped)."""
        with self._pass_done:
            self._waiters += 1
            try:
                self._pass_done.wait(min(timeout_s, threading.TIMEOUT_MAX))
            finally:
                self._waiters -= 1

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    # =========================================================================================
    # The loop's side
    # =========================================================================================
    def run_commands(self) -> None:
        """Apply every queued command, in order (under :attr:`lock`)."""
        cmds = self._cmds
        while cmds:
            fn, arg = cmds.popleft()
            try:
                fn(arg)
            except Exception:  # never lose the loop to one command
                self.metrics.internal_error()
                log.exception("kvtier: an engine command failed in the I/O loop")
            self.passes += 1

    def apply(self, inp: ix.Input) -> None:
        """On the loop (inside a command): apply one engine input and perform everything it leads
        to — unless it must wait behind a store whose digests are being taken (then it is applied
        in its turn).  An input about everything (drain, shutdown) first waits for every store in
        progress.  A job the core refuses (a reject rule, a shape it cannot take) is settled
        failed, by the core."""
        if isinstance(inp, _GLOBAL):
            for held in self.work.flush():
                self._run(held)
        elif self.work.holds(inp):
            return
        self._run(inp)
        t = type(inp)  # what the published answers must look at again (inputs, not messages)
        if t is ix.LoadAnnounced or t is ix.ProbeAnnounced:
            self.published.announced.add(inp.kv_request_id)
        elif t is ix.RequestFinished and not inp.producer:
            self.published.finishing.add(inp.kv_request_id)

    def _run(self, inp: ix.Input) -> None:
        try:
            effects = self.core.handle(inp, self.clock())
        except (InvalidTransition, ValueError) as exc:
            job = getattr(inp, "job_id", None)
            if job is None:
                raise
            reason = Reason(exc.reason) if isinstance(exc, InvalidTransition) else Reason.JOB_REFUSED
            log.warning("kvtier: job %d refused by the core: %s", job, exc)
            effects = self.core.handle(inp := ix.JobSettled(job, False, reason), self.clock())
        self.outbound.applied(inp)
        settle(self.core, effects, self.clock(), **self.outbound.hooks)

    def park(self, inp: ix.StoreSubmitted) -> None:
        """On the loop (inside a command): a checked store, its digests taken first (I14)."""
        pool = self.outbound.pool
        ready = self.work.store(inp, [pool.buffer(b) for b in inp.blocks])
        if ready is not None:  # else: held for its digests, applied (and its age started) by a later pass
            self.metrics.parked(inp.kv_request_id)  # before the store: the first one starts the age
            self._run(ready)

    # -- commands the façade hands over (run on the loop) ----------------------------------------------
    def holds_consumer(self, kid: str) -> bool:
        """Whether the core still holds a consumer, probe or round load of ``kid`` (L15: not free yet)."""
        core = self.core
        return (core.consumer_state(kid) is not ConsumerState.ABSENT
                or core.probe_state(kid) is not ProbeState.ABSENT or bool(core.round_loads(kid)))

    def schedule_end(self, keys: tuple[tuple[str, tuple[bytes, ...]], ...]) -> None:
        """The engine step ended: ``ScheduleEnded`` with the step's lookups, ``(kv_request_id,
        keys)`` per request (one probe per (peer, id) per step, decisions Y4, Y26), then a window
        for a standing source."""
        self.apply(ix.ScheduleEnded(keys))
        if self.serving.standing is not None:
            self.serve(self.serving.standing)

    def load_nothing(self, arg: tuple[str, int]) -> None:
        """An empty load (``KvTierManager.load_nothing``) for the internal job ``arg[1]`` if the consumer
        record of ``arg[0]`` is still only announced; else the core ends the job."""
        kid, job_id = arg
        if self.core.consumer_state(kid) is ConsumerState.ANNOUNCED:
            self.apply(ix.LoadSubmitted(kid, job_id, (), ()))
        else:  # decided meanwhile (its own dial failed): the job ends with what decided it (E11)
            why = getattr(self.core.consumer(kid), "reason", None)
            self.apply(ix.JobSettled(job_id, False, why or Reason.JOB_REFUSED))

    def tick(self) -> None:
        """One service pass over the network and the plane, then whatever is due (and, with a
        standing block source, a serve window)."""
        work, core = self.work, self.core
        due = core.next_deadline()  # a pass late for it crosses the transport's barrier first (T17)
        inputs = self.inbound.collect(receiving=core.loading(), due=due)
        if self.outbound.lookups.ready:  # type: ignore[union-attr]
            inputs[:0] = self.outbound.looked_up()
        quiet = self.inbound.deadlines_at(self.clock())
        firing = due is not None and due <= quiet and due <= work.floor()
        if inputs or firing or work.ready():
            now = self.clock()
            if firing:
                self.metrics.tick_lag(now - due)
            drive(core, work.inputs(inputs), now, deadlines_at=quiet, held=work.floor, **self.outbound.hooks)
            self.passes += 1
            if work.settle:
                work.settle = False
                if self.plane.finish_landings(SETTLE_S):
                    reports = self.inbound.reports(self.plane.poll())
                    drive(core, work.inputs(reports), self.clock(), deadlines_at=None, **self.outbound.hooks)
        serving = self.serving
        if serving.standing is not None and serving.wanted():
            self.serve(serving.standing)
        if core.quarantined_count():
            self._report_quarantine()
        if self.plane.one_sided:  # after the pass: its posts and its settle-path reports count too
            self.plane_activity.saw(self.plane.posts, self.inbound.reported, self.clock)

    def serve(self, source: Any) -> int:
        """One serve window with ``source`` (:mod:`kvtier.shell.serving`): each lookup's answer is
        applied, and what it leads to performed, before the next lookup."""
        return self.serving.run(source, self.core.serve_room, self._run, self.core.serve_lookup_budget)

    def one_pass(self) -> None:
        """Commands, then the network, then publish (under :attr:`lock`) — only after a pass
        that applied something, or while the last answers said work is pending (queued sends
        flushing, a transfer's release: no input reports those)."""
        before = self.passes
        self.run_commands()
        self.tick()
        if self.passes != before or self.published.pending:
            if self._thread is None:
                self._stale = True  # caller-driven: published when the engine asks (fresh())
            else:
                self._publish()

    def _publish(self) -> None:
        self.published.update(self)
        if self._waiters:
            with self._pass_done:
                self._pass_done.notify_all()

    def _report_quarantine(self) -> None:
        """Blocks held back from the engine because the plane never released them: say so, loudly
        and rate-limited (the gauge ``kvtier_quarantined_blocks`` counts them)."""
        ids, blocks = self.core.quarantined_count(), self.core.quarantined_blocks()
        self.logs("*", "quarantined",
                  "kvtier: %d ids (%d blocks) quarantined: the data plane has not released them; their store "
                  "jobs stay outstanding so the engine cannot reuse blocks a send may still read", ids, blocks)

    def wait_budget(self) -> float:
        """How long the next wait may block: until the core's next deadline, no longer than the
        data plane's progress allows, at most :data:`MAX_WAIT_S`."""
        if self.inbound.behind:  # read, not yet decoded: sockets may be empty, nothing would wake us
            return 0.0
        budget = MAX_WAIT_S
        nd = self.core.next_deadline()
        # a deadline held back by work still running (a landing on the pool) cannot fire before
        # that work ends, which wakes the loop: the deadline does not bound the sleep (else: a spin)
        if nd is not None and nd <= self.work.floor():
            budget = min(budget, max(0.0, nd - self.clock()))
        # e.g. a UCX tcp target must progress WRITEs into it, but only while a load is out
        plane = self.plane.max_wait_s(receiving=self.core.loading())
        if plane is not None:
            budget = min(budget, plane)
        if self.serving.standing is not None and self.serving.wanted():
            budget = min(budget, REPOLL_S)
        if self.plane.one_sided:
            out = self.outbound
            if eager(self.clock(), out.posted_at, out.sent_at, self.plane_activity.at, plane is not None):
                budget = min(budget, EAGER_WAIT_S)
        return budget

    def poll(self, timeout_s: float) -> None:
        """Caller-driven: wait up to ``timeout_s`` for input (or the wake-up), then one pass.
        Threaded: wait up to ``timeout_s`` for the loop's next pass (one that takes what is
        queued: a deferred command wakes it now, C34)."""
        if self._thread is not None:
            self.kick()
            if timeout_s > 0:
                self.wait_pass(timeout_s)
            return
        if self.closed:
            return
        # the wait too under the lock: the sockets are not thread-safe, and an engine call from
        # another thread (outside the contract) then waits for it, where libzmq would abort (A12)
        with self.lock:
            if timeout_s > 0:
                budget = self.wait_budget()
                if not self._cmds:
                    self.transport.wait(min(timeout_s, budget))
                self._waker.clear()
            self.one_pass()

    # -- the thread -------------------------------------------------------------------------------
    def start(self) -> None:
        """Run passes on the ``kvtier-io`` thread from now on."""
        if self._thread is not None:
            return
        self._stop = False
        self._thread = threading.Thread(target=self._main, name="kvtier-io", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread after its current pass; from then on the loop is caller-driven."""
        t = self._thread
        if t is None:
            return
        self._stop = True
        self._waker.wake()
        if t is not threading.current_thread():
            t.join(timeout_s)
            if t.is_alive():
                log.error("kvtier: the I/O loop did not stop within %.1f s", timeout_s)
        self._thread = None

    def _main(self) -> None:
        lock, cmds, waker, transport = self.lock, self._cmds, self._waker, self.transport
        while not self._stop:
            try:
                with lock:
                    self.one_pass()
                    budget = self.wait_budget()
                if cmds or self._stop:
                    continue
                self._sleeping = True
                if not cmds:  # a command queued after the flag was set wakes the wait below
                    transport.wait(budget)
                self._sleeping = False
                waker.clear()
            except Exception:  # never let the thread die silently
                self._sleeping = False
                self.metrics.internal_error()
                log.exception("kvtier: I/O loop error")
                threading.Event().wait(0.01)

    # =========================================================================================
    # Drain and the end (the façade's drain_jobs and shutdown; their contracts are documented there)
    # =========================================================================================
    def drain(self, start: float, timeout_s: float | None) -> None:
        """Apply ``DrainStarted``; return once no job is open, no pin held and no command queued.

        Raises:
            TimeoutError: ``timeout_s`` (wall seconds from ``start``) passed first."""
        self.input(ix.DrainStarted())
        while True:
            if self._thread is None:
                self.poll(0.0)
            pub = self.fresh()
            if not len(self.jobs) and not pub.pins and not self._cmds:
                return
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"drain_jobs: {len(self.jobs)} jobs and {pub.pins} pins still outstanding "
                                   f"after {timeout_s} s")
            self.poll(0.01)

    def shutdown(self, start: float, grace_s: float) -> None:
        """``ShutdownStarted``; work in flight gets 80 % of the grace; the thread stops, ``GraceEnded``
        ends what is left (goodbyes) and :meth:`close` lingers the rest of the grace for them."""
        self.call(lambda _: (self.apply(ix.ShutdownStarted()), self.transport.flush()))
        work_until = start + 0.8 * grace_s  # leave a slice of the grace for the goodbyes to flush
        while time.monotonic() < work_until:
            if self._thread is None:
                self.poll(0.0)
            if not self._cmds and not self.query(self.core.busy):
                break
            self.poll(min(0.005, max(0.0, work_until - time.monotonic())))
        self.stop()
        self.jobs.held = not self.closed  # GraceEnded's results wait for the plane's close (I41)
        try:
            with self.lock:
                self.run_commands()
                self.apply(ix.GraceEnded())
                self.transport.flush()
        finally:
            # at most a day (libzmq's linger ends at ~24.8 days); at least the goodbyes' slice, within the grace
            self.close(linger_s=min(86_400.0, max(min(0.05, 0.2 * grace_s), grace_s - (time.monotonic() - start))))

    def close(self, linger_s: float) -> None:
        """Close the transport (queued sends get ``linger_s``), then the plane (its work in flight: the rest)."""
        with self.lock:
            if self.closed:
                return
            self.closed, until = True, time.monotonic() + linger_s
            try:
                self.run_commands()
                self.transport.close(linger_s=linger_s)
                self._finish_plane(until - time.monotonic())
            finally:
                self.outbound.pool = None  # a shut-down manager never touches its pool again
                self.jobs.held = False  # the plane is closed: no peer writes a slot that has a result (N27)
                if self.digest_pool is not None:
                    self.digest_pool.close()
                self._waker.close()
                self._switch()
                self._publish()

    def close_abruptly(self) -> None:
        """Close the sockets now, no goodbye, no further results (a crash, seen from the peers)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            try:
                self.transport.close()
                self.plane.close()  # its agent goes too, as in a crash: nothing of it outlives the manager
                if self.digest_pool is not None:
                    self.digest_pool.close()  # lets its running work end: none starts again
                self._waker.close()
            finally:
                self._switch()

    def _finish_plane(self, wait_s: float) -> None:
        inputs = self.inbound.reports(self.plane.close(wait_s))  # landings still running end first
        now = self.clock()
        drive(self.core, self.work.inputs(inputs), now, deadlines_at=None, **self.outbound.hooks)
        drive(self.core, self.work.drain(), now, deadlines_at=None, **self.outbound.hooks)
        held = self.jobs.still_writable(self.core, getattr(self.plane, "unrevoked", ()))  # slots unsafe: N27
        for job_id in self.jobs.open_ids():  # nothing else should remain; never leave a job without a result
            if job_id not in held:
                log.error("kvtier: job %d had no result at shutdown; failing it", job_id)
                self._run(ix.JobSettled(job_id, False, Reason.SHUTDOWN))
        # no serve window comes after shutdown: engine lookup contexts go with the engine
        self.serving.drop_contexts()
