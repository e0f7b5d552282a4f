"""Fixtures for the runtime manager tests.

* ``peer_pool`` (session): child processes running a KvTierManager (tests.support.peer_process).
  A spawn costs seconds (torch import), so one long-lived child serves every test through
  ``producer`` (a fresh manager per test), and one spare is started at the same time, in the
  background, for the test that kill -9s (or SIGSTOPs) a child; taking it starts the next spare.
* ``producer``: the shared child, with its manager stopped again after the test.
* ``victim``: a child of its own that the test may kill; killed/closed by the finaliser.
* ``make_manager``: in-process managers on real zmq sockets (127.0.0.1, ephemeral port), shut
  down by the finaliser.
* ``pairs``: ``pairs(*a, **kw)`` -> a :class:`mgr_helpers.VirtualPair` (two managers on an in-memory
  network, a virtual clock), closed by the finaliser.
* ``data_plane``: ``"zmq"`` unless a test parametrises it (``indirect=True``, see
  ``mgr_helpers.BOTH_PLANES``); ``producer``, ``victim`` and ``make_manager`` configure their managers
  with it.  NIXL runs on loopback (``UCX_NET_DEVICES=lo``), in the children and here.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.peer_process import PeerProcess

# before any NIXL agent exists, here and (inherited) in every child
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")


@pytest.fixture
def data_plane(request: pytest.FixtureRequest) -> str:
    return getattr(request, "param", "zmq")


class PeerPool:
    def __init__(self) -> None:
        self.shared: PeerProcess | None = None
        self.spares: list[PeerProcess] = []
        self.all: list[PeerProcess] = []

    def _new(self, name: str) -> PeerProcess:
        p = PeerProcess(name, max_lifetime_s=900.0)
        p.start()
        self.all.append(p)
        return p

    def get_shared(self) -> PeerProcess:
        if self.shared is None or not self.shared.alive:
            self.shared = self._new("kvtier-peer-shared")
            if not self.spares:  # start the spare now too: both import torch in parallel
                self.spares.append(self._new("kvtier-peer-spare"))
        self.shared.wait_ready()
        return self.shared

    def take_spare(self) -> PeerProcess:
        p = self.spares.pop() if self.spares else self._new("kvtier-peer-victim")
        # the next test that kills or wedges a child finds one ready: it imports torch now,
        # while this test runs, instead of on that test's clock
        self.spares.append(self._new("kvtier-peer-spare"))
        p.wait_ready()
        return p

    def close(self) -> None:
        for p in self.all:
            try:
                p.close(timeout_s=5.0)
            finally:
                p.kill()


@pytest.fixture(scope="session")
def peer_pool() -> Iterator[PeerPool]:
    pool = PeerPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def producer(peer_pool: PeerPool, data_plane: str) -> Iterator[PeerProcess]:
    """The shared child process; the test starts its manager with ``start_manager``."""
    p = peer_pool.get_shared()
    p.defaults = {"data_plane": data_plane}
    try:
        yield p
    finally:
        if p.alive:
            try:
                p.stop_manager()
            except Exception:
                p.kill()  # a wedged child is replaced by the next test
        assert p.alive, "the shared peer process died during the test"


@pytest.fixture
def victim(peer_pool: PeerPool, data_plane: str) -> Iterator[PeerProcess]:
    """A child process of its own, which the test may kill -9."""
    p = peer_pool.take_spare()
    p.defaults = {"data_plane": data_plane}
    try:
        yield p
    finally:
        p.close(timeout_s=5.0)
        p.kill()
        assert not p.alive


@pytest.fixture
def make_manager(data_plane: str) -> Iterator[Any]:
    """``make_manager(config, num_blocks=64, block_bytes=4096, **kw)`` -> KvTierManager on a
    real ZmqTransport at 127.0.0.1:<ephemeral>; every one is shut down after the test."""
    from kvtier.manager import KvTierManager
    from kvtier.memory import BlockPool

    made: list[KvTierManager] = []

    def _make(config: dict | None = None, *, num_blocks: int = 64, block_bytes: int = 4096, **kw: Any):
        cfg = {"host": "127.0.0.1", "port": 0, "data_plane": data_plane, **(config or {})}
        m = KvTierManager(cfg, BlockPool(num_blocks, block_bytes, pin=False), **kw)
        made.append(m)
        return m

    try:
        yield _make
    finally:
        for m in made:
            m.shutdown()


@pytest.fixture
def pairs() -> Iterator[Any]:
    from mgr_helpers import VirtualPair

    made: list[VirtualPair] = []

    def _make(*a: Any, **kw: Any) -> VirtualPair:
        v = VirtualPair(*a, **kw)
        made.append(v)
        return v

    try:
        yield _make
    finally:
        for v in made:
            v.close()


def _held_by_other_processes() -> set[str]:
    """Names under /dev/shm that a process other than this one has open or mapped: another xdist
    worker's transport (UCX's shared-memory segments) is not this test's leak."""
    held: set[str] = set()
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                held.update(line.rsplit("/dev/shm/", 1)[1].split()[0] for line in f if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    held.add(target[len("/dev/shm/"):].split()[0])
        except OSError:  # the process ended, or is not ours to read
            continue
    return held


class ShmBaseline:
    """/dev/shm as a test found it; :meth:`new` names what this process left there since."""

    def __init__(self) -> None:
        self.before = self._list()

    @staticmethod
    def _list() -> set[str]:
        try:
            return set(os.listdir("/dev/shm"))
        except FileNotFoundError:  # pragma: no cover
            return set()

    def new(self) -> set[str]:
        added = self._list() - self.before
        return added - _held_by_other_processes() if added else added


@pytest.fixture
def shm_files() -> ShmBaseline:
    return ShmBaseline()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP and never speaks (a black hole, a wrong ``remote_port``): the kernel
    completes every TCP handshake; nothing answers ZMTP's greeting."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        yield hole.getsockname()[1]

