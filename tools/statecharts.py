"""Reviewer views of one lifecycle machine, generated from ``spec/lifecycle.toml``.

* :func:`overview_dot` — states and only the **state-changing** transitions, labelled by event
  only; parallel branches between two states are one edge listing their events; an event that
  takes *every* live state to the same state (``shutdown``) is drawn once, from an "any live
  state" box.  The normal path (``[machines.<m>.layout] normal_path``) is one straight line;
  failure states sit together in a "failure exits" cluster; final and retained states look
  different (see :func:`roles`).  Hovering shows the spec's docs (SVG tooltips).
* :func:`state_dot` — one small diagram per state: what enters it (left), what leaves it
  (right), with guards, effects and reasons; self-loops and ignored inputs in notes.
* :func:`machine_page` — the markdown page ``docs/states/<machine>.md``: the overview, a
  per-state table (guards, effects, reasons, self-loops, ignore and reject rules) and each
  state's detail diagram.

Everything is derived from the spec records (:mod:`tools.spec`); the only drawing input
the spec states for this purpose is the validated ``normal_path`` hint.
"""

from __future__ import annotations

import textwrap

import graphviz

from tools.spec import Branch, Machine

__all__ = [
    "FONT_SIZE",
    "any_state_events",
    "machine_page",
    "overview_dot",
    "roles",
    "state_dot",
]

#: Font size (points) of every label in the overview and the state diagrams: with the overview
#: rendered 1200 px wide this stays at or above body text size (tests check it).
FONT_SIZE = 14

_FILL = {
    "normal": "#dbe8fb",
    "failure": "#fde2e2",
    "final": "#d9d9d9",
    "initial": "#ffffff",
    "other": "#ffffff",
}


#: characters per line of an overview's title: graphviz never wraps a label, and a long title
#: alone would set the picture's width
TITLE_WIDTH = 100


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _wrap_items(items: list[str], width: int, sep: str = ", ") -> str:
    lines: list[str] = []
    cur = ""
    for item in items:
        nxt = f"{cur}{sep}{item}" if cur else item
        if cur and len(nxt) > width:
            lines.append(cur + sep.rstrip())
            cur = item
        else:
            cur = nxt
    if cur:
        lines.append(cur)
    return "\n".join(lines)


def _ordered(branches: tuple[Branch, ...]) -> list[Branch]:
    """Branches in evaluation order: guarded ones in spec order, the fallback last."""
    return [b for b in branches if b.guard] + [b for b in branches if not b.guard]


def _transitions(m: Machine) -> list[tuple[str, str, Branch]]:
    """Every (state, event, branch) of the machine in state order, then event order."""
    out = []
    for s in m.states:
        for e in m.events:
            rule = m.rules.get((s.name, e))
            if rule is not None and rule.kind == "transition":
                out.extend((s.name, e, b) for b in _ordered(rule.branches))
    return out


def _live(m: Machine) -> list[str]:
    return [s.name for s in m.states if s.name != m.initial and s.name not in m.final]


def any_state_events(m: Machine) -> dict[str, str]:
    """Events that take **every** live state (not initial, not final) to one and the same state,
    by some branch: ``{event: destination}``.  The overview draws each once from "any live
    state" instead of once per state."""
    live = _live(m)
    out: dict[str, str] = {}
    for e in m.events:
        dests: set[str] = set()
        covered = True
        for s in live:
            rule = m.rules.get((s, e))
            moves = {b.dest for b in rule.branches if b.dest != s} if rule and rule.kind == "transition" else set()
            if len(moves) != 1:
                covered = False
                break
            dests |= moves
        if covered and len(dests) == 1 and live:
            out[e] = dests.pop()
    return out


def roles(m: Machine) -> dict[str, set[str]]:
    """Drawing roles of each state, derived from the spec:

    * ``initial`` / ``final`` — as declared;
    * ``normal`` — on the layout's ``normal_path``;
    * ``retained`` — a live state whose every way out leads to a final state *with no effect*:
      the outcome is settled and the record is kept only to answer late inputs (or to wait for
      the engine) until it is deleted;
    * ``failure`` — a live state off the normal path that some transition enters with a reason
      code (it exists because something went wrong).
    """
    path = set(m.layout.normal_path)
    entered_with_reason: set[str] = set()
    exits: dict[str, set[str]] = {s.name: set() for s in m.states}
    busy_exit: set[str] = set()  # states with an exit that still does something
    for src, _e, b in _transitions(m):
        if b.dest != src:
            exits[src].add(b.dest)
            if b.effects:
                busy_exit.add(src)
            if b.reason:
                entered_with_reason.add(b.dest)
    out: dict[str, set[str]] = {}
    for s in m.states:
        r: set[str] = set()
        if s.name == m.initial:
            r.add("initial")
        if s.name in m.final:
            r.add("final")
        if s.name in path:
            r.add("normal")
        live = s.name != m.initial and s.name not in m.final
        if live and exits[s.name] and exits[s.name] <= set(m.final) and s.name not in busy_exit:
            r.add("retained")
        if live and s.name not in path and s.name in entered_with_reason:
            r.add("failure")
        out[s.name] = r
    return out


