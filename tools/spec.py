"""Load and validate ``spec/lifecycle.toml``.

The spec is TOML (stdlib ``tomllib``: no dependency, comments allowed, strict types) and is the only
hand-edited description of kvtier's three machines.  This module turns it into frozen records and
enforces the rules in ``spec/README.md``; :class:`SpecError` names the machine, state and event.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import attrs



def spec_path(root: Path | None = None) -> Path:
    """``spec/lifecycle.toml`` of checkout ``root`` (default: the one around the current directory,
    :func:`tools.checkout.root`)."""
    from tools.checkout import root as checkout_root

    return (root if root is not None else checkout_root()) / "spec" / "lifecycle.toml"


_STATE_KEYS = {"doc", "timer", "exit"}
_TRANSITION_KEYS = {"from", "on", "when", "to", "do", "reason"}
_RULE_KEYS = {"from", "on", "reason"}
_LAYOUT_KEYS = {"normal_path"}


class SpecError(ValueError):
    """The spec violates a rule. The message names the machine, state and event involved."""

    def __init__(self, machine: str, message: str, *, state: str = "", event: str = "") -> None:
        where = machine + (f", state {state!r}" if state else "") + (f", event {event!r}" if event else "")
        super().__init__(f"spec: machine {where}: {message}")
        self.machine = machine
        self.state = state
        self.event = event


@attrs.frozen
class Branch:
    """One guarded (or fallback, ``guard is None``) outcome of a (state, event) pair."""

    guard: str | None
    dest: str
    effects: tuple[str, ...]
    reason: str | None


@attrs.frozen
class Rule:
    """What a (state, event) pair does: ``transition`` (branches), ``ignore`` or ``reject``."""

    kind: str
    branches: tuple[Branch, ...] = ()
    reason: str | None = None


@attrs.frozen
class Timer:
    name: str
    event: str
    config_key: str
    doc: str


@attrs.frozen
class State:
    name: str
    doc: str
    timer: str | None
    exit: tuple[str, ...]


@attrs.frozen
class Layout:
    """Drawing hints for the overview diagram (``[machines.<m>.layout]``); no runtime meaning.

    ``normal_path``: the states of the common successful life, in order, from the initial state
    to a final state; the overview draws them as one straight line.
    """

    normal_path: tuple[str, ...] = ()


@attrs.frozen
class Machine:
    name: str
    doc: str
    initial: str
    final: tuple[str, ...]
    states: tuple[State, ...]
    events: dict[str, str]
    guards: dict[str, str]
    effects: dict[str, str]
    timers: dict[str, Timer]
    rules: dict[tuple[str, str], Rule]
    layout: Layout = Layout()
    durations: dict[str, str] = attrs.field(factory=dict)
    """``[machines.<m>.durations]``: config keys (seconds) a guard or effect compares against,
    besides the timers' own, each with what reads it."""

    def duration_keys(self) -> tuple[str, ...]:
        """Every config key (seconds) this machine reads: its timers', then its ``durations``."""
        return tuple(dict.fromkeys([*(t.config_key for t in self.timers.values()), *self.durations]))

    def state(self, name: str) -> State:
        return next(s for s in self.states if s.name == name)


@attrs.frozen
class Wire:
    """How one wire message (``[wire.<tag>]``) reaches the code that takes it."""

    tag: str
    struct: str
    receive: str
    lands: bool = False
    principal: bool = False
    noted: str = ""
    sent: str = ""


@attrs.frozen
class Spec:
    machines: dict[str, Machine]
    reasons: dict[str, str]
    properties: dict[str, dict[str, str]]
    sha256: str
    wire: dict[str, Wire] = attrs.Factory(dict)
    """Wire message tag -> its routing (``[wire.<tag>]``)."""
    effects: dict[str, str] = attrs.Factory(dict)
    """Effect record name -> the shell's performer (``[effects]``)."""


