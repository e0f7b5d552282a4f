"""``kvtier top``: one frame of a live producer and consumer endpoint, plus a dead one."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from kvtier.cli import cli
from kvtier.top import Snapshot, endpoint_url, row
from kvtier.lifecycle import ProducerState
from mgr_helpers import job, keys_for, producer_req, pump_until, serve_http, transfer_once

pytestmark = pytest.mark.timeout(60)


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parked(m, kid: str) -> bool:
    with m.lock:
        return m.core.producer_state(kid) is ProducerState.PARKED


def _cells(output: str, first: str) -> list[str]:
    """The cells of the table line that starts with ``first`` (rich draws │ between cells)."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│ \n").split("│")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row for {first!r} in:\n{output}")


def test_top_renders_live_endpoints(make_manager) -> None:
    cfg = {"metrics_port": 0, "background_poll": True}
    p = make_manager(cfg, block_bytes=65536)
    c = make_manager(cfg, block_bytes=65536)
    # one id served to the consumer, one left parked
    assert transfer_once(p, c, "kv-top", 4, poll=False).success
    held = producer_req("p2", "kv-held")
    p.on_new_request(held)
    p.submit_store(job(3, keys_for("kv-held", 2), [8, 9], held))
    p.get_finished_jobs()  # as an engine does: a store no fetch awaits waits for it or the next pass (C34)
    assert pump_until(lambda: _parked(p, "kv-held"))

    dead = f"127.0.0.1:{_dead_port()}"
    res = CliRunner().invoke(
        cli, ["top", p.metrics_address, f"http://{c.metrics_address}", dead, "--once", "--interval", "0.2"],
        env={"COLUMNS": "250"})
    assert res.exit_code == 1, res.output  # one endpoint could not be scraped
    out = res.output
    prow = _cells(out, f"http://{p.metrics_address}/metrics")
    crow = _cells(out, f"http://{c.metrics_address}/metrics")
    drow = _cells(out, f"http://{dead}/metrics")
    # endpoint, listener, parked, bound, retained, pinned GB, oldest park s, sessions, out, in, per transfer, late, failed
    assert prow[1] == p.address and crow[1] == c.address
    assert prow[2:6] == ["1", "0", "1", f"{2 * 65536 / 1e9:.3f}"]  # kv-held parked, kv-top done
    assert float(prow[6]) >= 0 and prow[7] == "1"
    assert crow[2:5] == ["0", "0", "0"] and crow[7] == "1"
    for cells in (prow, crow):  # two scrapes: every rate is a number (no transfer in the window)
        assert [float(x) for x in (cells[8], cells[9], cells[11], cells[12])] == [0.0] * 4, cells
    assert drow[1] == "connection refused: is the tier's metrics_port this port?", drow


def test_rates_come_from_the_difference_of_two_scrapes() -> None:
    def snap(t: float, sent: float, n: float, thr: float, late: float, failed: float) -> Snapshot:
        return Snapshot("u", t, {
            ("kvtier_transfer_bytes_sum", (("role", "producer"),)): sent,
            ("kvtier_transfer_throughput_bytes_per_second_count", (("role", "producer"),)): n,
            ("kvtier_transfer_throughput_bytes_per_second_sum", (("role", "producer"),)): thr,
            ("kvtier_fetches_refused_total", (("reason", "reaped"),)): late,
            ("kvtier_fetches_refused_total", (("reason", "aborted"),)): 7.0,
            ("kvtier_jobs_total", (("kind", "store"), ("outcome", "fail"), ("reason", "reaped"))): failed,
        })

    first = row(None, snap(10.0, 0, 0, 0, 0, 0))
    assert first.out_gbps is None and first.late_per_s is None  # one scrape: no rate yet
    r = row(snap(10.0, 0, 0, 0, 0, 0), snap(12.0, 4e9, 2, 6e9, 1, 2))
    assert r.out_gbps == pytest.approx(2.0)  # 4 GB completed in 2 s of wall time
    assert r.per_transfer_gbps == pytest.approx(3.0)  # mean of the two transfers' own throughput
    assert r.late_per_s == pytest.approx(0.5) and r.failed_per_s == pytest.approx(1.0)


@pytest.mark.parametrize(("target", "url"), [
    ("127.0.0.1:9464", "http://127.0.0.1:9464/metrics"),
    ("http://h:1/", "http://h:1/metrics"),
    ("https://h:1/custom", "https://h:1/custom"),
    ("[::1]:9464", "http://[::1]:9464/metrics"),
])
def test_endpoint_urls(target: str, url: str) -> None:
    assert endpoint_url(target) == url


