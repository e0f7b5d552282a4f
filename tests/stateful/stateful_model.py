"""The Hypothesis state machine shared by ``test_interleavings.py`` and ``test_planted.py``.

One producer :class:`~kvtier.lifecycle.TierCore` and two consumer cores joined by a
:class:`~kvtier.testing.FakeNetwork`, time from a :class:`~kvtier.testing.VirtualClock`.  Rules
are engine calls (store, load, request finished on either side, drain, shutdown), network
nondeterminism (deliver any queued message, drop, duplicate), the transport finishing a transfer,
**moving time** and, separately, **ticking** a core (so "a deadline passed but was not handled
yet" is explorable), and a consumer crashing (its process and jobs are gone) and restarting.

Invariants are the spec's ``[properties]``; liveness is checked in ``teardown``: once the network
is drained and time runs on, every job has its result and no record waits in a live state.
"""

from __future__ import annotations

from typing import Any

from hypothesis import note as _hnote
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvtier.lifecycle import InvalidTransition, TierCore
from kvtier.lifecycle.consumer import LoadInput
from kvtier.lifecycle.core import CoreSettings
from kvtier.lifecycle.effects import JobDone, SendBlocks, SendTransferDone, WriteBlocks
from kvtier.lifecycle.producer import StoreInput
from kvtier.lifecycle.session import HelloInput
from kvtier.testing.clock import VirtualClock
from kvtier.testing.fakenet import FakeNetwork



def note(text: str) -> None:
    """``hypothesis.note`` that also works when a test drives the machine by hand."""
    if currently_in_test_context():
        _hnote(text)


LOCAL = HelloInput(version=1, block_bytes=16, layout="stateful", hash_seed="")
DURATIONS = {
    "unbound_store_timeout_s": 6.0,
    "fetch_supply_timeout_s": 3.0,
    "transfer_timeout_s": 4.0,
    "tombstone_retention_s": 8.0,
    "load_timeout_s": 5.0,
    "abort_ack_timeout_s": 2.0,
    "handshake_timeout_s": 2.0,
    "peer_timeout_s": 1000.0,  # the shell's pings keep sessions alive; crashes are explicit rules
}
TOMBSTONE_MAX = 2
P_LIVE = {"parked", "awaiting", "serving", "cancelling"}
P_RETAINED = {"done", "tombstoned"}
P_LATE = {"done", "tombstoned", "cancelling"}
C_LIVE = {"queued", "in_flight", "aborting", "cancelling"}


