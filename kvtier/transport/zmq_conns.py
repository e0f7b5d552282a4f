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
Residual, accepted: an old connection's *first* message read after its fd number was reused and
before the new connection's first message binds the new record to the old id; the record is then
ambiguous, never shut down on anyone's behalf (decision T10).

:meth:`ZmqTransport.drop_peer` cuts one peer that dialled us: ``shutdown(SHUT_RDWR)`` on a
``dup`` of its fd (a ROUTER has no per-peer close). The dup pins the open socket, and its
``getpeername()`` is compared with the one recorded at accept time first, so a number that
libzmq closed and reused meanwhile is never shut down. Residual race, accepted: *the same remote
ip:port* reconnecting onto the *same fd number* between our last monitor drain and the dup is cut.

:class:`Connections`, a part of :class:`~kvtier.transport.zmq_transport.ZmqTransport` (W12), owns the
ROUTER, the dialled DEALERs, their monitors and connection records; it fails queued sends too.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import zmq

from kvtier.transport import CloseReason, PeerClosed, SendFailure, TransportEvent
from kvtier.transport.zmq_dial import AddressOrder
from kvtier.transport.zmq_handshake import AUTH, NO_DETAIL, PROTOCOL, handshake_problem

if TYPE_CHECKING:
    from kvtier.transport.zmq_send import Outbox, Target

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
_SPOKE = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)  # only a dial that completed ZMTP can carry a goodbye (T13)
DEALER_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED | zmq.EVENT_CLOSED | _HANDSHAKE_EVENTS | _SPOKE


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
_MAX_EVENTS = 65536  # undrained events beyond this drop the oldest (an owner that never reads)


