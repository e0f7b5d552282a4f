"""Two network namespaces joined by a veth pair: "two hosts" on one machine (needs root).

``with veth_pair() as net:`` creates namespaces ``net.ns[0]``/``net.ns[1]`` with interfaces
``net.dev[0]``/``net.dev[1]`` addressed ``net.addr[0]``/``net.addr[1]`` (a /30, both up, loopback
up too), and deletes both namespaces on exit, which removes the veth pair with them. Names carry
the pid and a random suffix, so concurrent tests do not collide; the addresses live only inside
the private namespaces, so every pair can use the same /30.

A process joins a namespace with :func:`kvtier.testing.nixl_peer.enter_netns` (``setns``, what
``ip netns exec`` does) before it opens sockets. :meth:`VethPair.set_link` takes the link down
and up again, a partition that both ends see as carrier loss.

This is the NIXL helper's copy; kvtier.testing may get one shared namespace module later.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

__all__ = ["VethPair", "netns_available", "veth_pair"]


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise OSError(f"`ip {' '.join(args)}` failed ({r.returncode}): {r.stderr.strip()}")


def netns_available() -> str | None:
    """``None`` if namespaces can be made here, else why not (for a skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` tool (iproute2) is not installed"
    return None


@attrs.frozen
class VethPair:
    ns: tuple[str, str]
    dev: tuple[str, str]
    addr: tuple[str, str]

    def set_link(self, up: bool) -> None:
        """Bring both ends of the veth down (a partition) or up again."""
        for ns, dev in zip(self.ns, self.dev):
            _ip("-n", ns, "link", "set", dev, "up" if up else "down")


@contextmanager
def veth_pair(subnet: str = "10.213.0") -> Iterator[VethPair]:
    """Create the pair (see module doc); ``subnet`` is the first three octets of the /30."""
    tag = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
    ns = (f"kvtn{tag}a", f"kvtn{tag}b")
    dev = (f"kv{tag}a"[:15], f"kv{tag}b"[:15])
    addr = (f"{subnet}.1", f"{subnet}.2")
    made: list[str] = []
    try:
        for n in ns:
            _ip("netns", "add", n)
            made.append(n)
        _ip("link", "add", dev[0], "netns", ns[0], "type", "veth", "peer", "name", dev[1], "netns", ns[1])
        for n, d, a in zip(ns, dev, addr):
            _ip("-n", n, "addr", "add", f"{a}/30", "dev", d)
            _ip("-n", n, "link", "set", d, "up")
            _ip("-n", n, "link", "set", "lo", "up")
        yield VethPair(ns, dev, addr)
    finally:
        for n in made:
            try:
                _ip("netns", "del", n)
            except OSError:
                pass
