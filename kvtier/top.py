"""``kvtier top URL [URL...]``: a live terminal view of kvtier metrics endpoints.

Each URL is a kvtier endpoint (config ``metrics_port``; ``host:port`` or ``http://host:port``,
``/metrics`` is implied).  Every ``interval`` seconds each endpoint is scraped over HTTP, the text
exposition is parsed with ``prometheus_client.parser``, and one row per endpoint shows what an
operator of a PD deployment asks first: ids parked / bound / retained, pinned GB, the age of the
oldest parked id, transfer bandwidth, and the rates of late fetches and failed jobs.  Below the
table: the endpoints' most recently finished requests, failures first (``GET /kvtier/requests``,
:mod:`kvtier.forensics`; ``kvtier why`` explains one).

Rates are differences between two scrapes divided by the wall time between them, so the first
frame of a live view shows ``—`` for them; ``--once`` scrapes twice (``interval`` apart) and
prints one complete frame.  Bandwidth is ``Δ kvtier_transfer_bytes_sum / Δt`` (bytes that
completed per second of wall time); "per transfer" is the mean of the per-transfer throughput
histogram over the window — never bytes divided by summed durations, which undercounts
overlapping transfers (vllm-project/vllm#48224).
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from kvtier.errors import KvTierError
from kvtier.lifecycle import Reason
from kvtier.metrics import REQUESTS_PATH

__all__ = ["NotAnEndpoint", "Row", "Snapshot", "by_listener", "each", "endpoint_url", "fetch_requests", "main",
           "recent", "render", "requests_url", "row", "scrape", "speaks_zmtp"]

_LATE = (Reason.REAPED.value, Reason.ALREADY_SERVED.value)
"""Refusal reasons that mean the consumer came after the producer let go of the id."""


_EXAMPLE = "host:port (e.g. 10.0.0.5:9464) or http://host:port, the host and metrics_port of a kvtier tier"


def _split(target: str) -> tuple[str, str, str]:
    """``(scheme, host:port, path)`` of an endpoint given as ``host:port`` or a URL."""
    given = target
    target = target.strip()
    if not target:
        raise ValueError(f"an endpoint is empty: give {_EXAMPLE}")
    if "://" not in target:
        target = "http://" + target
    scheme, _, rest = target.partition("://")
    hostport, _, path = rest.partition("/")
    host, colon, port = hostport.rsplit("]", 1)[-1].rpartition(":")
    if scheme not in ("http", "https") or not colon or not (port.isascii() and port.isdigit()) \
            or not (host or hostport.startswith("[")):  # a bare "9464" is a port without its host
        raise ValueError(f"{given!r} is not a metrics endpoint: give {_EXAMPLE}")
    if not 0 < int(port) < 65536:
        raise ValueError(f"{given!r}: port {port} is not 1..65535: give {_EXAMPLE}")
    return scheme, hostport, path


def endpoint_url(target: str) -> str:
    """``host:port`` or ``http(s)://host:port[/path]`` → the URL to scrape (``/metrics`` implied).

    Raises:
        ValueError: ``target`` is empty or has no port (the message shows what a target looks like).
    """
    scheme, hostport, path = _split(target)
    return f"{scheme}://{hostport}/{path or 'metrics'}"


def requests_url(target: str, kv_request_id: str | None = None, limit: int | None = None) -> str:
    """The URL of ``target``'s recently finished requests (``GET /kvtier/requests``, JSON; any path
    given with ``target`` is replaced).

    Raises:
        ValueError: ``target`` is not an endpoint (see :func:`endpoint_url`).
    """
    scheme, hostport, _ = _split(target)
    query = urllib.parse.urlencode({k: v for k, v in (("kv_request_id", kv_request_id), ("limit", limit)) if v})
    return f"{scheme}://{hostport}{REQUESTS_PATH}" + (f"?{query}" if query else "")


_ZMTP_PORT = ("it is a kvtier tier's own port (it speaks ZMTP, not HTTP): give that tier's metrics_port (config "
              "key metrics_port; unset or null: no metrics endpoint; 0: a free port, which the tier's INFO log line "
              "'kvtier: metrics on' names)")


def speaks_zmtp(hostport: str, timeout_s: float = 0.5) -> bool:
    """Whether ``host:port`` greets a new TCP connection with a ZMTP signature (``0xFF``, eight bytes,
    ``0x7F``) before it is sent anything — a kvtier tier's ``port``, often given where its
    ``metrics_port`` belongs; an HTTP server says nothing first.  Asked only after a read failed, so
    a working endpoint pays nothing.  False when it cannot be reached or says anything else."""
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as s:
            got = b""
            while len(got) < 10:
                chunk = s.recv(10 - len(got))
                if not chunk:
                    break
                got += chunk
    except (OSError, ValueError):
        return False
    return len(got) == 10 and got[0] == 0xFF and got[9] == 0x7F


_FIX = "give the tier's host and metrics_port (its port takes the tier's own connections)"


class _Greeted(http.client.HTTPException):
    """The endpoint spoke first, with a ZMTP signature's first byte: not an HTTP server."""


