"""kvtier's Prometheus series: what they are, how they are fed, how they are served.

One :class:`TierMetrics` per :class:`~kvtier.manager.KvTierManager` owns a private
``prometheus_client`` :class:`~prometheus_client.CollectorRegistry`, so several managers in one
process never collide.  Every series is declared once, as data, in :data:`SERIES` (name, type,
labels, unit, meaning); the registry, the documentation table in ``docs/metrics.md`` (rendered
by the repository's tools, ``python -m tools docs``) and the vLLM bridge in
:mod:`kvtier.integrations.vllm` are all derived from it.

Two kinds of series:

* **event series** (counters, histograms) are fed by the manager through small methods
  (:meth:`TierMetrics.job_done`, :meth:`TierMetrics.transfer`, …);
* **live gauges** (ids by state, pinned bytes, oldest parked age, sessions…) are computed when
  scraped, by walking the lifecycle core's records under the manager's lock, so the poll loop pays
  nothing for them.

Every sample carries two per-manager labels, ``tier`` (the config's ``type``) and ``listener``
(the manager's ``host:port``); every other label value comes from kvtier's own bounded vocabulary
(the reason codes of ``spec/lifecycle.toml [reasons]``, the wire codec's reason codes, and the
states of the generated tables); anything else is counted as ``other`` — a peer cannot grow the
label set.  ``instance`` is deliberately not used: Prometheus sets it to the scrape target.

The endpoint (:meth:`TierMetrics.serve`) is bound to the config's ``host`` and ``metrics_port``:
``prometheus_client``'s own WSGI app answers ``GET /metrics``, and ``GET /kvtier/requests`` answers
with the manager's recently finished requests as JSON (:mod:`kvtier.forensics`; ``kvtier why``
reads it).
"""

from __future__ import annotations

import collections
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvtier import metrics_http
from kvtier.lifecycle._table import ConsumerState, ProbeState, ProducerState, Reason, ServeState, SessionState
from kvtier.wire.codec import WireReason

__all__ = [
    "CONST_LABELS",
    "LABEL_VALUES",
    "MACHINES",
    "REQUESTS_PATH",
    "ROLES",
    "SERIES",
    "STATES",
    "VOCABULARY",
    "SeriesDef",
    "TierMetrics",
    "bounded",
]

REQUESTS_PATH = metrics_http.REQUESTS_PATH
"""Where the endpoint serves the recently finished requests as JSON (``?kv_request_id=``,
``?limit=``)."""

CONST_LABELS: tuple[str, ...] = ("tier", "listener")
"""Labels every kvtier sample carries: the tier's config ``type`` and its ``host:port``."""

ROLES: tuple[str, ...] = ("producer", "consumer")
"""Values of the ``role`` label."""

#: kvtier's own reason vocabulary: lifecycle reasons, wire codec reasons, and the manager's few
#: own words (``local``: a store for a request with no remote decoder; ``failed``: a job failure
#: without a reason).  A label value outside it is reported as ``other``.
VOCABULARY: frozenset[str] = frozenset(
    {r.value for r in Reason} | {r.value for r in WireReason} | {"failed", ""}
)

MACHINES: tuple[str, ...] = ("producer", "consumer", "session", "probe", "serve")
"""Values of the ``machine`` label (the spec's machines)."""

LABEL_VALUES: Mapping[str, tuple[str, ...]] = {
    "role": ROLES,
    "kind": ("store", "load"),
    "outcome": ("ok", "fail"),
    "answer": ("hit", "miss"),
    "machine": MACHINES,
}
"""The closed label sets other than ``state`` (:data:`STATES`) and ``reason`` (:data:`VOCABULARY`)."""

_MACHINES = frozenset(MACHINES)
_RETAINED = frozenset({ProducerState.DONE, ProducerState.TOMBSTONED})

