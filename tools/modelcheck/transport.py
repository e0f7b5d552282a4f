"""The data plane: the references a transfer holds, and the consumer's shell around it.

The life of one transfer::

    producer core                   data plane (this module)                 producer core
    SendBlocks(peer, id, r, gen) -> Transfer(c, id, r, gen, blocks) --"released"--> TransferReleased(id, r)
                                    (references the blocks)         --"failed"----> TransferReleased(id, r, failed)
    CancelTransfer(id, r)        -> (nothing more is posted; the references may linger)

* ``SendBlocks`` also puts one ``block_data`` message on the consumer's channel (:mod:`.network`
  does that, like every message); the :class:`Transfer` is the plane's side: its blocks are
  referenced until the plane reports ``released`` (or, with ``transfer_failures``, ``failed``).
* **When the plane reports.**  At any step after the post, before or after the consumer read the
  block_data, before or after a ``CancelTransfer`` (which changes nothing here: the references
  outlive a cancel for as long as the plane likes).  But a report is a *completion* step (the
  liveness search may count on it) only once the session that carried the transfer has ended — the
  transport drops a dead connection's frames and with them the plane's references — or the
  producer has closed (its plane closes).  So the liveness search must find its way to quiescence
  with a plane that never releases while the session is up: through the ``cancel`` deadline,
  ``quarantined``, ``force_release`` → ``give_up`` → the session's end.
* **The consumer's shell** answers at once, in the core step that asked (:meth:`Transport.answers`):
  a ``LandBlocks`` with ``BlocksLanded`` (ok, or corrupt when :mod:`.network`'s ``corrupt`` fault
  delivered the block_data), and, on a receiver-applied plane, a ``RevokeAccess`` with
  ``AccessRevoked``.  On a one-sided plane (``one_sided``) the revocation waits in
  ``State.revokes`` until a later step confirms it (a completion step).
* **Descriptors**: a session's ``AttachPeer`` is taken at once (``PeerAttached``), or, with
  ``attach_later``, waits in ``State.attaches`` until the plane takes it (a completion step) or
  refuses it (``AttachRefused``: not a completion step) — for good (a descriptor it cannot take)
  or for now (``still_held``: it still holds an earlier session of that peer's agent, decision
  N25) — so the handshake's ``attaching`` state meets deadlines, a peer's goodbye, the session's
  end and a refusal its peer may outlive.
* The pure functions :func:`reports`, :func:`after_effects` and :func:`after_report` are the
  transfer model; :class:`Transport` plugs them into the composed system (state fields
  ``transfers``, ``revokes``, ``attaches``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from tools.modelcheck.part import Answer, CoreInput, Drive, Part, Stage
from tools.modelcheck.trace import NETWORK, PRODUCER
from kvtier.lifecycle import Reason
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import AttachPeer, LandBlocks, RevokeAccess, SendBlocks

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.trace import Recorder

__all__ = ["OUTCOMES", "Transfer", "Transport", "after_effects", "after_report", "reports"]


class Transfer(NamedTuple):
    """One transfer whose blocks the plane references (a plain tuple in the state: cheap to hash,
    sorts by consumer)."""

    consumer: int
    """the consumer index the blocks go to"""
    kv_request_id: str
    """the transfer's plane key: the id for a PD transfer, ``<id>|<peer>`` for a symmetric round
    served from the engine's tiers (:func:`kvtier.lifecycle.serve.transfer_key`)"""
    round: int
    gen: int
    """the generation of the session that carries it (the ``SendBlocks``' ``gen``)"""
    blocks: tuple[int, ...]
    """the producer pool blocks it references"""


OUTCOMES: Mapping[str, str] = {
    "released": "transfer_released",
    "failed": "transfer_failed",
}
"""report -> the producer's event it becomes (a ``TransferReleased`` input, ``failed`` or not)."""


def reports(t: Transfer, *, failures: bool, completion: bool, session_ended: bool) -> tuple[str, ...]:
    """The reports the plane may make about ``t`` now, in the order the search tries them: any of
    them at any step; as a completion step (``completion``) only the release, and only once the
    session that carried ``t`` ended (``session_ended``)."""
    if completion:
        return ("released",) if session_ended else ()
    return ("released", "failed") if failures else ("released",)


