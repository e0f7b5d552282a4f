"""The engines: what vLLM's prefill and decode instances (and their operators) do to the cores.

* The producer's (prefill) engine stores ``chunks`` one-key chunks per id; the last store is
  followed by ``request_finished`` (the prefill is over).  With ``abandon`` it may finish the
  request early, before every chunk is stored.  With ``lives > 1`` it may store an id again once
  the id's record was pruned (a client reusing the id: a new life).
* Each consumer's (decode) engine loads an id (``announce`` + ``submit_load``; the fetch names
  every key) and may finish a live load (``request_finished``: the consumer-side abort).  With
  ``lives > 1`` it may also finish a load that has its result and, once the record is gone, load
  the id again.  With the default ``routing="fixed"`` id i is loaded by consumer i (mod
  ``consumers``); ``routing="any"`` with ``loads_per_id=2`` lets two consumers race for one id.
* The operator: with ``drain`` it may call ``drain_jobs()`` on the producer once; with
  ``shutdown`` each manager may shut down: ``shutdown()`` begins (no new work), and the grace ends
  with ``close()`` — a completion step (time passes) — after which the manager's process is gone
  (:mod:`.network` drops messages to it) and its data plane closes (:mod:`.transport`: every
  release becomes a completion step because every session of the manager is dead).

State fields (:class:`~.state.State`): ``stores``, ``p_finished``, ``lives``, ``loads``,
``outstanding`` (jobs submitted without a result: an engine takes a result when a core reports
``JobDone``), ``drained``, ``shut``.

Job ids encode their owner: store job ``1000 + 100*life + 10*i + chunk`` (id i), load job
``2000 + 100*c + 10*i + n`` (consumer c, id i, its n-th load, from 0); so ids, consumers, chunks
and lives are at most 10 (:class:`~.bounds.Bounds` is checked by the CLI).

Which steps are *completion* steps (``full=False``, the liveness search): the producer's request
finishing and a shutdown's grace ending.  New work (stores, loads), the consumer giving up on its
own, drain and shutdown are not: an engine waits for its load, so a load that only ends when its
engine abandons it counts as stuck.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.modelcheck.part import CoreInput, Drive, Part, Stage
from tools.modelcheck.state import put
from tools.modelcheck.trace import PREFILL, PRODUCER, decode_lane
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import JobDone

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.system import System
    from tools.modelcheck.trace import Recorder

__all__ = ["Engines"]


SYM_LOADS = 1
"""loads a symmetric request's engine submits at most (job ids :meth:`Engines.sym_job`)"""

C_LOADING = frozenset({"queued", "in_flight", "aborting", "revoking"})
"""consumer states in which the decode engine may finish the request before the load's result"""


def load_count(v: int) -> tuple[int, bool]:
    """``(loads submitted, whether the latest one's request finished)`` of a ``State.loads`` entry."""
    return (v + 1) // 2, v > 0 and v % 2 == 0


