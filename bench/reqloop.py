"""Two managers in one process, a 1-block request loop: what one request costs end to end.

The producer parks one 64 KiB block per request, the consumer loads it; both managers are driven
from this thread only (``poll`` / ``get_finished_jobs``, no background I/O thread), so the figure
is the request path's own cost with no thread hand-off, against a raw pyzmq ROUTER/DEALER
request/reply carrying the same block between two sockets of this process (``recv_into``).

``python -m bench.reqloop [N] [zmq|nixl]`` prints the medians; run it under py-spy or cProfile to
see where a request's time goes.  ``python -m bench.reqloop --files [zmq|nixl]`` lists the kvtier
files one request's calls run in, with the calls in each (decisions C13, C32)."""

from __future__ import annotations

import itertools
import logging
import sys
import time
from typing import Any

BS = 64 << 10


def start_one(prod: Any, cons: Any, kid: str, jobs: Any, host: str, port: int) -> tuple[Any, int, float]:
    """``prod`` parks block 0 under ``kid`` (key ``k0``, its request already finished, as vLLM
    does after its last store); ``cons`` is told of a request that fetches it from ``host:port``
    and submits the load into slot 1.  Returns the consumer's
    :class:`~kvtier.api.RequestContext`, the load's job id and ``perf_counter`` right before
    ``submit_load``."""
    from kvtier.api import RequestContext, TransferJob

    preq = RequestContext(req_id="P" + kid, kv_transfer_params={"remote_decoder": {"kv_request_id": kid}})
    prod.on_new_request(preq)
    prod.submit_store(TransferJob(job_id=next(jobs), keys=(b"k0",), slots=(0,), req=preq))
    prod.on_request_finished(preq)
    creq = RequestContext(req_id="C" + kid, kv_transfer_params={
        "remote_prefiller": {"kv_request_id": kid, "remote_host": host, "remote_port": port}})
    cons.on_new_request(creq)
    job = next(jobs)
    t0 = time.perf_counter()
    cons.submit_load(TransferJob(job_id=job, keys=(b"k0",), slots=(1,), req=creq))
    return creq, job, t0


def kvtier_loop(n: int, plane: str = "zmq", warm: int = 50) -> list[float]:
    """Seconds per request (submit_load → its successful JobResult), ``n`` requests."""
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    logging.getLogger("kvtier").setLevel(logging.ERROR)
    cfg = {"host": "127.0.0.1", "port": 0, "data_plane": plane, "allowed_peers": ["127.0.0.1"]}
    prod, cons = KvTierManager(cfg, BlockPool(4, BS)), KvTierManager(cfg, BlockPool(4, BS))
    host, _, port = prod.address.rpartition(":")
    jobs = itertools.count(1)

    def one(i: int) -> float:
        kid = f"r{i}"
        creq, j, t0 = start_one(prod, cons, kid, jobs, host, int(port))
        done: list[Any] = []
        while not done:
            prod.poll(0)
            done = [r for r in cons.get_finished_jobs() if r.job_id == j]
        dt = time.perf_counter() - t0
        if not done[0].success:
            raise RuntimeError(f"request {kid} failed: {done[0]}")
        cons.on_request_finished(creq)
        deadline = time.monotonic() + 5
        while prod.has_pending_work() and time.monotonic() < deadline:  # the receipt, the store's result
            prod.poll(0.0005)
            prod.get_finished_jobs()
        return dt

    try:
        for i in range(warm):
            one(i)
        return [one(i) for i in range(warm, warm + n)]
    finally:
        prod.shutdown(grace_s=0.2)
        cons.shutdown(grace_s=0.2)


