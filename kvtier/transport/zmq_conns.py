"""The connections of a ZmqTransport: which TCP connection each peer id speaks for, what its socket
monitors report, and cutting one connection.

Connection events (:meth:`ZmqTransport.events`): every socket has a libzmq *socket monitor*
(an inproc PAIR we read). For the ROUTER, the monitor reports ``ACCEPTED``/``DISCONNECTED`` with
the connection's file descriptor, and every received message carries the fd it came in on
(``zmq.SRCFD``); joining the two maps a TCP connection to the routing id (peer id) it speaks
for. (``ZMQ_ROUTER_NOTIFY`` would do this directly but is a draft option this libzmq lacks.)
``SRCFD`` is an fd *number*, and a ROUTER keeps a closed connection's unread messages: they may
be read after the number was taken by a newer connection (a reader that fell behind: a stall,
SIGSTOP, a long engine step).  So records are made only from ``EVENT_ACCEPTED``, never from a
message, and a routing id binds to a connection **once**, by the first message ever read from
it: a message from a routing id that was bound before (its connection closed, or it is bound to
another fd) is a leftover of that connection — delivered, but it changes no record.  A first
message from a connection that closed before anything of it was read is delivered followed by
its ``PeerClosed`` (a leftover ``hello`` must not open a session nothing will ever end).
Residual, accepted: the *first* message of an old connection read after its fd number was
reused and before the new connection's first message binds the new record to the old id; the
record is then marked ambiguous and never shut down on anyone's behalf (decision T10).

:meth:`ZmqTransport.drop_peer` cuts one peer that dialled us: ``shutdown(SHUT_RDWR)`` on a
``dup`` of its fd (a ROUTER has no per-peer close). The dup pins the open socket, and its
``getpeername()`` is compared with the one recorded at accept time first, so a number that
libzmq closed and reused meanwhile is never shut down. Residual race, accepted: if the peer's
connection closed and *the same remote ip:port* reconnected onto the *same fd number* between
our last monitor drain and the dup, the new connection of that same remote endpoint is cut.

:class:`ZmqConnections` is a base of :class:`~kvtier.transport.zmq_transport.ZmqTransport`; the
state it works on is made by ``ZmqTransport.__init__``.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import time
from typing import Any

import zmq

from kvtier.transport import CloseReason, PeerClosed, SendFailure, TransportEvent

#: peer ids of the peers that dialled us: this prefix and their routing id in hex
IN_PREFIX = "in:"
# Plain ints for the per-message socket calls: pyzmq turns an enum member into its option/flag
# enum on every call (~0.6 µs each; a request makes dozens of them on each side).
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)

_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                     | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
ROUTER_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED | _HANDSHAKE_EVENTS
# CONNECTED and CLOSED: a CLOSED before the dial's first CONNECTED is a connect attempt that
# failed (refused, unreachable, or ZMQ_CONNECT_TIMEOUT); reported only for fail_fast dials.
DEALER_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED | zmq.EVENT_CLOSED | _HANDSHAKE_EVENTS
_AUTH, _NO_DETAIL, _PROTOCOL = (int(zmq.EVENT_HANDSHAKE_FAILED_AUTH), int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL),
                                int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL))
_MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
_CRYPTOGRAPHIC = int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)


def handshake_problem(event: int, value: int, *, curve: bool, dialled: bool) -> tuple[bool, str]:
    """What a libzmq ``EVENT_HANDSHAKE_FAILED_*`` (``value``: its protocol error code, or an errno
    for ``NO_DETAIL``) most likely means, for the operator: ``(auth, text)``; ``auth`` when it is
    an authentication failure (the session ends ``auth_failed``; decision E1), else a peer that
    does not speak ZMTP at all.  ``curve``: this tier runs ``auth='curve'``; ``dialled``: we are
    the consumer that dialled.

    The side that detects a mechanism mismatch reports it with its code and hangs up; the other
    side then sees ``NO_DETAIL`` with ``EPIPE`` (it was writing its greeting), which is how a CURVE
    problem reaches it about half of the time.  A connection closed before any greeting (a TCP
    health check, a port scan) ends with ``ECONNRESET`` instead and is no authentication failure."""
    other = "the producer" if dialled else "the peer"
    mismatch = event == _PROTOCOL and value == _MECHANISM_MISMATCH
    hung_up = event == _NO_DETAIL and value == errno.EPIPE
    if not curve and (mismatch or hung_up or (dialled and event == _AUTH)):
        return True, (f"{other} requires CURVE (auth='curve') and this tier has auth='none': set auth='curve' "
                      "with auth_secret_key_file and auth_allowed_keys_dir here too (docs/security.md)")
    if curve and (mismatch or (hung_up and not dialled)):
        return True, (f"{other} does not run CURVE (its auth is 'none') while this tier has auth='curve': "
                      "set the same auth on both sides (docs/security.md)")
    if curve and (event == _AUTH or (event == _PROTOCOL and value == _CRYPTOGRAPHIC)
                  or (dialled and event == _NO_DETAIL)):
        if dialled:
            return True, ("the CURVE handshake failed: the producer does not accept our key (is our public "
                          "certificate in its auth_allowed_keys_dir?), the certificate in our auth_allowed_keys_dir "
                          "that names this endpoint is not the producer's key, or it does not run auth='curve'")
        return True, ("the CURVE handshake failed: the peer's public certificate is not in our "
                      "auth_allowed_keys_dir, or the certificate it holds for our endpoint is not our key")
    if event == _NO_DETAIL:
        return False, "the connection closed during the handshake"
    return False, f"{other} does not speak our ZMTP (a plain-TCP or other service?)"


log = logging.getLogger("kvtier.transport")
_MON_HEADER = struct.Struct("=HI")  # libzmq monitor frame 0: event id (u16), value (u32)


def _peername(fd: int) -> str:
    """``ip:port`` of the remote end of socket ``fd`` ("" if it is not a connected socket)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return ""
    try:
        return _fmt_sockaddr(s.getpeername())
    except OSError:
        return ""
    finally:
        s.close()