def _node_attrs(m: Machine, name: str, role: set[str], *, font: str) -> dict[str, str]:
    st = m.state(name)
    lines = [name]
    if st.timer is not None:
        lines.append(f"timer: {st.timer}")
    elif len(st.exit) == 1:  # one named exit, e.g. a data-plane report (settling: blocks_landed)
        lines.append(f"ends on {st.exit[0]}")
    elif st.exit:
        lines.append("ended by the engine")
    tip = [f"{name}: {st.doc}"]
    if st.timer is not None:
        t = m.timers[st.timer]
        tip.append(f"timer {t.name} ({t.config_key}): {t.doc}")
    if st.exit:
        tip.append("left only on: " + ", ".join(st.exit))
    fill = _FILL["other"]
    for key in ("final", "failure", "normal", "initial"):
        if key in role:
            fill = _FILL[key]
            break
    style = ["rounded", "filled"]
    if "retained" in role:
        style.append("dashed")
        lines.append("(retained)")
    attrs = {
        "label": _esc("\n".join(lines)),
        "tooltip": _esc("\n".join(tip)),
        "shape": "box",
        "style": ",".join(style),
        "fillcolor": fill,
        "fontsize": font,
    }
    if "final" in role:
        attrs["peripheries"] = "2"
        attrs["style"] = "filled"
    if "normal" in role:
        attrs["group"] = "normal"
        attrs["penwidth"] = "2"
    return attrs


def _branch_text(m: Machine, event: str, b: Branch) -> str:
    head = event + (f" [{b.guard}]" if b.guard else "")
    if b.effects:
        head += " / " + ", ".join(b.effects)
    if b.reason:
        head += f" ({b.reason})"
    return head


def _branch_tip(m: Machine, src: str, event: str, b: Branch) -> str:
    lines = [f"{src} -> {b.dest} on {event}: {m.events[event]}"]
    if b.guard:
        lines.append(f"  when {b.guard}: {m.guards[b.guard]}")
    for eff in b.effects:
        lines.append(f"  do {eff}: {m.effects[eff]}")
    if b.reason:
        lines.append(f"  reason {b.reason}")
    return "\n".join(lines)


def overview_dot(m: Machine) -> str:
    """DOT text of the machine's overview (deterministic; see the module docstring)."""
    font = str(FONT_SIZE)
    path = list(m.layout.normal_path)
    names = [s.name for s in m.states]
    for s in path:
        if s not in names:  # the spec validator says so too; this catches unvalidated specs
            raise ValueError(
                f"[machines.{m.name}.layout] normal_path names {s!r}, which is not a state of {m.name} "
                f"(states: {', '.join(names)}); fix the hint in spec/lifecycle.toml")
    role = roles(m)
    anywhere = any_state_events(m)
    on_path = set(zip(path, path[1:]))
    g = graphviz.Digraph(f"{m.name}_overview")
    g.attr("graph", rankdir="TB", fontname="Helvetica", fontsize=str(FONT_SIZE + 2), labelloc="t",
           label=_esc("\n".join(textwrap.wrap(f"{m.name}: {m.doc}", TITLE_WIDTH))), nodesep="0.2", ranksep="0.5",
           newrank="true",
           # more crossing-minimisation passes: the consumer's ending states (settling among them)
           # otherwise spread sideways and shrink every label below 12 px at 1200 px (decision R5)
           mclimit="4",
           tooltip=_esc(f"{m.name}: {m.doc}"))
    g.attr("node", fontname="Helvetica", fontsize=font)
    g.attr("edge", fontname="Helvetica", fontsize=font)
    g.node("__start", label="", shape="point", width="0.15",
           tooltip=_esc(f"a new {m.name} record starts in {m.initial}"))
    failure = [s.name for s in m.states if "failure" in role[s.name]]
    for s in m.states:
        if s.name in failure:
            continue
        g.node(s.name, **_node_attrs(m, s.name, role[s.name], font=font))
    if failure:
        with g.subgraph(name="cluster_failure") as c:
            c.attr(label="failure exits", style="dashed,rounded", color="#c00000", fontcolor="#c00000",
                   fontsize=font, tooltip="states that exist because something went wrong")
            for name in failure:
                c.node(name, **_node_attrs(m, name, role[name], font=font))
    g.edge("__start", m.initial, weight="20", tooltip=_esc(f"initial state: {m.initial}"))
    # merge parallel branches between the same two states
    merged: dict[tuple[str, str], list[tuple[str, Branch]]] = {}
    for src, e, b in _transitions(m):
        if b.dest == src or anywhere.get(e) == b.dest and src in _live(m):
            continue
        merged.setdefault((src, b.dest), []).append((e, b))
    for (src, dst), items in merged.items():
        events = list(dict.fromkeys(e for e, _ in items))
        tip = "\n".join(_branch_tip(m, src, e, b) for e, b in items)
        attrs = {"label": _esc(_wrap_items(events, 18)), "tooltip": _esc(tip), "labeltooltip": _esc(tip)}
        if (src, dst) in on_path:
            attrs.update(weight="50", penwidth="3", color="#1f4e9c", fontcolor="#1f4e9c")
        elif dst in failure or "failure" in role[src]:
            attrs.update(color="#b04040", fontcolor="#802020")
        g.edge(src, dst, **attrs)
    # keep the normal path straight: invisible heavy chain between consecutive path states
    for a, b in zip(path, path[1:]):
        if (a, b) not in merged:  # drawn only as an "any state" edge: still keep the line
            g.edge(a, b, style="invis", weight="50")
    if anywhere:
        by_dest: dict[str, list[str]] = {}
        for e, d in anywhere.items():
            by_dest.setdefault(d, []).append(e)
        live = _live(m)
        g.node("__any", label="any live state", shape="box", style="dashed,rounded", color="gray40",
               fontcolor="gray25", tooltip=_esc("every state except " + ", ".join([m.initial, *m.final]) + ": "
                                                + ", ".join(live)))
        for d, events in by_dest.items():
            tip = "\n".join(f"{e}: {m.events[e]}" for e in events)
            g.edge("__any", d, label=_esc(_wrap_items(events, 24)), style="dashed", color="gray40",
                   fontcolor="gray25", tooltip=_esc(tip), labeltooltip=_esc(tip))
        # one rank above its (first) destination, so the edge stays short and its label clear
        first = next(iter(by_dest))
        if first in path and path.index(first) >= 2:
            g.edge(path[path.index(first) - 2], "__any", style="invis")
        else:
            with g.subgraph() as r:
                r.attr(rank="same")
                r.node("__any")
                r.node(first)
    return g.source


