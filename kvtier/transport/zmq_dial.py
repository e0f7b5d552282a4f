"""A dial of a host name that resolved to several addresses: each is tried in turn (decision T20).

``localhost`` resolves to ``::1`` before ``127.0.0.1`` where /etc/hosts lists both, and a producer
often listens on IPv4 only: dialling only the first address would fail a dial that the next one
completes.  While none of a ``fail_fast`` dial's addresses has connected, a failed attempt (the
DEALER monitor's ``CLOSED``) moves the DEALER to the next address — ``disconnect`` the one, then
``connect`` the other — and is not reported; the last address's failure is, as a one-address dial's
is.  Such a DEALER sets ``ZMQ_IMMEDIATE`` (:func:`immediate`): a send waits in the transport's own
queue until a connection is up, never in the pipe of an address the dial then leaves (libzmq drops
a pipe's messages with its endpoint).  The monitor keeps reporting on an address the dial left
(its reconnect attempts), so those events are dropped here.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence

import zmq

__all__ = ["AddressOrder", "immediate"]

log = logging.getLogger("kvtier.transport")


def immediate(endpoints: Sequence[str], fail_fast: bool) -> bool:
    """Whether a dial of ``endpoints`` must set ``ZMQ_IMMEDIATE`` (it may move between them)."""
    return fail_fast and len(endpoints) > 1


class AddressOrder:
    """The named dials still moving through their addresses, by peer address."""

    def __init__(self) -> None:
        self._dials: dict[str, tuple[str, deque[str], set[bytes]]] = {}  # endpoint now, next, left

    def add(self, address: str, endpoints: Sequence[str]) -> None:
        """A fail_fast dial of ``address`` that connects to ``endpoints[0]`` first."""
        if len(endpoints) > 1:
            self._dials[address] = (endpoints[0], deque(endpoints[1:]), set())

    def forget(self, address: str) -> None:
        """The dial connected, or was closed: no address is tried after this."""
        self._dials.pop(address, None)

    def consumed(self, address: str, event: int, endpoint: bytes, sock: zmq.Socket) -> bool:
        """Whether ``address``'s monitor ``event`` (about ``endpoint``) ends here: it is about an
        address the dial left, or a failed attempt with an address left — dialled now instead."""
        dial = self._dials.get(address)
        if dial is None:
            return False
        current, nxt, left = dial
        if endpoint in left:
            return True
        if event != zmq.EVENT_CLOSED or not nxt:
            return False
        after = nxt.popleft()
        try:
            sock.disconnect(current)
            sock.connect(after)
        except zmq.ZMQError as exc:
            log.debug("kvtier: %s: cannot dial %s instead of %s: %s", address, after, current, exc)
            return False
        log.debug("kvtier: %s: %s failed, dialling %s (the name's next address)", address, current, after)
        left.add(current.encode())
        self._dials[address] = (after, nxt, left)
        return True
