"""Revocation on the NIXL plane: who owns a peer's agent, the proof that it can no longer write
into our slots, and the per-session windows a consumer withdraws (decisions N9, N14).

Pure bookkeeping and ``/proc`` reads; the plane (:mod:`kvtier.dataplane.nixl`) decides when to
withdraw a window and reports :class:`~kvtier.dataplane.base.Revoked` from these checks.
"""

from __future__ import annotations

import os
from typing import Any, Final

import attrs
import msgspec

from kvtier.dataplane.base import Revoked
from kvtier.memory import shared

__all__ = ["CHECK_EVERY_S", "DRAIN_CALLS", "DRAIN_S", "SINK_RELEASE_S", "SINKS_WARN", "ProcessId", "Revocation",
           "Window", "check_revocations", "ended_by_close", "process_gone", "reclaim_sinks", "this_process"]

DRAIN_S: Final = 0.05
"""After a producer's death is proven, keep progressing this long (and at least
:data:`DRAIN_CALLS` times) before reporting the revocation: over UCX tcp our own worker applies
the bytes the producer had already put in our socket buffers."""
DRAIN_CALLS: Final = 5
CHECK_EVERY_S: Final = 0.01
"""How often a pending revocation re-reads ``/proc`` (each check is one small file read)."""

SINK_RELEASE_S: Final = 1.0
"""How often a sink kept for a producer not proven gone gives back the pages late WRITEs touched
(``MADV_DONTNEED``: a later WRITE lands in fresh zero pages of the same sink, so nothing it
writes reaches the pool either way; decision N23)."""

#: Sinks kept beyond this are logged (their address ranges stay mapped until proven unused).
SINKS_WARN = 1024


class ProcessId(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Who owns an agent: enough to prove, from the same host, that the process is gone.

    ``host``: ``<boot_id>/<pid namespace inode>`` (empty where ``/proc`` does not tell);
    ``pid``: its pid in that namespace; ``started``: its start time (clock ticks since boot,
    field 22 of ``/proc/<pid>/stat``), so a recycled pid is not mistaken for it."""

    host: str
    pid: int
    started: int


def _proc_start(pid: int) -> int | None:
    """Start time of live process ``pid`` (not a zombie), else ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) state ppid ..." where comm may hold spaces and parentheses
    rest = data[data.rindex(b")") + 2 :].split()
    if rest[0] in (b"Z", b"X"):  # a zombie has no memory left to write from
        return None
    return int(rest[19])


def this_process() -> ProcessId:
    """The calling process's :class:`ProcessId`."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            host = f"{f.read().strip()}/{os.stat('/proc/self/ns/pid').st_ino}"
        started = _proc_start(os.getpid()) or 0
    except OSError:
        host, started = "", 0
    return ProcessId(host, os.getpid(), started)


def process_gone(pid: ProcessId, here: ProcessId) -> bool:
    """True only if process ``pid`` provably no longer exists: it ran on this host in this PID
    namespace (``here``) and ``/proc`` no longer shows it (or shows another process, or a
    zombie).  False when it lives or when nothing can be proven (another host)."""
    if not pid.host or pid.host != here.host:
        return False
    return _proc_start(pid.pid) != pid.started


def ended_by_close(rev: Revocation, me: ProcessId) -> bool:
    """Whether destroying our agent ends ``rev``'s agents' access to a pool without windows: each
    owner is gone, or on another host (UCX tcp and RDMA reach our memory only through our agent;
    a producer on this host writes by CMA, into our process, agent or not: docs/nixl.md)."""
    if rev.proven_at is not None:  # its owners' deaths were proven; only the drain was left
        return True
    host = me.host.partition("/")[0]
    return bool(rev.agents) and all(o.host and (o.host.partition("/")[0] != host or process_gone(o, me))
                                    for o in rev.agents.values())


@attrs.define(slots=True)
class Revocation:
    """Pending revocation of one peer's access: the agents it wrote through, each with its
    owner, until each one is proven done (its owner dead, or it accepted a fresh handshake)."""

    agents: dict[str, ProcessId] = attrs.Factory(dict)
    checked: float = 0.0
    proven_at: float | None = None
    drained: int = 0


@attrs.define(slots=True, eq=False)
class Window:
    """One dialled session's mapping of the pool (see the module docstring).  ``agent`` and
    ``owner``: the producer it was given to, once its hello_ack named them (reclaiming a sink
    needs proof about that agent)."""

    peer: str
    gen: int
    addr: int
    registration: Any
    agent: str = ""
    owner: ProcessId | None = None
    withdrawn_at: float | None = None
    proven_at: float | None = None
    drained: int = 0
    released_at: float = 0.0  # when the sink last gave its touched pages back (SINK_RELEASE_S)


def check_revocations(revoking: dict[str, Revocation], now: float, me: ProcessId) -> list[Revoked]:
    """One poll's look at the pending revocations (``revoking``: peer -> its revocation; the
    reported ones are removed): an owner proven gone is dropped from its agents, and a revocation
    with no agent left is reported once its drain ran (:data:`DRAIN_S`, :data:`DRAIN_CALLS`)."""
    out: list[Revoked] = []
    for peer, rev in list(revoking.items()):
        if rev.proven_at is None:
            if now - rev.checked < CHECK_EVERY_S or not rev.agents:
                continue
            rev.checked = now
            for agent, owner in list(rev.agents.items()):
                if process_gone(owner, me):
                    del rev.agents[agent]
            if not rev.agents:
                rev.proven_at = now
            continue
        rev.drained += 1  # poll() progressed once more since the proof
        if rev.drained >= DRAIN_CALLS and now - rev.proven_at >= DRAIN_S:
            del revoking[peer]
            out.append(Revoked(peer))
    return out


def reclaim_sinks(sinks: list[Window], now: float, check: bool, me: ProcessId, size: int) -> list[Window]:
    """Unmap the sinks whose producer is proven unable to write there (and drained since); the
    sinks kept.  ``check``: re-read ``/proc`` this time (at most every :data:`CHECK_EVERY_S`)."""
    keep = []
    for w in sinks:
        if w.proven_at is None and check and w.owner is not None and process_gone(w.owner, me):
            w.proven_at = now
        if w.proven_at is not None:
            w.drained += 1
            if w.drained >= DRAIN_CALLS and now - w.proven_at >= DRAIN_S:
                shared.unmap(w.addr, size)
                continue
        elif now - w.released_at >= SINK_RELEASE_S:
            w.released_at = now
            shared.release_pages(w.addr, size)
        keep.append(w)
    return keep