def after_effects(
    transfers: tuple[Transfer, ...], effects: tuple, consumers: Mapping[str, int]
) -> tuple[Transfer, ...]:
    """The transfers after a producer step's ``effects``: a ``SendBlocks`` to a known consumer
    (``consumers``: peer name -> index) posts one.  A ``CancelTransfer`` changes nothing: the
    plane posts no more, but what it references stays referenced until it reports."""
    for eff in effects:
        if isinstance(eff, SendBlocks) and eff.peer in consumers:
            new = Transfer(consumers[eff.peer], eff.transfer or eff.kv_request_id, eff.round, eff.gen, eff.blocks)
            transfers = tuple(sorted(transfers + (new,)))
    return transfers


def after_report(transfers: tuple[Transfer, ...], t: Transfer) -> tuple[Transfer, ...]:
    """The transfers after the plane reported on ``t``: it references nothing of it any more."""
    return tuple(x for x in transfers if x != t)


TAKEN, REFUSED, HELD = "taken", "refused", "held"
"""What a plane does with a descriptor (``attach_later``): takes it, refuses it for good, or refuses it
for now (an earlier session of the peer's agent still held: ``AttachRefused`` with ``still_held``)."""
_SAYS = {TAKEN: "takes", REFUSED: "REFUSES", HELD: "REFUSES FOR NOW (still held)"}
_RESULT = {TAKEN: "plane_attached", REFUSED: "plane_refused", HELD: "plane_refused_still_held"}


