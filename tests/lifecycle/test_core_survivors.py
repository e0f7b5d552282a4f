"""What the core does itself between its machines, checked where a test of one machine cannot see
it: the first session's generation of a core built without ``gen_base``, the data plane's answer
for a session it no longer serves, the size of every ``block_data`` header against the plane's
limit, a revocation reaching only the loads that wait for it, and a session's loss reaching a
probe that already failed.

Times and durations are :class:`~tests.lifecycle.scenario_pair.Pair`'s (revoke timeout 1 s).
"""

from __future__ import annotations

import msgspec

from kvtier.lifecycle import ConsumerState, ProbeState, Reason, SessionState, TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import CoreSettings
from kvtier.lifecycle.effects import Ignored, JobDone, OpenConnection, RevokeAccess, SendBlocks
from kvtier.wire import messages as wm
from tests.lifecycle.scenario_pair import BASE, LOCAL, P, Pair, keys, of, sent
from tools.coreview import CoreView


def test_a_core_built_without_gen_base_numbers_its_sessions_from_1() -> None:
    """``gen_base`` defaults to 0: the first session is generation 1 (0 means "no session")."""
    core = TierCore(CoreSettings(durations=BASE), LOCAL)
    assert of(core.handle(ix.Dial("prefill:1"), 0.0), OpenConnection) == [OpenConnection("prefill:1", 1)]
    assert of(core.handle(ix.Dial("prefill:2"), 0.0), OpenConnection) == [OpenConnection("prefill:2", 2)]


def test_the_planes_answer_for_another_generation_or_an_unknown_peer_is_dropped_as_stale() -> None:
    s = Pair()
    assert s.c.handle(ix.PeerAttached(P, s.gen + 1), 1.0) == [
        Ignored("session", P, SessionState.READY, "plane_attached", Reason.STALE)]
    assert s.c.handle(ix.AttachRefused(P, s.gen - 1, "old"), 1.0) == [
        Ignored("session", P, SessionState.READY, "plane_refused", Reason.STALE)]
    assert s.c.handle(ix.PeerAttached("nobody:1", s.gen), 1.0) == [
        Ignored("session", "nobody:1", SessionState.ABSENT, "plane_attached", Reason.STALE)]
    assert s.c.handle(ix.AttachRefused("nobody:1", s.gen), 1.0) == [
        Ignored("session", "nobody:1", SessionState.ABSENT, "plane_refused", Reason.STALE)]
    assert CoreView(s.c).session_ready(P)  # the live session is untouched


def test_every_block_data_header_fits_the_planes_header_limit() -> None:
    """A plane that carries headers of at most ``max_header_bytes`` (NIXL: a notification) gets a
    transfer cut into batches whose header, digests included, fits; without a limit one batch."""
    limit = 110
    s = Pair(options={"block_bytes": 16, "max_header_bytes": limit})
    ks = keys("A", 6)
    s.p.handle(ix.StoreSubmitted("A", "req-A", 1, ks, tuple(range(6)), digests=(2**64 - 1,) * 6), 0.0)
    (send,) = of(s.fetch("A", ks, 1.0), SendBlocks)
    assert len(send.headers) > 1
    assert [(h.first, h.count) for h in send.headers] == [
        (sum(x.count for x in send.headers[:i]), h.count) for i, h in enumerate(send.headers)]
    assert sum(h.count for h in send.headers) == 6
    for h in send.headers:
        assert len(msgspec.msgpack.encode(h)) <= limit, h
        assert h.digests == [2**64 - 1] * h.count
    unlimited = Pair(options={"block_bytes": 16})
    unlimited.p.handle(ix.StoreSubmitted("A", "req-A", 1, ks, tuple(range(6)), digests=(2**64 - 1,) * 6), 0.0)
    (whole,) = of(unlimited.fetch("A", ks, 1.0), SendBlocks)
    assert [(h.first, h.count) for h in whole.headers] == [(0, 6)]


def test_a_revocation_reaches_only_the_loads_waiting_for_it() -> None:
    """The plane's ``access_revoked`` for a peer ends the loads of that peer in ``revoking``; a
    load of the same peer that already loaded is not told (nothing is counted stale)."""
    s = Pair()
    job_b, rnd_b, _ = s.load("B", 1, 0.0)
    s.to_c(wm.BlockData(gen=s.gen, kv_request_id="B", round=rnd_b, first=0, count=1), 0.1)
    assert of(s.c.handle(ix.BlocksLanded(P, "B", rnd_b, 0, 1, True), 0.2), JobDone) == [JobDone(job_b, True, None)]
    assert s.c.consumer_state("B") is ConsumerState.LOADED
    job_a, _, _ = s.load("A", 1, 0.3)
    out = s.c.handle(ix.ConnectionClosed(P), 0.4)  # the session dies with A in flight
    assert of(out, RevokeAccess) == [RevokeAccess(P)]
    assert s.c.consumer_state("A") is ConsumerState.REVOKING
    out = s.c.handle(ix.AccessRevoked(P), 0.5)
    assert out == [JobDone(job_a, False, Reason.PEER_DISCONNECTED)]
    assert s.c.consumer_state("A") is ConsumerState.FAILED and s.c.consumer_state("B") is ConsumerState.LOADED


def test_a_session_lost_again_leaves_a_probe_that_already_failed_as_it_was() -> None:
    """A probe whose session died is failed; the next session to the same peer (dialled for
    another probe) dying too changes nothing for it: that loss is counted stale there."""
    s = Pair()
    s.c.handle(ix.ProbeAnnounced("sym-1", "peer:9"), 1.0)  # dials peer:9
    s.c.handle(ix.ConnectFailed("peer:9"), 1.1)
    assert s.c.probe_state("sym-1") is ProbeState.FAILED
    s.c.handle(ix.ProbeAnnounced("sym-2", "peer:9"), 2.0)  # dials peer:9 again
    assert s.c.probe_state("sym-2") is ProbeState.IDLE
    out = s.c.handle(ix.ConnectFailed("peer:9"), 2.1)
    assert of(out, Ignored) == [Ignored("probe", "sym-1", ProbeState.FAILED, "peer_lost", Reason.STALE)]
    assert s.c.probe_state("sym-1") is ProbeState.FAILED and s.c.probe_state("sym-2") is ProbeState.FAILED
    assert sent(out, wm.Fetch) == []