def make_machine(
    ids: tuple[str, ...] = ("A", "B"),
    consumers: tuple[str, ...] = ("c1", "c2"),
    *,
    full: bool = True,
    opening: bool = False,
    steps: tuple[int, ...] = (8, 1, 2, 4),
    reorder: bool = True,
    chunks: int = 1,
) -> type:
    """The state machine class for ``ids`` and consumer names.  ``full=False`` leaves out the
    stop (drain / shutdown) and peer-failure rules: the planted-bug hunt uses one id, one consumer
    and the core rules — a smaller search space with the same checks.  ``opening=True`` starts
    every example with an ``initialize`` step that stores and/or loads the first id (in an order
    Hypothesis chooses), the prefix every lifecycle bug needs.  ``steps``: the time steps the
    ``advance`` rule may take; ``reorder=False`` delivers only the oldest message of a direction
    (zmq keeps per-connection order; the hunt does not need reordering)."""
    POS = st.integers(0, 3) if reorder else st.just(0)
    CHUNKS = chunks  # one-key stores per id; a load fetches every key
    IDS, CONSUMERS = ids, consumers

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = VirtualClock()
            self.net = FakeNetwork()
            self.cs = CoreSettings(durations=DURATIONS, tombstone_max=TOMBSTONE_MAX, max_pending_fetches_per_peer=2)
            self.p = TierCore(self.cs, LOCAL)
            self.net.attach("p", self.p)
            self.cores: dict[str, TierCore] = {"p": self.p}
            self.generation = 0
            for c in CONSUMERS:
                self._start_consumer(c)
                self.net.connect(c, "p", 0.0)  # sessions start ready; failures and restarts re-handshake
            self.next_job = 1
            self.outstanding: dict[int, str] = {}  # job -> core name that owes its result
            self.stores = {k: 0 for k in IDS}
            self.p_finished = {k: False for k in IDS}
            self.loaded: set[tuple[str, str]] = set()
            self.retired = {k: False for k in IDS}
            self.shut: set[str] = set()

        def _start_consumer(self, c: str) -> None:
            self.generation += 1
            core = TierCore(self.cs, LOCAL, gen_base=10_000 * self.generation)
            self.cores[c] = core
            self.net.attach(c, core)

        # -- running one step and checking the spec's properties ----------------------------------
        def _pstates(self) -> dict[str, str]:
            return {k: self.p.producer.state_of(k).value for k in IDS}

        def _cstates(self, c: str) -> dict[str, tuple[str, int]]:
            core = self.cores[c]
            out = {}
            for k in IDS:
                rec = core.consumer.records.get(k)
                out[k] = (rec.state.value, rec.round) if rec is not None else ("absent", -1)
            return out

        def _step(self, who: str, effects_of: Any, *, fetch: Any = None) -> list[Any]:
            pre_p = self._pstates()
            pre_c = self._cstates(who) if who != "p" else {}
            pre_gate = None
            if fetch is not None:
                rec = self.p.sessions.records.get(fetch.src)
                pre_gate = rec is not None and rec.state.value == "ready" and rec.gen == fetch.gen
            effects = effects_of()
            post_p = self._pstates()
            for eff in effects:
                if isinstance(eff, JobDone):
                    owner = self.outstanding.pop(eff.job_id, None)
                    assert owner == who, f"exactly_once_job_result: {who} reported job {eff.job_id} (ok={eff.ok}, " \
                                         f"{eff.reason}) that {'had its result already' if owner is None else 'is ' + owner + 's'}"
                elif isinstance(eff, SendBlocks):
                    k = eff.kv_request_id
                    assert pre_p[k] in ("parked", "awaiting") and post_p[k] == "serving", (
                        f"no_bytes_for_tombstoned: blocks of {k} sent on a {pre_p[k]} -> {post_p[k]} step"
                    )
                elif isinstance(eff, WriteBlocks):
                    state, rnd = pre_c.get(eff.kv_request_id, ("absent", -1))
                    assert state == "in_flight", f"no_write_after_terminal: {who} wrote {eff.kv_request_id} while {state}"
            if fetch is not None and pre_gate:
                k = fetch.kv_request_id
                if pre_p[k] in P_LATE or self.retired[k]:
                    assert any(
                        isinstance(e, SendTransferDone) and not e.ok and (e.kv_request_id, e.round) == (k, fetch.round)
                        for e in effects
                    ), f"late_fetch_one_rtt: fetch for {k} while {pre_p[k]} (retired={self.retired[k]}) not refused at once"
            for k in IDS:
                before, after = pre_p[k], post_p[k]
                if before == after:
                    continue
                if after in ("parked", "awaiting", "serving"):
                    assert not self.retired[k], f"tombstoned_never_reparks: {k} went {before} -> {after} after it ended"
                if after in P_RETAINED:
                    self.retired[k] = True
                elif before in P_RETAINED and after == "absent":
                    self.retired[k] = False
                elif before in P_LIVE and after == "absent" and "p" not in self.shut:
                    self.retired[k] = True
            return effects

        def _call(self, who: str, fn: Any) -> list[Any]:
            now = self.clock.now()

            def run() -> list[Any]:
                effs = fn(now)
                self.net.route(who, effs, now)
                return effs

            return self._step(who, run)

        # -- engine rules --------------------------------------------------------------------------
        @rule(k=st.sampled_from(IDS))
        def store(self, k: str) -> None:
            if self.stores[k] >= CHUNKS or self.p_finished[k] or "p" in self.shut:
                return
            chunk = self.stores[k]
            self.stores[k] += 1
            job = self.next_job
            self.next_job += 1
            self.outstanding[job] = "p"
            note(f"store {k} chunk {chunk} (job {job})")
            self._call("p", lambda now: self.p.store(StoreInput(k, f"req-{k}", job, (f"{k}{chunk}".encode(),), (job,)), now))

        @rule(k=st.sampled_from(IDS))
        def producer_finished(self, k: str) -> None:
            if "p" in self.shut:
                return
            self.p_finished[k] = True
            self._call("p", lambda now: self.p.producer_finished(k, now))

        @rule(c=st.sampled_from(CONSUMERS), k=st.sampled_from(IDS))
        def load(self, c: str, k: str) -> None:
            if (c, k) in self.loaded or c in self.shut:
                return
            self.loaded.add((c, k))
            job = self.next_job
            self.next_job += 1
            keys = tuple(f"{k}{i}".encode() for i in range(CHUNKS))
            core = self.cores[c]

            def go(now: float) -> list[Any]:
                effs = core.announce(k, "p", now)
                try:
                    effs += core.submit_load(LoadInput(k, job, keys, tuple(range(job, job + CHUNKS))), now)
                except InvalidTransition as exc:  # e.g. the id is still known from an earlier load
                    note(f"load refused: {exc}")
                    return effs
                self.outstanding[job] = c
                return effs

            self._call(c, go)

        @rule(c=st.sampled_from(CONSUMERS), k=st.sampled_from(IDS))
        def consumer_finished(self, c: str, k: str) -> None:
            if c in self.shut:
                return
            self._call(c, lambda now: self.cores[c].consumer_finished(k, now))

        @rule(what=st.sampled_from(("drain", "shutdown p") + tuple(f"shutdown {c}" for c in CONSUMERS)))
        def stop(self, what: str) -> None:
            """The producer engine drains its jobs, or a manager shuts down (its process then exits:
            messages to it are lost, what it sent — disconnects — stays in flight)."""
            if what == "drain":
                if "p" not in self.shut:
                    self._call("p", lambda now: self.p.drain(now))
                return
            who = what.split()[1]
            if who in self.shut:
                return
            self.shut.add(who)
            self._call(who, lambda now: self.cores[who].shutdown(now))
            self.net.cores.pop(who, None)
            self.net.transfers = [t for t in self.net.transfers if t.src != who]

        # -- time: moving it and handling deadlines are separate rules ----------------------------
        @rule(dt=st.sampled_from(steps))
        def advance(self, dt: int) -> None:
            self.clock.advance(dt)

        @rule(who=st.sampled_from(("p",) + CONSUMERS))
        def tick(self, who: str) -> None:
            self._call(who, lambda now: self.cores[who].tick(now))

        # -- the network ---------------------------------------------------------------------------
        @rule(d=st.integers(0, 5), i=POS)
        def deliver(self, d: int, i: int) -> None:
            dirs = self.net.directions()
            if not dirs:
                return
            src, dst = dirs[d % len(dirs)]
            q = self.net.queues[(src, dst)]
            env = q[i % len(q)]
            note(f"deliver {env}")
            if dst not in self.net.cores:
                self.net.deliver(src, dst, i, self.clock.now())
                return
            self._step(
                dst,
                lambda: self.net.deliver(src, dst, i, self.clock.now())[1],
                fetch=env if (dst == "p" and env.kind == "fetch") else None,
            )

        @rule(d=st.integers(0, 5), i=st.integers(0, 3), dup=st.booleans())
        def fault(self, d: int, i: int, dup: bool) -> None:
            """Lose (or duplicate) one message in flight."""
            dirs = self.net.directions()
            if not dirs:
                return
            if dup:
                note(f"duplicate {self.net.duplicate(*dirs[d % len(dirs)], i)}")
            else:
                note(f"drop {self.net.drop(*dirs[d % len(dirs)], i)}")

        @rule(i=st.integers(0, 2), ok=st.booleans())
        def finish_transfer(self, i: int, ok: bool) -> None:
            if not self.net.transfers:
                return
            t = self.net.transfers[i % len(self.net.transfers)]
            self._step(t.src, lambda: self.net.finish_transfer(i, self.clock.now(), ok=ok)[1])

        # -- peers crash and restart ---------------------------------------------------------------
        @rule(c=st.sampled_from(CONSUMERS), crash=st.booleans())
        def peer_failure(self, c: str, crash: bool) -> None:
            """``crash=False``: the session between the producer and ``c`` dies and both ends see the
            disconnect (a later announce reconnects).  ``crash=True``: the consumer process dies (its
            engine and its jobs with it) and a new one starts at the same address; the producer learns
            of it from the new hello (peer_restarted) or from its own liveness deadline."""
            if crash:
                self.net.kill(c)
                for job, owner in list(self.outstanding.items()):
                    if owner == c:
                        del self.outstanding[job]
                self.loaded = {(cc, k) for cc, k in self.loaded if cc != c}
                self.shut.discard(c)
                self._start_consumer(c)
                return
            core = self.cores[c]
            gen = core.session_gen("p")
            if gen is not None and c not in self.shut:
                self._call(c, lambda now: core.disconnect("p", gen, now))
            pgen = self.p.session_gen(c)
            if pgen is not None and "p" not in self.shut:
                self._call("p", lambda now: self.p.disconnect(c, pgen, now))

        # -- invariants ----------------------------------------------------------------------------
        @invariant()
        def jobs_without_result_are_held_by_live_records(self) -> None:
            held = {}
            for k, rec in self.p.producer.records.items():
                for j in rec.jobs:
                    held[j] = rec.state.value
            for job, owner in self.outstanding.items():
                if owner == "p":
                    assert held.get(job) in P_LIVE, (
                        f"exactly_once_job_result: store job {job} has no result and is held by "
                        f"{held.get(job, 'no record')}: it will never get one"
                    )
                else:
                    core = self.cores[owner]
                    assert any(
                        r.job_id == job and r.state.value in C_LIVE for r in core.consumer.records.values()
                    ), f"exactly_once_job_result: load job {job} of {owner} has no result and no live load"

        @invariant()
        def bounded_bookkeeping(self) -> None:
            prod = self.p.producer
            assert len(prod.retained) <= TOMBSTONE_MAX
            live = sum(1 for r in prod.records.values() if r.state.value in P_LIVE)
            assert len(prod.records) <= live + len(prod.retained)

        # -- liveness ------------------------------------------------------------------------------
        def teardown(self) -> None:
            """Let the system settle without new work or faults: every job gets its result and no
            record stays in a live state."""
            for _ in range(60):
                if not (self.net.directions() or self.net.transfers or self.outstanding or self._live_records()):
                    break
                busy = False
                for src, dst in self.net.directions():
                    busy = True
                    if dst in self.net.cores:
                        env = self.net.queues[(src, dst)][0]
                        self._step(
                            dst,
                            lambda s=src, d=dst: self.net.deliver(s, d, 0, self.clock.now())[1],
                            fetch=env if (dst == "p" and env.kind == "fetch") else None,
                        )
                    else:
                        self.net.deliver(src, dst, 0, self.clock.now())
                if self.net.transfers:
                    busy = True
                    t = self.net.transfers[0]
                    self._step(t.src, lambda: self.net.finish_transfer(0, self.clock.now())[1])
                if not busy:
                    nxt = [d for d in (core.next_deadline() for core in self.cores.values()) if d is not None]
                    if not nxt:
                        break
                    self.clock.set(max(self.clock.now(), min(nxt)))
                    for who in self.cores:
                        self._call(who, lambda now, w=who: self.cores[w].tick(now))
                    if not self.outstanding and not self._live_records():
                        break
            assert not self.outstanding, f"liveness: jobs without a result after settling: {self.outstanding}"
            assert not self._live_records(), f"liveness: records stuck after settling: {self._live_records()}"

        def _live_records(self) -> list[str]:
            stuck = [f"p:{k}:{r.state.value}" for k, r in self.p.producer.records.items() if r.state.value in P_LIVE]
            for c in CONSUMERS:
                stuck += [
                    f"{c}:{k}:{r.state.value}" for k, r in self.cores[c].consumer.records.items() if r.state.value in C_LIVE
                ]
            return stuck

    if not full:
        for name in ("stop", "peer_failure"):
            delattr(Machine, name)
    if opening:

        class Opening(Machine):  # type: ignore[misc, valid-type]
            @initialize(order=st.sampled_from(("store, load", "load, store", "load", "store")))
            def opening(self, order: str) -> None:
                for what in order.split(", "):
                    if what == "store":
                        self.store(IDS[0])
                    else:
                        self.load(CONSUMERS[0], IDS[0])

        Machine = Opening
    Machine.__name__ = Machine.__qualname__ = f"Interleavings_{len(ids)}ids_{len(consumers)}consumers"
    return Machine


Interleavings = make_machine()