@pytest.mark.parametrize("target", ["", "localhost", "http://h/metrics", "[::1]", "127.0.0.1:99999", "h:0", "9464", ":9464"])
def test_a_target_without_a_port_is_refused_by_name(target: str) -> None:
    res = CliRunner().invoke(cli, ["top", target, "--once"])
    assert res.exit_code == 2 and ("host:port" in res.output or "empty" in res.output), res.output


def test_top_at_80_columns_shows_one_column_per_endpoint(make_manager) -> None:
    """A console too narrow for one line per endpoint gets the table turned: every figure and
    the dead endpoint's error stay readable (the wide table squeezed them to two characters)."""
    cfg = {"metrics_port": 0, "background_poll": True}
    p = make_manager(cfg, block_bytes=65536)
    held = producer_req("p1", "kv-held")
    p.on_new_request(held)
    p.submit_store(job(1, keys_for("kv-held", 2), [0, 1], held))
    p.get_finished_jobs()  # as an engine does (C34)
    assert pump_until(lambda: _parked(p, "kv-held"))
    dead = f"127.0.0.1:{_dead_port()}"
    res = CliRunner().invoke(cli, ["top", p.metrics_address, dead, "--once", "--interval", "0.2"],
                             env={"COLUMNS": "80"})
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 80, res.output
    assert _cells(res.output, "parked")[1:] == ["1", "—"]
    assert _cells(res.output, "pinned GB")[1:] == [f"{2 * 65536 / 1e9:.3f}", "—"]
    assert _cells(res.output, "listener")[1] == p.address
    assert _cells(res.output, "listener")[2] == "unreachable"
    assert _cells(res.output, "error")[1:2] == [""]  # the live endpoint has none
    assert "connection refused: is the tier's" in res.output and "metrics_port this port?" in res.output, res.output


def _serve_text(text: str):
    """An HTTP endpoint that answers every GET with ``text`` (a Prometheus exposition)."""
    return serve_http(text.encode())


@pytest.mark.parametrize(("exposition", "parked"), [
    ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n", None),
    ('# TYPE vllm:kvtier_parked_ids gauge\nvllm:kvtier_parked_ids{listener="10.0.0.5:5710",state="parked"} 3.0\n', "3"),
    # an engine running kvtier before its first stats: vLLM declared the series, no sample yet
    ("# HELP vllm:kvtier_parked_ids ids parked\n# TYPE vllm:kvtier_parked_ids gauge\n", "0"),
])
def test_an_endpoint_without_kvtier_series_is_said_so(exposition: str, parked: str | None) -> None:
    """An endpoint that is not kvtier's (vLLM's own /metrics of an engine without kvtier) is an
    error row and exit 1 — it showed an idle tier, every count 0; vLLM's /metrics of an engine
    that runs kvtier carries the series as ``vllm:kvtier_*``, which count."""
    server = _serve_text(exposition)
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        res = CliRunner().invoke(cli, ["top", target, "--once", "--interval", "0.1"], env={"COLUMNS": "250"})
        if parked is None:  # an error turns the table: a row per figure, the error's among them
            assert res.exit_code == 1 and "no kvtier series at this endpoint" in _cells(res.output, "error")[1]
        else:
            assert res.exit_code == 0, res.output
            listener = "10.0.0.5:5710" if parked != "0" else ""
            assert _cells(res.output, f"http://{target}/metrics")[1:3] == [listener, parked]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("body", "status", "says"), [
    (b"no such page", 404, "its /metrics answers HTTP 404"),
    (b"<html>a web page</html>\n", 200, "its /metrics is not Prometheus text"),
])
def test_an_http_endpoint_that_is_not_kvtiers_is_named_with_the_fix(body: bytes, status: int, says: str) -> None:
    """As ``kvtier why`` says it: what answered and the fix, not a Python exception's text."""
    server = serve_http(body, status, "text/html")
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        res = CliRunner().invoke(cli, ["top", target, "--once", "--interval", "0.1"], env={"COLUMNS": "400"})
    finally:
        server.shutdown()
        server.server_close()
    assert res.exit_code == 1, res.output
    error = _cells(res.output, f"http://{target}/metrics")[1]  # wide enough: the error fills the row
    assert error.startswith("not a kvtier metrics endpoint: ") and says in error and "metrics_port" in error, error
    assert "Error" not in res.output, res.output


