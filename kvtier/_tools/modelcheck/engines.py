"""The engines: what vLLM's prefill and decode instances do to the cores.

* The producer's (prefill) engine stores ``chunks`` one-key chunks per id; the last store is
  followed by ``request_finished`` (the prefill is over).  With ``abandon`` it may finish the
  request early, before every chunk is stored.  With ``drain`` / ``shutdown`` an operator may
  call ``drain_jobs()`` / ``shutdown()`` once.
* Each consumer's (decode) engine loads an id (``announce`` + ``submit_load``; the fetch names
  every key) and may finish a live load (``request_finished``: the consumer-side abort).  With the
  default ``routing="fixed"`` id i is loaded by consumer i (mod ``consumers``); ``routing="any"``
  with ``loads_per_id=2`` lets two consumers race for one id.

State fields (:class:`~.state.State`): ``stores``, ``p_finished``, ``loads``, ``outstanding`` (jobs
submitted without a result: an engine takes a result when a core reports ``JobDone``), ``drained``,
``shut``.

Job ids encode their owner: store job ``1000 + 10*i + chunk`` (id i), load job
``2000 + 100*c + 10*i`` (consumer c, id i).

Which steps are *completion* steps (``full=False``, the liveness search): only the producer's
request finishing.  New work (stores, loads), the consumer giving up on its own, drain and
shutdown are not: an engine waits for its load, so a load that only ends when its engine abandons
it counts as stuck.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier._tools.modelcheck.clock import NOW
from kvtier._tools.modelcheck.part import CoreInput, Part, Stage
from kvtier._tools.modelcheck.state import put
from kvtier._tools.modelcheck.trace import PREFILL, PRODUCER, decode_lane
from kvtier.lifecycle.consumer import LoadInput
from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.effects import JobDone
from kvtier.lifecycle.producer import StoreInput

if TYPE_CHECKING:
    from kvtier._tools.modelcheck.encoding import CoreStep
    from kvtier._tools.modelcheck.state import Draft, State
    from kvtier._tools.modelcheck.system import System
    from kvtier._tools.modelcheck.trace import Recorder

__all__ = ["Engines"]


class Engines(Part):
    """The prefill engine (producer side), the decode engines (one per consumer), the operator."""

    kinds = ("store", "abandon", "load", "c_finished", "drain", "shutdown")

    def __init__(self, system: System) -> None:
        super().__init__(system)
        b = self.b
        self.owner_of: dict[int, tuple[int | None, int]] = {
            **{self.store_job(i, k): (None, i) for i in range(b.ids) for k in range(b.chunks)},
            **{self.load_job(c, i): (c, i) for c in range(b.consumers) for i in range(b.ids)},
        }
        """job id -> (consumer index, or None for a store job; id index), for every job there can be"""

    # -- jobs ----------------------------------------------------------------------------------
    @staticmethod
    def store_job(i: int, chunk: int) -> int:
        return 1000 + 10 * i + chunk

    @staticmethod
    def load_job(c: int, i: int) -> int:
        return 2000 + 100 * c + 10 * i

    def engine_lane(self, job: int) -> str:
        """The trace lane of the engine that submitted ``job``."""
        c = self.owner_of[job][0]
        return PREFILL if c is None else decode_lane(c)

    def describe_job(self, job: int) -> str:
        s = self.system
        if job < 2000:
            i, k = divmod(job - 1000, 10)
            return f"store job {job} ({s.kids[i]} chunk {k})"
        c, rest = divmod(job - 2000, 100)
        return f"load job {job} ({s.cnames[c]} {s.kids[rest // 10]})"

    def after_step(self, step: CoreStep, c: int | None) -> Stage | None:
        """The engines take the job results a core step reports."""
        done = frozenset(eff.job_id for eff in step.effects if isinstance(eff, JobDone))
        if not done:
            return None

        def take_results(st: Draft, c: int | None, step: CoreStep) -> None:
            st.outstanding = st.outstanding - done

        return take_results

    # -- actions -------------------------------------------------------------------------------
    def producer_actions(self, g: State, full: bool) -> list[tuple]:
        """The prefill engine stores the next chunk of an id, or finishes its request early."""
        b = self.b
        out: list[tuple] = []
        if not g.shut:
            for i in range(b.ids):
                if not g.p_finished[i]:
                    if full and g.stores[i] < b.chunks:
                        out.append(("store", i))
                    if b.abandon and g.stores[i] < b.chunks:
                        out.append(("abandon", i))
        return out

    def consumer_actions(self, g: State, full: bool) -> list[tuple]:
        """A decode engine loads an id routed to it, or finishes a live load (new work only)."""
        out: list[tuple] = []
        if not full:
            return out
        b = self.b
        summaries = self.system.cores.summaries
        for c in range(b.consumers):
            consumer = summaries[g.c[c]].consumer
            for i, kid in enumerate(self.system.kids):
                st = g.loads[c][i]
                if (
                    st == 0
                    and (b.routing == "any" or i % b.consumers == c)
                    and sum(1 for cc in range(b.consumers) if g.loads[cc][i]) < b.loads_per_id
                ):
                    out.append(("load", c, i))
                if st == 1 and consumer.get(kid, ("absent",))[0] in ("queued", "in_flight", "aborting"):
                    out.append(("c_finished", c, i))
        return out

    def operator_actions(self, g: State) -> list[tuple]:
        """``drain_jobs()`` then ``shutdown()`` of the producer, once each, when the bounds allow."""
        b = self.b
        out: list[tuple] = []
        if b.drain and not g.drained and not g.shut:
            out.append(("drain",))
        if b.shutdown and not g.shut:
            out.append(("shutdown",))
        return out

    def label(self, g: State, action: tuple) -> str:
        s = self.system
        kind = action[0]
        if kind == "store":
            i = action[1]
            last = g.stores[i] + 1 == self.b.chunks
            return f"P.store({s.kids[i]} chunk {g.stores[i]})" + (" + P.request_finished" if last else "")
        if kind == "abandon":
            i = action[1]
            return f"P.request_finished({s.kids[i]}) after {g.stores[i]} of {self.b.chunks} chunks stored"
        if kind == "load":
            return f"{s.cnames[action[1]]}.load({s.kids[action[2]]})"
        if kind == "c_finished":
            return f"{s.cnames[action[1]]}.request_finished({s.kids[action[2]]})"
        if kind == "drain":
            return "P.drain_jobs()"
        return "P.shutdown()"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s = self.system
        kind = action[0]
        if kind == "store":
            i = action[1]
            chunk = g.stores[i]
            job = self.store_job(i, chunk)
            st.stores = put(st.stores, i, st.stores[i] + 1)
            st.outstanding = st.outstanding | {job}
            if rec is not None:
                rec.add("call", PREFILL, PRODUCER, f"store({s.kids[i]} chunk {chunk})")
            s.step_producer(st, ("store", s.kids[i], chunk, job), rec)
            if st.stores[i] == self.b.chunks:  # the prefill is over once its last chunk is stored
                st.p_finished = put(st.p_finished, i, True)
                if rec is not None:
                    rec.add("call", PREFILL, PRODUCER, f"request_finished({s.kids[i]})")
                s.step_producer(st, ("p_finished", s.kids[i]), rec)
        elif kind == "abandon":
            i = action[1]
            st.p_finished = put(st.p_finished, i, True)
            if rec is not None:
                rec.add("call", PREFILL, PRODUCER, f"request_finished({s.kids[i]}) after {g.stores[i]} chunks")
            s.step_producer(st, ("p_finished", s.kids[i]), rec)
        elif kind == "load":
            _, c, i = action
            job = self.load_job(c, i)
            st.loads = put(st.loads, c, put(st.loads[c], i, 1))
            st.outstanding = st.outstanding | {job}
            if rec is not None:
                rec.add("call", decode_lane(c), s.lanes[c], f"load({s.kids[i]})")
            s.step_consumer(st, c, ("load", s.kids[i], self.b.chunks, job, "p"), rec)
        elif kind == "c_finished":
            _, c, i = action
            st.loads = put(st.loads, c, put(st.loads[c], i, 2))
            if rec is not None:
                rec.add("call", decode_lane(c), s.lanes[c], f"request_finished({s.kids[i]})")
            s.step_consumer(st, c, ("c_finished", s.kids[i]), rec)
        elif kind == "drain":
            st.drained = True
            if rec is not None:
                rec.add("call", PREFILL, PRODUCER, "drain_jobs()")
            s.step_producer(st, ("drain",), rec)
        else:  # shutdown
            st.shut = True
            if rec is not None:
                rec.add("call", PREFILL, PRODUCER, "shutdown()")
            s.step_producer(st, ("shutdown",), rec)

    # -- partial-order reduction ---------------------------------------------------------------
    def process_of(self, action: tuple) -> int | None:
        kind = action[0]
        if kind in ("store", "abandon"):
            return action[1]
        if kind in ("load", "c_finished"):
            return action[2]
        return None  # drain, shutdown: every id

    def touches_producer(self, action: tuple) -> bool:
        return action[0] in ("store", "abandon")

    def project(self, g: State, i: int) -> tuple:
        return (
            tuple(sorted(j for j in g.outstanding if self.owner_of[j][1] == i)),
            g.stores[i],
            g.p_finished[i],
            g.loads[i],
        )

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {
            "store": _store,
            "load": _load,
            "p_finished": lambda core, inp: core.producer_finished(inp[1], NOW),
            "c_finished": lambda core, inp: core.consumer_finished(inp[1], NOW),
            "drain": lambda core, inp: core.drain(NOW),
            "shutdown": lambda core, inp: core.shutdown(NOW),
        }


def _store(core: TierCore, inp: tuple) -> list:
    """("store", kid, chunk, job): one one-key chunk (key ``b"<kid>.<chunk>"``, block ``job % 1000``)."""
    _, kid, chunk, job = inp
    key = f"{kid}.{chunk}".encode()
    return core.store(StoreInput(kid, f"req-{kid}", job, (key,), (job % 1000,)), NOW)


def _load(core: TierCore, inp: tuple) -> list:
    """("load", kid, chunks, job, producer): announce the id, then submit a load of every key."""
    _, kid, chunks, job, producer = inp
    keys = tuple(f"{kid}.{k}".encode() for k in range(chunks))
    out = core.announce(kid, producer, NOW)
    out += core.submit_load(LoadInput(kid, job, keys, tuple(range(job % 1000, job % 1000 + chunks))), NOW)
    return out
