"""``kvtier`` command line (one click app): ``top`` and ``keys``, the commands an operator runs.

The development tools (model check, generators, diagrams), the benchmarks and the demo are not
part of the installed package: they run from a checkout (``python -m tools``, ``python -m bench``,
``python -m demo``; docs/decisions.md W1).  Each command imports its implementation lazily so
``kvtier --help`` is instant.
"""

from __future__ import annotations

import sys

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """kvtier: KV-cache hand-off between LLM prefill and decode instances."""


@cli.command()
@click.argument("urls", nargs=-1, required=True, metavar="URL [URL...]")
@click.option("--interval", "interval_s", type=click.FloatRange(0.05, 3600), default=2.0, show_default=True, help="Seconds between scrapes (the window of every rate).")
@click.option("--once", is_flag=True, help="Scrape twice, --interval apart, print one frame and exit (1 if an endpoint failed).")
def top(urls: tuple[str, ...], interval_s: float, once: bool) -> None:
    """Live view of kvtier metrics endpoints (config metrics_port): host:port or http://host:port."""
    from kvtier.top import main as run_top

    try:
        status = run_top(urls, interval_s=interval_s, once=once)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="URL") from None
    sys.exit(status)


@cli.group()
def keys() -> None:
    """CURVE key pairs for ``auth = "curve"`` (docs/security.md)."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("name")
@click.option("--endpoint", "endpoints", multiple=True, metavar="HOST[:PORT]",
              help="An address this instance serves as a producer (repeatable); consumers dial it with this key.")
def keys_generate(directory: str, name: str, endpoints: tuple[str, ...]) -> None:
    """Write NAME.key (public: copy it into peers' auth_allowed_keys_dir) and NAME.key_secret
    (this instance's auth_secret_key_file; mode 0600) into DIRECTORY. NAME is the principal."""
    from kvtier.transport.curve import generate_keys

    try:
        pub, sec = generate_keys(directory, name, endpoints)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    click.echo(f"public: {pub}\nsecret: {sec}")


def main() -> None:
    cli(prog_name="kvtier")


if __name__ == "__main__":
    main()
