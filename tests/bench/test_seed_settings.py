"""``python -m bench.seed --set KEY=VALUE``: config keys of every kvtier tier in a P0 run, to measure
what one costs (e.g. ``--set integrity=none``: the digests' share of a hand-off)."""

from __future__ import annotations

import pytest

from bench.seed import config_settings


def test_values_are_json_where_they_parse_and_strings_otherwise() -> None:
    assert config_settings(["integrity=none", "digest_threads=1", "background_poll=true", "x=0.5", "k=a=b"]) == {
        "integrity": "none", "digest_threads": 1, "background_poll": True, "x": 0.5, "k": "a=b"}
    assert config_settings([]) == {}


@pytest.mark.parametrize("bad", ["integrity", "=none"])
def test_a_pair_without_a_key_and_an_equals_sign_is_named(bad: str) -> None:
    with pytest.raises(SystemExit, match=f"--set {bad!r}: expected KEY=VALUE"):
        config_settings([bad])
