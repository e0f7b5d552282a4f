"""The request forensics ring (:mod:`kvtier.forensics`) keeps its memory bounded however many
requests finish: a million finished ids leave :data:`~kvtier.forensics.CAPACITY` entries of a few
hundred bytes each, measured object by object, and nothing in progress.

The ring is fed batches of effects — through ``observe`` (a batch noted whole before it is
performed), or through ``before``/``after`` around performing it, as the shell feeds it — with a
stand-in for the two things it reads (the core's state of an id, the job ledger's record of a
job); the end-to-end stories are in ``tests/manager/test_why.py``.
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import msgspec
import pytest

from kvtier import forensics
from kvtier.forensics import CAPACITY, Forensics
from kvtier.lifecycle import ConsumerState, ProbeState, ProducerState, Reason
from kvtier.lifecycle import effects as fx
from kvtier.wire import messages as wm

#: The stated bound (docs/metrics.md, decision E3): the ring of CAPACITY entries, ids of 37
#: characters, takes at most this many bytes.
RING_BOUND_BYTES = 1 << 20

PEER = "10.0.0.5:5710"


class _Core:
    """The core's read API as the ring uses it: every load ended ``failed``, every id tombstoned."""

    def consumer_state(self, kid: str) -> ConsumerState:
        return ConsumerState.FAILED

    def producer_state(self, kid: str) -> ProducerState:
        return ProducerState.TOMBSTONED

    def probe_state(self, kid: str) -> ProbeState:
        return ProbeState.ABSENT

    def consumer(self, kid: str) -> None:
        return None


def _kid(job_id: int) -> str:
    return f"cmpl-{job_id:032x}"


def _ring(capacity: int = CAPACITY) -> tuple[Forensics, list[float]]:
    clock = [0.0]
    # every even job is a load, every odd one a store; one 4-block job per id

    def job_info(j: int) -> tuple[bool, str, float, int] | None:
        return (bool(j & 1), _kid(j), clock[0] - 0.5, 4 * 4096) if j < 10**9 else None

    ring = Forensics(core=_Core(), job_info=job_info, clock=lambda: clock[0], block_bytes=4096, capacity=capacity)
    return ring, clock


def _finish(ring: Forensics, clock: list[float], first: int, n: int, batch: int = 256) -> None:
    """``n`` ids finish, ``batch`` per observed step: a fetch leaves, blocks land, the job ends."""
    for start in range(first, first + n, batch):
        effects: list[Any] = []
        for j in range(start, min(start + batch, first + n)):
            if not j & 1 and not j & 63:  # one load in 64 with its fetch and landing, as the shell reports
                effects += [fx.Send(PEER, wm.Fetch(gen=1, kv_request_id=_kid(j), round=j, keys=[b"k"], slots=[0])),
                            fx.LandBlocks(PEER, _kid(j), j, 0, (0, 1))]
            effects.append(fx.JobDone(j, False, Reason.LOAD_TIMEOUT if not j & 1 else Reason.REAPED))
        ring.observe(effects)
        clock[0] += 0.001


def _deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes held by ``obj`` and everything it refers to (each object counted once)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, (str, bytes, int, float, bool)) or obj is None:
        return size
    if isinstance(obj, dict):
        return size + sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return size + sum(_deep_size(x, seen) for x in obj)
    if isinstance(obj, msgspec.Struct):
        return size + sum(_deep_size(getattr(obj, f), seen) for f in obj.__struct_fields__)
    raise TypeError(f"unexpected object in the ring: {type(obj).__name__}")


def _ring_bytes(ring: Forensics) -> int:
    return _deep_size(ring.recent()) - sys.getsizeof(ring.recent())  # the entries, not the copy's list


def test_a_million_finished_ids_leave_capacity_entries_under_the_stated_bound() -> None:
    ring, clock = _ring()
    _finish(ring, clock, 0, 2 * CAPACITY)
    full = _ring_bytes(ring)
    _finish(ring, clock, 2 * CAPACITY, 1_000_000 - 2 * CAPACITY)
    assert ring.finished_total == 1_000_000
    assert len(ring.recent()) == CAPACITY and ring.in_progress() == 0
    after = _ring_bytes(ring)
    assert after <= RING_BOUND_BYTES, f"{after} bytes for {CAPACITY} entries"
    assert after <= full * 1.02, (full, after)  # a full ring does not grow with the ids it saw
    newest = ring.recent(limit=1)[0]
    assert newest.kv_request_id == _kid(999_999) and newest.reason == "reaped"
    loads = [e for e in ring.recent() if e.role == "consumer" and e.marks[0][0] == "fetch"]
    assert loads and all(e.peer == PEER and e.landed == 2 and e.path == ("failed",) for e in loads)


