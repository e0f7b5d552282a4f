"""The metrics endpoint's server holds out against idle and half-sent connections (decision O16):
whoever reaches ``metrics_port`` cannot pin threads of the engine's process for ever, nor grow
them without bound, and a scrape works again once they are gone."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from kvtier.metrics_http import serve

pytestmark = pytest.mark.timeout(60)


def _metrics_app(environ: dict, start_response) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"kvtier_up 1\n"]


def _closed_by_server(s: socket.socket, within_s: float) -> bool:
    """Whether the server closed ``s`` (EOF or reset) within ``within_s`` seconds."""
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


@pytest.fixture
def endpoint(request):
    io_timeout_s = getattr(request, "param", 1.0)
    server, thread = serve("127.0.0.1", 0, _metrics_app, None, ("t", "l"), max_connections=4, io_timeout_s=io_timeout_s)
    host, port = server.server_address[:2]
    yield server, (host, port)
    server.shutdown()
    server.server_close()
    thread.join(5)


def _scrape(address: tuple[str, int]) -> bytes:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=5) as resp:
        return resp.read()


@pytest.mark.parametrize("endpoint", [30.0], indirect=True)  # the four held ones stay held throughout
def test_connections_beyond_the_cap_are_closed_at_once_and_threads_stay_bounded(endpoint) -> None:
    server, address = endpoint
    before = threading.active_count()
    held = [socket.create_connection(address, timeout=5) for _ in range(4)]
    held[0].sendall(b"GET /metr")  # half a request line
    time.sleep(0.2)  # the server took the four
    extra = [socket.create_connection(address, timeout=5) for _ in range(20)]
    try:
        assert all(_closed_by_server(s, 2.0) for s in extra)
        assert server.refused >= 20
        assert threading.active_count() - before <= 4
    finally:
        for s in held + extra:
            s.close()
    deadline = time.monotonic() + 5  # their threads see the close and give their slots back
    while True:
        try:
            assert _scrape(address) == b"kvtier_up 1\n"
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_silent_connection_is_closed_after_the_io_timeout_and_frees_its_slot(endpoint) -> None:
    server, address = endpoint
    silent = [socket.create_connection(address, timeout=5) for _ in range(4)]  # every slot
    try:
        silent[1].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        t0 = time.monotonic()
        assert all(_closed_by_server(s, 5.0) for s in silent)
        assert 0.8 <= time.monotonic() - t0 < 5.0  # the 1 s timeout, not at once and not never
    finally:
        for s in silent:
            s.close()
    assert _scrape(address) == b"kvtier_up 1\n"


def test_a_managers_endpoint_grows_no_thread_per_idle_connection(make_manager) -> None:
    from kvtier.metrics_http import MAX_CONNECTIONS

    m = make_manager({"metrics_port": 0})
    host, port = m.metrics_address.rsplit(":", 1)
    before = threading.active_count()
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3 * MAX_CONNECTIONS)]
    try:
        for s in idle[::2]:
            s.sendall(b"GET /metr")
        time.sleep(0.5)  # the server accepted them all
        assert threading.active_count() - before <= MAX_CONNECTIONS
    finally:
        for s in idle:
            s.close()


def test_a_negative_limit_on_the_requests_page_means_every_entry_and_a_bad_one_is_said() -> None:
    import json
    import urllib.error

    class _Requests:
        capacity, finished_total = 4, 3

        def in_progress(self) -> int:
            return 0

        def as_json(self, kid, limit) -> list:
            return [{"n": i} for i in range(3)][:limit]

        def open_json(self, kid) -> list:
            return []

    server, thread = serve("127.0.0.1", 0, _metrics_app, _Requests(), ("t", "l"))
    try:
        host, port = server.server_address[:2]
        for query, n in (("", 3), ("?limit=2", 2), ("?limit=-1", 3), ("?limit=0", 3)):
            with urllib.request.urlopen(f"http://{host}:{port}/kvtier/requests{query}", timeout=5) as resp:
                assert len(json.loads(resp.read())["requests"]) == n, query
        # a typo is said, not read as "every entry"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{host}:{port}/kvtier/requests?limit=abc", timeout=5)
        assert err.value.code == 400
        assert json.loads(err.value.read()) == {"error": "limit must be an integer (0 or less: every entry), got 'abc'"}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("share", [0.25, 1.0])
def test_pages_are_rendered_one_at_a_time_within_their_share_of_a_thread(share) -> None:
    """Eight clients ask at once for a page that takes ~20 ms of CPU to render: renders never
    overlap, and each starts at least ``cpu × (1/share − 1)`` after the one before ended (a flood
    of scrapes took the interpreter from the I/O loop; decision O18).  Lower bounds only: a slow
    host spaces renders further apart, never closer."""
    spans: list[tuple[float, float, float]] = []  # (start, end, cpu) of each render

    def heavy(environ: dict, start_response) -> list[bytes]:
        t0, c0 = time.monotonic(), time.thread_time()
        while time.thread_time() - c0 < 0.02:
            pass
        spans.append((t0, time.monotonic(), time.thread_time() - c0))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"kvtier_up 1\n"]

    server, thread = serve("127.0.0.1", 0, heavy, None, ("t", "l"), max_connections=16, io_timeout_s=30.0,
                           render_share=share)
    try:
        address = server.server_address[:2]
        got: list[bytes] = []
        clients = [threading.Thread(target=lambda: got.append(_scrape(address))) for _ in range(8)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(30)
        assert got == [b"kvtier_up 1\n"] * 8  # every request answered: a request waits, never refused
        spans.sort()
        for (_, end, cpu), (start, _, _) in zip(spans, spans[1:]):
            assert start >= end, spans  # one at a time
            assert start - end >= cpu * (1 / share - 1) - 1e-3, (share, spans)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