def _fmt_sockaddr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr)


class Conn:
    """One TCP connection accepted by the ROUTER, keyed by its fd."""

    __slots__ = ("fd", "peername", "accepted", "rid", "principal", "dropped", "ambiguous")

    def __init__(self, fd: int, peername: str, accepted: float) -> None:
        self.fd = fd
        self.peername = peername
        self.accepted = accepted
        self.rid: bytes | None = None
        self.principal: str | None = None
        self.dropped = False
        self.ambiguous = False  # two never-seen routing ids spoke first on this fd number


#: Routing ids whose connection closed, remembered (oldest forgotten first) so that their
#: leftover messages never bind a newer connection that reused the fd number.
_MAX_SPENT = 65536


class ZmqConnections:
    """The connection records and monitors of :class:`~kvtier.transport.zmq_transport.ZmqTransport`."""

    # -- monitors and connection events -----------------------------------------------------

    def events(self) -> list[TransportEvent]:
        """Connection events since the last call, oldest first. Never blocks.

        Returns:
            :class:`~kvtier.transport.PeerClosed` records: one per connection of a known peer
            that closed or reset (``disconnected``), was cut by :meth:`drop_peer`
            (``dropped``). A connection that never delivered a message has no peer id and is
            reported by nothing (see :attr:`idle_dropped`). ``[]`` after ``close()``.
        """
        if self._closed:
            return []
        self._service()
        out = list(self._events)
        self._events.clear()
        return out

    def _service(self) -> None:
        """Housekeeping on every poll path: read monitor events, cut idle connections, and make
        the ROUTER process its commands (a pipe closed by a shutdown releases its queued
        zero-copy frames only when the socket does)."""
        self._drain_router_monitor()
        for address in list(self._dealer_mons):
            self._drain_dealer_monitor(address)
        if self._idle_timeout_s is not None and self._unbound:
            self._cut_idle()
        if self._closing or self._lingering:
            self._end_lingering(time.monotonic())
        try:
            self._router.get(EVENTS)
        except zmq.ZMQError:  # pragma: no cover
            pass

    def _monitor(self, sock: zmq.Socket, events: int) -> zmq.Socket:
        """A PAIR that receives ``sock``'s monitor events. Unbounded on our side, so a flood of
        connections cannot make libzmq drop (and us miss) a ``DISCONNECTED``."""
        self._mon_n += 1
        addr = f"inproc://kvtier-mon-{id(self):x}-{self._mon_n}"
        sock.monitor(addr, events)
        mon = self._ctx.socket(zmq.PAIR)
        try:
            mon.setsockopt(zmq.LINGER, 0)
            mon.setsockopt(zmq.RCVHWM, 0)
            mon.connect(addr)
        except BaseException:
            mon.close(linger=0)
            raise
        return mon

    @staticmethod
    def _monitor_events(mon: zmq.Socket) -> list[tuple[int, int]]:
        """``(event, value)`` pairs waiting on a monitor PAIR, without blocking."""
        out = []
        while True:
            try:
                if not mon.get(EVENTS) & POLLIN:
                    return out
                frames = mon.recv_multipart(NOBLOCK)
            except zmq.ZMQError:
                return out
            out.append(_MON_HEADER.unpack_from(frames[0]))

    def _drain_router_monitor(self) -> None:
        for event, fd in self._monitor_events(self._rmon):
            if event == zmq.EVENT_ACCEPTED:
                self._conn_closed(fd)  # a missed close of an older connection on this fd
                conn = self._conns[fd] = Conn(fd, _peername(fd), time.monotonic())
                self._unbound[fd] = conn
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._conn_closed(fd)
            elif event in (_AUTH, _NO_DETAIL, _PROTOCOL):
                # the value is libzmq's error code, not the fd: libzmq closes that connection next,
                # and its DISCONNECTED names the fd (so the peer's address) of a connection that
                # never delivered a message
                self._refusing = handshake_problem(event, fd, curve=self._curve is not None, dialled=False)

    def _conn_closed(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        self._unbound.pop(fd, None)
        refusing, self._refusing = self._refusing, None
        if refusing is not None and refusing[0] and conn is not None and conn.rid is None and not conn.dropped:
            # an inbound connection that failed CURVE: no peer id, no session; the shell counts
            # and logs it with the reason the dialler's session ends with (decision E1)
            self._events.append(PeerClosed(conn.peername, CloseReason.AUTH_REFUSED, refusing[1]))
        if conn is None or conn.rid is None or self._rid_fd.get(conn.rid) != fd:
            return
        del self._rid_fd[conn.rid]
        self._spend(conn.rid)
        peer = IN_PREFIX + conn.rid.hex()
        self._fail_queue(peer, SendFailure.UNREACHABLE, "connection closed")
        reason = CloseReason.DROPPED if conn.dropped else CloseReason.DISCONNECTED
        self._events.append(PeerClosed(peer, reason))

    def _drain_dealer_monitor(self, address: str) -> None:
        failed_auth = False
        for event, value in self._monitor_events(self._dealer_mons[address]):
            if event == zmq.EVENT_CONNECTED:
                self._dialling.pop(address, None)
            elif event == zmq.EVENT_CLOSED:
                since = self._dialling.pop(address, None)
                if since is not None:  # a fail_fast dial that never connected: the dial failed
                    timed_out = self._connect_timeout_ms and (
                        time.monotonic() - since) * 1000 >= 0.9 * self._connect_timeout_ms
                    self._events.append(PeerClosed(address, CloseReason.CONNECT_TIMEOUT if timed_out
                                                   else CloseReason.REFUSED))
            elif event == zmq.EVENT_DISCONNECTED:
                if not failed_auth:  # after a failed CURVE handshake its session already ends auth_failed
                    self._events.append(PeerClosed(address, CloseReason.DISCONNECTED))
            elif event in (_AUTH, _NO_DETAIL, _PROTOCOL):
                auth, text = handshake_problem(event, value, curve=self._curve is not None, dialled=True)
                if auth and not failed_auth:
                    failed_auth = True
                    self._events.append(PeerClosed(address, CloseReason.AUTH_FAILED, text))
                if (address, event) in self.handshake_failures:
                    continue
                # once per producer and text: libzmq retries the connect and fails the same way,
                # and each failed load may dial again (bounded: addresses come from requests)
                if len(self.handshake_failures) >= 4096:
                    self.handshake_failures.clear()
                said = any(handshake_problem(e, value, curve=self._curve is not None, dialled=True)[1] == text
                           for a, e in self.handshake_failures if a == address)
                self.handshake_failures.add((address, event))
                if not said:
                    log.warning("kvtier: handshake with producer %s failed: %s", address, text)

    # -- binding routing ids to connections -------------------------------------------------

    def _from_connection(self, frame: zmq.Frame, rid: bytes) -> bool:
        """Bind ``rid`` to the connection (fd) ``frame`` came in on, the first time it speaks.
        False: drop the message (it comes from a connection we dropped).  See the module
        docstring for why a routing id binds once and leftovers change nothing."""
        try:
            fd = frame.get(zmq.SRCFD)
        except zmq.ZMQError:  # pragma: no cover - every TCP frame has a source fd
            return True
        conn = self._conns.get(fd)
        if conn is not None and conn.rid == rid:
            return not conn.dropped
        # The monitor may not have told us about this fd (or its reuse) yet; it has by now.
        self._drain_router_monitor()
        conn = self._conns.get(fd)
        if conn is not None and conn.rid == rid:
            return not conn.dropped
        if rid in self._rid_fd or rid in self._spent:
            # a leftover of a connection that closed (or is bound to another fd): deliver it
            # unless that connection was dropped by us; it changes no record
            own = self._conns.get(self._rid_fd.get(rid, -1))
            return not (own is not None and own.dropped)
        if conn is None or conn.rid is not None:
            self._spend(rid)
            if conn is None:
                # its connection closed before anything of it was read: nothing will report
                # that close, so report it after this message
                self._events.append(PeerClosed(IN_PREFIX + rid.hex(), CloseReason.DISCONNECTED))
            else:
                conn.ambiguous = True  # which of the two ids is the live one is unknown
            return True
        if conn.dropped:
            return False
        conn.rid = rid
        self._unbound.pop(fd, None)
        self._rid_fd[rid] = fd
        if self._curve is not None:
            try:
                conn.principal = frame.get("User-Id")
            except zmq.ZMQError:  # pragma: no cover - libzmq sets it after ZAP
                conn.principal = None
        return True

    def _spend(self, rid: bytes) -> None:
        self._spent[rid] = None
        if len(self._spent) > _MAX_SPENT:
            del self._spent[next(iter(self._spent))]

    # -- cutting connections ----------------------------------------------------------------

    def _linger(self, peer: str, linger_s: float) -> bool:
        """:meth:`drop_peer` with a linger (see there)."""
        deadline = time.monotonic() + linger_s
        self._flush_peer(peer)
        sock = self._dealers.get(peer)
        if sock is not None:
            mon = self._dealer_mons[peer]
            self._fail_queue(peer, SendFailure.DISCONNECTED)  # what could not be handed to libzmq
            self._dealers.pop(peer)
            self._dealer_mons.pop(peer)
            self._dialling.pop(peer, None)
            self._dealer_peer.pop(sock, None)
            self._mon_peer.pop(mon, None)
            self._mon_set = None
            self._poller = None
            self._lingering.append((deadline, sock, mon))
            self._events.append(PeerClosed(peer, CloseReason.DROPPED))
            return True
        target = self._resolve(peer)
        if target is None or target[1] is None or target[1] not in self._rid_fd:
            return False
        self._closing[peer] = deadline
        return True

    def _next_linger_end(self) -> float:
        """When the first goodbye's linger ends (``inf`` when none lingers)."""
        ends = [*self._closing.values(), *(d for d, _, _ in self._lingering)]
        return min(ends) if ends else float("inf")

    def _end_lingering(self, now: float) -> None:
        """Cut the connections whose goodbye's linger is over."""
        for peer, deadline in list(self._closing.items()):
            if now >= deadline:
                del self._closing[peer]
                self.drop_peer(peer)
        if self._lingering:
            keep = []
            for deadline, sock, mon in self._lingering:
                if now >= deadline:
                    mon.close(linger=0)
                    sock.close(linger=0)
                else:
                    keep.append((deadline, sock, mon))
            self._lingering = keep

    def _cut_idle(self) -> None:
        cutoff = time.monotonic() - self._idle_timeout_s  # type: ignore[operator]
        for fd, conn in list(self._unbound.items()):
            if conn.accepted > cutoff:
                break  # accept order: the rest are younger
            del self._unbound[fd]
            if self._shutdown_conn(conn):
                conn.dropped = True
                self.idle_dropped += 1

    def _shutdown_conn(self, conn: Conn) -> bool:
        """``shutdown(SHUT_RDWR)`` the connection behind ``conn.fd`` if it is still the one we
        recorded (same remote ip:port on a dup of the fd). libzmq then sees the close, ends
        the pipe and frees what was queued to it.  Never for an ambiguous record."""
        if conn.ambiguous:
            return False
        try:
            dup = socket.socket(fileno=os.dup(conn.fd))
        except OSError:
            return False
        try:
            if not conn.peername or _fmt_sockaddr(dup.getpeername()) != conn.peername:
                return False  # the fd was closed (and maybe reused): not our connection any more
            dup.shutdown(socket.SHUT_RDWR)
            return True
        except OSError:
            return False
        finally:
            dup.close()

    def drop_peer(self, peer: str, linger_s: float = 0.0) -> bool:
        """Force the connection to ``peer`` closed, now — or, with ``linger_s`` > 0, once a
        goodbye just sent (and whatever is queued before it) had up to ``linger_s`` seconds to
        leave: nothing more can be sent to ``peer`` from now on, and the connection is cut at the
        deadline unless the peer closed it first (a goodbye that names why, decision I28).  A
        dialled producer's DEALER is forgotten at once (``connect()`` dials afresh; what it
        receives meanwhile is not read) and closed at the deadline.

        - A peer that dialled us: its TCP connection is shut down (see the module docstring).
          libzmq then frees everything queued to it, so zero-copy handles become ``done``
          within a poll or two, and messages it still had in flight to us are discarded. A
          :class:`~kvtier.transport.PeerClosed` (``dropped``) follows when libzmq reports the
          close. The peer may dial again; that is a new connection.
        - A producer we dialled: its DEALER is closed (``linger=0``) and a ``PeerClosed``
          (``dropped``) is reported at once. ``connect()`` dials it afresh.

        Our queued sends to ``peer`` fail with ``disconnected``; later sends fail too.

        Returns:
            True if a connection was cut; False if ``peer`` is unknown or already gone.
        """
        if self._closed:
            return False
        if linger_s > 0:
            return self._linger(peer, linger_s)
        self._closing.pop(peer, None)
        self._fail_queue(peer, SendFailure.DISCONNECTED)
        if peer in self._dealers:
            self._close_dealer(peer)
            self._events.append(PeerClosed(peer, CloseReason.DROPPED))
            return True
        target = self._resolve(peer)
        if target is None or target[1] is None:
            return False
        self._drain_router_monitor()
        fd = self._rid_fd.get(target[1])
        if fd is None:
            return False
        conn = self._conns[fd]
        if conn.dropped:
            return True
        if not self._shutdown_conn(conn):
            return False
        conn.dropped = True
        self._service()
        return True