class Transport(Part):
    """The data plane (and the consumer shell's landing) as a part of the composed system."""

    kinds = ("transport", "revoked", "attached")

    def session_ended(self, g: State, t: Transfer) -> bool:
        """Whether the session that carried ``t`` is over (or the producer closed its plane)."""
        if g.shut[0] == 2:
            return True
        sess = self.system.cores.summaries[g.p].sessions.get(self.system.cnames[t.consumer])
        return sess is None or sess[1] != t.gen or sess[0] == "dead"

    def actions(self, g: State, full: bool) -> list[tuple]:
        """``("transport", transfer, report)`` for every report the plane may make now (see
        :func:`reports`)."""
        if not g.transfers:
            return []
        failures = self.b.transfer_failures
        out: list[tuple] = []
        for t in g.transfers:
            ended = not full and self.session_ended(g, t)
            out.extend(
                ("transport", t, r)
                for r in reports(t, failures=failures, completion=not full, session_ended=ended)
            )
        return out

    def revocations(self, g: State) -> list[tuple]:
        """``("revoked", c)``: a one-sided plane confirms a revocation (a completion step)."""
        return [("revoked", c) for c in g.revokes]

    def attachments(self, g: State, full: bool) -> list[tuple]:
        """``("attached", manager, peer, gen, outcome)``: a plane takes a descriptor (outcome
        :data:`TAKEN`, a completion step) or refuses it (:data:`REFUSED`, or :data:`HELD`: for now,
        an earlier session of the peer's agent still held; neither a completion step)."""
        out = [("attached", *a, TAKEN) for a in g.attaches]
        if full:
            out.extend(("attached", *a, o) for a in g.attaches for o in (REFUSED, HELD))
        return out

    def answers(self) -> dict[type, Answer]:
        """The consumer shell's synchronous answers: every ``LandBlocks`` is landed and checked
        (``BlocksLanded``; corrupt when the input is a corrupt delivery), every ``RevokeAccess`` of
        a receiver-applied plane confirmed (``AccessRevoked``), every ``AttachPeer`` taken
        (``PeerAttached``) unless the plane takes descriptors later."""
        out: dict[type, Answer] = {LandBlocks: _landed}
        if not self.b.one_sided:
            out[RevokeAccess] = lambda eff, inp: ix.AccessRevoked(eff.peer)
        if not self.b.attach_later:
            out[AttachPeer] = lambda eff, inp: ix.PeerAttached(eff.peer, eff.gen)
        return out

    def after_step(self, step: CoreStep, c: int | None) -> Stage | None:
        """A producer step that sends blocks posts a transfer; a consumer step that asks a one-sided
        plane to revoke access leaves a revocation to confirm; with ``attach_later`` a step that
        hands a descriptor to the plane leaves it to take or refuse."""
        stages: list[Stage] = []
        if c is None and SendBlocks in step.types:
            stages.append(self._take_producer_step)
        if c is not None and self.b.one_sided and RevokeAccess in step.types:
            def revoke(st: Draft, c: int | None, step: CoreStep) -> None:
                st.revokes = tuple(sorted(set(st.revokes) | {c}))

            stages.append(revoke)
        if self.b.attach_later and AttachPeer in step.types:
            m = 0 if c is None else 1 + c
            new = {(m, e.peer, e.gen) for e in step.effects if isinstance(e, AttachPeer)}

            def attach(st: Draft, c: int | None, step: CoreStep) -> None:
                st.attaches = tuple(sorted(set(st.attaches) | new))

            stages.append(attach)
        if not stages:
            return None
        if len(stages) == 1:
            return stages[0]

        def all_of(st: Draft, c: int | None, step: CoreStep) -> None:
            for stage in stages:
                stage(st, c, step)

        return all_of

    def _take_producer_step(self, st: Draft, c: int | None, step: CoreStep) -> None:
        st.transfers = after_effects(st.transfers, step.effects, self.system.cindex)

    def label(self, g: State, action: tuple) -> str:
        if action[0] == "revoked":
            return f"{self.system.cnames[action[1]]}'s data plane: the producer's access revoked"
        if action[0] == "attached":
            _, m, peer, gen, outcome = action
            who = "P" if m == 0 else self.system.cnames[m - 1]
            return f"{who}'s data plane {_SAYS[outcome]} the descriptor of {peer} (gen {gen})"
        t = action[1]
        return f"transport: {action[2]} {t[1]} r{t[2]} (to {self.system.cnames[t[0]]})"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s = self.system
        if action[0] == "revoked":
            c = action[1]
            st.revokes = tuple(r for r in st.revokes if r != c)
            if rec is not None:
                rec.add("result", NETWORK, s.lanes[c], "access_revoked(p)")
            s.step_consumer(st, c, ("revoked",), rec)
            return
        if action[0] == "attached":
            _, m, peer, gen, outcome = action
            st.attaches = tuple(a for a in st.attaches if a != (m, peer, gen))
            lane = PRODUCER if m == 0 else s.lanes[m - 1]
            if rec is not None:
                rec.add("result", NETWORK, lane, f"{_RESULT[outcome]}({peer})")
            if m == 0:
                s.step_producer(st, ("attached", peer, gen, outcome), rec)
            else:
                s.step_consumer(st, m - 1, ("attached", peer, gen, outcome), rec)
            return
        _, t, outcome = action
        st.transfers = after_report(st.transfers, t)
        if rec is not None:
            rec.add("result", NETWORK, PRODUCER, f"{OUTCOMES[outcome]}({t[1]} r{t[2]})")
        s.step_producer(st, ("transport", t[1], t[2], outcome), rec)

    # -- partial-order reduction ---------------------------------------------------------------
    def process_of(self, action: tuple) -> int | None:
        if action[0] == "revoked":
            return action[1]
        if action[0] == "attached":
            _, m, peer, _gen, _ok = action
            return m - 1 if m else self.system.cindex[peer]
        return self.system.kindex[action[1][1].split("|")[0]]

    def touches_producer(self, action: tuple) -> bool:
        return action[0] == "transport" or (action[0] == "attached" and action[1] == 0)

    def project(self, g: State, i: int) -> tuple:
        cname = self.system.cnames[i]
        return (
            tuple(t for t in g.transfers if t[0] == i) if g.transfers else (),
            i in g.revokes,
            tuple(a for a in g.attaches if a[0] == 1 + i or (a[0] == 0 and a[1] == cname)) if g.attaches else (),
        )

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {
            "transport": lambda inp: Drive((ix.TransferReleased(inp[1], inp[2], inp[3] == "failed"),)),
            "revoked": lambda inp: Drive((ix.AccessRevoked("p"),)),
            "attached": lambda inp: Drive(
                (ix.PeerAttached(inp[1], inp[2]) if inp[3] == TAKEN
                 else ix.AttachRefused(inp[1], inp[2], ix.STILL_HELD if inp[3] == HELD else "model"),)),
        }


def _landed(eff: LandBlocks, inp: tuple) -> ix.BlocksLanded:
    """The consumer's shell lands ``eff``'s blocks and checks their digests: a mismatch when the
    input is a corrupt delivery."""
    ok = not (inp[0] == "deliver" and inp[2:] == ("corrupt",))
    return ix.BlocksLanded(eff.peer, eff.kv_request_id, eff.round, eff.first, len(eff.slots), ok,
                           None if ok else Reason.CORRUPT)
