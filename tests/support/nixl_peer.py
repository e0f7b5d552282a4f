"""A NIXL block agent in a child process, for two-process tests and measurements.

:func:`spawn_nixl_peer` starts a ``spawn`` child (a :class:`tools.child.Child`) that owns
one :class:`~kvtier.dataplane.nixl_agent.NixlBlockAgent` over a zeroed numpy region and answers
commands (``op_*`` of :class:`NixlPeer`) over a Pipe. Between commands the child keeps calling
``progress()`` and ``poll()`` (a UCX tcp target needs that) and records every outcome, fault and
notification, so the parent asks for them whenever it likes.

The environment (``UCX_NET_DEVICES``, ``UCX_TLS`` …) is applied in the child *before* NIXL is
imported, and ``netns`` moves the child into a network namespace first, so one test can run its
processes on loopback, over tcp only, or across a veth pair.

Block contents are :func:`tools.blocks.block_pattern`, so the parent computes the
digest of what a slot must hold without asking anyone.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tools.blocks import block_pattern
from tools.child import Child

__all__ = ["NixlPeer", "enter_netns", "spawn_nixl_peer"]

def enter_netns(name: str) -> None:
    """Move the calling (single-threaded) process into network namespace ``name`` as ``ip netns
    exec`` does (:func:`tests.support.netns.enter` with ``sysfs=True``)."""
    from tests.support.netns import enter

    enter(name, sysfs=True)


class NixlPeer:
    """Child-side handler: one agent, its region, and what happened to it (see module doc)."""

    def __init__(
        self,
        agent_name: str,
        num_blocks: int,
        block_bytes: int,
        env: Mapping[str, str] | None = None,
        netns: str | None = None,
        layout: str = "",
        pump_s: float = 0.0005,
    ) -> None:
        os.environ.update(env or {})
        if netns:
            enter_netns(netns)
        from kvtier.dataplane.nixl_agent import NixlBlockAgent, PeerFault

        self._PeerFault = PeerFault
        self.region = np.zeros((num_blocks, block_bytes), dtype=np.uint8)
        self.region[:] = 0  # fault the pages in before anything is timed
        t = time.perf_counter()
        self.agent = NixlBlockAgent(agent_name, self.region, layout=layout)
        self.start_s = time.perf_counter() - t
        self.pump_s = pump_s
        self.results: dict[int, tuple[str, str, str]] = {}
        self.faults: list[tuple[str, str]] = []
        self.notifs: list[tuple[str | None, str, bytes]] = []
        self.streams: dict[str, dict[str, Any]] = {}
        self.paused = False

    def hello(self) -> dict[str, Any]:
        return {"descriptor": self.agent.descriptor(), "pid": os.getpid(), "start_s": self.start_s}

    # -- background -------------------------------------------------------------------------------

    def _record(self, events: Sequence[Any]) -> None:
        for ev in events:
            if isinstance(ev, self._PeerFault):
                self.faults.append((ev.peer, ev.cause))
            else:
                if ev.xfer_id in self.results:
                    raise AssertionError(f"transfer {ev.xfer_id} reported twice")
                self.results[ev.xfer_id] = (ev.peer, ev.status, ev.detail)

    def _step(self) -> None:
        if self.agent.closed:
            return
        self.notifs.extend((n.peer, n.agent, n.message) for n in self.agent.progress())
        self._record(self.agent.poll())
        for peer, s in self.streams.items():
            if self.agent.pending(peer) < s["depth"]:
                remote = s["remote_sets"][len(s["posted"]) % len(s["remote_sets"])]
                s["posted"].append(self.agent.post_write(peer, s["local"], remote))

    def wait(self, conn: Any) -> None:
        if self.paused:  # a wedged process: no NIXL call until the next command
            conn.poll(None)
            return
        while not conn.poll(self.pump_s):
            self._step()

    # -- commands ---------------------------------------------------------------------------------

    def op_pause(self) -> None:
        """Stop calling into the agent between commands (a target that makes no progress)."""
        self.paused = True

    def op_resume(self) -> None:
        self.paused = False

    def op_fill_byte(self, value: int, blocks: Sequence[int]) -> None:
        for b in blocks:
            self.region[b] = value

    def op_runs_of(self, value: int, slots: Sequence[int], run: int = 4096) -> int:
        """How many aligned ``run``-byte chunks of ``slots`` consist only of ``value``."""
        chunks = self.region[list(slots)].reshape(-1, run)
        return int((chunks == value).all(axis=1).sum())

    def op_fill(self, seed: int, blocks: Sequence[int]) -> None:
        bb = self.region.shape[1]
        for b in blocks:
            self.region[b] = np.frombuffer(block_pattern(seed, b, bb), dtype=np.uint8)

    def op_digests(self, slots: Sequence[int]) -> list[str]:
        return [hashlib.sha256(self.region[s].tobytes()).hexdigest() for s in slots]

    def op_add_peer(self, peer: str, descriptor: bytes) -> None:
        self.agent.add_peer(peer, descriptor)

    def op_remove_peer(self, peer: str) -> None:
        self.agent.remove_peer(peer)

    def op_post(self, peer: str, local: Any, remote: Any, notif: bytes | None = None) -> int:
        return self.agent.post_write(peer, local, remote, notif)

    def op_wait(self, xids: Sequence[int], within_s: float = 30.0) -> dict[int, tuple[str, str, str]]:
        """Outcomes of ``xids``; raises ``TimeoutError`` if any is still open after ``within_s``."""
        end = time.monotonic() + within_s
        while any(x not in self.results for x in xids):
            if time.monotonic() > end:
                open_ = [x for x in xids if x not in self.results]
                raise TimeoutError(f"transfers {open_} have no outcome after {within_s} s")
            self._step()
        return {x: self.results[x] for x in xids}

    def op_wait_fault(self, peer: str, within_s: float = 30.0) -> str:
        end = time.monotonic() + within_s
        while not any(p == peer for p, _ in self.faults):
            if time.monotonic() > end:
                raise TimeoutError(f"no fault reported for {peer!r} after {within_s} s")
            self._step()
        return next(c for p, c in self.faults if p == peer)

    def op_state(self) -> dict[str, Any]:
        return {
            "results": dict(self.results),
            "faults": list(self.faults),
            "notifs": list(self.notifs),
            "pending": self.agent.pending() if not self.agent.closed else 0,
        }

    def op_stream_start(self, peer: str, local: Sequence[int], remote_sets: Sequence[Sequence[int]], depth: int = 4) -> None:
        """Between commands, keep up to ``depth`` WRITEs of ``local`` to ``peer`` posted and not
        yet reported, cycling over ``remote_sets`` (each as long as ``local``)."""
        self.streams[peer] = {"local": list(local), "remote_sets": [list(r) for r in remote_sets],
                              "depth": depth, "posted": []}

    def op_stream_stop(self, peer: str) -> list[int]:
        """Stop streaming to ``peer``; the ids it posted."""
        s = self.streams.pop(peer, None)
        return s["posted"] if s else []

    def op_close(self, grace_s: float = 2.0) -> int:
        """Close the agent; record what close() reported. Returns how many outcomes it reported."""
        events = self.agent.close(grace_s)
        self._record(events)
        return len(events)

    def close(self) -> None:
        self.agent.close(0.5)

    # -- measurements -----------------------------------------------------------------------------

    def op_bench_write(self, peer: str, blocks: int, reps: int, warmup: int = 2, spread: bool = True) -> list[float]:
        """Seconds per WRITE of ``blocks`` blocks (post → DONE, busy-polling), ``reps`` times.

        ``spread``: remote slots in reverse order (not one contiguous run), as a fetch names them.
        """
        local = np.arange(blocks, dtype=np.int32)
        remote = local[::-1].copy() if spread else local
        out = []
        for i in range(warmup + reps):
            t = time.perf_counter()
            xid = self.agent.post_write(peer, local, remote)
            while True:
                evs = self.agent.poll()
                self._record(evs)
                if xid in self.results:
                    break
            dt = time.perf_counter() - t
            if self.results[xid][1] != "done":
                raise RuntimeError(f"bench WRITE failed: {self.results[xid]}")
            if i >= warmup:
                out.append(dt)
        return out

    def op_bench_memcpy(self, nbytes: int, reps: int, warmup: int = 2) -> list[float]:
        """Seconds per in-process ``np.copyto`` of ``nbytes`` between two pre-faulted buffers."""
        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.zeros(nbytes, dtype=np.uint8)
        out = []
        for i in range(warmup + reps):
            t = time.perf_counter()
            np.copyto(dst, src)
            dt = time.perf_counter() - t
            if i >= warmup:
                out.append(dt)
        return out


def spawn_nixl_peer(
    name: str, num_blocks: int, block_bytes: int, *, env: Mapping[str, str] | None = None,
    start_timeout_s: float = 60.0, **kw: Any
) -> Child:
    """Start a child running :class:`NixlPeer` (agent ``name``; ``kw``: ``netns``, ``layout``,
    ``pump_s``); ``.hello`` holds its descriptor, pid and agent start-up seconds.

    ``env`` is merged over ``{"UCX_NET_DEVICES": "lo", "NIXL_LOG_LEVEL": "WARN"}``. Close it
    with ``.close()`` (asks, joins, then SIGKILLs by pid); ``.kill()`` is SIGKILL by pid.
    """
    full_env = {"UCX_NET_DEVICES": "lo", "NIXL_LOG_LEVEL": "WARN", **(env or {})}
    child = Child(__name__, "NixlPeer", {"agent_name": name, "num_blocks": num_blocks, "block_bytes": block_bytes, **kw},
                  name=name, env=full_env).start()
    child.wait_ready(start_timeout_s)
    return child
