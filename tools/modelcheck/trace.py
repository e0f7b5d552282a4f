"""Counterexample traces: the text lines and the structured steps a sequence chart is drawn from.

A counterexample is replayed action by action (:func:`.search.check` does it); while an action is
applied, a :class:`Recorder` collects

* the **text notes** printed under the action's numbered line (``P: X absent->parked, ...``),
  exactly as the text trace has always shown them, and
* the **structured steps**: one :class:`TraceStep` per thing that happened, on the *lanes* of the
  actors involved — the call an engine made, the message the network delivered or lost, the timer
  that fired, what a core did (a note) and the job results it handed back.

Lanes (the columns of a sequence chart):

=====================  =====================================================
``engine:prefill``     the producer's engine (vLLM prefill instance)
``producer``           the producer's TierCore
``consumer:<n>``       consumer ``c<n>``'s TierCore (numbered as in the text: c1 is ``consumer:1``)
``engine:decode:<n>``  consumer ``c<n>``'s engine (vLLM decode instance)
``network``            channels, faults, session deaths, and the data plane's reports
``clock``              abstract time: a deadline firing
=====================  =====================================================

Kinds: ``call`` (engine -> core), ``result`` (core -> engine: a job result; network -> producer: a
transfer report), ``msg`` (a delivered message, sender -> receiver; a lost one goes sender ->
``network``), ``timer`` (``clock`` -> core), ``note`` (on one lane: src == dst), ``violation``
(on the lane where the property broke, last).  :func:`to_chart_steps` turns them into the plain
dicts the sequence-chart renderer takes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from kvtier.lifecycle.effects import JobDone

if TYPE_CHECKING:
    from tools.modelcheck.encoding import Summary
    from tools.modelcheck.result import Result

__all__ = [
    "CLOCK", "KINDS", "NETWORK", "PREFILL", "PRODUCER", "Recorder", "TraceStep", "consumer_lane", "decode_lane",
    "to_chart_steps",
]

PRODUCER = "producer"
PREFILL = "engine:prefill"
NETWORK = "network"
CLOCK = "clock"
KINDS = ("msg", "call", "result", "timer", "note", "violation")


def consumer_lane(c: int) -> str:
    """The lane of consumer index ``c`` (0-based; named ``c{c+1}`` in the text trace)."""
    return f"consumer:{c + 1}"


def decode_lane(c: int) -> str:
    """The lane of consumer index ``c``'s engine."""
    return f"engine:decode:{c + 1}"


@attrs.frozen
class TraceStep:
    """One thing that happened in a counterexample, between two lanes."""

    n: int
    """the numbered line of the text trace (the action) this step belongs to (1-based)"""
    kind: str
    """one of :data:`KINDS`"""
    src: str
    """the lane it starts from (for a note or violation: the lane it is on)"""
    dst: str
    """the lane it ends at (== ``src`` for a note or violation)"""
    label: str
    """short text: a call, a message, a timer, a core's state changes and effects"""


class Recorder:
    """Collects what one action does while it is applied: text notes and structured steps."""

    __slots__ = ("n", "notes", "steps")

    def __init__(self, n: int) -> None:
        self.n = n
        self.notes: list[str] = []
        self.steps: list[TraceStep] = []

    def add(self, kind: str, src: str, dst: str, label: str) -> None:
        self.steps.append(TraceStep(self.n, kind, src, dst, label))

    def core_step(self, who: str, lane: str, engine: str, pre: Summary, post: Summary, effects: tuple) -> None:
        """A core step on ``lane`` (``who``: its prefix in the text note): the text note, a note step
        with its state changes and effects, a result step to ``engine`` per job result; nothing
        when the step changed no state and had no effect worth showing."""
        changes = _changes(pre, post)
        texts = [(eff, _effect_text(eff)) for eff in effects]
        if not changes and not any(t for _, t in texts):
            return  # nothing to show (e.g. the producer noting that the prefill finished)
        self.notes.append(f"{who}: " + ", ".join(changes + [t for _, t in texts if t]))
        other = changes + [t for eff, t in texts if t and not isinstance(eff, JobDone)]
        results = [t for eff, t in texts if t and isinstance(eff, JobDone)]
        if other:
            self.add("note", lane, lane, ", ".join(other))
        for t in results:
            self.add("result", lane, engine, t)


def _changes(pre: Summary, post: Summary) -> list[str]:
    bits = []
    for table in ("producer", "consumer", "sessions"):
        a, b = getattr(pre, table), getattr(post, table)
        for key in sorted(set(a) | set(b)):
            sa = a[key][0] if key in a else "absent"
            sb = b[key][0] if key in b else "absent"
            if sa != sb:
                what = "session " if table == "sessions" else ""
                bits.append(f"{what}{key} {sa}->{sb}")
    return bits


def _effect_text(eff: Any) -> str | None:
    name = type(eff).__name__
    if name == "Ignored":
        return f"ignored {eff.event} ({eff.reason})"
    if name == "JobDone":
        return f"JobDone({eff.job_id}, {'ok' if eff.ok else 'fail ' + str(eff.reason)})"
    if name == "Send":
        msg = eff.msg
        kind = msg.TYPE
        if kind == "transfer_done":
            return f"transfer_done({msg.kv_request_id} r{msg.round} {'ok' if msg.ok else 'fail ' + msg.reason})"
        if kind == "abort_fetch":
            return f"abort_fetch({msg.kv_request_id}{'' if msg.fetched else ', not fetched'})"
        kid = getattr(msg, "kv_request_id", "")
        return f"{kind}({kid})" if kid else kind
    if name in ("SendBlocks", "LandBlocks", "CancelTransfer"):
        return f"{name}({eff.kv_request_id})"
    if name in ("RevokeAccess", "AttachPeer"):
        return f"{name}({eff.peer})"
    if name == "SessionEnded":
        return f"SessionEnded({eff.peer}, {eff.reason})"
    if name in ("OpenConnection", "CloseConnection"):
        return name
    return None


def to_chart_steps(result: Result) -> list[dict[str, Any]]:
    """The counterexample of ``result`` as sequence-chart input: one dict per structured step, with
    keys ``src``, ``dst`` (lane keys), ``label``, ``kind`` (one of :data:`KINDS`) and ``t`` (always
    None: the model's time is abstract).  An empty list when every property held."""
    return [{"src": s.src, "dst": s.dst, "label": s.label, "kind": s.kind, "t": None} for s in result.steps]
