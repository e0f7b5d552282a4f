"""``python -m demo`` (``make demo``): the SmolLM2-135M prefill/decode demo, run from a checkout."""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--prompts", "num_prompts", type=click.IntRange(1, 50), default=None, help="How many prompts of the prompt set to run (default: all).")
@click.option("--max-prompt-tokens", type=click.IntRange(64, 8192), default=2048, show_default=True, help="Longest prompt, in tokens (prompts that do not fit are skipped).")
@click.option("--max-new-tokens", type=click.IntRange(1, 512), default=24, show_default=True, help="Tokens decoded per prompt.")
@click.option("--unbound-store-timeout", "unbound_store_timeout_s", type=click.FloatRange(0.05, 3600), default=1.0, show_default=True, help="Producer park timeout (s) used for the late-consumer scenario.")
@click.option("--late-delay", "late_delay_s", type=click.FloatRange(0.0, 3600), default=None, help="How long the late consumer is held back (s); must exceed the park timeout; default: park timeout + 0.5 s.")
@click.option("--no-late", is_flag=True, help="Skip the late-consumer scenario.")
@click.option("--data-plane", type=click.Choice(["zmq", "nixl"]), default="zmq", show_default=True, help="How blocks travel: zmq frames, or NIXL one-sided WRITEs (needs nixl-cu12).")
@click.option("--shared-prefix-tokens", type=click.IntRange(16, 4096), default=512, show_default=True, help="Length of the shared system prompt in the shared-prefix run (the symmetric path).")
@click.option("--no-shared", is_flag=True, help="Skip the shared-prefix run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
def demo(**opts: object) -> None:
    """Disaggregated prefill/decode of SmolLM2-135M through kvtier (two processes)."""
    from demo.run import main as run_demo

    late, park = opts["late_delay_s"], opts["unbound_store_timeout_s"]
    if late is not None and not opts["no_late"] and late <= park:  # type: ignore[operator]
        raise click.BadParameter(
            f"{late} s is not past the park timeout ({park} s): the consumer would not be late "
            "(use --no-late to skip the scenario)", param_hint="--late-delay")

    sys.exit(run_demo(**opts))


if __name__ == "__main__":
    demo(prog_name="python -m demo")
