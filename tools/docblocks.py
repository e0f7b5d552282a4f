"""The generated parts of the operator's pages that are not the two big tables of
:mod:`tools.docgen` (which registers every renderer here in its ``BLOCKS``): each turns one thing
the code declares into Markdown, so a page cannot drift from it (decision E2).

* ``dependencies`` — the runtime's requirements, from ``pyproject.toml``;
* ``metric labels`` — every label value a series can carry (:data:`kvtier.metrics.STATES`,
  :data:`~kvtier.metrics.LABEL_VALUES`, the reason vocabularies);
* ``config limits`` — the range of every duration key (:func:`kvtier.config.config_table`);
* ``cli reference`` — the help of every ``kvtier`` command (click renders it);
* ``reasons`` and ``wire reasons`` — every reason code: what it means (the spec), where an
  operator sees it (the spec's tables), what to change (:mod:`kvtier.advice`);
* ``compatibility`` — the versions kvtier is tested with (:mod:`kvtier.version`, ``pyproject.toml``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

__all__ = ["render_cli", "render_compatibility", "render_config_limits", "render_dependencies",
           "render_metric_labels", "render_reasons", "render_wire_reasons"]

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> list[str]:
    return [re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0] for r in requirements]


def render_dependencies() -> str:
    """One sentence: the runtime's requirements (``[project] dependencies``) and torch."""
    names = _names(_pyproject()["project"]["dependencies"])
    return ("kvtier itself needs " + ", ".join(f"`{n}`" for n in names)
            + " (`pyproject.toml`), and torch, installed first (the build for your machine); `pip install` adds "
            "whichever of them vLLM did not already bring.")


def render_metric_labels() -> str:
    """Every label and the values it takes."""
    from kvtier.lifecycle import Reason
    from kvtier.metrics import LABEL_VALUES, STATES
    from kvtier.wire.codec import WireReason

    def vals(values: tuple[str, ...] | list[str]) -> str:
        return ", ".join(f"`{v}`" for v in values)

    by_values: dict[tuple[str, ...], list[str]] = {}
    for series, states in STATES.items():
        by_values.setdefault(states, []).append(series)
    state = "; ".join(f"{' and '.join(f'`{s}`' for s in series)}: {vals(states)}"
                      for states, series in by_values.items())
    rows = [
        "| label | values |",
        "|---|---|",
        f"| `state` | {state} |",
        (f"| `reason` | a reason code of `spec/lifecycle.toml` ({len(Reason)} codes, each explained in "
         f"[troubleshooting.md](troubleshooting.md)) or of the wire codec ({vals([r.value for r in WireReason])}); "
         "`peer_reported_<code>` on `kvtier_wire_errors_total`; empty for a success, except `local` and "
         "`not_needed` (a success that moved nothing); `other` for anything else |"),
    ]
    rows += [f"| `{label}` | {vals(values)} |" for label, values in LABEL_VALUES.items()]
    return "\n".join(rows)


def render_config_limits() -> str:
    """The range of every duration key (grouped by range), from the keys' declarations."""
    from kvtier.config import config_table

    ranges: dict[tuple[float, float], list[str]] = {}
    for row in config_table():
        if row.unit == "s" and row.minimum is not None:
            ranges.setdefault((row.minimum, row.maximum), []).append(row.key)
    common = max(ranges, key=lambda r: len(ranges[r]))
    lines = [f"* **Durations** (seconds) take {common[0]:g} ≤ x ≤ {common[1]:g}, except:"]
    for (lo, hi), keys in ranges.items():
        if (lo, hi) != common:
            lines.append(f"  {', '.join(f'`{k}`' for k in keys)}: {lo:g} ≤ x ≤ {hi:g};")
    lines[-1] = lines[-1].rstrip(";") + "."
    return "\n".join(lines)