def raw_loop(n: int, warm: int = 100) -> list[float]:
    """Seconds per raw request/reply of one 64 KiB block (DEALER → ROUTER → the block, recv_into)."""
    import numpy as np
    import zmq

    ctx = zmq.Context(1)
    r, d = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    r.bind("tcp://127.0.0.1:*")
    d.connect(r.getsockopt_string(zmq.LAST_ENDPOINT))
    blk, dst = np.ones(BS, dtype=np.uint8), np.zeros(BS, dtype=np.uint8)

    def one() -> float:
        t0 = time.perf_counter()
        d.send(b"x" * 96)
        rid, _ = r.recv_multipart()
        r.send_multipart([rid, blk], copy=False)
        d.recv_into(dst)
        return time.perf_counter() - t0

    try:
        for _ in range(warm):
            one()
        return [one() for _ in range(n)]
    finally:
        ctx.destroy(linger=0)


def files_crossed(plane: str = "zmq") -> tuple[dict[str, int], int]:
    """The kvtier source files whose functions run for one warm 1-block request (both managers,
    from the producer's ``submit_store`` to the consumer's successful ``JobResult``), in order of
    first entry, each with how many of its functions were called, and how many kvtier calls that
    takes in all (``sys.setprofile``; housekeeping of the passes it takes included)."""
    import os as _os

    from kvtier.api import RequestContext, TransferJob
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    logging.getLogger("kvtier").setLevel(logging.ERROR)
    cfg = {"host": "127.0.0.1", "port": 0, "data_plane": plane, "allowed_peers": ["127.0.0.1"]}
    prod, cons = KvTierManager(cfg, BlockPool(4, BS)), KvTierManager(cfg, BlockPool(4, BS))
    host, _, port = prod.address.rpartition(":")
    sep = _os.sep + "kvtier" + _os.sep
    seen: dict[str, int] = {}
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" and sep in frame.f_code.co_filename:
            calls += 1
            rel = frame.f_code.co_filename.split(sep, 1)[1]
            seen[rel] = seen.get(rel, 0) + 1

    try:
        for i in range(6):  # five warm requests, the sixth traced
            kid = f"f{i}"
            preq = RequestContext(req_id="P" + kid, kv_transfer_params={"remote_decoder": {"kv_request_id": kid}})
            creq = RequestContext(req_id="C" + kid, kv_transfer_params={
                "remote_prefiller": {"kv_request_id": kid, "remote_host": host, "remote_port": int(port)}})
            prod.on_new_request(preq)
            cons.on_new_request(creq)
            if i == 5:
                sys.setprofile(profile)
            prod.submit_store(TransferJob(job_id=2 * i + 1, keys=(b"k0",), slots=(0,), req=preq))
            cons.submit_load(TransferJob(job_id=2 * i + 2, keys=(b"k0",), slots=(1,), req=creq))
            done: list[Any] = []
            while not done:
                prod.poll(0.001)
                done = [r for r in cons.get_finished_jobs() if r.job_id == 2 * i + 2]
                if not done:
                    cons.poll(0.001)
            sys.setprofile(None)
            prod.on_request_finished(preq)
            cons.on_request_finished(creq)
            for _ in range(50):
                prod.poll(0.001)
                prod.get_finished_jobs()
    finally:
        sys.setprofile(None)
        prod.shutdown(grace_s=0.2)
        cons.shutdown(grace_s=0.2)
    return seen, calls


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--files":
        seen, calls = files_crossed(argv[1] if len(argv) > 1 else "zmq")
        print(f"{len(seen)} kvtier files, {calls} kvtier calls for one 1-block request (calls per file):")
        for f, n in seen.items():
            print(f"  {n:4d}  {f}")
        return
    n = int(argv[0]) if argv else 2000
    plane = argv[1] if len(argv) > 1 else "zmq"
    import os
    import statistics

    kv, raw = kvtier_loop(n, plane), raw_loop(n)
    km, rm = statistics.median(kv), statistics.median(raw)
    print(f"{plane}: kvtier 1-block request median {km * 1e6:.0f} µs, raw {rm * 1e6:.0f} µs, "
          f"ratio {km / rm:.2f} (n={n}, load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main(sys.argv[1:])
