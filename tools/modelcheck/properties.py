"""The properties the model check proves, one documented checker each, and their registry.

The names are the spec's (``spec/lifecycle.toml`` ``[properties]``); :data:`REGISTRY` maps each
model property to the spec properties it covers.  A property is checked through up to three hooks:

* ``producer_step`` / ``consumer_step`` — run after a core step of the producer / a consumer
  (``hook(system, draft, c, step)``: ``c`` the consumer index, None for the producer; ``step``
  the memoised :class:`~.encoding.CoreStep` with its input, the core's summary before and after,
  and its effects), on every explored transition whose core step passes the property's ``when``
  filter; may update the property's own history fields of the draft state (``retired``).
  ``when(system, step)`` depends on the memoised step only, so it is evaluated once per distinct
  core step: it keeps the hooks off the many steps they have nothing to say about;
* ``state`` — run on every new global state;
* liveness (``no_stuck_ids``) is not a hook: the search (:mod:`.search`) asks :func:`quiescent`
  of the states reachable by completion steps, and reports :func:`stuck` when none is.

A hook raises :class:`Fail` to report a violation; the search turns it into a counterexample.

The registry lists the properties in the order their hooks run on one step (when one step breaks
two properties, the first listed is reported); :data:`PROPERTIES` is the order of the report.

Adding a property: write its checker below (docstring: what it proves and how), add a
:class:`Property` to :data:`REGISTRY` and its name to :data:`PROPERTIES`, and plant a bug that
breaks it (``tools/planted.py``; ``tests/model/test_modelcheck.py`` ``EXPECTED``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from operator import attrgetter
from typing import TYPE_CHECKING

import attrs

from kvtier.lifecycle.effects import JobDone, ReleasePins, Send, SendBlocks
from kvtier.wire import messages as wm
from tools.modelcheck import honest
from tools.modelcheck.checking import NO_REC as _NO_REC
from tools.modelcheck.checking import Fail
from tools.modelcheck.checking import lane_of as _lane
from tools.modelcheck.checking import read as _read
from tools.modelcheck.checking import who as _who
from tools.modelcheck.data_path import (
    lands_or_fails_a_load,
    no_store_result_while_referenced,
    no_write_after_terminal,
    receipt_or_store_result,
    success_needs_receipt_c,
    success_needs_receipt_p,
)
from tools.modelcheck.state import put
from tools.modelcheck.symmetric_props import (
    hits_pinned,
    pins_held_by_records,
    pins_released_once,
    replies_probe,
    retry_in_bound,
    served_blocks_pinned,
)
from tools.modelcheck.trace import NETWORK, PRODUCER

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep, Summary
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.system import System

__all__ = [
    "C_LIVE",
    "PROPERTIES",
    "P_LATE",
    "P_LIVE",
    "P_RETAINED",
    "REGISTRY",
    "Fail",
    "Property",
    "quiescent",
    "stuck",
]

P_LIVE = frozenset({"parked", "awaiting", "serving", "delivering", "confirmed", "cancelling", "quarantined"})
"""producer states that still hold jobs, blocks or a fetch"""
P_RETAINED = frozenset({"done", "tombstoned"})
"""producer states retained after an id ended (until pruned)"""
P_LATE = frozenset({"done", "tombstoned", "cancelling", "quarantined"})
"""producer states in which a fetch is late"""
C_LIVE = frozenset({"queued", "in_flight", "aborting", "cancelling", "revoking", "settling"})
"""consumer states of a load that has no result yet"""


StepHook = Callable[["System", "Draft", "int | None", "CoreStep"], None]
StepFilter = Callable[["System", "CoreStep"], bool]
StateHook = Callable[["System", "State"], None]
StepCheck = tuple[StepHook, "StepFilter | None", "tuple[str, ...] | None", "tuple[str, ...]"]
StateReads = Callable[["State"], Hashable]


@attrs.frozen
class Property:
    """One property of the registry."""

    name: str
    """the name the report uses (the spec's, where the spec has one)"""
    covers: tuple[str, ...]
    """the spec ``[properties]`` it checks (all or part of)"""
    producer_step: StepHook | None = None
    consumer_step: StepHook | None = None
    when: StepFilter | None = None
    """the core steps the step hooks need to see (None: every step); the hooks run only when it holds"""
    reads: tuple[str, ...] | None = None
    """the draft's fields the step hooks read (None: not declared).  A hook's verdict, and what it
    writes, follow from the step and these fields alone, so a hook runs once per distinct step and
    value of them: with none it runs when the step's pipeline is built, and stays in it only when it
    fails there"""
    writes: tuple[str, ...] = ()
    """the draft's fields the step hooks write (history fields; each among ``reads``)"""
    state: StateHook | None = None
    state_reads: StateReads | None = None
    """the fields of a state the state hook reads, as a key (its verdict is the same on every state with
    the same key): once it passed on a key, states with that key are not checked again"""
    liveness: bool = False
    """checked by the search's completion phase (:func:`quiescent`, :func:`stuck`)"""


# ------------------------------------------------------------------------------------------------
# checkers


def deadline_armed(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """every_state_has_deadline_or_exit: after every step, a record in a state that names a timer has
    a live deadline (otherwise nothing would ever move it).  Runs on steps that leave one without."""
    raise Fail(
        "every_state_has_deadline_or_exit",
        f"{_who(system, c)}: {', '.join(step.dead_timers)}: the state names a timer but no deadline is pending, so "
        f"nothing will ever move it",
        _lane(system, c),
    )


def _leaves_a_timer_unarmed(system: System, step: CoreStep) -> bool:
    return bool(step.dead_timers)


def one_result_per_job(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """exactly_once_job_result (safety half, per step): no job gets a second result — every
    ``JobDone`` names a job still outstanding, at most once per step."""
    seen: set[int] = set()
    for eff in step.effects:
        if isinstance(eff, JobDone):
            if eff.job_id not in st.outstanding or eff.job_id in seen:
                raise Fail(
                    "exactly_once_job_result",
                    f"{_who(system, c)} reported {system.engines.describe_job(eff.job_id)} again "
                    f"(JobDone ok={eff.ok} reason={eff.reason}); it already had its result",
                    _lane(system, c),
                )
            seen.add(eff.job_id)


def jobs_held_by_live_records(system: System, g: State) -> None:
    """exactly_once_job_result (per state): a job without a result is held by a live record (so it
    will get one): a store job by a producer record in a live state, a load job by its consumer's
    record for the id, in a live state, with that job id."""
    if not g.outstanding:
        return
    summaries = system.cores.summaries
    ps = summaries[g.p]
    held: dict[int, str] = {}
    for state, jobs, *_binding in ps.producer.values():
        for j in jobs:
            held[j] = state
    engines = system.engines
    owner_of = engines.owner_of
    for job in g.outstanding:
        c, i = owner_of[job]
        if c is None:
            if job not in held or held[job] not in P_LIVE:
                where = f"held by a {held[job]} record" if job in held else "held by no record"
                raise Fail(
                    "exactly_once_job_result",
                    f"{engines.describe_job(job)} has no result and is {where}: it will never get one",
                    PRODUCER,
                )
        elif job >= 3000:  # a symmetric request's load: held by one of its rounds' loads
            kid = system.kids[i]
            loads = summaries[g.c[c]].loads
            if not any(k == kid and state in C_LIVE and j == job for (k, _r), (state, j) in loads.items()):
                raise Fail(
                    "exactly_once_job_result",
                    f"{engines.describe_job(job)} has no result but no live load of {system.cnames[c]}'s rounds of "
                    f"{kid} holds it ({ {r: st for (k, r), (st, _j) in loads.items() if k == kid} })",
                    system.lanes[c],
                )
        else:
            kid = system.kids[i]
            rec = summaries[g.c[c]].consumer.get(kid)
            if rec is None or rec[0] not in C_LIVE or rec[2] != job:
                state = rec[0] if rec else "absent"
                raise Fail(
                    "exactly_once_job_result",
                    f"{engines.describe_job(job)} has no result but {system.cnames[c]}'s record for {kid} is {state}",
                    system.lanes[c],
                )


"""the producer summary of an id without a record"""


def _pstate(summary: Summary, kid: str) -> str:
    return summary.producer.get(kid, _NO_REC)[0]


def blocks_only_when_serving(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_bytes_for_tombstoned: the producer emits ``SendBlocks`` only on a parked/awaiting ->
    serving step of that id (never for a tombstoned, done, pruned or unknown id)."""
    for eff in step.effects:
        if isinstance(eff, SendBlocks) and not eff.transfer:  # a served round's: no_block_after_release
            before = _pstate(step.pre, eff.kv_request_id)
            after = _pstate(step.post, eff.kv_request_id)
            if before not in ("parked", "awaiting") or after != "serving":
                raise Fail(
                    "no_bytes_for_tombstoned",
                    f"the producer sent blocks for {eff.kv_request_id} on a {before} -> {after} step "
                    f"(blocks are sent only on parked/awaiting -> serving)",
                    _lane(system, c),
                )


def late_fetch_answered(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """late_fetch_one_rtt: a fetch that passes the session gate for an id that is done, tombstoned,
    cancelling, quarantined, or ended and no longer retained (``retired``) is answered
    ``transfer_done(fail)`` in the step that receives it — except a duplicate of the very fetch a
    cancelling or quarantined id is bound to, whose terminal answer waits for the data plane's
    release (no write may land after it) — and except a fetch of a round the session's round
    ledger already holds answered or below the consumer's watermark (a duplicate of a fetch that
    was answered, or one overtaken: dropped unanswered, decision I11; the consumer has or will
    have the first copy's answer).  Runs on steps that receive a fetch."""
    for env in _read(system, step):
        if env.kind != "fetch" or getattr(env.msg, "offered", False):  # an offered round's fetch goes to serve
            continue
        sess = step.pre.sessions.get(env.src)
        gated = sess is not None and sess[0] == "ready" and sess[1] == env.gen
        kid = env.kv_request_id
        before, _jobs, peer, rnd = step.pre.producer.get(kid, _NO_REC)
        own = (peer, rnd) == (env.src, env.round) and before in ("cancelling", "quarantined")
        low, answered = step.pre.rounds.get(env.src, (0, ()))
        if env.round < low or env.round in answered:
            continue
        if gated and not own and (before in P_LATE or st.retired[system.kindex[kid]]):
            answered = any(
                type(e) is Send
                and type(e.msg) is wm.TransferDone
                and not e.msg.ok
                and (e.peer, e.msg.kv_request_id, e.msg.round) == (env.src, kid, env.round)
                for e in step.effects
            )
            if not answered:
                after = _pstate(step.post, kid)
                why = before if before in P_LATE else "ended (retired) but no longer retained"
                raise Fail(
                    "late_fetch_one_rtt",
                    f"a fetch for {kid} (round {env.round}) from {env.src} reached the producer while {kid} was "
                    f"{why}; it was not answered transfer_done(fail) in the same step (-> {after})",
                    _lane(system, c),
                )


def _receives(*kinds: str) -> StepFilter:
    """A ``when`` filter: the step reads a message of one of ``kinds``."""

    def receives(system: System, step: CoreStep) -> bool:
        return any(env.kind in kinds for env in _read(system, step))

    return receives


def ended_ids_stay_ended(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """tombstoned_never_reparks: an id that ended (tombstoned, done, or dropped without a tombstone)
    is never parked, awaiting or serving again until it was pruned from done/tombstoned.

    Keeps the history field ``retired`` (per id: ended and not pruned since), which
    :func:`late_fetch_answered` reads too."""
    pre, post = step.pre, step.post
    for i, kid in enumerate(system.kids):
        before = _pstate(pre, kid)
        after = _pstate(post, kid)
        if before == after:
            continue
        if after in ("parked", "awaiting", "serving") and st.retired[i]:
            raise Fail(
                "tombstoned_never_reparks",
                f"{kid} ended earlier and was not pruned through its tombstone, yet it went {before} -> {after}",
                _lane(system, c),
            )
        if after in P_RETAINED:
            st.retired = put(st.retired, i, True)
        elif before in P_RETAINED and after == "absent":
            st.retired = put(st.retired, i, False)  # pruned by its deadline or the count cap: the id is fresh again
        elif before in P_LIVE and after == "absent":
            st.retired = put(st.retired, i, True)  # ended without a tombstone (never legitimate; see above)


def _moves_a_producer_id(system: System, step: CoreStep) -> bool:
    pre, post = step.pre, step.post
    return any(_pstate(pre, kid) != _pstate(post, kid) for kid in system.kids)


def deadline_after_input(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """input_before_deadline: when a deadline falls due while messages that concern it (naming
    its id, or from its session's peer) wait unread in the core's sockets, the shell's tick —
    :func:`kvtier.lifecycle.driver.drive`, run on the real core — fires no deadline before it has
    applied them (the core it drives notes any ``fire`` that found a deadline due while one of
    them was unapplied: ``CoreStep.early``)."""
    if step.early:
        key = step.inp[2]
        raise Fail(
            "input_before_deadline",
            f"a deadline of {_who(system, c)}'s record {key} fired while a message about it had arrived in "
            f"{_who(system, c)}'s socket and was not read yet: the deadline beat input that came first",
            _lane(system, c),
        )


def _fires(system: System, step: CoreStep) -> bool:
    return step.inp[0] == "fire" and bool(step.inp[-1])


def binding_messages_keep_to_their_life(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """lives_never_mix: a consumer message that refers to a binding — a ``receipt``, an
    ``abort_fetch`` of a round that fetched — changes the producer's record of the id only if it
    names that record's current binding (peer, round).  Runs on steps that read one."""
    cores = system.cores
    for env in _read(system, step):
        if env.kind not in ("receipt", "abort_fetch") or (env.kind == "abort_fetch" and not env.fetched):
            continue
        kid = env.kv_request_id
        before = cores.precords(step.pre_snap).get(("producer", kid))
        after = cores.precords(step.snap).get(("producer", kid))
        if before == after:
            continue
        state, _jobs, peer, rnd = step.pre.producer.get(kid, _NO_REC)
        if (peer, rnd) != (env.src, env.round):
            raise Fail(
                "lives_never_mix",
                f"{env.kind} of {env.src} round {env.round} changed {kid} ({state} -> {_pstate(step.post, kid)}), but "
                + (f"that life is bound to {peer} round {rnd}" if peer is not None and rnd >= 0
                   else "that life is not bound"),
                PRODUCER,
            )


def retained_within_cap(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """bounded_bookkeeping: the producer never retains more than ``tombstone_max`` done/tombstoned ids.
    Runs on steps that leave more."""
    raise Fail(
        "bounded_bookkeeping",
        f"the producer retains {step.post.retained} done/tombstoned ids, more than tombstone_max="
        f"{system.b.tombstone_max}",
        _lane(system, c),
    )


def _over_the_cap(system: System, step: CoreStep) -> bool:
    return step.post.retained > system.b.tombstone_max


def _emits(effect: type) -> StepFilter:
    """A ``when`` filter: the step emits an ``effect``."""

    def emits(system: System, step: CoreStep) -> bool:
        return effect in step.types

    return emits


def quiescent(system: System, g: State) -> bool:
    """no_stuck_ids' goal: every job has its result, the data plane references nothing and has no
    revocation to confirm, no producer record is live (:data:`P_LIVE`), no consumer load is live
    (:data:`C_LIVE`); on the symmetric path also no engine pin is held, no serve record is left,
    no round's load is live and no probe waits for its peer (collecting, probing)."""
    if g.outstanding or g.transfers or g.revokes or g.pins:
        return False
    summaries = system.cores.summaries
    ps = summaries[g.p]
    if ps.serve or any(r[0] in P_LIVE for r in ps.producer.values()):
        return False
    for sid in g.c:
        cs = summaries[sid]
        if any(r[0] in C_LIVE for r in cs.consumer.values()) or any(r[0] in C_LIVE for r in cs.loads.values()):
            return False
        if any(r[0] in ("collecting", "probing") for r in cs.probe.values()):
            return False
    return True


def stuck(system: System, g: State) -> list[tuple[str, str]]:
    """Why ``g`` is not quiescent: (lane, text) per job, record and transfer that is not done."""
    engines = system.engines
    items = [(engines.engine_lane(job), f"{engines.describe_job(job)} never gets a result") for job in sorted(g.outstanding)]
    for kid, (s, *_rest) in sorted(system.cores.summaries[g.p].producer.items()):
        if s in P_LIVE:
            items.append((PRODUCER, f"producer {kid} stays {s}"))
    for c, sid in enumerate(g.c):
        for kid, r in sorted(system.cores.summaries[sid].consumer.items()):
            if r[0] in C_LIVE:
                items.append((system.lanes[c], f"{system.cnames[c]} {kid} stays {r[0]}"))
    for key, (s, pins, _found) in sorted(system.cores.summaries[g.p].serve.items()):
        items.append((PRODUCER, f"producer serve {key} stays {s}" + (f" holding pins {list(pins)}" if pins else "")))
    items.extend((PRODUCER, f"the engine's pin {p[0]} ({p[1]} r{p[2]}) is never released") for p in g.pins)
    for c, sid in enumerate(g.c):
        cs = system.cores.summaries[sid]
        for (kid, rnd), (s, _job) in sorted(cs.loads.items()):
            if s in C_LIVE:
                items.append((system.lanes[c], f"{system.cnames[c]} {kid} round {rnd}'s load stays {s}"))
        for kid, (s, *_rest) in sorted(cs.probe.items()):
            if s in ("collecting", "probing"):
                items.append((system.lanes[c], f"{system.cnames[c]} probe {kid} stays {s}"))
    items.extend(
        (NETWORK, f"the data plane never releases the transfer of {t[1]} r{t[2]} to {system.cnames[t[0]]}")
        for t in g.transfers
    )
    items.extend(
        (system.lanes[c], f"{system.cnames[c]}'s data plane never confirms the revocation of the producer's access")
        for c in g.revokes
    )
    return items


# ------------------------------------------------------------------------------------------------
# the registry

REGISTRY: tuple[Property, ...] = (
    Property(
        "every_state_has_deadline_or_exit", ("every_state_has_deadline_or_exit",),
        producer_step=deadline_armed, consumer_step=deadline_armed, when=_leaves_a_timer_unarmed,
    ),
    Property(
        "input_before_deadline", ("input_before_deadline",),
        producer_step=deadline_after_input, consumer_step=deadline_after_input, when=_fires, reads=(),
    ),
    Property(
        "exactly_once_job_result", ("exactly_once_job_result",),
        producer_step=one_result_per_job, consumer_step=one_result_per_job, when=_emits(JobDone),
        reads=("outstanding",),
        state=jobs_held_by_live_records, state_reads=attrgetter("outstanding", "p", "c"),
    ),
    Property(
        "no_block_returned_while_referenced", ("no_block_returned_while_referenced",),
        producer_step=no_store_result_while_referenced, when=_emits(JobDone), reads=("transfers",),
    ),
    Property(
        "no_success_without_receipt", ("no_success_without_receipt",),
        producer_step=success_needs_receipt_p, consumer_step=success_needs_receipt_c, when=receipt_or_store_result,
        reads=("receipted", "corrupted"), writes=("receipted",),
    ),
    Property(
        "lives_never_mix", ("lives_never_mix",),
        producer_step=binding_messages_keep_to_their_life, when=_receives("receipt", "abort_fetch"), reads=(),
    ),
    Property(
        "no_bytes_for_tombstoned", ("no_bytes_for_tombstoned",),
        producer_step=blocks_only_when_serving, when=_emits(SendBlocks), reads=(),
    ),
    Property("late_fetch_one_rtt", ("late_fetch_one_rtt",), producer_step=late_fetch_answered, when=_receives("fetch"),
             reads=("retired",)),
    Property(
        "tombstoned_never_reparks", ("tombstoned_never_reparks",),
        producer_step=ended_ids_stay_ended, when=_moves_a_producer_id, reads=("retired",), writes=("retired",),
    ),
    Property(
        "no_write_after_terminal", ("no_write_after_terminal",),
        consumer_step=no_write_after_terminal, when=lands_or_fails_a_load, reads=("transfers",),
    ),
    Property("bounded_bookkeeping", ("bounded_bookkeeping",), producer_step=retained_within_cap, when=_over_the_cap),
    # the symmetric path (decision M14)
    Property(
        "pin_released_once", ("pin_released_once",),
        producer_step=pins_released_once, when=_emits(ReleasePins), reads=("pins", "transfers"),
        state=pins_held_by_records,
        state_reads=attrgetter("pins", "p"),
    ),
    Property("no_hit_without_pin", ("no_hit_without_pin",), producer_step=hits_pinned, when=replies_probe,
             reads=("pins",)),
    Property(
        "no_block_after_release", ("no_block_after_release",), producer_step=served_blocks_pinned, when=_emits(SendBlocks),
        reads=("pins",),
    ),
    Property("probe_answered_in_bound", ("probe_answered_in_bound",), state=retry_in_bound,
             state_reads=attrgetter("c")),
    # honest results, no live producer condemned (decisions I21-I24; tools/modelcheck/honest.py)
    Property("partial_keys_verified", ("partial_keys_verified",), consumer_step=honest.partial_keys_verified,
             when=honest.reports_a_failed_load, reads=()),
    Property("failed_keys_miss", ("failed_keys_miss",), consumer_step=honest.failed_keys_miss,
             when=honest.reports_a_failed_load, reads=()),
    Property("instance_fate_proven", ("instance_fate_proven",), state=honest.gone_only_on_proof,
             state_reads=attrgetter("c")),
    Property("release_never_dropped", ("release_never_dropped",), producer_step=honest.release_never_dropped,
             when=honest.reads_a_release, reads=()),
    # From every explored state, a quiescent state is reachable by completion steps only (see
    # .search): every fetch is answered, every job gets its result, no id is stuck.
    Property("no_stuck_ids", ("fetch_always_answered", "exactly_once_job_result"), liveness=True),
)
"""Every property, in the order their hooks run on a step."""

PROPERTIES: tuple[str, ...] = (
    "exactly_once_job_result",
    "every_state_has_deadline_or_exit",
    "tombstoned_never_reparks",
    "no_bytes_for_tombstoned",
    "late_fetch_one_rtt",
    "no_write_after_terminal",
    "bounded_bookkeeping",
    "no_block_returned_while_referenced",
    "no_success_without_receipt",
    "input_before_deadline",
    "lives_never_mix",
    "pin_released_once",
    "no_hit_without_pin",
    "no_block_after_release",
    "probe_answered_in_bound",
    "partial_keys_verified",
    "failed_keys_miss",
    "instance_fate_proven",
    "release_never_dropped",
    "no_stuck_ids",
)
"""Every property's name, in the order the report lists them."""

if sorted(PROPERTIES) != sorted(p.name for p in REGISTRY):  # pragma: no cover - caught at import
    raise RuntimeError("modelcheck.properties: PROPERTIES and REGISTRY name different properties")

PRODUCER_STEP_CHECKS: tuple[StepCheck, ...] = tuple(
    (p.producer_step, p.when, p.reads, p.writes) for p in REGISTRY if p.producer_step
)
"""(hook, when, reads, writes) of every property that checks producer steps, in registry order"""
CONSUMER_STEP_CHECKS: tuple[StepCheck, ...] = tuple(
    (p.consumer_step, p.when, p.reads, p.writes) for p in REGISTRY if p.consumer_step
)
"""(hook, when, reads, writes) of every property that checks consumer steps, in registry order"""
STATE_CHECKS: tuple[tuple[StateHook, StateReads | None], ...] = tuple(
    (p.state, p.state_reads) for p in REGISTRY if p.state
)
"""(hook, the fields it reads) of every property that checks states, in registry order"""