def test_requests_in_progress_are_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fetches whose loads never end (for the ring: it forgets the oldest) cannot grow it."""
    monkeypatch.setattr(forensics, "MAX_OPEN", 16)
    ring, _ = _ring()
    ring.observe([fx.Send(PEER, wm.Fetch(gen=1, kv_request_id=_kid(j), round=j, keys=[b"k"], slots=[0]))
                  for j in range(100)])
    assert ring.in_progress() == 16 and ring.finished_total == 0


def test_the_ring_ignores_what_it_does_not_track() -> None:
    ring, clock = _ring(capacity=4)
    ring.observe([fx.Ignored("producer", "kv", ProducerState.PARKED, "x", Reason.STALE), fx.CloseConnection(PEER),
                  fx.JobDone(10**9, True)])  # a job the ledger does not know (the manager's own)
    ring.observe([])
    assert ring.recent() == [] and ring.in_progress() == 0
    _finish(ring, clock, 0, 10, batch=1)
    assert [e.kv_request_id for e in ring.recent()] == [_kid(j) for j in range(9, 5, -1)]
    assert ring.recent(_kid(8)) == [ring.recent()[1]] and ring.recent(_kid(1)) == []


def _split(ring: Forensics, effects: list[Any], performed: list[int]) -> None:
    """Feed ``effects`` as the shell does (decision C26): ``before``, the batch performed (the
    job ledger forgets each job as its ``JobDone`` is performed), then ``after``."""
    noted = ring.before(effects)
    performed.extend(e.job_id for e in effects if type(e) is fx.JobDone)
    ring.after(effects, noted)


def test_a_batch_is_noted_in_its_order_whatever_is_noted_after_it_is_performed() -> None:
    """A message leaves before its bookkeeping, yet the entries read as if each batch had been
    noted whole before it was performed: an abort that came before a result is in the result's
    entry, a receipt right after a success is added to that entry, and each result finds its
    job in the ledger."""
    performed: list[int] = []
    kids = {2: _kid(2), 4: _kid(4)}

    def job_info(j: int) -> tuple[bool, str, float, int] | None:
        return None if j in performed or j not in kids else (False, kids[j], 0.0, 4096)

    def feed(ring: Forensics, clock: list[float], split: bool) -> list[Any]:
        performed.clear()
        steps: list[tuple[float, list[Any]]] = []
        for j, kid in kids.items():
            steps.append((0.0, [fx.Send(PEER, wm.Fetch(gen=1, kv_request_id=kid, round=j, keys=[b"k"], slots=[0]))]))
        steps.append((0.25, [fx.Send(PEER, wm.AbortFetch(gen=1, kv_request_id=kids[2], round=2)),
                             fx.JobDone(2, False, Reason.LOAD_TIMEOUT)]))
        steps.append((0.5, [fx.JobDone(4, True), fx.Send(PEER, wm.Receipt(gen=1, kv_request_id=kids[4], round=4))]))
        for at, batch in steps:
            clock[0] = at
            if split:
                _split(ring, batch, performed)
            else:
                ring.observe(batch)
                performed.extend(e.job_id for e in batch if type(e) is fx.JobDone)
        return ring.recent()

    clock = [0.0]
    ring = Forensics(core=_Core(), job_info=job_info, clock=lambda: clock[0], block_bytes=4096)
    fetch = fx.Send(PEER, wm.Fetch(gen=1, kv_request_id=_kid(6), round=6, keys=[b"k"], slots=[0]))
    assert ring.before([fetch]) == 0 and ring.in_progress() == 0  # nothing needs the ledger: all after
    ring.after([fetch], 0)
    assert ring.in_progress() == 1
    ring = Forensics(core=_Core(), job_info=job_info, clock=lambda: clock[0], block_bytes=4096)
    entries = feed(ring, clock, split=True)
    ok, failed = entries
    assert [m for m, _ in failed.marks] == ["fetch", "abort", "result"] and failed.reason == "load_timeout"
    assert [m for m, _ in ok.marks] == ["fetch", "receipt", "result"] and ok.ok and ok.blocks == 1
    assert ring.in_progress() == 0
    whole = Forensics(core=_Core(), job_info=job_info, clock=lambda: clock[0], block_bytes=4096)
    assert feed(whole, clock, split=False) == entries  # noted whole before performing: the same
    _split(ring, [fx.JobDone(10**9, True)], performed)  # a job the ledger does not know: nothing
    assert len(ring.recent()) == 2


def test_a_peer_is_named_once_per_connection_not_per_entry() -> None:
    """Naming an inbound peer asks the transport (a record built per call): the ring asks once per
    peer id, and asks again for a peer it could not name yet."""
    asked: list[str] = []
    known = {"in:01": "10.0.0.9:40000"}

    def where(peer: str) -> str:
        asked.append(peer)
        return known.get(peer, "")

    clock = [0.0]
    ring = Forensics(core=_Core(), job_info=lambda j: None, clock=lambda: clock[0], block_bytes=4096, where=where)
    for j in range(5):
        ring.observe([fx.Send("in:01", wm.TransferDone(gen=1, kv_request_id=_kid(j), round=1, ok=False,
                                                       reason="reaped", final=True))])
    ring.observe([fx.Send("in:02", wm.TransferDone(gen=1, kv_request_id=_kid(9), round=1, ok=False,
                                                   reason="reaped", final=True))])
    known["in:02"] = "10.0.0.7:40001"
    ring.observe([fx.Send("in:02", wm.TransferDone(gen=1, kv_request_id=_kid(10), round=1, ok=False,
                                                   reason="reaped", final=True))])
    assert asked == ["in:01", "in:02", "in:02"]
    assert [e.peer for e in ring.recent()] == ["10.0.0.7:40001", "in:02"] + ["10.0.0.9:40000"] * 5


def test_a_batch_whose_performer_raised_is_noted_all_the_same() -> None:
    """An internal error in a performer (counted, and the batch goes on: decision C39) does not
    cost the ring the batch's notes: the fetch before it is traced as if the batch had been
    performed."""
    def boom(e: Any) -> None:
        raise RuntimeError("a performer bug")

    ring, _ = _ring()
    calls: list[str] = []
    out = _outbound_with(ring, {fx.Send: lambda e: None, fx.CloseConnection: boom}, calls)
    out.perform([fx.Send(PEER, wm.Fetch(gen=1, kv_request_id=_kid(2), round=2, keys=[b"k"], slots=[0])),
                 fx.CloseConnection(PEER)])
    assert calls == ["internal_error"]
    assert ring.in_progress() == 1


def _outbound_with(ring: Forensics, performers: dict[type, Any], calls: list[str]) -> Any:
    """A real :class:`~kvtier.shell.outbound.Outbound` whose table performs ``performers`` (its
    public effect -> performer table, from the spec's PERFORM), feeding ``ring``."""
    import time
    from types import SimpleNamespace

    from kvtier.shell.jobs import JobBook
    from kvtier.shell.logs import RateLimitedLog
    from kvtier.shell.outbound import Outbound
    from kvtier.shell.perbyte import ByteWork
    from kvtier.testing.inproc import InprocNetwork, InprocTransport

    metrics = SimpleNamespace(internal_error=lambda: calls.append("internal_error"))
    logs = RateLimitedLog(time.monotonic, lambda p: "")
    work = ByteWork(algorithm="xxh3_64", digest_pool=None, block_bytes=4096, metrics=metrics, logs=logs)
    out = Outbound(transport=InprocTransport(InprocNetwork(), "c:1"), plane=None, pool=None, jobs=JobBook(),
                   metrics=metrics, logs=logs, work=work, clock=time.monotonic)
    out.PERFORMERS.update(performers)
    out.forensics = ring
    return out


def test_a_refusal_is_named_before_the_same_batch_closes_its_peers_connection() -> None:
    """Closing a connection may take the transport's name of the peer it spoke for; a refusal in
    the same batch is noted before that close is performed, so its entry names where the late
    consumer is, as noting the whole batch first did."""
    known = {"in:01": "10.0.0.9:40000"}
    ring = Forensics(core=_Core(), job_info=lambda j: None, clock=lambda: 0.0, block_bytes=4096,
                     where=lambda p: known.get(p, ""))
    out = _outbound_with(ring, {fx.Send: lambda e: None, fx.CloseConnection: lambda e: known.pop(e.peer) and None}, [])
    refusal = wm.TransferDone(gen=1, kv_request_id=_kid(1), round=1, ok=False, reason="reaped", final=True)
    assert out.perform([fx.Send("in:01", refusal), fx.CloseConnection("in:01")]) == []
    assert [e.peer for e in ring.recent()] == ["10.0.0.9:40000"] and not known


def test_a_failing_ring_costs_the_batch_nothing_it_did_or_produced() -> None:
    """The ring is a diagnostic: if noting after the batch fails, what the performers produced is
    still returned (applied by the core next) and the failure is counted as an internal error."""
    calls: list[str] = []

    class Broken(Forensics):
        def after(self, effects: Any, start: int) -> None:
            raise RuntimeError("a ring bug")

    ring = Broken(core=_Core(), job_info=lambda j: None, clock=lambda: 0.0, block_bytes=4096)
    produced = object()
    out = _outbound_with(ring, {fx.Send: lambda e: [produced]}, calls)
    fetch = fx.Send(PEER, wm.Fetch(gen=1, kv_request_id=_kid(2), round=2, keys=[b"k"], slots=[0]))
    assert out.perform([fetch]) == [produced]
    assert calls == ["internal_error"]
