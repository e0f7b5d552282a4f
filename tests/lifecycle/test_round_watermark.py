"""Decision I11's defence, on the core's public API: a duplicated or overtaken fetch never binds.

On a one-sided plane a fetch that binds makes the producer WRITE into the slots it names.  A
duplicate of a fetch that already got its terminal answer (after the id was tombstoned and
pruned), or a fetch overtaken by its own abort, would write into slots the consumer reused.  Each
fetch and abort carries the consumer's low watermark; the producer remembers, per session, the
rounds it answered: such a fetch is dropped unbound (``stale_round``), and the store that follows
parks and sends nothing.  (The model checker's ``one-sided`` profile with ``--faults 1`` and
``--reorder`` explores every interleaving; these are its two counterexamples, replayed.)
"""

from __future__ import annotations

from kvtier.lifecycle import CoreSettings, HelloInput, ProducerState, TierCore
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS
from kvtier.wire import messages as wm
from tools.coreview import CoreView

PEER = "in:c"
GEN = 77
DURATIONS = {k: 10.0 for k in TIMER_KEYS} | {"tombstone_retention_s": 1.0, "fetch_supply_timeout_s": 1.0,
                                           "heartbeat_interval_s": 100.0, "peer_timeout_s": 1000.0}


def _producer() -> TierCore:
    local = HelloInput(wm.PROTOCOL_VERSION, 64, "raw", "", data_plane="nixl", instance="prod")
    core = TierCore(CoreSettings(durations=DURATIONS, one_sided=True), local)
    hello = wm.Hello(gen=GEN, version=wm.PROTOCOL_VERSION, instance="cons", block_bytes=64, layout="raw",
                     hash_seed="", data_plane="nixl")
    effects = core.handle(ix.Received(PEER, hello), 0.0)
    assert any(isinstance(e, fx.AttachPeer) for e in effects)
    core.handle(ix.PeerAttached(PEER, GEN), 0.0)
    assert CoreView(core).session_ready(PEER)
    return core


def _fetch(round: int, low: int = 0) -> ix.Received:
    return ix.Received(PEER, wm.Fetch(gen=GEN, kv_request_id="X", round=round, keys=[b"k"], slots=[5], low=low))


def _store(core: TierCore, now: float) -> list:
    return core.handle(ix.StoreSubmitted("X", "p-X", 1, (b"k",), (0,)), now)


def test_a_duplicate_of_an_answered_fetch_never_binds_the_next_life() -> None:
    core = _producer()
    core.handle(_fetch(0), 0.1)
    assert core.producer_state("X") is ProducerState.AWAITING
    ended = core.fire(1.2)  # supply timeout: tombstoned, transfer_done(fail) for round 0
    assert any(isinstance(e, fx.Send) and isinstance(e.msg, wm.TransferDone) and e.msg.round == 0 for e in ended)
    core.fire(2.5)  # pruned
    assert core.producer_state("X") is ProducerState.ABSENT
    dup = core.handle(_fetch(0), 2.6)  # the network duplicated the first fetch
    assert core.producer_state("X") is ProducerState.ABSENT
    assert [e.reason for e in dup if isinstance(e, fx.Ignored)] == ["stale"]
    effects = _store(core, 2.7)
    assert core.producer_state("X") is ProducerState.PARKED
    assert not any(isinstance(e, fx.SendBlocks) for e in effects)


def test_a_fetch_overtaken_by_its_own_abort_never_binds() -> None:
    core = _producer()
    acked = core.handle(ix.Received(PEER, wm.AbortFetch(gen=GEN, kv_request_id="X", round=0, fetched=True)), 0.1)
    assert any(isinstance(e, fx.Send) and isinstance(e.msg, wm.AbortAck) for e in acked)
    core.handle(_fetch(0), 0.2)  # the fetch the abort overtook
    assert core.producer_state("X") is ProducerState.ABSENT
    effects = _store(core, 0.3)
    assert core.producer_state("X") is ProducerState.PARKED
    assert not any(isinstance(e, fx.SendBlocks) for e in effects)


def test_a_fetch_below_the_consumers_low_watermark_never_binds() -> None:
    core = _producer()
    core.handle(ix.Received(PEER, wm.Fetch(gen=GEN, kv_request_id="Y", round=7, keys=[b"y"], slots=[1], low=7)), 0.1)
    core.handle(_fetch(3), 0.2)  # round 3 was closed on the consumer when it said low=7
    assert core.producer_state("X") is ProducerState.ABSENT
    assert core.producer_state("Y") is ProducerState.AWAITING


def test_a_fresh_round_at_or_above_the_watermark_binds() -> None:
    core = _producer()
    core.handle(_fetch(4, low=4), 0.1)
    assert core.producer_state("X") is ProducerState.AWAITING
    effects = _store(core, 0.2)
    assert any(isinstance(e, fx.SendBlocks) for e in effects)
