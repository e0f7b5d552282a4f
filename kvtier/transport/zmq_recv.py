"""The receiving side of a ZmqTransport: reading messages round-robin (one socket cannot starve
the others), the one-pass ``service`` of what the poller reports, and ``wait``, which blocks
until a message or a connection event is ready while it keeps queued sends moving.

:class:`Inbox` is a part of :class:`~kvtier.transport.zmq_transport.ZmqTransport` (decision W12):
it owns the poller, the wake-up fd and the round-robin offset; it reads the sockets the connections
part holds and keeps the outbox's queued sends moving.
"""

from __future__ import annotations

import math
import select
import time

import zmq

from kvtier.transport import TransportEvent
from kvtier.transport.zmq_conns import EVENTS, IN_PREFIX, NOBLOCK, POLLIN, Connections
from kvtier.transport.zmq_send import Outbox

#: Sub-millisecond waits poll this often: a message that arrives during one waits at most this
#: long (``zmq_poll`` itself counts whole milliseconds).
SUB_MS_SLICE_S = 0.0001

#: Received frames from this size up are handed over as views of libzmq's message, not copied into
#: ``bytes`` (decision T12): a block's payload is copied once, into its slot; a header stays ``bytes``.
VIEW_BYTES = 4 << 10

#: ``select``'s fd limit (glibc's ``FD_SETSIZE``): past it a sub-millisecond wait slices instead.
_FD_SETSIZE = 1024

#: Header bytes one service call reads at most (the first message always): a peer's headers that
#: are large and slow to decode (up to ``max_message_bytes`` each) are not taken in by the hundred
#: ahead of the other peers' next messages, which the ROUTER's fair queue interleaves with them
#: (decision C36).  A pass's usual ~100-200-byte headers never come near it.
READ_HEADER_BYTES = 256 << 10


def _recv_message(sock: zmq.Socket) -> list[zmq.Frame]:
    """One whole multipart message as frames (no copy), without blocking.  A frame says whether
    another follows (``Frame.more``): pyzmq's ``recv_multipart`` asks the socket for ``RCVMORE``
    after each frame instead, through enum conversions — twice the cost per message on the
    request path (decision C26).  libzmq delivers a multipart message whole, so once its first
    frame is read the rest is there.

    Raises:
        zmq.ZMQError: ``zmq.Again`` when nothing is waiting, or a socket error."""
    frame = sock.recv(NOBLOCK, copy=False)
    parts = [frame]
    while frame.more:
        frame = sock.recv(NOBLOCK, copy=False)
        parts.append(frame)
    return parts


