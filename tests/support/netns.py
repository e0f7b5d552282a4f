"""Two hosts on one machine: network namespaces joined by a veth pair (Linux, root).

:class:`TwoHosts` creates namespaces ``a`` and ``b`` with addresses :attr:`TwoHosts.addr_a` and
:attr:`TwoHosts.addr_b` (``10.213.0.1/30`` and ``.2``) on the two ends of one veth link, and
deletes everything on exit, also when the body raised. Faults:

- :meth:`TwoHosts.link_down` / :meth:`~TwoHosts.link_up`: a partition (both veth ends down:
  packets vanish, TCP retransmits, nothing is reset).
- ``rate="8mbit"``: a ``tc tbf`` rate limit on both ends (a slow link).
- :meth:`TwoHosts.blackhole_a`: host ``a`` silently loses everything ``b`` sends it (SYNs
  included), as a stale conntrack entry or a DROP rule does.

Code runs inside a namespace three ways: :meth:`~TwoHosts.exec` for a command (``ip netns
exec``), :func:`enter` for the calling thread (``setns(2)``; do it *before* creating a zmq
context: libzmq's I/O threads inherit the namespace of the thread that starts them), and
:meth:`~TwoHosts.run` for a callable in a fresh thread that entered it.
:class:`~tests.support.peer_process.PeerProcess` and
:func:`~tests.support.nixl_peer.spawn_nixl_peer` take ``netns=`` for whole processes; they enter
with ``sysfs=True``, because UCX lists network devices from ``/sys/class/net`` (NIXL tests set
``UCX_NET_DEVICES`` to :attr:`TwoHosts.dev_a` / :attr:`TwoHosts.dev_b`).

If namespaces cannot be made (not root, no ``ip``), :func:`unavailable_reason` says why, so tests
skip with that reason.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["TwoHosts", "NetnsError", "enter", "unavailable_reason"]

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_SLAVE = 0x80000
_MNT_DETACH = 2


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed (the message has the command and its stderr)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def unavailable_reason() -> str | None:
    """None if namespaces can be created here, else why not (for ``pytest.skip``)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    name = "kvtprobe" + secrets.token_hex(3)
    p = _ip("ip", "netns", "add", name, check=False)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    _ip("ip", "netns", "del", name, check=False)
    return None


def open_text(path: str, ns: str) -> str:
    """Read a (sysfs) file as seen from namespace ``ns``."""
    p = _ip("ip", "netns", "exec", ns, "cat", path)
    return p.stdout


