"""The symmetric path through KvTierManager on real ZeroMQ sockets (127.0.0.1), on both data
planes: each manager serves its own pool's blocks (a BlockIndex) and fetches from the other.

Shows: RETRY then HIT, bytes identical, every pin released once (``pin_released_once``), a partial
prefix (the missing block MISS), serving off by default (``not_serving`` in one round trip),
``allowed_peers`` bounding whom a request probes, CURVE with ``serve_allowed_principals``, and
``drain_jobs`` releasing pins of unfetched rounds.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kvtier.api import LookupResult, RequestContext, TransferJob
from kvtier.blocksource import BlockIndex
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from tools.coreview import CoreView

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

pytestmark = pytest.mark.timeout(120)

BB = 4096
NB = 32
WAIT_S = 10.0


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[KvTierManager] = []

    def _make(**cfg: Any) -> KvTierManager:
        m = KvTierManager({"host": "127.0.0.1", "port": 0, **cfg}, BlockPool(NB, BB, pin=False))
        made.append(m)
        return m

    yield _make
    for m in made:
        m.shutdown(grace_s=0.5)


def source_req(req_id: str, kid: str, peer: KvTierManager | str) -> RequestContext:
    host, port = (peer.host, peer.port) if isinstance(peer, KvTierManager) else peer.rsplit(":", 1)
    return RequestContext(req_id=req_id, kv_transfer_params={"remote_kv_source": {
        "kv_request_id": kid, "remote_host": host, "remote_port": int(port)}})


def fill(m: KvTierManager, index: BlockIndex, keys: list[bytes], first_block: int, seed: int) -> list[bytes]:
    """The engine computed ``keys`` into blocks ``first_block..``: write a pattern and publish."""
    out = []
    for i, k in enumerate(keys):
        data = bytes([(seed + i * 7 + j) % 251 for j in range(251)]) * (BB // 251) + bytes(BB % 251)
        m.pool.write(first_block + i, data)
        index.publish(k, first_block + i)
        out.append(data)
    return out


def pump(managers: list[KvTierManager], pred, timeout_s: float = WAIT_S) -> bool:
    end = time.monotonic() + timeout_s
    while not pred():
        for m in managers:
            m.poll(0.001)
        if time.monotonic() > end:
            return pred()
    return True


def probe(c: KvTierManager, req: RequestContext, keys: list[bytes], others: list[KvTierManager]) -> list[LookupResult]:
    """The engine's steps: scan (RETRY does not stop it) and end the step, until no RETRY."""
    answers: list[LookupResult] = []

    def settled() -> bool:
        answers[:] = []
        for k in keys:
            a = c.lookup(k, req)
            answers.append(a)
            if a is LookupResult.MISS:
                break
        c.on_schedule_end()
        return LookupResult.RETRY not in answers

    assert pump([c, *others], settled), answers
    return answers


def load(c: KvTierManager, req: RequestContext, job_id: int, keys: list[bytes], slots: list[int],
         others: list[KvTierManager]):
    c.submit_load(TransferJob(job_id=job_id, keys=tuple(keys), slots=tuple(slots), req=req))
    results = []
    assert pump([c, *others], lambda: bool(results.extend(c.get_finished_jobs(poll=False)) or results))
    (r,) = results
    return r


def stat(m: KvTierManager, prefix: str) -> float:
    return sum(v for k, v in m.stats().items() if k.startswith(prefix))


@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_each_manager_serves_and_fetches_byte_identical_and_releases_every_pin(make, data_plane: str) -> None:
    a = make(serve_external=True, data_plane=data_plane)
    b = make(serve_external=True, data_plane=data_plane)
    ia, ib = BlockIndex(NB), BlockIndex(NB)
    a.serve_from(ia)
    b.serve_from(ib)
    ka = [f"prefix-a/{i}".encode() for i in range(4)]
    kb = [f"prefix-b/{i}".encode() for i in range(3)]
    data_a = fill(a, ia, ka, 0, seed=3)
    data_b = fill(b, ib, kb, 0, seed=9)

    # B fetches A's prefix; then A fetches B's (a session each way between the two)
    for cons, prod, keys, data, kid in ((b, a, ka, data_a, "ab-1"), (a, b, kb, data_b, "ba-1")):
        req = source_req(f"r-{kid}", kid, prod)
        assert cons.on_new_request(req) == "source"
        assert cons.lookup(keys[0], req) is LookupResult.RETRY
        assert probe(cons, req, keys, [prod]) == [LookupResult.HIT] * len(keys)
        slots = list(range(10, 10 + len(keys)))
        r = load(cons, req, 1, keys, slots, [prod])
        assert r.success, r
        for s, d in zip(slots, data):
            assert cons.pool.buffer(s).tobytes() == d
        assert pump([cons, prod], lambda prod=prod: not CoreView(prod.core).serve_ids())
        assert cons.forensics.open_json(kid) == []  # the request lives on, but no load of it is in progress
        cons.on_request_finished(req)
        assert pump([cons, prod], lambda cons=cons: not cons.core.probe_ids())
        # `kvtier why` tells the load once, finished, with its timeline (it stayed "in progress")
        (entry,) = [e for e in cons.forensics.recent(kid) if e.role == "consumer"]
        assert entry.ok and dict(entry.marks).keys() >= {"fetch", "first_block"} and entry.landed == len(keys)
        assert entry.path[-1] == "loaded", entry.path
        assert not [e for e in prod.forensics.recent(kid) if e.role == "offer"]  # served: nothing withdrawn
        assert cons.forensics.in_progress() == 0
    for m, idx in ((a, ia), (b, ib)):
        assert idx.pins_outstanding() == 0 and all(idx.released.values())
        assert stat(m, "kvtier_pins_released_total{outcome=ok") >= 1
        assert not CoreView(m.core).pins_held() and not m.has_pending_work()


