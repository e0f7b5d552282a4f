"""Graphviz: DOT text to SVG, stamped so a stale SVG is found without running ``dot``.

Shared by the diagram renderer (:mod:`tools.diagrams`) and the sequence charts
(:mod:`tools.seqchart`), neither of which imports the other.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess

__all__ = ["render_svg", "stamp"]


def stamp(dot: str) -> str:
    """The comment an SVG made from ``dot`` carries: the SHA-256 of the DOT text."""
    return f"kvtier_dot_sha256 {hashlib.sha256(dot.encode()).hexdigest()}"


def render_svg(dot: str, dot_binary: str | None = None) -> str:
    """SVG text for ``dot`` (runs Graphviz ``dot -Tsvg``), stamped with the DOT text's hash.

    Raises:
        FileNotFoundError: Graphviz ``dot`` is not installed (``apt-get install graphviz``).
        subprocess.CalledProcessError: ``dot`` failed.
    """
    binary = dot_binary or shutil.which("dot")
    if binary is None:
        raise FileNotFoundError("Graphviz `dot` is not installed (apt-get install graphviz)")
    head, rest = dot.split("{\n", 1)
    comment = '"' + stamp(dot).replace("\\", "\\\\").replace('"', '\\"') + '"'
    stamped = f"{head}{{\n  comment={comment};\n{rest}"
    proc = subprocess.run([binary, "-Tsvg"], input=stamped.encode(), capture_output=True, check=True)
    return proc.stdout.decode()
