"""The metrics endpoint's HTTP server: ``GET /metrics`` (Prometheus text) and ``GET /kvtier/requests``
(JSON), one thread per connection, at most :data:`MAX_CONNECTIONS` at once, each given at most
:data:`IO_TIMEOUT_S` seconds per read or write (decision O16), and pages rendered one at a time
within :data:`RENDER_SHARE` of one thread's CPU (decision O18).

Whoever can reach ``metrics_port`` can open connections: an idle or half-sent request must not
hold a thread of the engine's process for ever, and many of them must not grow the process's
threads without bound.  A connection beyond the cap is closed at once (its scrape fails and is
retried by the scraper); one silent for :data:`IO_TIMEOUT_S` is closed.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any, Final
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

__all__ = ["IO_TIMEOUT_S", "MAX_CONNECTIONS", "RENDER_SHARE", "REQUESTS_PATH", "serve"]

log = logging.getLogger("kvtier.metrics")

REQUESTS_PATH: Final = "/kvtier/requests"
"""Where the endpoint serves the last finished requests (:class:`~kvtier.forensics.Forensics`)."""

MAX_CONNECTIONS: Final = 16
"""Connections served at once; one more is closed as it is accepted.  A scrape takes one for a few
milliseconds: Prometheus, ``kvtier top`` and an operator's ``curl`` together need a handful."""

IO_TIMEOUT_S: Final = 10.0
"""The longest a connection may keep one read or write of its request or answer waiting
(seconds): a scrape of this endpoint is a few kilobytes on a local network."""


RENDER_SHARE: Final = 0.1
"""The most of one thread's CPU the endpoint spends rendering pages: a page that took ``t`` seconds
of CPU lets the next start ``t × (1 / RENDER_SHARE − 1)`` later (a request that comes sooner waits,
it is not refused).  The endpoint runs in the engine's process and renders in Python: unbounded, a
few clients asking back to back took the interpreter from kvtier's I/O loop and the engine's
calls (hand-offs 30-45x slower).  A scraper every few seconds never waits."""


class _Budgeted:
    """A WSGI app that renders ``app``'s pages one at a time, in at most ``share`` of a thread's CPU."""

    def __init__(self, app: Callable, share: float) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._factor = 1.0 / share - 1.0
        self._next = 0.0

    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        with self._lock:
            wait = self._next - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the interpreter is free meanwhile: the I/O loop runs
            t0 = time.thread_time()
            try:
                return self._app(environ, start_response)
            finally:
                self._next = time.monotonic() + (time.thread_time() - t0) * self._factor


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds up close()
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slots = threading.BoundedSemaphore(self.max_connections)
        self.refused = 0
        """Connections closed at once because ``max_connections`` were being served."""
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread took the connection: give its slot back
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out or went away ends quietly (socketserver prints a
        traceback on stderr for each); anything else is logged once per connection."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):  # TimeoutError, resets and broken pipes are OSErrors
            log.warning("kvtier: the metrics endpoint failed serving %s", client_address, exc_info=True)


class _Handler(WSGIRequestHandler):
    timeout = IO_TIMEOUT_S  # set on the connection's socket before anything is read

    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr."""


def _app(metrics: Callable, requests: Any, const: tuple[str, str]) -> Callable:
    """The endpoint's WSGI app: ``/kvtier/requests`` from ``requests``, ``/metrics`` (and ``/``, where
    some scrape configs point) from ``prometheus_client``; any other path is 404, naming the two
    (a mistyped path answered with metrics reads as a broken page)."""
    def app(environ: dict, start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO", "").rstrip("/")
        if path in ("", "/metrics"):
            return metrics(environ, start_response)
        if path != REQUESTS_PATH or requests is None:
            pages = "/metrics" + (f" and {REQUESTS_PATH}" if requests is not None else "")
            return _answer(start_response, "404 Not Found", {"error": f"no page {path[:80]!r} here: this "
                                                             f"kvtier metrics endpoint serves {pages}"})
        query = parse_qs(environ.get("QUERY_STRING", ""))
        kid = (query.get("kv_request_id") or [None])[0]
        raw = (query.get("limit") or ["0"])[0]
        try:
            limit = max(0, int(raw)) or None  # 0 or less: every entry
        except ValueError:  # said, not ignored: a typo would otherwise read as "every entry"
            return _answer(start_response, "400 Bad Request", {
                "error": f"limit must be an integer (0 or less: every entry), got {raw[:40]!r}"})
        return _answer(start_response, "200 OK", {
            "tier": const[0], "listener": const[1], "capacity": requests.capacity,
            "finished_total": requests.finished_total, "in_progress": requests.in_progress(),
            "requests": requests.as_json(kid, limit), "open": requests.open_json(kid) if kid else [],
        })

    return app


def _answer(start_response: Callable, status: str, doc: dict[str, Any]) -> list[bytes]:
    body = json.dumps(doc).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


def serve(host: str, port: int, metrics: Callable, requests: Any, const: tuple[str, str], *,
          max_connections: int = MAX_CONNECTIONS, io_timeout_s: float = IO_TIMEOUT_S,
          render_share: float = RENDER_SHARE) -> tuple[Any, threading.Thread]:
    """Serve ``metrics`` (a WSGI app: ``prometheus_client.make_wsgi_app``) and, with ``requests``
    (a :class:`~kvtier.forensics.Forensics`), ``GET /kvtier/requests``, on ``host:port`` (port 0:
    an ephemeral port), from a daemon thread; at most ``max_connections`` at once, each closed
    once a read or write of it waited ``io_timeout_s`` seconds; pages rendered one at a time, in
    at most ``render_share`` (0 < share ≤ 1) of one thread's CPU.

    Returns:
        the server (``server_address``, ``refused``: connections closed at the cap; stop it with
        ``shutdown()`` then ``server_close()``) and its accepting thread.
    Raises:
        OSError: the address cannot be bound (e.g. the port is in use).
    """
    class Server(_Server):
        address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    Server.max_connections = max_connections

    class Handler(_Handler):
        timeout = io_timeout_s

    app = _Budgeted(_app(metrics, requests, const), render_share)
    server = make_server(host, port, app, Server, handler_class=Handler)
    thread = threading.Thread(target=server.serve_forever, name="kvtier-metrics", daemon=True)
    thread.start()
    return server, thread
