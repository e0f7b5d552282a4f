"""``python -m tools [--root DIR] COMMAND``: the development tools' command line (one click app).

Commands: ``check`` (the exhaustive model check, ``make check``), ``gen`` (spec → the table module,
``make gen``), ``diagram`` (diagrams/ and the generated pages, ``make diagrams``), ``docs`` (the
generated parts of the README and docs/: tables, reason codes, CLI help).  Every command works on one checkout
(:mod:`tools.checkout`) and fails with a clear message outside one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tools.checkout import NotACheckout, require_runtime
from tools.checkout import root as checkout_root

__all__ = ["cli", "main", "run"]

PROG = "python -m tools"


def _root(ctx: click.Context, *, runtime: bool = False) -> Path:
    """The checkout the command works on (``--root`` or around the current directory); with
    ``runtime``, also insist that the imported ``kvtier`` is that checkout's."""
    try:
        root = checkout_root(ctx.obj)
        if runtime:
            require_runtime(root)
    except NotACheckout as exc:
        raise click.ClickException(str(exc)) from None
    return root


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The checkout to work on (default: the one around the current directory).")
@click.pass_context
def cli(ctx: click.Context, root: Path | None) -> None:
    """kvtier's development tools (run from a checkout; not part of the installed package)."""
    ctx.obj = root


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def check(ctx: click.Context, args: tuple[str, ...]) -> None:
    """Exhaustive bounded model check of the lifecycle (`python -m tools check --help` lists its options)."""
    if "-h" not in args and "--help" not in args:
        _root(ctx, runtime=True)
    from tools.modelcheck import main as run_check

    sys.exit(run_check(list(args)))


@cli.command()
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if the generated module is stale.")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The spec (default: spec/lifecycle.toml of the checkout).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The module to write (default: kvtier/lifecycle/_table.py of the checkout).")
@click.pass_context
def gen(ctx: click.Context, check_only: bool, spec_file: Path | None, out: Path | None) -> None:
    """Regenerate kvtier/lifecycle/_table.py from the spec (exit 2: the spec is invalid)."""
    from tools.spec import spec_path
    from tools.specgen import generate, table_path

    root = _root(ctx)
    sys.exit(generate(spec_file or spec_path(root), out or table_path(root), check=check_only))


@cli.command()
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if anything generated is stale.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Diagram directory (default: diagrams/).")
@click.option("--docs", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory of the generated pages (default: docs/, or OUT/docs with --out).")
@click.option("--no-svg", is_flag=True, help="DOT and markdown only (no Graphviz needed).")
@click.pass_context
def diagram(ctx: click.Context, check_only: bool, out: Path | None, docs: Path | None, no_svg: bool) -> None:
    """Render diagrams/ (DOT + SVG) and the generated pages from the spec, the recorded scenarios
    and the model checker (exit 2: cannot render)."""
    from tools.diagrams import main as run_diagrams

    root = _root(ctx, runtime=True)
    sys.exit(run_diagrams(out, docs, check_only=check_only, svg=not no_svg, root=root))


@cli.command()
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if a page is stale.")
@click.pass_context
def docs(ctx: click.Context, check_only: bool) -> None:
    """Render the generated parts of README.md and docs/ (configuration and metrics tables, label
    values, limits, dependencies, CLI help, reason codes, compatibility) from kvtier's declarations."""
    from tools.docgen import stale_pages, write_pages

    root = _root(ctx, runtime=True)
    if check_only:
        stale = stale_pages(root)
        for p in stale:
            click.echo(f"stale: {p} (run `{PROG} docs`)", err=True)
        if not stale:
            click.echo("generated tables are up to date")
        sys.exit(1 if stale else 0)
    for p in write_pages(root):
        click.echo(f"wrote {p}")


def main() -> None:
    cli(prog_name=PROG)


def run(argv: list[str]) -> int:
    """Run the command line in this process; return its exit status (for tests)."""
    try:
        cli.main(args=argv, prog_name=PROG, standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