#: The ``state`` label's values per series: every state of the machine the series counts, except
#: the initial and final ones (no record) — and for the parked ids, the retained ones (they are
#: ``kvtier_retained_ids``).  The gauges report each of them, 0 included, from the first scrape.
STATES: Mapping[str, tuple[str, ...]] = {
    "kvtier_parked_ids": tuple(s.value for s in ProducerState
                               if s not in _RETAINED and s not in (ProducerState.ABSENT, ProducerState.PRUNED)),
    "kvtier_retained_ids": tuple(sorted(s.value for s in _RETAINED)),
    "kvtier_consumer_loads": tuple(s.value for s in ConsumerState if s not in (ConsumerState.ABSENT,)),
    "kvtier_sessions": tuple(s.value for s in SessionState if s not in (SessionState.ABSENT, SessionState.DEAD)),
    "kvtier_probes": tuple(s.value for s in ProbeState if s not in (ProbeState.ABSENT, ProbeState.FINISHED)),
    "kvtier_serve_rounds": tuple(s.value for s in ServeState if s not in (ServeState.ABSENT, ServeState.ENDED)),
}
STATES["kvtier_pinned_bytes"] = STATES["kvtier_parked_ids"]


def bounded(value: str | None, vocabulary: frozenset[str] = VOCABULARY) -> str:
    """``value`` if it is one of kvtier's own codes, else ``"other"`` (``None`` is ``""``)."""
    value = value or ""
    return value if value in vocabulary else "other"


class SeriesDef(NamedTuple):
    """One series: its exposition name, Prometheus type, own labels (the constant labels come
    first, see :data:`CONST_LABELS`), unit, help text, histogram buckets, and who feeds it."""

    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    labels: tuple[str, ...]
    unit: str
    help: str
    buckets: tuple[float, ...] = ()
    fed_by: str = ""  # the TierMetrics method, or "scrape" for live gauges


_BYTES_BUCKETS = tuple(float(1 << s) for s in range(16, 34, 2))  # 64 KiB … 4 GiB, ×4
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_THROUGHPUT_BUCKETS = (1e7, 1e8, 2.5e8, 5e8, 1e9, 2.5e9, 5e9, 1e10, 2.5e10, 5e10, 1e11)
_LAG_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)

