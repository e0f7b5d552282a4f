"""Where a 1-block request's time and CPU go, across the two processes of P1/P3 (decision C25).

``python -m bench.reqtrace [zmq|nixl] [N] [--late]`` runs P1's 1-block cell (64 KiB, the producer's
loop on its thread, the consumer caller-driven, as :mod:`bench.xproc` runs it) — or, with
``--late``, P3's late fetch of a reaped id — ``N`` times and prints, as medians over the requests:

* the milestones of one request on one clock (``perf_counter`` is system-wide): the consumer's
  fetch leaving, the producer reading it, the producer's answer leaving, the consumer reading it,
  the result in the caller's hand (µs after ``submit_load``);
* CPU per request of every thread of both processes (``/proc/self/task/*/schedstat``) and of each
  process in all (``getrusage``): under load, wall time is mostly other processes' turn on the CPU,
  CPU per request is what this code costs.

``python -m bench.reqtrace --store`` prints the engine thread's CPU per ``submit_store`` (1, 8, 64,
256 blocks of 1 MiB, loop on its thread): the first call after 2 ms asleep (cold: as the scheduler
thread calls it, after writing the blocks) and one right after it (warm).
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from typing import Any

from bench import _xfer

_EV: list[tuple[Any, ...]] = []


def _trace() -> None:
    """Stamp the transport's waits, reads and sends (this process only)."""
    from kvtier.transport.zmq_transport import ZmqTransport

    pc, wait, service, send = time.perf_counter, ZmqTransport.wait, ZmqTransport.service, ZmqTransport.send

    def traced_wait(self: Any, t: float) -> bool:
        r = wait(self, t)
        _EV.append(("woke", pc()))
        return r

    def traced_service(self: Any, *a: Any, **k: Any) -> Any:
        r = service(self, *a, **k)
        if r[0]:
            _EV.append(("read", pc()))
        return r

    def traced_send(self: Any, peer: str, frames: Any, **k: Any) -> Any:
        _EV.append(("sent", pc()))  # as it starts: the send itself may lose the CPU under load
        return send(self, peer, frames, **k)

    ZmqTransport.wait, ZmqTransport.service, ZmqTransport.send = traced_wait, traced_service, traced_send


