"""The interface every part of the environment implements (engines, network, transport, clock).

An *action* is one nondeterministic step of the environment: a tuple whose first item is its kind
(``("deliver", channel, index)``, ``("transport", transfer, "complete")``, ...).  Each kind is
owned by one part, which

* offers it (its ``*actions`` methods, which return the enabled actions as a list, called in
  :meth:`.system.System.actions`, whose order is the breadth-first order: it decides which
  shortest counterexample is found),
* labels it for the text trace (:meth:`Part.label`),
* applies it to a :class:`~.state.Draft` (:meth:`Part.apply`), usually through a core step of the
  producer or a consumer (:meth:`.system.System.step_producer` / ``step_consumer``), and records
  what happened on the trace lanes when it is given a :class:`~.trace.Recorder`,
* takes what concerns it from the effects of a core step (:meth:`Part.after_step`),
* tells the partial-order reduction (:mod:`.reduction`) which id/consumer pair it belongs to and
  what it shares with the others.

A part also names the **core inputs** it produces (:meth:`Part.core_inputs`): input kind ->
``handler(inp) -> Drive``, the only place that says which :mod:`kvtier.lifecycle.inputs` records
an input is and how the driver is asked to apply them; and the **answers** its performers give
(:meth:`Part.answers`): what the shell reports back for an effect within the same core step (a
connection up, blocks landed …), applied by :func:`kvtier.lifecycle.driver.drive` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.system import System
    from tools.modelcheck.trace import Recorder

__all__ = ["Answer", "CoreInput", "Drive", "Part", "Stage"]


@attrs.frozen
class Drive:
    """How one model input is applied: the input records handed to
    :func:`kvtier.lifecycle.driver.drive`, the time deadlines fire at (None: none), how the
    restored state is prepared first (:func:`tools.snapshot.retime`'s ``clock``;
    None: as it is), and whether the inputs are messages that arrived before the deadline that
    is due fell due (``unread``: then no deadline may fire before they are applied)."""

    inputs: tuple[Any, ...]
    deadlines_at: float | None = None
    retime: Callable[[str, str, str, float], float] | None = None
    unread: bool = False


CoreInput = Callable[[tuple], Drive]
"""``handler(inp) -> Drive``: how a model input reaches a (restored) core."""

Answer = Callable[[Any, tuple], Any]
"""``answer(eff, inp) -> input | None``: a performer's synchronous report."""

Stage = Callable[["Draft", "int | None", "CoreStep"], None]
"""``stage(draft, c, step)``: something that follows core step ``step`` of the producer (``c``
None) or consumer ``c`` (a property check, or a part taking the step's effects)."""


class Part:
    """One part of the world the cores live in."""

    kinds: tuple[str, ...] = ()
    """the action kinds this part owns"""

    def __init__(self, system: System) -> None:
        self.system = system
        self.b = system.b

    def core_inputs(self) -> dict[str, CoreInput]:
        """Input kind -> handler, for the core inputs this part's actions produce."""
        return {}

    def answers(self) -> dict[type, Answer]:
        """Effect type -> ``answer(eff, inp) -> input | None``: what this part's performer
        reports for an effect within the same core step (``inp``: the model input being
        applied).  Each effect type is answered by one part at most."""
        return {}

    def after_step(self, step: CoreStep, c: int | None) -> Stage | None:
        """What this part does after core step ``step`` of the producer (``c`` None) or consumer
        ``c``: a stage that takes the step's effects into the draft state, or None.  Called once per
        distinct step (the stage is cached), so work that depends on the step alone belongs here."""
        return None

    def label(self, g: State, action: tuple) -> str:
        """The text of ``action`` in state ``g`` (the numbered line of the text trace)."""
        raise NotImplementedError

    def apply(self, st: Draft, g: State, action: tuple, rec: Recorder | None) -> None:
        """Apply ``action`` (enabled in ``g``) to ``st``; raises :class:`~.properties.Fail` when a
        property breaks.  With a recorder, record the action's own steps (a call, a message, a
        timer) before the core steps it causes."""
        raise NotImplementedError

    # -- for the partial-order reduction (.reduction) -----------------------------------------
    def process_of(self, action: tuple) -> int | None:
        """The index of the id/consumer pair ``action`` belongs to (None: it couples them all)."""
        return None

    def touches_producer(self, action: tuple) -> bool:
        """Whether ``action`` steps the producer's core (then the retained-id cap may couple ids)."""
        return False

    def shares_budget(self, g: State, action: tuple) -> bool:
        """Whether ``action`` spends a budget the other pairs share (faults in total, crashes)."""
        return False

    def project(self, g: State, i: int) -> tuple:
        """The part of this part's state fields that belongs to pair ``i``."""
        return ()
