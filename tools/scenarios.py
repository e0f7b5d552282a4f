"""Scenarios recorded from real runs: two ``KvTierManager`` s, one virtual clock, one recorder.

Each scenario drives a real producer manager and a real consumer manager over
:class:`~kvtier.testing.inproc.InprocTransport` with a
:class:`~kvtier.testing.clock.VirtualClock` (no sockets, no sleeps, deterministic), **asserts the
outcomes it exists to show**, and leaves behind a trace the review page draws as a message
sequence chart (:mod:`tools.seqchart`).  Nothing is simulated: the managers, their
lifecycle cores, the wire codec and the block pools are the production ones.  What is recorded:

* engine calls (``on_new_request``, ``submit_store``, ``submit_load``, ``on_request_finished``,
  ``drain_jobs``, ``shutdown``) and the job results the engine collects — by :class:`Engine`,
  which the scenario uses instead of calling the manager directly;
* every wire message — by :class:`RecordingTransport`, which decodes the header frame with
  :mod:`kvtier.wire.codec` at ``send`` and marks it delivered when the receiver's ``recv``
  hands it over (a message that never arrives is labelled so); pings and pongs are recorded but
  left out of charts;
* every lifecycle state change, deadline and ignored input — by :class:`RecordingCore`, which
  wraps the manager's :class:`~kvtier.lifecycle.TierCore` entry points (``handle``, ``fire``) and
  compares record states (its read API) before and after each input.

Adding a scenario is one function::

    @scenario("Title shown on the review page", properties=("exactly_once_job_result",))
    def my_case(h: Harness) -> None:
        \"\"\"One paragraph for the reviewer.\"\"\"
        req = h.prefill.request("p-A", "A")
        ...
        h.expect(h.decode.outcome(10) == (True, None), "the load succeeds")

Harness arguments (configs, pool geometry, transport options such as ``hold_completion``) go in
``@setup(...)`` under ``@scenario``.  ``python -m tools diagram`` then draws it
(``diagrams/scenarios/<name>.svg``), ``docs/review.md`` lists
it, and ``tests/lifecycle/test_scenarios.py`` runs it.  Every scenario additionally checks, at
the end, that every job it submitted got exactly one result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kvtier.api import LookupResult, RequestContext
from kvtier.manager import MAX_BATCH_BYTES
from tools.scenario_harness import Engine, Harness
from tools.scenario_record import LANES, SCEN_CFG, RecordingCore, RecordingTransport, ScenarioFailed, Trace
from tools.spec import Spec, load

__all__ = [
    "AWAITING",
    "Engine",
    "Harness",
    "LANES",
    "RecordingCore",
    "RecordingTransport",
    "SCENARIOS",
    "SCEN_CFG",
    "Scenario",
    "ScenarioFailed",
    "Trace",
    "record",
    "scenario",
    "setup",
]

# -- registry ---------------------------------------------------------------------------------------


@attrs.frozen
class Scenario:
    """One recorded scenario: ``run(h)`` drives a :class:`Harness` and asserts its outcomes."""

    name: str
    title: str
    doc: str
    properties: tuple[str, ...]
    run: Callable[[Harness], None]


SCENARIOS: list[Scenario] = []

#: Scenarios the code on this branch cannot produce yet: name -> what they need.  The review
#: page lists them; each becomes a ``@scenario`` function once the behaviour exists.
AWAITING: dict[str, str] = {
    "transfer_stalled_past_cancel_deadline": (
        "the transport still holds a cancelled transfer's blocks when cancel_transfer's deadline "
        "passes: needs the producer's quarantine rule (blocks stay pinned, the store job's result "
        "waits for the release)"
    ),
}


_Run = Callable[[Harness], None]


def scenario(title: str, *, properties: Sequence[str] = ()) -> Callable[[_Run], _Run]:
    """Register a scenario function (in review order: registration order).  Its docstring is the
    paragraph the review page shows; ``properties`` names the spec properties its assertions
    check (validated against ``[properties]``)."""

    def deco(fn: _Run) -> _Run:
        doc = " ".join((fn.__doc__ or "").split())
        if not doc:
            raise ValueError(f"scenario {fn.__name__} needs a docstring (the review page shows it)")
        if any(s.name == fn.__name__ for s in SCENARIOS):
            raise ValueError(f"scenario {fn.__name__} is registered twice")
        SCENARIOS.append(Scenario(fn.__name__, title, doc, tuple(properties), fn))
        return fn

    return deco


def record(s: Scenario, spec: Spec | None = None) -> Trace:
    """Run scenario ``s`` and return its trace.

    Raises:
        ScenarioFailed: an outcome the scenario asserts did not happen, or a submitted job did not
            get exactly one result.
        ValueError: the scenario names a property the spec does not declare.
    """
    spec = spec if spec is not None else load()
    unknown = [p for p in s.properties if p not in spec.properties]
    if unknown:
        raise ValueError(f"scenario {s.name} names unknown properties {unknown}")
    h = _build(s, spec)
    log = logging.getLogger("kvtier")
    level = log.level
    log.setLevel(logging.CRITICAL)  # a scenario's expected peer failures are not news
    try:
        s.run(h)
        for eng in (h.prefill, h.decode):
            if eng.killed:
                continue
            for job_id in eng.submitted:
                got = eng.results.get(job_id, [])
                if len(got) != 1:
                    raise ScenarioFailed(
                        f"scenario {s.name}: job {job_id} got {len(got)} results (exactly one expected): {got}")
        jobs = [j for e in (h.prefill, h.decode) if not e.killed for j in e.submitted]
        if jobs:
            h.trace.checks.append(f"every job ({', '.join(map(str, sorted(jobs)))}) got exactly one result")
    finally:
        h.trace.recording = False  # tearing the pair down is not part of the scenario
        h.close()
        log.setLevel(level)
    return h.trace


_BUILD: dict[str, dict[str, Any]] = {}


def _build(s: Scenario, spec: Spec) -> Harness:
    return Harness(spec=spec, **_BUILD.get(s.name, {}))


def setup(**kw: Any) -> Callable[[_Run], _Run]:
    """Harness arguments for the decorated scenario (put it under ``@scenario``)."""

    def deco(fn: _Run) -> _Run:
        _BUILD[fn.__name__] = kw
        return fn

    return deco


def _keys(kv: str, n: int) -> list[bytes]:
    return [f"{kv}/blk{i}".encode() for i in range(n)]


def _connect(h: Harness, req_id: str, kv: str) -> RequestContext:
    """The decode engine announces ``kv``; the session handshake completes."""
    req = h.decode.request(req_id, kv)
    h.settle()
    return req


def _park_then_connect(h: Harness, n: int, seed: int) -> tuple[RequestContext, RequestContext]:
    """At 0 s: the prefill stores ``n`` blocks of A (slots 0..n-1) and finishes its request; the
    decode engine announces A and the handshake completes.  Then the clock moves to 1 s."""
    preq = h.prefill.request("p-A", "A")
    h.prefill.store(1, preq, _keys("A", n), list(range(n)), seed=seed)
    h.prefill.finish(preq)
    h.settle()
    creq = _connect(h, "c-A", "A")
    h.advance_to(1.0)
    return preq, creq


# -- the scenarios (review order) -------------------------------------------------------------------


@scenario("Happy path: store, fetch, transfer, prune", properties=("exactly_once_job_result",))
def happy_path(h: Harness) -> None:
    """The prefill engine stores four blocks of id A and finishes its request; the decode engine
    announces A (the session handshake runs), loads the four blocks into its own slots, and the
    producer streams them. Both jobs succeed once; the producer keeps A as `done` for
    `tombstone_retention_s` so a late duplicate fetch is refused in one round trip, then prunes it."""
    _, creq = _park_then_connect(h, 4, seed=1)
    h.decode.load(10, creq, _keys("A", 4), [4, 5, 6, 7])
    h.settle()
    h.expect(h.decode.outcome(10) == (True, None), "the load succeeds")
    h.expect(h.prefill.outcome(1) == (True, None), "the store job succeeds once the transfer completed")
    h.expect(h.slots_hold_pattern([4, 5, 6, 7], seed=1), "the consumer's slots hold the producer's blocks")
    h.expect(h.producer_state("A") == "done", "the producer retains A as done")
    h.decode.finish(creq)
    h.advance_to(61.0, tick=0.5)
    h.expect(h.producer_state("A") == "absent", "A is pruned after tombstone_retention_s")


@scenario("Fetch before store: the consumer is faster than the prefill",
          properties=("exactly_once_job_result", "fetch_always_answered"))
def fetch_before_store(h: Harness) -> None:
    """The decode engine loads id A before the prefill has stored anything. The producer binds the
    fetch (`awaiting`, timer `fetch_supply_timeout_s`); when the store arrives it meets the
    demand and the transfer starts at once."""
    creq = _connect(h, "c-A", "A")
    h.decode.load(10, creq, _keys("A", 2), [4, 5])
    h.settle()
    h.expect(h.producer_state("A") == "awaiting", "the producer holds the fetch, bound, waiting for blocks")
    h.advance_to(0.5)
    preq = h.prefill.request("p-A", "A")
    h.prefill.store(1, preq, _keys("A", 2), [0, 1], seed=3)
    h.settle()
    h.expect(h.decode.outcome(10) == (True, None), "the load succeeds as soon as the blocks are stored")
    h.expect(h.prefill.outcome(1) == (True, None), "the store job succeeds")
    h.expect(h.slots_hold_pattern([4, 5], seed=3), "the consumer's slots hold the stored blocks")
    h.prefill.finish(preq)
    h.decode.finish(creq)
    h.settle()


@scenario("Chunked prefill: the fetch waits for the last chunk",
          properties=("exactly_once_job_result", "fetch_always_answered"))
def chunked_prefill(h: Harness) -> None:
    """The prefill stores id A in three one-block chunks, one second apart; the fetch for all three
    blocks arrives after the first chunk. Each further store restarts the supply timer; the
    store that completes the demand starts the transfer, and all three store jobs succeed once."""
    preq = h.prefill.request("p-A", "A")
    keys = _keys("A", 3)
    h.prefill.store(1, preq, keys[:1], [0], seed=5)
    h.settle()
    creq = _connect(h, "c-A", "A")
    h.decode.load(10, creq, keys, [4, 5, 6])
    h.settle()
    h.expect(h.producer_state("A") == "awaiting", "a fetch for blocks not yet stored waits, bound")
    for i in (1, 2):
        h.advance_to(float(i))
        h.prefill.store(1 + i, preq, keys[i : i + 1], [i], seed=5, first=i)
        h.settle()
    h.expect(h.decode.outcome(10) == (True, None), "the load succeeds after the last chunk")
    h.expect(all(h.prefill.outcome(j) == (True, None) for j in (1, 2, 3)), "every chunk's store job succeeds")
    h.expect(h.slots_hold_pattern([4, 5, 6], seed=5), "the blocks land in fetch order")
    h.prefill.finish(preq)
    h.decode.finish(creq)
    h.settle()


@scenario("Late fetch refused after the reap, in one round trip, with no data",
          properties=("exactly_once_job_result", "late_fetch_one_rtt", "no_bytes_for_tombstoned",
                      "tombstoned_never_reparks"))
def late_fetch_after_reap(h: Harness) -> None:
    """Nobody fetches id A within `unbound_store_timeout_s` (60 s): the producer reaps it (`reaped`,
    the store job fails and the engine may reuse the blocks) and keeps a tombstone. A fetch at
    62 s is refused with `transfer_done(FAIL, reaped)` in the same step, not after the
    consumer's load timeout; no byte is sent and the consumer's slots are untouched."""
    preq = h.prefill.request("p-A", "A")
    h.prefill.store(1, preq, _keys("A", 4), [0, 1, 2, 3], seed=1)
    h.prefill.finish(preq)
    h.settle()
    h.advance_to(60.0, tick=0.5)
    h.expect(h.prefill.outcome(1) == (False, "reaped"), "the store job fails with reaped at 60 s")
    h.expect(h.producer_state("A") == "tombstoned", "A is tombstoned")
    h.advance_to(62.0)
    creq = _connect(h, "c-A", "A")
    h.decode.load(10, creq, _keys("A", 4), [4, 5, 6, 7])
    h.settle()
    h.expect(h.now == 62.0, "no time passed")
    h.expect(h.decode.outcome(10) == (False, "reaped"), "the load fails with the producer's reason at once")
    h.expect(h.decode.lookup(creq, _keys("A", 1)[0]) is LookupResult.MISS, "lookups miss: the engine recomputes")
    h.expect(h.slots_untouched([4, 5, 6, 7]), "no byte landed in the consumer's slots")
    h.expect(h.P.stats().get("kvtier_block_sent_bytes_total", 0) == 0, "the producer sent no block data")
    h.decode.finish(creq)
    h.settle()


@scenario("Abort racing completion: the engine cancels while the blocks are on the wire",
          properties=("exactly_once_job_result", "no_write_after_terminal", "no_success_without_receipt"))
def abort_racing_completion(h: Harness) -> None:
    """The producer serves id A in full and its transport has moved every block, but before they
    reach the consumer its engine finishes the request. The consumer sends `abort_fetch` and from
    then on drops block data (`late_data`): its load fails once with `cancelled` and no byte is
    written into slots the engine already considers free. The producer never gets a receipt, so
    its store job fails (`aborted`): handing the bytes to the transport is not delivering them."""
    _, creq = _park_then_connect(h, 2, seed=2)
    h.decode.load(10, creq, _keys("A", 2), [4, 5])  # fetch sent; the consumer is not polled yet
    h.net.hold(h.C_ADDR)  # what the producer sends now is on the wire, not yet at the consumer
    h.poll("P")  # the producer serves; its transport moves the blocks: block_data in flight
    h.poll("P")  # its next tick reads the plane's report that it holds none of them any more
    h.expect(h.producer_state("A") == "delivering", "the blocks are moved; the producer waits for the receipt")
    h.decode.finish(creq)  # the engine gives up before they arrive
    h.net.release(h.C_ADDR)
    h.settle()
    h.expect(h.decode.outcome(10) == (False, "cancelled"), "the load fails once, cancelled")
    h.expect(h.slots_untouched([4, 5]), "no block data was written after the abort")
    h.expect(h.prefill.outcome(1) == (False, "aborted"), "no receipt: the producer's store job fails, aborted")
    h.expect(h.consumer_state("A") == "absent", "the consumer's record is gone")


@scenario("Transfer stalled past its deadline: the blocks stay quarantined until the transport lets go",
          properties=("exactly_once_job_result", "no_block_returned_while_referenced", "fetch_always_answered"))
@setup(p_cfg={"transfer_timeout_s": 10.0, "peer_timeout_s": 120.0}, c_cfg={"peer_timeout_s": 120.0},
       p_transport={"hold_completion": True, "hold_after_drop": True})
def transfer_stalled(h: Harness) -> None:
    """The producer hands A's blocks to its transport, but the consumer's process stalls and reads
    nothing, so zmq keeps holding the zero-copy frames. At `transfer_timeout_s` (10 s) the producer
    cancels, yet the store job stays outstanding: the engine must not reuse blocks a send may
    still read. At the cancel deadline (10 s later) the transport still has not let go, so the
    producer ends the session (`transfer_stalled`) to force it and keeps A `quarantined`. Only when
    the transport releases the frames does the store job fail, once (`transfer_timeout`). An
    earlier kvtier reported the job at the cancel deadline; the engine reused the blocks and the
    consumer landed another request's bytes as a success (B26/B32)."""
    _, creq = _park_then_connect(h, 2, seed=4)
    h.frozen.add("C")
    h.decode.load(10, creq, _keys("A", 2), [4, 5])  # the fetch goes out; then the consumer stalls
    h.settle()
    h.expect(h.producer_state("A") == "serving", "the transport holds the blocks")
    h.advance_to(10.75)
    h.expect(h.prefill.outcome(1) is None, "no store result before the deadline")
    h.advance_to(11.0)
    h.expect(h.producer_state("A") == "cancelling", "at transfer_timeout_s the producer cancels")
    h.expect(h.prefill.outcome(1) is None, "the store job waits for the transport to release the blocks")
    h.advance_to(21.0)
    h.expect(h.producer_state("A") == "quarantined", "past the cancel deadline: quarantined, session ended")
    h.expect(h.prefill.outcome(1) is None, "still no store result: the blocks are never handed back early")
    h.expect(h.P.quarantined() == (1, 2), "the manager reports 1 id, 2 blocks quarantined")
    h.note("P", "the transport releases the frames")
    h.P.transport.complete()
    h.settle()
    h.expect(h.prefill.outcome(1) == (False, "transfer_timeout"), "the store job fails once, transfer_timeout")
    h.expect(h.producer_state("A") == "tombstoned", "A is tombstoned")
    h.frozen.discard("C")
    h.settle()
    h.expect(h.decode.outcome(10) is not None and h.decode.outcome(10)[0] is not None,
             "the consumer's load ends once when it wakes")
    h.decode.finish(creq)
    h.settle()