SERIES: tuple[SeriesDef, ...] = (
    # ---- producer: what is parked, pinned, retained -------------------------------------------
    SeriesDef("kvtier_parked_ids", "gauge", ("state",), "ids",
              "kv_request_ids whose blocks the producer holds for a consumer, by producer state "
              "(parked: no fetch yet; awaiting/serving/cancelling: bound to a fetch).", fed_by="scrape"),
    SeriesDef("kvtier_pinned_bytes", "gauge", ("state",), "bytes",
              "Block-pool bytes those ids hold (blocks × block_bytes; page-locked when an "
              "accelerator exists), by producer state.", fed_by="scrape"),
    SeriesDef("kvtier_oldest_parked_age_seconds", "gauge", (), "seconds",
              "Seconds since the first store of the oldest id still in state parked (no consumer "
              "has fetched it); 0 when none is parked.", fed_by="scrape"),
    SeriesDef("kvtier_retained_ids", "gauge", ("state", "reason"), "ids",
              "Ended ids remembered so a late fetch is answered in one round trip: state done "
              "(transferred) or tombstoned (ended without a transfer), by the reason they ended.",
              fed_by="scrape"),
    SeriesDef("kvtier_fetches_refused_total", "counter", ("reason",), "fetches",
              "transfer_done(fail) sent, by reason: fetches refused, and a serving peer's notice that it withdrew an "
              "offer (offer_expired, drained). reason=reaped, already_served: consumers late.", fed_by="fetch_refused"),
    SeriesDef("kvtier_store_jobs_awaiting_receipt", "gauge", (), "jobs",
              "Store jobs whose blocks were sent and which wait for the consumer's receipt "
              "before they are reported.", fed_by="scrape"),
    # ---- consumer ------------------------------------------------------------------------------
    SeriesDef("kvtier_consumer_loads", "gauge", ("state",), "ids",
              "Consumer-side ids (announced requests and their loads), by consumer state.",
              fed_by="scrape"),
    # ---- the symmetric path (remote_kv_source) -----------------------------------------------------
    SeriesDef("kvtier_probes", "gauge", ("state",), "requests",
              "Symmetric requests probing a peer for blocks, by probe state (collecting/probing: their "
              "lookups answer RETRY; offered: the peer pins blocks for them).", fed_by="scrape"),
    SeriesDef("kvtier_probe_keys_total", "counter", ("answer",), "keys",
              "Keys peers answered in probe replies to us: answer hit (pinned for us) or miss.",
              fed_by="probe_answered"),
    SeriesDef("kvtier_probe_failures_total", "counter", ("reason",), "requests",
              "Symmetric requests whose probing of their peer failed, by reason: their lookups answer "
              "miss, so the engine computed the blocks.", fed_by="probe_failed"),
    SeriesDef("kvtier_serve_rounds", "gauge", ("state",), "rounds",
              "Peers' symmetric rounds this producer answers from its engine's tiers, by serve state.",
              fed_by="scrape"),
    SeriesDef("kvtier_served_keys_total", "counter", ("answer",), "keys",
              "Keys of peers' probes this producer answered: answer hit (pinned for the peer) or miss.",
              fed_by="served"),
    SeriesDef("kvtier_serve_pinned_blocks", "gauge", (), "blocks",
              "Engine blocks pinned for peers' symmetric rounds (bounded by serve_max_pinned_fraction).",
              fed_by="scrape"),
    SeriesDef("kvtier_pins_released_total", "counter", ("outcome", "reason"), "pins",
              "Engine pins of served rounds released: outcome ok|fail, reason of a failure "
              "(offer_expired: the consumer never fetched).", fed_by="pins_released"),
    # ---- both: transfers and jobs ----------------------------------------------------------------
    SeriesDef("kvtier_transfer_bytes", "histogram", ("role",), "bytes",
              "Bytes per completed transfer: role=producer per round its data plane finished sending (an "
              "aborted or corrupt load's too), role=consumer per successful load.", _BYTES_BUCKETS, "transfer"),
    SeriesDef("kvtier_transfer_duration_seconds", "histogram", ("role",), "seconds",
              "Duration per completed transfer: producer from the first block handed to the "
              "transport to the last released; consumer from load submission to the job result.",
              _SECONDS_BUCKETS, "transfer"),
    SeriesDef("kvtier_transfer_throughput_bytes_per_second", "histogram", ("role",), "bytes/s",
              "Throughput of each completed transfer (its bytes / its duration). Aggregate "
              "bandwidth is rate(kvtier_transfer_bytes_sum), never bytes/summed durations.",
              _THROUGHPUT_BUCKETS, "transfer"),
    SeriesDef("kvtier_block_sent_bytes_total", "counter", (), "bytes",
              "Block payload bytes of rounds the producer's data plane finished sending, whatever the consumer made "
              "of them (its store job's result says; O15).", fed_by="transfer"),
    SeriesDef("kvtier_block_landed_bytes_total", "counter", (), "bytes",
              "Block payload bytes written into consumer slots and checked, failed loads included (a batch "
              "after a corrupt one too; the load reports the prefix before it: successful_keys).", fed_by="landed"),
    SeriesDef("kvtier_jobs_total", "counter", ("kind", "outcome", "reason"), "jobs",
              "Job results reported to the engine: kind store|load, outcome ok|fail, reason why a job "
              "failed, or why a successful one moved nothing (local: a store for a request without a "
              "remote decoder; not_needed: its consumer needed none of the blocks).", fed_by="job_done"),
    SeriesDef("kvtier_quarantined_blocks", "gauge", ("role",), "blocks",
              "Blocks kept out of reuse because a transfer touching them could not be proven finished, by role.",
              fed_by="scrape"),
    # ---- sessions and the wire -------------------------------------------------------------------
    SeriesDef("kvtier_sessions", "gauge", ("state",), "sessions",
              "Control sessions with peers, by session state.", fed_by="scrape"),
    SeriesDef("kvtier_session_ends_total", "counter", ("reason",), "sessions",
              "Sessions that ended or were refused, by reason (shutdown and peer_disconnected are "
              "routine; the rest are faults).", fed_by="session_ended"),
    SeriesDef("kvtier_wire_errors_total", "counter", ("reason",), "messages",
              "Malformed or invalid messages: from peers (the codec's reason), or reported by a "
              "peer about ours (peer_reported_<reason>).", fed_by="wire_error"),
    SeriesDef("kvtier_ignored_inputs_total", "counter", ("machine", "reason"), "inputs",
              "Inputs dropped by an ignore rule of the spec (late, duplicate, stale), by machine and reason.",
              fed_by="ignored"),
    # ---- the loop itself ------------------------------------------------------------------------
    SeriesDef("kvtier_tick_lag_seconds", "histogram", (), "seconds",
              "How late a poll-loop pass that fires lifecycle deadlines runs after the earliest of "
              "them was due: one observation per such pass, not per deadline (poll-loop starvation).",
              _LAG_BUCKETS, "tick_lag"),
    SeriesDef("kvtier_internal_errors_total", "counter", (), "errors",
              "Unexpected exceptions caught by the manager (a kvtier bug; see the log).",
              fed_by="internal_error"),
    SeriesDef("kvtier_rejected_peer_total", "counter", (), "requests",
              "Requests whose producer endpoint is not in allowed_peers: nothing was dialled, the "
              "request recomputes (docs/security.md). A steady rate means a misconfigured router "
              "or someone probing.",
              fed_by="rejected_peer"),
    SeriesDef("kvtier_rejected_params_total", "counter", (), "requests", "Requests whose kv_transfer_params were "
              "malformed (on_new_request raised; vLLM's adapter then runs them without KV hand-off and logs the "
              "first each 10 s, naming the field).", fed_by="rejected_params"),
)

