"""``TierView``: what a :class:`~kvtier.manager.KvTierManager` shows its readers — the parts its
I/O loop owns, its metrics and its addresses — apart from the engine calls (one job per module).
Nothing here changes the tier; reading :attr:`TierView.core` while the loop runs on its thread
needs :attr:`TierView.lock`."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry

from kvtier.config import TierConfig
from kvtier.explain import TierStats
from kvtier.integrity import DigestPool
from kvtier.lifecycle import TierCore
from kvtier.metrics import TierMetrics

__all__ = ["TierView"]


class TierView:
    """The read side of a manager (its subclass sets the attributes below)."""

    config: TierConfig
    forensics: Any
    _loop: Any
    _lock: threading.RLock
    _metrics: TierMetrics
    _hello: Any

    # -- what the loop owns, for readers -----------------------------------------------------------
    @property
    def core(self) -> TierCore:
        """The lifecycle core (its read API: sessions, states, quarantine, snapshots).  Owned by
        the I/O loop: read it under :attr:`lock` while the loop runs on its thread."""
        return self._loop.core

    @property
    def transport(self) -> Any:
        """The loop's transport (introspection and fault injection in tests; the loop owns it)."""
        return self._loop.transport

    @property
    def plane(self) -> Any:
        """The loop's data plane (introspection in tests and benchmarks; the loop owns it)."""
        return self._loop.plane

    @property
    def digest_pool(self) -> DigestPool | None:
        """The pool that takes large stores' digests and does large landings (config
        ``digest_threads``; ``None`` with ``digest_threads=0`` or ``integrity="none"``); closed,
        its threads joined, by :meth:`shutdown` and :meth:`close_abruptly`."""
        return self._loop.digest_pool

    @property
    def lock(self) -> threading.RLock:
        """The I/O loop's pass lock: held for the length of each pass — and, without the loop's own
        thread, while :meth:`poll` waits for input (decision A12); on its thread, never while it
        waits.  Hold it to read :attr:`core` consistently while the loop runs on its thread."""
        return self._lock

    @property
    def passes(self) -> int:
        """Passes of the I/O loop that applied something (commands, inputs, deadlines) so far."""
        return self._loop.passes

    # -- metrics ---------------------------------------------------------------------------------
    @property
    def metrics(self) -> CollectorRegistry:
        """This manager's Prometheus registry (its series: docs/metrics.md)."""
        return self._metrics.registry

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` of the metrics endpoint (config ``metrics_port``), or ``None`` when off."""
        return self._metrics.address

    @property
    def tier_metrics(self) -> TierMetrics:
        """This manager's :class:`~kvtier.metrics.TierMetrics` (its registry, taps, labels)."""
        return self._metrics

    def stats(self) -> TierStats:
        """A snapshot of every series (not a stable API): a ``dict`` whose keys are
        ``name{label=value,...}`` without the per-manager ``tier``/``listener`` labels; printed, a
        dozen readable lines with the last finished requests (:class:`kvtier.explain.TierStats`)."""
        with self._lock:
            samples = self._metrics.samples()
        return TierStats(samples, title=f"{self.config.type} @ {self.address}", recent=self.forensics.as_json(limit=5))

    # -- properties ------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``host:port`` this manager listens on (give it to consumers as remote_host/port)."""
        return self._loop.transport.address

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def local_hello(self) -> Any:
        """What our handshakes announce (:class:`~kvtier.lifecycle.HelloInput`)."""
        return self._hello
