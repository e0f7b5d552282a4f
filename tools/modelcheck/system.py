"""The composed system: one producer core, the consumer cores, and the environment's parts.

:class:`System` wires the parts (:mod:`.engines`, :mod:`.network`, :mod:`.transport`,
:mod:`.clock`) to the cores (:mod:`.encoding`) and the properties (:mod:`.properties`):

* :meth:`System.actions` — every action enabled in a state, in breadth-first order (the order
  decides which of the shortest counterexamples is reported, and is the priority order of the
  liveness search's greedy completion path);
* :meth:`System.apply` — the successor state (the part that owns the action's kind applies it);
* :meth:`System.step_producer` / :meth:`System.step_consumer` — one core step: run it (memoised),
  record it, run the properties' step checks, then let the environment take the step's effects
  (the engines their job results, the transport its transfers and revocations, the network the
  messages);
* :meth:`System.feed` — how a core input reaches the core: the owning part's handler says which
  input records and which deadline time; a core restored from the interned state is driven
  through :func:`kvtier.lifecycle.driver.drive` — the function the shell runs — with a performer
  that gives the shell's synchronous answers (a connection comes up, the plane takes a
  descriptor, blocks are landed, a receiver-applied plane's access is revoked) within the same
  core step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from operator import attrgetter
from typing import Any

from kvtier.lifecycle import driver
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings, TierCore
from tools import snapshot
from tools.modelcheck.bounds import Bounds
from tools.modelcheck.clock import NOW, Clock
from tools.modelcheck.encoding import Cores, CoreStep
from tools.modelcheck.engines import Engines
from tools.modelcheck.network import Network
from tools.modelcheck.part import Answer, CoreInput, Part, Stage
from tools.modelcheck.properties import (
    CONSUMER_STEP_CHECKS,
    PRODUCER_STEP_CHECKS,
    STATE_CHECKS,
    Fail,
    StepHook,
    quiescent,
    stuck,
)
from tools.modelcheck.state import Draft, State, put
from tools.modelcheck.symmetric import Symmetric
from tools.modelcheck.trace import PREFILL, PRODUCER, Recorder, consumer_lane, decode_lane
from tools.modelcheck.transport import Transport
from tools.snapshot import CoreState

__all__ = ["System"]


class _Observed:
    """What :func:`~kvtier.lifecycle.driver.drive` is handed instead of the core: it passes every
    call on and notes whether a deadline was due when ``fire`` was called while one of the
    ``unread`` inputs (messages that arrived before the deadline fell due) was not applied yet —
    the one thing ``input_before_deadline`` forbids."""

    __slots__ = ("core", "unread", "early")

    def __init__(self, core: TierCore, unread: tuple) -> None:
        self.core = core
        self.unread = {id(i) for i in unread}
        self.early = False

    def handle(self, inp: object, now: float) -> list:
        self.unread.discard(id(inp))
        return self.core.handle(inp, now)  # type: ignore[arg-type]

    def fire(self, now: float) -> list:
        if self.unread:
            due = self.core.next_deadline()
            if due is not None and due <= now:
                self.early = True
        return self.core.fire(now)



def _passes(hook: StepHook, system: System, c: int | None, step: CoreStep) -> bool:
    """Whether a step hook that reads the step alone passes on ``step``."""
    try:
        hook(system, None, c, step)  # type: ignore[arg-type]
    except Fail:
        return False
    return True


def _remembered(hook: StepHook, system: System, reads: tuple[str, ...], writes: tuple[str, ...]) -> Stage:
    """A stage of one step's pipeline that runs ``hook`` once per value of the draft's fields it
    ``reads``, and after that only sets the fields it ``writes`` to what they became then."""
    get = attrgetter(*reads)
    put_back = attrgetter(*writes) if writes else None
    done: dict[Any, Any] = {}

    def stage(st: Draft, c: int | None, step: CoreStep) -> None:
        key = get(st)
        if key in done:
            if put_back is not None:
                values = done[key]
                for name, v in zip(writes, values if len(writes) > 1 else (values,)):
                    setattr(st, name, v)
            return
        hook(system, st, c, step)
        done[key] = put_back(st) if put_back is not None else None

    return stage


class System:
    """The composed system explored under bounds ``b``."""

    def __init__(self, b: Bounds) -> None:
        self.b = b
        self.kids = tuple(chr(ord("X") + i) if i < 3 else f"I{i}" for i in range(b.ids))
        """kv_request_ids: X, Y, Z, I3, I4..."""
        self.cnames = tuple(f"c{i + 1}" for i in range(b.consumers))
        """consumer peer names: c1, c2... (the producer is "p")"""
        self.kindex = {k: i for i, k in enumerate(self.kids)}
        self.cindex = {c: i for i, c in enumerate(self.cnames)}
        self.lanes = tuple(consumer_lane(c) for c in range(b.consumers))
        """each consumer's trace lane"""
        self.engines = Engines(self)
        self.network = Network(self)
        self.transport = Transport(self)
        self.clock = Clock(self)
        self.symmetric = Symmetric(self)
        self.parts: tuple[Part, ...] = (self.engines, self.network, self.transport, self.clock, self.symmetric)
        parts = self.parts
        self.owner: dict[str, Part] = {}
        """action kind -> the part that owns it"""
        self._inputs: dict[str, CoreInput] = {}
        self._answers: dict[type, Answer] = {}
        for part in parts:
            answers = part.answers()
            for table, names in ((self.owner, part.kinds), (self._inputs, part.core_inputs()), (self._answers, answers)):
                taken = set(names) & set(table)
                if taken:
                    raise RuntimeError(f"model check: {type(part).__name__} claims {sorted(taken, key=str)}, already "
                                       f"claimed")
            self.owner.update(dict.fromkeys(part.kinds, part))
            self._inputs.update(part.core_inputs())
            self._answers.update(answers)
        self._apply = {kind: part.apply for kind, part in self.owner.items()}  # bound once: called per transition
        self._projects = tuple(part.project for part in parts)
        settings = CoreSettings(
            durations={k: 10.0 for k in TIMER_KEYS},  # any value: abstract time ignores durations
            park_clock=b.park_clock,
            tombstone_max=b.tombstone_max,
            max_pending_fetches_per_peer=b.max_pending,
            serve_external=b.symmetric,  # the producer serves probes from its engine's tiers
        )
        self.cores = Cores(settings, self.feed)
        self._state_checks = tuple((check, reads, set()) for check, reads in STATE_CHECKS)
        """each state check, the fields it reads, and the keys of those it passed on"""
        # the pipeline of each distinct core step, by id(step): the producer's, then each consumer's
        self._stages_p: dict[int, tuple[Stage, ...]] = {}
        self._stages_c: tuple[dict[int, tuple[Stage, ...]], ...] = tuple({} for _ in self.cnames)

    def feed(self, name: str, state: CoreState, inp: tuple) -> tuple[TierCore, list, bool]:
        """Restore core ``name`` from ``state`` and apply model input ``inp`` through
        :func:`kvtier.lifecycle.driver.drive`, with the shell's synchronous answers to its effects
        (and to theirs) reported by the parts' performers (:meth:`.part.Part.answers`).  Returns
        the core after the step, every effect performed, in order, and whether a deadline fired
        while an unread message that arrived before it was not applied yet."""
        plan = self._inputs[inp[0]](inp)
        if plan.retime is not None:
            state = snapshot.retime(state, plan.retime)
        core = self.cores.restore(state, scratch=True)
        seen: list = []
        answers = self._answers

        def perform(effects: list) -> list:
            reported = []
            for eff in effects:
                seen.append(eff)
                answer = answers.get(type(eff))
                if answer is not None:
                    got = answer(eff, inp)
                    if got is not None:
                        reported.append(got)
            return reported

        observed = _Observed(core, plan.inputs if plan.unread else ())
        driver.drive(observed, plan.inputs, NOW, deadlines_at=plan.deadlines_at, perform=perform)  # type: ignore[arg-type]
        return core, seen, observed.early

    def initial(self) -> State:
        """Every core fresh, every consumer's session to the producer ready (unless the bounds
        leave the handshake to be explored: ``connected=False``), nothing else."""
        cores = self.cores
        p = cores.intern(cores.fresh())
        cs = []
        for name in self.cnames:
            c = cores.intern(cores.fresh(gen_base=100 * (len(cs) + 1)))
            if self.b.connected:
                p, c = self.network.handshake(p, c, name)
            cs.append(c)
        n = self.b.ids
        return State(
            p=p,
            c=tuple(cs),
            chans=tuple(() for _ in range(2 * self.b.consumers)),
            arrived=(0,) * (2 * self.b.consumers),
            transfers=(),
            revokes=(),
            attaches=(),
            stores=(0,) * n,
            p_finished=(False,) * n,
            lives=(0,) * n,
            loads=tuple((0,) * n for _ in self.cnames),
            outstanding=frozenset(),
            retired=(False,) * n,
            receipted=(False,) * n,
            corrupted=frozenset(),
            faults=(self.b.faults,) * (self.b.consumers if self.b.fault_scope == "per_peer" else 1),
            crashes=self.b.crashes,
            drained=False,
            shut=(0,) * (1 + self.b.consumers),
        )

    # -- actions -------------------------------------------------------------------------------
    def actions(self, g: State, full: bool) -> Iterable[tuple]:
        """Actions enabled in ``g``: every one (``full``: a list), or completion steps only (no new
        work, no faults, no crashes, and no consumer giving up on its own: an engine waits for its
        load), lazily, in the priority order the liveness search tries them."""
        if not full:
            return self._completion(g)
        engines, network, transport = self.engines, self.network, self.transport
        acts = network.deliveries(g)
        acts += network.arrivals(g)
        acts += transport.actions(g, True)
        acts += transport.revocations(g)
        acts += transport.attachments(g, True)
        acts += self.clock.actions(g, True)
        acts += engines.producer_actions(g, True)
        acts += engines.consumer_actions(g, True)
        acts += self.symmetric.actions(g, True)
        acts += network.faults(g)
        acts += network.crashes(g)
        acts += engines.operator_actions(g, True)
        return acts

    def _completion(self, g: State) -> Iterator[tuple]:
        # the same order as actions(g, full=True), restricted to completion steps
        yield from self.network.deliveries(g)
        yield from self.network.arrivals(g)
        yield from self.transport.actions(g, False)
        yield from self.transport.revocations(g)
        yield from self.transport.attachments(g, False)
        yield from self.clock.actions(g, False)
        yield from self.engines.producer_actions(g, False)
        yield from self.engines.consumer_actions(g, False)
        yield from self.symmetric.actions(g, False)
        yield from self.engines.operator_actions(g, False)

    def label(self, g: State, action: tuple) -> str:
        """Human-readable text of ``action`` in state ``g``."""
        return self.owner[action[0]].label(g, action)

    def apply(self, g: State, action: tuple, rec: Recorder | None = None) -> State:
        """Successor of ``g``; raises :class:`~.properties.Fail` on a safety violation. Records the
        trace of the step into ``rec`` if given."""
        st = Draft(g)
        self._apply[action[0]](st, g, action, rec)
        return st.freeze()

    # -- core steps ----------------------------------------------------------------------------
    def step_producer(self, st: Draft, inp: tuple, rec: Recorder | None) -> None:
        """One step of the producer's core."""
        step = self.cores.step("p", st.p, inp)
        st.p = step.snap
        if rec is not None:  # before the checks: a violating step shows what the core did
            rec.core_step("P", PRODUCER, PREFILL, step.pre, step.post, step.effects)
        stages = self._stages_p.get(id(step))
        if stages is None:
            stages = self._stages_p[id(step)] = self._pipeline(step, None)
        for stage in stages:
            stage(st, None, step)

    def step_consumer(self, st: Draft, c: int, inp: tuple, rec: Recorder | None) -> None:
        """One step of consumer ``c``'s core."""
        step = self.cores.step(self.cnames[c], st.c[c], inp)
        st.c = put(st.c, c, step.snap)
        if rec is not None:
            rec.core_step(self.cnames[c], self.lanes[c], decode_lane(c), step.pre, step.post, step.effects)
        cache = self._stages_c[c]
        stages = cache.get(id(step))
        if stages is None:
            stages = cache[id(step)] = self._pipeline(step, c)
        for stage in stages:
            stage(st, c, step)

    def _pipeline(self, step: CoreStep, c: int | None) -> tuple[Stage, ...]:
        """What follows core step ``step`` of the producer (``c`` None) or consumer ``c``, in order:
        the property checks that need to see it (registry order, see :mod:`.properties`), then the
        parts of the environment that take its effects.  Every stage is ``stage(draft, c, step)``.

        Depends on the memoised step (and the core) only, so it is built once per step and core and
        cached by the step's identity (the memo keeps every step alive)."""
        checks = PRODUCER_STEP_CHECKS if c is None else CONSUMER_STEP_CHECKS
        stages: list[Stage] = []
        for hook, when, reads, writes in checks:
            if when is not None and not when(self, step):
                continue
            if reads is None:
                stages.append(partial(hook, self))
            elif reads:
                stages.append(_remembered(hook, self, reads, writes))
            elif not _passes(hook, self, c, step):
                stages.append(partial(hook, self))
        for part in self.parts:
            stage = part.after_step(step, c)
            if stage is not None:
                stages.append(stage)
        return tuple(stages)

    # -- properties ----------------------------------------------------------------------------
    def check_state(self, g: State) -> None:
        """The properties' checks of one state (each once per distinct part of a state it reads)."""
        for check, reads, passed in self._state_checks:
            if reads is None:
                check(self, g)
                continue
            key = reads(g)
            if key not in passed:
                check(self, g)
                passed.add(key)

    def quiescent(self, g: State) -> bool:
        return quiescent(self, g)

    def stuck(self, g: State) -> list[tuple[str, str]]:
        return stuck(self, g)

    # -- for the partial-order reduction (.reduction; the parts answer for their actions) -------
    def shared(self, g: State) -> tuple:
        """Everything no pair's projection holds: the producer core's counters and retained order,
        the budgets the pairs share, the operator's and the producer's shutdown."""
        return (
            self.cores.shared(g.p),
            g.crashes,
            g.faults if self.b.fault_scope != "per_peer" else None,
            g.drained,
            g.shut[0],
        )

    def projection(self, g: State, i: int) -> tuple:
        """Everything that belongs to pair ``i`` (id i with consumer i): its producer records, the
        consumer's core, and each part's slice of the environment."""
        precs = self.cores.precords(g.p)
        engines, network, transport, clock, symmetric = self._projects  # unrolled: this runs per state and pair
        return (
            precs.get(("producer", self.kids[i])),
            precs.get(("session", self.cnames[i])),
            g.c[i],
            g.retired[i],
            g.receipted[i],
            engines(g, i), network(g, i), transport(g, i), clock(g, i), symmetric(g, i),
        )