def load(path: Path | None = None, *, validate_spec: bool = True) -> Spec:
    """Parse and (by default) validate the spec file (default: :func:`spec_path`).

    Raises:
        SpecError: the spec breaks a rule.
        tools.checkout.NotACheckout: no ``path`` and no checkout around the current directory.
    """
    raw = (path if path is not None else spec_path()).read_bytes()
    return loads(raw.decode(), validate_spec=validate_spec)


def loads(text: str, *, validate_spec: bool = True) -> Spec:
    """Parse spec text; see :func:`load`."""
    data = tomllib.loads(text)
    reasons = dict(data.get("reasons", {}))
    machines = {name: _machine(name, m, reasons) for name, m in data.get("machines", {}).items()}
    spec = Spec(
        machines=machines,
        reasons=reasons,
        properties={k: dict(v) for k, v in data.get("properties", {}).items()},
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        wire={tag: _wire(tag, w) for tag, w in data.get("wire", {}).items()},
        effects=_effects(data.get("effects", {})),
    )
    if validate_spec:
        validate(spec)
    return spec


_WIRE_KEYS = {"struct": str, "receive": str, "lands": bool, "principal": bool, "noted": str, "sent": str}
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def _wire(tag: str, w: dict[str, Any]) -> Wire:
    """One ``[wire.<tag>]`` row: every key known and of its type, handler names identifiers."""
    where = f"wire {tag!r}"
    if not _NAME.match(tag):
        raise SpecError(where, "a wire tag is lower_snake_case")
    for key, value in w.items():
        kind = _WIRE_KEYS.get(key)
        if kind is None:
            raise SpecError(where, f"unknown key {key!r} (known: {sorted(_WIRE_KEYS)})")
        if type(value) is not kind:
            raise SpecError(where, f"{key} must be a {kind.__name__}, got {value!r}")
    for key in ("struct", "receive"):
        if key not in w:
            raise SpecError(where, f"{key} is required")
    if not w["struct"].isidentifier() or not w["struct"][0].isupper():
        raise SpecError(where, f"struct must be a class name, got {w['struct']!r}")
    for key in ("receive", "noted", "sent"):
        if w.get(key) and not _NAME.match(w[key]):
            raise SpecError(where, f"{key} must be a lower_snake_case name, got {w[key]!r}")
    return Wire(tag, **w)


