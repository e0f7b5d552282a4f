"""The symmetric path's engines (decision M14): the consumer's engine probing the producer for a
request's blocks, and the producer's engine answering in its serve windows.

* **The consumer's engine** (consumer 0, request ``kids[0]``, keys ``b"<id>.<k>"``, ``k <
  sym_keys``): it announces the request (``ProbeAnnounced``: the blocks may be on ``p``); looks
  keys up, in prefix order as vLLM's scan does (key ``k`` only after key ``k-1`` answered RETRY or
  HIT; a key the probe already answered HIT or MISS is not looked up again); ends its step
  (``ScheduleEnded``, only while the probe collects keys: otherwise it changes nothing); submits
  one load of the keys answered HIT that no load holds yet (``LoadSubmitted``, job
  :meth:`.engines.Engines.sym_job`); and finishes the request (``RequestFinished``).  The answers
  are the live core's (``TierCore.probe_answers``, read into :class:`.encoding.Summary`).
* **The producer's engine** (the shell's :class:`kvtier.shell.serving.ServeWindows` and a block
  source): every ``LookUpBlocks`` the producer's core emits is queued (``State.lookups``); a
  *window* step takes the oldest: if the core no longer waits for the round's lookups
  (``serve_room`` None: the serve record is not ``looking_up``) it is dropped, as the shell does;
  otherwise each key is found, missing or pending (every combination is explored), the found ones
  pinned under a fresh pin id with pool blocks ``600 + k``, and ``LookupAnswered`` applied.  Every
  ``ReleasePins`` the core emits releases its pins (``State.pins``; the properties check each is
  released once, never while the data plane references its blocks).  ``CloseLookup`` closes a
  context: the model keeps none (the engine's lookup contexts are checked by
  tests/symmetric/harness.py, which drives the real ``ServeWindows``; decision M14).

Completion steps (the liveness search): the step's end and the serve window (found or missing
only: a pending answer does not progress).  Announcing, lookups, loads and finishing the request
are new work, as a PD load is.

State fields: ``sym`` (phase, loads submitted, next pin id), ``lookups``, ``pins``.
"""

from __future__ import annotations

from itertools import product
from typing import TYPE_CHECKING

from tools.modelcheck.engines import SYM_LOADS
from tools.modelcheck.part import CoreInput, Drive, Part, Stage
from tools.modelcheck.trace import PRODUCER, decode_lane
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import LookUpBlocks, ReleasePins

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep, Summary
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.system import System
    from tools.modelcheck.trace import Recorder

__all__ = ["BLOCK_BASE", "Symmetric"]

BLOCK_BASE = 600
"""The producer's engine holds key ``k`` of the request in pool block ``BLOCK_BASE + k``."""

_OUTCOMES = {"f": "found", "m": "missing", "p": "pending"}


