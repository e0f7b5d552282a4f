"""The exact wording of every kind of config refusal (B25): one case per converter and per check,
so a change of how keys are declared cannot change what an operator reads."""

from __future__ import annotations

import pytest

from kvtier.config import TierConfig, TierConfigError
from kvtier.config_kinds import shown
from tests.config_helpers import build

CASES = [
    ("unbound_store_timeout_s", True,
     "a bool is not accepted as a number (Python's bool is an int; write a number)"),
    ("unbound_store_timeout_s", "0x10", "not a decimal number"),
    ("unbound_store_timeout_s", [1], "expected a number or numeric string, got a list"),
    ("unbound_store_timeout_s", float("nan"), "NaN is not allowed"),
    ("unbound_store_timeout_s", float("-inf"), "must be finite"),
    ("unbound_store_timeout_s", 0, "must be > 0 (range 0.001..86400.0 s)"),
    ("unbound_store_timeout_s", "1e999", "above the maximum 86400.0 s"),
    ("unbound_store_timeout_s", "1e-999", "below the minimum 0.001 s"),
    ("heartbeat_interval_s", 3601, "above the maximum 3600.0 s"),
    ("serve_max_pinned_fraction", 2, "above the maximum 1.0"),
    ("max_peers", 4097, "above the maximum 4096"),
    ("max_peers", "1e999", "above the maximum 4096"),
    ("max_peers", 0, "below the minimum 1"),
    ("max_peers", "0.5", "below the minimum 1"),  # the range is checked before the fraction
    ("max_peers", 1.5, "must be an integer (has a fractional part)"),
    ("max_peers", float("inf"), "must be a finite integer"),
    ("metrics_port", 65536, "above the maximum 65535"),
    ("metrics_port", "x", "not a decimal number"),
    ("type", "", "must not be empty"),
    ("type", 5, "expected a string, got an integer"),
    ("type", "1abc", "must be a Python identifier"),
    ("module_path", "a." * 200, "longer than 256 characters"),
    ("host", "a b", "must be an address without whitespace, '/' or a port (the port goes in 'port')"),
    ("host", "localhost:1", "must be an address without whitespace, '/' or a port (the port goes in 'port')"),
    ("auth_secret_key_file", "a\x00b", "must be a file path"),
    ("hash_seed", "s" * 1025, "longer than 1024 characters"),
    ("park_clock", "last", "must be one of 'last_store', 'first_store'; did you mean 'last_store'?"),
    ("park_clock", None, "must be one of 'last_store', 'first_store'"),
    ("data_plane", 1, "must be one of 'zmq', 'nixl'"),
    ("background_poll", 1, "expected true or false (a real bool; 0/1 and strings are rejected)"),
    ("locality", 5, "expected a string or null, got an integer"),
    ("locality", "l" * 65, "longer than 64 characters"),
    ("backends", "UCX", "expected a list of strings, got a string"),
    ("backends", [], "must list 1..16 names"),
    ("backends", ["UCX", "UCX"], "names a backend twice"),
    ("backends", ["bad name"], "'bad name' is not a name of 1..64 [A-Za-z0-9_] characters"),
    ("serve_allowed_principals", [], 'must list 1..4096 principals (["*"]: any authenticated peer)'),
    ("serve_allowed_principals", ["-x"], "'-x' is neither \"*\" nor a principal name"),
    ("allowed_peers", [], 'must not be empty (use ["*"] for any peer)'),
]


@pytest.mark.parametrize(("key", "value", "why"), CASES, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(CASES)])
def test_a_refusal_reads_key_value_and_why(key, value, why):
    with pytest.raises(TierConfigError) as exc:
        build(key, value)
    assert str(exc.value) == f"{key}={shown(value)}: {why}"  # long values are cut at 120 characters
    assert exc.value.keys == (key,)