class _HTTPConnection(http.client.HTTPConnection):
    """An HTTP connection that looks at the answer's first byte before parsing it: a ZMTP peer (a
    tier's own port) greets every connection with ``0xFF`` and then waits for ours, so a status line
    read from it would wait out the whole timeout; an HTTP answer starts with ``H``.  The byte is
    only peeked, so a working endpoint pays nothing."""

    def getresponse(self) -> http.client.HTTPResponse:
        if self.sock is not None and self.sock.recv(1, socket.MSG_PEEK) == b"\xff":
            raise _Greeted("the endpoint greeted with a ZMTP signature")
        return super().getresponse()


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


_OPENER = urllib.request.build_opener(_HTTPHandler)


def _urlopen(url: str, timeout_s: float) -> Any:
    """``urllib.request.urlopen``, but an endpoint that greets like ZMTP fails at once (:class:`_HTTPConnection`)."""
    return _OPENER.open(url, timeout=timeout_s)


def _what_answered(exc: BaseException, hostport: str) -> str | None:
    """After a read of ``hostport`` failed with ``exc`` (a connection error, a timeout, or an
    answer that is not HTTP): what answered there when it is known — a tier's own ZMTP port, or a
    service that does not speak HTTP — with the fix; None for anything else (the error says it).
    After a timeout nothing more is asked: a ZMTP port greets at once (:class:`_HTTPConnection`
    sees it), and a second wait would put the caller past its ``--timeout``."""
    if not _timed_out(exc) and speaks_zmtp(hostport):
        return _ZMTP_PORT
    if isinstance(exc, http.client.HTTPException):  # e.g. BadStatusLine: another service
        return f"it does not answer HTTP ({type(exc).__name__}): {_FIX}"
    return None


def _timed_out(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)


_T = TypeVar("_T")
_R = TypeVar("_R")
MAX_READERS = 16
"""Endpoints :func:`each` reads at once."""


def each(fn: Callable[[_T], _R], targets: Sequence[_T]) -> list[_R | Exception]:
    """``fn(target)`` for every target at once (a thread each, at most :data:`MAX_READERS`), in the
    targets' order; an exception ``fn`` raised stands in its place.  So several endpoints cost one
    ``--timeout``, not one each."""
    def call(t: _T) -> _R | Exception:
        try:
            return fn(t)
        except Exception as exc:  # noqa: BLE001 - handed to the caller, which knows what each means
            return exc

    if len(targets) <= 1:
        return [call(t) for t in targets]
    with ThreadPoolExecutor(max_workers=min(MAX_READERS, len(targets)), thread_name_prefix="kvtier-read") as ex:
        return list(ex.map(call, targets))


