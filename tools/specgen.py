"""Compile ``spec/lifecycle.toml`` into ``kvtier/lifecycle/_table.py``.

Usage (from a checkout)::

    python -m tools gen          # regenerate the table module (make gen)
    python -m tools gen --check  # exit 1 if the checked-in module is stale

The output is deterministic (sorted only where the spec has no order; transition branches keep
spec order), so a test can regenerate it in memory and diff.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools.spec import Machine, Spec, SpecError, load


def table_path(root: Path) -> Path:
    """The generated table module of checkout ``root``."""
    return root / "kvtier" / "lifecycle" / "_table.py"


HEADER = '''\
# ============================================================================================
# GENERATED FILE — DO NOT EDIT.
# Source: spec/lifecycle.toml   Generator: python -m tools gen
# A test (tests/lifecycle/test_spec.py) fails when this file does not match the spec.
# ============================================================================================
"""kvtier lifecycle tables, generated from ``spec/lifecycle.toml``.

For each machine (producer, consumer, session): ``State``, ``Event``, ``Guard`` and ``Effect``
enums, the immutable ``TABLE`` mapping ``(state, event)`` to a :class:`Rule`, the timer of each
state, and the initial/final states.  ``SPEC_SHA256`` is the hash of the spec text this was
generated from.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Final, NamedTuple
'''


def _ident(name: str) -> str:
    return name.upper()


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


def _doc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', "'''")


def _enum(cls: str, items: dict[str, str]) -> list[str]:
    out = [f"class {cls}(enum.StrEnum):"]
    for name, doc in items.items():
        out.append(f'    {_ident(name)} = "{name}"')
        out.append(f'    """{_doc(doc)}"""')
    out.append("")
    out.append("")
    return out


def _machine(m: Machine) -> list[str]:
    c = _camel(m.name)
    up = m.name.upper()
    out = [f"# {'-' * 90}", f"# machine: {m.name} — {m.doc}", f"# {'-' * 90}", ""]
    out += _enum(f"{c}State", {s.name: s.doc for s in m.states})
    out += _enum(f"{c}Event", m.events)
    out += _enum(f"{c}Guard", m.guards)
    out += _enum(f"{c}Effect", m.effects)
    S, E, G, F = f"{c}State", f"{c}Event", f"{c}Guard", f"{c}Effect"
    out.append(f"{up}_INITIAL: Final = {S}.{_ident(m.initial)}")
    out.append(f"{up}_FINAL: Final = frozenset({{{', '.join(f'{S}.{_ident(f)}' for f in m.final)}}})")
    out.append(f"{up}_TIMERS: Final = MappingProxyType({{")
    for t in m.timers.values():
        out.append(f'    "{t.name}": TimerSpec("{t.name}", {E}.{_ident(t.event)}, "{t.config_key}"),')
    out.append("})")
    out.append(f'"""Timer name -> (event it fires, config key that sets its duration in seconds)."""')
    out.append(f"{up}_STATE_TIMER: Final = MappingProxyType({{")
    for s in m.states:
        out.append(f"    {S}.{_ident(s.name)}: {repr(s.timer)},")
    out.append("})")
    out.append(f'"""State -> name of the timer armed while in it (None: no timer)."""')
    out.append(f"{up}_TABLE: Final = MappingProxyType({{")
    for s in m.states:
        for e in m.events:
            rule = m.rules.get((s.name, e))
            if rule is None:
                continue
            key = f"({S}.{_ident(s.name)}, {E}.{_ident(e)})"
            if rule.kind == "transition":
                # guarded branches in spec order, then the fallback
                ordered = [b for b in rule.branches if b.guard] + [b for b in rule.branches if not b.guard]
                parts = []
                for b in ordered:
                    g = f"{G}.{_ident(b.guard)}" if b.guard else "None"
                    effs = "".join(f"{F}.{_ident(x)}, " for x in b.effects)
                    r = f"Reason.{_ident(b.reason)}" if b.reason else "None"
                    parts.append(f"Branch({g}, {S}.{_ident(b.dest)}, ({effs}), {r})")
                out.append(f"    {key}: Rule(TRANSITION, (")
                for p in parts:
                    out.append(f"        {p},")
                out.append("    ), None),")
            else:
                kind = "IGNORE" if rule.kind == "ignore" else "REJECT"
                out.append(f"    {key}: Rule({kind}, (), Reason.{_ident(rule.reason)}),")
    out.append("})")
    out.append("")
    out.append("")
    return out


