"""In-process memory benchmarks of the sans-I/O lifecycle core: P6 (bytes per parked, retained
and in-flight id; ``retained_bytes`` is what tests/lifecycle/test_retained_size.py holds to its
target) and P8 (a core's resident memory at scale, in a child process).  The time benchmarks,
P4 and P5, are :mod:`bench.corebench`'s.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import tracemalloc
from typing import Any, Callable

from bench._util import CpuMeter, summary, target
from bench.corebench import ONE_KEY, STORE_GUARDS, durations
from tools.child import Child
from tools.coreview import CoreView


class _Traced:
    """One tracemalloc session: ``mark()`` returns bytes still allocated since ``__enter__``."""

    def __enter__(self) -> _Traced:
        gc.collect()
        tracemalloc.start()
        self.base = tracemalloc.get_traced_memory()[0]
        return self

    def mark(self) -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - self.base

    def __exit__(self, *exc: object) -> None:
        tracemalloc.stop()


def _bench_core(n: int) -> Any:
    """A producer TierCore sized for ``n`` retained ids (no session)."""
    from kvtier.lifecycle import CoreSettings, HelloInput, TierCore
    from kvtier.wire import messages as wm

    return TierCore(CoreSettings(durations=durations(peer_timeout_s=3600.0), tombstone_max=4 * n),
                    HelloInput(wm.PROTOCOL_VERSION, 4096, "bench", "", instance="bench"))


def _core_bytes(n: int, blocks: int) -> dict[str, float]:
    """Bytes per id the core keeps. What the engine owns anyway is built before the baseline: the
    id and owner strings, the block-key bytes and each job's keys/slots tuples (vLLM keeps them
    until the job result). The StoreSubmitted records the shell builds are made inside the traced
    region and dropped after the call, as are the effects the core returns, so whatever the core
    retains of them is counted."""
    from kvtier.lifecycle import ProducerState
    from kvtier.lifecycle.inputs import StoreSubmitted

    keys = tuple(b"%016d" % i for i in range(blocks))
    ids = [f"req-{i:07d}" for i in range(n)]
    owners = ["engine-" + k for k in ids]
    job_keys = [tuple(keys) for _ in range(n)] if blocks > 1 else [(b"k%015d" % i,) for i in range(n)]
    job_slots = [tuple(range(i, i + blocks)) for i in range(n)]
    job_ids = list(range(10**6, 10**6 + n))  # the engine's job ids (ints above the small-int cache)
    core = _bench_core(n)
    with _Traced() as tm:
        for i in range(n):
            assert not core.handle(StoreSubmitted(ids[i], owners[i], job_ids[i], job_keys[i], job_slots[i]), 1.0)
        parked = tm.mark()
        assert core.producer_count() == n
        core.fire(100.0)  # unbound_store_timeout 60 s: every id is reaped → tombstoned (effects dropped)
        tombstoned = tm.mark()
    assert all(core.producer_state(k) is ProducerState.TOMBSTONED for k in ids)
    return {"parked": parked / n, "tombstoned": tombstoned / n}


RETAINED_TARGET_B = 256
"""Bytes one retained (done or tombstoned) producer id may cost, whatever its fetch named."""


def retained_bytes(n: int, fetch_keys: int, end: str) -> dict[str, float]:
    """Bytes per *retained* producer id: stored, fetched with ``fetch_keys`` keys, served, then
    ``end`` = ``"done"`` (released + receipt) or ``"tombstoned"`` (released, then the fetched
    round aborted), all through :meth:`TierCore.handle` on a ready session.

    Objects the engine owns anyway (id and owner strings, job ids, each store job's keys and
    slots) and the session are built before the tracemalloc baseline; what the shell builds per
    input — the StoreSubmitted with its digests, the decoded fetch with *fresh* key bytes, its
    round and generation ints, the receipt or abort — is built inside it and dropped after the
    call (as are the effects), so whatever the core keeps of them counts.  Returns
    ``{"retained": B/id right after the id entered retention, "steady": B/id once the deadlines
    of its earlier states (reap, transfer) have surfaced and been dropped — what it costs for the
    rest of tombstone_retention_s}``.

    Raises:
        ValueError: ``end`` is neither ``"done"`` nor ``"tombstoned"``.
    """
    from kvtier.lifecycle import ProducerState
    from kvtier.lifecycle import inputs as ix
    from kvtier.wire import messages as wm

    if end not in ("done", "tombstoned"):
        raise ValueError(f"end must be 'done' or 'tombstoned', got {end!r}")
    # one more id than measured: the first is served before the baseline, so the rules it applies
    # are compiled (once per core, decision V1) outside the measured bytes
    ids = [f"req-{i:07d}" for i in range(n + 1)]
    owners = ["engine-" + k for k in ids]
    job_ids = list(range(10**6, 10**6 + n + 1))
    job_keys = [tuple(b"%s/%05d" % (k.encode(), j) for j in range(fetch_keys)) for k in ids]
    job_slots = [tuple(range(fetch_keys)) for _ in range(n + 1)]
    peer = "in:" + "6b" * 16  # one session's peer id, shared by every record bound to it
    gen = (0x2A5A5A5A5A5A5A5A).to_bytes(8, "little")
    core = _bench_core(n + 1)
    g = int.from_bytes(gen, "little")
    core.handle(ix.Received(peer, wm.Hello(gen=g, version=wm.PROTOCOL_VERSION, instance="consumer", block_bytes=4096,
                                           layout="bench", hash_seed="")), 1.0)
    core.handle(ix.PeerAttached(peer, g), 1.0)
    assert CoreView(core).session_ready(peer)

    def serve(i: int) -> None:
        digests = tuple(range(10**9, 10**9 + fetch_keys))
        core.handle(ix.StoreSubmitted(ids[i], owners[i], job_ids[i], job_keys[i], job_slots[i], digests), 1.0)
        del digests
        # what the decoder hands over: new bytes for every key, new ints for round and gen
        fetch = wm.Fetch(gen=int.from_bytes(gen, "little"), kv_request_id=ids[i], round=10_000 + i,
                         keys=[bytes(memoryview(k)) for k in job_keys[i]])
        core.handle(ix.Received(peer, fetch), 1.0)
        del fetch
        core.handle(ix.TransferReleased(ids[i], 10_000 + i), 1.0)
        if end == "done":
            late: Any = wm.Receipt(gen=int.from_bytes(gen, "little"), kv_request_id=ids[i], round=10_000 + i)
        else:
            late = wm.AbortFetch(gen=int.from_bytes(gen, "little"), kv_request_id=ids[i], round=10_000 + i,
                                 fetched=True)
        core.handle(ix.Received(peer, late), 1.0)
        del late

    serve(n)
    with _Traced() as tm:
        for i in range(n):
            serve(i)
        retained = tm.mark()
        core.fire(100.0)  # past the reap (61 s) and transfer (31 s) deadlines, before the prune
        steady = tm.mark()
    want = ProducerState.DONE if end == "done" else ProducerState.TOMBSTONED
    assert all(core.producer_state(k) is want for k in ids) and CoreView(core).retained() == n + 1
    return {"retained": retained / n, "steady": steady / n}


def retained_breakdown(fetch_keys: int, end: str) -> dict[str, int]:
    """``sys.getsizeof`` of one retained producer record and of each object it still owns
    (attribute name -> bytes; shared singletons such as ``None``, ``()`` and small ints count 0).
    Deterministic: for the P6 report and for the test that the record does not grow.  It measures
    the machine's own record object, so it drives a ProducerMachine alone (what the core hands
    it: the store job, its view of the fetch and of the receipt or abort)."""
    from kvtier.lifecycle._table import ProducerEvent
    from kvtier.lifecycle.inputs import StoreSubmitted
    from kvtier.lifecycle.producer import ProducerMachine
    from kvtier.lifecycle.producer_records import FetchInput, ProducerRecord

    m = ProducerMachine(durations())
    keys = tuple(b"k/%05d" % j for j in range(fetch_keys))
    out: list[Any] = []
    m.store(StoreSubmitted("req-0", "engine-req-0", 10**6, keys, tuple(range(fetch_keys)),
                           tuple(range(10**9, 10**9 + fetch_keys))), 1.0, out)
    m.fetch(FetchInput("in:peer", "req-0", 10_000, tuple(bytes(memoryview(k)) for k in keys), gen=2**61 + 5), 1.0, out)
    m.transfer_event("req-0", 10_000, ProducerEvent.TRANSFER_RELEASED, 1.0, out)
    late = FetchInput("in:peer", "req-0", 10_000, gen=2**61 + 5, fetched=True)
    (m.receipt if end == "done" else m.abort_fetch)(late, 1.0, out)
    rec = m.records["req-0"]
    shared = (None, (), True, False, rec.key, rec.peer, rec.state, rec.reason, rec.timer)
    # the stored record (a RetainedRecord: its own slots are key, state, reason, timer, tseq and
    # consumer; a live record's other fields read as shared empty class attributes) and its
    # prune time in ``retained`` (one float, shared by every id retained in the same step); the
    # rest of an id's cost is its slot in ``records``, ``retained`` and the prune-order deque
    sizes = {"record": sys.getsizeof(rec), "prune_time": sys.getsizeof(m.retained["req-0"])}
    for name in (*ProducerRecord.__slots__, "key", "state", "reason", "timer", "tseq"):
        v = getattr(rec, name)
        if any(v is x for x in shared) or (isinstance(v, int) and -5 <= v <= 256):
            sizes[name] = 0
        elif isinstance(v, dict) and not v:
            sizes[name] = 0  # the shared empty block map
        else:
            sizes[name] = sys.getsizeof(v)
    return sizes


def _transitions_bytes(n: int) -> dict[str, float]:
    from tools import reference

    ref = reference.build()["producer"]
    ids = [f"req-{i:07d}" for i in range(n)]
    models: list[Any] = []
    with _Traced() as tm:
        for k in ids:
            model = ref.new_model(k)
            ref.fire(model, "store", STORE_GUARDS)
            models.append(model)
        parked = tm.mark() - sys.getsizeof(models)  # the benchmark's own list
        for model in models:
            ref.fire(model, "reap_deadline")
        tombstoned = tm.mark() - sys.getsizeof(models)
    assert all(mo.state == "tombstoned" for mo in models)
    return {"parked": parked / n, "tombstoned": tombstoned / n}


def run_p6(quick: bool, log: Callable[[str], None], smoke: bool = False) -> dict[str, dict[str, Any]]:
    n_core = 1_000 if smoke else 5_000 if quick else 100_000
    n_tr = 100 if smoke else 500 if quick else 5_000
    reps = 1 if smoke else 2 if quick else 3
    meter = CpuMeter()
    t_start = time.monotonic()
    n_ret = 50 if smoke else 300 if quick else 1_000  # the same for both fetch sizes: per-id dict overheads then match
    c1, c16, tr = [], [], []
    ret: dict[tuple[str, int], list[dict[str, float]]] = {}
    for rep in range(reps):
        c1.append(_core_bytes(n_core, 1))
        tr.append(_transitions_bytes(n_tr))
        c16.append(_core_bytes(n_core // 4, 16))
        log(f"P6 rep {rep}: core parked {c1[-1]['parked']:.0f} B/id (16 blocks: {c16[-1]['parked']:.0f}), "
            f"tombstoned {c1[-1]['tombstoned']:.0f}; transitions {tr[-1]['parked']:.0f} / {tr[-1]['tombstoned']:.0f}")
        for end in ("done", "tombstoned"):
            for k in (1, 2000):
                ret.setdefault((end, k), []).append(retained_bytes(n_ret, k, end))
        log("P6 rep {}: retained B/id (just retained / steady): ".format(rep) + ", ".join(
            f"{e} {k} key(s) {v[-1]['retained']:.0f}/{v[-1]['steady']:.0f}" for (e, k), v in ret.items()))
    noise = meter.stop()
    retained = {f"{e}_{k}_key{'s' if k > 1 else ''}_{w}": statistics.median(r[w] for r in v)
                for (e, k), v in ret.items() for w in ("retained", "steady")}
    worst_steady = max(v for name, v in retained.items() if name.endswith("_steady"))
    worst_now = max(v for name, v in retained.items() if name.endswith("_retained"))

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    core_p, core_t = med(c1, "parked"), med(c1, "tombstoned")
    tr_p, tr_t = med(tr, "parked"), med(tr, "tombstoned")
    per_block = (med(c16, "parked") - core_p) / 15
    ratio = summary([t["parked"] / c["parked"] for t, c in zip(tr, c1)])
    return {
        "P6": {
            "id": "P6",
            "title": "Bookkeeping bytes per tracked id (tracemalloc) vs a transitions model per id",
            "status": "ok",
            "kvtier": {"label": "parked producer record, 1 block", "value": core_p, "unit": "B/id"},
            "baseline": {"label": "transitions model per id (parked)", "value": tr_p, "unit": "B/id"},
            "ratio": dict(ratio, over="transitions bytes / core bytes, parked, per repeat"),
            "target": target("<=", 300.0, max(core_p, core_t), "≤ 300 B per tracked id"),
            "targets": [
                target("<=", 300.0, core_p, "≤ 300 B per parked id (1 block)"),
                target("<=", 300.0, core_t, "≤ 300 B per tombstoned id"),
                target("<=", float(RETAINED_TARGET_B), worst_steady,
                       f"≤ {RETAINED_TARGET_B} B per retained (done/tombstoned) id, 1- or 2000-key fetch, "
                       "once its earlier deadlines surfaced"),
                target("<=", float(RETAINED_TARGET_B), worst_now,
                       f"≤ {RETAINED_TARGET_B} B per retained id right after it entered retention"),
            ],
            "retained_bytes_per_id": retained,
            "retained_record_breakdown": {
                f"{end}_{k}_key{'s' if k > 1 else ''}": retained_breakdown(k, end)
                for end in ("done", "tombstoned") for k in (1, 2000)
            },
            "bytes_per_id": {
                "core_parked_1_block": core_p,
                "core_parked_16_blocks": med(c16, "parked"),
                "core_per_extra_block": per_block,
                "core_tombstoned": core_t,
                "transitions_parked": tr_p,
                "transitions_tombstoned": tr_t,
            },
            "n": {"core": n_core, "core_16_blocks": n_core // 4, "transitions": n_tr,
                  "retained": n_ret},
            "noise": noise,
            "wall_s": round(time.monotonic() - t_start, 1),
            "method": (
                "tracemalloc, bytes still allocated after storing N ids into a producer TierCore, then after "
                "fire() reaps them all (effects dropped). Engine-owned objects (id/owner strings, job ids, key "
                "bytes, each job's keys/slots tuples) are built before the baseline; the StoreSubmitted records are built "
                "inside it and dropped, so what the core retains of them counts. Includes the record, its "
                "containers, the records-dict slot, deadline-heap entries and indexes. transitions: "
                "tools.reference model per id "
                "(add_model + store), then reap_deadline. Retained ids (retained_bytes, through TierCore.handle on "
                "a ready session): store, fetch message (1 or 2000 fresh key objects, fresh round/generation ints), "
                "release, then receipt (done) or abort of the fetched round (tombstoned); measured right after, "
                "and again after fire() past the reap/transfer deadlines (their stale entries dropped)."
            ),
        }
    }


# =============================================================================================
# P8 — one million ids on a virtual clock (child process)
# =============================================================================================


class ScaleRunner:
    """Runs in a fresh process so that RSS numbers belong to this test alone."""

    def hello(self) -> dict[str, Any]:
        return {"rss": _rss()}

    def op_run(self, n: int, batch: int = 1000, dt: float = 0.1) -> dict[str, Any]:
        from kvtier.lifecycle import CoreSettings, HelloInput, TierCore
        from kvtier.lifecycle.inputs import StoreSubmitted
        from kvtier.testing.clock import VirtualClock
        from kvtier.wire import messages as wm
        from tools import snapshot

        gc.collect()
        # what the child imported (vLLM too, once the fork server preloaded it for P0) leaves the
        # collector's scans, as vLLM's engine freezes its heap after start-up (freeze_gc_heap):
        # the collections measured are those of the core's own objects
        gc.freeze()
        rss0, blocks0 = _rss(), sys.getallocatedblocks()
        settings = CoreSettings(durations=durations(unbound_store_timeout_s=1.0, tombstone_retention_s=5.0))
        core = TierCore(settings, HelloInput(wm.PROTOCOL_VERSION, 4096, "bench", "", instance="bench"))
        clock = VirtualClock(0.0)
        timeline = []
        peak_rss, peak_records, peak_heap = rss0, 0, 0
        fired = 0
        t0 = time.perf_counter()
        i = 0
        step = 0
        while i < n:
            now = clock.now()
            for _ in range(min(batch, n - i)):
                kid = f"id{i}"
                core.handle(StoreSubmitted(kid, kid, i, ONE_KEY, (i & 1023,)), now)
                i += 1
            fired += len(core.fire(now))
            clock.advance(dt)
            step += 1
            if step % 10 == 0:
                rss = _rss()
                peak_rss = max(peak_rss, rss)
                peak_records = max(peak_records, core.producer_count())
                snap = core.snapshot()  # counts only, no views: O(records) without allocating per record
                peak_heap = max(peak_heap, snap.deadline_entries)
                timeline.append({"t": round(now, 2), "records": core.producer_count(),
                                 "retained": sum(snap.retained.values()), "heap": snap.deadline_entries,
                                 "rss_mib": rss / 2**20})
        # let every deadline pass: reap the last parked ids, then prune every tombstone
        while core.producer_count():
            clock.advance(1.0)
            fired += len(core.fire(clock.now()))
            snap = core.snapshot()
            timeline.append({"t": round(clock.now(), 2), "records": core.producer_count(),
                             "retained": sum(snap.retained.values()), "heap": snap.deadline_entries,
                             "rss_mib": _rss() / 2**20})
        seconds = time.perf_counter() - t0
        gc.collect()
        # the producer's two per-peer indexes lead the tuple (tools.snapshot.indexes)
        by_peer, awaiting = snapshot.indexes(core)[:2]
        state = {
            "records": core.producer_count(),
            "retained": CoreView(core).retained(),
            "by_peer": len(by_peer),
            "awaiting_per_peer": len(awaiting),
            "deadline_heap": core.snapshot().deadline_entries,
            "evicted_by_cap": core.snapshot().evicted,
        }
        blocks1, rss1 = sys.getallocatedblocks(), _rss()
        rss_trim = _malloc_trim_rss()
        gc.unfreeze()
        return {
            "ids": n,
            "seconds": seconds,
            "ids_per_s": n / seconds,
            "events": 3 * n,
            "rss_baseline_mib": rss0 / 2**20,
            "rss_peak_mib": max(peak_rss, _vm_hwm()) / 2**20,
            "rss_after_mib": rss1 / 2**20,
            "rss_after_malloc_trim_mib": rss_trim / 2**20 if rss_trim else None,
            "py_blocks_baseline": blocks0,
            "py_blocks_after": blocks1,
            "py_blocks_delta": blocks1 - blocks0,
            "peak_records": peak_records,
            "peak_heap": peak_heap,
            "final": state,
            "timeline": timeline,
        }


def _malloc_trim_rss() -> int:
    """RSS after asking glibc to give free heap memory back to the OS (0 if unavailable): tells
    allocator retention apart from live data."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return 0
    return _rss()