class Symmetric(Part):
    """The consumer engine's symmetric request and the producer engine's serve windows."""

    kinds = ("s_announce", "s_lookup", "s_schedule_end", "s_load", "s_finished", "window")

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.kid = system.kids[0]
        self.keys = tuple(f"{self.kid}.{k}".encode() for k in range(self.b.sym_keys))
        self.index = {k: i for i, k in enumerate(self.keys)}

    # -- reads ---------------------------------------------------------------------------------
    def _consumer(self, g: State) -> Summary:
        return self.system.cores.summaries[g.c[0]]

    def answer(self, summary: Summary, key: bytes) -> str:
        return summary.answers.get((self.kid, key), "miss")

    def _hits(self, summary: Summary) -> tuple[bytes, ...]:
        """The HIT prefix no load holds yet: what the engine loads."""
        probe = summary.probe.get(self.kid)
        loading = set(probe[3]) if probe else set()
        out = []
        for k in self.keys:
            if self.answer(summary, k) != "hit":
                break
            if k not in loading:
                out.append(k)
        return tuple(out)

    # -- actions -------------------------------------------------------------------------------
    def actions(self, g: State, full: bool) -> list[tuple]:
        if not self.b.symmetric:
            return []
        out: list[tuple] = []
        out.extend(self._windows(g, full))
        phase, loads, _pin = g.sym
        summary = self._consumer(g)
        probe = summary.probe.get(self.kid)
        if phase == 1 and probe is not None and probe[0] == "collecting":
            out.append(("s_schedule_end",))
        if not full or g.shut[1]:
            return out
        if phase == 0:
            out.append(("s_announce",))
        elif phase == 1:
            known = {k for (kid, k) in summary.answers if kid == self.kid}
            for i, k in enumerate(self.keys):
                if i and (self.keys[i - 1] not in known or self.answer(summary, self.keys[i - 1]) not in ("retry", "hit")):
                    break
                if k not in known or self.answer(summary, k) == "retry":
                    out.append(("s_lookup", i))
            if loads < SYM_LOADS and self._hits(summary):
                out.append(("s_load",))
            out.append(("s_finished",))
        return out

    def _windows(self, g: State, full: bool) -> list[tuple]:
        """``("window", outcome)`` for the oldest queued lookup: ``None`` when the core no longer
        wants it (the shell skips it), else one letter per key (found, missing, pending)."""
        if not g.lookups or g.shut[0] == 2:
            return []
        peer, kid, rnd, keys = g.lookups[0]
        serve = self.system.cores.summaries[g.p].serve.get((peer, kid, rnd))
        if serve is None or serve[0] != "looking_up":
            return [("window", None)]
        letters = "fmp" if full else "fm"
        return [("window", "".join(o)) for o in product(letters, repeat=len(keys))]

    def label(self, g: State, action: tuple) -> str:
        s, kind = self.system, action[0]
        who = s.cnames[0]
        if kind == "s_announce":
            return f"{who}.probe_announced({self.kid} on p)"
        if kind == "s_lookup":
            return f"{who}.lookup({self.keys[action[1]].decode()})"
        if kind == "s_schedule_end":
            return f"{who}.schedule_end()"
        if kind == "s_load":
            return f"{who}.load({self.kid} keys {[k.decode() for k in self._hits(self._consumer(g))]})"
        if kind == "s_finished":
            return f"{who}.request_finished({self.kid})"
        peer, kid, rnd, keys = g.lookups[0]
        if action[1] is None:
            return f"P serve window skips the lookup of {kid} r{rnd} (the round stopped looking)"
        what = ", ".join(f"{k.decode()} {_OUTCOMES[o]}" for k, o in zip(keys, action[1]))
        return f"P serve window: {kid} r{rnd} from {peer}: {what}"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s, kind = self.system, action[0]
        lane = decode_lane(0)
        phase, loads, pin = st.sym
        if kind == "window":
            self._window(st, g, action[1], rec)
            return
        if kind == "s_announce":
            st.sym = (1, loads, pin)
            inp: tuple = ("s_announce", self.kid)
        elif kind == "s_lookup":
            inp = ("s_lookup", self.kid, self.keys[action[1]])
        elif kind == "s_schedule_end":
            inp = ("s_schedule_end",)
        elif kind == "s_load":
            keys = self._hits(self._consumer(g))
            job = s.engines.sym_job(0, loads)
            st.sym = (phase, loads + 1, pin)
            st.outstanding = st.outstanding | {job}
            inp = ("s_load", self.kid, job, keys)
        else:
            st.sym = (2, loads, pin)
            inp = ("c_finished", self.kid)
        if rec is not None:
            rec.add("call", lane, s.lanes[0], self.label(g, action).split(".", 1)[1])
        s.step_consumer(st, 0, inp, rec)

    def _window(self, st: Draft, g: State, outcome: str | None, rec: Recorder | None) -> None:
        s = self.system
        peer, kid, rnd, keys = st.lookups[0]
        st.lookups = st.lookups[1:]
        if outcome is None:
            if rec is not None:
                rec.add("note", PRODUCER, PRODUCER, f"serve window skips the lookup of {kid} r{rnd}")
            return
        found = tuple(k for k, o in zip(keys, outcome) if o == "f")
        blocks = tuple(BLOCK_BASE + self.index[k] for k in found)
        phase, loads, pin = st.sym
        got = None
        if found:
            got = pin
            st.sym = (phase, loads, pin + 1)
            st.pins = tuple(sorted((*st.pins, (pin, kid, rnd, blocks))))
        pending = tuple(k for k, o in zip(keys, outcome) if o == "p")
        missing = tuple(k for k, o in zip(keys, outcome) if o == "m")
        if rec is not None:
            rec.add("result", PRODUCER, PRODUCER, f"lookup_result({kid} r{rnd}: found {[k.decode() for k in found]}"
                    f"{f' pin {got}' if got is not None else ''}, pending {[k.decode() for k in pending]}, "
                    f"missing {[k.decode() for k in missing]})")
        s.step_producer(st, ("lookup_answered", peer, kid, rnd, found, blocks, got, pending, missing), rec)

    # -- the producer's effects ----------------------------------------------------------------
    def after_step(self, step: CoreStep, c: int | None) -> Stage | None:
        """A producer step's lookups are queued for the next window; its pin releases return the
        pins to the engine (after the properties checked them: :mod:`.properties`)."""
        if c is not None or not ({LookUpBlocks, ReleasePins} & step.types):
            return None
        queued = tuple((e.peer, e.kv_request_id, e.round, e.keys) for e in step.effects if type(e) is LookUpBlocks)
        released = {p for e in step.effects if type(e) is ReleasePins for p in e.pins}

        def take(st: Draft, c: int | None, step: CoreStep) -> None:
            if queued:
                st.lookups = st.lookups + queued
            if released:
                st.pins = tuple(p for p in st.pins if p[0] not in released)

        return take

    # -- partial-order reduction (the profile runs without it: one pair) -----------------------
    def process_of(self, action: tuple) -> int | None:
        return 0

    def touches_producer(self, action: tuple) -> bool:
        return action[0] == "window"

    def project(self, g: State, i: int) -> tuple:
        return (g.pins, g.lookups, g.sym) if i == 0 else ()

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {
            "s_announce": lambda inp: Drive((ix.ProbeAnnounced(inp[1], "p"),)),
            "s_lookup": lambda inp: Drive((ix.KeyLookedUp(inp[1], inp[2]),)),
            "s_schedule_end": lambda inp: Drive((ix.ScheduleEnded(),)),
            "s_load": lambda inp: Drive((ix.LoadSubmitted(inp[1], inp[2], inp[3],
                                                          tuple(range(40, 40 + len(inp[3])))),)),
            "lookup_answered": lambda inp: Drive((ix.LookupAnswered(*inp[1:]),)),
        }
