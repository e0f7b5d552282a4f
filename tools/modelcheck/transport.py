"""The data plane: the references a transfer holds, and the consumer's shell around it.

The life of one transfer::

    producer core                   data plane (this module)                 producer core
    SendBlocks(peer, id, r, gen) -> Transfer(c, id, r, gen, blocks) --"released"--> transfer_released(id, r)
                                    (references the blocks)         --"failed"----> transfer_failed(id, r)
    CancelTransfer(peer, id, r)  -> (nothing more is posted; the references may linger)

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
* **The consumer's shell** answers at once, in the core step that asked (:meth:`Transport.answer`):
  a ``LandBlocks`` with ``blocks_landed`` (ok, or corrupt when :mod:`.network`'s ``corrupt`` fault
  delivered the block_data), and, on a receiver-applied plane, a ``RevokeAccess`` with
  ``access_revoked``.  On a one-sided plane (``one_sided``) the revocation waits in
  ``State.revokes`` until a later step confirms it (a completion step).
* The pure functions :func:`reports`, :func:`after_effects` and :func:`after_report` are the
  transfer model; :class:`Transport` plugs them into the composed system (state fields
  ``transfers``, ``revokes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from tools.modelcheck.clock import NOW
from tools.modelcheck.part import CoreInput, Part, Stage
from tools.modelcheck.trace import NETWORK, PRODUCER
from kvtier.lifecycle.consumer import MessageInput
from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.effects import LandBlocks, RevokeAccess, SendBlocks

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
    round: int
    gen: int
    """the generation of the session that carries it (the ``SendBlocks``' ``gen``)"""
    blocks: tuple[int, ...]
    """the producer pool blocks it references"""


OUTCOMES: Mapping[str, str] = {
    "released": "transfer_released",
    "failed": "transfer_failed",
}
"""report -> the :class:`~kvtier.lifecycle.TierCore` method that tells the producer."""


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
            new = Transfer(consumers[eff.peer], eff.kv_request_id, eff.round, eff.gen, eff.blocks)
            transfers = tuple(sorted(transfers + (new,)))
    return transfers


def after_report(transfers: tuple[Transfer, ...], t: Transfer) -> tuple[Transfer, ...]:
    """The transfers after the plane reported on ``t``: it references nothing of it any more."""
    return tuple(x for x in transfers if x != t)


class Transport(Part):
    """The data plane (and the consumer shell's landing) as a part of the composed system."""

    kinds = ("transport", "revoked")

    def session_ended(self, g: State, t: Transfer) -> bool:
        """Whether the session that carried ``t`` is over (or the producer closed its plane)."""
        if g.shut[0] == 2:
            return True
        sess = self.system.cores.summaries[g.p].sessions.get(self.system.cnames[t.consumer])
        return sess is None or sess[1] != t.gen or sess[0] == "dead"

    def actions(self, g: State, full: bool) -> list[tuple]:
        """``("transport", transfer, report)`` for every report the plane may make now (see
        :func:`reports`)."""
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
        """``("revoked", c, id, round)``: a one-sided plane confirms a revocation (a completion step)."""
        return [("revoked", *r) for r in g.revokes]

    def answer(self, core: TierCore, inp: tuple, effects: list) -> list:
        """The consumer shell's synchronous answers to a core step's ``effects``: every
        ``LandBlocks`` is landed and checked (``blocks_landed``; corrupt when ``inp`` is a corrupt
        delivery), every ``RevokeAccess`` of a receiver-applied plane confirmed
        (``access_revoked``)."""
        more: list = []
        for eff in effects:
            if isinstance(eff, LandBlocks):
                ok = not (inp[0] == "deliver" and inp[2:] == ("corrupt",))
                landed = MessageInput(eff.kv_request_id, eff.round, eff.first, eff.count, ok=ok,
                                      reason=None if ok else "corrupt")
                more.extend(core.blocks_landed(eff.peer, landed, NOW))
            elif isinstance(eff, RevokeAccess) and not self.b.one_sided:
                more.extend(core.access_revoked(eff.peer, eff.kv_request_id, eff.round, NOW))
        return more

    def after_step(self, step: CoreStep, c: int | None) -> Stage | None:
        """A producer step that sends blocks posts a transfer; a consumer step that asks a one-sided
        plane to revoke access leaves a revocation to confirm."""
        if c is None:
            return self._take_producer_step if SendBlocks in step.types else None
        if not self.b.one_sided or RevokeAccess not in step.types:
            return None
        new = tuple((c, e.kv_request_id, e.round) for e in step.effects if isinstance(e, RevokeAccess))

        def revoke(st: Draft, c: int | None, step: CoreStep) -> None:
            st.revokes = tuple(sorted(set(st.revokes) | set(new)))

        return revoke

    def _take_producer_step(self, st: Draft, c: int | None, step: CoreStep) -> None:
        st.transfers = after_effects(st.transfers, step.effects, self.system.cindex)

    def label(self, g: State, action: tuple) -> str:
        if action[0] == "revoked":
            _, c, kid, rnd = action
            return f"{self.system.cnames[c]}'s data plane: access revoked for {kid} r{rnd}"
        t = action[1]
        return f"transport: {action[2]} {t[1]} r{t[2]} (to {self.system.cnames[t[0]]})"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        s = self.system
        if action[0] == "revoked":
            _, c, kid, rnd = action
            st.revokes = tuple(r for r in st.revokes if r != action[1:])
            if rec is not None:
                rec.add("result", NETWORK, s.lanes[c], f"access_revoked({kid} r{rnd})")
            s.step_consumer(st, c, ("revoked", kid, rnd), rec)
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
        return self.system.kindex[action[1][1]]

    def touches_producer(self, action: tuple) -> bool:
        return action[0] == "transport"

    def project(self, g: State, i: int) -> tuple:
        return tuple(t for t in g.transfers if t[0] == i), tuple(r for r in g.revokes if r[0] == i)

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {"transport": _report, "revoked": _revoked}


def _report(core: TierCore, inp: tuple) -> list:
    """("transport", kid, round, report): tell the producer core (see :data:`OUTCOMES`)."""
    _, kid, rnd, outcome = inp
    return getattr(core, OUTCOMES[outcome])(kid, rnd, NOW)


def _revoked(core: TierCore, inp: tuple) -> list:
    """("revoked", kid, round): the consumer's one-sided plane confirms the producer's access is gone."""
    _, kid, rnd = inp
    return core.access_revoked("p", kid, rnd, NOW)
