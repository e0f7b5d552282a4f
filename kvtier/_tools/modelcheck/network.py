"""The network: control channels, message faults and session deaths.

* **Channels**: one FIFO per direction per consumer (zmq keeps per-connection order): channel
  ``2*c`` carries producer -> consumer c, ``2*c+1`` consumer c -> producer.  A core step's
  messages (the effects ``to_envelope`` turns into messages, ``block_data`` included) are appended
  to the channel of their destination.  Delivering takes the oldest message (``reorder``: any
  message) and feeds it to the receiving core, whose session gate drops messages of an old
  generation.
* **Faults**: ``faults`` messages may be lost or duplicated per consumer connection
  (``fault_scope="total"``: in all), any message of any channel.
* **Crashes**: ``crashes`` session deaths: both sides see ``disconnect`` (one action), or one side's
  liveness deadline fires (a :mod:`.clock` step that spends the same budget).  A later announce
  reconnects with a new generation.
* **Connections** come up at once: an ``OpenConnection`` effect is answered by ``transport_up`` in
  the same core step (:meth:`Network.connected`), and each consumer is connected to the producer
  by a hello / hello_ack handshake before the search starts (:meth:`Network.handshake`).

State fields (:class:`~.state.State`): ``chans``, ``faults``, ``crashes``.

Deliveries are completion steps; faults and crashes are not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier._tools.modelcheck.clock import NOW
from kvtier._tools.modelcheck.part import CoreInput, Part, Stage
from kvtier._tools.modelcheck.state import put
from kvtier._tools.modelcheck.trace import NETWORK, PRODUCER
from kvtier.lifecycle._table import SessionEvent
from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.effects import OpenConnection
from kvtier.testing.fakenet import FakeNetwork

if TYPE_CHECKING:
    from kvtier._tools.modelcheck.encoding import CoreStep, Summary
    from kvtier._tools.modelcheck.state import Draft, State
    from kvtier._tools.modelcheck.trace import Recorder

__all__ = ["Network"]


class Network(Part):
    """Channels, faults, crashes and connection set-up."""

    kinds = ("deliver", "drop", "dup", "crash")

    # -- channels ------------------------------------------------------------------------------
    @staticmethod
    def to_consumer(c: int) -> int:
        """The channel producer -> consumer ``c``."""
        return 2 * c

    @staticmethod
    def to_producer(c: int) -> int:
        """The channel consumer ``c`` -> producer."""
        return 2 * c + 1

    def budget_of(self, ch: int) -> int:
        """The fault budget channel ``ch`` spends from."""
        return ch // 2 if self.b.fault_scope == "per_peer" else 0

    def after_step(self, step: CoreStep, c: int | None) -> Stage | None:
        """The messages of a core step go onto the channels of their destinations (the producer's to
        its consumers' channels, a consumer's to its channel to the producer), in order."""
        s = self.system
        msgs = s.cores.msgs
        if c is None:
            sends = tuple((2 * s.cindex[msgs[m].dst], m) for m in step.envelopes if msgs[m].dst in s.cindex)
        else:
            sends = tuple((2 * c + 1, m) for m in step.envelopes if msgs[m].dst == "p")
        if not sends:
            return None

        def send(st: Draft, c: int | None, step: CoreStep) -> None:
            for ch, m in sends:
                st.chan(ch).append(m)

        return send

    # -- sessions ------------------------------------------------------------------------------
    def handshake(self, p: int, c: int, name: str) -> tuple[int, int]:
        """Connect consumer ``name`` (snapshot ``c``) to the producer (snapshot ``p``): dial, hello,
        hello_ack.  Returns the new (producer, consumer) snapshots."""
        cores = self.system.cores
        st = cores.step(name, c, ("dial", "p"))
        hello = next(m for m in st.envelopes if cores.msgs[m].kind == "hello")
        pst = cores.step("p", p, ("deliver", hello))
        ack = next(m for m in pst.envelopes if cores.msgs[m].kind == "hello_ack")
        cst = cores.step(name, st.snap, ("deliver", ack))
        return pst.snap, cst.snap

    @staticmethod
    def connected(core: TierCore, effects: list) -> list:
        """The effects of connections coming up at once (``transport_up`` per ``OpenConnection``)."""
        more: list = []
        for eff in effects:
            if isinstance(eff, OpenConnection):
                more.extend(core.transport_up(eff.peer, NOW))
        return more

    def liveness_may_fire(self, g: State, full: bool) -> bool:
        """A session's liveness deadline is a crash: only outside completion, while crashes are left."""
        return full and g.crashes > 0

    def on_session_deadline(self, st: Draft, summary: Summary, peer: str) -> None:
        """A session deadline fires in a core (``summary``): a ready session dying spends a crash."""
        if summary.sessions[peer][0] == "ready":
            st.crashes -= 1

    # -- actions -------------------------------------------------------------------------------
    def deliveries(self, g: State) -> list[tuple]:
        """``("deliver", channel, index)``: the oldest message of each channel (``reorder``: any)."""
        if self.b.reorder:
            return [("deliver", ch, j) for ch, q in enumerate(g.chans) for j in range(len(q))]
        return [("deliver", ch, 0) for ch, q in enumerate(g.chans) if q]

    def faults(self, g: State) -> list[tuple]:
        """``("drop" | "dup", channel, index)`` for every queued message, while the budget lasts."""
        out: list[tuple] = []
        if any(g.faults):
            for ch, q in enumerate(g.chans):
                if not g.faults[self.budget_of(ch)]:
                    continue
                for j in range(len(q)):
                    out.append(("drop", ch, j))
                    out.append(("dup", ch, j))
        return out

    def crashes(self, g: State) -> list[tuple]:
        """``("crash", c)``: the session producer <-> consumer c dies (both sides ready)."""
        out: list[tuple] = []
        if g.crashes > 0:
            s = self.system
            summaries = s.cores.summaries
            ps = summaries[g.p]
            for c, cname in enumerate(s.cnames):
                csess = summaries[g.c[c]].sessions.get("p")
                psess = ps.sessions.get(cname)
                if csess and psess and csess[0] == "ready" and psess[0] == "ready":
                    out.append(("crash", c))
        return out

    def _ends(self, ch: int) -> tuple[str, str]:
        lane = self.system.lanes[ch // 2]
        return (PRODUCER, lane) if ch % 2 == 0 else (lane, PRODUCER)

    def label(self, g: State, action: tuple) -> str:
        kind = action[0]
        if kind == "crash":
            return f"session p<->{self.system.cnames[action[1]]} dies (both sides get disconnect)"
        env = self.system.cores.msgs[g.chans[action[1]][action[2]]]
        return {"deliver": "deliver", "drop": "LOSE", "dup": "DUPLICATE"}[kind] + f" {env}"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s = self.system
        kind = action[0]
        if kind == "crash":
            c = action[1]
            st.crashes -= 1
            cname = s.cnames[c]
            pgen = s.cores.summaries[st.p].sessions[cname][1]
            cgen = s.cores.summaries[st.c[c]].sessions["p"][1]
            if rec is not None:
                rec.add("note", NETWORK, NETWORK, f"session p<->{cname} dies")
            s.step_producer(st, ("disconnect", cname, pgen), rec)
            s.step_consumer(st, c, ("disconnect", "p", cgen), rec)
            return
        _, ch, j = action
        q = st.chan(ch)
        env = q[j]
        if rec is not None:
            text = str(s.cores.msgs[env]).split(" ", 1)[1]  # without "src->dst": the lanes say it
            src, dst = self._ends(ch)
            if kind == "deliver":
                rec.add("msg", src, dst, text)
            elif kind == "drop":
                rec.add("msg", src, NETWORK, f"lost: {text}")
            else:
                rec.add("note", NETWORK, NETWORK, f"duplicated: {text}")
        if kind == "drop":
            del q[j]
            st.faults = put(st.faults, self.budget_of(ch), st.faults[self.budget_of(ch)] - 1)
        elif kind == "dup":
            q.append(env)
            st.faults = put(st.faults, self.budget_of(ch), st.faults[self.budget_of(ch)] - 1)
        else:
            del q[j]
            c = ch // 2
            if ch % 2 == 0:
                s.step_consumer(st, c, ("deliver", env), rec)
            else:
                s.step_producer(st, ("deliver", env), rec)

    # -- partial-order reduction ---------------------------------------------------------------
    def process_of(self, action: tuple) -> int | None:
        return action[1] if action[0] == "crash" else action[1] // 2

    def touches_producer(self, action: tuple) -> bool:
        return action[0] == "crash" or action[1] % 2 == 1

    def shares_budget(self, g: State, action: tuple) -> bool:
        kind = action[0]
        return kind == "crash" or (kind in ("drop", "dup") and self.b.fault_scope != "per_peer")

    def project(self, g: State, i: int) -> tuple:
        return (
            g.chans[2 * i],
            g.chans[2 * i + 1],
            g.faults[i] if self.b.fault_scope == "per_peer" else None,
        )

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {
            "deliver": lambda core, inp: FakeNetwork.dispatch(core, inp[1], NOW),
            "disconnect": lambda core, inp: core.disconnect(inp[1], inp[2], NOW),
            "dial": _dial,
        }


def _dial(core: TierCore, inp: tuple) -> list:
    """("dial", peer): open a session to ``peer`` (the consumer side of a connection)."""
    out: list = []
    core.sessions.apply(core.sessions.new_record(inp[1]), SessionEvent.DIAL, None, NOW, out)
    return out
