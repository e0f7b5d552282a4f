"""Generated tables inside hand-written Markdown pages, rendered from the runtime's declarations.

A page marks a generated part with ``<!-- BEGIN GENERATED: <block>, python -m tools docs -->`` and
``<!-- END GENERATED -->``; ``<block>`` names what fills it:

* ``config table``: every key of :class:`kvtier.config.TierConfig` (its field metadata: default,
  unit, meaning, validation) and the cross-field relations — ``docs/configuration.md`` and the
  README;
* ``metrics table``: every series of :data:`kvtier.metrics.SERIES` — ``docs/metrics.md``;
* the operator pages' blocks (label values, duration limits, dependencies, CLI help, reason codes,
  compatibility): :mod:`tools.docblocks`, listed in :data:`PAGES`.

The runtime only declares (attrs field metadata, a tuple of series); this module renders, so no
runtime module parses its own source or carries a generator (docs/decisions.md W4).
``python -m tools docs`` rewrites the pages, ``--check`` fails when one is stale.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tools import docblocks

__all__ = ["BLOCKS", "END", "PAGES", "begin_marker", "render_config_table", "render_metrics_table",
           "render_page", "replace_block", "stale_pages", "write_pages"]

COMMAND = "python -m tools docs"
END = "<!-- END GENERATED -->"


def begin_marker(block: str, command: str = COMMAND) -> str:
    """The opening marker of the generated ``block`` (``command`` renders it; the benchmark suite's
    blocks name ``python -m bench --summary``)."""
    return f"<!-- BEGIN GENERATED: {block}, {command} -->"


def replace_block(current: str, block: str, body: str, command: str = COMMAND) -> str:
    """``current`` with the generated ``block`` replaced by ``body``.

    Raises:
        ValueError: the page has no such block.
    """
    begin = begin_marker(block, command)
    start = current.index(begin) + len(begin)
    return current[:start] + "\n" + body + "\n" + current[current.index(END, start):]


def _cell(text: str) -> str:
    """Docstring RST (``x``) to Markdown (`x`); escape table pipes."""
    return text.replace("``", "`").replace("|", "\\|")


def render_config_table() -> str:
    """The configuration keys table and the cross-field relations (from ``kvtier.config``)."""
    from kvtier.config import CROSS_FIELD_RULES, config_table

    lines = [
        "| key | default | unit | description | validation |",
        "|---|---|---|---|---|",
    ]
    for row in config_table():
        default = json.dumps(row.default)
        lines.append(
            f"| `{row.key}` | `{default}` | {row.unit} | {_cell(row.description)} "
            f"| {_cell(row.validation)} |"
        )
    lines += ["", "Cross-field relations (checked at construction):", ""]
    for rule in CROSS_FIELD_RULES:
        lines.append(f"* `{rule.text()}` — {rule.why}.")
    return "\n".join(lines)


def render_metrics_table() -> str:
    """One row per series of :data:`kvtier.metrics.SERIES`."""
    from kvtier.metrics import SERIES

    lines = ["| series | type | labels | unit | meaning |", "|---|---|---|---|---|"]
    for s in SERIES:
        labels = ", ".join(f"`{label}`" for label in s.labels) or "—"
        text = s.help.replace("|", "\\|")
        lines.append(f"| `{s.name}` | {s.kind} | {labels} | {s.unit} | {text} |")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "config table": render_config_table,
    "config limits": docblocks.render_config_limits,
    "metrics table": render_metrics_table,
    "metric labels": docblocks.render_metric_labels,
    "dependencies": docblocks.render_dependencies,
    "cli reference": docblocks.render_cli,
    "reasons": docblocks.render_reasons,
    "wire reasons": docblocks.render_wire_reasons,
    "compatibility": docblocks.render_compatibility,
    "messages": docblocks.render_messages,
}
"""Block name -> its renderer (the operator pages' ones: :mod:`tools.docblocks`)."""

PAGES: dict[str, tuple[str, ...]] = {
    "README.md": ("config table",),
    "docs/configuration.md": ("config table", "config limits"),
    "docs/metrics.md": ("metric labels", "metrics table"),
    "docs/integrations/vllm.md": ("dependencies",),
    "docs/cli.md": ("cli reference",),
    "docs/troubleshooting.md": ("reasons", "wire reasons"),
    "docs/compatibility.md": ("compatibility",),
    "docs/protocol.md": ("messages",),
}
"""Page (relative to the checkout) -> the generated blocks it holds."""


def render_page(current: str, blocks: tuple[str, ...]) -> str:
    """``current`` (a page's text) with each of ``blocks`` rendered afresh."""
    for block in blocks:
        current = replace_block(current, block, BLOCKS[block]())
    return current


def _stale(root: Path) -> dict[Path, str]:
    """Page under ``root`` -> its fresh text, for every page whose generated blocks changed."""
    out = {}
    for rel, blocks in PAGES.items():
        path = root / rel
        text = path.read_text(encoding="utf-8")
        fresh = render_page(text, blocks)
        if fresh != text:
            out[path] = fresh
    return out


def stale_pages(root: Path) -> list[Path]:
    """The pages under ``root`` whose generated blocks differ from a fresh render."""
    return list(_stale(root))


def write_pages(root: Path) -> list[Path]:
    """Render every page's blocks under ``root``; returns the pages that changed."""
    stale = _stale(root)
    for path, fresh in stale.items():
        path.write_text(fresh, encoding="utf-8")
    return list(stale)
