"""The request forensics ring (:mod:`kvtier.forensics`) keeps its memory bounded however many
requests finish: a million finished ids leave :data:`~kvtier.forensics.CAPACITY` entries of a few
hundred bytes each, measured object by object, and nothing in progress.

The ring is fed batches of effects — through ``observe`` (a batch noted whole before it is
performed), or through ``before``/``after`` around performing it, as the shell feeds it — and the
inputs the core applied (``applied``), with a stand-in for the two things it reads (the core's
state of an id, the job ledger's record of a job); the end-to-end stories are in
``tests/manager/test_why.py``.
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
from kvtier.lifecycle import inputs as ix
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

    def round_loads(self, kid: str) -> list:
        return []


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
    """``n`` ids finish, ``batch`` per observed step: a fetch leaves, blocks land and are checked,
    the job ends."""
    for start in range(first, first + n, batch):
        effects: list[Any] = []
        for j in range(start, min(start + batch, first + n)):
            if not j & 1 and not j & 63:  # one load in 64 with its fetch and landing, as the shell reports
                ring.observe([*effects, fx.Send(PEER, wm.Fetch(gen=1, kv_request_id=_kid(j), round=j, keys=[b"k"],
                                                               slots=[0])), fx.LandBlocks(PEER, _kid(j), j, 0, (0, 1))])
                ring.applied(ix.BlocksLanded(PEER, _kid(j), j, 0, 2, True))  # the check's answer
                effects = []
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


def test_a_load_counts_the_blocks_its_checks_matched_not_those_that_arrived() -> None:
    """Four blocks arrive in one batch and the check answers the first two matched and the third
    did not (the shell splits a corrupt batch at its first mismatch, decision I21): the load
    landed two blocks, in progress and in its record, whatever arrived."""
    ring, _ = _ring()
    kid = _kid(2)
    fetch = wm.Fetch(gen=1, kv_request_id=kid, round=2, keys=[b"k0", b"k1", b"k2", b"k3"], slots=[0, 1, 2, 3])
    ring.observe([fx.Send(PEER, fetch), fx.LandBlocks(PEER, kid, 2, 0, (0, 1, 2, 3))])
    ring.applied(ix.BlocksLanded(PEER, kid, 2, 0, 2, True))
    ring.applied(ix.BlocksLanded(PEER, kid, 2, 2, 2, False, Reason.CORRUPT))
    assert [e["landed"] for e in ring.open_json(kid)] == [2]
    ring.observe([fx.JobDone(2, False, Reason.CORRUPT, (b"k0", b"k1"))])
    (load,) = ring.recent(kid)
    assert (load.blocks, load.landed, load.reason) == (4, 2, "corrupt")


class _Producer(_Core):
    """The core's read API with the producer state of every id set by the test (what the last input
    left it in)."""

    def __init__(self) -> None:
        self.state = ProducerState.ABSENT

    def producer_state(self, kid: str) -> ProducerState:
        return self.state


def _bound_ring(jobs: dict[int, str]) -> tuple[Forensics, _Producer, list[float], list[int]]:
    """A ring whose job ledger knows store jobs ``jobs`` (job -> id, one block each) until their
    results are performed; a fetch of round 7 from ``in:01`` bound each id at 0."""
    clock, core, performed = [0.0], _Producer(), []

    def job_info(j: int) -> tuple[bool, str, float, int] | None:
        return None if j in performed or j not in jobs else (True, jobs[j], 0.0, 4096)

    ring = Forensics(core=core, job_info=job_info, clock=lambda: clock[0], block_bytes=4096)
    core.state = ProducerState.AWAITING
    for kid in sorted(set(jobs.values()) | {_kid(1)}):
        ring.applied(ix.Received("in:01", wm.Fetch(gen=1, kv_request_id=kid, round=7, keys=[b"k"], slots=[0])))
    return ring, core, clock, performed


def _refusal(kid: str, reason: str, peer: str = "in:01", rnd: int = 7) -> fx.Send:
    return fx.Send(peer, wm.TransferDone(gen=1, kv_request_id=kid, round=rnd, ok=False, reason=reason, final=True))


def test_a_fetch_that_bound_an_id_is_told_with_its_peer_its_wait_and_the_awaiting_step() -> None:
    """The fetch that bound an id opens its producer record (its peer, ``bound``, ``awaiting``):
    refused later, its entry says how long it waited bound, not "at once"; the parked blocks'
    entry names the peer and the step; another peer's fetch refused meanwhile was refused at
    once.  Nothing is left in progress."""
    ring, core, clock, performed = _bound_ring({5: _kid(5)})
    assert ring.in_progress() == 2
    assert [(e["peer"], e["path"], list(e["marks"])) for e in ring.open_json(_kid(1))] == [
        ("in:01", ["awaiting"], ["bound"])]
    ring.observe([_refusal(_kid(1), "duplicate_fetch", peer="in:02", rnd=3)])  # another fetch: at once
    clock[0] = 1.5
    core.state = ProducerState.TOMBSTONED
    ring.observe([_refusal(_kid(1), "nothing_stored")])  # nothing stored: no job's result ends it
    _split(ring, [fx.JobDone(5, False, Reason.INCOMPLETE), _refusal(_kid(5), "incomplete")], performed)
    told = {(e.kv_request_id, e.role, e.peer): e for e in ring.recent()}
    at_once = told[_kid(1), "fetch", "in:02"]
    assert (at_once.reason, at_once.marks, at_once.seconds) == ("duplicate_fetch", (("refused", 0.0),), 0.0)
    for kid, reason in ((_kid(1), "nothing_stored"), (_kid(5), "incomplete")):
        fetch = told[kid, "fetch", "in:01"]
        assert (fetch.reason, fetch.path, fetch.started) == (reason, ("awaiting", "tombstoned"), 0.0), fetch
        assert fetch.marks == (("bound", 0.0), ("refused", 1.5)) and fetch.seconds == 1.5, fetch
    parked = told[_kid(5), "producer", "in:01"]
    assert (parked.reason, parked.path, parked.blocks) == ("incomplete", ("awaiting", "tombstoned"), 1)
    assert [m for m, _ in parked.marks] == ["bound", "result"]
    assert ring.in_progress() == 0 and len(ring.recent()) == 4


def test_a_fetch_whose_peer_was_lost_while_bound_ends_its_story_too() -> None:
    """The consumer's session ends while its fetch waits bound: with a block stored, the parked
    blocks' entry names it; with nothing stored (no job's result to end the record), a ``fetch``
    entry says it was lost — and neither stays in progress."""
    ring, core, clock, performed = _bound_ring({5: _kid(5)})
    clock[0] = 2.0
    core.state = ProducerState.TOMBSTONED
    _split(ring, [fx.SessionEnded("in:01", Reason.PEER_DISCONNECTED), fx.JobDone(5, False, Reason.PEER_LOST)],
           performed)
    told = {(e.kv_request_id, e.role): e for e in ring.recent()}
    assert set(told) == {(_kid(1), "fetch"), (_kid(5), "producer")}
    lost = told[_kid(1), "fetch"]
    assert (lost.reason, lost.peer, lost.marks) == ("peer_lost", "in:01", (("bound", 0.0), ("lost", 2.0)))
    parked = told[_kid(5), "producer"]
    assert (parked.reason, parked.peer, parked.path) == ("peer_lost", "in:01", ("awaiting", "tombstoned"))
    assert ring.in_progress() == 0


def test_a_transfer_the_plane_let_go_of_waits_for_its_receipt() -> None:
    """The data plane moved every block (its release is an input, no effect shows it): the
    producer's record moves to ``delivering``, and ``kvtier why`` says it waits for the receipt."""
    from kvtier.explain import explain_open

    ring, core, _, _ = _bound_ring({})
    core.state = ProducerState.SERVING
    ring.observe([fx.SendBlocks("in:01", _kid(1), 7, (0,))])
    core.state = ProducerState.DELIVERING
    ring.applied(ix.TransferReleased(_kid(1), 7))
    (now,) = ring.open_json(_kid(1))
    assert now["path"] == ["awaiting", "serving", "delivering"] and list(now["marks"]) == ["bound", "sending",
                                                                                           "released"]
    assert "waiting   for the consumer's receipt" in explain_open(now)