def enter(name: str, *, sysfs: bool = False) -> None:
    """Move the calling thread into namespace ``name`` (``setns(2)``). Threads it starts later
    inherit it.

    ``sysfs=True`` (a whole, still single-threaded process) also does what ``ip netns exec``
    does next: a private mount namespace with ``/sys`` remounted, so that ``/sys/class/net``
    shows this namespace's devices (UCX reads it; without the remount it only offers ``lo``).

    Raises:
        OSError: no such namespace, or not permitted (the message names the step).
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what} (entering network namespace {name!r}): {os.strerror(err)}")

    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        check(libc.setns(fd, _CLONE_NEWNET), "setns")
    finally:
        os.close(fd)
    if sysfs:
        check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        check(libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "making / a slave mount")
        check(libc.umount2(b"/sys", _MNT_DETACH), "unmounting /sys")
        check(libc.mount(name.encode(), b"/sys", b"sysfs", 0, None), "mounting sysfs")


class TwoHosts:
    """Namespaces ``a`` and ``b`` joined by a veth pair (see the module docstring).

    Args:
        rate: optional ``tc tbf`` rate on both veth ends (``"8mbit"``); ``None``: full speed.
        addr_a / addr_b: the two ends' addresses (a /30 between them).

    Raises:
        NetnsError: setup failed (everything made so far is deleted first).
    """

    def __init__(self, *, rate: str | None = None, addr_a: str = "10.213.0.1", addr_b: str = "10.213.0.2") -> None:
        tag = secrets.token_hex(3)
        self.a, self.b = f"kvta{tag}", f"kvtb{tag}"
        self._veth_a, self._veth_b = f"kva{tag}", f"kvb{tag}"
        self.addr_a, self.addr_b = addr_a, addr_b
        self.rate = rate
        self._made: list[str] = []

    def __enter__(self) -> TwoHosts:
        try:
            for ns in (self.a, self.b):
                _ip("ip", "netns", "add", ns)
                self._made.append(ns)
            _ip("ip", "link", "add", self._veth_a, "type", "veth", "peer", "name", self._veth_b)
            for ns, dev, addr in ((self.a, self._veth_a, self.addr_a), (self.b, self._veth_b, self.addr_b)):
                _ip("ip", "link", "set", dev, "netns", ns)
                _ip("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
                _ip("ip", "-n", ns, "link", "set", "lo", "up")
                _ip("ip", "-n", ns, "link", "set", dev, "up")
                if self.rate:
                    _ip("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                        "burst", "32kbit", "latency", "400ms")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dev_a(self) -> str:
        """Host ``a``'s end of the veth pair (its interface name inside ``a``)."""
        return self._veth_a

    @property
    def dev_b(self) -> str:
        """Host ``b``'s end of the veth pair."""
        return self._veth_b

    def close(self) -> None:
        """Delete both namespaces (and with them the veth pair). Idempotent."""
        while self._made:
            _ip("ip", "netns", "del", self._made.pop(), check=False)

    # -- faults ----------------------------------------------------------------------------------
    def link_down(self) -> None:
        """Partition: both veth ends down. Packets in either direction are lost."""
        _ip("ip", "-n", self.a, "link", "set", self._veth_a, "down")
        _ip("ip", "-n", self.b, "link", "set", self._veth_b, "down")

    def link_up(self) -> None:
        """Heal :meth:`link_down`."""
        _ip("ip", "-n", self.a, "link", "set", self._veth_a, "up")
        _ip("ip", "-n", self.b, "link", "set", self._veth_b, "up")

    def blackhole_a(self, on: bool = True) -> None:
        """Host ``a`` vanishes from the wire (its veth end down) while ``b``'s stays up: what ``b``
        sends to ``a`` (SYNs included) is silently lost, no reset, no "unreachable", as with a
        stale conntrack entry or a DROP rule. (This kernel's tc has no action modules, and
        iptables/nftables may be missing, so a SYN-only filter is not used.)"""
        if on:
            # Pin a's MAC on b first: else b's ARP for a fails and connect() gets a prompt
            # EHOSTUNREACH, which is not what a silent drop looks like.
            mac = open_text(f"/sys/class/net/{self._veth_a}/address", self.a).strip()
            _ip("ip", "-n", self.b, "neigh", "replace", self.addr_a, "lladdr", mac, "dev", self._veth_b,
                "nud", "permanent")
        _ip("ip", "-n", self.a, "link", "set", self._veth_a, "down" if on else "up")

    # -- running code inside ---------------------------------------------------------------------
    def exec(self, ns: str, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run a command inside namespace ``ns`` (``ip netns exec``) and wait for it."""
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, **kw)

    def run(self, ns: str, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
        """Call ``fn`` in a new thread that entered ``ns`` first; return its result (or raise its
        exception). Objects it creates (a zmq context and its I/O threads, a listening socket)
        live in ``ns`` and may be used from any thread afterwards.

        Raises:
            TimeoutError: ``fn`` did not return within ``timeout_s``.
        """
        box: dict[str, Any] = {}

        def body() -> None:
            try:
                enter(ns)
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc

        t = threading.Thread(target=body, name=f"netns-{ns}", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            raise TimeoutError(f"{fn!r} in {ns} did not return within {timeout_s} s")
        if "error" in box:
            raise box["error"]
        return box["value"]
