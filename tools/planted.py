"""Planted-bug variants of the lifecycle core, to test the tests (style anchors, rule 14).

Each entry of :data:`PLANTED` is a context manager factory.  Inside ``with PLANTED[name]():`` the
code that runs behaves with one realistic bug (each docstring says which, and the bug scenario it
comes from); on exit it is restored exactly.  Most patch the machine classes
(:class:`~kvtier.lifecycle.producer.ProducerMachine`,
:class:`~kvtier.lifecycle.consumer.ConsumerMachine`: their table and effect builders), so build
the cores **inside** the ``with`` block.  One, ``deadlines_before_input``, plants the first
release's tick order in :func:`kvtier.lifecycle.driver.drive` itself — the function the shell,
the model checker and the stateful suite all call — by swapping the function's code, so every
reference to it (``from ... import drive`` included) runs the bug.

The stateful suite (``tests/stateful/test_planted.py``) and the model checker
(``python -m tools check --bug NAME``, ``tests/model/test_modelcheck.py``) must find every one of them;
if a change to the tests stops finding one, the tests got weaker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from types import MappingProxyType
from typing import Any

from kvtier.lifecycle._table import (
    TRANSITION,
    Branch,
    ConsumerEffect,
    ConsumerEvent,
    ConsumerGuard,
    ConsumerState,
    ProducerEffect,
    ProducerEvent,
    ProducerState,
    Reason,
    Rule,
)
from kvtier.lifecycle.consumer import ConsumerMachine
from kvtier.lifecycle.effects import JobDone, Send, SendBlocks
from kvtier.lifecycle.producer import ProducerMachine
from kvtier.lifecycle.producer_records import RETAINED, ProducerRecord, RetainedRecord

__all__ = ["PLANTED", "PROFILE_OF"]


@contextmanager
def _patched(cls: type, name: str, value: Any) -> Iterator[None]:
    had = name in cls.__dict__
    old = cls.__dict__.get(name)
    setattr(cls, name, value)
    try:
        yield
    finally:
        if had:
            setattr(cls, name, old)
        else:
            delattr(cls, name)


def _table(cls: type, changes: dict[tuple[Any, Any], Rule]) -> AbstractContextManager[None]:
    table = dict(cls.TABLE)
    for key in changes:
        if key not in table:  # pragma: no cover - guards against a renamed state or event
            raise KeyError(f"planted bug patches a pair the table does not have: {key}")
    table.update(changes)
    return _patched(cls, "TABLE", MappingProxyType(table))


def _rule(*branches: Branch) -> Rule:
    return Rule(TRANSITION, tuple(branches), None)


def _revive_retained(method: str) -> AbstractContextManager[None]:
    """The bugs below treat a tombstoned id as live on one input (``method``, taking an input
    with ``kv_request_id``): its lookup hands out a full record again (the correct core keeps
    only a RetainedRecord, which cannot be bound or parked).  An id still retained afterwards is
    slimmed back, so only the planted rule changes what the core does."""
    original = getattr(ProducerMachine, method)

    def wrapped(self: ProducerMachine, inp: Any, now: float, out: list) -> None:
        key = inp.kv_request_id
        rec = self.records.get(key)
        if isinstance(rec, RetainedRecord):
            live = ProducerRecord(key)
            live.state, live.reason, live.timer, live.tseq, live.consumer = (
                rec.state, rec.reason, rec.timer, rec.tseq, rec.consumer)
            self.records[key] = live
        original(self, inp, now, out)
        rec = self.records.get(key)
        if rec is not None and rec.state in RETAINED and not isinstance(rec, RetainedRecord):
            self.records[key] = RetainedRecord(rec)

    return _patched(ProducerMachine, method, wrapped)


@contextmanager
def bind_ignores_tombstone() -> Iterator[None]:
    """A fetch for a tombstoned id binds and starts a transfer from the freed blocks (B01)."""

    def start_transfer(self: ProducerMachine, rec: Any, inp: Any, reason: Any, now: float, out: list) -> None:
        # the record's block map was cleared when the jobs failed: send whatever the slots hold now
        out.append(SendBlocks(rec.peer, rec.key, rec.round, tuple(rec.blocks.get(k, 0) for k in rec.demand)))

    with ExitStack() as stack:
        stack.enter_context(
            _table(
                ProducerMachine,
                {
                    (ProducerState.TOMBSTONED, ProducerEvent.FETCH): _rule(
                        Branch(None, ProducerState.SERVING, (ProducerEffect.BIND, ProducerEffect.START_TRANSFER), None)
                    )
                },
            )
        )
        stack.enter_context(_patched(ProducerMachine, "effect_start_transfer", start_transfer))
        stack.enter_context(_revive_retained("fetch"))
        yield


@contextmanager
def dup_ack_releases_twice() -> Iterator[None]:
    """The consumer reports a load job again when a transfer_done or abort_ack arrives for a load
    that already ended (a duplicated message releases the slots twice)."""

    def report_ok(self: ConsumerMachine, rec: Any, inp: Any, reason: Any, now: float, out: list) -> None:
        out.append(JobDone(rec.job_id, True, None))  # job_id is not cleared

    def fail_job(self: ConsumerMachine, rec: Any, inp: Any, reason: Any, now: float, out: list) -> None:
        if rec.job_id is not None:
            out.append(JobDone(rec.job_id, False, reason))  # job_id is not cleared

    again_ok = _rule(Branch(None, ConsumerState.LOADED, (ConsumerEffect.REPORT_LOAD_OK,), None))
    again_fail = _rule(Branch(None, ConsumerState.FAILED, (ConsumerEffect.FAIL_JOB,), None))
    with ExitStack() as stack:
        stack.enter_context(
            _table(
                ConsumerMachine,
                {
                    (ConsumerState.LOADED, ConsumerEvent.TRANSFER_DONE): again_ok,
                    (ConsumerState.FAILED, ConsumerEvent.TRANSFER_DONE): again_fail,
                    (ConsumerState.FAILED, ConsumerEvent.ABORT_ACK): again_fail,
                },
            )
        )
        stack.enter_context(_patched(ConsumerMachine, "effect_report_load_ok", report_ok))
        stack.enter_context(_patched(ConsumerMachine, "effect_fail_job", fail_job))
        yield


@contextmanager
def reap_forgets_jobs() -> Iterator[None]:
    """The reap deadline tombstones a parked id without failing its store jobs: the engine never
    learns it may release the blocks (B16)."""
    with _table(
        ProducerMachine,
        {
            (ProducerState.PARKED, ProducerEvent.REAP_DEADLINE): _rule(
                Branch(None, ProducerState.TOMBSTONED, (), Reason.REAPED)
            )
        },
    ):
        yield


@contextmanager
def prune_before_retention() -> Iterator[None]:
    """The reap deadline deletes the record at once instead of tombstoning it, so a late fetch
    waits for blocks and a late store parks again (B01/B03 with the tombstone retention gone)."""
    with _table(
        ProducerMachine,
        {
            (ProducerState.PARKED, ProducerEvent.REAP_DEADLINE): _rule(
                Branch(None, ProducerState.PRUNED, (ProducerEffect.FAIL_JOBS,), Reason.REAPED)
            )
        },
    ):
        yield


@contextmanager
def write_after_abort() -> Iterator[None]:
    """Block data that arrives while the load is aborting is still written into the slots, although
    the load may be reported failed (and its slots reused) any moment (B08)."""
    with _table(
        ConsumerMachine,
        {
            (ConsumerState.ABORTING, ConsumerEvent.BLOCK_DATA): _rule(
                Branch(ConsumerGuard.BLOCKS_VALID, ConsumerState.ABORTING, (ConsumerEffect.LAND_BLOCKS,), None),
                Branch(None, ConsumerState.ABORTING, (ConsumerEffect.NOTE_STALE,), None),
            )
        },
    ):
        yield


@contextmanager
def store_reparks_tombstone() -> Iterator[None]:
    """A store for a tombstoned id parks its blocks again, pinning memory for an id that can never
    be fetched (B03)."""
    with _table(
        ProducerMachine,
        {
            (ProducerState.TOMBSTONED, ProducerEvent.STORE): _rule(
                Branch(None, ProducerState.PARKED, (ProducerEffect.PARK_BLOCKS,), None)
            )
        },
    ), _revive_retained("store"):
        yield


@contextmanager
def abort_never_gives_up() -> Iterator[None]:
    """When abort_ack does not come, the consumer re-arms its abort deadline instead of failing the
    load, so one lost abort (or abort_ack) keeps the load and its slots forever (B31, B09)."""
    original = ConsumerMachine.effect_note_stale

    def note_stale(self: ConsumerMachine, rec: Any, inp: Any, reason: Any, now: float, out: list) -> None:
        if inp is None:  # the abort_ack deadline: wait another round instead of giving up
            self.restart_timer(rec, now)
            return
        original(self, rec, inp, reason, now, out)

    with ExitStack() as stack:
        stack.enter_context(
            _table(
                ConsumerMachine,
                {
                    (ConsumerState.ABORTING, ConsumerEvent.ABORT_ACK_DEADLINE): _rule(
                        Branch(None, ConsumerState.ABORTING, (ConsumerEffect.NOTE_STALE,), None)
                    )
                },
            )
        )
        stack.enter_context(_patched(ConsumerMachine, "effect_note_stale", note_stale))
        yield


@contextmanager
def cancel_deadline_returns_blocks() -> Iterator[None]:
    """An earlier kvtier's B26/B32 bug: when a cancelled transfer is not released in time, the
    store jobs fail (the engine may reuse the blocks) while the data plane still references them;
    the consumer then lands the reused bytes."""
    with _table(
        ProducerMachine,
        {
            (ProducerState.CANCELLING, ProducerEvent.CANCEL_DEADLINE): _rule(
                Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_DONE_FAIL), None)
            ),
            (ProducerState.CONFIRMED, ProducerEvent.CANCEL_DEADLINE): _rule(
                Branch(None, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS,), None)
            ),
        },
    ):
        yield


@contextmanager
def success_without_receipt() -> Iterator[None]:
    """An earlier kvtier's "sent to libzmq is delivered": the store jobs succeed as soon as the data
    plane released the blocks, although the consumer never confirmed receipt (it died after 8 of
    200 blocks)."""
    with _table(
        ProducerMachine,
        {
            (ProducerState.SERVING, ProducerEvent.TRANSFER_RELEASED): _rule(
                Branch(None, ProducerState.DONE, (ProducerEffect.COMPLETE_JOBS, ProducerEffect.REPLY_DONE_OK), None)
            )
        },
    ):
        yield


@contextmanager
def abort_ignores_round() -> Iterator[None]:
    """An earlier kvtier's B14 bug: an abort for a round that fetched an earlier life of a reused id
    still tombstones the id's new, unbound life."""
    with _table(
        ProducerMachine,
        {
            (ProducerState.PARKED, ProducerEvent.ABORT_FETCH): _rule(
                Branch(None, ProducerState.TOMBSTONED, (ProducerEffect.FAIL_JOBS, ProducerEffect.REPLY_ABORT_ACK),
                       Reason.ABORTED)
            )
        },
    ):
        yield


