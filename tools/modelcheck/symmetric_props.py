"""The symmetric path's properties the model check proves (decision M14; :mod:`.properties`
registers them, the engines are :mod:`.symmetric`'s): every pin released once, hits and served
blocks pinned, a probe answered in bound.
"""


from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.lifecycle.effects import ReleasePins, Send, SendBlocks
from kvtier.lifecycle.serve import transfer_key
from kvtier.wire import messages as wm
from tools.modelcheck.checking import Fail
from tools.modelcheck.trace import PRODUCER

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.system import System

# -- the symmetric path (decision M14; the engines are .symmetric's) -----------------------------


def _released(step: CoreStep) -> set[int]:
    return {p for e in step.effects if type(e) is ReleasePins for p in e.pins}


def _pinned_blocks(st: Draft, kid: str, rnd: int, released: set[int]) -> set[int]:
    """The pool blocks the engine pins for round ``rnd`` of ``kid``, pins released by the step aside."""
    return {b for pin, k, r, blocks in st.pins if (k, r) == (kid, rnd) and pin not in released for b in blocks}


def pins_released_once(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """pin_released_once (per step): every pin a ``ReleasePins`` names is one the producer's engine
    gave out and nobody released yet (``State.pins``), named once, and the data plane references
    none of its blocks in a transfer of the pin's round (the engine may evict or reuse them)."""
    held = {p[0]: p for p in st.pins}
    seen: set[int] = set()
    for eff in step.effects:
        if type(eff) is not ReleasePins:
            continue
        for pin in eff.pins:
            if pin in seen or pin not in held:
                raise Fail("pin_released_once", f"the producer released pin {pin} "
                           + ("twice in one step" if pin in seen else "which is not held (released before, or never "
                              "given out)"), PRODUCER)
            seen.add(pin)
            _, kid, rnd, blocks = held[pin]
            for t in st.transfers:
                if t[1] == transfer_key(system.cnames[t[0]], kid) and t[2] == rnd and set(t[4]) & set(blocks):
                    raise Fail("pin_released_once", f"the producer released pin {pin} ({kid} r{rnd}, blocks {blocks}) "
                               f"while the data plane still references them in the round's transfer to "
                               f"{system.cnames[t[0]]}", PRODUCER)


def pins_held_by_records(system: System, g: State) -> None:
    """pin_released_once (per state): the pins the engine holds for the producer are exactly those
    its serve records hold — one held by no record is never released, one a record holds that the
    engine does not is released twice when the record ends."""
    engine = {p[0] for p in g.pins}
    records = {pin for (_state, pins, _found) in system.cores.summaries[g.p].serve.values() for pin in pins}
    if engine != records:
        raise Fail("pin_released_once", f"the engine holds pins {sorted(engine)} for the producer, its serve records "
                   f"hold {sorted(records)}: " + ("a pin nobody will release" if engine - records
                                                  else "a record holds a pin that was released"), PRODUCER)


def hits_pinned(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_hit_without_pin: a ``probe_reply`` says hit only for a key its round's serve record found
    in a pool block that a pin the engine holds (and the step does not release) keeps."""
    released = _released(step)
    for eff in step.effects:
        if type(eff) is not Send or type(eff.msg) is not wm.ProbeReply:
            continue
        m = eff.msg
        serve = step.post.serve.get((eff.peer, m.kv_request_id, m.round))
        held = _pinned_blocks(st, m.kv_request_id, m.round, released)
        for k, hit in zip(m.keys, m.hits):
            if hit and (serve is None or k not in serve[2] or serve[2][k] not in held):
                raise Fail("no_hit_without_pin", f"the producer's probe_reply for {m.kv_request_id} r{m.round} says hit "
                           f"for {k.decode(errors='replace')} but no pin it holds keeps that key's block", PRODUCER)


def replies_probe(system: System, step: CoreStep) -> bool:
    return Send in step.types and any(type(e) is Send and type(e.msg) is wm.ProbeReply for e in step.effects)


def served_blocks_pinned(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_block_after_release: a served round's transfer (``SendBlocks`` with a plane key) names
    only blocks a pin of that round keeps (held, and not released by the same step)."""
    released = _released(step)
    for eff in step.effects:
        if type(eff) is SendBlocks and eff.transfer:
            held = _pinned_blocks(st, eff.kv_request_id, eff.round, released)
            if not set(eff.blocks) <= held:
                raise Fail("no_block_after_release", f"the producer sends blocks {eff.blocks} of {eff.kv_request_id} "
                           f"r{eff.round}, but the round's pins keep only {sorted(held)}", PRODUCER)


def retry_in_bound(system: System, g: State) -> None:
    """probe_answered_in_bound: a lookup answers RETRY (the live core's ``probe_answer``) only
    while the probe is ``collecting`` or ``probing`` with its ``probe`` deadline armed."""
    for c, sid in enumerate(g.c):
        summary = system.cores.summaries[sid]
        for (kid, key), answer in summary.answers.items():
            if answer != "retry":
                continue
            state = summary.probe.get(kid, ("absent",))[0]
            if state not in ("collecting", "probing"):
                why = f"its probe is {state} (RETRY is bounded only in collecting and probing)"
            elif ("probe", kid, "probe") not in summary.timers:
                why = f"its probe is {state} without the probe deadline armed"
            else:
                continue
            raise Fail("probe_answered_in_bound", f"{system.cnames[c]} answers RETRY for "
                       f"{key.decode(errors='replace')} of {kid} while {why}", system.lanes[c])
