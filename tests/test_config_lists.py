"""``allowed_peers`` (a peer list) and the boolean keys: each refusal's exact message and key, and
the list's size limit exactly at and one past its bound."""

from __future__ import annotations

import pytest

from kvtier.config import TierConfig, TierConfigError
from kvtier.config_kinds import MAX_ALLOWED_PEERS, safe_repr, shown


def refused(entry: dict) -> TierConfigError:
    with pytest.raises(TierConfigError) as info:
        TierConfig.from_dict(entry)
    return info.value


@pytest.mark.parametrize(("value", "why"), [
    ("10.0.0.1", "expected a list of strings, got a string"),
    ({"a": 1}, "expected a list of strings, got an object"),
    ([], 'must not be empty (use ["*"] for any peer)'),
])
def test_allowed_peers_refusals_name_the_key_and_the_value(value: object, why: str) -> None:
    err = refused({"allowed_peers": value})
    assert str(err) == f"allowed_peers={safe_repr(value)}: {why}"
    assert err.keys == ("allowed_peers",)


def test_allowed_peers_up_to_the_limit_is_taken_one_more_is_refused() -> None:
    limit = MAX_ALLOWED_PEERS
    at = [f"10.0.{i // 256}.{i % 256}" for i in range(limit)]
    assert TierConfig.from_dict({"allowed_peers": at}).allowed_peers == tuple(at)
    over = [*at, "10.255.0.1"]
    err = refused({"allowed_peers": over})
    assert str(err) == f"allowed_peers={safe_repr(over)}: more than {limit} entries"
    assert err.keys == ("allowed_peers",)


@pytest.mark.parametrize("key", ["serve_external", "background_poll"])
@pytest.mark.parametrize("value", [1, 0, "true", None])
def test_booleans_refuse_anything_but_a_bool_by_name(key: str, value: object) -> None:
    err = refused({key: value})
    assert str(err) == f"{key}={shown(value)}: expected true or false (a real bool; 0/1 and strings are rejected)"
    assert err.keys == (key,)
    assert getattr(TierConfig.from_dict({key: True}), key) is True
