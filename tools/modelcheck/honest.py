"""Checkers of the properties that keep every result true and no live producer condemned
(decisions I21-I24); registered in :data:`.properties.REGISTRY` beside the others.

* ``partial_keys_verified``: a failed load's ``successful_keys`` are exactly the verified prefix of
  its fetch (every position from the first that landed and matched its digest: the consumer's
  shell answered each landing in the model, ok or corrupt).
* ``failed_keys_miss``: once a symmetric round's load failed, every key of it outside its
  successful prefix is held MISS for the request's life (in the probe's miss set: a lookup of a key
  the probe merely forgot would open a new round for it), so the engine recomputes it instead of
  probing, being offered and loading it again.
* ``instance_fate_proven``: no consumer holds a producer instance gone — the model never proves one
  gone (no producer restarts, every dial connects), so a session's end alone must not.
* ``release_never_dropped``: an ``abort_fetch`` (or a fetch naming no keys) that reaches the
  producer on a session of its generation that is ready or still attaching is applied, never
  dropped by the session gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.modelcheck.checking import Fail, lane_of, read, who
from kvtier.lifecycle.effects import Ignored, JobDone

if TYPE_CHECKING:
    from tools.modelcheck.encoding import CoreStep, Summary
    from tools.modelcheck.state import Draft, State
    from tools.modelcheck.system import System

__all__ = ["failed_keys_miss", "gone_only_on_proof", "partial_keys_verified", "release_never_dropped",
           "reads_a_release", "reports_a_failed_load"]


def _failed_loads(system: System, c: int, step: CoreStep) -> list[tuple[JobDone, str, int]]:
    """(result, id, round) of every live load job (PD or a symmetric round's) this step fails."""
    out = []
    pre = step.pre
    for eff in step.effects:
        if type(eff) is not JobDone or eff.ok:
            continue
        hit = next(((kid, rnd) for (kid, rnd), (_s, job) in pre.loads.items() if job == eff.job_id), None)
        if hit is None:
            hit = next(((kid, r[1]) for kid, r in pre.consumer.items() if r[2] == eff.job_id), None)
        if hit is not None:
            out.append((eff, *hit))
    return out


def _fetched(step: CoreStep, kid: str, rnd: int) -> tuple[tuple[bytes, ...], int]:
    """The load's keys and verified prefix: after the step when its record is still there (a
    block landed in the same step counts), else before it."""
    got = step.post.fetched.get((kid, rnd))
    return got if got is not None else step.pre.fetched.get((kid, rnd), ((), 0))


def partial_keys_verified(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """partial_keys_verified: a failed load reports as ``successful_keys`` exactly the keys of
    its verified prefix (None when there is none)."""
    for eff, kid, rnd in _failed_loads(system, c, step):  # type: ignore[arg-type]
        keys, n = _fetched(step, kid, rnd)
        want = keys[:n] or None
        if eff.successful_keys != want:
            raise Fail("partial_keys_verified", f"{who(system, c)} reported its load of {kid} round {rnd} failed with "
                       f"successful_keys {eff.successful_keys}, but only {want} is its verified prefix",
                       lane_of(system, c))


def failed_keys_miss(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """failed_keys_miss: after a symmetric round's load failed, each of its keys outside the
    successful prefix answers MISS (a failed key is never probed and loaded again)."""
    post: Summary = step.post
    for eff, kid, rnd in _failed_loads(system, c, step):  # type: ignore[arg-type]
        if (kid, rnd) not in step.pre.loads:
            continue  # a PD load: its record answers load_ended, not the probe
        keys, _n = _fetched(step, kid, rnd)
        kept = set(eff.successful_keys or ())
        missed = post.missed.get(kid)
        if missed is None:
            continue  # the request is over: nothing will look it up again
        for k in keys:
            if k not in kept and k not in missed:
                now = post.answers.get((kid, k), "miss")
                raise Fail("failed_keys_miss", f"{who(system, c)}'s load of {kid} round {rnd} failed, yet "
                           f"{k.decode(errors='replace')} is not held MISS for the request (a lookup answers {now} "
                           f"now, and the next one probes it again: the engine would load it again instead of "
                           f"computing it)", lane_of(system, c))


def gone_only_on_proof(system: System, g: State) -> None:
    """instance_fate_proven: no consumer holds a producer instance gone (nothing here proves one)."""
    for c, sid in enumerate(g.c):
        gone = system.cores.summaries[sid].gone
        if gone:
            raise Fail("instance_fate_proven", f"{system.cnames[c]} holds producer instance(s) {list(gone)} gone, but "
                       "no dial was refused and no producer restarted: a session's end alone proves nothing",
                       system.lanes[c])


def release_never_dropped(system: System, st: Draft, c: int | None, step: CoreStep) -> None:
    """release_never_dropped: a release read on a session of its generation that is ready or
    attaching reaches the producer (the session gate drops nothing of it)."""
    for env in read(system, step):
        if not _is_release(env):
            continue
        sess = step.pre.sessions.get(env.src)
        if sess is None or sess[1] != env.gen or sess[0] not in ("attaching", "ready"):
            continue
        dropped = [e for e in step.effects if type(e) is Ignored and e.machine == "session"
                   and str(e.event) in ("message", "release")]
        if dropped:
            raise Fail("release_never_dropped", f"the producer dropped {env.kind} of {env.kv_request_id} from "
                       f"{env.src} while its session was {sess[0]}: its blocks wait for the reap instead of one "
                       f"round trip", lane_of(system, c))


def _is_release(env: object) -> bool:
    kind = env.kind  # type: ignore[attr-defined]
    return kind == "abort_fetch" or (kind == "fetch" and not env.keys)  # type: ignore[attr-defined]


def reads_a_release(system: System, step: CoreStep) -> bool:
    """A ``when`` filter: the step reads an abort_fetch or an empty fetch."""
    return any(_is_release(env) for env in read(system, step))


def reports_a_failed_load(system: System, step: CoreStep) -> bool:
    """A ``when`` filter: the step reports a failed job."""
    return JobDone in step.types and any(type(e) is JobDone and not e.ok for e in step.effects)
