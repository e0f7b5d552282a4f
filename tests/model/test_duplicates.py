"""Duplicates of every message in every state: a network duplicate is idempotent.

The (state, message) pairs come from the generated tables (every ``(state, event)`` of a machine
whose event is a wire message's tag) and the model check's searches (every profile,
tests/model/conftest.py): each message the searches delivered is delivered a second time on the
core the first delivery left, and each step is traced per machine (the state the message met,
the effects produced).  What the duplicates must do, from the spec:

* no repeated result and no repeated release: no ``JobDone``, ``ReleasePins`` or ``SendBlocks`` (the
  job, the pins and the blocks were answered, released or sent by the original);
* an input the table drops (an ``ignore`` rule: "a late, duplicate or out-of-order input ...;
  counted and dropped", or the ``note_duplicate`` effect) is counted: the step reports an
  ``Ignored`` effect, which ``kvtier_ignored_inputs_total`` counts;
* every message of every machine the searches delivered is duplicated in at least one state, and
  in every state where the table drops it (the copy then meets the same state).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.lifecycle import _table as T
from tests.model.conftest import MESSAGE_TYPES, UNROUTED

TABLES = {name: getattr(T, f"{name.upper()}_TABLE") for name in ("producer", "consumer", "session", "probe", "serve")}
#: (machine, state, message) -> the table's rule, for every message event of every machine
PAIRS: dict[tuple[str, str, str], Any] = {
    (name, state.value, event.value): rule
    for name, table in TABLES.items()
    for (state, event), rule in table.items()
    if event.value in MESSAGE_TYPES
}
NO_SECOND = ("JobDone", "ReleasePins", "SendBlocks")


def _counted(rule: Any) -> bool:
    """Whether the table says this input is dropped and counted."""
    if rule.kind == T.IGNORE:
        return True
    return rule.kind == T.TRANSITION and all("note_duplicate" in b.effects for b in rule.branches)


def test_the_pairs_come_from_the_tables() -> None:
    events = {(m, e) for m, _, e in PAIRS}
    assert {("producer", "fetch"), ("producer", "receipt"), ("producer", "abort_fetch"),
            ("consumer", "transfer_done"), ("consumer", "block_data"), ("consumer", "abort_ack"),
            ("session", "hello"), ("session", "hello_ack"), ("session", "ping"), ("session", "pong"),
            ("probe", "probe_reply"), ("probe", "transfer_done"),
            ("serve", "probe"), ("serve", "fetch"), ("serve", "receipt"), ("serve", "abort_fetch")} <= events


def test_a_duplicate_never_answers_releases_or_sends_blocks_twice(profile_runs) -> None:
    assert profile_runs.again, "the searches delivered no message"
    bad = {pair: kinds for pair, counts in profile_runs.again.items()
           for kinds in counts if any(k in kinds for k in NO_SECOND)}
    assert not bad, f"duplicates with a second result, release or transfer: {bad}"


def test_a_duplicate_the_table_drops_is_counted(profile_runs) -> None:
    uncounted = {}
    for pair, counts in profile_runs.again.items():
        if pair in PAIRS and _counted(PAIRS[pair]):
            missing = [kinds for kinds in counts if "Ignored" not in kinds]
            if missing:
                uncounted[pair] = missing
    assert not uncounted, f"dropped without being counted: {uncounted}"
    assert any(_counted(PAIRS[p]) for p in profile_runs.again if p in PAIRS)


def test_every_message_is_duplicated_wherever_its_original_can_leave_a_record(profile_runs) -> None:
    """Every traced pair is one of the table's; every message the searches delivered to a machine
    was also duplicated (to one, or dropped by the core before any machine: below); and for every
    (state, message) a first delivery met whose rule drops it (so the record stays), a duplicate
    met that state too."""
    def routed(d: dict) -> set:
        return {p for p in d if p[0] != UNROUTED}

    first, again = routed(profile_runs.first), routed(profile_runs.again)
    assert first <= set(PAIRS) and again <= set(PAIRS)
    # a copy no machine meets: the core drops it (its session's generation is dead: the original
    # was a disconnect or a hello_reject, or ended the session otherwise) or answers it itself (a
    # probe while serving is off or shutting down: refused again); never a result or a release
    gated = {e for m, _, e in profile_runs.again if m == UNROUTED}
    for e in gated:
        kinds = set(profile_runs.again[(UNROUTED, "-", e)])
        assert kinds <= {(), ("Ignored",), ("Send",), ("Ignored", "Send")}, (e, kinds)
    delivered = {(m, e) for m, _, e in first}
    duplicated = {(m, e) for m, _, e in again}
    assert {(m, e) for m, e in delivered if e not in gated} <= duplicated, sorted(delivered - duplicated)
    assert {e for _, e in delivered} <= {e for _, e in duplicated} | gated
    # where the table drops the original, the record stays, and its copy meets the same state
    staying = {p for p in first if PAIRS[p].kind == T.IGNORE}
    assert staying and staying <= again, sorted(staying - again)
    print(f"{len(PAIRS)} (state, message) pairs in the tables; the searches delivered messages in "
          f"{len(first)} of them and duplicates in {len(again)}; copies dropped before any machine: {sorted(gated)}")


@pytest.mark.parametrize("machine", sorted(TABLES))
def test_each_machine_meets_duplicates(profile_runs, machine: str) -> None:
    assert any(m == machine for m, _, _ in profile_runs.again), machine
