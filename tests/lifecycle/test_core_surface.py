"""The core's public surface is what kvtier's runtime uses (decision W12).

Every public method of :class:`~kvtier.lifecycle.TierCore` is called by the runtime outside the
core's own modules (the driver, shell, manager, metrics, forensics, the testing kit), except the two
documented seams for checkers: ``records()`` (every record as frozen views) and ``machines()``
(the reference interpreter shadows transitions).  A read only tests or tools want belongs in
``tools/coreview.py``, built on ``records()``.  Checked by scanning the source with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kvtier.lifecycle import TierCore

PKG = Path(__file__).resolve().parents[2] / "kvtier"
SEAMS = {"records", "machines"}
OWN = {"core", "reads", "receive"}  # the core and its parts (the driver, also in lifecycle, is a caller)


def _attributes_used_by_the_runtime() -> set[str]:
    used: set[str] = set()
    for path in PKG.rglob("*.py"):
        if path.parent.name == "lifecycle" and path.stem in OWN:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
    return used


def _public_methods() -> set[str]:
    return {n for n, v in vars(TierCore).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}


def test_every_public_core_method_is_used_by_the_runtime() -> None:
    unused = _public_methods() - SEAMS - _attributes_used_by_the_runtime()
    assert not unused, f"TierCore methods no runtime code calls (move them to tools/coreview.py): {sorted(unused)}"


def test_the_surface_has_no_reach_in_helpers_left() -> None:
    """The reads moved to the tools' inspector are gone from the core (a test that used one would
    be reading something the runtime does not)."""
    moved = {"session", "sessions", "session_gen", "session_ready", "session_state", "producer", "producer_ids",
             "consumer_ids", "tracks", "retained", "evicted", "quarantined", "quarantined_jobs", "pending_jobs",
             "outstanding_jobs", "probe", "probe_answer", "serve", "serve_state", "serve_ids", "pins_held",
             "serve_pinned_blocks", "deadlines", "deadline_entries", "step"}
    assert not moved & _public_methods()
