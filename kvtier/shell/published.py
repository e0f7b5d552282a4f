"""What the I/O loop publishes after each pass, for engine calls that answer without waiting.

The engine's thread never reads the core while the loop may be changing it (decision C12).  What
an engine call must answer at once — ``lookup``, ``has_pending_work``, ``quarantined`` — comes from
this object instead: plain attributes the loop replaces wholesale (a reference swap is atomic under
the GIL), read without a lock — except ``ended_loads``, a set the loop changes in place, one set
operation at a time (each atomic under the GIL; engine threads only test membership), so a load's
end costs O(1), not a copy of every ended load still in use (decision C41).  Each is as fresh as
the loop's last pass; what the engine queued since is accounted for by the façade (a lookup the
loop has not applied yet answers RETRY, a queued job counts as pending work).

* ``ended_loads``: consumer ``kv_request_id``\\ s whose load failed or loaded (an id is fetched
  once, decision L8): lookups MISS until the engine finishes the request (decision L11); after a
  pass that could change it, only the ids it could have changed are looked at again (an announce,
  a load's result), every id after a
  session's end.
* ``probes``: per symmetric request, the keys answered HIT, RETRY (a probe is out) and MISS, and
  whether every key is MISS now.
* ``in_use``: consumer ids some request or winding-down load still holds (the façade adds an id
  when it announces it; the loop drops it once the core forgot it).
* ``awaiting``: producer ids a peer's fetch waits on (not every block stored): a store, naming or
  finish of one of them wakes the loop at once, any other rides its next pass (decision C34).
"""

from __future__ import annotations

from typing import Any

from kvtier.api import LookupResult
from kvtier.lifecycle import ProbeState
from kvtier.lifecycle.views import ProbeAnswers

__all__ = ["Published"]


class Published:
    """The loop's answers for the engine's thread (see the module docstring)."""

    def __init__(self) -> None:
        self.ended_loads: set[str] = set()
        self.probes: dict[str, ProbeAnswers] = {}
        self.in_use: set[str] = set()
        self.finishing: set[str] = set()
        """Consumer ids whose request finished: dropped from ``in_use`` once the core forgot them."""
        self.pending = False
        """Work the engine must keep stepping for: transfers referenced, sends queued, symmetric
        work, a serve window wanted, pins held (jobs are the façade's to count)."""
        self.serve_wanted = False
        self.pins = 0
        self.quarantined = (0, 0)
        self.dirty = True
        """Every id in use must be looked at again (set at start)."""
        self.announced: set[str] = set()
        """Ids announced since the last publish (the loop adds them): only these are looked at."""
        self.awaiting: frozenset[str] = frozenset()
        self._awaiting_seen = -1

    def load_ended(self, core: Any, kv_request_id: str) -> None:
        """A load job of consumer id ``kv_request_id`` is about to get its result (on the loop's
        thread): once the id's load ended, its lookups MISS from now on, not from the end of the
        pass — the engine may take the result before that, and a lookup answering HIT after it
        would make the engine load the id again (L8, L11)."""
        if kv_request_id in self.in_use and kv_request_id not in self.ended_loads and core.load_ended(kv_request_id):
            self.ended_loads.add(kv_request_id)

    def update(self, loop: Any) -> None:
        """Refresh from the loop's parts (on the loop's thread, under its lock)."""
        core, serving = loop.core, loop.serving
        out = loop.outbound
        if self.dirty or out.changed:
            self.dirty = out.changed = False
            self.announced.clear()
            out.ended.clear()
            # a copy first: the engine's thread adds to in_use while this runs
            self.ended_loads = {k for k in list(self.in_use) if core.load_ended(k)}
        elif self.announced or out.ended:
            # only the ids a pass could have changed: an announce or a failed load is O(1), not
            # O(ids in use) (decision C25)
            ids = self.announced | out.ended
            self.announced.clear()
            out.ended.clear()
            add = {k for k in ids if k in self.in_use and core.load_ended(k)}
            self.ended_loads.difference_update(ids - add)
            self.ended_loads.update(add)
        if self.finishing:
            gone = {k for k in self.finishing
                    if core.consumer_state(k).value == "absent" and core.probe_state(k) is ProbeState.ABSENT
                    and not core.round_loads(k)}
            if gone:
                self.finishing -= gone
                self.in_use -= gone
                self.ended_loads.difference_update(gone)
        seen, awaiting = core.awaiting_ids(self._awaiting_seen)
        if awaiting is not None:
            self._awaiting_seen, self.awaiting = seen, awaiting
        symmetric = core.symmetric_work()
        ids = core.probe_ids()
        if ids or self.probes:
            self.probes = {k: core.probe_answers(k) for k in ids}
        self.serve_wanted = serving.wanted()
        self.pins = serving.pin_count()
        transport = loop.transport
        self.pending = bool(
            (not loop.closed and (loop.plane.referenced() > 0 or transport.pending_sends() > 0))
            or symmetric or serving.pending())
        n = core.quarantined_count()
        self.quarantined = (n, core.quarantined_blocks()) if n else (0, 0)

    def probe_answer(self, kid: str, key: bytes, step_keys: dict[str, dict[bytes, None]]) -> LookupResult:
        """A symmetric request's lookup of ``key`` (on the engine's thread), answered from the last
        pass — HIT or MISS once the peer answered it, RETRY until then.  A key the core does not
        hold yet is registered in this step's ``step_keys`` (it leaves in the step's probe); one
        it holds (HIT, or RETRY while its probe is out) is not handed over again: an engine scans
        every key of a prompt each step while any is RETRY, and a long prompt's keys handed over
        again every step outran the loop that applies them (decision Y26)."""
        answers = self.probes.get(kid)
        if answers is not None:
            if answers.dead or key in answers.miss:
                return LookupResult.MISS
            if key in answers.hit:
                return LookupResult.HIT
            if key in answers.retry:
                return LookupResult.RETRY
        step = step_keys.setdefault(kid, {})
        step[key] = None
        return LookupResult.RETRY  # registered now: the loop has not seen it