_BY_NAME: Mapping[str, SeriesDef] = {s.name: s for s in SERIES}


class _Live(Collector):
    """The scrape-time gauges: one core snapshot (:meth:`TierCore.snapshot`) under the manager's lock.

    Holds the core, the lock and plain values — never the manager — so a registry kept alive by
    a scraper cannot keep the manager (and its block pool) alive.
    """

    LOCK_TIMEOUT_S = 5.0

    def __init__(self, owner: TierMetrics, core: Any, lock: Any, clock: Callable[[], float], block_bytes: int):
        self._const = owner.const_values
        self._core = core
        self._lock = lock
        self._clock = clock
        self._block_bytes = block_bytes
        self._parked_at = owner._parked_at

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for s in SERIES:
            if s.kind == "gauge":
                yield GaugeMetricFamily(s.name, s.help, labels=CONST_LABELS + s.labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self._lock.acquire(timeout=self.LOCK_TIMEOUT_S):
            return  # the manager is wedged: scrape what is not live rather than hang the scraper
        try:
            snap = self._core.snapshot()
            now = self._clock()
        finally:
            self._lock.release()
        yield from self._families(snap, now)

    def _gauge(self, name: str) -> GaugeMetricFamily:
        s = _BY_NAME[name]
        return GaugeMetricFamily(s.name, s.help, labels=CONST_LABELS + s.labels)

    def _families(self, snap: Any, now: float) -> list[GaugeMetricFamily]:
        const = list(self._const)
        parked_at = self._parked_at
        oldest = 0.0
        for kid in snap.parked:
            t0 = parked_at.get(kid)
            if t0 is not None and now - t0 > oldest:
                oldest = now - t0
        if len(parked_at) > len(snap.parked):  # forget ids that are no longer parked
            keep = set(snap.parked)
            for kid in [k for k in parked_at if k not in keep]:
                del parked_at[kid]
        out = []
        g = self._gauge("kvtier_parked_ids")
        p = self._gauge("kvtier_pinned_bytes")
        for state in STATES["kvtier_parked_ids"]:
            g.add_metric(const + [state], snap.producer.get(state, 0))
            p.add_metric(const + [state], snap.pinned_blocks.get(state, 0) * self._block_bytes)
        out += [g, p]
        g = self._gauge("kvtier_oldest_parked_age_seconds")
        g.add_metric(const, max(oldest, 0.0))
        out.append(g)
        g = self._gauge("kvtier_retained_ids")
        retained = dict(snap.retained)
        for state in STATES["kvtier_retained_ids"]:
            retained.setdefault((state, ""), 0)  # both states present from the first scrape
        for (state, reason), n in sorted(retained.items()):
            g.add_metric(const + [state, bounded(reason) if reason else ""], n)
        out.append(g)
        out.append(self._by_state("kvtier_consumer_loads", snap.consumer))
        out.append(self._by_state("kvtier_sessions", snap.sessions))
        g = self._gauge("kvtier_quarantined_blocks")
        g.add_metric(const + ["producer"], float(snap.quarantined_blocks))
        g.add_metric(const + ["consumer"], float(snap.revoking_slots))
        out.append(g)
        g = self._gauge("kvtier_store_jobs_awaiting_receipt")
        g.add_metric(const, float(snap.awaiting_receipt_jobs))
        out.append(g)
        out.append(self._by_state("kvtier_probes", snap.probe))
        out.append(self._by_state("kvtier_serve_rounds", snap.serve))
        g = self._gauge("kvtier_serve_pinned_blocks")
        g.add_metric(const, float(snap.serve_pinned_blocks))
        out.append(g)
        return out

    def _by_state(self, name: str, counts: Mapping[str, int]) -> GaugeMetricFamily:
        g = self._gauge(name)
        for state in STATES[name]:
            g.add_metric(list(self._const) + [state], counts.get(state, 0))
        return g


class TierMetrics:
    """The Prometheus series of one manager, in a registry of its own.

    Args:
        tier: value of the ``tier`` label (the config's ``type``).
        listener: value of the ``listener`` label (the manager's ``host:port``).
        core: the manager's :class:`~kvtier.lifecycle.TierCore`, read at scrape time.
        lock: the manager's lock; held while the live gauges read the core.
        clock: the manager's clock (seconds); ages are measured with it.
        block_bytes: bytes per pool block (pinned bytes = blocks × block_bytes).

    Every feeding method is cheap (a dict lookup and an increment) and never raises for a label
    value outside the vocabulary (it is counted as ``other``).
    """

    def __init__(
        self,
        *,
        tier: str,
        listener: str,
        core: Any,
        lock: Any,
        clock: Callable[[], float],
        block_bytes: int,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.const_values: tuple[str, str] = (tier, listener)
        self._core = core
        self._clock = clock
        self._parked_at: dict[str, float] = {}
        self._children: dict[tuple[str, ...], Any] = {}
        self._metrics: dict[str, Any] = {}
        self._taps: list[_Tap] = []
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        labels = list(CONST_LABELS)
        for s in SERIES:
            if s.kind == "counter":
                self._metrics[s.name] = Counter(s.name, s.help, labels + list(s.labels), registry=self.registry)
            elif s.kind == "histogram":
                self._metrics[s.name] = Histogram(s.name, s.help, labels + list(s.labels), buckets=s.buckets,
                                                  registry=self.registry)
        self.registry.register(_Live(self, core, lock, clock, block_bytes))
        # label-free and role-labelled children exist from the start, so every series is visible
        # (and every dashboard query resolves) before the first event
        for s in SERIES:
            if s.kind == "gauge":
                continue
            if not s.labels:
                self._child(s.name)
            elif s.labels == ("role",):
                for role in ROLES:
                    self._child(s.name, role)
        for kind in ("store", "load"):
            self._child("kvtier_jobs_total", kind, "ok", "")

    # -- feeding (the manager calls these) --------------------------------------------------------
    def job_done(self, kind: str, ok: bool, reason: str | None) -> None:
        """A job result was reported: ``kind`` store|load, ``reason`` of a failure (or ``local``)."""
        self._inc("kvtier_jobs_total", "store" if kind == "store" else "load", "ok" if ok else "fail", bounded(reason))

    def transfer(self, role: str, nbytes: int, seconds: float) -> None:
        """One completed transfer of ``nbytes`` bytes that took ``seconds`` (role producer|consumer)."""
        role = role if role in ROLES else "producer"
        self._observe("kvtier_transfer_bytes", nbytes, role)
        self._observe("kvtier_transfer_duration_seconds", seconds, role)
        if seconds > 0:
            self._observe("kvtier_transfer_throughput_bytes_per_second", nbytes / seconds, role)
        if role == "producer":
            self._inc("kvtier_block_sent_bytes_total", amount=nbytes)

    def landed(self, nbytes: int) -> None:
        """``nbytes`` of block data were written into consumer slots."""
        self._inc("kvtier_block_landed_bytes_total", amount=nbytes)

    def fetch_refused(self, reason: str | None) -> None:
        """A fetch was answered ``transfer_done(fail)`` with ``reason``."""
        self._inc("kvtier_fetches_refused_total", bounded(reason))

    def session_ended(self, reason: str | None) -> None:
        """A session ended (or a hello was refused) with ``reason``."""
        self._inc("kvtier_session_ends_total", bounded(reason))

    def wire_error(self, reason: str | None, *, reported_by_peer: bool = False) -> None:
        """A malformed message arrived (codec ``reason``), or a peer reported one of ours."""
        label = bounded(reason)
        self._inc("kvtier_wire_errors_total", "peer_reported_" + label if reported_by_peer else label)

    def ignored(self, machine: str, reason: str | None) -> None:
        """An input was dropped by one of the spec's ignore rules."""
        self._inc("kvtier_ignored_inputs_total", machine if machine in _MACHINES else "other", bounded(reason))

    def probe_failed(self, reason: str | None) -> None:
        """A request's probing of its peer failed with ``reason``."""
        self._inc("kvtier_probe_failures_total", bounded(reason))

    def probe_answered(self, hits: int, misses: int) -> None:
        """A peer's probe reply answered ``hits`` keys hit and ``misses`` miss."""
        if hits:
            self._inc("kvtier_probe_keys_total", "hit", amount=hits)
        if misses:
            self._inc("kvtier_probe_keys_total", "miss", amount=misses)

    def served(self, hits: int, misses: int) -> None:
        """Our probe reply to a peer answered ``hits`` keys hit and ``misses`` miss."""
        if hits:
            self._inc("kvtier_served_keys_total", "hit", amount=hits)
        if misses:
            self._inc("kvtier_served_keys_total", "miss", amount=misses)

    def pins_released(self, n: int, ok: bool, reason: str | None) -> None:
        """``n`` engine pins of served rounds were released."""
        if n:
            self._inc("kvtier_pins_released_total", "ok" if ok else "fail", "" if ok else bounded(reason), amount=n)

    def rejected_peer(self) -> None:
        """A request named a producer endpoint outside ``allowed_peers``; nothing was dialled."""
        self._inc("kvtier_rejected_peer_total")

    def rejected_params(self) -> None:  # malformed kv_transfer_params: no KV hand-off for that request
        self._inc("kvtier_rejected_params_total")

    def internal_error(self) -> None:
        """An unexpected exception was caught (and logged) by the manager."""
        self._inc("kvtier_internal_errors_total")

    def tick_lag(self, seconds: float) -> None:
        """A deadline fired ``seconds`` after it was due."""
        self._observe("kvtier_tick_lag_seconds", max(0.0, seconds))

    def parked(self, kv_request_id: str) -> None:
        """A store for ``kv_request_id`` is about to be applied (now, by the manager's clock): the
        one that creates the id's producer record starts its park age.  Call it in the pass that
        applies the store, under the manager's lock, before the core applies it — not when a store
        is held for its digests: a scrape forgets the age of an id the core does not show parked."""
        if self._core.producer_state(kv_request_id) is ProducerState.ABSENT:
            self._parked_at[kv_request_id] = self._clock()
            if len(self._parked_at) > 2 * self._core.producer_count() + 1024:  # forget ids no longer parked
                state_of, parked = self._core.producer_state, ProducerState.PARKED
                for kid in [k for k in self._parked_at if k != kv_request_id and state_of(k) is not parked]:
                    del self._parked_at[kid]

    def parked_since(self, kv_request_id: str) -> float | None:
        """When the store that created ``kv_request_id``'s producer record was applied (manager
        clock, seconds), or ``None`` when not known (never parked here, or forgotten)."""
        return self._parked_at.get(kv_request_id)

    # -- reading ----------------------------------------------------------------------------------
    def samples(self) -> dict[str, float]:
        """Every sample as ``{'name{label=value,...}': value}``, without the constant labels and
        without ``_created`` samples (for humans, the demo and tests; not a stable API)."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in CONST_LABELS)
                out[s.name + (f"{{{label}}}" if label else "")] = s.value
        return out

    def tap(self, max_observations: int = 65536) -> _Tap:
        """Start recording every histogram observation (for bridges that ship raw observations,
        like vLLM's stats payload). Bounded: the oldest are dropped beyond ``max_observations``."""
        tap = _Tap(max_observations)
        self._taps.append(tap)
        return tap

    # -- the endpoint -----------------------------------------------------------------------------
    def serve(self, host: str, port: int, requests: Any = None) -> tuple[str, int]:
        """Serve the registry over HTTP (``GET /metrics``, text exposition) on ``host:port``
        (port 0: an ephemeral port), in daemon threads, at most
        :data:`~kvtier.metrics_http.MAX_CONNECTIONS` connections at once (decision O16); with
        ``requests`` (a :class:`~kvtier.forensics.Forensics`) also ``GET /kvtier/requests`` (JSON).

        Returns:
            the bound ``(host, port)``.
        Raises:
            OSError: the address cannot be bound (e.g. the port is in use).
        """
        if self._server is not None:
            raise RuntimeError("the metrics endpoint is already being served")
        server, thread = metrics_http.serve(host, port, make_wsgi_app(self.registry), requests, self.const_values)
        self._server, self._server_thread = server, thread
        return server.server_address[0], server.server_address[1]

    @property
    def address(self) -> str | None:
        """``host:port`` of the endpoint, or ``None`` when it is not served."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def close(self) -> None:
        """Stop the endpoint (if served) and release its port. Idempotent."""
        server, thread = self._server, self._server_thread
        self._server = self._server_thread = None
        if server is not None:
            try:  # wakes serve_forever's select now (Linux), not at the end of its 0.5 s poll interval
                server.socket.shutdown(socket.SHUT_RDWR)
            except OSError:  # pragma: no cover - not supported for a listening socket here
                pass
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5.0)

    # -- internals --------------------------------------------------------------------------------
    def _child(self, name: str, *labels: str) -> Any:
        key = (name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._metrics[name].labels(*self.const_values, *labels)
        return child

    def _inc(self, name: str, *labels: str, amount: float = 1.0) -> None:
        self._child(name, *labels).inc(amount)

    def _observe(self, name: str, value: float, *labels: str) -> None:
        self._child(name, *labels).observe(value)
        for tap in self._taps:
            tap.add(name, labels, value)


class _Tap:
    """Raw histogram observations since the last :meth:`take` (bounded)."""

    def __init__(self, maxlen: int) -> None:
        self._buf: collections.deque[tuple[str, tuple[str, ...], float]] = collections.deque(maxlen=maxlen)
        self.dropped = 0

    def add(self, name: str, labels: tuple[str, ...], value: float) -> None:
        if len(self._buf) == self._buf.maxlen:
            self.dropped += 1
        self._buf.append((name, labels, value))

    def take(self) -> list[tuple[str, tuple[str, ...], float]]:
        out = list(self._buf)
        self._buf.clear()
        return out
