"""``kvtier`` command line (one click app): ``top``, ``why``, ``check-config`` and ``keys``, the
commands an operator runs.

The development tools (model check, generators, diagrams), the benchmarks and the demo are not
part of the installed package: they run from a checkout (``python -m tools``, ``python -m bench``,
``python -m demo``; docs/decisions.md W1).  Each command imports its implementation lazily so
``kvtier --help`` is instant.  Help texts are plain text (click prints them as written): no
reStructuredText markup.
"""

from __future__ import annotations

import os
import sys

import click


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from kvtier.version import describe

        click.echo(describe())
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Print kvtier's version, its wire protocol and the vLLM and NIXL releases it is tested with.")
def cli() -> None:
    """kvtier: KV-cache hand-off between LLM prefill and decode instances."""


@cli.command()
@click.argument("urls", nargs=-1, required=True, metavar="ENDPOINT [ENDPOINT...]")
@click.option("--interval", "interval_s", type=click.FloatRange(0.05, 3600), default=2.0, show_default=True,
              help="Seconds between scrapes (the window of every rate).")
@click.option("--once", is_flag=True,
              help="Scrape twice, --interval apart (an endpoint that failed the first is not asked again), "
                   "print one frame and exit (1 if an endpoint failed).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds to wait for the endpoints' answers (they are read at once).")
def top(urls: tuple[str, ...], interval_s: float, once: bool, timeout_s: float) -> None:
    """Live view of kvtier metrics endpoints, one row each, and their last finished requests
    (failures first).

    ENDPOINT: host:port (e.g. 10.0.0.5:9464) or http://host:port, a tier's host and metrics_port
    (or vLLM's /metrics: a data-parallel deployment's ranks get a row each, by listener).
    """
    from kvtier.top import main as run_top

    try:
        status = run_top(urls, interval_s=interval_s, once=once, timeout_s=timeout_s)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ENDPOINT") from None
    sys.exit(status)


@cli.command()
@click.argument("kv_request_id")
@click.argument("endpoints", nargs=-1, required=True, metavar="ENDPOINT [ENDPOINT...]")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoints' records as JSON instead.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds to wait for the endpoints' answers (they are read at once).")
def why(kv_request_id: str, endpoints: tuple[str, ...], as_json: bool, timeout_s: float) -> None:
    """Explain how KV_REQUEST_ID ended: its states, timeline, peer and bytes, and for a failure what
    the reason means and what to change. A request still in progress (blocks parked, a fetch out,
    a transfer being served) is shown as such, with its states so far and what it waits for.

    ENDPOINT: the metrics endpoint (host:port, the tier's metrics_port) of the decode engine, the
    prefill engine, or both. Each keeps its last 1024 finished requests. Exit status 1 when no
    endpoint knows the id.
    """
    import json

    from kvtier.explain import UNREADABLE, as_sent, explain, explain_open
    from kvtier.top import NotAnEndpoint, each, fetch_requests, requests_url, unreachable
    from kvtier.wire.messages import check_kv_request_id

    try:
        check_kv_request_id(kv_request_id)
    except ValueError as exc:
        raise click.BadParameter(f"{kv_request_id!r} is not a kv_request_id: {exc}", param_hint="KV_REQUEST_ID") from None
    for endpoint in endpoints:  # every endpoint well-formed before any is read
        try:
            requests_url(endpoint, kv_request_id)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="ENDPOINT") from None
    found, problems, records = 0, [], {}
    docs = each(lambda e: fetch_requests(e, kv_request_id, timeout_s=timeout_s), endpoints)  # at once
    for endpoint, doc in zip(endpoints, docs):
        if isinstance(doc, OSError):
            problems.append(f"{endpoint}: cannot read it: {unreachable(doc)}")
            continue
        if isinstance(doc, NotAnEndpoint):
            problems.append(f"{endpoint} is not a kvtier metrics endpoint: {doc}")
            continue
        if isinstance(doc, Exception):
            raise doc
        entries, opened = doc.get("requests", []), doc.get("open", [])
        records[endpoint] = doc
        if not entries and not opened:
            problems.append(f"{endpoint}: {kv_request_id!r} is not among its last {doc.get('capacity', '?')} "
                            "finished requests, nor in progress there")
        for tell, e in [(explain_open, e) for e in opened] + [(explain, e) for e in entries]:
            found += 1
            if as_json:
                continue
            try:
                click.echo(tell(e, where=f"{endpoint}, listener {doc.get('listener', '?')}"))
            except UNREADABLE as exc:
                click.echo(f"{endpoint}: {as_sent(e, exc, what=f'a record of {kv_request_id!r}', indent=2)}")
            click.echo()
    if as_json:
        click.echo(json.dumps(records, indent=2))
    for line in problems:
        click.echo(line, err=True)
    sys.exit(0 if found else 1)


