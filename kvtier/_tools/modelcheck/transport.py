"""The data plane: what happens to the blocks a ``SendBlocks`` hands to the transport.

The life of one transfer::

    producer core            transport (this module)               producer core
    SendBlocks(peer, id, r)  -> Transfer(c, id, r, cancelled=False)  --"complete"--> transfer_complete(id, r)
                                                                     --"failed"----> transfer_failed(id, r)
    CancelTransfer(peer,id,r)-> Transfer(c, id, r, cancelled=True)   --"released"--> transfer_released(id, r)

* ``SendBlocks`` also puts one ``block_data`` message on the consumer's channel (:mod:`.network`
  does that, like every message); the :class:`Transfer` record is the transport's side: the blocks
  are referenced until the transport reports.
* A transfer in progress ends ``complete`` or (with ``transfer_failures``) ``failed``; a cancelled
  one ends ``released`` (the transport let go of the blocks).  Each report is one nondeterministic
  step, at any time (a completion step: the liveness search may use it).
* The pure functions :func:`reports`, :func:`after_effects` and :func:`after_report` are the whole
  model; :class:`Transport` plugs them into the composed system (state field ``transfers``:
  the sorted tuple of transfers in progress).

Adding a transport behaviour (e.g. references that outlive a cancel and are released later, or
only when the session ends): give :class:`Transfer` the state it needs, say in :func:`reports`
which reports it allows when, map a new report to the core in :data:`OUTCOMES` (or a new core
input in :meth:`Transport.core_inputs`), and, if another event ends it (a session's death), call a
new function of this module from where that event is applied (:meth:`.network.Network.apply`).
A property about it (``no_block_returned_while_referenced``) reads ``State.transfers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from kvtier._tools.modelcheck.clock import NOW
from kvtier._tools.modelcheck.part import CoreInput, Part, Stage
from kvtier._tools.modelcheck.trace import NETWORK, PRODUCER
from kvtier.lifecycle.core import TierCore
from kvtier.lifecycle.effects import CancelTransfer, SendBlocks

if TYPE_CHECKING:
    from kvtier._tools.modelcheck.encoding import CoreStep
    from kvtier._tools.modelcheck.state import Draft, State
    from kvtier._tools.modelcheck.trace import Recorder

__all__ = ["OUTCOMES", "Transfer", "Transport", "after_effects", "after_report", "reports"]


class Transfer(NamedTuple):
    """One transfer in progress (a plain tuple in the state: cheap to hash, sorts by consumer)."""

    consumer: int
    """the consumer index the blocks go to"""
    kv_request_id: str
    round: int
    cancelled: bool
    """the producer sent ``CancelTransfer``: only a release can end it"""


OUTCOMES: Mapping[str, str] = {
    "complete": "transfer_complete",
    "failed": "transfer_failed",
    "released": "transfer_released",
}
"""report -> the :class:`~kvtier.lifecycle.TierCore` method that tells the producer."""


_DATA_PLANE = frozenset({SendBlocks, CancelTransfer})
"""the effects the transport acts on"""


def reports(t: Transfer, *, failures: bool) -> tuple[str, ...]:
    """The reports the transport may make about ``t`` now, in the order the search tries them."""
    if t.cancelled:
        return ("released",)
    return ("complete", "failed") if failures else ("complete",)


def after_effects(
    transfers: tuple[Transfer, ...], effects: tuple, consumers: Mapping[str, int]
) -> tuple[Transfer, ...]:
    """The transfers after a producer step's ``effects``: ``SendBlocks`` to a known consumer
    (``consumers``: peer name -> index) starts one, ``CancelTransfer`` marks its transfer cancelled."""
    for eff in effects:
        if isinstance(eff, SendBlocks):
            if eff.peer in consumers:
                new = Transfer(consumers[eff.peer], eff.kv_request_id, eff.round, False)
                transfers = tuple(sorted(transfers + (new,)))
        elif isinstance(eff, CancelTransfer):
            c = consumers.get(eff.peer)
            transfers = tuple(
                sorted(
                    Transfer(t[0], t[1], t[2], True) if (t[0], t[1], t[2]) == (c, eff.kv_request_id, eff.round) else t
                    for t in transfers
                )
            )
    return transfers


def after_report(transfers: tuple[Transfer, ...], t: Transfer) -> tuple[Transfer, ...]:
    """The transfers after the transport reported on ``t``: it is over."""
    return tuple(x for x in transfers if x != t)


class Transport(Part):
    """The data plane as a part of the composed system."""

    kinds = ("transport",)

    def actions(self, g: State) -> list[tuple]:
        """``("transport", transfer, report)`` for every report of every transfer in progress."""
        failures = self.b.transfer_failures
        return [("transport", t, outcome) for t in g.transfers for outcome in reports(t, failures=failures)]

    def after_step(self, step: CoreStep, c: int | None) -> Stage | None:
        """A producer step that sends blocks or cancels a transfer starts or cancels transfers."""
        if c is not None or _DATA_PLANE.isdisjoint(step.types):
            return None
        return self._take_producer_step

    def _take_producer_step(self, st: Draft, c: int | None, step: CoreStep) -> None:
        st.transfers = after_effects(st.transfers, step.effects, self.system.cindex)

    def label(self, g: State, action: tuple) -> str:
        t = action[1]
        return f"transport: {action[2]} {t[1]} r{t[2]} (to {self.system.cnames[t[0]]})"

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        _, t, outcome = action
        st.transfers = after_report(st.transfers, t)
        if rec is not None:
            rec.add("result", NETWORK, PRODUCER, f"{OUTCOMES[outcome]}({t[1]} r{t[2]})")
        self.system.step_producer(st, ("transport", t[1], t[2], outcome), rec)

    # -- partial-order reduction ---------------------------------------------------------------
    def process_of(self, action: tuple) -> int | None:
        return self.system.kindex[action[1][1]]

    def touches_producer(self, action: tuple) -> bool:
        return True

    def project(self, g: State, i: int) -> tuple:
        return tuple(t for t in g.transfers if t[0] == i)

    # -- core inputs ---------------------------------------------------------------------------
    def core_inputs(self) -> dict[str, CoreInput]:
        return {"transport": _report}


def _report(core: TierCore, inp: tuple) -> list:
    """("transport", kid, round, report): tell the producer core (see :data:`OUTCOMES`)."""
    _, kid, rnd, outcome = inp
    return getattr(core, OUTCOMES[outcome])(kid, rnd, NOW)