def test_partial_prefix_hits_what_the_peer_holds_and_misses_the_rest(make) -> None:
    a, b = make(serve_external=True), make()
    ia = BlockIndex(NB)
    a.serve_from(ia)
    keys = [f"p/{i}".encode() for i in range(4)]
    fill(a, ia, keys[:3], 0, seed=1)
    req = source_req("r", "partial", a)
    b.on_new_request(req)
    assert probe(b, req, keys, [a]) == [LookupResult.HIT] * 3 + [LookupResult.MISS]
    assert load(b, req, 1, keys[:3], [0, 1, 2], [a]).success
    assert b.lookup(keys[3], req) is LookupResult.MISS  # kept: never probed again
    assert stat(a, "kvtier_served_keys_total{answer=miss}") == 1


def test_serving_is_off_by_default_and_refused_in_one_round_trip(make) -> None:
    a, b = make(), make()
    ia = BlockIndex(NB)
    a.serve_from(ia)
    keys = [b"k0", b"k1"]
    fill(a, ia, keys, 0, seed=2)
    req = source_req("r", "off", a)
    b.on_new_request(req)
    assert probe(b, req, keys, [a]) == [LookupResult.MISS]
    assert ia.pins_outstanding() == 0 and not ia.released  # the engine was never asked
    assert stat(a, "kvtier_fetches_refused_total{reason=not_serving}") == 1
    # the request never loads: its record and a counter say why its blocks were computed (I32)
    b.on_request_finished(req)
    (entry,) = b.forensics.recent("off")
    assert (entry.role, entry.reason, entry.peer) == ("probe", "not_serving", f"{a.host}:{a.port}")
    assert stat(b, "kvtier_probe_failures_total{reason=not_serving}") == 1
    from kvtier.explain import explain
    from kvtier.forensics import to_json

    text = explain(to_json([entry], entry.started)[0])
    assert "off probing its peer (symmetric) FAILED: not_serving" in text and "turn `serve_external` on there" in text, text


def test_allowed_peers_bounds_whom_a_request_probes(make) -> None:
    a = make(serve_external=True)
    b = make(allowed_peers=["10.0.0.0/8"])
    req = source_req("r", "refused", a)
    assert b.on_new_request(req) == "local"
    assert b.lookup(b"k", req) is LookupResult.MISS
    assert CoreView(b.core).sessions() == [] and b.core.probe_ids() == []
    assert stat(b, "kvtier_rejected_peer_total") == 1


def test_an_unreachable_peer_answers_miss_within_the_probe_bound(make) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = make(probe_timeout_s=0.5, serve_lookup_timeout_s=0.1)
    req = source_req("r", "nobody", f"127.0.0.1:{port}")
    b.on_new_request(req)
    t0 = time.monotonic()
    assert probe(b, req, [b"k0", b"k1"], []) == [LookupResult.MISS]
    assert time.monotonic() - t0 < 0.5 + 1.5  # probe_answered_in_bound (+ slack on a shared machine)
    # a closed port refuses the dial at once: the probe fails then, not at its deadline (decision I18's dials)
    kid = req.kv_transfer_params["remote_kv_source"]["kv_request_id"]
    assert CoreView(b.core).probe(kid).reason.value == "connect_refused"


def offered(make, kid: str, keys: list[bytes], seed: int) -> tuple[Any, Any, BlockIndex, RequestContext]:
    """A serves ``keys`` from blocks 4.. of its index; B's request ``kid`` probed them: HIT each."""
    a, b = make(serve_external=True), make()
    ia = BlockIndex(NB)
    a.serve_from(ia)
    fill(a, ia, keys, 4, seed=seed)
    req = source_req(f"r-{kid}", kid, a)
    b.on_new_request(req)
    assert probe(b, req, keys, [a]) == [LookupResult.HIT] * len(keys)
    return a, b, ia, req


