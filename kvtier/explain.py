"""Text a person reads: one finished request explained (``kvtier why``), and a manager's numbers in
a dozen lines (:meth:`KvTierManager.stats`, printed).

Both read plain data — the JSON of ``GET /kvtier/requests`` (:func:`kvtier.forensics.to_json`) and
the ``{'name{label=value}': value}`` samples of :meth:`kvtier.metrics.TierMetrics.samples` — so the
same text comes out of a live manager and of a remote endpoint.
"""

from __future__ import annotations

import json

from collections.abc import Iterable, Mapping
from typing import Any

from kvtier.advice import advice
from kvtier.lifecycle import REASON_DOCS, Reason

__all__ = ["UNREADABLE", "TierStats", "as_sent", "explain", "explain_open", "one_line"]

#: What explaining a record of another kvtier version (or a proxy's) raises: a field missing or
#: of another type; :func:`as_sent` then shows it.
UNREADABLE = (KeyError, TypeError, ValueError, AttributeError)


def as_sent(e: Any, exc: Exception, *, what: str = "a record", indent: int | None = None,
            limit: int | None = None) -> str:
    """A record this kvtier cannot read, with why, as the endpoint sent it."""
    text = json.dumps(e, indent=indent, default=str)
    return (f"{what} this kvtier cannot read ({type(exc).__name__}: {exc}; another kvtier version?), as sent:"
            f"{chr(10) if indent else ' '}{text if limit is None else text[:limit]}")

_ROLE = {"consumer": "load (consumer)", "producer": "parked blocks (producer)",
         "fetch": "a peer's fetch (producer)", "probe": "probing its peer (symmetric)",
         "offer": "blocks offered to a peer (symmetric, serving)"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _meaning(reason: str) -> str:
    try:
        return REASON_DOCS[Reason(reason)]
    except ValueError:
        return ""


def _outcome(e: Mapping[str, Any]) -> str:
    if e["ok"]:
        return "ok" + (f" ({e['reason']})" if e.get("reason") else "")
    return f"FAILED: {e['reason'] or 'failed'}"


def one_line(e: Mapping[str, Any]) -> str:
    """``kv-42 load (consumer) FAILED: load_timeout, peer 10.0.0.5:5710, 1.40 s ago``."""
    ago = e.get("ago")
    when = f", {_ms(ago)} ago" if isinstance(ago, (int, float)) else ""
    peer = f", peer {e['peer']}" if e.get("peer") else ""
    return f"{e['kv_request_id']} {_ROLE.get(e['role'], e['role'])} {_outcome(e)}{peer}{when}"


def _steps(marks: Mapping[str, float]) -> str:
    """``fetch +0.1 ms · first_block +1.2 ms`` (milestone -> seconds after the start)."""
    return " · ".join(f"{name} +{_ms(at)}" for name, at in marks.items())


#: What a request in one of these states waits for (``kvtier why`` on one still in progress).
_WAITING = {
    ("producer", "parked"): "a consumer's fetch; unbound_store_timeout_s after the store it is reaped",
    ("producer", "awaiting"): "the rest of the fetched blocks to be stored (fetch_supply_timeout_s)",
    ("producer", "serving"): "the data plane to move the blocks, then the consumer's receipt (transfer_timeout_s)",
    ("producer", "delivering"): "the consumer's receipt: every block left (transfer_timeout_s)",
    ("producer", "confirmed"): "the data plane to let go of the blocks the consumer confirmed",
    ("producer", "cancelling"): "the data plane to let go of the given-up transfer; its answer follows",
    ("producer", "quarantined"): "the data plane to let go of the blocks (their session was ended to force it)",
    ("consumer", "announced"): "the engine's load of it (submit_load)",
    ("consumer", "queued"): "its session with the producer (the dial and handshake); the fetch leaves then",
    ("consumer", "in_flight"): "the producer's blocks (load_timeout_s)",
}


def explain_open(e: Mapping[str, Any], where: str = "") -> str:
    """A request still in progress (an ``open`` object of ``GET /kvtier/requests``): its role,
    peer, states and milestones so far, and what its state waits for."""
    peer = f", peer {e['peer']}" if e.get("peer") else ""
    seconds = e.get("seconds")
    since = f" for {_ms(seconds)}" if isinstance(seconds, (int, float)) else ""
    lines = [f"{e['kv_request_id']} {_ROLE.get(e['role'], e['role'])} IN PROGRESS{since}{peer}"
             + (f"  [{where}]" if where else "")]
    path = e.get("path") or []
    if path:
        lines.append(f"  path      {' → '.join(path)} (so far)")
    marks = e.get("marks") or {}
    if marks:
        lines.append(f"  timeline  {_steps(marks)}")
    if e["role"] == "consumer" and e.get("landed"):
        lines.append(f"  blocks    {e['landed']} landed so far")
    waits = _WAITING.get((e["role"], path[-1])) if path else None
    if waits:
        lines.append(f"  waiting   for {waits}")
    return "\n".join(lines)


def explain(e: Mapping[str, Any], where: str = "") -> str:
    """A finished request (a JSON object of ``GET /kvtier/requests``), as a few labelled lines: what
    happened, when, with whom, and — for a failure — what the reason means and what to change."""
    head = one_line(e) + (f"  [{where}]" if where else "")
    lines = [head]
    if e.get("path"):
        lines.append(f"  path      {' → '.join(e['path'])}")
    marks = e.get("marks") or {}
    if marks:
        lines.append(f"  timeline  {_steps(marks)}  ({_ms(e.get('seconds', 0.0))} in all)")
    if e["role"] == "consumer" and e.get("blocks"):
        lines.append(f"  blocks    {e.get('landed', 0)} of {e['blocks']} landed ({_bytes(e.get('nbytes', 0))} asked)")
    elif e["role"] == "producer" and e.get("blocks"):
        lines.append(f"  blocks    {e['blocks']} parked ({_bytes(e.get('nbytes', 0))})")
    elif e["role"] == "producer" and list(e.get("path") or ()) == ["refused"]:
        lines.append("  blocks    none parked: this store was refused when it was submitted")
    reason = e.get("reason") or ""
    if reason:
        meaning = _meaning(reason)
        if meaning:
            lines.append(f"  meaning   {meaning}")
        todo = advice(reason, e["role"])
        if todo and not e["ok"]:
            lines.append(f"  change    {todo}")
        lines.append(f"  see       docs/troubleshooting.md#{reason}")
    return "\n".join(lines)


# -- a manager's numbers, readable ---------------------------------------------------------------

def _parse(samples: Mapping[str, float]) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for key, value in samples.items():
        name, _, rest = key.partition("{")
        labels = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv)
        out.setdefault(name, []).append((labels, value))
    return out


