"""Differential testing: random event traces through real TierCores, every table step mirrored by
the transitions-based reference interpreter built from the same spec.

A :class:`tools.reference.Shadow` sits on each machine of each core, so every ``apply``
— engine calls, wire messages, ticks, peer loss broadcasts, tombstone-cap evictions — is compared
with the reference: same destination state, same effect builders (names, order), same reason,
same timer.  A divergence raises inside the trace and Hypothesis shrinks it.

Trace counts: a few hundred in the default (``dev``/``ci``) run; ``pytest -m slow`` runs the full
10 000 (or ``KVTIER_DIFF_TRACES=<n>``, or the ``explore`` profile).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.lifecycle import InvalidTransition, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.session import HelloInput
from kvtier.testing.clock import VirtualClock
from kvtier.wire import messages as wm
from tools import reference
from tools.coreview import CoreView
from tools.fakenet import FakeNetwork

REFS = reference.build()
LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="diff", hash_seed="", instance="diff")
IDS = ("A", "B", "C")
CONSUMERS = ("c1", "c2")
DURATIONS = {k: 4.0 for k in TIMER_KEYS} | {"tombstone_retention_s": 9.0, "load_timeout_s": 7.0}


def _default_traces() -> int:
    env = os.environ.get("KVTIER_DIFF_TRACES")
    if env:
        return int(env)
    return 10_000 if settings.default.max_examples >= 10_000 else 300


class Harness:
    """One producer and two consumers, each machine shadowed by the reference."""

    def __init__(self, *, tombstone_max: int, max_pending: int, park_clock: str, connect: bool = True) -> None:
        cs = CoreSettings(
            durations=DURATIONS, tombstone_max=tombstone_max, max_pending_fetches_per_peer=max_pending,
            park_clock=park_clock,
        )
        self.clock = VirtualClock()
        self.net = FakeNetwork()
        self.cores = {"p": TierCore(cs, LOCAL)}
        for i, c in enumerate(CONSUMERS):
            self.cores[c] = TierCore(cs, LOCAL, gen_base=1000 * (i + 1))
        self.shadows = []
        for name, core in self.cores.items():
            self.net.attach(name, core)
            self.shadows.extend(reference.shadow_core(core, REFS).values())
        self.job = 0
        if connect:
            for c in CONSUMERS:
                self.net.connect(c, "p", 0.0)

    def checked(self) -> int:
        return sum(s.checked for s in self.shadows)

    def do(self, op: tuple) -> None:
        kind, *args = op
        now = self.clock.now()
        net, p = self.net, self.cores["p"]
        self.job += 1
        if kind == "store":
            kid, n, owner = args
            keys = tuple(f"{IDS[kid]}{k}".encode() for k in range(n))
            net.apply("p", ix.StoreSubmitted(IDS[kid], f"r{owner}", self.job, keys, tuple(range(n))), now)
        elif kind == "load":
            c, kid, n, announce = args
            if announce:
                net.apply(CONSUMERS[c], ix.LoadAnnounced(IDS[kid], "p"), now)
            keys = tuple(f"{IDS[kid]}{k}".encode() for k in range(n))
            try:
                net.apply(CONSUMERS[c], ix.LoadSubmitted(IDS[kid], self.job, keys, tuple(range(n))), now)
            except InvalidTransition:
                return
        elif kind == "net":
            what, d, i = args
            dirs = net.directions()
            if not dirs:
                return
            src, dst = dirs[d % len(dirs)]
            if what == "deliver":
                net.deliver(src, dst, i, now)
            elif what == "arrive":
                net.arrive(src, dst, i, now)
            elif what == "drop":
                net.drop(src, dst, i)
            else:
                net.duplicate(src, dst, i)
        elif kind == "transfer":
            i, ok = args
            if net.transfers:
                net.finish_transfer(i, now, ok=ok)
        elif kind == "advance":
            self.clock.advance(args[0])
        elif kind == "tick":
            for name in self.cores:
                net.tick(name, now)
        elif kind == "p_finished":
            net.apply("p", ix.RequestFinished(IDS[args[0]], producer=True), now)
        elif kind == "c_finished":
            c, kid = args
            net.apply(CONSUMERS[c], ix.RequestFinished(IDS[kid], producer=False), now)
        elif kind == "drain":
            net.apply("p", ix.DrainStarted(), now)
        elif kind == "shutdown":
            name = ("p",) + CONSUMERS
            net.apply(name[args[0] % 3], ix.ShutdownStarted(), now)
        elif kind == "session":
            c, what = args
            cname = CONSUMERS[c]
            core = self.cores[cname]
            pgen = CoreView(p).session_gen(cname) or 0
            if what == "disconnect":
                gen = CoreView(core).session_gen("p") or 0
                net.apply(cname, ix.Received("p", wm.Disconnect(gen=gen, reason="")), now)
                net.apply("p", ix.Received(cname, wm.Disconnect(gen=pgen, reason="")), now)
            elif what == "send_failed":
                net.apply("p", ix.SendFailed(cname), now)
            elif what == "connection_closed":
                net.apply(cname, ix.ConnectionClosed("p"), now)
            elif what == "bad_hello":
                bad = wm.Hello(gen=77, version=wm.PROTOCOL_VERSION, instance=cname, block_bytes=32, layout="diff",
                               hash_seed="")
                net.apply("p", ix.Received(cname, bad), now)
            elif what == "forged_fetch":
                kid = IDS[self.job % len(IDS)]
                net.apply("p", ix.Received(cname, wm.Fetch(gen=999_999, kv_request_id=kid, round=5, keys=[b"x"])), now)
            elif what == "ping":
                net.apply("p", ix.Received(cname, wm.Ping(gen=pgen, t=now)), now)
            elif what == "pong":
                net.apply(cname, ix.Received("p", wm.Pong(gen=CoreView(core).session_gen("p") or 0, t=now)), now)
            elif what == "stale_attach":
                net.apply(cname, ix.AttachRefused("p", (CoreView(core).session_gen("p") or 0) + 1, "stale"), now)
        elif kind == "stale_msg":
            c, kid, rnd = args
            cname = CONSUMERS[c]
            gen = CoreView(self.cores[cname]).session_gen("p") or 0
            for msg in (
                wm.TransferDone(gen=gen, kv_request_id=IDS[kid], round=rnd, ok=False, reason="stale"),
                wm.BlockData(gen=gen, kv_request_id=IDS[kid], round=rnd, first=0, count=1),
                wm.AbortAck(gen=gen, kv_request_id=IDS[kid], round=rnd),
            ):
                net.apply(cname, ix.Received("p", msg), now)


ids = st.integers(0, len(IDS) - 1)
cons = st.integers(0, len(CONSUMERS) - 1)
OPS = st.one_of(
    st.tuples(st.just("store"), ids, st.integers(0, 2), st.integers(0, 1)),
    st.tuples(st.just("load"), cons, ids, st.integers(0, 2), st.booleans()),
    st.tuples(st.just("net"), st.sampled_from(["deliver", "deliver", "deliver", "arrive", "drop", "dup"]),
              st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("transfer"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("advance"), st.integers(0, 6)),
    st.tuples(st.just("tick")),
    st.tuples(st.just("p_finished"), ids),
    st.tuples(st.just("c_finished"), cons, ids),
    st.tuples(st.just("drain")),
    st.tuples(st.just("shutdown"), st.integers(0, 2)),
    st.tuples(st.just("session"), cons, st.sampled_from(["disconnect", "send_failed", "connection_closed", "bad_hello",
                                                         "forged_fetch", "ping", "pong", "stale_attach"])),
    st.tuples(st.just("stale_msg"), cons, ids, st.integers(0, 3)),
)
TRACES = st.lists(st.one_of(OPS, st.tuples(st.just("net"), st.just("deliver"), st.integers(0, 3),
                                           st.just(0))), min_size=1, max_size=60)
CONFIG = st.tuples(
    st.integers(1, 3), st.integers(1, 2), st.sampled_from(["last_store", "first_store"]), st.booleans()
)


def run_trace(config: tuple[int, int, str, bool], trace: list[tuple]) -> int:
    h = Harness(tombstone_max=config[0], max_pending=config[1], park_clock=config[2], connect=config[3])
    for op in trace:
        h.do(op)
    # let everything settle: read what waits unread, deliver in order, finish transfers, run time forward
    for _ in range(50):
        if not (h.net.directions() or h.net.transfers or any(h.net.inbox.values())):
            h.do(("advance", 5))
            h.do(("tick",))
            if not (h.net.directions() or h.net.transfers):
                break
        for name in [n for n, q in h.net.inbox.items() if q]:
            h.net.tick(name, h.clock.now())
        for src, dst in h.net.directions():
            h.net.deliver(src, dst, 0, h.clock.now())
        if h.net.transfers:
            h.net.finish_transfer(0, h.clock.now())
    return h.checked()


@settings(max_examples=_default_traces(), suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(config=CONFIG, trace=TRACES)
def test_random_traces_agree_with_the_reference(config: tuple[int, int, str, bool], trace: list[tuple]) -> None:
    checked = run_trace(config, trace)
    assert checked > 0 or not config[3]


@pytest.mark.slow
@settings(max_examples=max(10_000, _default_traces()), derandomize=False, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(config=CONFIG, trace=TRACES)
def test_ten_thousand_random_traces_agree_with_the_reference(
    config: tuple[int, int, str, bool], trace: list[tuple]
) -> None:
    run_trace(config, trace)


def test_a_typical_trace_touches_every_machine() -> None:
    trace = [("store", 0, 2, 0), ("load", 0, 0, 2, True)] + [("net", "deliver", 0, 0)] * 4 + [
        ("transfer", 0, True), ("net", "deliver", 0, 0), ("advance", 6), ("tick",), ("advance", 6), ("tick",)]
    h = Harness(tombstone_max=4, max_pending=4, park_clock="last_store")
    for op in trace:
        h.do(op)
    by_machine: dict[str, int] = {}
    for s in h.shadows:
        by_machine[s.ref.name] = by_machine.get(s.ref.name, 0) + s.checked
    assert all(by_machine[m] > 0 for m in ("producer", "consumer", "session")), by_machine


def test_the_shadow_catches_a_drifted_core() -> None:
    from tools.planted import PLANTED

    trace = [("store", 0, 1, 0), ("advance", 5), ("tick",)]
    with PLANTED["reap_forgets_jobs"](), pytest.raises(reference.Divergence, match="effects"):
        h = Harness(tombstone_max=4, max_pending=4, park_clock="last_store")
        for op in trace:
            h.do(op)
