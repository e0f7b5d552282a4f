"""Helpers shared by the runtime manager tests (tests/manager/).

Nothing here replaces kvtier code: managers, transports, pools and the lifecycle core are the
real ones.  These are bookkeeping helpers: collect job results (keeping duplicates visible), poll
several managers until a condition holds (bounded, never a timing assertion), read metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from kvtier.api import JobResult, RequestContext, TransferJob
from kvtier.manager import KvTierManager
from kvtier.testing.pair import Jobs
from kvtier.testing.pair import VirtualPair as _KitPair
from tests.support.peer_process import block_pattern, pattern_digest, slot_digest
from tools.coreview import CoreView

__all__ = [
    "BOTH_PLANES",
    "Jobs",
    "asleep",
    "block_pattern",
    "consumer_req",
    "digests",
    "fill_pattern",
    "keys_for",
    "metric",
    "pattern_digest",
    "producer_req",
    "pump_until",
    "slot_digest",
]

#: Decorator: run a test once per data plane (parametrises the ``data_plane`` fixture, which
#: ``producer``, ``victim`` and ``make_manager`` configure their managers with).
BOTH_PLANES = pytest.mark.parametrize("data_plane", ["zmq", "nixl"], indirect=True)

#: Upper bound of every wait in these tests.  Only there to stop a hung test; nothing asserts
#: how long anything took.
WAIT_S = 8.0

SENTINEL = 0xAB


def serve_http(body: bytes, status: int = 200, content_type: str = "text/plain; version=0.0.4") -> Any:
    """An HTTP server on loopback that answers every GET with ``status`` and ``body`` (a fake
    metrics endpoint); the caller shuts it down (``shutdown()``, ``server_close()``)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def producer_req(req_id: str, kv_id: str) -> RequestContext:
    return RequestContext(req_id=req_id, kv_transfer_params={"remote_decoder": {"kv_request_id": kv_id}})


def consumer_req(req_id: str, kv_id: str, host: str, port: int) -> RequestContext:
    return RequestContext(
        req_id=req_id,
        kv_transfer_params={"remote_prefiller": {"kv_request_id": kv_id, "remote_host": host, "remote_port": port}},
    )


def keys_for(kv_id: str, n: int) -> list[bytes]:
    return [f"{kv_id}/blk{i}".encode() for i in range(n)]


def job(job_id: int, keys: Iterable[bytes], slots: Iterable[int], req: RequestContext) -> TransferJob:
    return TransferJob(job_id=job_id, keys=tuple(keys), slots=tuple(slots), req=req)


def fill_pattern(pool: Any, slots: Iterable[int], seed: int) -> list[str]:
    """Write block_pattern(seed, i) into the i-th slot; return the sha256 of each."""
    out = []
    for i, s in enumerate(slots):
        pool.write(s, block_pattern(seed, i, pool.block_bytes))
        out.append(slot_digest(pool, s))
    return out


def digests(pool: Any, slots: Iterable[int]) -> list[str]:
    return [slot_digest(pool, s) for s in slots]


def sentinel_digest(block_bytes: int, byte: int = SENTINEL) -> str:
    import hashlib

    return hashlib.sha256(bytes([byte]) * block_bytes).hexdigest()


def metric(src: KvTierManager | dict[str, float], name: str, **labels: str) -> float:
    """Value of one sample from ``manager.stats()`` (0.0 when it was never touched)."""
    stats = src.stats() if isinstance(src, KvTierManager) else src
    if labels:
        name += "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
    return float(stats.get(name, 0.0))


def metric_sum(src: KvTierManager | dict[str, float], name: str, **labels: str) -> float:
    """Sum of every sample of ``name`` whose labels include ``labels``."""
    stats = src.stats() if isinstance(src, KvTierManager) else src
    total = 0.0
    for key, value in stats.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        have = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv)
        if all(have.get(k) == v for k, v in labels.items()):
            total += value
    return total


def in_core(mgr: KvTierManager, kv_id: str, job_id: int) -> bool:
    """Whether store job ``job_id`` of ``kv_id`` reached ``mgr``'s core, or already has its result
    (a large store is held until the digest pool took its digests, decision I14)."""
    view = CoreView(mgr.core).producer(kv_id)
    return (view is not None and job_id in view.jobs) or job_id not in mgr.jobs_in_flight(kv_id)


def pump_until(
    pred: Callable[[], bool],
    *,
    managers: Iterable[KvTierManager] = (),
    jobs: Iterable[Jobs] = (),
    timeout_s: float = WAIT_S,
    wait_s: float = 0.002,
) -> bool:
    """Poll ``managers`` (and collect ``jobs``) until ``pred()`` or ``timeout_s``; returns pred()."""
    managers, jobs = list(managers), list(jobs)
    end = time.monotonic() + timeout_s
    while True:
        for m in managers:
            m.poll(wait_s)
        for j in jobs:
            j.pump()
        if pred():
            return True
        if time.monotonic() > end:
            return pred()
        if not managers:
            time.sleep(wait_s)


def asleep(m: KvTierManager) -> int:
    """Let threaded ``m``'s loop finish what it was doing and sleep (its pass count stops moving,
    0.1 s apart); returns that count."""
    last = -1
    while m.passes != last:
        last = m.passes
        time.sleep(0.1)
    return last


def transfer_once(p: KvTierManager, c: KvTierManager, kv_id: str, n: int = 3, *, poll: bool = True) -> JobResult:
    """Park ``n`` blocks of ``kv_id`` on ``p`` (store job 1, slots 0..n-1), load them on ``c``
    (load job 2, slots n..2n-1), and wait until both sides counted the transfer — the producer
    only once the transport released its blocks.  ``poll=False`` when the managers poll in the
    background.  Returns the load's result."""
    jobs = Jobs(c)
    preq = producer_req(f"p-{kv_id}", kv_id)
    p.on_new_request(preq)
    keys = keys_for(kv_id, n)
    p.submit_store(job(1, keys, range(n), preq))
    creq = consumer_req(f"c-{kv_id}", kv_id, p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys, range(n, 2 * n), creq))
    managers = [p, c] if poll else []
    assert pump_until(lambda: jobs.has(2), managers=managers, jobs=[jobs]), f"{kv_id}: the load never ended"
    assert pump_until(lambda: metric(p, "kvtier_transfer_bytes_count", role="producer") >= 1, managers=managers)
    return jobs.one(2)


# -- virtual clock + in-memory transport ------------------------------------------------------------


class VirtualPair(_KitPair):
    """:class:`kvtier.testing.pair.VirtualPair` whose consumer slots start as :data:`SENTINEL`, so a
    slot no transfer wrote is told from one that was."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        kw.setdefault("consumer_fill", SENTINEL)
        super().__init__(*a, **kw)