def state_dot(m: Machine, state: str) -> str:
    """DOT text of one state's detail: every branch that enters it (from other states, left),
    every branch that leaves it (right), its self-loops and ignored/rejected inputs (notes).

    Raises:
        KeyError: ``state`` is not a state of ``m``.
    """
    if state not in {s.name for s in m.states}:
        raise KeyError(f"machine {m.name} has no state {state!r}")
    font = str(FONT_SIZE)
    role = roles(m)
    g = graphviz.Digraph(f"{m.name}_{state}")
    g.attr("graph", rankdir="LR", fontname="Helvetica", fontsize=str(FONT_SIZE + 2), labelloc="t",
           label=_esc(f"{m.name} · {state}"), nodesep="0.3", ranksep="0.6", newrank="true")
    g.attr("node", fontname="Helvetica", fontsize=font)
    g.attr("edge", fontname="Helvetica", fontsize=font)
    g.node("S", **_node_attrs(m, state, role[state], font=font))
    incoming = [(src, e, b) for src, e, b in _transitions(m) if b.dest == state and src != state]
    outgoing = [(src, e, b) for src, e, b in _transitions(m) if src == state and b.dest != state]
    loops = [(src, e, b) for src, e, b in _transitions(m) if src == state and b.dest == state]
    if state == m.initial:
        g.node("__start", label="", shape="point", width="0.15")
        g.edge("__start", "S")
    for src in dict.fromkeys(src for src, _, _ in incoming):
        g.node(f"in_{src}", **_node_attrs(m, src, role[src], font=font))
    for dst in dict.fromkeys(b.dest for _, _, b in outgoing):
        g.node(f"out_{dst}", **_node_attrs(m, dst, role[dst], font=font))
    for src, e, b in incoming:
        g.edge(f"in_{src}", "S", label=_esc(_branch_label(e, b)), tooltip=_esc(_branch_tip(m, src, e, b)))
    for src, e, b in outgoing:
        g.edge("S", f"out_{b.dest}", label=_esc(_branch_label(e, b)), tooltip=_esc(_branch_tip(m, src, e, b)))
    notes: list[str] = []
    if loops:
        notes.append(f"stays in {state} on:")
        notes.extend("  " + _branch_text(m, e, b) for _, e, b in loops)
    for kind, title in (("ignore", "ignores (counted, dropped):"), ("reject", "rejects (InvalidTransition):")):
        by_reason: dict[str, list[str]] = {}
        for e in m.events:
            rule = m.rules.get((state, e))
            if rule is not None and rule.kind == kind:
                by_reason.setdefault(rule.reason or "", []).append(e)
        if by_reason:
            notes.append(title)
            for reason, events in by_reason.items():
                wrapped = _wrap_items(events, 56).split("\n")
                notes.append(f"  ({reason}) {wrapped[0]}")
                notes.extend(f"      {w}" for w in wrapped[1:])
    if notes:
        text = "".join(_esc(n) + "\\l" for n in notes)
        g.node("__notes", label=text, shape="note", style="filled", fillcolor="#f7f7f7", color="gray60",
               tooltip=_esc("\n".join(notes)))
        g.edge("S", "__notes", style="invis")
    return g.source


