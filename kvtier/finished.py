"""One finished request as the request forensics keep it (:mod:`kvtier.forensics`) and the metrics
endpoint serves it (``GET /kvtier/requests``): the record, and its JSON; and one request still in
progress as they trace it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

__all__ = ["Finished", "InProgress", "to_json"]


class Finished(msgspec.Struct, frozen=True, gc=False):
    """One finished request (what ``GET /kvtier/requests`` serves, one JSON object each).

    Attributes:
        kv_request_id: the id.
        role: ``"consumer"`` (a load), ``"producer"`` (parked blocks), ``"fetch"`` (a peer's
            fetch refused, at once or after it waited bound), ``"probe"`` (a symmetric
            request's probing of its peer failed: its blocks were computed) or ``"offer"`` (blocks
            this serving peer offered for a symmetric round, withdrawn unfetched: expired, drained).
        ok: whether it succeeded.
        reason: the spec reason code of a failure (docs/troubleshooting.md); ``""`` on success
            (or the label of a success that moved nothing, ``not_needed``).
        peer: the other side (``host:port`` of a producer we dialled; a peer that dialled us as
            the transport names it), ``""`` if none was involved.
        path: the lifecycle states the id was seen in, in order (spec/lifecycle.toml).
        marks: ``(milestone, seconds after start)`` in order (:mod:`kvtier.forensics` names them).
        started: when it started (seconds, the manager's clock).
        seconds: from start to finish.
        blocks: blocks of the job(s) (a load: slots; parked: stored blocks).
        landed: a load's blocks that landed and matched their digests (0 for other roles).
        nbytes: bytes of the job(s) (``blocks × block_bytes``).
    """

    kv_request_id: str
    role: str
    ok: bool
    reason: str
    peer: str
    path: tuple[str, ...]
    marks: tuple[tuple[str, float], ...]
    started: float
    seconds: float
    blocks: int = 0
    landed: int = 0
    nbytes: int = 0


def to_json(entries: Iterable[Finished], now: float | None = None) -> list[dict[str, Any]]:
    """The entries as JSON-ready dicts (milestones as ``{name: seconds}``; with ``now``, ``ago``:
    seconds since each finished)."""
    out = []
    for e in entries:
        d = msgspec.structs.asdict(e)
        d["path"] = list(e.path)
        d["marks"] = dict(e.marks)
        if now is not None:
            d["ago"] = max(0.0, now - e.started - e.seconds)
        out.append(d)
    return out


class InProgress:
    """A request in progress, as the request forensics trace it (:mod:`kvtier.forensics`; mutable:
    only the thread that performs effects touches it)."""

    __slots__ = ("blocks", "bound", "landed", "marks", "nbytes", "path", "peer", "round", "started")

    def __init__(self, now: float) -> None:
        self.started = now
        self.peer = ""
        self.bound: float | None = None  # producer: when the fetch of (peer, round) bound the id
        self.round = -1
        self.path: list[str] = []
        self.marks: list[tuple[str, float]] = []
        self.blocks = self.landed = self.nbytes = 0

    def mark(self, name: str, now: float) -> None:
        if not any(m == name for m, _ in self.marks):  # the first of each milestone
            self.marks.append((name, now))