def render(spec: Spec) -> str:
    """Return the source text of the generated table module."""
    out = [HEADER]
    out.append(f'SPEC_SHA256: Final = "{spec.sha256}"')
    out.append('"""SHA-256 of spec/lifecycle.toml at generation time."""')
    out.append("")
    out.append('TRANSITION: Final = "transition"')
    out.append('IGNORE: Final = "ignore"')
    out.append('REJECT: Final = "reject"')
    out.append("")
    out.append("")
    out += _enum("Reason", spec.reasons)
    out.append("REASON_DOCS: Final = MappingProxyType({")
    for name, doc in spec.reasons.items():
        out.append(f'    Reason.{_ident(name)}: "{_doc(doc).replace(chr(34), chr(92) + chr(34))}",')
    out.append("})")
    out.append('"""Reason -> what it means (the spec\'s text; docs/troubleshooting.md and ``kvtier why``)."""')
    out.append("")
    out.append("")
    out += [
        "class Branch(NamedTuple):",
        '    """One outcome of a (state, event) pair: taken if ``guard`` holds (``None``: fallback)."""',
        "",
        "    guard: enum.StrEnum | None",
        "    dest: enum.StrEnum",
        "    effects: tuple[enum.StrEnum, ...]",
        "    reason: Reason | None",
        "",
        "",
        "class Rule(NamedTuple):",
        '    """``kind`` is TRANSITION (branches: guarded first, fallback last), IGNORE or REJECT."""',
        "",
        "    kind: str",
        "    branches: tuple[Branch, ...]",
        "    reason: Reason | None",
        "",
        "",
        "class TimerSpec(NamedTuple):",
        '    """A named timer: the event it fires and the config key that sets its duration (s)."""',
        "",
        "    name: str",
        "    event: enum.StrEnum",
        "    config_key: str",
        "",
        "",
    ]
    for m in spec.machines.values():
        out += _machine(m)
    out += [
        "class Wire(NamedTuple):",
        '    """How one wire message reaches the code that takes it (``[wire.<tag>]`` of the spec)."""',
        "",
        "    struct: str",
        '    """The msgspec struct\'s name in ``kvtier.wire.messages``."""',
        "    receive: str",
        '    """The core\'s handler: ``TierCore._rx_<receive>``."""',
        "    lands: bool",
        '    """A block_data: its landing may run on the digest pool, a further one is landed beside it."""',
        "    principal: bool",
        '    """The shell attaches the peer\'s authenticated principal."""',
        "    noted: str",
        '    """The shell\'s observation when one arrives (log line, counter), or ``""``."""',
        "    sent: str",
        '    """The shell\'s observation when one is sent, or ``""``."""',
        "",
        "",
        "WIRE: Final = MappingProxyType({",
    ]
    for tag, w in spec.wire.items():
        out.append(f'    "{tag}": Wire("{w.struct}", "{w.receive}", {w.lands}, {w.principal}, "{w.noted}", "{w.sent}"),')
    out.append("})")
    out.append('"""Wire message tag -> its routing: the only table that says which code takes which message."""')
    out.append("PERFORM: Final = MappingProxyType({")
    for cls, performer in spec.effects.items():
        out.append(f'    "{cls}": "{performer}",')
    out.append("})")
    out.append('"""Effect record name -> the shell\'s performer (``Outbound._<performer>``)."""')
    out.append("")
    out.append("PROPERTIES: Final = MappingProxyType({")
    for name, p in spec.properties.items():
        out.append(f'    "{name}": ("{p["kind"]}", "{_doc(p.get("doc", ""))}"),')
    out.append("})")
    out.append('"""Property name -> (kind, statement). Verified by tests and `python -m tools check`."""')
    out += _timer_keys(spec)
    return "\n".join(out).rstrip() + "\n"


def timer_keys(spec: Spec) -> tuple[str, ...]:
    """Every config key (seconds) the machines read, first-seen in spec order: each machine's
    timers' ``config_key``, then its ``[machines.<m>.durations]``."""
    return tuple(dict.fromkeys(k for m in spec.machines.values() for k in m.duration_keys()))


def _timer_keys(spec: Spec) -> list[str]:
    out = ["", "TIMER_KEYS: Final = ("]
    out += [f'    "{k}",' for k in timer_keys(spec)]
    out.append(")")
    out.append('"""Every config key (seconds) the machines read: their timers\' durations, then the durations '
               'a guard compares against (``[machines.<m>.durations]``)."""')
    return out


def generate(spec_file: Path, out: Path, *, check: bool = False) -> int:
    """Render ``spec_file`` into ``out`` (``check``: only compare).  Prints what it did; returns 0,
    1 (``check`` and ``out`` is stale) or 2 (the spec is invalid: the error is printed)."""
    try:
        spec = load(spec_file)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    text = render(spec)
    if check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print(f"{out} is stale: run `python -m tools gen`", file=sys.stderr)
            return 1
        print(f"{out} matches {spec_file} (sha256 {spec.sha256[:12]})")
        return 0
    out.write_text(text)
    print(f"wrote {out} from {spec_file} (sha256 {spec.sha256[:12]})")
    return 0