def test_drain_jobs_releases_the_pins_of_an_unfetched_round(make) -> None:
    keys = [b"d0", b"d1"]
    a, b, ia, req = offered(make, "drain", keys, seed=5)
    assert ia.pinned(4) and ia.pinned(5)  # the engine must not reuse them now
    a.drain_jobs(timeout_s=5.0)
    assert not ia.pinned(4) and ia.pins_outstanding() == 0 and ia.released == {1: False}
    assert pump([a, b], lambda: b.lookup(keys[0], req) is LookupResult.MISS)  # the offer was withdrawn
    # an engine that loads on the HIT it had is told why the offer went (decision I32), and the
    # request's record names the peer it probed
    r = load(b, req, 7, keys, [10, 11], [a])
    assert (r.success, r.reason) == (False, "drained")
    where = f"{a.host}:{a.port}"
    assert [(e.role, e.ok, e.reason, e.peer) for e in b.forensics.recent("drain")] == [
        ("consumer", False, "drained", where), ("probe", False, "drained", where)]  # newest first
    # the serving side tells an offer withdrawn, not a peer's fetch refused (none came), with its own advice
    from kvtier.explain import explain
    from kvtier.forensics import to_json

    (entry,) = to_json(a.forensics.recent("drain"), a.clock())
    assert (entry["role"], entry["reason"], list(entry["marks"])) == ("offer", "drained", ["withdrawn"]), entry
    assert "blocks offered to a peer" in explain(entry) and "here withdrew the offer" in explain(entry)
    assert stat(b, "kvtier_probe_failures_total{reason=drained}") == 1


def test_curve_only_allowed_principals_are_served(make, tmp_path) -> None:
    """With CURVE every connection is authenticated; serve_allowed_principals answers only the
    named principals: ``dec-ok`` is served, ``dec-other`` (authenticated, allowed to connect) is
    refused not_serving."""
    from kvtier.transport.curve import generate_keys

    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    allowed.mkdir()
    for name, port in (("prod", ports[0]), ("dec-ok", ports[1]), ("dec-other", ports[2])):
        generate_keys(keys, name, (f"127.0.0.1:{port}",))
        (allowed / f"{name}.key").write_text((keys / f"{name}.key").read_text())

    def curve(name: str, port: int) -> dict:
        return {"auth": "curve", "auth_secret_key_file": str(keys / f"{name}.key_secret"),
                "auth_allowed_keys_dir": str(allowed), "port": port}

    p = make(serve_external=True, serve_allowed_principals=["dec-ok"], **curve("prod", ports[0]))
    ok, other = make(**curve("dec-ok", ports[1])), make(**curve("dec-other", ports[2]))
    ip = BlockIndex(NB)
    p.serve_from(ip)
    fill(p, ip, [b"c0"], 0, seed=7)
    r_ok, r_other = source_req("a", "cv-1", p), source_req("b", "cv-2", p)
    ok.on_new_request(r_ok)
    other.on_new_request(r_other)
    assert probe(ok, r_ok, [b"c0"], [p, other]) == [LookupResult.HIT]
    assert probe(other, r_other, [b"c0"], [p, ok]) == [LookupResult.MISS]
    assert CoreView(other.core).probe("cv-2").reason.value == "not_serving"
    assert load(ok, r_ok, 1, [b"c0"], [3], [p, other]).success


def test_a_source_missing_a_method_is_refused_even_after_a_good_one_was_taken(make) -> None:
    """``serve_external_requests`` and ``serve_from`` check the source's type once (vLLM hands the
    same source in every tier poll); a source of another class is still checked, and one that
    lacks a method is refused with a ``TypeError`` naming its class."""
    m = make(serve_external=True)
    index = BlockIndex(NB)
    assert m.serve_external_requests(index) == 0
    m.serve_from(index)
    m.serve_from(None)

    class NoRelease:
        def open(self, ctx_id: str) -> None: ...
        def lookup(self, key: bytes, ctx: Any) -> Any: ...
        def pin(self, keys: Any, ctx: Any) -> Any: ...
        def close(self, ctx: Any) -> None: ...

    for call in (m.serve_external_requests, m.serve_from):
        with pytest.raises(TypeError, match="must implement kvtier.blocksource.BlockSource, got NoRelease"):
            call(NoRelease())
    assert m.serve_external_requests(index) == 0


