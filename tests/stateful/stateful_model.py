"""The Hypothesis state machine shared by ``test_interleavings.py`` and ``test_planted.py``.

One producer :class:`~kvtier.lifecycle.TierCore` and two consumer cores joined by a
:class:`~kvtier.testing.FakeNetwork`, time from a :class:`~kvtier.testing.VirtualClock`.  Rules
are engine calls (store, load, request finished on either side, drain, shutdown), network
nondeterminism (deliver any queued message, drop, duplicate), the transport finishing a transfer,
**moving time** and, separately, **ticking** a core (so "a deadline passed but was not handled
yet" is explorable), and a consumer crashing (its process and jobs are gone) and restarting.

Invariants are the spec's ``[properties]``; liveness is checked in ``teardown``: once the network
is drained and time runs on, every job has its result and no record waits in a live state.

The fake data plane is the worst case the seam allows: a posted transfer keeps its references
until the ``finish_transfer`` rule (any number of steps after a cancel), a consumer's revocation
of a one-sided producer completes only on the ``finish_revoke`` rule, and a ``corrupt`` rule makes
a round's blocks land with a digest mismatch.  Ids are reused: once an id's tombstone is pruned,
its next life may be stored and loaded again while messages of the earlier life are still in
flight (``lives_never_mix``).  ``input_before_deadline`` is a property of the shell's poll order,
not of the core: ``python -m tools check`` models it, and tests/manager checks the manager against it.
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
from kvtier.lifecycle.effects import JobDone, LandBlocks, SendBlocks, SendTransferDone
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
P_LIVE = {"parked", "awaiting", "serving", "delivering", "confirmed", "cancelling", "quarantined"}
P_BOUND = P_LIVE - {"parked"}  # bound to a consumer: indexed per peer
P_RETAINED = {"done", "tombstoned"}
P_LATE = {"done", "tombstoned", "cancelling", "quarantined"}
C_LIVE = {"queued", "in_flight", "aborting", "cancelling", "revoking"}


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
            self.net.revoke_later = True  # a one-sided plane: revocation takes its time
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
            self.broken = False
            self.store_of: dict[int, str] = {}  # store job -> id
            self.fetched_ids: set[str] = set()  # ids whose current life a non-empty fetch bound
            self.receipts: set[str] = set()  # ids whose current life received its consumer's receipt
            self.revoked: set[tuple[str, str, int]] = set()  # (consumer, id, round) whose access was revoked

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

        def _step(self, who: str, effects_of: Any, *, fetch: Any = None, msg: Any = None) -> list[Any]:
            try:
                return self._checked_step(who, effects_of, fetch=fetch, msg=msg)
            except AssertionError:
                self.broken = True  # Hypothesis still runs teardown: do not bury this failure under another
                raise

        def _checked_step(self, who: str, effects_of: Any, *, fetch: Any = None, msg: Any = None) -> list[Any]:
            pre_p = self._pstates()
            pre_c = self._cstates(who) if who != "p" else {}
            pre_bind = {k: (r.peer, r.round) for k, r in self.p.producer.records.items()}
            pre_gate = None
            if fetch is not None:
                rec = self.p.sessions.records.get(fetch.src)
                pre_gate = rec is not None and rec.state.value == "ready" and rec.gen == fetch.gen
            effects = effects_of()
            post_p = self._pstates()
            if msg is not None and msg.kind in ("receipt", "abort_fetch") and (msg.kind == "receipt" or msg.fetched):
                k = msg.kv_request_id
                if pre_p[k] != post_p[k]:
                    assert pre_bind.get(k) == (msg.src, msg.round), (
                        f"lives_never_mix: {msg.kind} of {msg.src} round {msg.round} moved {k} {pre_p[k]} -> "
                        f"{post_p[k]}, but that life was bound to {pre_bind.get(k)}"
                    )
                if msg.kind == "receipt" and pre_bind.get(k) == (msg.src, msg.round):
                    self.receipts.add(k)
            for eff in effects:
                if isinstance(eff, JobDone):
                    owner = self.outstanding.pop(eff.job_id, None)
                    assert owner == who, f"exactly_once_job_result: {who} reported job {eff.job_id} (ok={eff.ok}, " \
                                         f"{eff.reason}) that {'had its result already' if owner is None else 'is ' + owner + 's'}"
                    self._check_job_result(who, eff)
                elif isinstance(eff, SendBlocks):
                    k = eff.kv_request_id
                    assert pre_p[k] in ("parked", "awaiting") and post_p[k] == "serving", (
                        f"no_bytes_for_tombstoned: blocks of {k} sent on a {pre_p[k]} -> {post_p[k]} step"
                    )
                elif isinstance(eff, LandBlocks):
                    state, rnd = pre_c.get(eff.kv_request_id, ("absent", -1))
                    assert state == "in_flight", f"no_write_after_terminal: {who} landed {eff.kv_request_id} while {state}"
            if fetch is not None and pre_gate:
                k = fetch.kv_request_id
                own = pre_bind.get(k) == (fetch.src, fetch.round)  # a duplicate of the bound fetch:
                # its terminal answer waits for the data plane's release (no write may land after it)
                if (pre_p[k] in P_LATE or self.retired[k]) and not (own and pre_p[k] in ("cancelling", "quarantined")):
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
                    self._new_life(k)
                elif before in P_LIVE and after == "absent" and "p" not in self.shut:
                    self.retired[k] = True
            return effects

        def _check_job_result(self, who: str, eff: JobDone) -> None:
            if who == "p":
                k = self.store_of[eff.job_id]
                assert not any(t.src == "p" and t.kv_request_id == k for t in self.net.transfers), (
                    f"no_block_returned_while_referenced: store job {eff.job_id} of {k} reported "
                    f"(ok={eff.ok}, {eff.reason}) while the data plane still references its blocks"
                )
                assert not eff.ok or k in self.receipts or k not in self.fetched_ids, (
                    f"no_success_without_receipt: store job {eff.job_id} of {k} succeeded without the consumer's receipt"
                )
                return
            rec = next((r for r in self.cores[who].consumer.records.values() if r.job_id == eff.job_id), None)
            if rec is None:
                return
            key = (who, rec.key, rec.round)
            if eff.ok:
                assert (rec.key, rec.round) not in self.net.corrupt, (
                    f"no_success_without_receipt: {who} reported load {rec.key} round {rec.round} ok with a corrupt block"
                )
            elif key not in self.revoked:
                assert not any(
                    (t.src, t.dst, t.kv_request_id, t.round) == ("p", who, rec.key, rec.round) for t in self.net.transfers
                ), (f"no_write_after_terminal: {who} reported load {rec.key} round {rec.round} failed while the "
                    "producer may still write into its slots")

        def _new_life(self, k: str) -> None:
            """The tombstone of ``k`` was pruned: the id may be reused (a brand-new life)."""
            self.retired[k] = False
            self.stores[k] = 0
            self.p_finished[k] = False
            self.receipts.discard(k)
            self.fetched_ids.discard(k)
            self.loaded = {(c, kk) for c, kk in self.loaded if kk != k}

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
            self.store_of[job] = k
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
            # shutdown() with a zero grace: begin, close, then the transport and the data plane are
            # closed, which releases every transfer and revokes every producer's access
            self._call(who, lambda now: self.cores[who].shutdown(now))
            self._call(who, lambda now: self.cores[who].close(now))
            while any(t.src == who for t in self.net.transfers):
                i = next(i for i, t in enumerate(self.net.transfers) if t.src == who)
                self._step(who, lambda i=i: self.net.finish_transfer(i, self.clock.now(), ok=False)[1])
            while any(src == who for src, _ in self.net.revokes):
                i = next(i for i, (src, _) in enumerate(self.net.revokes) if src == who)
                _, eff = self.net.revokes[i]
                self.revoked.add((who, eff.kv_request_id, eff.round))
                self._step(who, lambda i=i: self.net.finish_revoke(i, self.clock.now()))
            self.net.cores.pop(who, None)

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
            self._deliver_step(src, dst, i, env)

        def _deliver_step(self, src: str, dst: str, i: int, env: Any) -> None:
            if dst == "p" and env.kind == "fetch" and env.keys:
                rec = self.p.producer.records.get(env.kv_request_id)
                if rec is None or rec.state.value in ("absent", "parked"):
                    self.fetched_ids.add(env.kv_request_id)
            self._step(
                dst,
                lambda: self.net.deliver(src, dst, i, self.clock.now())[1],
                fetch=env if (dst == "p" and env.kind == "fetch") else None,
                msg=env if dst == "p" else None,
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

        @rule(i=st.integers(0, 2))
        def finish_revoke(self, i: int) -> None:
            """A consumer's one-sided plane confirms the producer can no longer write."""
            if not self.net.revokes:
                return
            src, eff = self.net.revokes[i % len(self.net.revokes)]
            if src not in self.net.cores:
                self.net.revokes.remove((src, eff))
                return
            self.revoked.add((src, eff.kv_request_id, eff.round))
            self._step(src, lambda: self.net.finish_revoke(i, self.clock.now()))

        @rule(k=st.sampled_from(IDS), c=st.sampled_from(CONSUMERS))
        def corrupt(self, k: str, c: str) -> None:
            """The blocks of ``c``'s live round of ``k`` land with a digest mismatch."""
            rec = self.cores[c].consumer.records.get(k)
            if rec is not None and rec.round >= 0:
                self.net.corrupt.add((k, rec.round))

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
        def producer_indexes_match_its_records(self) -> None:
            # the shell reads these indexes instead of scanning (quarantine gauge and log on every
            # poll, per-peer fan-out), so a drifted index is a wrong gauge or a missed session end
            prod = self.p.producer
            recs = prod.records.values()
            assert prod.quarantined == {r.key for r in recs if r.state.value == "quarantined"}
            assert set(prod.retained) == {r.key for r in recs if r.state.value in ("done", "tombstoned")}
            bound: dict[str, set[str]] = {}
            for r in recs:
                if r.state.value in P_BOUND:
                    bound.setdefault(r.peer, set()).add(r.key)
            assert {peer: set(keys) for peer, keys in prod.by_peer.items()} == bound

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
            if self.broken:
                return
            for _ in range(60):
                if not (self.net.directions() or self.net.transfers or self.net.revokes or self.outstanding
                        or self._live_records()):
                    break
                busy = False
                for src, dst in self.net.directions():
                    busy = True
                    if dst in self.net.cores:
                        env = self.net.queues[(src, dst)][0]
                        self._deliver_step(src, dst, 0, env)
                    else:
                        self.net.deliver(src, dst, 0, self.clock.now())
                if self.net.transfers:
                    busy = True
                    t = self.net.transfers[0]
                    self._step(t.src, lambda: self.net.finish_transfer(0, self.clock.now())[1])
                if self.net.revokes:
                    busy = True
                    self.finish_revoke(0)
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
        for name in ("stop", "peer_failure", "corrupt"):
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
