"""Shared by the ``test_virtual_*`` modules: the scenario parameters of
docs/scenarios.md (T_park = 60 s, T_tomb = 60 s) and small steps on a
:class:`mgr_helpers.VirtualPair` (the ``pairs`` fixture is in ``conftest.py``).
"""

from __future__ import annotations

from kvtier.manager import KvTierManager
from mgr_helpers import Jobs, VirtualPair, fill_pattern, job, keys_for, producer_req
from tools.coreview import CoreView

SCEN = {"unbound_store_timeout_s": 60.0, "tombstone_retention_s": 60.0}
BB = 64


def outcome(jobs: Jobs, job_id: int) -> tuple[bool, str | None]:
    r = jobs.one(job_id)
    return r.success, r.reason


def store(v: VirtualPair, kv: str, job_id: int, slots, seed: int, *, keys=None, req_id=None):
    req = producer_req(req_id or f"p-{kv}", kv)
    v.P.on_new_request(req)
    d = fill_pattern(v.P.pool, slots, seed)
    v.P.submit_store(job(job_id, keys or keys_for(kv, len(slots)), slots, req))
    return req, d


def no_refs(m: KvTierManager, kv: str) -> None:
    assert not CoreView(m.core).tracks(kv)
    assert not m.jobs_in_flight(kv)
