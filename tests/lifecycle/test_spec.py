"""The spec validator and the table generator (``tools.spec``, ``tools.specgen``).

Every rule of ``spec/README.md`` has a test that feeds a small spec breaking exactly that rule;
the checked-in ``kvtier/lifecycle/_table.py`` must equal what the generator renders from the
spec, so editing the spec without regenerating fails here.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import specgen
from tools.cli import run
from tools.spec import SpecError, load, loads, spec_path
from kvtier.lifecycle import _table

ROOT = Path(__file__).resolve().parents[2]

# A tiny valid machine: a --go--> b (timer t) --go [g] / e--> b | --go--> z, b --tick--> z.
BASE = {
    "states": {
        "a": '{ doc = "start" }',
        "b": '{ doc = "waiting", timer = "t" }',
        "z": '{ doc = "end" }',
    },
    "transitions": [
        'from = ["a"]\non = "go"\nto = "b"\ndo = ["e"]',
        'from = ["b"]\non = "go"\nwhen = "g"\nto = "b"\ndo = ["e"]',
        'from = ["b"]\non = "go"\nto = "z"\nreason = "r"',
        'from = ["b"]\non = "tick"\nto = "z"',
    ],
    "ignore": ['from = ["a"]\non = ["tick"]\nreason = "r"'],
    "reject": [],
}


def spec_text(
    *,
    states: dict[str, str] | None = None,
    transitions: list[str] | None = None,
    ignore: list[str] | None = None,
    reject: list[str] | None = None,
    final: str = '["z"]',
) -> str:
    states = BASE["states"] if states is None else states
    out = [
        "[meta]",
        'name = "t"',
        "[reasons]",
        'r = "a reason"',
        "[machines.m]",
        'doc = "test machine"',
        'initial = "a"',
        f"final = {final}",
        "[machines.m.states]",
    ]
    out += [f"{k} = {v}" for k, v in states.items()]
    out += [
        "[machines.m.events]",
        'go = "go on"',
        'tick = "timer t fired"',
        "[machines.m.guards]",
        'g = "a guard"',
        "[machines.m.effects]",
        'e = "an effect"',
        "[machines.m.timers]",
        't = { event = "tick", config_key = "t_s" }',
    ]
    for t in BASE["transitions"] if transitions is None else transitions:
        out += ["[[machines.m.transitions]]", t]
    for r in BASE["ignore"] if ignore is None else ignore:
        out += ["[[machines.m.ignore]]", r]
    for r in BASE["reject"] if reject is None else reject:
        out += ["[[machines.m.reject]]", r]
    return "\n".join(out) + "\n"


def rejects(text: str, *, match: str) -> SpecError:
    with pytest.raises(SpecError, match=match) as info:
        loads(text)
    assert str(info.value).startswith("spec: machine m"), str(info.value)
    return info.value


def test_minimal_spec_is_valid() -> None:
    spec = loads(spec_text())
    m = spec.machines["m"]
    assert m.rules[("b", "go")].branches[0].guard == "g"
    assert m.rules[("a", "tick")].kind == "ignore"


def test_rejects_two_unguarded_transitions() -> None:
    t = BASE["transitions"] + ['from = ["b"]\non = "go"\nto = "b"']
    err = rejects(spec_text(transitions=t), match="non-deterministic: two unguarded")
    assert (err.state, err.event) == ("b", "go")


def test_rejects_the_same_guard_twice() -> None:
    t = BASE["transitions"] + ['from = ["b"]\non = "go"\nwhen = "g"\nto = "z"']
    err = rejects(spec_text(transitions=t), match="non-deterministic: the same guard twice")
    assert (err.state, err.event) == ("b", "go")


def test_rejects_a_guarded_rule_without_fallback() -> None:
    t = [BASE["transitions"][0], BASE["transitions"][1], BASE["transitions"][3]]
    err = rejects(spec_text(transitions=t), match="non-total: every branch is guarded")
    assert (err.state, err.event) == ("b", "go")


def test_rejects_a_missing_state_event_pair_and_names_it() -> None:
    err = rejects(spec_text(ignore=[]), match="non-total: no transition, ignore or reject rule")
    assert (err.machine, err.state, err.event) == ("m", "a", "tick")
    assert "machine m, state 'a', event 'tick'" in str(err)


def test_rejects_an_unreachable_state() -> None:
    states = dict(BASE["states"], c='{ doc = "island", timer = "t" }')
    t = BASE["transitions"] + ['from = ["c"]\non = ["go"]\nto = "z"', 'from = ["c"]\non = "tick"\nto = "z"']
    t[-2] = 'from = ["c"]\non = "go"\nto = "z"'
    err = rejects(spec_text(states=states, transitions=t), match="unreachable from the initial state")
    assert err.state == "c"


def test_rejects_a_state_with_no_path_to_a_final_state() -> None:
    states = dict(BASE["states"], c='{ doc = "trap", exit = ["go"] }')
    t = [
        'from = ["a"]\non = "go"\nto = "c"',
        'from = ["c"]\non = "go"\nto = "c"',
        'from = ["c"]\non = "tick"\nto = "c"',
        'from = ["b"]\non = "go"\nto = "z"',
        'from = ["b"]\non = "tick"\nto = "z"',
        'from = ["a"]\non = "tick"\nto = "b"',
    ]
    err = rejects(spec_text(states=states, transitions=t, ignore=[]), match="no final state is reachable")
    assert err.state == "c"


def test_rejects_a_transition_out_of_a_final_state() -> None:
    t = BASE["transitions"] + ['from = ["z"]\non = "go"\nto = "b"']
    err = rejects(spec_text(transitions=t), match="a final state has an outgoing rule")
    assert (err.state, err.event) == ("z", "go")


def test_rejects_an_ignore_rule_on_a_final_state() -> None:
    err = rejects(spec_text(ignore=BASE["ignore"] + ['from = ["z"]\non = ["go"]\nreason = "r"']),
                  match="a final state has an outgoing rule")
    assert err.state == "z"


def test_rejects_a_waiting_state_without_timer_or_exit() -> None:
    states = dict(BASE["states"], b='{ doc = "waits forever?" }')
    err = rejects(spec_text(states=states), match="neither a timer nor declared exits")
    assert err.state == "b"


def test_rejects_a_timer_whose_event_does_not_leave_the_state() -> None:
    t = [BASE["transitions"][0], BASE["transitions"][1], BASE["transitions"][2], 'from = ["b"]\non = "tick"\nto = "b"']
    err = rejects(spec_text(transitions=t), match="timer 't' fires but nothing leaves the state")
    assert (err.state, err.event) == ("b", "tick")


def test_rejects_a_declared_exit_that_does_not_leave() -> None:
    states = dict(BASE["states"], b='{ doc = "w", exit = ["go"] }')
    t = [BASE["transitions"][0], 'from = ["b"]\non = "go"\nto = "b"', 'from = ["b"]\non = "tick"\nto = "z"']
    err = rejects(spec_text(states=states, transitions=t), match="declared exit does not leave the state")
    assert (err.state, err.event) == ("b", "go")


@pytest.mark.parametrize(
    ("transition", "match"),
    [
        ('from = ["b"]\non = "go"\nwhen = "nope"\nto = "b"', "unknown guard 'nope'"),
        ('from = ["b"]\non = "go"\nwhen = "g"\nto = "b"\ndo = ["nope"]', "unknown effect 'nope'"),
        ('from = ["b"]\non = "go"\nto = "z"\nreason = "nope"', "unknown reason code 'nope'"),
        ('from = ["b"]\non = "nope"\nto = "z"', "unknown event"),
        ('from = ["b"]\non = "go"\nto = "nowhere"', "unknown state"),
    ],
)
def test_rejects_unknown_names(transition: str, match: str) -> None:
    t = [BASE["transitions"][0], transition, BASE["transitions"][3]]
    if "when" in transition:
        t.append('from = ["b"]\non = "go"\nto = "z"')
    rejects(spec_text(transitions=t), match=match)


def test_rejects_an_ignore_rule_with_an_unknown_reason() -> None:
    rejects(spec_text(ignore=['from = ["a"]\non = ["tick"]\nreason = "nope"']), match="unknown reason code 'nope'")


def test_rejects_a_rule_that_is_both_transition_and_ignore() -> None:
    rejects(spec_text(ignore=BASE["ignore"] + ['from = ["b"]\non = ["go"]\nreason = "r"']),
            match="ignore rule duplicates an existing transition")


# -- the real spec and the generated table --------------------------------------------------------


def test_the_real_spec_validates() -> None:
    spec = load()
    assert set(spec.machines) == {"producer", "consumer", "session", "probe", "serve"}
    for m in spec.machines.values():
        for s in m.states:
            if s.name not in m.final and s.name != m.initial:
                assert s.timer or s.exit, (m.name, s.name)  # every_state_has_deadline_or_exit


def test_generated_table_is_fresh() -> None:
    """Editing spec/lifecycle.toml without `python -m tools gen` fails here."""
    assert specgen.table_path(ROOT).read_text() == specgen.render(load())


def test_any_spec_edit_makes_the_table_stale() -> None:
    edited = spec_path().read_text() + "\n# an innocent comment\n"
    assert specgen.render(loads(edited)) != specgen.table_path(ROOT).read_text()


def test_generated_table_has_the_do_not_edit_header() -> None:
    head = specgen.table_path(ROOT).read_text().splitlines()[:4]
    assert "GENERATED FILE" in head[1] and "DO NOT EDIT" in head[1]
    assert "spec/lifecycle.toml" in head[2]


def test_spec_sha256_matches_the_spec_file() -> None:
    assert _table.SPEC_SHA256 == hashlib.sha256(spec_path().read_bytes()).hexdigest()
    assert load().sha256 == _table.SPEC_SHA256


def test_render_is_deterministic() -> None:
    assert specgen.render(load()) == specgen.render(load())


def test_specgen_check_exit_codes(tmp_path: Path) -> None:
    assert run(["gen", "--check"]) == 0
    stale = tmp_path / "_table.py"
    stale.write_text(specgen.table_path(ROOT).read_text() + "# edited by hand\n")
    assert run(["gen", "--check", "--out", str(stale)]) == 1
    assert run(["gen", "--check", "--out", str(tmp_path / "missing.py")]) == 1
    bad = tmp_path / "bad.toml"
    bad.write_text(spec_text(ignore=[]))
    assert run(["gen", "--check", "--spec", str(bad), "--out", str(stale)]) == 2
    # regenerating into the stale file makes it fresh
    assert run(["gen", "--out", str(stale)]) == 0
    assert run(["gen", "--check", "--out", str(stale)]) == 0


def test_the_tools_run_as_a_module_from_the_checkout_only(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools", "gen", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    # outside any checkout (the tools still importable): a clear refusal, nothing written
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tools", "gen"], cwd=tmp_path, capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 1 and "is not inside a kvtier checkout" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []
    proc = subprocess.run([sys.executable, "-m", "tools", "--root", str(tmp_path), "gen", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "is not a kvtier checkout" in proc.stderr, proc.stderr


def test_rejects_a_timer_that_fires_into_a_state_with_the_same_timer() -> None:
    states = dict(BASE["states"], c='{ doc = "same timer", timer = "t" }')
    t = [
        'from = ["a"]\non = "go"\nto = "b"',
        'from = ["b"]\non = "go"\nto = "z"',
        'from = ["b"]\non = "tick"\nto = "c"',  # the deadline fired; c names t too: never re-armed
        'from = ["c"]\non = "go"\nto = "z"',
        'from = ["c"]\non = "tick"\nto = "z"',
    ]
    rejects(spec_text(states=states, transitions=t), match="same timer")