class Engines(Part):
    """The prefill engine (producer side), the decode engines (one per consumer), the operator."""

    kinds = ("store", "abandon", "load", "c_finished", "drain", "shutdown", "close")

    def __init__(self, system: System) -> None:
        super().__init__(system)
        b = self.b
        self.owner_of: dict[int, tuple[int | None, int]] = {
            **{
                self.store_job(i, k, life): (None, i)
                for i in range(b.ids) for k in range(b.chunks) for life in range(b.lives)
            },
            **{self.load_job(c, i, n): (c, i) for c in range(b.consumers) for i in range(b.ids) for n in range(b.lives)},
            **({self.sym_job(0, n): (0, 0) for n in range(SYM_LOADS)} if b.symmetric else {}),
        }
        """job id -> (consumer index, or None for a store job; id index), for every job there can be"""
        self._jobs_of: dict[tuple[frozenset[int], int], tuple[int, ...]] = {}

    # -- jobs ----------------------------------------------------------------------------------
    @staticmethod
    def store_job(i: int, chunk: int, life: int = 0) -> int:
        return 1000 + 100 * life + 10 * i + chunk

    @staticmethod
    def load_job(c: int, i: int, n: int = 0) -> int:
        return 2000 + 100 * c + 10 * i + n

    @staticmethod
    def sym_job(c: int, n: int) -> int:
        """The n-th load of consumer ``c``'s symmetric request (:mod:`.symmetric`)."""
        return 3000 + 100 * c + n

    def engine_lane(self, job: int) -> str:
        """The trace lane of the engine that submitted ``job``."""
        c = self.owner_of[job][0]
        return PREFILL if c is None else decode_lane(c)

    def describe_job(self, job: int) -> str:
        s = self.system
        if job < 2000:
            life, rest = divmod(job - 1000, 100)
            i, k = divmod(rest, 10)
            return f"store job {job} ({s.kids[i]}{f' life {life + 1}' if life else ''} chunk {k})"
        if job >= 3000:
            c, n = divmod(job - 3000, 100)
            return f"load job {job} ({s.cnames[c]} symmetric {s.kids[0]}{f' load {n + 1}' if n else ''})"
        c, rest = divmod(job - 2000, 100)
        i, n = divmod(rest, 10)
        return f"load job {job} ({s.cnames[c]} {s.kids[i]}{f' load {n + 1}' if n else ''})"

    def after_step(self, step: CoreStep, c: int | None) -> Stage | None:
        """The engines take the job results a core step reports."""
        done = frozenset(eff.job_id for eff in step.effects if isinstance(eff, JobDone))
        if not done:
            return None

        def take_results(st: Draft, c: int | None, step: CoreStep) -> None:
            st.outstanding = st.outstanding - done

        return take_results

    # -- actions -------------------------------------------------------------------------------
    def _new_life(self, g: State, i: int) -> bool:
        """Whether the prefill engine may store id ``i`` again: its last request finished, the
        producer pruned the id's record, and the bounds allow another life."""
        b = self.b
        return (
            g.p_finished[i]
            and g.lives[i] + 1 < b.lives
            and self.system.kids[i] not in self.system.cores.summaries[g.p].producer
        )

    def producer_actions(self, g: State, full: bool) -> list[tuple]:
        """The prefill engine stores the next chunk of an id (or the first of its next life), or
        finishes its request early."""
        b = self.b
        out: list[tuple] = []
        if g.shut[0] or b.symmetric:  # the symmetric path's engines are .symmetric's
            return out
        for i in range(b.ids):
            if not g.p_finished[i]:
                if full and g.stores[i] < b.chunks:
                    out.append(("store", i))
                if b.abandon and g.stores[i] < b.chunks:
                    out.append(("abandon", i))
            elif full and b.lives > 1 and self._new_life(g, i):
                out.append(("store", i))
        return out

    def consumer_actions(self, g: State, full: bool) -> list[tuple]:
        """A decode engine loads an id routed to it (again, after its earlier load ended, while
        lives last), or finishes a live load (new work only)."""
        out: list[tuple] = []
        if not full or self.b.symmetric:
            return out
        b = self.b
        summaries = self.system.cores.summaries
        for c in range(b.consumers):
            if g.shut[1 + c]:
                continue
            consumer = summaries[g.c[c]].consumer
            for i, kid in enumerate(self.system.kids):
                n, finished = load_count(g.loads[c][i])
                if (
                    (n == 0 or (finished and n < b.lives and kid not in consumer))
                    and (b.routing == "any" or i % b.consumers == c)
                    and 1 + sum(1 for cc in range(b.consumers) if cc != c and g.loads[cc][i]) <= b.loads_per_id
                ):
                    out.append(("load", c, i))
                if n and not finished:
                    state = consumer.get(kid, ("absent",))[0]
                    if state in C_LOADING or (n < b.lives and state in ("loaded", "failed")):
                        out.append(("c_finished", c, i))
        return out

    def operator_actions(self, g: State, full: bool) -> list[tuple]:
        """``drain_jobs()`` of the producer once; each manager's ``shutdown()`` once, then its
        ``close()`` (the grace is over: a completion step)."""
        b = self.b
        out: list[tuple] = []
        if full and b.drain and not g.drained and not g.shut[0]:
            out.append(("drain",))
        if b.shutdown:
            for m, phase in enumerate(g.shut):
                if phase == 0 and full:
                    out.append(("shutdown", m))
                elif phase == 1:
                    out.append(("close", m))
        return out

    def _who(self, m: int) -> str:
        return "P" if m == 0 else self.system.cnames[m - 1]

    def label(self, g: State, action: tuple) -> str:
        s = self.system
        kind = action[0]
        if kind == "store":
            i = action[1]
            new = g.p_finished[i]
            chunk = 0 if new else g.stores[i]
            last = chunk + 1 == self.b.chunks
            life = f" life {g.lives[i] + 2}" if new else ""
            return f"P.store({s.kids[i]}{life} chunk {chunk})" + (" + P.request_finished" if last else "")
        if kind == "abandon":
            i = action[1]
            return f"P.request_finished({s.kids[i]}) after {g.stores[i]} of {self.b.chunks} chunks stored"
        if kind == "load":
            n, _ = load_count(g.loads[action[1]][action[2]])
            return f"{s.cnames[action[1]]}.load({s.kids[action[2]]})" + (f" again (load {n + 1})" if n else "")
        if kind == "c_finished":
            return f"{s.cnames[action[1]]}.request_finished({s.kids[action[2]]})"
        if kind == "drain":
            return "P.drain_jobs()"
        who = self._who(action[1])
        return f"{who}.shutdown()" if kind == "shutdown" else f"{who}.close() (shutdown grace over)"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s = self.system
        kind = action[0]
        if kind == "store":
            i = action[1]
            if g.p_finished[i]:  # a new life of a pruned id
                st.lives = put(st.lives, i, st.lives[i] + 1)
                st.stores = put(st.stores, i, 0)
                st.p_finished = put(st.p_finished, i, False)
            chunk = st.stores[i]
            job = self.store_job(i, chunk, st.lives[i])
            st.stores = put(st.stores, i, chunk + 1)
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
            n, _ = load_count(g.loads[c][i])
            job = self.load_job(c, i, n)
            st.loads = put(st.loads, c, put(st.loads[c], i, 2 * n + 1))
            st.outstanding = st.outstanding | {job}
            if rec is not None:
                rec.add("call", decode_lane(c), s.lanes[c], f"load({s.kids[i]})")
            s.step_consumer(st, c, ("load", s.kids[i], self.b.chunks, job, "p"), rec)
        elif kind == "c_finished":
            _, c, i = action
            st.loads = put(st.loads, c, put(st.loads[c], i, st.loads[c][i] + 1))
            if rec is not None:
                rec.add("call", decode_lane(c), s.lanes[c], f"request_finished({s.kids[i]})")
            s.step_consumer(st, c, ("c_finished", s.kids[i]), rec)
        elif kind == "drain":
            st.drained = True
            if rec is not None:
                rec.add("call", PREFILL, PRODUCER, "drain_jobs()")
            s.step_producer(st, ("drain",), rec)
        else:  # shutdown, close
            m = action[1]
            st.shut = put(st.shut, m, 1 if kind == "shutdown" else 2)
            call = "shutdown()" if kind == "shutdown" else "close()"
            if m == 0:
                if rec is not None:
                    rec.add("call", PREFILL, PRODUCER, call)
                s.step_producer(st, (kind,), rec)
            else:
                if rec is not None:
                    rec.add("call", decode_lane(m - 1), s.lanes[m - 1], call)
                s.step_consumer(st, m - 1, (kind,), rec)

    # -- partial-order reduction ---------------------------------------------------------------
    def process_of(self, action: tuple) -> int | None:
        kind = action[0]
        if kind in ("store", "abandon"):
            return action[1]
        if kind in ("load", "c_finished"):
            return action[2]
        if kind in ("shutdown", "close") and action[1] > 0:
            return action[1] - 1  # a consumer's shutdown touches only its own pair (fixed routing)
        return None  # drain, the producer's shutdown: every id

    def touches_producer(self, action: tuple) -> bool:
        return action[0] in ("store", "abandon") or (action[0] in ("shutdown", "close") and action[1] == 0)

    def project(self, g: State, i: int) -> tuple:
        key = (g.outstanding, i)
        jobs = self._jobs_of.get(key)
        if jobs is None:  # few distinct sets of outstanding jobs: each one's split by id is cached
            jobs = self._jobs_of[key] = tuple(sorted(j for j in g.outstanding if self.owner_of[j][1] == i))
        return (
            jobs,
            g.stores[i],
            g.p_finished[i],
            g.lives[i],
            g.loads[i],
            g.shut[1 + i],
        )

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {
            "store": _store,
            "load": _load,
            "p_finished": lambda inp: Drive((ix.RequestFinished(inp[1], producer=True),)),
            "c_finished": lambda inp: Drive((ix.RequestFinished(inp[1], producer=False),)),
            "drain": lambda inp: Drive((ix.DrainStarted(),)),
            "shutdown": lambda inp: Drive((ix.ShutdownStarted(),)),
            "close": lambda inp: Drive((ix.GraceEnded(),)),
        }


def _store(inp: tuple) -> Drive:
    """("store", kid, chunk, job): one one-key chunk (key ``b"<kid>.<chunk>"``, block ``job % 1000``)."""
    _, kid, chunk, job = inp
    key = f"{kid}.{chunk}".encode()
    return Drive((ix.StoreSubmitted(kid, f"req-{kid}", job, (key,), (job % 1000,)),))


def _load(inp: tuple) -> Drive:
    """("load", kid, chunks, job, producer): announce the id, then submit a load of every key."""
    _, kid, chunks, job, producer = inp
    keys = tuple(f"{kid}.{k}".encode() for k in range(chunks))
    return Drive((ix.LoadAnnounced(kid, producer),
                  ix.LoadSubmitted(kid, job, keys, tuple(range(job % 1000, job % 1000 + chunks)))))
