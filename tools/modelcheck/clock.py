"""Abstract time: any armed deadline of any record may fire at any step.

The model has no durations.  Every core input happens at ``now = NOW``, and the interned states
have every deadline at +inf (:func:`.encoding.timeless`), so none fires by itself.  Instead, in
every state, each live deadline offers a nondeterministic step "it falls due": the core is
restored with that one deadline at ``NOW`` (:func:`tools.snapshot.retime`) and the
shell's tick runs — :func:`kvtier.lifecycle.driver.drive`, the function the shell runs, with the
messages that wait unread in the core's sockets and the time the sockets were last seen empty.
So every ordering of deadlines relative to each other and to every other step is covered,
whatever the configured durations — a superset of what any real clock can do.

**Input before deadlines.**  A message that *arrived* in a core's socket and waits unread
(:mod:`.network`, receive batching) arrived before the deadline that falls due now.  The tick
hands the unread messages that *concern* the deadline (:meth:`.network.Network.unread_for`: a
message concerns the deadlines of the id it names and of its sender's session) to the driver as
its inputs, with ``deadlines_at`` just before ``NOW`` (the sockets were last seen empty before
those messages arrived); with nothing unread, ``deadlines_at = NOW``.  The contract
(``input_before_deadline``, decision I3) says the driver applies the inputs first and fires only
what was due at ``deadlines_at``: then the deadline does not fire in that step (it may fire in a
later one, once the messages were read) and the step reads the messages.  Whether the driver
keeps the contract is what the property ``input_before_deadline`` checks, on the code that runs:
the core the driver is handed notes a deadline fired while one of those messages was still
unapplied (:class:`.system._Observed`).  The planted bug ``deadlines_before_input`` plants an
earlier kvtier's shell (deadlines against ``now``, before the input) in ``drive`` itself.

The shell's rule is stronger than the model's (it waits for *every* unread message, not only
the ones that concern the deadline); the model's lets more deadlines fire, so it covers every
ordering the shell can produce, and it keeps the id/consumer pairs independent for the
partial-order reduction (:mod:`.reduction`): a deadline of one pair never waits for another
pair's messages.

Sessions' ``heartbeat`` deadlines (ready sessions) come in two kinds, by the bounds:

* **silent**: nothing was heard from the peer for ``peer_timeout_s`` (the core is restored with
  the session last heard at -inf): the session dies (``peer_timeout``) — a session death seen
  from one side, which spends the crash budget (:meth:`.network.Network.silence_may_end`) and is
  not a completion step;
* **heard**: the dialled side (the consumer) pings and restarts its timer (``pings``; at most one
  ping or pong of a session in flight, :meth:`.network.Network.pinging`).  The accepting side's
  heartbeat without silence only restarts its timer: a step that changes nothing, not explored.

A consumer's ``abort_ack`` deadline on a two-sided plane comes in two kinds too: the producer
**at work** (the session active at the model's one instant: the load ends alone, decision L20) and
**idle** (:data:`IDLE`: the session is given up).  A one-sided plane ends the session either way.

``prune`` deadlines fire only with ``prune_timers`` (a pruned id is fresh again, so a late fetch
then meets a new id).  Deadlines are completion steps (the liveness search may use them), except
a silent heartbeat: a stuck id cannot blame time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtier.lifecycle import inputs as ix
from tools.modelcheck.part import CoreInput, Drive, Part
from tools.modelcheck.trace import CLOCK, PRODUCER

if TYPE_CHECKING:
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.system import System
    from tools.modelcheck.trace import Recorder

__all__ = ["IDLE", "NOW", "QUIET", "SILENT", "Clock"]

NOW = 0.0
"""The time of every core input (seconds; abstract: deadlines fire only when chosen to)."""

QUIET = NOW - 1.0
"""When a core's sockets were last seen empty, if a message waits unread in them: before it
arrived, so before the deadline that falls due at ``NOW``."""

SILENT = "silent"
"""The variant of a heartbeat deadline that finds the peer silent for ``peer_timeout_s``."""

IDLE = "idle"
"""The variant of a consumer's ``abort_ack`` deadline that finds the producer sent it no work for
``abort_ack_timeout_s`` (the core restored with the session last active at -inf); without it the
producer is at work (decisions L19, L20)."""


class Clock(Part):
    """Which deadlines may fall due, and the shell's tick that follows."""

    kinds = ("fire",)

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self._fires: dict[tuple[str, int], tuple[tuple, ...]] = {}
        self._variant_cache: dict[tuple[str, int, bool], tuple] = {}
        self._firable: dict[tuple[str, int, bool], frozenset[str]] = {}

    def actions(self, g: State, full: bool) -> list[tuple]:
        """``("fire", core, machine, key, variant)`` for every live deadline the bounds let fall
        due (the producer's first, then each consumer's; per core in machine then key order)."""
        s = self.system
        out: list[tuple] = []
        out.extend(self._core_actions(g, None, full))
        for c in range(len(s.cnames)):
            out.extend(self._core_actions(g, c, full))
        return out

    def _core_actions(self, g: State, c: int | None, full: bool) -> Sequence[tuple]:
        s = self.system
        comp, sid = ("p", g.p) if c is None else (s.cnames[c], g.c[c])
        silence = s.network.silence_may_end(g, full)
        always, pings = self._variants(comp, sid, silence)
        if not pings:
            return always
        pinging = s.network.pinging
        return [*always, *(a for a, pair in pings if not pinging(g, pair))]

    def _variants(self, comp: str, sid: int, silence: bool) -> tuple[tuple[tuple, ...], tuple[tuple[tuple, int], ...]]:
        """The fire actions of core ``comp`` in snapshot ``sid``: those offered whatever the
        channels hold, and the pings (with the pair whose channels must hold no ping) — cached per
        snapshot and whether silence may end a session."""
        key = (comp, sid, silence)
        got = self._variant_cache.get(key)
        if got is None:
            s = self.system
            always: list[tuple] = []
            pings: list[tuple[tuple, int]] = []
            for f in self._core_fires(comp, sid):
                if f[2] == "session" and f[4] == "heartbeat":
                    if silence:
                        always.append((*f[:4], SILENT))
                    if self.b.pings and s.cores.summaries[sid].sessions[f[3]][2]:  # the dialled side pings
                        pings.append(((*f[:4], ""), s.cindex[comp] if comp != "p" else s.cindex[f[3]]))
                    continue
                always.append((*f[:4], ""))
                if f[2] == "consumer" and f[4] == "abort_ack" and not self.b.one_sided:
                    always.append((*f[:4], IDLE))
            got = self._variant_cache[key] = (tuple(always), tuple(pings))
        return got

    def firable(self, g: State, c: int | None) -> frozenset[str]:
        """The record keys of the producer (``c`` None) or consumer ``c`` whose deadlines may fall
        due in ``g``, input aside."""
        s = self.system
        key = ("p", g.p, s.network.silence_may_end(g, True)) if c is None else (
            s.cnames[c], g.c[c], s.network.silence_may_end(g, True))
        got = self._firable.get(key)
        if got is None:
            if self._variants(*key)[1]:  # pings, which depend on the channels: not cached
                return frozenset(a[3] for a in self._core_actions(g, c, True))
            got = self._firable[key] = frozenset(a[3] for a in self._variants(*key)[0])
        return got

    def _core_fires(self, comp: str, sid: int) -> tuple[tuple, ...]:
        """``("fire", comp, machine, key, timer)`` of core ``comp``'s live deadlines in snapshot
        ``sid`` the bounds let fire at all (cached per snapshot)."""
        key = (comp, sid)
        got = self._fires.get(key)
        if got is None:
            fires = []
            for machine, rkey, timer in self.system.cores.summaries[sid].timers:
                if timer == "prune" and not self.b.prune_timers:
                    continue
                fires.append(("fire", comp, machine, rkey, timer))
            got = self._fires[key] = tuple(fires)
        return got

    def _sid(self, g: State, comp: str) -> int:
        return g.p if comp == "p" else g.c[self.system.cindex[comp]]

    def _timer(self, g: State, comp: str, machine: str, key: str) -> str:
        summ = self.system.cores.summaries[self._sid(g, comp)]
        return next(t for m, k, t in summ.timers if (m, k) == (machine, key))

    def label(self, g: State, action: tuple) -> str:
        _, comp, machine, key, variant = action
        who = "P" if comp == "p" else comp
        timer = self._timer(g, comp, machine, key)
        what = {SILENT: " (the peer was silent for peer_timeout_s)",
                IDLE: " (the producer sent no work for abort_ack_timeout_s)"}.get(variant, "")
        unread = self.system.network.unread_for(g, None if comp == "p" else self.system.cindex[comp], key)
        msgs = self.system.cores.msgs
        also = f", the tick reading first: {'; '.join(str(msgs[m]) for _, m in unread)}" if unread else ""
        return f"timer {timer} of {who}.{machine}({key}) fires{what}{also}"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s = self.system
        _, comp, machine, key, variant = action
        c = None if comp == "p" else s.cindex[comp]
        if variant == SILENT:
            s.network.on_silence(st, s.cores.summaries[self._sid(g, comp)], key)
        unread = s.network.unread_for(g, c, key)
        if rec is not None:
            lane = PRODUCER if c is None else s.lanes[c]
            rec.add("timer", CLOCK, lane, f"{self._timer(g, comp, machine, key)} deadline of {machine} {key}"
                    + {SILENT: " (peer silent)", IDLE: " (producer idle)"}.get(variant, ""))
        s.network.read_unread(st, c, unread, rec)
        inp = ("fire", machine, key, variant, tuple(m for _, m in unread))
        if c is None:
            s.step_producer(st, inp, rec)
        else:
            s.step_consumer(st, c, inp, rec)

    # -- partial-order reduction ---------------------------------------------------------------
    def process_of(self, action: tuple) -> int | None:
        s = self.system
        _, comp, machine, key, _variant = action
        if comp != "p":
            return s.cindex[comp]
        if machine == "session":
            return s.cindex[key]
        return s.kindex[key[1] if machine == "serve" else key]

    def touches_producer(self, action: tuple) -> bool:
        return action[1] == "p"

    def shares_budget(self, g: State, action: tuple) -> bool:
        return action[4] == SILENT

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {"fire": _fire}


def _fire(inp: tuple) -> Drive:
    """("fire", machine, key, variant, unread envelopes): the record's deadline is due at NOW (the
    others stay at +inf), the session silent if so chosen, and the tick reads the unread messages
    about it first (:func:`kvtier.lifecycle.driver.drive`)."""
    _, machine, key, variant, unread = inp
    silent = variant == SILENT

    def clock(kind: str, m: str, k: str, t: float) -> float:
        if kind == "deadline":
            return NOW if (m, k) == (machine, key) else t
        if kind == "heard" and silent and k == key:
            return -math.inf
        if kind == "active" and variant == IDLE:
            return -math.inf
        return t

    inputs = tuple(ix.Received(env.src, env.msg) for env in unread)
    return Drive(inputs, QUIET if inputs else NOW, clock, unread=True)