def _branch_label(event: str, b: Branch) -> str:
    lines = [event + (f" [{b.guard}]" if b.guard else "")]
    if b.effects:
        lines.append("/ " + _wrap_items(list(b.effects), 30).replace("\n", "\n  "))
    if b.reason:
        lines.append(f"({b.reason})")
    return "\n".join(lines)


# -- markdown -------------------------------------------------------------------------------------


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _cell(items: list[str]) -> str:
    return "<br>".join(items) if items else "—"


def machine_page(m: Machine, *, diagrams_rel: str) -> str:
    """Markdown of ``docs/states/<machine>.md``: the overview, the per-state table and every
    state's detail diagram.  ``diagrams_rel`` is the path from the page to ``diagrams/``."""
    role = roles(m)
    anywhere = any_state_events(m)
    out = [
        f"<!-- GENERATED from spec/lifecycle.toml by `python -m tools diagram` — DO NOT EDIT. -->",
        f"# The `{m.name}` machine, state by state",
        "",
        f"{m.doc}  Initial state `{m.initial}`; final: {', '.join(f'`{f}`' for f in m.final)}.",
        "",
        f"![{m.name} overview]({diagrams_rel}/{m.name}-overview.svg)",
        "",
        "The overview draws only state changes, labelled by event; hover over a state or an edge for "
        "the spec's prose. Blue: the normal path. Red cluster: failure exits. Dashed border: a "
        "*retained* state (kept only to answer late inputs or wait for the engine). Double border: "
        "final (the record is deleted).",
    ]
    if anywhere:
        out.append(
            " Events drawn from *any live state* take every state other than "
            f"`{m.initial}` and the final ones there: "
            + ", ".join(f"`{e}` → `{d}`" for e, d in anywhere.items()) + "."
        )
    out += [
        "",
        f"Every branch, guard and effect in one picture: [the full graph]({diagrams_rel}/{m.name}.svg).",
        "",
        "## Per-state table",
        "",
        "Branches are listed in evaluation order (guarded ones first, the unguarded fallback last). "
        "`→ =` marks a self-loop.",
        "",
        "| state | role | deadline | on event → next state / effects (reason) | ignored (reason) "
        "| rejected (reason) |",
        "|---|---|---|---|---|---|",
    ]
    for s in m.states:
        moves = []
        for e in m.events:
            rule = m.rules.get((s.name, e))
            if rule is None or rule.kind != "transition":
                continue
            for b in _ordered(rule.branches):
                dest = "=" if b.dest == s.name else f"`{b.dest}`"
                txt = f"`{e}`" + (f" [`{b.guard}`]" if b.guard else "") + f" → {dest}"
                if b.effects:
                    txt += " / " + ", ".join(b.effects)
                if b.reason:
                    txt += f" (`{b.reason}`)"
                moves.append(txt)
        cols = {}
        for kind in ("ignore", "reject"):
            by_reason: dict[str, list[str]] = {}
            for e in m.events:
                rule = m.rules.get((s.name, e))
                if rule is not None and rule.kind == kind:
                    by_reason.setdefault(rule.reason or "", []).append(e)
            cols[kind] = [f"(`{r}`) " + ", ".join(evs) for r, evs in by_reason.items()]
        if s.timer is not None:
            t = m.timers[s.timer]
            deadline = f"`{t.name}` = `{t.config_key}` → `{t.event}`"
        elif s.exit:
            deadline = "none; left by " + ", ".join(f"`{e}`" for e in s.exit)
        else:
            deadline = "—"
        out.append(
            f"| [`{s.name}`](#{m.name}-{s.name}) {_md(s.doc)} | {', '.join(sorted(role[s.name])) or '—'} | "
            f"{deadline} | {_cell(moves)} | {_cell(cols['ignore'])} | {_cell(cols['reject'])} |"
        )
    out += ["", "## Each state, with everything that enters and leaves it", ""]
    for s in m.states:
        out += [
            f'<a id="{m.name}-{s.name}"></a>',
            f"### `{s.name}`",
            "",
            _md(s.doc),
            "",
            f"![{m.name} {s.name}]({diagrams_rel}/states/{m.name}-{s.name}.svg)",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"
