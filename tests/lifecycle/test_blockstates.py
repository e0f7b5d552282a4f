"""A load's per-position slot states (kvtier.lifecycle.blockstates): never a truth value, each
landing's start and answer moving exactly its own positions, a stale answer left alone, the
counts the consumer's guards read kept exact, the prefix a failed load may report, and the raw
bytes the model checker exports read back strictly (decision I21)."""

from __future__ import annotations

import pytest

from kvtier.lifecycle.blockstates import BlockState, BlockStates

E, U, V, F = BlockState.EMPTY, BlockState.UNCHECKED, BlockState.VERIFIED, BlockState.FAILED


def _states(s: BlockStates) -> list[BlockState]:
    return [s[i] for i in range(len(s))]


def test_neither_a_state_nor_the_states_is_a_truth_value() -> None:
    with pytest.raises(TypeError, match=r"^a BlockState is not a truth value: compare it with "
                                        r"BlockState\.VERIFIED \(decision I21\)$"):
        bool(V)
    with pytest.raises(TypeError, match=r"^BlockStates is not a truth value: ask prefix\(\), verified or unchecked$"):
        bool(BlockStates(2))


def test_a_landing_moves_exactly_its_positions_and_the_counts_follow() -> None:
    s = BlockStates(6)
    assert s.untouched(0, 6) and (s.verified, s.unchecked) == (0, 0)
    s.start(2, 2)
    assert _states(s) == [E, E, U, U, E, E] and s.unchecked == 2
    assert s.untouched(0, 2) and s.untouched(4, 2) and not s.untouched(1, 2) and not s.untouched(3, 3)
    s.start(4, 1)
    assert s.unchecked == 3  # counted on top of the first landing
    s.settle(2, 2, ok=True)
    assert _states(s) == [E, E, V, V, U, E] and (s.verified, s.unchecked) == (2, 1)
    s.settle(4, 1, ok=False)
    assert _states(s) == [E, E, V, V, F, E] and (s.verified, s.unchecked) == (2, 0)
    assert repr(s) == "BlockStates(..vvx.)"


def test_an_answer_moves_only_its_unchecked_positions() -> None:
    s = BlockStates(5)
    s.start(0, 1)
    s.start(3, 2)
    s.settle(3, 1, ok=True)  # position 0 is unchecked too, but not this answer's
    assert _states(s) == [U, E, E, V, U] and (s.verified, s.unchecked) == (1, 2)
    s.settle(3, 1, ok=False)  # a stale answer for a settled position changes nothing
    s.settle(1, 2, ok=True)  # nor one for positions never started
    assert _states(s) == [U, E, E, V, U] and (s.verified, s.unchecked) == (1, 2)
    s.settle(4, 3, ok=True)  # an answer running past the end settles what exists
    assert _states(s) == [U, E, E, V, V] and (s.verified, s.unchecked) == (2, 1)


@pytest.mark.parametrize(("raw", "prefix"), [(b"\x02\x02\x02", 3), (b"\x02\x00\x02", 1), (b"\x02\x02\x03", 2),
                                             (b"\x01\x02", 0), (b"", 0)])
def test_the_prefix_is_the_leading_run_of_verified_positions(raw: bytes, prefix: int) -> None:
    assert BlockStates.from_raw(raw).prefix() == prefix


def test_raw_bytes_read_back_with_their_counts_and_nothing_else() -> None:
    s = BlockStates.from_raw(bytes([0, 1, 2, 3, 1, 2]))
    assert _states(s) == [E, U, V, F, U, V] and (s.verified, s.unchecked) == (2, 2)
    assert s.raw() == bytes([0, 1, 2, 3, 1, 2]) and len(s) == 6
    with pytest.raises(ValueError, match=r"^4 is not a block state$"):
        BlockStates.from_raw(bytes([0, 3, 4]))
