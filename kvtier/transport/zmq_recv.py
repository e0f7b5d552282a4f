"""The receiving side of a ZmqTransport: reading messages round-robin (one socket cannot starve
the others), the one-pass ``service`` of what the poller reports, and ``wait``, which blocks
until a message or a connection event is ready while it keeps queued sends moving.

:class:`ZmqReceive` is a base of :class:`~kvtier.transport.zmq_transport.ZmqTransport`; the state
it works on is made by ``ZmqTransport.__init__``.
"""

from __future__ import annotations

import math
import select
import time

import zmq

from kvtier.transport import TransportEvent
from kvtier.transport.zmq_conns import EVENTS, IN_PREFIX, NOBLOCK, POLLIN
from kvtier.transport.zmq_options import positive_int

#: Sub-millisecond waits poll this often: a message that arrives during one waits at most this
#: long (``zmq_poll`` itself counts whole milliseconds).
SUB_MS_SLICE_S = 0.0001

#: ``select``'s fd limit (glibc's ``FD_SETSIZE``): past it a sub-millisecond wait slices instead.
_FD_SETSIZE = 1024


class ZmqReceive:
    """Receiving, polling and waiting of :class:`~kvtier.transport.zmq_transport.ZmqTransport`."""

    _sel_cache: tuple[zmq.Poller, list[int] | None] | None = None  # (poller, its select fds)

    # -- receive ----------------------------------------------------------------------------

    def recv(self, max_messages: int = 1000) -> list[tuple[str, list[memoryview | bytes]]]:
        """Drain received messages without blocking. Flushes queued sends first.

        Sockets are served round-robin, one message at a time, so a busy peer cannot starve
        the others.

        Args:
            max_messages: upper bound on messages returned, >= 1.

        Returns:
            ``[(peer, frames), ...]`` in arrival order per peer. Frames shorter than
            ``zero_copy_threshold`` are ``bytes``. Longer ones are read-only ``memoryview``
            objects over zmq's buffer (no copy), which stay valid while referenced. ``[]`` after
            ``close()``.

        Raises:
            ValueError: ``max_messages`` is not an int >= 1.
        """
        max_messages = positive_int("max_messages", max_messages)
        if self._closed:
            return []
        self._service()
        self._flush_all()
        socks: list[tuple[zmq.Socket, str | None]] = [(self._router, None)]
        socks.extend((s, p) for p, s in self._dealers.items())
        # Rotate the start so that with a small max_messages every socket gets its turn.
        k = self._rr % len(socks)
        self._rr += 1
        active = socks[k:] + socks[:k]
        out: list[tuple[str, list[memoryview | bytes]]] = []
        threshold = self._zc_threshold
        while active and len(out) < max_messages:
            for entry in list(active):
                sock, peer = entry
                try:
                    # ZMQ_EVENTS first: an empty socket costs a flag read, not a raised zmq.Again
                    if not sock.get(EVENTS) & POLLIN:
                        active.remove(entry)
                        continue
                    parts = sock.recv_multipart(NOBLOCK, copy=False)
                except zmq.ZMQError:  # Again (raced), or a socket error: skip it this round
                    active.remove(entry)
                    continue
                if peer is None:
                    rid = parts[0].bytes
                    if not self._from_connection(parts[0], rid) or len(parts) < 2:
                        continue
                    peer = IN_PREFIX + rid.hex()
                    parts = parts[1:]
                out.append(
                    (peer, [p.bytes if len(p) < threshold else p.buffer for p in parts])
                )
                if len(out) >= max_messages:
                    break
        return out

    def service(self, max_messages: int = 1000) -> tuple[list[tuple[str, list[memoryview | bytes]]], list[TransportEvent], bool]:
        """One non-blocking pass over what the poller reports readable: monitors first (their
        connection events), then the data sockets, round-robin, until each is empty or
        ``max_messages`` were read.  Also flushes queued sends and cuts accepted connections
        whose idle time is up.  Sockets the poller does not report are not touched.

        Returns:
            ``(messages, events, drained)``: messages as :meth:`recv` returns them, events as
            :meth:`events` does, and whether every socket was read to empty in this pass (then
            everything that arrived before the pass began has been returned).
        """
        max_messages = positive_int("max_messages", max_messages)
        if self._closed:
            return [], [], True
        if self._npending:
            self._flush_all()
        poller = self._poller if self._poller is not None else self._build_poller(set())
        try:
            ready = poller.poll(0)
        except zmq.ZMQError:
            return [], [], True
        data: list[tuple[zmq.Socket, str | None]] = []
        if ready:
            rmon, dmons, wake = self._rmon, self._mon_peer, self._wake
            for sock, ev in ready:
                if sock == wake:  # the owner's wake-up: not ours to read
                    continue
                if sock is rmon:
                    self._drain_router_monitor()
                elif sock in dmons:
                    self._drain_dealer_monitor(dmons[sock])
                elif ev & POLLIN:
                    data.append((sock, None if sock is self._router else self._dealer_peer[sock]))
        if self._idle_timeout_s is not None and self._unbound:
            self._cut_idle()
        if self._closing or self._lingering:
            self._end_lingering(time.monotonic())
        out: list[tuple[str, list[memoryview | bytes]]] = []
        drained = True
        if data:
            drained = self._read(data, max_messages, out)
        events: list[TransportEvent] = []
        if self._events:
            events = list(self._events)
            self._events.clear()
        return out, events, drained

    def _read(self, active: list[tuple[zmq.Socket, str | None]], max_messages: int,
              out: list[tuple[str, list[memoryview | bytes]]]) -> bool:
        """Read ``active`` sockets round-robin into ``out``; True when every one is empty."""
        threshold = self._zc_threshold
        while active:
            for entry in list(active):
                if len(out) >= max_messages:
                    return False
                sock, peer = entry
                try:
                    # ZMQ_EVENTS first: an emptied socket costs a flag read, not a raised (and
                    # built) zmq.Again at the end of every pass that read it (decision C25)
                    if not sock.get(EVENTS) & POLLIN:
                        active.remove(entry)
                        continue
                    parts = sock.recv_multipart(NOBLOCK, copy=False)
                except zmq.ZMQError:  # Again (raced), or a socket error: skip it this pass
                    active.remove(entry)
                    continue
                if peer is None:
                    rid = parts[0].bytes
                    if not self._from_connection(parts[0], rid) or len(parts) < 2:
                        continue
                    peer = IN_PREFIX + rid.hex()
                    parts = parts[1:]
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
        """Watch ``fd`` (an eventfd or pipe the owner writes to wake its loop) in the same poll
        as the sockets: :meth:`wait` returns True as soon as it is readable.  The owner reads it
        (this transport never does); ``None`` stops watching."""
        self._wake = fd
        self._poller = None

    def wait(self, timeout_s: float) -> bool:
        """Block until a message or a connection event is ready, the wake-up fd
        (:meth:`set_wake`) is readable, or ``timeout_s`` passes.
        Flushes queued sends as their sockets become writable, and cuts idle connections
        when their time is up.

        Args:
            timeout_s: seconds, finite. Values <= 0 just poll; values under 1 ms are honoured
                (:meth:`_poll_once`), not rounded up to ``zmq_poll``'s millisecond.

        Returns:
            True if a message is readable (call :meth:`recv`) or an event is waiting (call
            :meth:`events`), else False.

        Raises:
            ValueError: ``timeout_s`` is NaN or infinite.
        """
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(
            timeout_s
        ):
            raise ValueError(f"timeout_s must be a finite number, got {timeout_s!r}")
        if self._closed:
            return False
        deadline = time.monotonic() + max(0.0, timeout_s)
        # Only events new to this call wake it: a caller that never drains events() must not
        # turn every wait into a busy loop.  Monitors are read only when the poller reports
        # them readable (the loop below), never up front: an idle wait costs one poll.
        seen = len(self._events)
        out_socks = self._sockets_with_pending() if self._queues else set()
        mons = self._monitors()
        while True:
            poller = self._build_poller(out_socks)
            now = time.monotonic()
            until = deadline
            if self._idle_timeout_s is not None and self._unbound:
                until = min(until, next(iter(self._unbound.values())).accepted + self._idle_timeout_s)
            if self._closing or self._lingering:  # a goodbye's linger ends: cut on time
                until = min(until, self._next_linger_end())
            try:
                events = self._poll_once(poller, until - now)
            except zmq.ZMQError:
                return False
            if any(ev & POLLIN and s not in mons for s, ev in events):
                return True  # a message, or the wake-up
            if any(s in mons for s, _ in events) or until < deadline:
                self._service()
                if len(self._events) > seen:
                    return True
            if any(ev & zmq.POLLOUT for _, ev in events):  # room opened up below some HWM
                if not self._flush_all():
                    # POLLOUT on a ROUTER means "some pipe has room", maybe not the pipe we
                    # need. Stop watching it for this call instead of spinning.
                    out_socks = set()
                else:
                    out_socks = self._sockets_with_pending()
                continue
            if time.monotonic() >= deadline:
                return False

    def _monitors(self) -> frozenset[zmq.Socket]:
        mons = self._mon_set
        if mons is None:
            mons = self._mon_set = frozenset({self._rmon, *self._dealer_mons.values()})
        return mons

    def _sockets_with_pending(self) -> set[zmq.Socket]:
        socks = set()
        for peer in self._queues:
            target = self._resolve(peer)
            if target is not None:
                socks.add(target[0])
        return socks

    def _build_poller(self, out_socks: set[zmq.Socket]) -> zmq.Poller:
        if not out_socks and self._poller is not None:
            return self._poller
        poller = zmq.Poller()
        for sock in (self._router, *self._dealers.values()):
            poller.register(sock, zmq.POLLIN | (zmq.POLLOUT if sock in out_socks else 0))
        for mon in (self._rmon, *self._dealer_mons.values()):
            poller.register(mon, zmq.POLLIN)
        if self._wake is not None:
            poller.register(self._wake, zmq.POLLIN)
        if not out_socks:
            self._poller = poller
        return poller