def test_a_data_parallel_endpoint_shows_a_row_per_tier() -> None:
    """vLLM's /metrics of a data-parallel deployment carries every rank's tier, told apart by the
    ``listener`` label: a row each (summed, two ranks' parked ids read as one tier's)."""
    exposition = (
        "# TYPE vllm:kvtier_parked_ids gauge\n"
        'vllm:kvtier_parked_ids{engine="0",listener="10.0.0.5:5710",state="parked"} 3.0\n'
        'vllm:kvtier_parked_ids{engine="1",listener="10.0.0.5:5711",state="parked"} 5.0\n'
        "# TYPE vllm:kvtier_sessions gauge\n"
        'vllm:kvtier_sessions{engine="0",listener="10.0.0.5:5710",state="ready"} 1.0\n'
        'vllm:kvtier_sessions{engine="1",listener="10.0.0.5:5711",state="ready"} 2.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 1.0\n'
    )
    server = _serve_text(exposition)
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        res = CliRunner().invoke(cli, ["top", target, "--once", "--interval", "0.1"], env={"COLUMNS": "250"})
        assert res.exit_code == 0, res.output
        rows = [[c.strip() for c in line.strip("│ \n").split("│")] for line in res.output.splitlines()
                if line.strip("│ ").startswith(f"http://{target}/metrics")]
        assert [r[1:3] for r in rows] == [["10.0.0.5:5710", "3"], ["10.0.0.5:5711", "5"]], res.output
        assert [r[7] for r in rows] == ["1", "2"], res.output  # sessions, each rank's own
    finally:
        server.shutdown()
        server.server_close()


def test_finished_requests_are_read_from_every_endpoint_that_answered(monkeypatch) -> None:
    """With a row per listener, rows and endpoints no longer pair one to one: the finished
    requests come from each endpoint that answered (not from an unreachable one, which cost its
    timeout every frame, while a healthy one listed after it was never read)."""
    import socket as socket_

    import kvtier.top as top

    two = _serve_text(
        "# TYPE kvtier_parked_ids gauge\n"
        'kvtier_parked_ids{listener="10.0.0.5:5710",state="parked"} 1.0\n'
        'kvtier_parked_ids{listener="10.0.0.5:5711",state="parked"} 2.0\n')
    one = _serve_text("# TYPE kvtier_parked_ids gauge\n"
                      'kvtier_parked_ids{listener="10.0.0.6:5710",state="parked"} 0.0\n')
    with socket_.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    asked: list[list[str]] = []
    monkeypatch.setattr(top, "recent", lambda targets, **kw: asked.append(list(targets)) or [])
    try:
        a, c = f"127.0.0.1:{two.server_address[1]}", f"127.0.0.1:{one.server_address[1]}"
        assert top.main([a, dead, c], interval_s=0.05, once=True, timeout_s=1.0) == 1  # the dead one
        assert asked and all(t == [a, c] for t in asked), asked
    finally:
        for server in (two, one):
            server.shutdown()
            server.server_close()


def test_a_finished_request_this_release_cannot_read_is_shown_as_sent() -> None:
    """Another kvtier version's (or a proxy's) record below the frame: shown as sent, the frame drawn —
    not a ``KeyError`` taking the whole multi-endpoint view down (an outside tester)."""
    from rich.console import Console

    import kvtier.top as top

    console = Console(width=200, record=True)
    bad = [("a:1", {"kv_request_id": "kv-x", "ok": False, "reason": "reaped"}),
           ("b:2", {"kv_request_id": "kv-y", "role": ["consumer"], "ok": False, "reason": "reaped", "ago": "x"})]
    console.print(top.render_recent(bad))
    text = console.export_text()
    assert text.count("a record this kvtier cannot read") == 2 and '"kv_request_id": "kv-x"' in text, text


def test_an_endpoint_that_accepts_but_never_answers_is_called_stalled_not_the_network() -> None:
    """A wedged process (stopped, swapping) whose kernel still accepts the connection: the
    operator is sent to the process, not to a firewall or a dead host."""
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(8)  # the kernel completes the handshake; nothing ever reads or answers
        port = lsock.getsockname()[1]
        res = CliRunner().invoke(cli, ["why", "--timeout", "0.5", "kv-x", f"127.0.0.1:{port}"])
    assert res.exit_code != 0, res.output
    assert "stalled" in res.output and "firewall" not in res.output, res.output


def test_an_https_url_for_a_plain_http_endpoint_names_the_fix() -> None:
    server = serve_http(b"kvtier_parked_ids 0\n")
    try:
        res = CliRunner().invoke(cli, ["why", "kv-x", f"https://127.0.0.1:{server.server_address[1]}"])
    finally:
        server.shutdown()
        server.server_close()
    assert res.exit_code != 0, res.output
    assert "plain HTTP, not TLS" in res.output and "SSL" not in res.output, res.output
