"""``kvtier`` command line: ``demo``, ``top``, ``check``, ``diagram``, ``gen``, ``bench``, ``keys``.

Each command imports its implementation lazily so ``kvtier --help`` is instant.
"""

from __future__ import annotations

import sys

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """kvtier: KV-cache hand-off between LLM prefill and decode instances."""


@cli.command()
@click.option("--prompts", "num_prompts", type=click.IntRange(1, 50), default=None, help="How many prompts of the prompt set to run (default: all).")
@click.option("--max-prompt-tokens", type=click.IntRange(64, 8192), default=2048, show_default=True, help="Longest prompt, in tokens (prompts that do not fit are skipped).")
@click.option("--max-new-tokens", type=click.IntRange(1, 512), default=24, show_default=True, help="Tokens decoded per prompt.")
@click.option("--unbound-store-timeout", "unbound_store_timeout_s", type=click.FloatRange(0.05, 3600), default=1.0, show_default=True, help="Producer park timeout (s) used for the late-consumer scenario.")
@click.option("--late-delay", "late_delay_s", type=click.FloatRange(0.0, 3600), default=None, help="How long the late consumer is held back (s); must exceed the park timeout; default: park timeout + 0.5 s.")
@click.option("--no-late", is_flag=True, help="Skip the late-consumer scenario.")
@click.option("--data-plane", type=click.Choice(["zmq", "nixl"]), default="zmq", show_default=True, help="How blocks travel: zmq frames, or NIXL one-sided WRITEs (needs nixl-cu12).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
def demo(**opts: object) -> None:
    """Disaggregated prefill/decode of SmolLM2-135M through kvtier (two processes)."""
    from kvtier.demo.run import main as run_demo

    late, park = opts["late_delay_s"], opts["unbound_store_timeout_s"]
    if late is not None and not opts["no_late"] and late <= park:  # type: ignore[operator]
        raise click.BadParameter(
            f"{late} s is not past the park timeout ({park} s): the consumer would not be late "
            "(use --no-late to skip the scenario)", param_hint="--late-delay")

    sys.exit(run_demo(**opts))


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


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def check(ctx: click.Context) -> None:
    """Exhaustive bounded model check of the lifecycle (`kvtier check --help` lists its options)."""
    from kvtier._tools.modelcheck import main as run_check

    sys.exit(run_check(list(ctx.args)))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def diagram(ctx: click.Context) -> None:
    """Render diagrams/ (DOT + SVG) and docs/review.md from the spec and recorded scenarios."""
    from kvtier._tools.diagrams import main as run_diagrams

    sys.exit(run_diagrams(list(ctx.args)))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def gen(ctx: click.Context) -> None:
    """Regenerate kvtier/lifecycle/_table.py from the spec (--check: fail if stale)."""
    from kvtier._tools.specgen import main as run_gen

    sys.exit(run_gen(list(ctx.args)))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Run the benchmark suite (--quick for a smoke run); writes docs/benchmarks/."""
    from kvtier.bench import main as run_bench

    sys.exit(run_bench(list(ctx.args)))


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
    cli()


if __name__ == "__main__":
    main()