def _sum(series: dict, name: str, **want: str) -> float:
    return sum(v for labels, v in series.get(name, ()) if all(labels.get(k) == w for k, w in want.items()))


def _by(series: dict, name: str, label: str, **want: str) -> str:
    """``reaped 18, aborted 2`` (non-zero values of ``label``, largest first)."""
    counts: dict[str, float] = {}
    for labels, v in series.get(name, ()):
        if v and all(labels.get(k) == w for k, w in want.items()):
            counts[labels.get(label, "")] = counts.get(labels.get(label, ""), 0.0) + v
    return ", ".join(f"{k or '—'} {v:g}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


class TierStats(dict):
    """:meth:`KvTierManager.stats`: every sample as ``{'name{label=value,...}': value}`` (a plain
    ``dict``, as before), printed as a short summary (``str()``), with the most recently finished
    requests (:attr:`recent`, JSON objects of :mod:`kvtier.forensics`)."""

    def __init__(self, samples: Mapping[str, float], *, title: str = "", recent: Iterable[Mapping[str, Any]] = ()):
        super().__init__(samples)
        self.title = title
        self.recent = list(recent)

    def summary(self) -> str:
        """A dozen lines: producer, consumer, jobs, transfers, sessions, wire, recent requests."""
        s = _parse(self)
        parked = _sum(s, "kvtier_parked_ids", state="parked")
        bound = _sum(s, "kvtier_parked_ids") - parked
        lines = [f"kvtier {self.title}".rstrip()]
        lines.append(
            f"  producer   parked {parked:g} ids ({_bytes(_sum(s, 'kvtier_pinned_bytes'))} pinned, oldest "
            f"{_sum(s, 'kvtier_oldest_parked_age_seconds'):.1f} s) · bound {bound:g} · retained "
            f"{_sum(s, 'kvtier_retained_ids'):g} ({_by(s, 'kvtier_retained_ids', 'state') or 'none'})")
        lines.append(f"  consumer   loads {_by(s, 'kvtier_consumer_loads', 'state') or 'none'}")
        for kind in ("store", "load"):
            ok, fail = _sum(s, "kvtier_jobs_total", kind=kind, outcome="ok"), _sum(
                s, "kvtier_jobs_total", kind=kind, outcome="fail")
            why = _by(s, "kvtier_jobs_total", "reason", kind=kind, outcome="fail")
            lines.append(f"  {kind} jobs {ok:g} ok · {fail:g} failed" + (f" ({why})" if why else ""))
        for role, word in (("producer", "sent"), ("consumer", "received")):
            n, b = (_sum(s, "kvtier_transfer_bytes_count", role=role), _sum(s, "kvtier_transfer_bytes_sum", role=role))
            secs = _sum(s, "kvtier_transfer_duration_seconds_sum", role=role)
            mean = f", mean {_ms(secs / n)} each" if n else ""
            lines.append(f"  {word:<9}  {n:g} transfers, {_bytes(b)}{mean}")
        refused = _by(s, "kvtier_fetches_refused_total", "reason")
        if refused:
            lines.append(f"  refused    fetches: {refused}")
        lines.append(f"  sessions   {_by(s, 'kvtier_sessions', 'state') or 'none'}"
                     + (f" · ended: {_by(s, 'kvtier_session_ends_total', 'reason')}"
                        if _sum(s, "kvtier_session_ends_total") else ""))
        wire = _by(s, "kvtier_wire_errors_total", "reason")
        bugs = _sum(s, "kvtier_internal_errors_total")
        if wire or bugs:
            lines.append(f"  problems   wire errors: {wire or 'none'} · internal errors: {bugs:g}")
        if self.recent:
            lines.append("  recent     " + "\n             ".join(one_line(e) for e in self.recent))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