def _drive_deadlines_first(core: Any, inputs: Any, now: float, *, deadlines_at: float | None, perform: Any) -> None:
    # runs as kvtier.lifecycle.driver.drive (its code swapped in): ``settle`` is the driver's
    settle(core, core.fire(now), now, perform)  # noqa: F821 - resolved in the driver's globals
    for inp in inputs:
        settle(core, core.handle(inp, now), now, perform)  # noqa: F821


@contextmanager
def deadlines_before_input() -> Iterator[None]:
    """An earlier kvtier's shell (B24): a tick fires the deadlines due at "now" before it applies
    the input it read, so one may fire while a message that arrived before it fell due is still
    unapplied — a fetch that queued during a stall meets an id reaped a moment ago.  Planted in
    :func:`kvtier.lifecycle.driver.drive` (its code object is swapped for the buggy one)."""
    from kvtier.lifecycle import driver

    fn = driver.drive
    original = fn.__code__
    fn.__code__ = _drive_deadlines_first.__code__
    try:
        yield
    finally:
        fn.__code__ = original


@contextmanager
def serve_releases_pins_at_cancel() -> Iterator[None]:
    """The serve machine releases a round's pins the moment it gives the transfer up (the consumer
    aborted, the transfer deadline hit), while the data plane may still read the blocks, and
    again when the plane reports the release: a pin released twice, the first time under a send
    (decision Y11: a pin is an engine job, released exactly once; I1: nothing is returned while
    the plane references it)."""
    from kvtier.lifecycle.effects import ReleasePins
    from kvtier.lifecycle.serve import ServeMachine

    original = ServeMachine.effect_cancel_transfer

    def cancel(self: Any, rec: Any, inp: Any, reason: Any, now: float, out: list) -> None:
        original(self, rec, inp, reason, now, out)
        if rec.pins:  # released now, and kept: released again once the plane lets go
            out.append(ReleasePins(tuple(rec.pins), False, reason or Reason.TRANSFER_FAILED))

    with _patched(ServeMachine, "effect_cancel_transfer", cancel):
        yield