def render_cli() -> str:
    """``kvtier --help`` and every command's help, as click prints them (80 columns)."""
    import click

    from kvtier.cli import cli

    out = []

    def walk(cmd: click.Command, name: str, parent: click.Context | None) -> None:
        # 78: what click prints on any terminal of 80 columns or more (its 80-column cap, less 2)
        ctx = click.Context(cmd, info_name=name, parent=parent, terminal_width=78, max_content_width=80,
                            **cmd.context_settings)
        out.extend([f"### `{ctx.command_path}`", "", "```text", cmd.get_help(ctx), "```", ""])
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(ctx):
                walk(cmd.commands[sub], sub, ctx)

    walk(cli, "kvtier", None)
    return "\n".join(out).rstrip()


#: Where a reason the spec's tables use shows up, by (machine, rule kind).
_SURFACES = {
    ("producer", "transition"): "a store job's result and the id's retained record "
                                "(`kvtier_jobs_total{kind=\"store\"}`, `kvtier_retained_ids`); a fetch answered "
                                "with it (`kvtier_fetches_refused_total`)",
    ("consumer", "transition"): "a load job's result (`kvtier_jobs_total{kind=\"load\"}`); the engine recomputes",
    ("session", "transition"): "a session's end (`kvtier_session_ends_total`, log `session with … ended: <reason>`); "
                               "the loads on it fail with it",
    ("probe", "transition"): "a symmetric request's lookups answer MISS (the engine computes the blocks)",
    ("serve", "transition"): "a peer's probe or fetch refused; the pins released (`kvtier_pins_released_total`)",
    ("*", "ignore"): "a dropped input (`kvtier_ignored_inputs_total{machine, reason}`), nothing else",
    ("*", "reject"): "an error raised to the engine's call (misuse of the API)",
}
#: Reasons no spec table names: where the shell, the manager or the adapter reports them.
_ELSEWHERE = {
    "transfer_stalled": ("session", "transition"),
    "abort_unacknowledged": ("session", "transition"),
    "idle_evicted": ("session", "transition"),
    "local": "a store job's success for a request without a remote decoder (`kvtier_jobs_total`)",
    "invalid_params": "`kvtier_rejected_params_total` (every such request), its jobs failed by the vLLM adapter "
                      "(`kvtier_jobs_total`) if vLLM submits any, and a warning (the first each 10 s)",
    "not_a_consumer": "a load refused by the vLLM adapter (`kvtier_jobs_total{kind=\"load\"}`)",
    "bad_job": "a job the vLLM adapter could not map, or a store whose keys or slots failed the I/O loop's "
               "checks (`kvtier_jobs_total`), with the error logged",
    "job_refused": "a job refused by the manager (`kvtier_jobs_total`), with the error logged",
    "peer_error": "the peer's `error` about one of our messages (`kvtier_wire_errors_total{reason=\"peer_reported_…\"}`)",
    "consumer_lost": "the producer's answer to a fetch of an id it tombstoned when the consumer bound to it was lost "
                     "(`kvtier_fetches_refused_total`): the load fails with it (`kvtier_jobs_total{kind=\"load\"}`); "
                     "the producer's own record of the id says `peer_lost`",
    "peer_not_allowed": "a consumer request refused before any dial: `on_new_request` answers `local` and its load "
                        "fails with it (`kvtier_rejected_peer_total`, `kvtier_jobs_total{kind=\"load\"}`, a "
                        "rate-limited warning, the request's record for `kvtier why`)",
}


def _surfaces() -> dict[str, list[str]]:
    from tools.spec import load

    spec = load(ROOT / "spec" / "lifecycle.toml")
    seen: dict[str, list[tuple[str, str]]] = {r: [] for r in spec.reasons}
    for m in spec.machines.values():
        for rule in m.rules.values():
            used = [rule.reason] if rule.kind != "transition" else [b.reason for b in rule.branches if b.reason]
            key = (m.name, "transition") if rule.kind == "transition" else ("*", rule.kind)
            for r in used:
                if key not in seen[r]:
                    seen[r].append(key)
    out: dict[str, list[str]] = {}
    for reason, keys in seen.items():
        extra = _ELSEWHERE.get(reason)
        if isinstance(extra, tuple):
            keys = [*keys, extra]
        texts = [_SURFACES[k] for k in keys] + ([extra] if isinstance(extra, str) else [])
        if not texts:
            raise ValueError(f"reason {reason!r}: no spec table uses it and tools/docblocks.py says nowhere else")
        out[reason] = texts
    return out


