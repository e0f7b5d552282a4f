"""Profiles next to the results: py-spy sampling of benchmark processes (all their threads), and a
plain-text summary of what the samples say.

``py-spy record`` writes *collapsed stacks* (``--format raw``): one line per distinct stack,
``frame;frame;...;frame count``, each frame ``function (file:line)``.  :func:`summarize` turns
them into the two tables a reader wants first: where the time is spent (self samples per
function) and what it is spent under (inclusive samples per function), with the share of all
samples of the process(es) recorded.  The raw file is kept beside the summary, so it can be fed to
flamegraph.pl or speedscope.

py-spy is a development dependency (``requirements/base.txt``, dependency group ``dev``); a
profile that cannot be taken (py-spy missing, ptrace refused) is reported, never fatal.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["OUT", "Recorder", "configure", "py_spy", "summarize"]

OUT: Path | None = None
"""Where :class:`Recorder` writes when the suite runs (``OUT/profiles``); None: no profiles."""


def configure(out: Path | None) -> None:
    """Profiles of this run go to ``out`` (``python -m bench`` sets ``OUT_DIR/profiles``)."""
    global OUT
    OUT = out

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]*?)(?::(?P<line>\d+))?\)$")


def py_spy() -> str | None:
    """The py-spy executable (next to this interpreter, else on PATH), or None."""
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    return shutil.which("py-spy")


def _short(frame: str) -> str:
    """``function (path/to/module.py:123)`` → ``module.py:function`` (lines dropped: one row per
    function)."""
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    return f"{os.path.basename(m['file'])}:{m['fn']}"


def summarize(raw: str | Path, *, top: int = 30, title: str = "") -> str:
    """A Markdown summary of a py-spy ``raw`` file: total samples, the ``top`` functions by self
    samples and by inclusive samples (each with its share of all samples).  Idle frames (a thread
    waiting in ``poll``/``select``/``wait``/``sleep``) count like any other: a loop that sleeps
    shows it."""
    self_n: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in Path(raw).read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        self_n[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    out = [f"# {title or Path(raw).name}", "", f"{total} samples (all threads of the recorded process(es)).", ""]
    for name, counter in (("self", self_n), ("inclusive", incl)):
        out += [f"## top {top} by {name} samples", "", "| samples | share | function |", "|---:|---:|---|"]
        for fn, n in counter.most_common(top):
            out.append(f"| {n} | {100.0 * n / max(1, total):.1f} % | `{fn}` |")
        out.append("")
    return "\n".join(out)


class Recorder:
    """``py-spy record`` attached to running processes, for one measured phase.

    ``start(pids, path)`` attaches one recorder per pid (all threads, ``--rate`` samples/s,
    ``--nonblocking`` so the measured process is never stopped); ``stop()`` ends them (SIGINT:
    py-spy writes its file) and writes a ``.md`` summary next to each raw file.  Returns what
    was written, or why nothing was."""

    def __init__(self, rate: int = 500) -> None:
        self.rate = rate
        self._procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.error: str | None = None

    def start(self, pids: dict[str, int], out: Path, stem: str) -> None:
        exe = py_spy()
        if exe is None:
            self.error = "py-spy is not installed (pip install py-spy)"
            return
        out.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            path = out / f"{stem}-{name}.txt"
            cmd = [exe, "record", "--pid", str(pid), "--rate", str(self.rate), "--nonblocking", "--format", "raw",
                   "--output", str(path)]
            self._procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), path))

    def stop(self) -> dict[str, Any]:
        written: dict[str, Any] = {}
        for proc, path in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if path.exists() and path.stat().st_size:
                md = path.with_suffix(".md")
                md.write_text(summarize(path, title=path.stem))
                written[path.stem] = {"raw": str(path), "summary": str(md)}
            else:
                written[path.stem] = {"error": (err or b"").decode(errors="replace")[-400:] or "no samples"}
        self._procs = []
        if self.error:
            written["error"] = self.error
        return written


if __name__ == "__main__":  # python -m bench._profile RAW [TITLE]: print a summary
    print(summarize(sys.argv[1], title=sys.argv[2] if len(sys.argv) > 2 else ""))
