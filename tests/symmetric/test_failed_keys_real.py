"""A symmetric load whose block fails its digest check turns its keys into MISS for the request
(decision I22), over real sockets, both planes: the engine recomputes them instead of probing,
being offered and loading them again (before decision I22 a key was loaded 10 times in 20 steps).

The bytes go bad on the way: on zmq a TCP relay on the path inverts one byte of the second block's
payload; on NIXL the consumer's slot is rewritten after the producer's WRITE and before the
consumer checks it (when its plane reports the batch's header).  Either way the consumer's check fails, the load fails ``corrupt``
naming the block before the bad one (checked: its slot holds the peer's bytes, so vLLM keeps it),
and from then on every key from the bad one on answers MISS — through ten more engine steps no
probe leaves for them.
"""

from __future__ import annotations

import pytest

from kvtier.api import LookupResult
from kvtier.blocksource import BlockIndex
from tests.support.relay import TcpRelay
from tests.symmetric.test_manager_symmetric import NB, fill, load, make, probe, pump, source_req, stat

__all__ = ["make"]  # the fixture, imported for this module's tests

pytestmark = pytest.mark.timeout(120)


def _steps(c, req, keys, others, n: int = 10) -> list[list[LookupResult]]:
    """``n`` engine steps: a prefix scan of ``keys`` (until the first MISS) and the step's end."""
    out = []
    for _ in range(n):
        answers = []
        for k in keys:
            a = c.lookup(k, req)
            answers.append(a)
            if a is LookupResult.MISS:
                break
        c.on_schedule_end()
        pump([c, *others], lambda: False, timeout_s=0.02)
        out.append(answers)
    return out


@pytest.mark.parametrize("data_plane", ["zmq", "nixl"])
def test_a_load_that_fails_its_check_turns_its_keys_into_miss(make, data_plane: str) -> None:
    a, b = make(serve_external=True, data_plane=data_plane), make(data_plane=data_plane)
    ia = BlockIndex(NB)
    a.serve_from(ia)
    keys = [f"bad/{i}".encode() for i in range(4)]
    fill(a, ia, keys, 0, seed=5)
    # zmq: invert a byte of the second block's payload (hellos, replies and headers are far shorter)
    with TcpRelay(a.address, flip_at=4096 + 2048 if data_plane == "zmq" else None) as relay:
        req = source_req("r-bad", "bad", relay.address)
        b.on_new_request(req)
        assert probe(b, req, keys, [a]) == [LookupResult.HIT] * 4
        slots = [10, 11, 12, 13]
        if data_plane == "nixl":
            # the slot is rewritten after the WRITE landed and before the consumer checks it: when
            # its plane reports the batch's header (Notified, the DataPlane seam's poll), the data
            # is in the slots and no check has run yet — whether UCX completed the WRITE without
            # the consumer's progress or not
            from kvtier.dataplane import Notified

            plane, plane_poll, flips = b.plane, b.plane.poll, []

            def poll_then_corrupt():
                reports = plane_poll()
                if not flips and any(isinstance(rep, Notified) for rep in reports):
                    b.pool.buffer(11)[100] ^= 0xFF
                    flips.append(1)
                return reports

            plane.poll = poll_then_corrupt
            b.submit_load(_job(1, keys, slots, req))
            results: list = []
            assert pump([a, b], lambda: bool(results.extend(b.get_finished_jobs(poll=False)) or results))
            assert flips == [1]
            (r,) = results
        else:
            r = load(b, req, 1, keys, slots, [a])
            assert relay.flipped == 1
        # the second block is the bad one: the first was checked before it, and is named
        assert (r.success, r.reason, r.successful_keys) == (False, "corrupt", (b"bad/0",)), r
        fetches = stat(a, "kvtier_served_keys_total")
        steps = _steps(b, req, keys[1:], [a])  # the engine kept bad/0: it scans on from the hole
        assert all(s == [LookupResult.MISS] for s in steps), steps
        assert stat(a, "kvtier_served_keys_total") == fetches  # nothing probed again
        b.on_request_finished(req)


def _job(job_id, keys, slots, req):
    from kvtier.api import TransferJob

    return TransferJob(job_id=job_id, keys=tuple(keys), slots=tuple(slots), req=req)
