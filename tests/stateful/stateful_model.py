"""The Hypothesis state machine shared by ``test_interleavings.py`` and ``test_planted.py``.

One producer :class:`~kvtier.lifecycle.TierCore` and two consumer cores joined by a
:class:`~kvtier.testing.FakeNetwork`, time from a :class:`~kvtier.testing.VirtualClock`.  Every
core is driven the way the shell drives it: through :func:`kvtier.lifecycle.driver.drive` (the
fake network is the shell).  Rules are engine calls (store, load, request finished on either
side, drain, shutdown), network nondeterminism (deliver any queued message at once, let one
*arrive* in its receiver's socket to wait there unread, drop, duplicate), the transport finishing
a transfer, **moving time** and, separately, a core's **tick** (it reads every unread message,
then fires the deadlines due when its socket was last seen empty — so "a deadline passed but was
not handled yet" and "a message waited while a deadline fell due" are both explorable), and a
consumer crashing (its process and jobs are gone) and restarting.

Invariants are the spec's ``[properties]``, read through the core's read API and checked on every
core input the driver applies (:class:`Checked` stands between the shell and each core, so a
batch of inputs is checked one input at a time); liveness is checked in ``teardown``: once the
network is drained and time runs on, every job has its result and no record waits in a live
state.  ``input_before_deadline`` is checked on every tick: no deadline due after a message
arrived may fire while that message is still unapplied.

The fake data plane is the worst case the seam allows: a posted transfer keeps its references
until the ``finish_transfer`` rule (any number of steps after a cancel), a consumer's revocation
of a one-sided producer completes only on the ``finish_revoke`` rule, and a ``corrupt`` rule makes
a round's blocks land with a digest mismatch.  Ids are reused: once an id's tombstone is pruned,
its next life may be stored and loaded again while messages of the earlier life are still in
flight (``lives_never_mix``).  Sessions ping: the consumers' heartbeats send pings the producer
answers, through the same lossy network.
"""

from __future__ import annotations

from typing import Any

from honest import honest_rules
from hypothesis import note as _hnote
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from stateful_checks import C_LIVE, P_LIVE, P_RETAINED, Checked, PropertyChecks

from kvtier.lifecycle import InvalidTransition, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import CoreSettings
from kvtier.lifecycle.session import HelloInput
from kvtier.testing.clock import VirtualClock
from kvtier.wire import messages as wm
from tools import snapshot
from tools.coreview import CoreView
from tools.fakenet import Envelope, FakeNetwork


def note(text: str) -> None:
    """``hypothesis.note`` that also works when a test drives the machine by hand."""
    if currently_in_test_context():
        _hnote(text)


LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="stateful", hash_seed="", instance="stateful")
DURATIONS = {
    "unbound_store_timeout_s": 6.0,
    "fetch_supply_timeout_s": 3.0,
    "transfer_timeout_s": 4.0,
    "tombstone_retention_s": 8.0,
    "load_timeout_s": 5.0,
    "abort_ack_timeout_s": 2.0,
    "handshake_timeout_s": 2.0,
    "revoke_timeout_s": 1.0,
    "heartbeat_interval_s": 5.0,  # the consumers ping every 5 s; a lost pong or a dead peer shows
    "peer_timeout_s": 60.0,  # ... after a minute of silence
}
QUIET = {"heartbeat_interval_s": 1000.0, "peer_timeout_s": 1000.0}
"""Durations for the planted-bug hunt: sessions never ping nor time out (crashes are rules)."""
TOMBSTONE_MAX = 2


