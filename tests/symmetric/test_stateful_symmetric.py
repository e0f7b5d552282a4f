"""Random interleavings of the symmetric path (Hypothesis): one consumer core, one producer core,
their engines, the network, the data plane, time, crashes, drain and shutdown.

Every step runs the harness's checks (``pin_released_once``, ``no_hit_without_pin``,
``no_block_after_release``, ``lookup_context_closed_once``, ``partial_keys_verified``,
``result_after_last_write``, ``failed_keys_miss``, ``probe_answered_in_bound``,
``exactly_once_job_result``).  :class:`SymmetricHonest` (the suite's machine) adds a block corrupt at
the source (every load of it fails its digest check), landings that end in a later step (a copy
on the digest pool) and an engine that, like vLLM's, does not look up again a key it holds (loaded,
or a failed load's successful prefix).  At the end everything is run to
quiescence and the liveness half is checked: every job has exactly one result, every pin was
released, every context closed, and no lookup answers RETRY any more.  (The exhaustive version of
this is the model checker's ``symmetric`` profile: docs/modelcheck.md.)
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvtier.lifecycle import Answer, InvalidTransition
from kvtier.lifecycle import inputs as ix
from tests.symmetric.harness import SymNet, make_core
from tools.coreview import CoreView

KEYS = [bytes([i]) * 8 for i in range(1, 5)]


class Symmetric(RuleBasedStateMachine):
    @initialize(present=st.sets(st.integers(0, 3)), pending=st.sets(st.integers(0, 3)),
                one_sided=st.booleans(), serve=st.sampled_from([True, True, True, False]),
                stage=st.sampled_from(["fresh", "connected", "offered", "loading"]))
    def setup(self, present: set[int], pending: set[int], one_sided: bool, serve: bool, stage: str = "fresh") -> None:
        """A fresh pair, or one driven (FIFO, nothing lost) to a later stage to start from: a
        ready session, an answered round, or a round's load in flight (deep states in few steps)."""
        self._setup(present, pending, one_sided, serve)
        self._advance_to(stage)

    def _advance_to(self, stage: str) -> None:
        if stage == "fresh":
            return
        self.net.connect("C", "P", self.now)
        self.flush()
        if stage == "connected":
            return
        self.announce()
        self.engine_step()
        self.flush()
        if stage == "loading":
            self.load_hits(4)
            if self.net.pending("C", "P"):
                self.net.deliver("C", "P", 0, self.now)

    def _setup(self, present: set[int], pending: set[int], one_sided: bool, serve: bool) -> None:
        self.net = SymNet()
        self.net.attach("C", make_core("C", one_sided=one_sided))
        self.net.attach("P", make_core("P", one_sided=one_sided, serve=serve, serve_max_pinned_blocks_per_peer=8))
        eng = self.net.engines["P"]
        for i in present:
            eng.blocks[KEYS[i]] = i
        for i in pending - present:
            eng.pending[KEYS[i]] = i
        self.now = 0.0
        self.req = 0
        self.kid: str | None = None
        self.jobs: set[int] = set()
        self.job_keys: dict[int, tuple[bytes, ...]] = {}
        self.next_job = 1
        self.closed = {"C": False, "P": False}

    # -- the consumer's engine ---------------------------------------------------------------------
    @precondition(lambda self: self.kid is None and not self.closed["C"])
    @rule()
    def announce(self) -> None:
        self.req += 1
        self.kid = f"sym-{self.req}"
        self.net.engine_input("C", ix.ProbeAnnounced(self.kid, "P"), self.now)

    @precondition(lambda self: self.kid is not None and not self.closed["C"])
    @rule()
    def scan(self) -> None:
        """vLLM's prefix scan: each key until the first MISS."""
        held = self._held()
        for k in KEYS:
            if k in held:
                continue
            self.net.engine_input("C", ix.KeyLookedUp(self.kid, k), self.now)
            if CoreView(self.net.cores["C"]).probe_answer(self.kid, k) is Answer.MISS:
                break

    @precondition(lambda self: not self.closed["C"])
    @rule()
    def schedule_end(self) -> None:
        self.net.engine_input("C", ix.ScheduleEnded(), self.now)

    @precondition(lambda self: self.kid is not None and not self.closed["C"])
    @rule()
    def engine_step(self) -> None:
        """One engine step: the scan, then the step's end (what vLLM does each step)."""
        self.scan()
        self.schedule_end()

    @precondition(lambda self: self.kid is not None and not self.closed["C"])
    @rule(n=st.integers(0, 4))
    def load_hits(self, n: int) -> None:
        """Load the first ``n`` keys answering HIT (the engine only loads what was HIT, but a
        stale view may name a key the round no longer offers: it must fail, never be served)."""
        core = self.net.cores["C"]
        keys = tuple(k for k in KEYS if CoreView(core).probe_answer(self.kid, k) is Answer.HIT)[:n]
        job = self.next_job
        self.next_job += 1
        try:
            self.net.engine_input("C", ix.LoadSubmitted(self.kid, job, keys, tuple(range(len(keys)))), self.now)
        except InvalidTransition:
            return
        self.jobs.add(job)
        self.job_keys[job] = keys

    def _held(self) -> set[bytes]:
        """Keys the engine does not look up again (none here: :class:`SymmetricHonest`'s engine
        remembers what it loaded)."""
        return set()

    def _held_keys(self) -> set[bytes]:
        """Keys the consumer's engine holds for the request: every key of a load that succeeded,
        a failed load's successful prefix (vLLM promotes them and never asks the tier again)."""
        held: set[bytes] = set()
        for job in self.jobs:
            for r in self.net.results.get(job, ()):
                held.update(self.job_keys.get(job, ()) if r.ok else (r.successful_keys or ()))
        return held

    @precondition(lambda self: self.kid is not None)
    @rule()
    def finish_request(self) -> None:
        self.net.engine_input("C", ix.RequestFinished(self.kid, False), self.now)
        self.kid = None

    # -- the producer's engine and operator ---------------------------------------------------------
    @precondition(lambda self: not self.closed["P"])
    @rule()
    def serve_window(self) -> None:
        self.net.serve_window("P", self.now)

    @precondition(lambda self: not self.closed["P"])
    @rule()
    def drain(self) -> None:
        self.net.engine_input("P", ix.DrainStarted(), self.now)

    @rule(who=st.sampled_from(["C", "P"]))
    def shutdown(self, who: str) -> None:
        if not self.closed[who]:
            self.closed[who] = True
            self.net.engine_input(who, ix.ShutdownStarted(), self.now)

    # -- the network, the plane, time ---------------------------------------------------------------
    @precondition(lambda self: bool(self.net.directions()))
    @rule(d=st.integers(0, 1))
    def deliver(self, d: int) -> None:
        dirs = self.net.directions()
        src, dst = dirs[d % len(dirs)]
        self.net.deliver(src, dst, 0, self.now)  # FIFO per connection (decision I11)

    @precondition(lambda self: bool(self.net.directions()))
    @rule()
    def flush(self) -> None:
        """Deliver everything in flight, FIFO per connection, with the producer's serve window in
        between (a macro step, so deep states are reached in few steps)."""
        for _ in range(50):
            if not self.net.directions():
                break
            for src, dst in self.net.directions():
                self.net.deliver(src, dst, 0, self.now)
            if not self.closed["P"]:
                self.net.serve_window("P", self.now)

    @precondition(lambda self: bool(CoreView(self.net.cores["P"]).serve_ids())
                  and CoreView(self.net.cores["C"]).session("P") is not None)
    @rule(which=st.integers(0, 3), keys=st.sets(st.integers(0, 3), min_size=1))
    def forged_fetch(self, which: int, keys: set[int]) -> None:
        """A misbehaving consumer: a fetch(offered) of any keys for a live round of its own."""
        from kvtier.wire import messages as wm
        from tools.fakenet import Envelope

        ids = [sid for sid in CoreView(self.net.cores["P"]).serve_ids() if sid[0] == "C"]
        if not ids:
            return
        _, kid, rnd = ids[which % len(ids)]
        gen = CoreView(self.net.cores["C"]).session("P").gen
        self.net.send(Envelope("C", "P", wm.Fetch(gen=gen, kv_request_id=kid, round=rnd,
                                                  keys=[KEYS[i] for i in sorted(keys)], offered=True)))

    @precondition(lambda self: bool(self.net.transfers))
    @rule(ok=st.booleans())
    def finish_transfer(self, ok: bool) -> None:
        self.net.finish_transfer(0, self.now, ok=ok)



    @rule(who=st.sampled_from(["C", "P"]))
    def connection_closed(self, who: str) -> None:
        other = "P" if who == "C" else "C"
        self.net.engine_input(who, ix.ConnectionClosed(other), self.now)

    @rule(dt=st.sampled_from([0.1, 0.3, 1.0, 6.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        for name in ("C", "P"):
            self.net.fire(name, self.now)

    # -- checks --------------------------------------------------------------------------------------
    @invariant()
    def retry_is_bounded(self) -> None:
        if self.kid is not None:
            self.net.check("C", self.kid, KEYS, self.now)

    def teardown(self) -> None:
        if not hasattr(self, "net"):
            return
        net = self.net
        if self.kid is not None:
            net.engine_input("C", ix.RequestFinished(self.kid, False), self.now)
        for _ in range(400):  # run to quiescence: deliver, serve, release, let time pass
            if net.directions():
                src, dst = net.directions()[0]
                net.deliver(src, dst, 0, self.now)
            elif net.landings:
                net.finish_landing(0, self.now)
            elif net.transfers:
                net.finish_transfer(0, self.now)
            elif net.windows["P"].pending() and CoreView(net.cores["P"]).serve_ids():
                net.serve_window("P", self.now)
                self.now += 0.3
                net.fire("P", self.now)
            else:
                self.now += 10.0
                for name in ("C", "P"):
                    net.fire(name, self.now)
                if not net.directions() and not net.transfers and not net.landings:
                    break
        net.serve_window("P", self.now)  # the last closes
        for job in self.jobs:
            assert len(net.results.get(job, [])) == 1, f"exactly_once_job_result: job {job}: {net.results.get(job)}"
        net.quiet_checks("P")
        assert not net.errors


class SymmetricHonest(Symmetric):
    """:class:`Symmetric` with the data plane at its least helpful: a block may be corrupt at the
    source (every load of it fails its digest check) and a landing may end steps later (a copy on
    the digest pool).  (The planted-bug hunts of the other properties keep :class:`Symmetric`'s
    rules, so their fixed-seed searches find what they always found.)"""

    @initialize(present=st.sets(st.integers(0, 3)), pending=st.sets(st.integers(0, 3)),
                one_sided=st.booleans(), serve=st.sampled_from([True, True, True, False]),
                stage=st.sampled_from(["fresh", "connected", "offered", "loading"]), land_later=st.booleans(),
                corrupt=st.sets(st.integers(0, 3), max_size=2))
    def setup(self, present: set[int], pending: set[int], one_sided: bool, serve: bool, stage: str = "fresh",
              land_later: bool = False, corrupt: frozenset[int] = frozenset()) -> None:
        """:meth:`Symmetric.setup`, the landings answered in a later step or not, and some blocks
        corrupt from the start (the :meth:`corrupt` rule corrupts more as the run goes on)."""
        self._setup(present, pending, one_sided, serve)
        self.net.land_later = land_later
        self.net.corrupt_keys.update(KEYS[i] for i in corrupt)
        self.net.count_loads = True  # this engine never looks up a key it holds: at most two loads each
        self._advance_to(stage)

    def _held(self) -> set[bytes]:
        return self._held_keys()

    @precondition(lambda self: bool(self.net.landings))
    @rule(i=st.integers(0, 3))
    def finish_landing(self, i: int) -> None:
        """A landing running on the consumer's digest pool ends."""
        self.net.finish_landing(i, self.now)

    @rule(i=st.integers(0, 3))
    def corrupt(self, i: int) -> None:
        """The producer's engine holds block ``i`` with bytes that no longer match its digest:
        every load of it fails its check."""
        self.net.corrupt_keys.add(KEYS[i])


TestSymmetric = SymmetricHonest.TestCase
# under mutation testing (docs/mutation.md) every mutant that reaches the symmetric path runs this
# suite: there it takes the mutate profile's example count, like tests/stateful's suite
_MUTATE = os.environ.get("HYPOTHESIS_PROFILE") == "mutate"
TestSymmetric.settings = settings(max_examples=settings.default.max_examples if _MUTATE else 150,
                                  stateful_step_count=40, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])