#: A reason that labels a success (its advice says so) is not in the engine's ``JobResult``:
#: ``reason`` is set on failure only, so a reader must look for it where the code does show.
_A_SUCCESS = "(a success)"
_SUCCESS = "; not in the engine's `JobResult` (its `reason` is None on success): in {}"
_SUCCESS_SHOWN = {
    "local": "the metrics' `reason` label only (a local request has no `kv_request_id` for `kvtier why`)",
    "not_needed": "the metrics' `reason` label, `stats()` and `kvtier why`",
}


def render_reasons() -> str:
    """One section per reason code of the spec: meaning, where it shows, what to change."""
    from kvtier.advice import ADVICE
    from kvtier.lifecycle import REASON_DOCS, Reason

    surfaces = _surfaces()
    out = []
    for reason in Reason:
        success = _SUCCESS.format(_SUCCESS_SHOWN[reason.value]) if ADVICE[reason].startswith(_A_SUCCESS) else ""
        out += [f'### <a id="{reason.value}"></a>`{reason.value}`', "",
                f"**Means:** {REASON_DOCS[reason]}.", "",
                f"**Seen as:** {'; '.join(surfaces[reason.value])}{success}.", "",
                f"**Change:** {ADVICE[reason]}", ""]
    return "\n".join(out).rstrip()


def render_wire_reasons() -> str:
    """The wire codec's reason codes (``kvtier_wire_errors_total``)."""
    from kvtier.advice import WIRE_ADVICE
    from kvtier.wire.codec import WIRE_REASON_DOCS, WireReason

    rows = ["| reason | means | change |", "|---|---|---|"]
    for r in WireReason:
        means = WIRE_REASON_DOCS[r].replace("|", "/")
        rows.append(f'| <a id="{r.value}"></a>`{r.value}` | {means} | {WIRE_ADVICE[r]} |')
    return "\n".join(rows)


def render_compatibility() -> str:
    """The versions this checkout is written and tested with."""
    from kvtier.version import PROTOCOL_VERSION, TESTED_NIXL_VERSION, TESTED_VLLM_VERSION

    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    return "\n".join([
        "| component | this release |",
        "|---|---|",
        f"| kvtier | {project['version']} (`kvtier --version`) |",
        f"| Python | {project['requires-python']} (tested on 3.11) |",
        (f"| wire protocol | version {PROTOCOL_VERSION}: a peer of another version is refused at the handshake "
         "(`handshake_mismatch`, field `version`) |"),
        (f"| vLLM | {TESTED_VLLM_VERSION} (`pip install '.[vllm]'` in a kvtier checkout: `{extras['vllm'][0]}`); "
         "another version logs a warning at construction (its tiering API is experimental) |"),
        (f"| NIXL (`data_plane = \"nixl\"`) | {TESTED_NIXL_VERSION} (`pip install '.[nixl]'` in a kvtier checkout: "
         f"`{extras['nixl'][0]}`) |"),
        "| torch | any build for your machine, installed first (tested: 2.13.0, CPU) |",
    ])


def render_messages() -> str:
    """docs/protocol.md's message table, one row per class of :mod:`kvtier.wire.messages` (its tag,
    its docstring's direction and meaning, its fields and their types), so a new message is
    documented where it is declared (decision C1)."""
    import re

    import msgspec

    from kvtier.wire.messages import MESSAGE_TYPES

    def kind(t: object) -> str:
        return t.__name__ if isinstance(t, type) else str(t)

    rows = ["| type | direction | fields | meaning |", "|---|---|---|---|"]
    for tag, cls in MESSAGE_TYPES.items():
        way, _, meaning = " ".join((cls.__doc__ or "").split()).partition(": ")
        meaning = re.sub(r"``(.+?)``", r"`\1`", meaning).replace("|", "\\|")
        fields = ", ".join(f"{f.name}:{kind(f.type)}" for f in msgspec.structs.fields(cls))
        rows.append(f"| `{tag}` | {way} | `{fields}` | {meaning} |")
    return "\n".join(rows)