def make_machine(
    ids: tuple[str, ...] = ("A", "B"),
    consumers: tuple[str, ...] = ("c1", "c2"),
    *,
    full: bool = True,
    opening: bool = False,
    steps: tuple[int, ...] = (8, 1, 2, 4),
    reorder: bool = True,
    chunks: int = 1,
    quiet_sessions: bool = False,
    keep: tuple[str, ...] = (),
) -> type:
    """The state machine class for ``ids`` and consumer names.  ``full=False`` leaves out the
    stop (drain / shutdown) and peer-failure rules: the planted-bug hunt uses one id, one consumer
    and the core rules — a smaller search space with the same checks.  ``opening=True`` starts
    every example with an ``initialize`` step that stores and/or loads the first id (in an order
    Hypothesis chooses), the prefix every lifecycle bug needs.  ``steps``: the time steps the
    ``advance`` rule may take; ``reorder=False`` delivers only the oldest message of a direction
    (zmq keeps per-connection order); ``quiet_sessions``: no heartbeats, no silence timeouts
    (:data:`QUIET`); ``keep``: rules a ``full=False`` machine keeps (a hunt that needs them).  The
    data plane's unhelpful rules are ``honest.py``'s (split batches, landings answered later)."""
    POS = st.integers(0, 3) if reorder else st.just(0)
    CHUNKS = chunks  # one-key stores per id; a load fetches every key
    IDS, CONSUMERS = ids, consumers
    durations = {**DURATIONS, **(QUIET if quiet_sessions else {})}

    class Machine(PropertyChecks, honest_rules(ids, consumers, chunks), RuleBasedStateMachine):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ids = IDS
            self.clock = VirtualClock()
            self.net = FakeNetwork()
            self.net.split_batches = self.net.land_later = True  # partial loads; landings end later
            self.load_keys: dict[int, tuple[bytes, ...]] = {}
            self.net.revoke_later = True  # a one-sided plane: revocation takes its time
            # ... and reports it only when it is done (no per-session window that withdraws access
            # by itself within revoke_timeout_s): revoke_bounded=False
            self.cs = CoreSettings(durations=durations, tombstone_max=TOMBSTONE_MAX, max_pending_fetches_per_peer=2,
                                   revoke_bounded=False)
            self.broken = False
            self.outstanding: dict[int, str] = {}  # job -> core name that owes its result
            self.stores = {k: 0 for k in IDS}
            self.p_finished = {k: False for k in IDS}
            self.loaded: set[tuple[str, str]] = set()
            self.retired = {k: False for k in IDS}
            self.shut: set[str] = set()
            self.closing: set[str] = set()  # past GraceEnded: their results wait for the plane's close (I41)
            self.store_of: dict[int, str] = {}  # store job -> id
            self.fetched_ids: set[str] = set()  # ids whose current life a non-empty fetch bound
            self.receipts: set[str] = set()  # ids whose current life received its consumer's receipt
            self.gone: set[int] = set()  # ids of transfers to a consumer process that died (no write lands)
            # consumers whose control messages were reordered or duplicated: one-sided write safety
            # assumes one session's messages in order and at most once (decision I11), so its check
            # is off for them (it holds with loss)
            self.disordered: set[str] = set()
            self.p = TierCore(self.cs, LOCAL)
            self.cores: dict[str, TierCore] = {"p": self.p}
            self.checked: dict[str, Checked] = {}
            self._attach("p", self.p)
            self.generation = 0
            for c in CONSUMERS:
                self._start_consumer(c)
                self.net.connect(c, "p", 0.0)  # sessions start ready; failures and restarts re-handshake
            self.next_job = 1

        def _attach(self, name: str, core: TierCore) -> None:
            self.cores[name] = core
            self.checked[name] = Checked(self, name, core)
            self.net.attach(name, self.checked[name])  # type: ignore[arg-type]

        def _start_consumer(self, c: str) -> None:
            self.generation += 1
            self._attach(c, TierCore(self.cs, LOCAL, gen_base=10_000 * self.generation))


        def _call(self, who: str, *inputs: ix.Input) -> list[Any]:
            """Engine (or operator) inputs to ``who``'s core, applied and performed now."""
            now = self.clock.now()
            return [e for inp in inputs for e in self.net.apply(who, inp, now)]

        def _tick(self, who: str) -> list[Any]:
            """One pass of ``who``'s loop: its unread messages, then its deadlines (checked: no
            deadline fires before input that arrived first)."""
            now = self.clock.now()
            unread = self.net.unread(who)
            for t, env in unread:
                note(f"{who} reads {env} (arrived at {t})")
            checked = self.checked[who]
            checked.unread = [(t, FakeNetwork.received(env)) for t, env in unread]
            try:
                return self.net.tick(who, now)
            finally:
                checked.unread = []

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
            self.store_of[job] = k
            note(f"store {k} chunk {chunk} (job {job})")
            self._call("p", ix.StoreSubmitted(k, f"req-{k}", job, (f"{k}{chunk}".encode(),), (job,)))

        @rule(k=st.sampled_from(IDS))
        def producer_finished(self, k: str) -> None:
            if "p" in self.shut:
                return
            self.p_finished[k] = True
            self._call("p", ix.RequestFinished(k, producer=True))

        @rule(c=st.sampled_from(CONSUMERS), k=st.sampled_from(IDS))
        def load(self, c: str, k: str) -> None:
            if (c, k) in self.loaded or c in self.shut:
                return
            self.loaded.add((c, k))
            job = self.next_job
            self.next_job += 1
            keys = tuple(f"{k}{i}".encode() for i in range(CHUNKS))
            self.load_keys[job] = keys

            self._call(c, ix.LoadAnnounced(k, "p"))
            self.outstanding[job] = c  # registered first: its effects may already report it
            try:
                self._call(c, ix.LoadSubmitted(k, job, keys, tuple(range(job, job + CHUNKS))))
            except InvalidTransition as exc:  # e.g. the id is still known from an earlier load
                del self.outstanding[job]
                note(f"load refused: {exc}")

        @rule(c=st.sampled_from(CONSUMERS), k=st.sampled_from(IDS))
        def consumer_finished(self, c: str, k: str) -> None:
            if c in self.shut:
                return
            self._call(c, ix.RequestFinished(k, producer=False))

        @rule(what=st.sampled_from(("drain", "shutdown p") + tuple(f"shutdown {c}" for c in CONSUMERS)))
        def stop(self, what: str) -> None:
            """The producer engine drains its jobs, or a manager shuts down (its process then exits:
            messages to it are lost, what it sent — disconnects — stays in flight)."""
            if what == "drain":
                if "p" not in self.shut:
                    self._call("p", ix.DrainStarted())
                return
            who = what.split()[1]
            if who in self.shut:
                return
            self.shut.add(who)
            # shutdown() with a zero grace: begin, close, then the transport and the data plane are
            # closed, which releases every transfer and revokes every producer's access
            self._call(who, ix.ShutdownStarted())
            self.closing.add(who)
            self._call(who, ix.GraceEnded())
            while any(t.src == who for t in self.net.transfers):
                i = next(i for i, t in enumerate(self.net.transfers) if t.src == who)
                self.net.finish_transfer(i, self.clock.now(), ok=False)
            while any(src == who for src, _ in self.net.revokes):
                self.net.finish_revoke(next(i for i, (src, _) in enumerate(self.net.revokes) if src == who),
                                       self.clock.now())
            while any(x.src == who for x in self.net.landings):  # its plane's close ends every landing
                self.net.finish_landing(next(i for i, x in enumerate(self.net.landings) if x.src == who),
                                        self.clock.now())
            self.net.cores.pop(who, None)
            self.net.inbox.pop(who, None)

        # -- time: moving it and handling deadlines are separate rules ----------------------------
        @rule(dt=st.sampled_from(steps))
        def advance(self, dt: int) -> None:
            self.clock.advance(dt)

        @rule(who=st.sampled_from(("p",) + CONSUMERS))
        def tick(self, who: str) -> None:
            if who in self.net.cores:
                self._tick(who)

        # -- the network ---------------------------------------------------------------------------
        def _pick(self, d: int, i: int) -> tuple[str, str, Envelope] | None:
            """Message ``i`` of direction ``d``; notes the pair disordered when it overtakes an
            older message (in the network or unread in the receiver's socket)."""
            dirs = self.net.directions()
            if not dirs:
                return None
            src, dst = dirs[d % len(dirs)]
            q = self.net.queues[(src, dst)]
            if i % len(q) or any(env.src == src for _, env in self.net.unread(dst)):
                self.disordered.add(dst if src == "p" else src)
            return src, dst, q[i % len(q)]

        @rule(d=st.integers(0, 5), i=POS)
        def deliver(self, d: int, i: int) -> None:
            """A message is read the moment it arrives."""
            picked = self._pick(d, i)
            if picked is None:
                return
            src, dst, env = picked
            note(f"deliver {env}")
            self.net.deliver(src, dst, i, self.clock.now())

        @rule(d=st.integers(0, 5), i=POS)
        def arrive(self, d: int, i: int) -> None:
            """A message arrives in its receiver's socket and waits there, unread, for a tick."""
            dirs = self.net.directions()
            if dirs:  # the receiver reads its socket in arrival order: only overtaking in the network
                src, dst = dirs[d % len(dirs)]  # reorders (an arrival after an unread one does not)
                if i % len(self.net.queues[(src, dst)]):
                    self.disordered.add(dst if src == "p" else src)
                note(f"arrive {self.net.arrive(src, dst, i, self.clock.now())} at {self.clock.now()}")

        @rule(d=st.integers(0, 5), i=st.integers(0, 3), dup=st.booleans())
        def fault(self, d: int, i: int, dup: bool) -> None:
            """Lose (or duplicate) one message in flight."""
            dirs = self.net.directions()
            if not dirs:
                return
            if dup:
                src, dst = dirs[d % len(dirs)]
                self.disordered.add(dst if src == "p" else src)
                note(f"duplicate {self.net.duplicate(src, dst, i)}")
            else:
                note(f"drop {self.net.drop(*dirs[d % len(dirs)], i)}")

        @rule(i=st.integers(0, 2), ok=st.booleans())
        def finish_transfer(self, i: int, ok: bool) -> None:
            if not self.net.transfers:
                return
            self.net.finish_transfer(i, self.clock.now(), ok=ok)

        @rule(i=st.integers(0, 2))
        def finish_revoke(self, i: int) -> None:
            """A consumer's one-sided plane confirms the producer can no longer write."""
            if not self.net.revokes:
                return
            self.net.finish_revoke(i, self.clock.now())

        @rule(k=st.sampled_from(IDS), c=st.sampled_from(CONSUMERS))
        def corrupt(self, k: str, c: str) -> None:
            """The blocks of ``c``'s live round of ``k`` land with a digest mismatch."""
            v = self.cores[c].consumer(k)
            if v is not None and v.round >= 0:
                self.net.corrupt.add((k, v.round))

        # -- peers crash and restart ---------------------------------------------------------------
        @rule(c=st.sampled_from(CONSUMERS), crash=st.booleans())
        def peer_failure(self, c: str, crash: bool) -> None:
            """``crash=False``: the session between the producer and ``c`` dies and both ends see the
            disconnect (a later announce reconnects).  ``crash=True``: the consumer process dies (its
            engine and its jobs with it) and a new one starts at the same address; the producer learns
            of it from the new hello (peer_restarted) or from its own heartbeat finding it silent."""
            if crash:
                self.gone |= {id(t) for t in self.net.transfers if t.dst == c}
                self.net.kill(c)
                for job, owner in list(self.outstanding.items()):
                    if owner == c:
                        del self.outstanding[job]
                self.loaded = {(cc, k) for cc, k in self.loaded if cc != c}
                self.shut.discard(c)
                self.disordered.discard(c)  # a new process: nothing of the old one's reaches it
                self._start_consumer(c)
                return
            gen = CoreView(self.cores[c]).session_gen("p")
            if gen is not None and c not in self.shut:
                self._call(c, ix.Received("p", wm.Disconnect(gen=gen, reason="")))
            pgen = CoreView(self.p).session_gen(c)
            if pgen is not None and "p" not in self.shut:
                self._call("p", ix.Received(c, wm.Disconnect(gen=pgen, reason="")))

        # -- invariants ----------------------------------------------------------------------------
        @invariant()
        def jobs_without_result_are_held_by_live_records(self) -> None:
            held = {j: v.state.value for v in self.p.records().producers for j in v.jobs}
            for job, owner in self.outstanding.items():
                if owner == "p":
                    assert held.get(job) in P_LIVE, (
                        f"exactly_once_job_result: store job {job} has no result and is held by "
                        f"{held.get(job, 'no record')}: it will never get one"
                    )
                else:
                    core = self.cores[owner]
                    assert any(
                        v.job_id == job and v.state.value in C_LIVE for v in core.records().consumers
                    ), f"exactly_once_job_result: load job {job} of {owner} has no result and no live load"

        @invariant()
        def producer_indexes_match_its_records(self) -> None:
            # the shell reads these indexes instead of scanning (quarantine gauge and log on every
            # poll, per-peer fan-out), so a drifted index is a wrong gauge or a missed session end
            assert snapshot.index_problems(self.p) == []
            r = self.p.records()
            assert r.quarantined == {v.kv_request_id for v in r.producers if v.state.value == "quarantined"}
            assert self.p.quarantined_count() == len(r.quarantined)
            assert len(r.retained) == sum(1 for v in r.producers if v.state.value in P_RETAINED)

        @invariant()
        def bounded_bookkeeping(self) -> None:
            r = self.p.records()
            assert len(r.retained) <= TOMBSTONE_MAX
            live = sum(1 for v in r.producers if v.state.value in P_LIVE)
            assert self.p.producer_count() <= live + len(r.retained)

        # -- liveness ------------------------------------------------------------------------------
        def teardown(self) -> None:
            """Let the system settle without new work or faults: every job gets its result and no
            record stays in a live state."""
            if self.broken:
                return
            for _ in range(200):
                if not (self.net.directions() or self.net.transfers or self.net.revokes or self.net.landings
                        or self.outstanding
                        or self._live_records() or any(self.net.inbox.values())):
                    break
                busy = False
                for who in [w for w, q in self.net.inbox.items() if q]:
                    busy = True
                    if who in self.net.cores:
                        self._tick(who)
                    else:
                        self.net.inbox.pop(who)
                for src, dst in self.net.directions():
                    busy = True
                    self.net.deliver(src, dst, 0, self.clock.now())
                if self.net.transfers:
                    busy = True
                    self.net.finish_transfer(0, self.clock.now())
                if self.net.revokes:
                    busy = True
                    self.finish_revoke(0)
                if self.net.landings:
                    busy = True
                    self.net.finish_landing(0, self.clock.now())
                if not busy:
                    nxt = [d for w, core in self.cores.items() if w in self.net.cores
                           if (d := core.next_deadline()) is not None]
                    if not nxt:
                        break
                    self.clock.set(max(self.clock.now(), min(nxt)))
                    for who in list(self.net.cores):
                        self._tick(who)
                    if not self.outstanding and not self._live_records():
                        break
            assert not self.outstanding, f"liveness: jobs without a result after settling: {self.outstanding}"
            assert not self._live_records(), f"liveness: records stuck after settling: {self._live_records()}"

        def _live_records(self) -> list[str]:
            stuck = [f"p:{k}:{s}" for k in CoreView(self.p).producer_ids()
                     if (s := self.p.producer_state(k).value) in P_LIVE]
            for c in CONSUMERS:
                core = self.cores[c]
                stuck += [f"{c}:{k}:{s}" for k in CoreView(core).consumer_ids()
                          if (s := core.consumer_state(k).value) in C_LIVE]
            return stuck

    if not full:
        for name in {"stop", "peer_failure", "corrupt", "corrupt_block", "plane_fault"} - set(keep):
            setattr(Machine, name, None)  # a rule left out (the honest ones live on a base class)
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


Interleavings = make_machine(chunks=2)