def _threads() -> dict[str, int]:
    """CPU nanoseconds so far of each thread of this process, by ``name:tid``."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[f"{name}:{tid}"] = int(f.read().split()[0])
        except OSError:
            continue
    return out


class _Side:
    def op_events(self) -> list[tuple[Any, ...]]:
        out = list(_EV)
        _EV.clear()
        return out

    def op_cpu(self) -> tuple[float, dict[str, int]]:
        import resource

        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime, _threads()


class Producer(_Side, _xfer.Producer):
    def __init__(self) -> None:
        _trace()
        super().__init__()


class Consumer(_Side, _xfer.Consumer):
    def __init__(self) -> None:
        _trace()
        super().__init__()

    def op_requests(self, ids: list[str], pair: str) -> list[tuple[Any, ...]]:
        """Load each id (one block into slot 0), one at a time; the events of the loads."""
        from kvtier.api import TransferJob

        mgr = self.mgrs[pair]
        reqs = [self._req(k, pair) for k in ids]
        for r in reqs:
            mgr.on_new_request(r)
        _EV.clear()
        for r in reqs:
            job = next(self._jobs)
            _EV.append(("submit", time.perf_counter()))
            mgr.submit_load(TransferJob(job_id=job, keys=_xfer._keys(1), slots=(0,), req=r))
            res = self._wait_job(job, mgr=mgr)
            _EV.append(("result", time.perf_counter(), res.success))
        for r in reqs:
            mgr.on_request_finished(r)
        return self.op_events()


def run(plane: str = "zmq", n: int = 300, late: bool = False) -> dict[str, Any]:
    """Medians over ``n`` requests (see the module docstring)."""
    from bench.xproc import CONSUMER_CONFIG, PRODUCER_CONFIG
    from tools.child import Child, start_all

    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    extra = {"data_plane": plane}
    pcfg = {**PRODUCER_CONFIG, **extra, **({"unbound_store_timeout_s": 0.05} if late else {})}
    prod, cons = start_all(Child("bench.reqtrace", "Producer", name="trace-producer"),
                           Child("bench.reqtrace", "Consumer", name="trace-consumer"), timeout_s=300)
    try:
        addrs = prod.call("setup", block_bytes=64 << 10, num_blocks=1, configs={plane: pcfg})
        cons.call("setup", block_bytes=64 << 10, num_blocks=1, producers=addrs, raw_port=prod.hello["raw_port"],
                  configs={plane: {**CONSUMER_CONFIG, **extra}})
        cons.call("requests", prod.call("park", "warm", 1 if late else 20, 1, pair=plane), plane)
        ids = prod.call("park", "m", n, 1, pair=plane)
        if late:
            time.sleep(0.5)  # reaped, tombstoned
        prod.call("events")
        (p0, pt0), (c0, ct0) = prod.call("cpu"), cons.call("cpu")
        cev = cons.call("requests", ids, plane)
        (p1, pt1), (c1, ct1) = prod.call("cpu"), cons.call("cpu")
        pev = prod.call("events")
    finally:
        cons.close()
        prod.close()
    events = sorted([("C", *e) for e in cev] + [("P", *e) for e in pev], key=lambda e: e[2])
    # each milestone is the first matching event after the one before it, within one request;
    # only requests that show all of them in that order count (NIXL: the answer is no zmq message)
    steps = (("fetch sent", "C", "sent"), ("fetch read", "P", "read"), ("answer sent", "P", "sent"),
             ("answer read", "C", "read"), ("result", "C", "result"))
    marks: dict[str, list[float]] = {name: [] for name, _, _ in steps}
    results: list[float] = []
    t0, got = 0.0, [0.0]
    for side, kind, t, *_ in events:
        if kind == "submit":
            t0, got = t, []
        elif kind == "result":
            results.append((t - t0) * 1e6)
            if len(got) == len(steps) - 1:
                for (name, _, _), v in zip(steps, [*got, (t - t0) * 1e6]):
                    marks[name].append(v)
            got = [0.0] * len(steps)  # nothing more counts until the next submit
        elif len(got) < len(steps) - 1 and (side, kind) == steps[len(got)][1:]:
            got.append((t - t0) * 1e6)

    def per_thread(a: dict[str, int], b: dict[str, int]) -> dict[str, float]:
        out = {k.rsplit(":", 1)[0] + ":" + k.rsplit(":", 1)[1][-4:]: (b[k] - a.get(k, 0)) / n / 1e3 for k in b}
        return {k: round(v) for k, v in out.items() if v >= 2}

    return {
        "plane": plane, "late": late, "n": n, "load": os.getloadavg()[0],
        "result_us": round(statistics.median(results)), "complete": len(marks["result"]),
        "milestones_us": {k: round(statistics.median(v)) for k, v in marks.items() if v},
        "cpu_per_request_us": {"producer": round((p1 - p0) / n * 1e6), "consumer": round((c1 - c0) / n * 1e6)},
        "threads_us": {"producer": per_thread(pt0, pt1), "consumer": per_thread(ct0, ct1)},
    }


def store_cpu(sizes: tuple[int, ...] = (1, 8, 64, 256), reps: int = 80) -> dict[int, tuple[float, float]]:
    """Engine-thread CPU µs per ``submit_store`` of ``n`` 1 MiB blocks: (cold, warm) medians."""
    import hashlib
    import logging

    from kvtier.api import RequestContext, TransferJob
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    logging.getLogger("kvtier").setLevel(logging.ERROR)
    pool = BlockPool(2 * max(sizes), 1 << 20)
    mgr = KvTierManager({"host": "127.0.0.1", "port": 0, "background_poll": True, "unbound_store_timeout_s": 0.05},
                        pool)
    jobs = itertools.count(1)
    out = {}
    try:
        for n in sizes:
            keys = tuple(hashlib.sha256(b"%d" % i).digest() for i in range(n))
            cold, warm = [], []
            for rep in range(reps):
                reqs = [RequestContext(req_id=f"P{n}-{rep}-{j}",
                                       kv_transfer_params={"remote_decoder": {"kv_request_id": f"s{n}-{rep}-{j}"}})
                        for j in range(2)]
                for r in reqs:
                    mgr.on_new_request(r)
                time.sleep(0.002)
                c0 = time.thread_time_ns()
                mgr.submit_store(TransferJob(job_id=next(jobs), keys=keys, slots=tuple(range(n)), req=reqs[0]))
                c1 = time.thread_time_ns()
                mgr.submit_store(TransferJob(job_id=next(jobs), keys=keys, slots=tuple(range(n, 2 * n)), req=reqs[1]))
                c2 = time.thread_time_ns()
                cold.append((c1 - c0) / 1e3)
                warm.append((c2 - c1) / 1e3)
                for r in reqs:
                    mgr.on_request_finished(r)
                deadline = time.monotonic() + 5
                while mgr.outstanding_jobs() and time.monotonic() < deadline:  # reaped: slots free again
                    mgr.get_finished_jobs()
                    time.sleep(0.002)
            out[n] = (statistics.median(cold[10:]), statistics.median(warm[10:]))
    finally:
        mgr.shutdown(0.2)
    return out


def main(argv: list[str]) -> None:
    if "--store" in argv:
        res = store_cpu()
        print("submit_store engine-thread CPU, cold / warm: " + ", ".join(
            f"{n} MiB {c:.0f} / {w:.0f} µs" for n, (c, w) in res.items()) + f" (load {os.getloadavg()[0]:.2f})")
        return
    args = [a for a in argv if not a.startswith("--")]
    r = run(args[0] if args else "zmq", int(args[1]) if len(args) > 1 else 300, "--late" in argv)
    print(f"{r['plane']}{' late fetch' if r['late'] else ' 1-block'} (n={r['n']}, load {r['load']:.2f}): "
          f"result {r['result_us']} µs after submit_load; in the {r['complete']} requests whose every step was "
          "seen: " + ", ".join(f"{k} {v}" for k, v in r["milestones_us"].items()))
    print(f"  CPU per request: producer {r['cpu_per_request_us']['producer']} µs, consumer "
          f"{r['cpu_per_request_us']['consumer']} µs; by thread {r['threads_us']}")


if __name__ == "__main__":
    main(sys.argv[1:])
