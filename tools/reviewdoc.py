"""``docs/review.md``: the page a design reviewer reads top to bottom in ten minutes (generated).

Sections, all derived from data: the machines' overview diagrams (:mod:`tools.statecharts`),
the recorded scenario charts (:mod:`tools.scenarios`) with the outcomes each run
asserted, the spec's ``[properties]`` with what establishes each (:func:`evidence`), the config
keys that change timing (:func:`timing_keys`), and an example model-checker counterexample.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from tools.checkout import root as checkout_root
from tools.spec import Spec

__all__ = ["Evidence", "evidence", "review_page", "timing_keys", "MissingEvidence"]


class MissingEvidence(ValueError):
    """A spec property that no test and no model-checker run establishes."""


@attrs.frozen
class Evidence:
    """What establishes one property.

    Attributes:
        tests: test files (relative to the repository root) that name the property.
        model_check: True when the model checker's source names it (``python -m tools check`` checks it;
            ``tests/model`` runs the checker).
        scenarios: names of recorded scenarios whose assertions exercise it (examples, not
            proof: they do not count as establishing it on their own).
    """

    tests: tuple[str, ...]
    model_check: bool
    scenarios: tuple[str, ...]

    @property
    def established(self) -> bool:
        return bool(self.tests) or self.model_check


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")


def evidence(spec: Spec, root: Path | None = None, scenarios: dict[str, tuple[str, ...]] | None = None,
             ) -> dict[str, Evidence]:
    """For every ``[properties]`` entry: the test files under ``tests/`` of checkout ``root``
    (default: the one around the current directory) that name it (as a whole word; the test
    machinery in ``tests/support/`` does not count), whether the model checker
    (``tools/modelcheck*``) names it, and the scenarios that declare it (``scenarios``: name ->
    properties)."""
    root = root if root is not None else checkout_root()
    tests = sorted(p for p in (root / "tests").rglob("*.py") if "support" not in p.relative_to(root).parts)
    texts = {p.relative_to(root).as_posix(): p.read_text(errors="replace") for p in tests}
    mc_paths = sorted((root / "tools").glob("modelcheck*"))
    mc_text = ""
    for p in mc_paths:
        files = [p] if p.is_file() else sorted(p.rglob("*.py"))
        mc_text += "".join(f.read_text(errors="replace") for f in files if f.suffix == ".py")
    out = {}
    for name in spec.properties:
        pat = _word(name)
        out[name] = Evidence(
            tests=tuple(path for path, text in texts.items() if pat.search(text)),
            model_check=bool(pat.search(mc_text)),
            scenarios=tuple(s for s, props in (scenarios or {}).items() if name in props),
        )
    return out


def timing_keys(spec: Spec) -> list[tuple[str, object, str, str]]:
    """``(key, default, what it drives, description)`` for every config key that changes timing:
    keys measured in seconds, plus keys the spec's timer docs name, plus keys named by the docs
    of guards on branches that restart a timer (``park_clock``)."""
    from kvtier.config import config_table

    rows = {r.key: r for r in config_table()}
    drives: dict[str, list[str]] = {}
    mentioned: set[str] = set()
    for m in spec.machines.values():
        for t in m.timers.values():
            states = [s.name for s in m.states if s.timer == t.name]
            drives.setdefault(t.config_key, []).append(f"{m.name} timer `{t.name}` ({', '.join(states)})")
            for key in rows:
                if key != t.config_key and _word(key).search(t.doc):
                    drives.setdefault(key, []).append(f"{m.name} timer `{t.name}` (named in its doc)")
                    mentioned.add(key)
        restarting = {b.guard for r in m.rules.values() for b in r.branches if b.guard and "restart_timer" in b.effects}
        for g in sorted(restarting):
            for key in rows:
                if _word(key).search(m.guards[g]):
                    drives.setdefault(key, []).append(f"{m.name} guard `{g}` (restarts a timer)")
                    mentioned.add(key)
    out = []
    for key, r in rows.items():
        if r.unit == "s" or key in drives or key in mentioned:
            what = "; ".join(drives.get(key, [])) or "not a lifecycle timer (shell cadence)"
            # the first sentence (a sentence ends before a capital letter, so "e.g. a" does not)
            first = re.split(r"(?<=[A-Za-z0-9)`])\.\s+(?=[A-Z])", r.description)[0].rstrip(".") + "."
            out.append((key, r.default, what, first))
    return out


def _count(n: int) -> str:
    words = "zero one two three four five six seven eight nine ten eleven twelve".split()
    return words[n] if n < len(words) else str(n)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def review_page(
    spec: Spec,
    *,
    diagrams_rel: str,
    scenarios: list[tuple[str, str, str, tuple[str, ...], tuple[str, ...]]],
    awaiting: dict[str, str],
    counterexample: tuple[str, str] | None,
    root: Path | None = None,
) -> str:
    """Markdown of ``docs/review.md``.

    Args:
        diagrams_rel: path from the page to ``diagrams/``.
        scenarios: ``(name, title, doc, properties, checks)`` in review order.
        awaiting: scenarios not recordable yet: name -> what they need.
        counterexample: ``(bug, title)`` of the example counterexample chart, or None.

    Raises:
        MissingEvidence: a property has no establishing test or model-checker run.
    """
    ev = evidence(spec, root, {name: props for name, _, _, props, _ in scenarios})
    missing = [p for p, e in ev.items() if not e.established]
    if missing:
        raise MissingEvidence(
            f"no test under tests/ and no model-checker check names the spec properties {missing}: "
            "add a test that checks each (and names it), or drop the property")
    out = [
        "<!-- GENERATED by `python -m tools diagram` from spec/lifecycle.toml, recorded scenario runs and "
        "the model checker — DO NOT EDIT. -->",
        "# kvtier design review",
        "",
        "kvtier hands a prompt's KV blocks from a prefill instance (the **producer**) to a decode "
        "instance (the **consumer**). The life of every `kv_request_id` on each side, and of every "
        "peer session, is a state machine declared in "
        "[`spec/lifecycle.toml`](../spec/lifecycle.toml); the runtime applies tables generated from "
        "it. This page is generated from that spec, from real runs of two managers, and from the "
        "model checker: `python -m tools diagram` rewrites it, and a test fails when it is stale.",
        "",
        f"Read it in this order: the {_count(len(spec.machines))} machines (1), what actually happens "
        f"on the wire in {_count(len(scenarios))} situations (2), the promises the design makes and "
        "what checks each (3), the timing knobs (4), and what a broken promise looks like when the "
        "model checker finds one (5).",
        "",
        "## 1. The machines at a glance",
        "",
        "Each overview shows only state changes, labelled by event (hover for the spec's prose). "
        "**Blue**: the normal path, drawn as a straight line. **Red cluster**: failure exits. "
        "**Dashed border**: a *retained* state, kept only to answer late inputs or wait for the "
        "engine. **Double border**: final (the record is deleted). Guards, effects, reasons, "
        "self-loops and ignored inputs are in each machine's state-by-state page.",
        "",
    ]
    for m in spec.machines.values():
        out += [
            f"### `{m.name}` — {_md(m.doc)}",
            "",
            f"![{m.name} overview]({diagrams_rel}/{m.name}-overview.svg)",
            "",
            f"State by state: [docs/states/{m.name}.md](states/{m.name}.md) · every branch in one "
            f"graph: [{m.name}.svg]({diagrams_rel}/{m.name}.svg)",
            "",
        ]
    out += [
        "## 2. Scenarios, recorded from real runs",
        "",
        "Each chart is the trace of one run of two real `KvTierManager`s (producer and consumer) "
        "over the in-memory transport, on a virtual clock (`unbound_store_timeout_s` and "
        "`tombstone_retention_s` 60 s, other timers at their defaults unless the text says "
        "otherwise). Lanes: the engines' calls and job results on the outside, wire messages "
        "between the managers, state changes, deadlines and ignored inputs as boxes on the lane "
        "where they happen; pings are left out. The run asserts the outcomes listed under it "
        "(`tools/scenarios.py`, run by `tests/lifecycle/test_scenarios.py`).",
        "",
    ]
    for n, (name, title, doc, props, checks) in enumerate(scenarios, 1):
        out += [
            f'<a id="scenario-{name}"></a>',
            f"### 2.{n} {title}",
            "",
            doc,
            "",
            "Asserted by the run: " + "; ".join(checks) + "." if checks else "",
        ]
        if props:
            out.append("Exercises: " + ", ".join(f"[`{p}`](#property-{p})" for p in props) + ".")
        out += ["", f"![{title}]({diagrams_rel}/scenarios/{name}.svg)", ""]
    if awaiting:
        out += ["### Not recorded yet", "", "Scenarios the code cannot produce yet, and what each needs:", ""]
        out += [f"* `{name}` — {_md(need)}" for name, need in awaiting.items()]
        out.append("")
    out += [
        "## 3. Properties and what establishes them",
        "",
        "The spec's `[properties]`. *Tests* are the test files that check the property by name; "
        "*model check* means `python -m tools check` checks it on every explored transition "
        "(`tests/model/test_modelcheck.py` runs the checker and makes it find every planted bug); "
        "*scenarios* are the charts above whose assertions exercise it (examples, not proof).",
        "",
        "| property | kind | promise | tests | model check | scenarios |",
        "|---|---|---|---|---|---|",
    ]
    for pname, p in spec.properties.items():
        e = ev[pname]
        tests = "<br>".join(f"[`{t}`](../{t})" for t in e.tests) or "—"
        scen = "<br>".join(f"[{s}](#scenario-{s})" for s in e.scenarios) or "—"
        out.append(
            f'| <a id="property-{pname}"></a>`{pname}` | {p.get("kind", "")} | {_md(p.get("doc", ""))} | '
            f"{tests} | {'yes' if e.model_check else '—'} | {scen} |"
        )
    out += [
        "",
        "## 4. Config keys that change timing",
        "",
        "Every duration is a `TierConfig` key ([configuration.md](configuration.md) has ranges and "
        "validation). *Drives* is derived from the spec: the timers that use the key, or the timer "
        "docs and timer-restarting guards that name it.",
        "",
        "| key | default | drives | meaning |",
        "|---|---|---|---|",
    ]
    for key, default, what, desc in timing_keys(spec):
        out.append(f"| `{key}` | `{default}` | {_md(what)} | {_md(desc)} |")
    out += ["", "## 5. When the model checker finds a broken promise", ""]
    if counterexample is not None:
        bug, title = counterexample
        out += [
            "`python -m tools check` explores every interleaving of the real cores within its bounds and "
            "prints the shortest path to a violated property. Planted bugs "
            "(`tools/planted.py`) prove it finds them; this chart is the counterexample "
            f"it prints for the planted bug `{bug}`, drawn from the checker's structured steps by "
            "`tools.seqchart` (engine calls, messages, deadlines, the data plane's reports, "
            f"and the violation in red; `python -m tools check --bug {bug} --chart DIR` draws it too):",
            "",
            f"![{title}]({diagrams_rel}/counterexamples/{bug}.svg)",
            "",
        ]
    out += [
        "## Regenerating",
        "",
        "`python -m tools diagram` (or `make diagrams`) rewrites `diagrams/` and this page after a change to "
        "the spec, the scenarios or the manager; `python -m tools diagram --check` and "
        "`tests/lifecycle/test_diagrams.py` fail while anything here is stale.",
    ]
    return "\n".join(line for line in out).rstrip() + "\n"
