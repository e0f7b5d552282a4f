"""NixlPlane on its own: two real planes (two NIXL agents over two block pools) in this process.

The control transport is a recorder (it keeps whatever the plane sends on it: since protocol
version 3, nothing); every byte still moves through NIXL/UCX.  Covers the seam's contract for the
one-sided plane: a bad slot fails the transfer instead of raising, ``Released`` only when every
WRITE is terminal, each batch's header reaches the consumer as its WRITE's notification once the
WRITE's bytes are there, cancel stops posting, one-sided landing refuses payloads and checks the
slots, revocation only on proof (a dead process, or a fresh handshake accepted by the same
agent), and close reports everything outstanding.
"""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import pytest

from kvtier.dataplane import Attached, Batch, Notified, PeerStillHeld, PlaneError, Released, Revoked, make_plane
from kvtier.integrity import digest
from kvtier.dataplane.nixl import DRAIN_S, ProcessId, process_gone, this_process
from kvtier.memory import BlockPool
from kvtier.transport import SendHandle

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

pytestmark = pytest.mark.timeout(60)

BB = 64 * 1024
NB = 32


class Recorder:
    """A control transport that records what the plane sends (and can refuse it)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[bytes]]] = []
        self.fail = False

    def send(self, peer: str, frames: list, track: bool = False) -> SendHandle:
        h = SendHandle(peer)
        if self.fail:
            h._mark_failed("closed", "test")
        else:
            self.sent.append((peer, [bytes(f) for f in frames]))
            h._mark_sent()
        return h


@pytest.fixture(scope="module")
def pair():
    """(producer plane, consumer plane, their pools, the producer's recorder); one pair of agents
    for the module (0.5 s each), peers added both ways as the handshake does."""
    pools = [BlockPool(NB, BB, pin=False) for _ in range(2)]
    rec = Recorder()
    p = make_plane("nixl", transport=rec, pool=pools[0], layout="raw")
    c = make_plane("nixl", transport=Recorder(), pool=pools[1], layout="raw")
    c.add_peer("prod", p.descriptor())
    p.add_peer("cons", c.descriptor(), accepted=True)
    yield p, c, pools, rec
    p.close()
    c.close()


def _until(plane, pred, n=20000, other=None, seen=None):
    """Poll ``plane`` (and ``other``, the far side, whose progress a WRITE may need; its reports go
    to ``seen``) until ``pred(reports so far)``."""
    out = []
    for _ in range(n):
        out += plane.poll()
        if other is not None:
            got = other.poll()
            if seen is not None:
                seen += got
        if pred(out):
            return out
    raise AssertionError(f"condition not met; saw {out}")


def _batches(blocks, slots, per=4, tag=b"hdr"):
    return [Batch(i, tuple(blocks[i : i + per]), tuple(slots[i : i + per]), tag + b"%d" % i)
            for i in range(0, len(blocks), per)]


def test_transfer_lands_byte_exact_and_headers_follow_their_writes(pair):
    p, c, (pp, cp), rec = pair
    for i in range(8):
        pp.view(i).fill_(i + 1)
    cp.tensor.fill_(0)
    rec.sent.clear()
    slots = [20, 3, 17, 9, 30, 1, 2, 4]
    p.post("cons", "kv-a", 1, _batches(list(range(8)), slots))
    seen: list = []
    out = _until(p, lambda o: any(isinstance(r, Released) for r in o), other=c, seen=seen)
    assert out == [Released("kv-a", 1, False, 8 * BB, "")]
    for _ in range(20000):  # the last notification may still be on its way
        if len(seen) >= 2:
            break
        seen += c.poll()
    # one header per batch, as its WRITE's notification, with the WRITE's bytes already there;
    # nothing on the control connection
    # (the consumer's own attach of "prod" may report in between: the fixture's warm-up READ)
    assert [r for r in seen if not isinstance(r, Attached)] == [Notified("prod", (b"hdr0",)),
                                                                 Notified("prod", (b"hdr4",))]
    assert rec.sent == []
    for i, s in enumerate(slots):
        assert bytes(cp.buffer(s)) == bytes([i + 1]) * BB
    assert p.referenced() == 0


def test_a_bad_slot_fails_the_transfer_without_raising_or_posting(pair):
    p, c, _, rec = pair
    rec.sent.clear()
    before = p.posts
    for slots in ([0, NB], [-1, 2], [5, 5]):  # out of the consumer's pool, negative, duplicate
        p.post("cons", "kv-bad", 2, [Batch(0, (0, 1), tuple(slots), b"h")])
        out = _until(p, lambda o: bool(o))
        assert len(out) == 1 and out[0].failed and out[0].nbytes == 0, out
        assert "not posted" in out[0].detail
    p.post("nobody", "kv-bad", 3, [Batch(0, (0,), (0,), b"h")])
    out = _until(p, lambda o: bool(o))
    assert out[0].failed and "no NIXL descriptor" in out[0].detail
    assert p.posts == before and rec.sent == []


def test_cancel_stops_posting_and_release_waits_for_posted_writes(pair, monkeypatch):
    import kvtier.dataplane.nixl_pipeline as nx

    p, c, _, rec = pair
    monkeypatch.setattr(nx, "WINDOW_BYTES", 4 * BB)  # one batch in flight at a time
    before = p.posts
    p.post("cons", "kv-c", 4, _batches(list(range(16)), list(range(16))))
    p.cancel("kv-c", 4)
    posted = p.posts - before  # a WRITE that completes at once lets post() go on to the next
    assert 1 <= posted < 4
    out = _until(p, lambda o: bool(o), other=c)
    assert out[0].kv_request_id == "kv-c" and not out[0].failed
    assert p.posts - before == posted and out[0].nbytes == posted * 4 * BB  # posted ones ran to their end


def test_a_header_too_long_for_a_notification_fails_the_transfer_unposted(pair):
    p, _, _, rec = pair
    assert p.max_header_bytes == 4096
    before = p.posts
    p.post("cons", "kv-h", 5, [Batch(0, (0, 1), (0, 1), b"h" * 4097)])
    out = _until(p, lambda o: bool(o), other=pair[1])
    assert out[0].failed and "not posted" in out[0].detail and p.posts == before


def test_one_sided_landing_checks_the_slots_and_refuses_payload_frames(pair):
    _, c, (_, cp), _ = pair
    cp.view(1).fill_(11)
    cp.view(2).fill_(12)
    good = [digest(cp.buffer(1)), digest(cp.buffer(2))]
    # nothing to copy (the WRITE put the bytes there): a check, done here for a small landing
    assert c.land("prod", "k1", [1, 2], [], good) == -1
    assert c.land("prod", "k2", [1, 2], [], [good[0], good[0]]) == 1
    with pytest.raises(PlaneError, match="payload frames"):
        c.land("prod", "k3", [1], [memoryview(b"x" * BB)], good[:1])


def test_bad_descriptors_are_refused_with_the_reason(pair):
    p, _, _, _ = pair
    for bad, why in ((b"", "descriptor"), (b"\x81\xa1x\x01", "descriptor"),
                     (msgspec.msgpack.encode({"agent": b"zz", "owner": {"host": "", "pid": 1, "started": 0}}),
                      "descriptor")):
        with pytest.raises(PlaneError, match=why):
            p.add_peer("mallory", bad)
    # the same agent under a 2nd name: refused for now, as still held (not a mismatch, decision N25)
    with pytest.raises(PeerStillHeld, match="still held by our session cons with that consumer: an earlier one not ended here yet, or"):
        p.add_peer("cons-again", pair[1].descriptor(), accepted=True)
    with pytest.raises(PlaneError, match="itself"):
        p.add_peer("me", p.descriptor())


def test_one_agent_may_be_held_once_per_direction(pair):
    """Two managers with a session each way (the symmetric path: each probes the other) hold each
    other's agent twice: once for the peer that dialled us (inbound: we write into it) and once
    for the peer we dialled (it writes into us).  The agent is loaded once; removing one entry
    leaves the other working; a second inbound entry is still refused (decision Y13)."""
    p, c, _, rec = pair
    p.add_peer("cons-in", c.descriptor())  # "cons" holds it as a dialled peer already
    with pytest.raises(PeerStillHeld, match="still held by our session cons-in with"):
        p.add_peer("cons-in-2", c.descriptor())
    rec.sent.clear()
    p.post("cons-in", "kv-both", 11, _batches([0, 1], [2, 3]))
    out = _until(p, lambda o: bool(o), other=c)
    assert out[0].kv_request_id == "kv-both" and not out[0].failed
    p.remove_peer("cons-in")
    p.post("cons", "kv-both", 12, _batches([0], [4]))  # the shared agent was not forgotten
    out = _until(p, lambda o: bool(o), other=c)
    assert not out[0].failed, out



@pytest.fixture(scope="module")
def private_consumer(pair):
    """A consumer plane over a pool in private memory (no shared backing: no windows)."""
    import torch

    pool = BlockPool.wrap(torch.zeros((NB, BB), dtype=torch.uint8))
    assert pool.backing is None
    c = make_plane("nixl", transport=Recorder(), pool=pool, layout="raw")
    assert c.revocation_bounded is False
    yield c
    c.close()


def test_revocation_without_windows_needs_a_proof(pair, private_consumer):
    """Private pool: no proof, no Revoked; a fresh handshake accepted by the same agent is a
    proof; it is reported only after the drain (our own progress ran DRAIN_S more)."""
    p = pair[0]
    c = private_consumer
    c.add_peer("prod", p.descriptor())
    assert c.session_descriptor("prod", 1) == b""  # no window: the plane's one descriptor
    assert c.revoke("prod") is False
    assert c.max_wait_s() is not None  # progress keeps being asked for while revoking
    out = []
    for _ in range(200):
        out += c.poll()
    assert out == [] and c.revoking() == ("prod",)
    c.remove_peer("prod")
    c.add_peer("prod-2", p.descriptor())  # the same agent dialled us: no proof
    assert c.revoking() == ("prod",)
    c.remove_peer("prod-2")
    import time

    t0 = time.monotonic()  # before the proof: the drain counts from the proof, not from here
    c.add_peer("prod", p.descriptor(), accepted=True)  # it accepted our fresh hello: proof
    out = [r for r in _until(c, lambda o: any(isinstance(r, Revoked) for r in o), other=p) if isinstance(r, Revoked)]
    assert out == [Revoked("prod")] and time.monotonic() - t0 >= DRAIN_S
    assert c.revoking() == ()
    c.remove_peer("prod")


@pytest.fixture(scope="module")
def wpair():
    """A producer and a consumer plane over shared pools, the consumer's sessions windowed
    (nothing added yet: each test handshakes as the shell would)."""
    pools = [BlockPool(NB, BB, pin=False) for _ in range(2)]
    rec = Recorder()
    p = make_plane("nixl", transport=rec, pool=pools[0], layout="raw")
    c = make_plane("nixl", transport=Recorder(), pool=pools[1], layout="raw")
    yield p, c, pools, rec
    p.close()
    c.close()


def _fill(pool, blocks, byte):
    for b in blocks:
        pool.view(b).fill_(byte)


def _slot_bytes(pool, slots):
    return {s: set(bytes(pool.buffer(s))) for s in slots}


def test_a_withdrawn_window_takes_a_late_write_into_a_sink_and_spares_the_pool(wpair):
    """Shared pool: the session we dial gets a window of its own.  A WRITE through it lands in
    the pool; once the window is withdrawn (revoke), the same producer's next WRITE with the same
    descriptor completes but lands in the sink: the pool's slots keep what the engine put there.
    Revoked follows only after the drain."""
    import time

    p, c, (pp, cp), rec = wpair
    assert c.revocation_bounded
    desc = c.session_descriptor("prod-w", 11)
    assert desc and desc != c.descriptor() and c.windows() == {"prod-w": 11}
    from kvtier.dataplane import Attached

    assert p.add_peer("cons-w", desc, gen=11) is False  # admitted once its warm-up READ completed
    assert Attached("cons-w", 11) in _until(p, lambda o: any(isinstance(r, Attached) for r in o), other=c)
    c.add_peer("prod-w", p.descriptor(), accepted=True)
    _fill(pp, [0, 1], 0x5A)
    cp.tensor[20:24].fill_(0)
    p.post("cons-w", "kv-w", 1, [Batch(0, (0, 1), (20, 21), b"hw")])
    assert not _until(p, lambda o: any(isinstance(r, Released) for r in o), other=c)[0].failed
    assert _slot_bytes(cp, [20, 21]) == {20: {0x5A}, 21: {0x5A}}  # through the window, into the pool

    t0 = time.monotonic()
    assert c.revoke("prod-w") is False
    assert c.windows() == {} and c.sinks() >= 1
    _fill(pp, [2, 3], 0xA5)
    p.post("cons-w", "kv-w", 2, [Batch(0, (2, 3), (22, 23), b"hx")])
    late = _until(p, lambda o: any(isinstance(r, Released) for r in o), other=c)
    assert [r.failed for r in late if isinstance(r, Released)] == [False]  # NIXL says DONE ...
    assert _slot_bytes(cp, [22, 23]) == {22: {0}, 23: {0}}  # ... and the pool never saw it
    out = _until(c, lambda o: bool(o), other=p)
    assert out == [Revoked("prod-w")] and time.monotonic() - t0 >= DRAIN_S
    p.remove_peer("cons-w")
    c.remove_peer("prod-w")


def test_a_session_end_withdraws_its_window_and_a_new_session_gets_a_new_one(wpair):
    p, c, _, _ = wpair
    d1 = c.session_descriptor("prod-s", 1)
    sinks = c.sinks()
    c.remove_peer("prod-s")  # the session ended (DetachPeer)
    assert c.windows() == {} and c.sinks() == sinks + 1
    d2 = c.session_descriptor("prod-s", 2)
    assert d2 and d2 != d1 and c.windows() == {"prod-s": 2}
    c.remove_peer("prod-s")


def test_an_agent_still_draining_writes_defers_the_attach_until_they_end(wpair, monkeypatch):
    """The producer side: a consumer's new session names the agent its old (removed) entry still
    holds with WRITEs in flight.  add_peer defers (False, nothing added); poll reports Attached
    for the new generation once they ended, and the new entry works.  (Over CMA a WRITE usually
    ends inside its post, so the in-flight WRITE is the agent's answer, faked here.)"""
    from kvtier.dataplane import Attached

    p, c, (pp, cp), rec = wpair
    d_new = c.session_descriptor("prod-d", 2)
    draining = {"left": 3}
    real = p.agent.holder

    def holder(agent, group=""):
        if draining["left"]:
            draining["left"] -= 1
            return ("cons-old", True, 1)  # removed, one WRITE still in flight
        return real(agent, group)

    monkeypatch.setattr(p.agent, "holder", holder)
    assert p.add_peer("cons-new", d_new, gen=2) is False
    assert "cons-new" not in p.agent.peers
    out = _until(p, lambda o: any(isinstance(r, Attached) for r in o), other=c)
    assert [r for r in out if isinstance(r, Attached)] == [Attached("cons-new", 2)]
    p.post("cons-new", "kv-d", 2, [Batch(0, (0,), (5,), b"hd")])
    done = _until(p, lambda o: any(isinstance(r, Released) for r in o), other=c)
    assert [r.failed for r in done if isinstance(r, Released)] == [False]
    p.remove_peer("cons-new")
    c.remove_peer("prod-d")


def test_a_warmed_endpoint_completes_a_write_while_the_target_makes_no_progress(wpair):
    """The producer admits a consumer's session only after a warm-up READ of its window (both
    sides progress during the handshake); a WRITE posted afterwards completes although the
    consumer never calls into NIXL again (decision N15: else the first WRITE on a new endpoint
    waits for the target, and so does its block_data header)."""
    from kvtier.dataplane import Attached

    p, c, (pp, cp), rec = wpair
    desc = c.session_descriptor("prod-warm", 3)
    assert p.add_peer("cons-warm", desc, gen=3) is False
    _until(p, lambda o: any(isinstance(r, Attached) for r in o), other=c)
    _fill(pp, [6], 0x77)
    p.post("cons-warm", "kv-warm", 1, [Batch(0, (6,), (26,), b"hw")])
    out = _until(p, lambda o: any(isinstance(r, Released) for r in o))  # the consumer is not polled
    assert [r.failed for r in out if isinstance(r, Released)] == [False]
    assert _slot_bytes(cp, [26]) == {26: {0x77}}
    p.remove_peer("cons-warm")
    c.remove_peer("prod-warm")


def test_a_session_is_admitted_after_its_warm_up_reads_one_after_another(wpair, monkeypatch):
    """N15: the producer posts WARM_READS warm-up READs, each once the one before completed, and
    reports ``Attached`` only after the last (one READ left a fresh producer's first WRITE waiting
    for a stalled consumer in 14 of 40 real-process trials)."""
    from kvtier.dataplane.nixl import WARM_READS

    p, c, _, _ = wpair
    posted: list[int] = []
    ended: set[int] = set()
    real_warm, real_poll = p.agent.warm, p.agent.poll

    def warm(peer):
        assert set(posted) <= ended, "a READ was posted before the one before it ended"
        posted.append(real_warm(peer))
        return posted[-1]

    def poll():
        events = real_poll()
        ended.update(e.xfer_id for e in events if hasattr(e, "xfer_id"))
        return events

    monkeypatch.setattr(p.agent, "warm", warm)
    monkeypatch.setattr(p.agent, "poll", poll)
    desc = c.session_descriptor("prod-reads", 9)
    assert p.add_peer("cons-reads", desc, gen=9) is False
    out = _until(p, lambda o: any(isinstance(r, Attached) for r in o), other=c)
    assert [r for r in out if isinstance(r, Attached)] == [Attached("cons-reads", 9)]
    assert WARM_READS >= 3 and len(posted) == WARM_READS
    p.remove_peer("cons-reads")
    c.remove_peer("prod-reads")


def test_the_configs_least_nixl_revocation_is_the_planes() -> None:
    """The config refuses a nixl ``revoke_timeout_s`` below what the plane needs (a window withdrawn
    and drained) before start-up, so ``kvtier check-config`` says so too, not the plane's start."""
    from kvtier.config import NIXL_MIN_REVOKE_S, TierConfig, TierConfigError

    assert NIXL_MIN_REVOKE_S == 2 * DRAIN_S
    with pytest.raises(TierConfigError, match="revoke_timeout_s=0.05 is below 0.1 s"):
        TierConfig.from_dict({"data_plane": "nixl", "revoke_timeout_s": 0.05})
    TierConfig.from_dict({"data_plane": "zmq", "revoke_timeout_s": 0.05})
    TierConfig.from_dict({"data_plane": "nixl", "revoke_timeout_s": 0.1})


def test_a_private_pools_close_ends_only_access_it_really_ends() -> None:
    """N27: without windows, destroying our agent ends a peer's access only when each agent's owner
    is gone or on another host (no CMA into our process); an owner proven gone whose drain had
    not run yet counts as ended (it read as a live producer on this host: a recheck tester)."""
    from kvtier.dataplane.nixl_revoke import Revocation, ended_by_close

    me = this_process()
    boot = me.host.partition("/")[0]
    here = ProcessId(me.host, os.getpid(), me.started)  # a live process on this host
    other = ProcessId(f"another-boot/{me.host.partition('/')[2]}", 1, 1)
    assert not ended_by_close(Revocation(agents={"a": here}), me)
    assert ended_by_close(Revocation(agents={"a": other}), me)
    assert not ended_by_close(Revocation(agents={"a": other, "b": here}), me)
    assert not ended_by_close(Revocation(agents={"a": ProcessId("", 1, 1)}), me)  # nothing known of it
    assert not ended_by_close(Revocation(), me)  # no agent known: nothing proven
    assert ended_by_close(Revocation(proven_at=1.0), me)  # gone, proven; only the drain was left
    assert boot  # this_process() read the host