class Connections:
    """The sockets and connections of :class:`~kvtier.transport.zmq_transport.ZmqTransport`.

    Args:
        ctx: the transport's context (monitors are inproc PAIRs on it).
        curve: the transport runs CURVE (principals are read from the ZAP handler's User-Id).
        idle_timeout_s: accepted connections silent this long are cut (None: never).
        connect_timeout_ms: the dials' ``ZMQ_CONNECT_TIMEOUT`` (0: off).
    """

    def __init__(self, ctx: zmq.Context, *, curve: bool, idle_timeout_s: float | None,
                 connect_timeout_ms: int) -> None:
        self._ctx = ctx
        self._curve = curve
        self._idle_timeout_s = idle_timeout_s
        self._connect_timeout_ms = connect_timeout_ms
        self.outbox: Outbox  # set by the transport (the two parts refer to each other)
        self.router: zmq.Socket | None = None
        self.rmon: zmq.Socket | None = None
        self.dealers: dict[str, zmq.Socket] = {}
        """Dialled producers' DEALERs, by address (the peer id)."""
        self._dealer_mons: dict[str, zmq.Socket] = {}
        self._dialling: dict[str, float] = {}  # fail_fast dials not connected yet -> when dialled
        self._order = AddressOrder()  # named dials still trying their addresses (T20)
        self._dealer_fd: dict[str, int] = {}  # a dial's TCP connection, from its monitor's CONNECTED
        self._spoken: set[str] = set()  # dials whose ZMTP handshake succeeded since their last disconnect
        self._spoke: dict[str, int] = {}  # addresses a handshake succeeded with -> hang-ups since (bounded; E8)
        self._dealer_peer: dict[zmq.Socket, str] = {}  # DEALER -> the address it dials
        self._mon_peer: dict[zmq.Socket, str] = {}  # a DEALER's monitor -> that address
        self._mon_set: frozenset[zmq.Socket] | None = None
        self._mon_n = 0
        self.version = 0
        """Bumped whenever the set of sockets changes (a poller built before is stale)."""
        self.closing: dict[str, float] = {}
        """Peers that dialled us, cut at this time (a goodbye's linger)."""
        self._lingering: list[tuple[float, zmq.Socket, zmq.Socket]] = []  # closed dials flushing a goodbye
        self.events: deque[TransportEvent] = deque(maxlen=_MAX_EVENTS)
        """Connection events not yet taken by the owner, oldest first."""
        self._conns: dict[int, Conn] = {}  # ROUTER connections by fd
        self.rid_fd: dict[bytes, int] = {}
        """Routing id -> fd of its connection (bound once)."""
        self._spent: dict[bytes, bool] = {}  # routing ids that bind no more -> their close was reported (bounded)
        self._unbound: dict[int, Conn] = {}  # accepted, no message yet (accept order)
        self._refusing: tuple[bool, str] | None = None  # the ROUTER's last failed handshake, until its close
        self.idle_dropped = 0
        """Accepted connections cut by ``idle_timeout_s`` (a counter)."""
        self.handshake_failures: set[tuple[str, int]] = set()
        """``(producer address, libzmq EVENT_HANDSHAKE_FAILED_*)`` seen on our dials (each logged once)."""

    # -- sockets ------------------------------------------------------------------------------

    def set_router(self, router: zmq.Socket) -> None:
        """Take the ROUTER we listen on (before it binds: its monitor must see every accept)."""
        self.router = router
        self.rmon = self.monitor(router, ROUTER_EVENTS)
        self.version += 1

    def add_dealer(self, address: str, sock: zmq.Socket, mon: zmq.Socket, *, fail_fast: bool,
                   endpoints: Sequence[str] = ()) -> None:
        """Take the DEALER dialling ``address`` and its monitor (from :meth:`monitor`); a fail_fast
        dial of a name that resolved to several addresses dials ``endpoints[0]`` and, while none
        connected, each next one after a failed attempt (decision T20)."""
        self.dealers[address] = sock
        self._dealer_mons[address] = mon
        if fail_fast:
            self._dialling[address] = time.monotonic()
            self._order.add(address, endpoints)
        self._dealer_peer[sock] = address
        self._mon_peer[mon] = address
        self.version += 1
        self._mon_set = None

    def tcp_fds(self) -> list[int]:
        """The fds of every TCP connection, accepted or dialled, as the monitors reported them so
        far (a number libzmq closed since may be reused: a reader treats it as a hint)."""
        return [*self._conns, *self._dealer_fd.values()]

    def dial_fds(self) -> dict[str, int]:
        """Each dial's TCP connection fd, by its address (as :meth:`tcp_fds`: a hint)."""
        return dict(self._dealer_fd)

    def forget_events_of(self, peer: str) -> None:
        """Drop the undrained events about ``peer`` (a new dial: they are history now)."""
        self.events = deque((e for e in self.events if e.peer != peer), maxlen=_MAX_EVENTS)

    def take_events(self) -> list[TransportEvent]:
        """The undrained events, oldest first; none remain."""
        if not self.events:
            return []
        out = list(self.events)
        self.events.clear()
        return out

    def resolve(self, peer: str) -> Target | None:
        """Socket and ROUTER routing id for a peer id, or None if it cannot exist."""
        sock = self.dealers.get(peer)
        if sock is not None:
            return sock, None
        if isinstance(peer, str) and peer.startswith(IN_PREFIX):
            try:
                rid = bytes.fromhex(peer[len(IN_PREFIX) :])
            except ValueError:
                return None
            if 0 < len(rid) <= 255:
                return self.router, rid
        return None

    def is_dropped(self, rid: bytes) -> bool:
        """True when the connection ``rid`` speaks for was cut by us."""
        conn = self._conns.get(self.rid_fd.get(rid, -1))
        return conn is not None and conn.dropped

    def is_closed(self, rid: bytes) -> bool:
        """True when ``rid``'s connection was reported closed (:class:`PeerClosed`). libzmq's
        ROUTER may still hold that connection's pipe for a moment after its monitor said so
        (the socket takes the pipe's end on a later command pass), and a send there would be
        accepted and dropped; a routing id never binds again, so such a send fails instead."""
        return self._spent.get(rid, False) and rid not in self.rid_fd

    def peer_record(self, peer: str) -> Conn | None:
        """The accepted connection a peer that dialled us speaks for, or None."""
        target = self.resolve(peer)
        if target is None or target[1] is None:
            return None
        fd = self.rid_fd.get(target[1])
        return None if fd is None else self._conns[fd]

    def idle_count(self) -> int:
        """Accepted connections that have not delivered a message yet."""
        return len(self._unbound)

    def data_sockets(self) -> list[tuple[zmq.Socket, str | None]]:
        """The ROUTER (peer None) and every DEALER with its address, in that order."""
        socks: list[tuple[zmq.Socket, str | None]] = [(self.router, None)]
        socks.extend((s, p) for p, s in self.dealers.items())
        return socks

    def monitors(self) -> frozenset[zmq.Socket]:
        """Every monitor PAIR (cached until the sockets change)."""
        mons = self._mon_set
        if mons is None:
            mons = self._mon_set = frozenset({self.rmon, *self._dealer_mons.values()})
        return mons

    def drain_monitor(self, mon: zmq.Socket) -> None:
        """Read the events waiting on monitor ``mon`` (one of :meth:`monitors`)."""
        if mon is self.rmon:
            self.drain_router_monitor()
        else:
            self.drain_dealer_monitor(self._mon_peer[mon])

    def peer_of(self, sock: zmq.Socket) -> str | None:
        """The address a DEALER dials; None for the ROUTER (its messages name their peer)."""
        return None if sock is self.router else self._dealer_peer[sock]

    def housekeeping(self, now: float) -> None:
        """Cut the idle connections and end the goodbyes' lingers that are due."""
        if self._idle_timeout_s is not None and self._unbound:
            self.cut_idle()
        if self.closing or self._lingering:
            self.end_lingering(now)

    def next_due(self, until: float) -> float:
        """The earlier of ``until`` and the next idle cut or linger end (``time.monotonic``)."""
        if self._idle_timeout_s is not None and self._unbound:
            until = min(until, next(iter(self._unbound.values())).accepted + self._idle_timeout_s)
        if self.closing or self._lingering:  # a goodbye's linger ends: cut on time
            until = min(until, self.next_linger_end())
        return until

    # -- monitors and connection events -----------------------------------------------------

    def service(self) -> None:
        """Housekeeping on every poll path: read monitor events, cut idle connections, and make
        the ROUTER process its commands (a pipe closed by a shutdown releases its queued
        zero-copy frames only when the socket does)."""
        self.drain_router_monitor()
        for address in list(self._dealer_mons):
            self.drain_dealer_monitor(address)
        self.housekeeping(time.monotonic())
        try:
            self.router.get(EVENTS)
        except zmq.ZMQError:  # pragma: no cover
            pass

    def monitor(self, sock: zmq.Socket, events: int) -> zmq.Socket:
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
    def _monitor_events(mon: zmq.Socket) -> list[tuple[int, int, bytes]]:
        """``(event, value, endpoint)`` waiting on a monitor PAIR, without blocking."""
        out = []
        while True:
            try:
                if not mon.get(EVENTS) & POLLIN:
                    return out
                frames = mon.recv_multipart(NOBLOCK)
            except zmq.ZMQError:
                return out
            out.append((*_MON_HEADER.unpack_from(frames[0]), frames[1]))

    def drain_router_monitor(self) -> None:
        for event, fd, _ in self._monitor_events(self.rmon):
            if event == zmq.EVENT_ACCEPTED:
                self._conn_closed(fd)  # a missed close of an older connection on this fd
                conn = self._conns[fd] = Conn(fd, _peername(fd), time.monotonic())
                self._unbound[fd] = conn
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._conn_closed(fd)
            elif event in (AUTH, NO_DETAIL, PROTOCOL):
                # the value is libzmq's error code, not the fd: libzmq closes that connection next,
                # and its DISCONNECTED names the fd (so the peer's address) of a connection that
                # never delivered a message
                self._refusing = handshake_problem(event, fd, curve=self._curve, dialled=False)

    def _conn_closed(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        self._unbound.pop(fd, None)
        refusing, self._refusing = self._refusing, None
        if refusing is not None and refusing[0] and conn is not None and conn.rid is None and not conn.dropped:
            # an inbound connection that failed CURVE: no peer id, no session; the shell counts
            # and logs it with the reason the dialler's session ends with (decision E1)
            self.events.append(PeerClosed(conn.peername, CloseReason.AUTH_REFUSED, refusing[1]))
        if conn is None or conn.rid is None or self.rid_fd.get(conn.rid) != fd:
            return
        del self.rid_fd[conn.rid]
        self._spend(conn.rid, closed=True)
        peer = IN_PREFIX + conn.rid.hex()
        self.outbox.fail(peer, SendFailure.UNREACHABLE, "connection closed")
        reason = CloseReason.DROPPED if conn.dropped else CloseReason.DISCONNECTED
        self.events.append(PeerClosed(peer, reason))

    def drain_dealer_monitor(self, address: str) -> None:
        failed_auth = False
        for event, value, endpoint in self._monitor_events(self._dealer_mons[address]):
            if self._order.consumed(address, event, endpoint, self.dealers[address]):
                if event == zmq.EVENT_CLOSED:
                    self._dialling[address] = time.monotonic()  # the next address's attempt starts
                continue
            if event == zmq.EVENT_CONNECTED:
                self._dialling.pop(address, None)
                self._order.forget(address)
                self._dealer_fd[address] = value
            elif event == _SPOKE:
                self._spoken.add(address)
                self._spoke[address] = 0
                if len(self._spoke) > 4096:
                    del self._spoke[next(iter(self._spoke))]
            elif event == zmq.EVENT_CLOSED:
                self._dealer_fd.pop(address, None)
                since = self._dialling.pop(address, None)
                if since is not None:  # a fail_fast dial that never connected: the dial failed
                    timed_out = self._connect_timeout_ms and (
                        time.monotonic() - since) * 1000 >= 0.9 * self._connect_timeout_ms
                    self.events.append(PeerClosed(address, CloseReason.CONNECT_TIMEOUT if timed_out
                                                   else CloseReason.REFUSED))
            elif event == zmq.EVENT_DISCONNECTED:
                self._dealer_fd.pop(address, None)
                self._spoken.discard(address)
                if not failed_auth:  # after a failed CURVE handshake its session already ends auth_failed
                    self.events.append(PeerClosed(address, CloseReason.DISCONNECTED))
            elif event in (AUTH, NO_DETAIL, PROTOCOL):
                hangups = self._spoke.get(address)
                if hangups is not None and event == NO_DETAIL:  # a restart hangs up once; CURVE every time
                    self._spoke[address] = hangups = hangups + 1
                spoke = hangups is not None and hangups < 2
                auth, text = handshake_problem(event, value, curve=self._curve, dialled=True, spoke=spoke)
                if auth and not failed_auth:
                    failed_auth = True
                    self.events.append(PeerClosed(address, CloseReason.AUTH_FAILED, text))
                if (address, event) in self.handshake_failures:
                    continue
                # once per producer and text: libzmq retries the connect and fails the same way,
                # and each failed load may dial again (bounded: addresses come from requests)
                if len(self.handshake_failures) >= 4096:
                    self.handshake_failures.clear()
                said = any(handshake_problem(e, value, curve=self._curve, dialled=True, spoke=spoke)[1] == text
                           for a, e in self.handshake_failures if a == address)
                self.handshake_failures.add((address, event))
                if not said:
                    log.warning("kvtier: handshake with producer %s failed: %s", address, text)

    # -- binding routing ids to connections -------------------------------------------------

    def from_connection(self, frame: zmq.Frame, rid: bytes) -> bool:
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
        self.drain_router_monitor()
        conn = self._conns.get(fd)
        if conn is not None and conn.rid == rid:
            return not conn.dropped
        if rid in self.rid_fd or rid in self._spent:
            # a leftover of a connection that closed (or is bound to another fd): deliver it
            # unless that connection was dropped by us; it changes no record
            own = self._conns.get(self.rid_fd.get(rid, -1))
            return not (own is not None and own.dropped)
        if conn is None or conn.rid is not None:
            self._spend(rid, closed=conn is None)
            if conn is None:
                # its connection closed before anything of it was read: nothing will report
                # that close, so report it after this message
                self.events.append(PeerClosed(IN_PREFIX + rid.hex(), CloseReason.DISCONNECTED))
            else:
                conn.ambiguous = True  # which of the two ids is the live one is unknown
            return True
        if conn.dropped:
            return False
        conn.rid = rid
        self._unbound.pop(fd, None)
        self.rid_fd[rid] = fd
        if self._curve:
            try:
                conn.principal = frame.get("User-Id")
            except zmq.ZMQError:  # pragma: no cover - libzmq sets it after ZAP
                conn.principal = None
        return True

    def _spend(self, rid: bytes, *, closed: bool) -> None:
        self._spent[rid] = closed
        if len(self._spent) > _MAX_SPENT:
            del self._spent[next(iter(self._spent))]

    # -- cutting connections ----------------------------------------------------------------

    def _linger(self, peer: str, linger_s: float) -> bool:
        """:meth:`drop_peer` with a linger (see there)."""
        deadline = time.monotonic() + linger_s
        self.outbox.flush_peer(peer)
        sock = self.dealers.get(peer)
        if sock is not None:
            self.outbox.fail(peer, SendFailure.DISCONNECTED)  # what could not be handed to libzmq
            mon = self._forget_dealer(peer)
            self._lingering.append((deadline, sock, mon))
            self.events.append(PeerClosed(peer, CloseReason.DROPPED))
            return True
        target = self.resolve(peer)
        if target is None or target[1] is None or target[1] not in self.rid_fd:
            return False
        self.closing[peer] = deadline
        return True

    def next_linger_end(self) -> float:
        """When the first goodbye's linger ends (``inf`` when none lingers)."""
        ends = [*self.closing.values(), *(d for d, _, _ in self._lingering)]
        return min(ends) if ends else float("inf")

    def end_lingering(self, now: float) -> None:
        """Cut the connections whose goodbye's linger is over."""
        for peer, deadline in list(self.closing.items()):
            if now >= deadline:
                del self.closing[peer]
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

    def cut_idle(self) -> None:
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
        """:meth:`ZmqTransport.drop_peer <kvtier.transport.zmq_transport.ZmqTransport.drop_peer>`
        on an open transport."""
        if linger_s > 0:
            return self._linger(peer, linger_s)
        self.closing.pop(peer, None)
        self.outbox.fail(peer, SendFailure.DISCONNECTED)
        if peer in self.dealers:
            self.close_dealer(peer)
            self.events.append(PeerClosed(peer, CloseReason.DROPPED))
            return True
        target = self.resolve(peer)
        if target is None or target[1] is None:
            return False
        self.drain_router_monitor()
        fd = self.rid_fd.get(target[1])
        if fd is None:
            return False
        conn = self._conns[fd]
        if conn.dropped:
            return True
        if not self._shutdown_conn(conn):
            return False
        conn.dropped = True
        self.service()
        return True

    def _forget_dealer(self, address: str) -> zmq.Socket:
        """Stop reading the DEALER dialling ``address``; returns its monitor (both stay open)."""
        self._dialling.pop(address, None)
        self._order.forget(address)
        self._dealer_fd.pop(address, None)
        self._spoken.discard(address)
        sock = self.dealers.pop(address)
        mon = self._dealer_mons.pop(address)
        self._dealer_peer.pop(sock, None)
        self._mon_peer.pop(mon, None)
        self._mon_set = None
        self.version += 1
        return mon

    def close_dealer(self, address: str) -> None:
        """Close the DEALER dialling ``address`` and its monitor (``linger=0``)."""
        sock = self.dealers[address]
        mon = self._forget_dealer(address)
        try:
            sock.disable_monitor()
        except zmq.ZMQError:  # pragma: no cover
            pass
        mon.close(linger=0)
        sock.close(linger=0)

    def teardown(self, linger_ms: int = 0) -> None:
        """Close every socket (queued messages get ``linger_ms`` to leave; on a dial whose ZMTP
        handshake never succeeded nothing can leave, so it is cut at once: decision T13)."""
        for _, sock, mon in self._lingering:
            mon.close(linger=0)
            sock.close(linger=0)
        self._lingering.clear()
        self.closing.clear()
        for address in list(self.dealers):
            self.drain_dealer_monitor(address)  # a handshake that succeeded since the last poll
            sock = self.dealers.pop(address)
            self._dealer_mons.pop(address).close(linger=0)
            sock.close(linger=linger_ms if address in self._spoken else 0)
        if self.rmon is not None:
            self.rmon.close(linger=0)
        if self.router is not None:
            self.router.close(linger=linger_ms)
        self.version += 1

