"""NixlPlane on its own: two real planes (two NIXL agents over two block pools) in this process.

The control transport is a recorder (it keeps the ``block_data`` headers the plane sends); every
byte still moves through NIXL/UCX.  Covers the seam's contract for the one-sided plane: a bad slot
fails the transfer instead of raising, ``Released`` only when every WRITE is terminal, headers
only after their WRITE completed, cancel stops posting, one-sided landing refuses payloads,
revocation only on proof (a dead process, or a fresh handshake accepted by the same agent), and
close reports everything outstanding.
"""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import pytest

from kvtier.dataplane import Batch, PlaneError, Released, Revoked, make_plane
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


def _until(plane, pred, n=20000, other=None):
    """Poll ``plane`` (and ``other``, the far side, whose progress a WRITE may need) until
    ``pred(reports so far)``."""
    out = []
    for _ in range(n):
        out += plane.poll()
        if other is not None:
            other.poll()
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
    out = _until(p, lambda o: any(isinstance(r, Released) for r in o), other=c)
    assert out == [Released("kv-a", 1, False, 8 * BB, "")]
    assert [f for _, f in rec.sent] == [[b"hdr0"], [b"hdr4"]]  # one header per batch, no payload
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
    import kvtier.dataplane.nixl as nx

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


def test_a_header_that_cannot_be_sent_fails_the_transfer(pair):
    p, _, _, rec = pair
    rec.fail = True
    try:
        p.post("cons", "kv-h", 5, _batches([0, 1], [0, 1]))
        out = _until(p, lambda o: bool(o), other=pair[1])
    finally:
        rec.fail = False
    assert out[0].failed and "block_data not sent" in out[0].detail


def test_one_sided_landing_refuses_payload_frames(pair):
    _, c, _, _ = pair
    c.land([1, 2], [])  # nothing to copy: the WRITE put the bytes there
    with pytest.raises(PlaneError, match="payload frames"):
        c.land([1], [memoryview(b"x" * BB)])


def test_bad_descriptors_are_refused_with_the_reason(pair):
    p, _, _, _ = pair
    for bad, why in ((b"", "descriptor"), (b"\x81\xa1x\x01", "descriptor"),
                     (msgspec.msgpack.encode({"agent": b"zz", "owner": {"host": "", "pid": 1, "started": 0}}),
                      "descriptor")):
        with pytest.raises(PlaneError, match=why):
            p.add_peer("mallory", bad)
    with pytest.raises(PlaneError, match="already registered"):  # the same agent under a 2nd name
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
    with pytest.raises(PlaneError, match="already registered"):
        p.add_peer("cons-in-2", c.descriptor())
    rec.sent.clear()
    p.post("cons-in", "kv-both", 11, _batches([0, 1], [2, 3]))
    out = _until(p, lambda o: bool(o), other=c)
    assert out[0].kv_request_id == "kv-both" and not out[0].failed
    p.remove_peer("cons-in")
    p.post("cons", "kv-both", 12, _batches([0], [4]))  # the shared agent was not forgotten
    out = _until(p, lambda o: bool(o), other=c)
    assert not out[0].failed, out


def test_revocation_needs_a_proof(pair):
    """No proof, no Revoked; a fresh handshake accepted by the same agent is a proof; it is
    reported only after the drain (our own progress ran DRAIN_S more)."""
    p, c, _, _ = pair
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
    c.add_peer("prod", p.descriptor(), accepted=True)  # it accepted our fresh hello: proof
    import time

    t0 = time.monotonic()
    out = _until(c, lambda o: bool(o), other=p)
    assert out == [Revoked("prod")] and time.monotonic() - t0 >= DRAIN_S
    assert c.revoking() == ()


def test_process_gone_only_with_proof():
    me = this_process()
    assert me.host and me.started > 0
    assert not process_gone(me, me)  # alive
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    st = open(f"/proc/{child.pid}/stat", "rb").read()
    started = int(st[st.rindex(b")") + 2 :].split()[19])
    ghost = ProcessId(me.host, child.pid, started)
    assert not process_gone(ghost, me) or child.poll() is not None
    child.wait()
    assert process_gone(ghost, me)  # exited (and reaped)
    assert process_gone(ProcessId(me.host, me.pid, me.started + 1), me)  # a recycled pid
    assert not process_gone(ProcessId("another-host/1", child.pid, started), me)  # cannot prove
    assert not process_gone(ProcessId("", child.pid, started), me)


def test_close_reports_everything_outstanding():
    pools = [BlockPool(8, 4096, pin=False) for _ in range(2)]
    rec = Recorder()
    p = make_plane("nixl", transport=rec, pool=pools[0], layout="raw")
    c = make_plane("nixl", transport=Recorder(), pool=pools[1], layout="raw")
    try:
        p.add_peer("cons", c.descriptor())
        c.add_peer("prod", p.descriptor())
        p.post("cons", "kv-z", 9, [Batch(0, (0, 1), (2, 3), b"h")])
        p.post("cons", "kv-y", 9, [Batch(0, (0,), (9,), b"h")])  # slot 9 is outside: fails
        c.revoke("prod")
    finally:
        outs = p.close(), c.close()
    by_id = {r.kv_request_id: r for r in outs[0]}
    assert set(by_id) == {"kv-z", "kv-y"} and by_id["kv-y"].failed
    assert outs[1] == [Revoked("prod")]
    assert p.close() == [] and p.poll() == []