def _effects(e: dict[str, Any]) -> dict[str, str]:
    """``[effects]``: record class name -> performer name."""
    for cls, performer in e.items():
        if not cls.isidentifier() or not cls[0].isupper():
            raise SpecError("effects", f"{cls!r} is not an effect record's class name")
        if not isinstance(performer, str) or not _NAME.match(performer):
            raise SpecError("effects", f"{cls}: the performer must be a lower_snake_case name, got {performer!r}")
    return dict(e)


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _machine(name: str, m: dict[str, Any], reasons: dict[str, str]) -> Machine:
    states = []
    for sname, sdef in m.get("states", {}).items():
        unknown = set(sdef) - _STATE_KEYS
        if unknown:
            raise SpecError(name, f"unknown keys {sorted(unknown)}", state=sname)
        states.append(State(sname, sdef.get("doc", ""), sdef.get("timer"), tuple(sdef.get("exit", ()))))
    state_names = [s.name for s in states]
    events = dict(m.get("events", {}))
    guards = dict(m.get("guards", {}))
    effects = dict(m.get("effects", {}))
    timers = {
        t: Timer(t, tdef["event"], tdef["config_key"], tdef.get("doc", "")) for t, tdef in m.get("timers", {}).items()
    }

    def check_state(s: str, event: str = "") -> None:
        if s not in state_names:
            raise SpecError(name, "unknown state", state=s, event=event)

    def check_event(e: str, state: str = "") -> None:
        if e not in events:
            raise SpecError(name, "unknown event", state=state, event=e)

    def check_reason(r: str | None, state: str, event: str) -> None:
        if r is not None and r not in reasons:
            raise SpecError(name, f"unknown reason code {r!r}", state=state, event=event)

    rules: dict[tuple[str, str], Rule] = {}
    for t in m.get("transitions", []):
        unknown = set(t) - _TRANSITION_KEYS
        if unknown:
            raise SpecError(name, f"transition has unknown keys {sorted(unknown)}", event=str(t.get("on", "")))
        for event, src in ((e, s) for e in _as_list(t["on"]) for s in _as_list(t["from"])):
            check_event(event)
            check_state(src, event)
            dest = src if t["to"] == "=" else t["to"]
            check_state(dest, event)
            guard = t.get("when")
            if guard is not None and guard not in guards:
                raise SpecError(name, f"unknown guard {guard!r}", state=src, event=event)
            for eff in t.get("do", []):
                if eff not in effects:
                    raise SpecError(name, f"unknown effect {eff!r}", state=src, event=event)
            check_reason(t.get("reason"), src, event)
            branch = Branch(guard, dest, tuple(t.get("do", [])), t.get("reason"))
            prev = rules.get((src, event))
            if prev is not None and prev.kind != "transition":
                raise SpecError(name, f"both a transition and {prev.kind}", state=src, event=event)
            branches = (prev.branches if prev else ()) + (branch,)
            rules[(src, event)] = Rule("transition", branches)
    for kind in ("ignore", "reject"):
        for r in m.get(kind, []):
            unknown = set(r) - _RULE_KEYS
            if unknown:
                raise SpecError(name, f"{kind} rule has unknown keys {sorted(unknown)}")
            if "reason" not in r:
                raise SpecError(name, f"{kind} rule without a reason code")
            for src in _as_list(r["from"]):
                check_state(src)
                for event in _as_list(r["on"]):
                    check_event(event, src)
                    check_reason(r["reason"], src, event)
                    if (src, event) in rules:
                        raise SpecError(
                            name, f"{kind} rule duplicates an existing {rules[(src, event)].kind}", state=src, event=event
                        )
                    rules[(src, event)] = Rule(kind, (), r["reason"])
    layout_def = m.get("layout", {})
    unknown = set(layout_def) - _LAYOUT_KEYS
    if unknown:
        raise SpecError(name, f"layout has unknown keys {sorted(unknown)}")
    layout = Layout(tuple(_as_list(layout_def.get("normal_path", ()))))
    return Machine(
        name=name,
        doc=m.get("doc", ""),
        initial=m["initial"],
        final=tuple(m["final"]),
        states=tuple(states),
        events=events,
        guards=guards,
        effects=effects,
        timers=timers,
        rules=rules,
        layout=layout,
        durations=dict(m.get("durations", {})),
    )


def validate(spec: Spec) -> None:
    """Enforce determinism, totality, reachability, no exit from final states, a path to a final
    state from every state, and a timer-or-exit for every waiting state. Raises :class:`SpecError`."""
    if not spec.machines:
        raise SpecError("-", "no machines")
    for m in spec.machines.values():
        _validate_machine(m)
    for pname, p in spec.properties.items():
        if p.get("kind") not in {"safety", "liveness", "structural"}:
            raise SpecError("-", f"property {pname!r} has kind {p.get('kind')!r}; want safety|liveness|structural")