class Inbox:
    """Receiving, polling and waiting of :class:`~kvtier.transport.zmq_transport.ZmqTransport`
    (its public methods of those names document them; these run on an open transport).

    Args:
        conns: the transport's sockets and connections.
        outbox: the transport's send queues.
        zero_copy_threshold: frames at least this long (or :data:`VIEW_BYTES`, if less) are
            returned as ``memoryview``.
    """

    def __init__(self, conns: Connections, outbox: Outbox, zero_copy_threshold: int) -> None:
        self._conns = conns
        self._out = outbox
        self._threshold = min(zero_copy_threshold, VIEW_BYTES)
        self._poller: zmq.Poller | None = None
        self._poller_version = -1  # the sockets' version the cached poller was built for
        self._wake: int | None = None  # the owner's wake-up fd, polled with the sockets (set_wake)
        self._rr = 0  # round-robin start offset for recv() fairness

    _sel_cache: tuple[zmq.Poller, list[int] | None] | None = None  # (poller, its select fds)

    # -- receive ----------------------------------------------------------------------------

    def recv(self, max_messages: int) -> list[tuple[str, list[memoryview | bytes]]]:
        conns = self._conns
        conns.service()
        self._out.flush_all()
        socks = conns.data_sockets()
        # Rotate the start so that with a small max_messages every socket gets its turn.
        k = self._rr % len(socks)
        self._rr += 1
        active = socks[k:] + socks[:k]
        out: list[tuple[str, list[memoryview | bytes]]] = []
        threshold = self._threshold
        while active and len(out) < max_messages:
            for entry in list(active):
                sock, peer = entry
                try:
                    # ZMQ_EVENTS first: an empty socket costs a flag read, not a raised zmq.Again
                    if not sock.get(EVENTS) & POLLIN:
                        active.remove(entry)
                        continue
                    parts = _recv_message(sock)
                except zmq.ZMQError:  # Again (raced), or a socket error: skip it this round
                    active.remove(entry)
                    continue
                if peer is None:
                    rid = parts[0].bytes
                    if not conns.from_connection(parts[0], rid) or len(parts) < 2:
                        continue
                    peer = IN_PREFIX + rid.hex()
                    parts = parts[1:]
                out.append(
                    (peer, [p.bytes if len(p) < threshold else p.buffer for p in parts])
                )
                if len(out) >= max_messages:
                    break
        return out

    def service(self, max_messages: int) -> tuple[list[tuple[str, list[memoryview | bytes]]], list[TransportEvent], bool]:
        conns = self._conns
        if self._out.pending:
            self._out.flush_all()
        poller = self._poller
        if poller is None or self._poller_version != conns.version:
            poller = self._build_poller(set())
        try:
            ready = poller.poll(0)
        except zmq.ZMQError:
            return [], [], True
        data: list[tuple[zmq.Socket, str | None]] = []
        if ready:
            mons, wake = conns.monitors(), self._wake
            for sock, ev in ready:
                if sock == wake:  # the owner's wake-up: not ours to read
                    continue
                if sock in mons:
                    conns.drain_monitor(sock)
                elif ev & POLLIN:
                    data.append((sock, conns.peer_of(sock)))
        conns.housekeeping(time.monotonic())
        out: list[tuple[str, list[memoryview | bytes]]] = []
        drained = True
        if data:
            drained = self._read(data, max_messages, out)
        return out, conns.take_events(), drained

    def _read(self, active: list[tuple[zmq.Socket, str | None]], max_messages: int,
              out: list[tuple[str, list[memoryview | bytes]]]) -> bool:
        """Read ``active`` sockets round-robin into ``out``; True when every one is empty.  Stops
        at ``max_messages``, or once :data:`READ_HEADER_BYTES` of headers were read."""
        threshold, conns = self._threshold, self._conns
        header_bytes = 0
        while active:
            for entry in list(active):
                if len(out) >= max_messages or header_bytes >= READ_HEADER_BYTES:
                    return False
                sock, peer = entry
                try:
                    # ZMQ_EVENTS first: an emptied socket costs a flag read, not a raised (and
                    # built) zmq.Again at the end of every pass that read it (decision C25)
                    if not sock.get(EVENTS) & POLLIN:
                        active.remove(entry)
                        continue
                    parts = _recv_message(sock)
                except zmq.ZMQError:  # Again (raced), or a socket error: skip it this pass
                    active.remove(entry)
                    continue
                if peer is None:
                    rid = parts[0].bytes
                    if not conns.from_connection(parts[0], rid) or len(parts) < 2:
                        continue
                    peer = IN_PREFIX + rid.hex()
                    parts = parts[1:]
                header_bytes += len(parts[0])
                out.append((peer, [p.bytes if len(p) < threshold else p.buffer for p in parts]))
        return True

    # -- waiting ----------------------------------------------------------------------------

    def _poll_once(self, poller: zmq.Poller, remaining_s: float) -> list:
        """One poll of at most ``remaining_s``. ``zmq_poll`` counts whole milliseconds, so a
        sub-millisecond wait (a NIXL plane's progress interval) would round up to 1 ms per
        wait; it is a non-blocking poll, then one ``select`` over the sockets' notification fds
        (and the wake-up fd) for what is left, then a non-blocking poll again: a message that
        arrives meanwhile ends the wait at once (decision C25; the ``select`` cannot miss one:
        the first poll left every socket's fd unsignalled, and libzmq signals it when a pipe
        turns readable).  With an fd past ``select``'s limit, non-blocking polls
        :data:`SUB_MS_SLICE_S` apart (a message waits at most one slice)."""
        if remaining_s >= 0.001 or remaining_s <= 0:
            return poller.poll(max(0, math.ceil(remaining_s * 1000)))
        events = poller.poll(0)
        if events:
            return events
        fds = self._select_fds(poller)
        if fds is not None:
            try:
                select.select(fds, (), (), remaining_s)
            except (OSError, ValueError):  # an fd closed meanwhile (shutdown): the poll says what is left
                pass
            return poller.poll(0)
        end = time.monotonic() + remaining_s
        while True:
            events = poller.poll(0)
            left = end - time.monotonic()
            if events or left <= 0:
                return events
            time.sleep(min(left, SUB_MS_SLICE_S))

    def _select_fds(self, poller: zmq.Poller) -> list[int] | None:
        """The fds a sub-millisecond wait selects on for ``poller`` (each socket's ``ZMQ_FD``,
        the raw fds as they are), cached per poller; None when one is past ``FD_SETSIZE``."""
        cached = self._sel_cache
        if cached is not None and cached[0] is poller:
            return cached[1]
        fds = [s.FD if isinstance(s, zmq.Socket) else (s if isinstance(s, int) else s.fileno())
               for s, _ in poller.sockets]
        out = fds if max(fds, default=0) < _FD_SETSIZE else None
        self._sel_cache = (poller, out)
        return out

    def set_wake(self, fd: int | None) -> None:
        self._wake = fd
        self._poller = None

    def wait(self, timeout_s: float) -> bool:
        conns, outbox = self._conns, self._out
        deadline = time.monotonic() + max(0.0, timeout_s)
        # Only events new to this call wake it: a caller that never drains events() must not
        # turn every wait into a busy loop.  Monitors are read only when the poller reports
        # them readable (the loop below), never up front: an idle wait costs one poll.
        seen = len(conns.events)
        out_socks = self._sockets_with_pending() if outbox.pending else set()
        mons = conns.monitors()
        while True:
            poller = self._build_poller(out_socks)
            now = time.monotonic()
            until = conns.next_due(deadline)
            try:
                events = self._poll_once(poller, until - now)
            except zmq.ZMQError:
                return False
            if any(ev & POLLIN and s not in mons for s, ev in events):
                return True  # a message, or the wake-up
            if any(s in mons for s, _ in events) or until < deadline:
                conns.service()
                if len(conns.events) > seen:
                    return True
            if any(ev & zmq.POLLOUT for _, ev in events):  # room opened up below some HWM
                if not outbox.flush_all():
                    # POLLOUT on a ROUTER means "some pipe has room", maybe not the pipe we
                    # need. Stop watching it for this call instead of spinning.
                    out_socks = set()
                else:
                    out_socks = self._sockets_with_pending()
                continue
            if time.monotonic() >= deadline:
                return False

    def _sockets_with_pending(self) -> set[zmq.Socket]:
        socks = set()
        for peer in self._out.queued_peers():
            target = self._conns.resolve(peer)
            if target is not None:
                socks.add(target[0])
        return socks

    def _build_poller(self, out_socks: set[zmq.Socket]) -> zmq.Poller:
        conns = self._conns
        if not out_socks and self._poller is not None and self._poller_version == conns.version:
            return self._poller
        poller = zmq.Poller()
        for sock, _peer in conns.data_sockets():
            poller.register(sock, zmq.POLLIN | (zmq.POLLOUT if sock in out_socks else 0))
        for mon in conns.monitors():
            poller.register(mon, zmq.POLLIN)
        if self._wake is not None:
            poller.register(self._wake, zmq.POLLIN)
        if not out_socks:
            self._poller, self._poller_version = poller, conns.version
        return poller