@cli.command("check-config")
@click.argument("config", metavar="KV_TRANSFER_CONFIG")
def check_config(config: str) -> None:
    """Check a vLLM --kv-transfer-config for kvtier before an engine starts: every kvtier entry is
    validated as kvtier would (each error names the key), and the mistakes vLLM decides before
    kvtier runs are found too (a "type" of vLLM's own tiers such as "p2p", a "type" or "module_path" vLLM cannot load, a "backpressure" key, a "tier_poll_interval_s" vLLM cannot read or below 0, a "cpu_bytes_to_use" vLLM cannot read or 0, a missing one said as a note).

    A MultiConnector config is checked through its "connectors": kvtier's entry in the
    OffloadingConnector among them. One tier entry alone (an object with a "type" or "module_path"
    and no "kv_connector") is checked as the only entry of an OffloadingConnector's secondary_tiers
    (a "note:" line says so). Each kvtier entry that passes gets an "ok:" line ("entry ok:" when
    the config has a problem elsewhere, ending with the SECURITY warnings the engine will log), advice a
    "note:" line, each problem a "problem:" line on stderr.

    KV_TRANSFER_CONFIG: the JSON text, or @FILE to read it from a file. CURVE key files are read as the
    engine reads them, on this host, and NIXL must import here for data_plane "nixl". Exit status 1
    on a problem in the config, 2 when it cannot be read or is not a JSON object.
    """
    from kvtier.vllmconfig import Advice, check_kv_transfer_config

    path = config[1:] if config.startswith("@") else None
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                config = f.read()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {path!r}: {exc.strerror}", param_hint="KV_TRANSFER_CONFIG")
        except UnicodeDecodeError:  # e.g. an editor's UTF-16: never read, so not "a problem in the config"
            raise click.BadParameter(f"{path!r} is not UTF-8 text: save it as UTF-8 (JSON is UTF-8)",
                                     param_hint="KV_TRANSFER_CONFIG") from None
    try:
        problems, notes = check_kv_transfer_config(config)
    except ValueError as exc:
        raise click.BadParameter(_not_json(str(exc), config, path), param_hint="KV_TRANSFER_CONFIG") from None
    except RecursionError:
        raise click.BadParameter("it is nested too deeply to be read (a kv-transfer-config is a shallow JSON "
                                 "object)", param_hint="KV_TRANSFER_CONFIG") from None
    passed = "entry ok" if problems else "ok"  # an entry that passes beside a problem: not the config
    for line in notes:
        click.echo(f"{'note' if isinstance(line, Advice) else passed}: {line}")
    for line in problems:
        click.echo(f"problem: {line}", err=True)
    sys.exit(1 if problems else 0)


def _not_json(why: str, text: str, path: str | None) -> str:
    """``why`` the config could not be read, with the likely slip: a file named without ``@``, or
    a file that is not JSON (vLLM's --kv-transfer-config is JSON text)."""
    stripped = text.strip()
    if path is None and stripped and not stripped.startswith("{") and os.path.isfile(stripped):
        return f"{why}: {stripped!r} is a file: did you mean @{stripped}?"
    if path is not None and not stripped.startswith(("{", "[")):
        return (f"{why}: {path!r} is not JSON (vLLM's --kv-transfer-config is JSON text; YAML is not read): "
                "write it as a JSON object")
    return why


@cli.group()
def keys() -> None:
    """CURVE key pairs for auth = "curve" (docs/security.md)."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("name")
@click.option("--endpoint", "endpoints", multiple=True, metavar="HOST[:PORT]",
              help="An address this instance serves as a producer (repeatable); consumers dial it with this key.")
def keys_generate(directory: str, name: str, endpoints: tuple[str, ...]) -> None:
    """Write NAME.key (public: copy it into every peer's auth_allowed_keys_dir) and
    NAME.key_secret (this instance's auth_secret_key_file; mode 0600) into DIRECTORY. NAME is the
    principal peers know this instance by."""
    from kvtier.transport.curve import generate_keys

    try:
        pub, sec = generate_keys(directory, name, endpoints)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    except OSError as exc:  # the directory cannot be made or written
        raise click.BadParameter(f"cannot write the keys into {directory!r}: {exc.strerror or exc}; give a directory "
                                 "this user can create or write") from None
    click.echo(f"public: {pub}  (copy into every peer's auth_allowed_keys_dir)\n"
               f"secret: {sec}  (this instance's auth_secret_key_file; keep it here)")


def main() -> None:
    cli(prog_name="kvtier")


if __name__ == "__main__":
    main()
