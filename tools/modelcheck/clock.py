"""Abstract time: any armed deadline of any record may fire at any step.

The model has no durations.  Every core input happens at ``now = NOW``; a restored core's
deadlines are armed at +inf (:mod:`.encoding`), so none fires by itself.  Instead, in every state,
each record that names a timer offers a nondeterministic step "its deadline fires": the record's
deadline is re-armed at ``NOW`` and the core's own ``tick`` runs it.  So every ordering of
deadlines relative to each other and to every other step is covered, whatever the configured
durations — a superset of what any real clock can do.

**Input before deadlines.**  The shell fires a manager's deadlines only at the time its inbound
queue was last seen empty (``KvTierManager._drain_inbound``; docs/lifecycle.md, "Deadlines never
beat input that arrived first").  So no deadline may fire while a message that concerns it has
arrived in the core's sockets and was not read yet (:mod:`.network`, receive batching;
:meth:`.network.Network.unread_concerns`: a message concerns the deadlines of the id it names and
of its sender's session): :attr:`Clock.input_first`.  The shell's rule is stronger (it waits for
*every* unread message); the model's lets more deadlines fire, so it covers every ordering the
shell can produce, and it keeps the id/consumer pairs independent for the partial-order reduction
(:mod:`.reduction`): a deadline of one pair never waits for another pair's messages.  The property
``input_before_deadline`` checks every firing against it; the planted bug
``deadlines_before_input`` (the first release's shell, which ticked against "now") switches the
rule off.

Two deadlines are restricted, by the bounds:

* a session's ``liveness`` deadline firing is a session death seen from one side: it spends the
  crash budget (:meth:`.network.Network.liveness_may_fire`) and is not a completion step;
* ``prune`` deadlines fire only with ``prune_timers`` (a pruned id is fresh again, so a late fetch
  then meets a new id).

Deadlines are completion steps (the liveness search may use them): a stuck id cannot blame time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.modelcheck.part import CoreInput, Part
from tools.modelcheck.trace import CLOCK, PRODUCER
from kvtier.lifecycle.core import TierCore

if TYPE_CHECKING:
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.system import System
    from tools.modelcheck.trace import Recorder

__all__ = ["NOW", "Clock"]

NOW = 0.0
"""The time of every core input (seconds; abstract: deadlines fire only when chosen to)."""


class Clock(Part):
    """Which deadlines may fire."""

    kinds = ("fire",)

    input_first = True
    """the shell's rule: a core's deadlines fire only when its sockets hold no unread message"""

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self._fires: dict[tuple[str, int, bool], tuple[tuple, ...]] = {}

    def actions(self, g: State, full: bool) -> list[tuple]:
        """``("fire", core, machine, key)`` for every armed deadline the bounds let fire (the producer's
        first, then each consumer's; per core in machine then key order), unless an unread message
        in the core's sockets concerns it (:attr:`input_first`)."""
        s = self.system
        liveness = s.network.liveness_may_fire(g, full)
        concerns = s.network.unread_concerns if self.input_first and self.b.batching else None
        out: list[tuple] = []
        for c, comp, sid in ((None, "p", g.p), *((c, s.cnames[c], sid) for c, sid in enumerate(g.c))):
            fires = self._core_fires(comp, sid, liveness)
            if concerns is not None and fires:
                blocked = concerns(g, c)
                if blocked:
                    fires = tuple(f for f in fires if f[3] not in blocked)
            out.extend(fires)
        return out

    def firable(self, g: State, comp: str, sid: int) -> frozenset[str]:
        """The record keys of core ``comp`` (snapshot ``sid``) whose deadlines may fire in ``g``,
        input aside."""
        return frozenset(f[3] for f in self._core_fires(comp, sid, self.system.network.liveness_may_fire(g, True)))

    def _core_fires(self, comp: str, sid: int, liveness: bool) -> tuple[tuple, ...]:
        """The deadlines of core ``comp`` in snapshot ``sid`` that may fire (cached: a function of the
        snapshot and of whether liveness deadlines may fire)."""
        key = (comp, sid, liveness)
        got = self._fires.get(key)
        if got is None:
            fires = []
            for machine, rkey, timer in self.system.cores.summaries[sid].timers:
                if machine == "sessions" and timer == "liveness" and not liveness:
                    continue
                if timer == "prune" and not self.b.prune_timers:
                    continue
                fires.append(("fire", comp, machine, rkey))
            got = self._fires[key] = tuple(fires)
        return got

    def _sid(self, g: State, comp: str) -> int:
        return g.p if comp == "p" else g.c[self.system.cindex[comp]]

    def label(self, g: State, action: tuple) -> str:
        _, comp, machine, key = action
        who = "P" if comp == "p" else comp
        summ = self.system.cores.summaries[self._sid(g, comp)]
        timer = next(t for m, k, t in summ.timers if (m, k) == (machine, key))
        return f"timer {timer} of {who}.{machine.rstrip('s')}({key}) fires"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s = self.system
        _, comp, machine, key = action
        if machine == "sessions":
            s.network.on_session_deadline(st, s.cores.summaries[self._sid(g, comp)], key)
        if rec is not None:
            summ = s.cores.summaries[self._sid(g, comp)]
            timer = next(t for m, k, t in summ.timers if (m, k) == (machine, key))
            lane = PRODUCER if comp == "p" else s.lanes[s.cindex[comp]]
            rec.add("timer", CLOCK, lane, f"{timer} deadline of {machine.rstrip('s')} {key}")
        if comp == "p":
            s.step_producer(st, ("fire", machine, key), rec)
        else:
            s.step_consumer(st, s.cindex[comp], ("fire", machine, key), rec)

    # -- partial-order reduction ---------------------------------------------------------------
    def process_of(self, action: tuple) -> int | None:
        s = self.system
        _, comp, machine, key = action
        if comp != "p":
            return s.cindex[comp]
        return s.cindex[key] if machine == "sessions" else s.kindex[key]

    def touches_producer(self, action: tuple) -> bool:
        return action[1] == "p"

    def shares_budget(self, g: State, action: tuple) -> bool:
        return action[2] == "sessions" and g.crashes > 0

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {"fire": _fire}


def _fire(core: TierCore, inp: tuple) -> list:
    """("fire", machine, key): re-arm the record's deadline at NOW and let the core's tick run it."""
    _, machine, key = inp
    m = getattr(core, machine)
    m.records[key].tseq = m._deadlines.arm(NOW, key)
    return core.tick(NOW)