def unreachable(exc: OSError) -> str:
    """Why an endpoint could not be read (``exc``: from ``urlopen``, ``urllib.error.URLError``
    included), in words, with what to check."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused: is the tier's metrics_port this port?"  # short: it fills a table cell
    if isinstance(exc, TimeoutError):
        # urllib wraps what fails before the request left (the connect) in URLError: a bare
        # timeout came while waiting for the answer, so the host and its kernel are up
        return "connected, no answer within --timeout: its process is stalled (stopped, swapping, blocked)"
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return "no answer within --timeout: a host down or a firewall"
    if isinstance(reason, ssl.SSLError):
        return "plain HTTP, not TLS: give http://HOST:PORT or HOST:PORT"
    if isinstance(reason, socket.gaierror):
        return f"its host name does not resolve ({reason.strerror or reason})"
    return f"{type(exc).__name__}: {exc}"[:160]


class NotAnEndpoint(KvTierError):
    """Something answered at an endpoint, but not as a kvtier metrics endpoint: its message says what
    answered and what to give instead (most often the tier's ``port`` given for its ``metrics_port``)."""


def fetch_requests(target: str, kv_request_id: str | None = None, limit: int | None = None,
                   timeout_s: float = 5.0) -> dict[str, Any]:
    """The JSON of ``target``'s ``/kvtier/requests`` (see :mod:`kvtier.forensics`): an object whose
    ``requests`` and ``open`` are lists of records.

    Raises:
        ValueError: ``target`` is not an endpoint.
        OSError: the endpoint cannot be read (``urllib.error.URLError`` included).
        NotAnEndpoint: what answered is not a kvtier metrics endpoint (not HTTP, no such page, not
            kvtier's JSON).
    """
    url = requests_url(target, kv_request_id, limit)
    try:
        with _urlopen(url, timeout_s) as resp:  # noqa: S310 - operator-given URL
            body = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        raise NotAnEndpoint(f"it has no {REQUESTS_PATH} page (HTTP 404: not kvtier, or a kvtier before "
                            f"that page): {_FIX}") from None
    except (OSError, http.client.HTTPException) as exc:
        why = _what_answered(exc, _split(target)[1])
        if why is not None:
            raise NotAnEndpoint(why) from None
        raise
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        doc = None
    lists = [doc.get(k, []) for k in ("requests", "open")] if isinstance(doc, dict) else [None]
    if not all(isinstance(v, list) and all(isinstance(e, dict) for e in v) for v in lists):
        raise NotAnEndpoint(f"its {REQUESTS_PATH} is not kvtier's list of requests: {_FIX}")
    return doc


@attrs.frozen
class Snapshot:
    """One scrape of one endpoint: ``samples`` maps ``(name, ((label, value), ...))`` to a value;
    ``t`` is ``time.monotonic()`` at the scrape (seconds); ``error`` is set when it failed."""

    url: str
    t: float
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = attrs.field(factory=dict)
    error: str = ""

    def total(self, name: str, **labels: str | tuple[str, ...]) -> float:
        """Sum of every sample ``name`` whose labels match (a tuple value matches any of its items)."""
        out = 0.0
        for (n, lbls), v in self.samples.items():
            if n != name:
                continue
            have = dict(lbls)
            if all(have.get(k) in (want if isinstance(want, tuple) else (want,)) for k, want in labels.items()):
                out += v
        return out

    def label(self, name: str, label: str) -> str:
        """The value of ``label`` on the first sample of ``name`` ('' if none)."""
        for (n, lbls), _ in self.samples.items():
            if n == name:
                return dict(lbls).get(label, "")
        return ""


def scrape(url: str, timeout_s: float = 5.0, *, clock: Callable[[], float] = time.monotonic) -> Snapshot:
    """GET ``url`` and parse the Prometheus text exposition (never raises for an unreachable or
    malformed endpoint: the snapshot's ``error`` says what went wrong)."""
    t = clock()
    try:
        with _urlopen(url, timeout_s) as resp:  # noqa: S310 - operator-given URL
            text = resp.read().decode("utf-8", "replace")
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        ours = False  # a kvtier family, even with no sample yet (vLLM adds its children at the first stats)
        for family in text_string_to_metric_families(text):
            ours = ours or family.name.startswith(("kvtier_", "vllm:kvtier_"))
            for s in family.samples:
                # vLLM's own /metrics carries kvtier's series as vllm:kvtier_* (its stats bridge)
                name = s.name.removeprefix("vllm:") if s.name.startswith("vllm:kvtier_") else s.name
                samples[name, tuple(sorted(s.labels.items()))] = s.value
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError is an OSError
        if isinstance(exc, urllib.error.HTTPError):  # an HTTP server, not a tier's metrics page
            why = f"not a kvtier metrics endpoint: its /metrics answers HTTP {exc.code}: {_FIX}"
        elif isinstance(exc, ValueError):  # an HTTP page that is not Prometheus text
            why = f"not a kvtier metrics endpoint: its /metrics is not Prometheus text: {_FIX}"
        else:
            why = _what_answered(exc, _split(url)[1]) or (
                unreachable(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"[:160])
        return Snapshot(url, t, error=why)
    if not ours:
        return Snapshot(url, t, error="no kvtier series at this endpoint: point it at a tier's host and metrics_port "
                                      "(or at vLLM's /metrics of an engine that runs kvtier)")
    return Snapshot(url, t, samples)


def by_listener(snap: Snapshot) -> list[tuple[str, Snapshot]]:
    """``(listener, snapshot)`` per kvtier tier behind an endpoint, told apart by their ``listener``
    label: vLLM's /metrics of a data-parallel deployment carries every rank's tier (summed, the
    ranks' figures read as one tier's).  An endpoint with one tier, or an error, stays whole
    (listener ``""``)."""
    if snap.error:
        return [("", snap)]
    groups: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for key, value in snap.samples.items():
        groups.setdefault(dict(key[1]).get("listener", ""), {})[key] = value
    named = sorted(lst for lst in groups if lst)
    if len(named) <= 1:
        return [("", snap)]
    return [(lst, Snapshot(snap.url, snap.t, groups[lst])) for lst in named]


@attrs.frozen
class Row:
    """What one endpoint shows. Rates are ``None`` until two scrapes exist."""

    url: str
    listener: str = ""
    parked: float = 0.0
    bound: float = 0.0
    retained: float = 0.0
    pinned_gb: float = 0.0
    oldest_park_s: float = 0.0
    sessions: float = 0.0
    out_gbps: float | None = None
    in_gbps: float | None = None
    per_transfer_gbps: float | None = None
    late_per_s: float | None = None
    failed_per_s: float | None = None
    error: str = ""


def _rate(prev: Snapshot | None, cur: Snapshot, name: str, **labels: Any) -> float | None:
    if prev is None or prev.error or cur.t <= prev.t:
        return None
    return max(0.0, cur.total(name, **labels) - prev.total(name, **labels)) / (cur.t - prev.t)


def row(prev: Snapshot | None, cur: Snapshot) -> Row:
    """One endpoint's row from its latest scrape and the one before (``None`` for the first)."""
    if cur.error:
        return Row(cur.url, error=cur.error)
    parked = cur.total("kvtier_parked_ids", state="parked")
    per_transfer = None
    if prev is not None and not prev.error:
        n = cur.total("kvtier_transfer_throughput_bytes_per_second_count") - prev.total(
            "kvtier_transfer_throughput_bytes_per_second_count")
        s = cur.total("kvtier_transfer_throughput_bytes_per_second_sum") - prev.total(
            "kvtier_transfer_throughput_bytes_per_second_sum")
        per_transfer = s / n / 1e9 if n > 0 else None
    out_bps = _rate(prev, cur, "kvtier_transfer_bytes_sum", role="producer")
    in_bps = _rate(prev, cur, "kvtier_transfer_bytes_sum", role="consumer")
    return Row(
        url=cur.url,
        listener=cur.label("kvtier_parked_ids", "listener"),
        parked=parked,
        bound=cur.total("kvtier_parked_ids") - parked,
        retained=cur.total("kvtier_retained_ids"),
        pinned_gb=cur.total("kvtier_pinned_bytes") / 1e9,
        oldest_park_s=cur.total("kvtier_oldest_parked_age_seconds"),
        sessions=cur.total("kvtier_sessions", state="ready"),
        out_gbps=None if out_bps is None else out_bps / 1e9,
        in_gbps=None if in_bps is None else in_bps / 1e9,
        per_transfer_gbps=per_transfer,
        late_per_s=_rate(prev, cur, "kvtier_fetches_refused_total", reason=_LATE),
        failed_per_s=_rate(prev, cur, "kvtier_jobs_total", outcome="fail"),
    )


_GBPS = "{:.3g}"  # 3 significant digits: 0.00214 and 23.4 both read well


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if x is None or math.isnan(x) else fmt.format(x)


_COLUMNS: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("parked", lambda r: _num(r.parked, "{:.0f}")),
    ("bound", lambda r: _num(r.bound, "{:.0f}")),
    ("retained", lambda r: _num(r.retained, "{:.0f}")),
    ("pinned GB", lambda r: _num(r.pinned_gb, "{:.3f}")),
    ("oldest park s", lambda r: _num(r.oldest_park_s, "{:.1f}")),
    ("sessions", lambda r: _num(r.sessions, "{:.0f}")),
    ("out GB/s", lambda r: _num(r.out_gbps, _GBPS)),
    ("in GB/s", lambda r: _num(r.in_gbps, _GBPS)),
    ("GB/s per transfer", lambda r: _num(r.per_transfer_gbps, _GBPS)),
    ("late fetch/s", lambda r: _num(r.late_per_s)),
    ("failed jobs/s", lambda r: _num(r.failed_per_s)),
)


def _wide_width(rows: Sequence[Row]) -> int:
    """Columns the one-line-per-endpoint table needs (rich: a border and two spaces per cell)."""
    cols = [[r.url for r in rows], [r.error or r.listener for r in rows],
            *[[get(r) for r in rows] for _, get in _COLUMNS]]
    heads = ["endpoint", "listener", *[h for h, _ in _COLUMNS]]
    return 1 + sum(max(len(h), *(len(c) for c in col)) + 3 for h, col in zip(heads, cols))


def render(rows: Sequence[Row], interval_s: float, width: int | None = None) -> Table:
    """The frame: one line per endpoint; on a console narrower than that table (``width``, in
    columns), one column per endpoint instead, so that every figure stays readable at 80 columns."""
    # live, also its refresh; --once, the time between its two scrapes
    title = f"kvtier top — rates over the last {interval_s:g} s"
    if width is not None and rows and _wide_width(rows) > width:
        t = Table(title=title, title_justify="left")
        t.add_column("", justify="left", no_wrap=True)
        for r in rows:
            t.add_column(r.url.removeprefix("http://").removesuffix("/metrics"), justify="right", overflow="fold")
        t.add_row("listener", *[r.listener if not r.error else "[red]unreachable[/]" for r in rows])
        for head, get in _COLUMNS:
            t.add_row(head, *["—" if r.error else get(r) for r in rows])
        if any(r.error for r in rows):
            t.add_row("error", *[f"[red]{r.error}[/]" if r.error else "" for r in rows])
        return t
    t = Table(title=title, title_justify="left")
    for col in ("endpoint", "listener", *[h for h, _ in _COLUMNS]):
        t.add_column(col, justify="left" if col in ("endpoint", "listener") else "right")
    for r in rows:
        if r.error:
            t.add_row(r.url, f"[red]{r.error}[/]", *["—"] * len(_COLUMNS))
            continue
        t.add_row(r.url, r.listener, *[get(r) for _, get in _COLUMNS])
    return t


RECENT = 8
"""Finished requests ``kvtier top`` shows below the table (failures first, newest first)."""


def recent(targets: Sequence[str], *, limit: int = RECENT, timeout_s: float = 5.0) -> list[tuple[str, dict[str, Any]]]:
    """``(endpoint, entry)`` of the last finished requests of every endpoint that answers
    (``GET /kvtier/requests``), failures first, then newest first; at most ``limit``."""
    out: list[tuple[str, dict[str, Any]]] = []
    docs = each(lambda t: fetch_requests(t, limit=4 * limit, timeout_s=timeout_s), targets)
    for target, doc in zip(targets, docs):
        if isinstance(doc, (OSError, ValueError, NotAnEndpoint)):  # unreachable, or not kvtier's: the table says so
            continue
        if isinstance(doc, Exception):
            raise doc
        name = _split(target)[1]
        out += [(name, e) for e in doc.get("requests", ())]
    out.sort(key=lambda pair: (bool(pair[1].get("ok")), _number(pair[1].get("ago"))))
    return out[:limit]


def render_recent(entries: Sequence[tuple[str, dict[str, Any]]]) -> Table:
    """The recently finished requests below the frame (``kvtier why ID ENDPOINT`` explains one)."""
    from kvtier.explain import UNREADABLE, as_sent, one_line

    t = Table(title="recently finished — kvtier why KV_REQUEST_ID ENDPOINT explains one", title_justify="left")
    t.add_column("endpoint", no_wrap=True)
    t.add_column("request", overflow="fold")
    for endpoint, e in entries:
        try:
            line = escape(one_line(e))
        except UNREADABLE as exc:
            line = escape(f"({as_sent(e, exc, limit=300)})")
        t.add_row(endpoint, f"[red]{line}[/]" if not e.get("ok") else line)
    return t


def _number(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0.0


def main(targets: Iterable[str], *, interval_s: float = 2.0, once: bool = False,
         console: Console | None = None, timeout_s: float = 5.0) -> int:
    """Run the view until interrupted (or one frame with ``once``). Returns the exit status:
    0, or 1 when ``once`` and an endpoint could not be scraped.

    Below the table: the last finished requests of every endpoint, failures first
    (:func:`recent`).

    Raises:
        ValueError: a target is not ``host:port`` / a URL.
    """
    targets = list(targets)
    urls = [endpoint_url(t) for t in targets]
    console = console or Console()
    prev: dict[tuple[str, str], Snapshot] = {}  # (url, listener) -> its last scrape

    failed: dict[str, Snapshot] = {}  # --once: an endpoint whose first scrape failed is not asked again

    def frame() -> tuple[Group, bool]:
        rows = []
        answered = []  # the targets with a scrape that worked (for their finished requests)
        snaps = each(lambda u: failed.get(u) or scrape(u, timeout_s), urls)  # all at once: one --timeout in all
        for target, url, snap in zip(targets, urls, snaps):
            if isinstance(snap, Exception):
                raise snap
            for listener, cur in by_listener(snap):  # a row per tier (vLLM: per DP rank)
                key = (url, listener)
                rows.append(row(prev.get(key), cur))
                prev[key] = cur
                if not cur.error and target not in answered:
                    answered.append(target)
        parts: list[Any] = [render(rows, interval_s, console.width)]
        done = recent(answered, timeout_s=timeout_s)
        if done:
            parts.append(render_recent(done))
        return Group(*parts), any(r.error for r in rows)

    if once:
        frame()
        failed.update((k[0], snap) for k, snap in prev.items() if snap.error)
        time.sleep(interval_s)
        table, any_failed = frame()
        console.print(table)
        return 1 if any_failed else 0
    table, _ = frame()
    try:
        with Live(table, console=console, refresh_per_second=4, transient=False) as live:
            while True:
                time.sleep(interval_s)
                live.update(frame()[0])
    except KeyboardInterrupt:
        return 0
