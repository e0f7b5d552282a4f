"""A TCP relay between a consumer and a producer, for faults of the path itself.

The consumer dials :attr:`TcpRelay.address` instead of the producer; every connection is copied
both ways by one thread.  Faults:

* :meth:`TcpRelay.reset`: every connection through the relay is reset at once (``SO_LINGER`` 0:
  an RST each way) — a transient network hiccup that both ends see as a closed connection, while
  both processes live on and the next dial goes through;
* ``flip_at``: the byte at that offset of the producer → consumer stream of each connection is
  inverted (memory or link corruption the checksum of TCP did not catch): a block payload that
  no longer matches its digest.

Standard library only; ``close()`` joins the thread.
"""

from __future__ import annotations

import select
import socket
import struct
import threading

__all__ = ["TcpRelay"]


class TcpRelay:
    """Relays ``127.0.0.1:<ephemeral>`` to ``target`` (``host:port``)."""

    def __init__(self, target: str, *, flip_at: int | None = None) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.flip_at = flip_at
        self.flipped = 0
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self._lsock.setblocking(False)
        self.host, self.port = self._lsock.getsockname()[:2]
        self._pairs: list[list] = []  # [client, server, bytes server->client so far]
        self._lock = threading.Lock()
        self._reset = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-relay", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def reset(self) -> None:
        """Reset every connection through the relay (RST both ways); later dials go through."""
        with self._lock:
            self._reset = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        with self._lock:
            for pair in self._pairs:
                _abort(pair[0])
                _abort(pair[1])
            self._pairs.clear()
        self._lsock.close()

    def __enter__(self) -> TcpRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._reset:
                    self._reset = False
                    for pair in self._pairs:
                        _abort(pair[0])
                        _abort(pair[1])
                    self._pairs.clear()
                socks = [self._lsock] + [s for pair in self._pairs for s in pair[:2]]
            readable, _, _ = select.select(socks, [], [], 0.01)
            for s in readable:
                if s is self._lsock:
                    self._accept()
                else:
                    self._pump(s)

    def _accept(self) -> None:
        try:
            client, _ = self._lsock.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self.target, timeout=2.0)
        except OSError:
            _abort(client)
            return
        for s in (client, server):
            s.setblocking(True)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._pairs.append([client, server, 0])

    def _pump(self, s: socket.socket) -> None:
        with self._lock:
            pair = next((p for p in self._pairs if s is p[0] or s is p[1]), None)
        if pair is None:
            return
        try:
            data = s.recv(1 << 20)
        except OSError:
            data = b""
        if not data:  # one side closed: close the other, as a router would
            with self._lock:
                if pair in self._pairs:
                    self._pairs.remove(pair)
            _abort(pair[0])
            _abort(pair[1])
            return
        if s is pair[1]:  # producer -> consumer
            start = pair[2]
            pair[2] += len(data)
            at = self.flip_at
            if at is not None and start <= at < pair[2]:
                buf = bytearray(data)
                buf[at - start] ^= 0xFF
                data = bytes(buf)
                self.flipped += 1
            dst = pair[0]
        else:
            dst = pair[1]
        try:
            dst.sendall(data)
        except OSError:
            pass


def _abort(s: socket.socket) -> None:
    """Close with an RST (linger 0), as a reset connection ends."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()