@contextmanager
def reply_hits_unpinned() -> Iterator[None]:
    """The serve machine's probe reply says hit for every key the engine did not report missing
    (pending keys included), though only found keys are pinned: the consumer loads blocks nobody
    holds for it."""
    from kvtier.lifecycle.serve import ServeMachine
    from kvtier.wire import messages as wm

    def reply(self: Any, rec: Any, inp: Any, reason: Any, now: float, out: list) -> None:
        keys = [k for k in rec.keys if k not in rec.answered]
        if not keys:
            return
        rec.answered.update(keys)
        out.append(Send(rec.peer, wm.ProbeReply(gen=rec.gen, kv_request_id=rec.kv_request_id, round=rec.round,
                                                keys=keys, hits=[k not in rec.missing for k in keys])))

    with _patched(ServeMachine, "effect_reply_probe", reply):
        yield


@contextmanager
def partial_keys_unverified() -> Iterator[None]:
    """A failed load reports as ``successful_keys`` every key whose landing started — unchecked,
    failed its digest check, or after a hole — as the landing flag before decision I21 did: the
    engine keeps blocks whose slots hold the wrong bytes (decision I21)."""
    from kvtier.lifecycle.blockstates import BlockState

    def every_started(self: ConsumerMachine, rec: Any) -> tuple:
        if not self.integrity:
            return None, ()
        idx = [i for i in range(len(rec.landed)) if rec.landed[i] is not BlockState.EMPTY]
        if not idx:
            return None, ()
        keys = tuple(rec.keys[i] for i in idx)
        return keys, (tuple((rec.slots[i], rec.digests[i]) for i in idx) if self._one_sided else ())

    with _patched(ConsumerMachine, "_verified_prefix", every_started):
        yield