def test_a_served_round_cut_short_by_shutdown_is_not_told_as_an_offer_withdrawn(make) -> None:
    """The serving side shuts down while it waits for the receipt of a round it delivered: its
    answer carries ``shutdown``, but the offer was fetched: no "offer withdrawn" entry."""
    keys = [b"sv0", b"sv1"]
    a, b, _, req = offered(make, "sv", keys, seed=6)
    b.submit_load(TransferJob(job_id=7, keys=tuple(keys), slots=(10, 11), req=req))
    b.poll(0.01)  # the fetch leaves; the consumer is then not polled: its receipt waits

    def delivering() -> bool:
        view = CoreView(a.core)
        return any(view.serve_state(*k).value == "delivering" for k in view.serve_ids() if k[1] == "sv")

    assert pump([a], delivering)
    a.shutdown(grace_s=0.3)
    results: list = []
    assert pump([b], lambda: bool(results.extend(b.get_finished_jobs()) or results))
    assert results[0].success, results
    assert [e.role for e in a.forensics.recent("sv")] == [], a.forensics.recent("sv")
    # the consumer's probe had no round open when the session ended: nothing failed to report
    b.on_request_finished(req)
    pump([b], lambda: False, 0.3)
    assert [e for e in b.forensics.recent("sv") if e.role == "probe" and not e.ok] == [], b.forensics.recent("sv")
    assert stat(b, "kvtier_probe_failures_total") == 0


def test_a_prompt_longer_than_the_peers_budget_still_gets_the_prefix_it_holds(make) -> None:
    """Y23: the pinned-block budget (here half the pool: 16 blocks) bounds what the peer pins, not
    how many keys a probe names.  A 24-block prompt whose first 4 blocks the peer holds gets those
    4 (they were refused ``serve_busy`` for naming more keys than the budget)."""
    a, b = make(serve_external=True), make()
    ia = BlockIndex(NB)
    a.serve_from(ia)
    keys = [f"long/{i}".encode() for i in range(24)]
    data = fill(a, ia, keys[:4], 0, seed=5)
    req = source_req("r-long", "long-1", a)
    b.on_new_request(req)
    assert probe(b, req, keys, [a]) == [LookupResult.HIT] * 4 + [LookupResult.MISS]
    r = load(b, req, 1, keys[:4], [0, 1, 2, 3], [a])
    assert r.success and [b.pool.buffer(i).tobytes() for i in range(4)] == data
    assert stat(a, "kvtier_fetches_refused_total") == 0


def test_a_prefix_several_requests_probe_at_once_is_counted_once_against_the_budget(make) -> None:
    """Y23: three requests share a 12-block system prompt and probe it one after another while the
    earlier offers still hold it: the peer pins 12 distinct blocks (its budget is 16), so all three
    get it — a block pinned already costs a lookup nothing (the third was refused ``serve_busy``
    when pins were counted per round; a lookup cut at the room left for new blocks got 12, 4, 4)."""
    a, b = make(serve_external=True, serve_max_rounds_per_peer=8), make()
    ia = BlockIndex(NB)
    a.serve_from(ia)
    keys = [f"system/{i}".encode() for i in range(12)]
    fill(a, ia, keys, 0, seed=11)
    for n in range(3):
        req = source_req(f"r-shared-{n}", f"shared-{n}", a)
        b.on_new_request(req)
        assert probe(b, req, keys, [a]) == [LookupResult.HIT] * 12, n
    assert stat(a, "kvtier_fetches_refused_total") == 0


def test_a_standing_sources_pending_keys_are_looked_up_again_while_its_loop_sleeps(make) -> None:
    """Y24: a key the engine reports PENDING (still on its way into its primary tier) is looked up
    again at later windows; with a standing source on a loop of its own that sleeps until input,
    the re-poll waited for the ``serve_lookup`` deadline, which answers it miss (0.05 s pending →
    MISS after 0.25 s).  The loop now comes back every ``REPOLL_S`` while such a lookup waits."""
    from kvtier.blocksource import Presence

    class Arriving(BlockIndex):  # the last key lands in the engine's primary 50 ms after the probe
        ready_at: float | None = None

        def lookup(self, key: bytes, ctx: Any) -> Presence:
            if key.endswith(b"/3"):
                self.ready_at = self.ready_at or time.monotonic() + 0.05
                if time.monotonic() < self.ready_at:
                    return Presence.PENDING
            return super().lookup(key, ctx)

    a, b = make(serve_external=True, background_poll=True), make()
    ia = Arriving(NB)
    keys = [f"arriving/{i}".encode() for i in range(4)]
    with a.lock:
        fill(a, ia, keys, 0, seed=7)
    a.serve_from(ia)
    req = source_req("r-pending", "pending-1", a)
    b.on_new_request(req)
    assert probe(b, req, keys, [a]) == [LookupResult.HIT] * 4