def _validate_machine(m: Machine) -> None:
    names = [s.name for s in m.states]
    if m.initial not in names:
        raise SpecError(m.name, "initial state is not declared", state=m.initial)
    for f in m.final:
        if f not in names:
            raise SpecError(m.name, "final state is not declared", state=f)
    for t in m.timers.values():
        if t.event not in m.events:
            raise SpecError(m.name, f"timer {t.name!r} fires an undeclared event", event=t.event)
    # determinism: at most one fallback branch, guards distinct
    for (state, event), rule in m.rules.items():
        if rule.kind != "transition":
            continue
        fallbacks = [b for b in rule.branches if b.guard is None]
        if len(fallbacks) > 1:
            raise SpecError(m.name, "non-deterministic: two unguarded transitions", state=state, event=event)
        guards = [b.guard for b in rule.branches if b.guard is not None]
        if len(set(guards)) != len(guards):
            raise SpecError(m.name, "non-deterministic: the same guard twice", state=state, event=event)
        if not fallbacks:
            raise SpecError(
                m.name, "non-total: every branch is guarded; add an unguarded fallback", state=state, event=event
            )
    # totality
    for s in names:
        if s in m.final:
            continue
        for e in m.events:
            if (s, e) not in m.rules:
                raise SpecError(m.name, "non-total: no transition, ignore or reject rule", state=s, event=e)
    # final states are terminal
    for (state, event), rule in m.rules.items():
        if state in m.final:
            raise SpecError(m.name, "a final state has an outgoing rule", state=state, event=event)
    # reachability
    succ: dict[str, set[str]] = defaultdict(set)
    for (state, _), rule in m.rules.items():
        for b in rule.branches:
            succ[state].add(b.dest)
    seen = {m.initial}
    queue = deque([m.initial])
    while queue:
        for nxt in succ[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    for s in names:
        if s not in seen:
            raise SpecError(m.name, "unreachable from the initial state", state=s)
    # a final state is reachable from every state
    pred: dict[str, set[str]] = defaultdict(set)
    for src, dests in succ.items():
        for d in dests:
            pred[d].add(src)
    can_finish = set(m.final)
    queue = deque(m.final)
    while queue:
        for p in pred[queue.popleft()]:
            if p not in can_finish:
                can_finish.add(p)
                queue.append(p)
    for s in names:
        if s not in can_finish:
            raise SpecError(m.name, "no final state is reachable from here", state=s)
    # every waiting state has a deadline or names its exits
    for st in m.states:
        if st.name in m.final or st.name == m.initial:
            continue
        if st.timer is None and not st.exit:
            raise SpecError(m.name, "waiting state has neither a timer nor declared exits", state=st.name)
        if st.timer is not None:
            if st.timer not in m.timers:
                raise SpecError(m.name, f"unknown timer {st.timer!r}", state=st.name)
            ev = m.timers[st.timer].event
            rule = m.rules.get((st.name, ev))
            if rule is None or rule.kind != "transition" or all(b.dest == st.name for b in rule.branches):
                raise SpecError(m.name, f"timer {st.timer!r} fires but nothing leaves the state", state=st.name, event=ev)
            for b in rule.branches:
                if m.state(b.dest).timer == st.timer and "restart_timer" not in b.effects:
                    raise SpecError(
                        m.name,
                        f"timer {st.timer!r} fires into {b.dest!r}, which names the same timer: "
                        "the fired deadline is never re-armed",
                        state=st.name,
                        event=ev,
                    )
        for ev in st.exit:
            rule = m.rules.get((st.name, ev))
            if rule is None or rule.kind != "transition" or all(b.dest == st.name for b in rule.branches):
                raise SpecError(m.name, "declared exit does not leave the state", state=st.name, event=ev)
    _validate_layout(m, succ)


def _validate_layout(m: Machine, succ: dict[str, set[str]]) -> None:
    """The overview's normal path names declared states, runs from the initial state to a final
    state, and each step of it is a transition of the machine (so the drawn line is true)."""
    path = m.layout.normal_path
    if not path:
        return
    names = [s.name for s in m.states]
    for s in path:
        if s not in names:
            raise SpecError(m.name, "layout.normal_path names an undeclared state", state=s)
    if len(set(path)) != len(path):
        raise SpecError(m.name, f"layout.normal_path visits a state twice: {list(path)}")
    if path[0] != m.initial:
        raise SpecError(m.name, f"layout.normal_path must start at the initial state {m.initial!r}", state=path[0])
    if path[-1] not in m.final:
        raise SpecError(m.name, f"layout.normal_path must end in a final state {list(m.final)}", state=path[-1])
    for a, b in zip(path, path[1:]):
        if b not in succ[a]:
            raise SpecError(m.name, f"layout.normal_path steps {a!r} -> {b!r}, but no transition does", state=a)