def _vm_hwm() -> int:
    """Peak RSS of this process image (VmHWM; unlike ru_maxrss it is not inherited across the
    fork+exec of a spawned child)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _rss() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:  # pragma: no cover
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096


def run_p8(quick: bool, log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    n = 20_000 if quick else 1_000_000
    meter = CpuMeter()
    t_start = time.monotonic()
    with Child("bench.corememory", "ScaleRunner", name="bench-scale") as child:
        r = child.call("run", n=n, timeout_s=900)
    noise = meter.stop()
    f = r["final"]
    returned = f["records"] == 0 and f["retained"] == 0 and f["by_peer"] == 0 and f["deadline_heap"] <= 64
    mem_ratio = r["py_blocks_after"] / r["py_blocks_baseline"]
    log(f"P8 {n:,} ids: {r['ids_per_s']:,.0f} ids/s, peak RSS {r['rss_peak_mib']:.0f} MiB "
        f"(baseline {r['rss_baseline_mib']:.0f}, after {r['rss_after_mib']:.0f}, after malloc_trim "
        f"{r['rss_after_malloc_trim_mib'] or 0:.0f}), records {f['records']}, "
        f"heap {f['deadline_heap']}, python blocks Δ {r['py_blocks_delta']:+,}")
    return {
        "P8": {
            "id": "P8",
            "title": f"Scale: {n:,} ids through park → reap → tombstone → prune (virtual clock)",
            "status": "ok" if returned else "problems",
            "kvtier": {"label": "ids/s (3 transitions + ticks per id)", "value": r["ids_per_s"], "unit": "ids/s"},
            "baseline": {"label": "python heap blocks before", "value": r["py_blocks_baseline"], "unit": "blocks"},
            "ratio": {"median": mem_ratio, "min": mem_ratio, "max": mem_ratio, "n": 1,
                      "over": "python heap blocks after / before (1.00 = memory back to baseline)"},
            "target": {"text": "memory returns to baseline (records empty, heap compacted)", "op": None,
                       "value": None, "achieved": mem_ratio, "met": returned and abs(mem_ratio - 1) < 0.01},
            "result": r,
            "noise": noise,
            "wall_s": round(time.monotonic() - t_start, 1),
            "method": (
                "fresh child process; TierCore with unbound_store_timeout_s=1, tombstone_retention_s=5, default "
                "tombstone_max; 1000 new ids stored (TierCore.handle) every 0.1 virtual s (10k ids/s), fire() "
                "after each batch; "
                "then the clock runs on until every record is pruned. Python heap blocks "
                "(sys.getallocatedblocks) and RSS before/after (and after glibc malloc_trim(0)); peak RSS "
                "sampled every 10 batches and from VmHWM."
            ),
        }
    }