@contextmanager
def failed_keys_not_missed() -> Iterator[None]:
    """A symmetric round's failed load tells its probe that every key landed, so none answers MISS:
    the engine looks them up again, the peer offers them again, the load fails again — a request
    that never recomputes (decision I22)."""
    from kvtier.lifecycle.notes import RoundLoadEnded
    from kvtier.lifecycle.probe import RoundLoads

    def ended(self: Any, rec: Any, ok: bool) -> None:
        self._notes.append(RoundLoadEnded(rec.kv_request_id, rec.round, ok, rec.keys, rec.keys))

    with _patched(RoundLoads, "_ended", ended):
        yield


@contextmanager
def disconnect_condemns_instance() -> Iterator[None]:
    """A session that ends ``peer_disconnected`` marks its producer instance gone, as the third
    release did: after a transient reset every load to that live producer fails ``instance_down``
    without dialling (decision I23: only a refused dial or a restart proves an instance gone)."""
    from kvtier.lifecycle import session

    old = session.GONE
    session.GONE = old | {Reason.PEER_DISCONNECTED}
    try:
        yield
    finally:
        session.GONE = old


PLANTED: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "bind_ignores_tombstone": bind_ignores_tombstone,
    "dup_ack_releases_twice": dup_ack_releases_twice,
    "reap_forgets_jobs": reap_forgets_jobs,
    "prune_before_retention": prune_before_retention,
    "write_after_abort": write_after_abort,
    "store_reparks_tombstone": store_reparks_tombstone,
    "abort_never_gives_up": abort_never_gives_up,
    "cancel_deadline_returns_blocks": cancel_deadline_returns_blocks,
    "success_without_receipt": success_without_receipt,
    "abort_ignores_round": abort_ignores_round,
    "deadlines_before_input": deadlines_before_input,
    "serve_releases_pins_at_cancel": serve_releases_pins_at_cancel,
    "reply_hits_unpinned": reply_hits_unpinned,
    "partial_keys_unverified": partial_keys_unverified,
    "failed_keys_not_missed": failed_keys_not_missed,
    "disconnect_condemns_instance": disconnect_condemns_instance,
}
"""Planted bug name -> context manager factory (``with PLANTED[name](): ...``)."""

PROFILE_OF: dict[str, str] = {
    "serve_releases_pins_at_cancel": "symmetric",
    "reply_hits_unpinned": "symmetric",
    "failed_keys_not_missed": "symmetric",
    "disconnect_condemns_instance": "sessions",
}
"""Planted bug name -> the model-check profile that explores the code it is in, where that is not
``core`` (the symmetric path's bugs: only the ``symmetric`` profile runs the serve machine; an
instance's fate needs a session's end: ``sessions``)."""
