"""The data path's safety properties the model check proves (:mod:`.properties` registers them):
no write lands after a load's terminal answer or failure, a store job's result waits for the data
plane's release, and success needs the consumer's receipt (decisions I1, I2, I4).
"""


from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.lifecycle.effects import JobDone, LandBlocks
from tools.modelcheck.checking import NO_REC as _NO_REC
from tools.modelcheck.checking import Fail
from tools.modelcheck.checking import lane_of as _lane
from tools.modelcheck.checking import read as _read
from tools.modelcheck.checking import who as _who
from tools.modelcheck.state import put
from tools.modelcheck.trace import PRODUCER

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep
    from tools.modelcheck.state import Draft
    from tools.modelcheck.system import System

def writes_only_in_flight(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_write_after_terminal, receiver-applied half: a consumer lands block data (``LandBlocks``)
    only for a record in ``in_flight`` and only for block data of its current round."""
    read = _read(system, step)
    for eff in step.effects:
        if isinstance(eff, LandBlocks):
            load = step.pre.loads.get((eff.kv_request_id, eff.round))
            if load is not None and eff.kv_request_id not in step.pre.consumer:  # a symmetric round's load
                if load[0] != "in_flight":
                    raise Fail(
                        "no_write_after_terminal",
                        f"{_who(system, c)} landed block data for {eff.kv_request_id} round {eff.round} in slots "
                        f"{eff.slots} while the round's load was {load[0]}",
                        _lane(system, c),
                    )
                continue
            rec = step.pre.consumer.get(eff.kv_request_id)
            other = sorted(env.round for env in read if env.kind == "block_data"
                           and env.kv_request_id == eff.kv_request_id and rec is not None and env.round != rec[1])
            if rec is None or rec[0] != "in_flight" or other:
                state = rec[0] if rec else "absent"
                raise Fail(
                    "no_write_after_terminal",
                    f"{_who(system, c)} landed block data for {eff.kv_request_id} in slots {eff.slots} while its load "
                    f"was {state}" + (f" (message round {other[0]}, load round {rec[1]})" if rec and other else ""),
                    _lane(system, c),
                )


def _live_jobs(system: System, c: int, step: CoreStep, ok: bool) -> list[tuple[str, int]]:
    """(id, round) of every live load job of consumer ``c`` this step reports with result ``ok``
    (not a new job refused alone: that one never fetched)."""
    out = []
    owner_of = system.engines.owner_of
    for eff in step.effects:
        if isinstance(eff, JobDone) and eff.ok == ok and eff.job_id in owner_of:
            kid = system.kids[owner_of[eff.job_id][1]]
            rec = step.pre.consumer.get(kid)
            if rec is not None and rec[2] == eff.job_id:
                out.append((kid, rec[1]))
    return out


def fails_only_when_no_write_can_land(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_write_after_terminal, one-sided half (``one_sided``; on a receiver-applied plane nothing
    lands outside ``in_flight``, whoever still sends): a load is reported failed (its slots handed
    back) only when the producer can no longer write into them — its data plane references no
    transfer of the load's round, or the consumer's plane revoked the producer's access in this
    step (``access_revoked``), or the load's ``revoke`` deadline fell due on a plane that
    withdraws access by itself within ``revoke_timeout_s`` (``revoke_bounded``: the NIXL plane's
    per-session windows, decision N14)."""
    bounded = system.cores.settings.revoke_bounded
    for kid, rnd in _live_jobs(system, c, step, False):
        referenced = any(t[0] == c and t[1] == kid and t[2] == rnd for t in st.transfers)
        if not referenced:
            continue
        rec = step.pre.consumer.get(kid)
        if bounded and step.inp[0] == "fire" and rec is not None and rec[0] == "revoking":
            continue
        if step.inp[0] != "revoked":
            raise Fail(
                "no_write_after_terminal",
                f"{system.cnames[c]} reported its load of {kid} (round {rnd}) failed while the producer's data plane "
                f"still references the round's transfer and its access was not revoked: a write may still land",
                system.lanes[c],
            )


def no_write_after_terminal(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_write_after_terminal: both halves (:func:`writes_only_in_flight`,
    :func:`fails_only_when_no_write_can_land`)."""
    if LandBlocks in step.types:
        writes_only_in_flight(system, st, c, step)
    if JobDone in step.types and system.b.one_sided:
        fails_only_when_no_write_can_land(system, st, c, step)


def lands_or_fails_a_load(system: System, step: CoreStep) -> bool:
    return LandBlocks in step.types or (
        system.b.one_sided and any(isinstance(e, JobDone) and not e.ok for e in step.effects)
    )


def _store_jobs(system: System, step: CoreStep) -> list[tuple[JobDone, int]]:
    """Every store job result of a producer step, with the index of its id."""
    owner_of = system.engines.owner_of
    return [
        (eff, owner_of[eff.job_id][1])
        for eff in step.effects
        if isinstance(eff, JobDone) and owner_of.get(eff.job_id, (0,))[0] is None
    ]


def no_store_result_while_referenced(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_block_returned_while_referenced: a store job's result (success or failure) is reported only
    in a step where the data plane references none of the job's blocks (``State.transfers`` before
    the step: a release takes the transfer out before the producer hears of it)."""
    for eff, i in _store_jobs(system, step):
        block = eff.job_id % 1000  # the model stores chunk k of a job in pool block job % 1000
        kid = system.kids[i]
        for t in st.transfers:
            if t[1] == kid and block in t[4]:
                raise Fail(
                    "no_block_returned_while_referenced",
                    f"the producer reported {system.engines.describe_job(eff.job_id)} "
                    f"({'ok' if eff.ok else 'failed: ' + str(eff.reason)}) while the data plane still references "
                    f"its block in the transfer of {kid} r{t[2]} to {system.cnames[t[0]]}: the engine may reuse it "
                    f"under a send",
                    PRODUCER,
                )


def success_needs_receipt_p(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_success_without_receipt, producer half: a store job succeeds only after the current life's
    binding received its consumer's receipt (or its fetch named zero keys).  Keeps the history
    field ``receipted`` (per id: a receipt naming the current binding's (peer, round) was
    delivered; cleared when the id's record is pruned: a new life)."""
    read = _read(system, step)
    for env in read:
        if env.kind == "receipt":
            _state, _jobs, peer, rnd = step.pre.producer.get(env.kv_request_id, _NO_REC)
            if (peer, rnd) == (env.src, env.round):
                st.receipted = put(st.receipted, system.kindex[env.kv_request_id], True)
    empty_fetch = any(env.kind == "fetch" and not env.keys for env in read)
    for eff, i in _store_jobs(system, step):
        if eff.ok and not st.receipted[i] and not empty_fetch:
            raise Fail(
                "no_success_without_receipt",
                f"the producer reported {system.engines.describe_job(eff.job_id)} succeeded, but no receipt from the "
                f"consumer its life was bound to was delivered: nobody confirmed the blocks landed intact",
                PRODUCER,
            )
    for i, kid in enumerate(system.kids):
        if st.receipted[i] and kid not in step.post.producer:
            st.receipted = put(st.receipted, i, False)


def receipt_or_store_result(system: System, step: CoreStep) -> bool:
    if any(env.kind == "receipt" for env in _read(system, step)):
        return True
    return JobDone in step.types or any(kid in step.pre.producer and kid not in step.post.producer for kid in system.kids)


def success_needs_receipt_c(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """no_success_without_receipt, consumer half: a load succeeds only if no block of its round
    landed corrupt (``State.corrupted``, kept by :mod:`.network`'s ``corrupt`` fault)."""
    for kid, rnd in _live_jobs(system, c, step, True):
        if (c, system.kindex[kid], rnd) in st.corrupted:
            raise Fail(
                "no_success_without_receipt",
                f"{system.cnames[c]} reported its load of {kid} (round {rnd}) succeeded although a block of the round "
                f"landed corrupt",
                system.lanes[c],
            )
