"""The network: control channels, receive batching, message faults and session deaths.

* **Channels**: one FIFO per direction per consumer (zmq keeps per-connection order): channel
  ``2*c`` carries producer -> consumer c, ``2*c+1`` consumer c -> producer.  A core step's
  messages (the effects ``to_envelope`` turns into messages, ``block_data`` included) are appended
  to the channel of their destination.
* **Receive batching** (``batching``, on by default): the oldest message of a channel may first
  *arrive* in the receiver's socket and wait there unread (``arrive``; ``arrived[ch]`` says it
  did) until a ``deliver`` reads it and feeds it to the receiving core, whose session gate drops
  messages of an old generation.  A message may also be read the moment it arrives (``deliver``
  of a message still in the network).  What the socket is for: the shell's tick
  (:func:`kvtier.lifecycle.driver.drive`) reads what waits in its sockets before it fires the
  deadlines due when they were last seen empty, so when a deadline falls due (:mod:`.clock`) the
  unread messages that concern it are the tick's input (``input_before_deadline``).  Two simplifications keep the state space small, and lose nothing:
  at most one message per channel waits unread (more would only block more deadlines), and a
  message arrives early only if it concerns a deadline the receiver could fire now (an arrival
  that blocks nothing is the same as reading it at once).  ``reorder``: any in-network message
  may arrive (it goes first) or, with nothing waiting, be read.
* **Faults** (``faults`` per consumer connection; ``fault_scope="total"``: in all): any message
  still in the network may be lost or duplicated (``drop`` / ``dup``), and a ``block_data`` the
  receiver is about to read may land corrupt (``corrupt``, with ``corruption``: the consumer's
  shell finds a digest mismatch; the round is remembered in ``corrupted`` for
  ``no_success_without_receipt``).
* **Crashes** (``crashes`` session deaths): both sides see ``disconnect`` (``crash``), or both
  sides' transports see the connection close (``cut``: ``connection_closed``), or one side's
  heartbeat finds the peer silent (a :mod:`.clock` step that spends the same budget).  A later
  announce reconnects with a new generation.
* **Heartbeats** (``pings``): the dialled side's heartbeat sends a ``ping``, the peer answers
  ``pong`` (or ``disconnect``, if it has no session with us); one at a time, and none while a
  goodbye is in flight (:meth:`Network.pinging`).
* **Connections** come up at once: an ``OpenConnection`` effect is answered by ``ConnectionUp`` in
  the same core step (:meth:`Network.answers`).  Each consumer is connected to the producer by a
  hello / hello_ack handshake before the search starts (:meth:`Network.handshake`), unless the
  bounds explore the handshake (``connected=False``: the first load dials).
* **A closed manager** (``shutdown``: its ``close()`` ran) is a process that exited: a message
  read for it is dropped.

State fields (:class:`~.state.State`): ``chans``, ``arrived``, ``faults``, ``crashes``,
``corrupted``.

Arrivals and deliveries are completion steps; faults and crashes are not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.modelcheck.part import Answer, CoreInput, Drive, Part, Stage
from tools.modelcheck.state import put
from tools.modelcheck.trace import NETWORK, PRODUCER
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import OpenConnection
from kvtier.wire import messages as wm

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep, Summary
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.trace import Recorder

__all__ = ["Network"]


class Network(Part):
    """Channels, receive batching, faults, crashes and connection set-up."""

    kinds = ("deliver", "arrive", "drop", "dup", "corrupt", "crash", "cut")

    # -- channels ------------------------------------------------------------------------------
    @staticmethod
    def to_consumer(c: int) -> int:
        """The channel producer -> consumer ``c``."""
        return 2 * c

    @staticmethod
    def to_producer(c: int) -> int:
        """The channel consumer ``c`` -> producer."""
        return 2 * c + 1

    def unread_for(self, g: State | Draft, c: int | None, key: str) -> list[tuple[int, int]]:
        """``(channel, message id)`` of every message waiting unread in the sockets of the
        producer (``c`` None) or consumer ``c`` that concerns the deadline of record ``key``: it
        names the id, or comes from the session's peer.  Empty when the receiver has closed
        (what it had unread is lost with it)."""
        arrived = g.arrived
        chans = range(1, len(arrived), 2) if c is None else (2 * c,)
        out = []
        msgs = self.system.cores.msgs
        for ch in chans:
            if arrived[ch] and not self._closed(g, ch):
                m = g.chans[ch][0]
                env = msgs[m]
                if env.src == key or env.kv_request_id == key:
                    out.append((ch, m))
        return out

    def read_unread(self, st: Draft, c: int | None, unread: list[tuple[int, int]], rec: Recorder | None) -> None:
        """The tick reads ``unread`` (from :meth:`unread_for`): out of the sockets."""
        for ch, m in unread:
            del st.chan(ch)[0]
            st.arrived = put(st.arrived, ch, 0)
            if rec is not None:
                src, dst = self._ends(ch)
                rec.add("msg", src, dst, str(self.system.cores.msgs[m]).split(" ", 1)[1])

    def pinging(self, g: State, c: int) -> bool:
        """Whether a ping of consumer ``c``'s session, or the answer to one (a pong; a producer
        without the session answers ``disconnect``), or a goodbye is in flight: then its heartbeat
        does not ping again (one ping at a time, and none once the session is ending — a bound
        of the model, or a consumer the producer forgot would ping an unbounded queue of
        goodbyes)."""
        msgs = self.system.cores.msgs
        return any(msgs[m].kind in ("ping", "pong", "disconnect") for ch in (2 * c, 2 * c + 1) for m in g.chans[ch])

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

    def answers(self) -> dict[type, Answer]:
        """The transport's synchronous answer: a connection opened comes up at once."""
        return {OpenConnection: lambda eff, inp: ix.ConnectionUp(eff.peer)}

    def silence_may_end(self, g: State | Draft, full: bool) -> bool:
        """A heartbeat that finds its peer silent is a crash: only outside completion, while
        crashes are left."""
        return full and g.crashes > 0

    def on_silence(self, st: Draft, summary: Summary, peer: str) -> None:
        """A heartbeat finds ``peer`` silent in a core (``summary``): the ready session dying
        spends a crash."""
        if summary.sessions[peer][0] == "ready":
            st.crashes -= 1

    # -- actions -------------------------------------------------------------------------------
    def deliveries(self, g: State) -> list[tuple]:
        """``("deliver", channel, index)``: read the oldest message of each channel — the one waiting
        in the socket, if any, else the oldest in the network (``reorder``: any of them)."""
        if self.b.reorder:
            return [
                ("deliver", ch, j)
                for ch, q in enumerate(g.chans)
                for j in (range(1) if g.arrived[ch] else range(len(q)))
            ]
        return [("deliver", ch, 0) for ch, q in enumerate(g.chans) if q]

    def arrivals(self, g: State) -> list[tuple]:
        """``("arrive", channel, index)``: with ``batching``, the oldest in-network message of a
        channel whose socket holds none (``reorder``: any) arrives and waits unread — if it
        concerns a deadline the receiver could fire now (:meth:`.clock.Clock.firable`)."""
        if not self.b.batching:
            return []
        out: list[tuple] = []
        clock, msgs = self.system.clock, self.system.cores.msgs
        for ch, q in enumerate(g.chans):
            if g.arrived[ch] or not q:
                continue
            c = ch // 2
            firable = clock.firable(g, None if ch % 2 else c)
            if not firable:
                continue
            for j in range(len(q)) if self.b.reorder else (0,):
                env = msgs[q[j]]
                if env.src in firable or env.kv_request_id in firable:
                    out.append(("arrive", ch, j))
        return out

    def faults(self, g: State) -> list[tuple]:
        """``("drop" | "dup", channel, index)`` for every message still in the network, then
        ``("corrupt", channel, index)`` for every ``block_data`` a delivery may read next, while
        the budget lasts."""
        out: list[tuple] = []
        if not any(g.faults):
            return out
        msgs = self.system.cores.msgs
        for ch, q in enumerate(g.chans):
            if not g.faults[self.budget_of(ch)]:
                continue
            for j in range(g.arrived[ch], len(q)):
                out.append(("drop", ch, j))
                out.append(("dup", ch, j))
        if self.b.corruption:
            for _, ch, j in self.deliveries(g):
                if (
                    ch % 2 == 0
                    and g.faults[self.budget_of(ch)]
                    and msgs[g.chans[ch][j]].kind == "block_data"
                    and not self._closed(g, ch)
                ):
                    out.append(("corrupt", ch, j))
        return out

    def crashes(self, g: State) -> list[tuple]:
        """``("crash", c)`` / ``("cut", c)``: the session producer <-> consumer c dies (both sides
        ready): both get ``disconnect`` / both transports see the connection close."""
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
                    out.append(("cut", c))
        return out

    def _ends(self, ch: int) -> tuple[str, str]:
        lane = self.system.lanes[ch // 2]
        return (PRODUCER, lane) if ch % 2 == 0 else (lane, PRODUCER)

    def _closed(self, g: State | Draft, ch: int) -> bool:
        """Whether the receiver of channel ``ch`` has closed (its process is gone)."""
        return g.shut[0 if ch % 2 else 1 + ch // 2] == 2

    def label(self, g: State, action: tuple) -> str:
        kind = action[0]
        if kind == "crash":
            return f"session p<->{self.system.cnames[action[1]]} dies (both sides get disconnect)"
        if kind == "cut":
            return f"connection p<->{self.system.cnames[action[1]]} closes (both sides get connection_closed)"
        env = self.system.cores.msgs[g.chans[action[1]][action[2]]]
        text = {"deliver": "deliver", "arrive": "arrive", "drop": "LOSE", "dup": "DUPLICATE", "corrupt": "deliver"}[
            kind
        ] + f" {env}"
        if kind == "corrupt":
            text += " (its blocks land CORRUPT)"
        elif kind == "deliver" and self._closed(g, action[1]):
            text += " (dropped: the receiver has closed)"
        return text

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s = self.system
        kind = action[0]
        if kind in ("crash", "cut"):
            c = action[1]
            st.crashes -= 1
            cname = s.cnames[c]
            if rec is not None:
                what = "dies" if kind == "crash" else "connection closes"
                rec.add("note", NETWORK, NETWORK, f"session p<->{cname} {what}")
            if kind == "crash":
                pgen = s.cores.summaries[st.p].sessions[cname][1]
                cgen = s.cores.summaries[st.c[c]].sessions["p"][1]
                s.step_producer(st, ("disconnect", cname, pgen), rec)
                s.step_consumer(st, c, ("disconnect", "p", cgen), rec)
            else:
                s.step_producer(st, ("closed", cname), rec)
                s.step_consumer(st, c, ("closed", "p"), rec)
            return
        _, ch, j = action
        q = st.chan(ch)
        env = q[j]
        if rec is not None:
            text = str(s.cores.msgs[env]).split(" ", 1)[1]  # without "src->dst": the lanes say it
            src, dst = self._ends(ch)
            if kind == "deliver":
                if self._closed(st, ch):
                    rec.add("msg", src, NETWORK, f"dropped (receiver closed): {text}")
                else:
                    rec.add("msg", src, dst, text)
            elif kind == "corrupt":
                rec.add("msg", src, dst, f"{text} (its blocks land CORRUPT)")
            elif kind == "arrive":
                rec.add("note", dst, dst, f"arrived, unread: {text}")
            elif kind == "drop":
                rec.add("msg", src, NETWORK, f"lost: {text}")
            else:
                rec.add("note", NETWORK, NETWORK, f"duplicated: {text}")
        if kind == "arrive":
            if j:  # reordered: this message overtakes the ones before it
                q.insert(0, q.pop(j))
            st.arrived = put(st.arrived, ch, 1)
            return
        if kind in ("drop", "dup"):
            if kind == "drop":
                del q[j]
            else:
                q.append(env)
            st.faults = put(st.faults, self.budget_of(ch), st.faults[self.budget_of(ch)] - 1)
            return
        # deliver / corrupt: read message j (the one waiting in the socket, if any)
        del q[j]
        if st.arrived[ch]:
            st.arrived = put(st.arrived, ch, 0)
        if self._closed(st, ch):
            return
        c = ch // 2
        if ch % 2 == 1:
            s.step_producer(st, ("deliver", env), rec)
        elif kind == "deliver":
            s.step_consumer(st, c, ("deliver", env), rec)
        else:
            st.faults = put(st.faults, self.budget_of(ch), st.faults[self.budget_of(ch)] - 1)
            m = s.cores.msgs[env]
            st.corrupted = st.corrupted | {(c, s.kindex[m.kv_request_id], m.round)}
            s.step_consumer(st, c, ("deliver", env, "corrupt"), rec)

    # -- partial-order reduction ---------------------------------------------------------------
    def process_of(self, action: tuple) -> int | None:
        return action[1] if action[0] in ("crash", "cut") else action[1] // 2

    def touches_producer(self, action: tuple) -> bool:
        return action[0] in ("crash", "cut") or (action[0] in ("deliver", "corrupt") and action[1] % 2 == 1)

    def shares_budget(self, g: State, action: tuple) -> bool:
        kind = action[0]
        return kind in ("crash", "cut") or (kind in ("drop", "dup", "corrupt") and self.b.fault_scope != "per_peer")

    def project(self, g: State, i: int) -> tuple:
        return (
            g.chans[2 * i],
            g.chans[2 * i + 1],
            g.arrived[2 * i],
            g.arrived[2 * i + 1],
            g.faults[i] if self.b.fault_scope == "per_peer" else None,
            tuple(sorted(x for x in g.corrupted if x[0] == i)) if g.corrupted else (),
        )

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {
            "deliver": lambda inp: Drive((ix.Received(inp[1].src, inp[1].msg),)),
            "disconnect": lambda inp: Drive((ix.Received(inp[1], wm.Disconnect(gen=inp[2], reason="")),)),
            "closed": lambda inp: Drive((ix.ConnectionClosed(inp[1]),)),
            "dial": lambda inp: Drive((ix.Dial(inp[1]),)),
        }