def test_a_ring_failing_on_an_input_costs_the_pass_nothing() -> None:
    """The ring fails on an input the core applied: the failure is counted as an internal error
    and the pass goes on (the input stands; its effects are performed next)."""
    calls: list[str] = []

    class Broken(Forensics):
        def applied(self, inp: Any) -> None:
            raise RuntimeError("a ring bug")

    ring = Broken(core=_Core(), job_info=lambda j: None, clock=lambda: 0.0, block_bytes=4096)
    out = _outbound_with(ring, {}, calls)
    out.applied(ix.TransferReleased(_kid(1), 1))
    assert calls == ["internal_error"]


def test_a_session_end_that_quarantined_a_served_id_shows_on_its_path_and_is_no_refusal() -> None:
    """A transfer was being sent when the consumer's session was forced down: the id moved to
    ``quarantined`` with no effect of its own to show it, then to ``tombstoned`` once the plane let
    go.  The parked blocks' entry shows both steps and when the session ended; the terminal answer
    that follows is the end of that transfer, not a refused fetch (no ``fetch`` entry)."""
    ring, core, clock, performed = _bound_ring({5: _kid(5)})
    clock[0] = 0.2
    core.state = ProducerState.SERVING
    ring.observe([fx.SendBlocks("in:01", _kid(5), 7, (0,), (1,))])
    clock[0] = 1.0
    core.state = ProducerState.QUARANTINED
    ring.observe([fx.SessionEnded("in:01", Reason.TRANSFER_STALLED)])
    clock[0] = 1.5
    core.state = ProducerState.TOMBSTONED
    _split(ring, [fx.JobDone(5, False, Reason.TRANSFER_TIMEOUT), _refusal(_kid(5), "transfer_timeout")], performed)
    entries = [e for e in ring.recent() if e.kv_request_id == _kid(5)]
    assert [e.role for e in entries] == ["producer"], entries
    (parked,) = entries
    assert parked.path == ("awaiting", "serving", "quarantined", "tombstoned"), parked.path
    assert [m for m, _ in parked.marks] == ["bound", "sending", "session_ended", "result"], parked.marks