@scenario("Producer killed mid-transfer",
          properties=("exactly_once_job_result", "fetch_always_answered", "no_write_after_terminal"))
@setup(block_bytes=MAX_BATCH_BYTES // 2 + 64, num_blocks=2, c_transport={"rcvhwm": 1})
def peer_killed_mid_transfer(h: Harness) -> None:
    """Blocks are large enough that each travels in its own `block_data` message. The first one
    lands; the producer's process dies before the second leaves its send queue. The consumer's
    transport sees the connection close (the socket monitor): the session ends at once
    (`peer_disconnected`) and the load fails once, without waiting for `peer_timeout_s` of
    silence, so the engine recomputes at once (B11)."""
    _, creq = _park_then_connect(h, 2, seed=6)
    h.decode.load(10, creq, _keys("A", 2), [0, 1])
    h.poll("P")  # serves block 0, which fills the consumer's inbox: one batch until the link's rate is known (T23)
    h.poll("P")  # block 0's release shows the rate: block 1 is posted and waits in the send queue
    t = h.now
    h.kill("P")
    h.poll("C")  # reads block 0, then sees the connection close
    h.expect(h.decode.outcome(10) == (False, "peer_disconnected"), "the load fails once, peer_disconnected")
    h.expect(h.now == t, "no time passed: no wait for peer_timeout_s")
    h.expect(h.decode.lookup(creq, _keys("A", 1)[0]) is LookupResult.MISS, "lookups miss: the engine recomputes")
    h.decode.finish(creq)
    h.settle()


@scenario("Shutdown with traffic in flight: every job still gets one result",
          properties=("exactly_once_job_result", "fetch_always_answered", "no_block_returned_while_referenced"))
@setup(p_cfg={"shutdown_grace_s": 0.2}, p_transport={"hold_completion": True})
def shutdown_in_flight(h: Harness) -> None:
    """The producer holds three ids: A parked (never fetched), B whose consumer already confirmed
    receipt while the transport still holds its frames (`confirmed`), and C awaiting blocks that
    were never stored. Its engine shuts it down (`shutdown_grace_s` 0.2 s): A's store job fails
    with `shutdown` at once; C's fetch is answered `transfer_done(FAIL, shutdown)` with the
    session's generation, so the consumer's load of C fails at once; B waits out the grace for
    its release, which only closing the transport gives — then its store job succeeds (the
    consumer confirmed every block). Every peer gets a goodbye; nothing is left waiting."""
    preq = {kv: h.prefill.request(f"p-{kv}", kv) for kv in ("A", "B")}
    h.prefill.store(1, preq["A"], _keys("A", 1), [0], seed=7)
    h.prefill.store(2, preq["B"], _keys("B", 2), [1, 2], seed=8)
    h.settle()
    creq = {kv: _connect(h, f"c-{kv}", kv) for kv in ("B", "C")}
    h.advance_to(1.0)
    h.decode.load(10, creq["B"], _keys("B", 2), [4, 5])
    h.decode.load(11, creq["C"], _keys("C", 1), [6])
    h.settle()
    h.expect(h.producer_state("B") == "confirmed" and h.producer_state("C") == "awaiting",
             "B's receipt is in but the transport holds its frames; C waits for blocks")
    h.advance_to(2.0)
    h.prefill.shutdown()
    h.settle()
    h.expect(h.prefill.outcome(1) == (False, "shutdown"), "A's store job fails with shutdown")
    h.expect(h.prefill.outcome(2) == (True, None), "B's store job succeeds once the closed transport let go")
    h.expect(h.decode.outcome(10) == (True, None), "B's load had completed")
    h.expect(h.decode.outcome(11) == (False, "shutdown"), "C's load fails once, at once, with shutdown")
    h.expect(h.now == 2.0, "no time passed on the scenario clock")
    h.expect(h.slots_untouched([6]), "nothing landed for C")
    for kv in ("B", "C"):
        h.decode.finish(creq[kv])
    h.settle()
