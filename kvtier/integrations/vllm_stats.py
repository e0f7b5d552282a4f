"""kvtier's series on vLLM's own ``/metrics`` (the vLLM adapter, :mod:`kvtier.integrations.vllm`):
the series as vLLM 0.33.0 offloading metric definitions, and the bridge that turns a manager's
registry into vLLM's ``OffloadingConnectorStats`` payloads.

Imports without vLLM: vLLM's names are imported when the adapter asks for them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kvtier.metrics import CONST_LABELS, SERIES

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.v1.kv_offload.base import OffloadingMetricMetadata

    from kvtier.manager import KvTierManager

__all__ = ["VLLM_PREFIX", "StatsBridge", "vllm_metric_definitions"]

VLLM_PREFIX = "vllm:"
"""kvtier's series appear on vLLM's ``/metrics`` as ``vllm:<name>`` (e.g. ``vllm:kvtier_parked_ids``)."""

def _vllm_name(name: str, kind: str) -> str:
    # prometheus_client appends _total to a counter's name itself
    base = name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name
    return VLLM_PREFIX + base


def vllm_metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """kvtier's series (:data:`kvtier.metrics.SERIES`) as vLLM 0.33.0 offloading metric
    definitions; vLLM prepends its engine labels (``model_name``, ``engine``)."""
    from vllm.v1.kv_offload.base import (
        OffloadingCounterMetadata,
        OffloadingGaugeMetadata,
        OffloadingHistogramMetadata,
    )

    out: dict[str, OffloadingMetricMetadata] = {}
    for s in SERIES:
        labels = CONST_LABELS + s.labels
        if s.kind == "counter":
            meta: OffloadingMetricMetadata = OffloadingCounterMetadata(documentation=s.help, labelnames=labels)
        elif s.kind == "gauge":
            meta = OffloadingGaugeMetadata(documentation=s.help, labelnames=labels)
        else:
            meta = OffloadingHistogramMetadata(documentation=s.help, labelnames=labels, buckets=s.buckets)
        out[_vllm_name(s.name, s.kind)] = meta
    return out


class StatsBridge:
    """Turns a manager's registry into vLLM's ``OffloadingConnectorStats`` payloads: counter
    increments since the last payload, gauge snapshots (a gauge child the registry no longer
    shows is sent once as 0: vLLM keeps each child's last value), and every histogram
    observation (from a bounded :meth:`~kvtier.metrics.TierMetrics.tap`).

    Args:
        mgr: the manager whose series are sent.
        interval_s: the least time between two payloads (seconds); :meth:`take` returns None
            before it has passed.

    Raises:
        ImportError: vLLM is not installed (at construction).
    """

    def __init__(self, mgr: KvTierManager, interval_s: float) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

        self._payload = OffloadingConnectorStats
        self._interval_s = interval_s
        self._metrics = mgr.tier_metrics
        self._tap = self._metrics.tap()
        self._last: dict[tuple[str, tuple[str, ...]], float] = {}
        self._gauges: set[tuple[str, tuple[str, ...]]] = set()  # gauge children sent (bounded labels)
        self._labels = {s.name: CONST_LABELS + s.labels for s in SERIES}
        self._kinds = {s.name: s.kind for s in SERIES}
        self._next = 0.0

    def take(self) -> OffloadingConnectorStats | None:
        """The payload since the last one; None when ``interval_s`` has not passed or nothing is
        to be sent."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self._interval_s
        stats = self._payload()
        const = self._metrics.const_values
        gauges: set[tuple[str, tuple[str, ...]]] = set()
        for family in self._metrics.registry.collect():
            kind = family.type
            if kind not in ("counter", "gauge"):
                continue
            for sample in family.samples:
                name = sample.name
                if kind == "counter" and not name.endswith("_total"):
                    continue  # _created
                names = self._labels.get(name)
                if names is None:
                    continue
                labels = tuple(sample.labels.get(n, "") for n in names)
                vname = _vllm_name(name, kind)
                if kind == "gauge":
                    stats.set_gauge(vname, sample.value, labels)
                    gauges.add((vname, labels))
                    continue
                key = (name, labels)
                delta = sample.value - self._last.get(key, 0.0)
                if delta > 0:
                    self._last[key] = sample.value
                    stats.increase_counter(vname, delta, labels)
        # vLLM keeps a gauge child's last value: one the registry no longer shows (a retained
        # reason whose ids were all pruned) is sent as 0 once, or vLLM's page would hold it for ever
        # — but only from a family this collection read: a scrape that could not take the manager's
        # lock yields no live gauge at all, and the children it did not read keep their values
        families = {vname for vname, _ in gauges}
        for vname, labels in self._gauges - gauges:
            if vname in families:
                stats.set_gauge(vname, 0.0, labels)
            else:
                gauges.add((vname, labels))
        self._gauges = gauges
        for name, labels, value in self._tap.take():
            stats.observe_histogram(_vllm_name(name, "histogram"), value, (*const, *labels))
        return None if stats.is_empty() else stats