def test_backpressure_says_how_to_remove_it():
    with pytest.raises(TierConfigError) as exc:
        build("backpressure", {})
    assert str(exc.value).startswith("backpressure={}: kvtier does its own flow control (")
    assert str(exc.value).endswith("(vLLM merges a top-level 'backpressure' block into every tier).")


def test_every_problem_of_a_config_is_named_at_once() -> None:
    """A user fixing a config is told every bad value, then every broken relation, in one error
    (each line as it would read alone), not one per attempt."""
    from kvtier.config import TierConfig

    with pytest.raises(TierConfigError) as exc:
        TierConfig.from_dict({"port": 70000, "load_timeout_s": "x", "peer_timeout_s": -1})
    assert str(exc.value) == ("3 problems:\n  - port=70000: above the maximum 65535\n"
                              "  - load_timeout_s='x': not a decimal number\n"
                              "  - peer_timeout_s=-1: must be > 0 (range 0.001..86400.0 s)")
    assert exc.value.keys == ("port", "load_timeout_s", "peer_timeout_s")
    with pytest.raises(TierConfigError) as exc:
        TierConfig.from_dict({"peer_timeout_s": 1, "heartbeat_interval_s": 5, "port": 5710, "metrics_port": 5710,
                              "auth": "curve"})
    lines = str(exc.value).split("\n")
    assert lines[0] == "4 problems:" and len(lines) == 5
    assert "violate peer_timeout_s >= 2 * heartbeat_interval_s" in lines[1]
    assert lines[2].startswith("  - metrics_port=5710 is port too")
    assert [ln.split(" needs ")[0] for ln in lines[3:5]] == ["  - auth='curve'"] * 2
    assert exc.value.keys == ("peer_timeout_s", "heartbeat_interval_s", "port", "metrics_port", "auth",
                              "auth_secret_key_file", "auth_allowed_keys_dir")


def test_an_unknown_key_and_bad_values_are_named_in_one_error() -> None:
    """A typo does not hide the bad values beside it: the unknown key first, then each bad value."""
    with pytest.raises(TierConfigError) as exc:
        TierConfig.from_dict({"prot": 5, "port": "x", "unbound_store_timeout_s": True})
    lines = str(exc.value).split("\n")
    assert lines[0] == "3 problems:" and "'prot' (did you mean 'port'?)" in lines[1], lines
    assert lines[2] == "  - port='x': not a decimal number" and lines[3].startswith("  - unbound_store_timeout_s=true")
    assert exc.value.keys == ("prot", "port", "unbound_store_timeout_s")


def test_a_p2p_key_with_no_counterpart_says_to_drop_it() -> None:
    """vLLM p2p's ``num_threads`` carried over: the refusal says it has no kvtier counterpart
    (a did-you-mean pointed at ``digest_threads``, an unrelated key)."""
    with pytest.raises(TierConfigError) as exc:
        TierConfig.from_dict({"num_threads": 4})
    assert "kvtier has no such key, drop it" in str(exc.value) and "did you mean" not in str(exc.value)


@pytest.mark.parametrize(("backends", "says"), [
    (["POSIX"], "'POSIX' is a NIXL storage backend (files, objects): it cannot carry blocks between instances; "
                'use ["UCX"]'),
    (["UCX", "GDS"], "'GDS' is a NIXL storage backend"),
    (["ucx"], "'ucx': NIXL's backend names are case-sensitive; did you mean 'UCX'?"),
])
def test_a_backend_that_can_never_carry_blocks_is_refused_before_the_engine_starts(backends, says) -> None:
    """``kvtier check-config`` and the manager refuse it at once, as the engine's start would
    (an outside tester's entries passed the check, then failed the start)."""
    with pytest.raises(TierConfigError) as err:
        TierConfig.from_dict({"data_plane": "nixl", "backends": backends})
    assert says in str(err.value)
    assert TierConfig.from_dict({"data_plane": "nixl", "backends": ["UCX", "LIBFABRIC"]}).backends == ("UCX", "LIBFABRIC")
