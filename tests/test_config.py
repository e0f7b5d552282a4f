"""TierConfig: the defaults, strict conversion of every key's values, unknown keys (B25)."""

from __future__ import annotations

import re
from decimal import Decimal

import attrs
import pytest

from kvtier.config import DEFAULTS, MAX_TIMEOUT_S, MIN_DURATION_S, TierConfig, TierConfigError
from tests.config_helpers import EXPECTED_DEFAULTS, FLOAT_KEYS, INT_KEYS, assert_names, build, row, value_id


# --------------------------------------------------------------------- defaults


def test_defaults_match_the_design():
    assert dict(DEFAULTS) == EXPECTED_DEFAULTS
    assert list(DEFAULTS) == list(EXPECTED_DEFAULTS)  # declaration order
    cfg = TierConfig()
    assert {a.name: getattr(cfg, a.name) for a in attrs.fields(TierConfig)} == EXPECTED_DEFAULTS
    for key, value in EXPECTED_DEFAULTS.items():
        assert type(DEFAULTS[key]) is type(value), key


def test_defaults_mapping_is_read_only():
    with pytest.raises(TypeError):
        DEFAULTS["port"] = 1  # type: ignore[index]


def test_error_is_a_value_error():
    assert issubclass(TierConfigError, ValueError)


# ------------------------------------------------------------------ B25 matrix


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("180", 180.0),
        (" 180\n", 180.0),
        ("59.5", 59.5),
        (59.5, 59.5),
        (180, 180.0),
        ("1e3", 1000.0),
        ("+7", 7.0),
        (".5", 0.5),
        ("86400", 86400.0),
        (MIN_DURATION_S, MIN_DURATION_S),
        # the exact decimal 0.001 lies just below the float 0.001: the range
        # check must compare the correctly rounded float (found by Hypothesis)
        ("0.001", 0.001),
        ("86400.0", 86400.0),
    ],
)
def test_b25_accepted(value, expected):
    cfg = build("unbound_store_timeout_s", value)
    assert cfg.unbound_store_timeout_s == expected
    assert type(cfg.unbound_store_timeout_s) is float


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        float("nan"),
        float("inf"),
        float("-inf"),
        -1,
        0,
        -0.0,
        1e12,
        86400.5,
        10**400,
        "1e999",
        "-1e999",
        "1e-999",
        1e-320,
        "nan",
        "NaN",
        "inf",
        "Infinity",
        "0x10",
        "1_000",
        "",
        "  ",
        "abc",
        "1.2.3",
        "\u0661\u0662\u0663",  # Arabic-Indic digits: not plain ASCII decimals
        None,
        [],
        [180],
        {},
        b"180",
        bytearray(b"180"),
        Decimal("2.5"),
        1j,
    ],
    ids=value_id,
)
def test_b25_rejected_naming_the_key(value):
    with pytest.raises(TierConfigError) as exc:
        build("unbound_store_timeout_s", value)
    assert_names(exc.value, "unbound_store_timeout_s", value)


def test_b25_specific_reasons():
    def msg(v):
        with pytest.raises(TierConfigError) as exc:
            build("unbound_store_timeout_s", v)
        return str(exc.value)

    assert "bool" in msg(True)
    assert "NaN" in msg(float("nan"))
    assert "finite" in msg(float("inf"))
    assert "> 0" in msg(0)
    assert "> 0" in msg(-1)
    assert "maximum" in msg(1e12)
    assert "maximum" in msg(10**400)
    assert "maximum" in msg("1e999")
    assert "minimum" in msg(1e-9)


def test_b25_misspelled_key_suggests_the_right_one():
    with pytest.raises(TierConfigError) as exc:
        TierConfig.from_dict({"unbound_store_timout_s": 180})
    msg = str(exc.value)
    assert "'unbound_store_timout_s'" in msg
    assert "did you mean 'unbound_store_timeout_s'?" in msg
    assert exc.value.keys == ("unbound_store_timout_s",)


@pytest.mark.parametrize("spelled", ["UNBOUND_STORE_TIMEOUT_S", "Unbound-Store-Timeout-S", "METRICS_PORT"])
def test_a_key_spelled_in_capitals_or_with_dashes_still_gets_its_did_you_mean(spelled: str) -> None:
    with pytest.raises(TierConfigError) as exc:
        TierConfig.from_dict({spelled: 1})
    want = spelled.lower().replace("-", "_")
    assert f"{spelled!r} (did you mean {want!r}?)" in str(exc.value), str(exc.value)


def test_huge_int_whose_repr_would_raise_still_names_the_key():
    # repr(10**5000) itself raises ValueError (int->str digit limit).
    with pytest.raises(TierConfigError) as exc:
        build("unbound_store_timeout_s", 10**5000)
    assert str(exc.value).startswith("unbound_store_timeout_s=<int of ")
    with pytest.raises(TierConfigError, match="max_peers"):
        build("max_peers", 10**5000)


def test_long_bad_value_is_truncated_in_the_message():
    with pytest.raises(TierConfigError) as exc:
        build("unbound_store_timeout_s", "x" * 10_000)
    assert len(str(exc.value)) < 300


# ------------------------------------------------------------ per-key bad values

_FLOAT_BAD = [
    True, False, float("nan"), float("inf"), float("-inf"), 0, 0.0, -1, -0.5,
    10**400, "1e999", "nan", "inf", "", "1 0", None, [1], {"a": 1}, b"1", Decimal("1"),
]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", _FLOAT_BAD, ids=value_id)
def test_every_float_key_rejects(key, value):
    with pytest.raises(TierConfigError) as exc:
        build(key, value)
    assert_names(exc.value, key, value)


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_has_a_cap_and_a_floor(key):
    kind = row(key)
    assert 0 < kind.minimum < kind.maximum <= MAX_TIMEOUT_S
    with pytest.raises(TierConfigError, match=re.escape(key) + ".*maximum"):
        build(key, kind.maximum * 2)
    with pytest.raises(TierConfigError, match=re.escape(key) + ".*minimum"):
        build(key, kind.minimum / 2)


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_accepts_its_default_as_a_string(key):
    cfg = build(key, f" {EXPECTED_DEFAULTS[key]!r}\n")
    assert getattr(cfg, key) == EXPECTED_DEFAULTS[key]


_INT_BAD = [
    True, False, 1.5, "1.5", "1e-3", float("nan"), float("inf"), "inf", "nan", 10**400,
    "1e999", None, "", "abc", "0x10", [1], b"1", Decimal("1"), 1e300,
]


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", _INT_BAD, ids=value_id)
def test_every_int_key_rejects(key, value):
    with pytest.raises(TierConfigError) as exc:
        build(key, value)
    assert_names(exc.value, key, value)


@pytest.mark.parametrize("key", INT_KEYS)
def test_every_int_key_has_documented_bounds(key):
    kind = row(key)
    with pytest.raises(TierConfigError, match=re.escape(key) + ".*maximum"):
        build(key, kind.maximum + 1)
    with pytest.raises(TierConfigError, match=re.escape(key) + ".*minimum"):
        build(key, kind.minimum - 1)
    assert getattr(build(key, kind.maximum), key) == kind.maximum
    assert getattr(build(key, kind.minimum), key) == kind.minimum
    assert str(kind.maximum) in kind.validation


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("spelling", ["{n}", " {n}\n", "{n}.0", "{n}.000", "+{n}"])
def test_every_int_key_accepts_integral_spellings(key, spelling):
    n = EXPECTED_DEFAULTS[key] or 1
    cfg = build(key, spelling.format(n=n))
    assert getattr(cfg, key) == n
    assert type(getattr(cfg, key)) is int


def test_float_bounds_given_as_strings_are_inclusive():
    assert build("poll_interval_s", "0.0001").poll_interval_s == 0.0001
    cfg = TierConfig.from_dict(
        {"poll_interval_s": "1.0", "heartbeat_interval_s": "1", "peer_timeout_s": "2"}
    )
    assert cfg.poll_interval_s == 1.0


def test_int_accepts_integral_float_and_exponent_string():
    assert build("max_peers", 128.0).max_peers == 128
    assert build("max_peers", "1e3").max_peers == 1000
    assert build("port", "0").port == 0
    assert build("port", 65535).port == 65535


@pytest.mark.parametrize("value", [-1, 65536, "70000", 5710.9, True])
def test_port_range(value):
    with pytest.raises(TierConfigError, match="port"):
        build("port", value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("type", ""),
        ("type", "my.Class"),
        ("type", 3),
        ("type", None),
        ("module_path", "kvtier..vllm"),
        ("module_path", "kvtier/integrations"),
        ("module_path", b"kvtier"),
        ("host", ""),
        ("host", " 127.0.0.1"),
        ("host", "tcp://127.0.0.1"),
        ("host", 127),
        ("host", None),
        ("host", "h" * 300),
        ("host", "localhost:5710"),  # a port belongs in `port`: this would bind no device at start
        ("host", "[::1]:5710"),
        ("hash_seed", 0),
        ("hash_seed", None),
        ("hash_seed", "s" * 2000),
        ("locality", 5),
        ("locality", ["REMOTE"]),
        ("park_clock", "last-store"),
        ("park_clock", "LAST_STORE"),
        ("park_clock", ""),
        ("park_clock", None),
        ("park_clock", 1),
        ("background_poll", 1),
        ("background_poll", 0),
        ("background_poll", "true"),
        ("background_poll", "false"),
        ("background_poll", None),
        ("background_poll", 1.0),
        ("data_plane", "NIXL"),
        ("data_plane", "rdma"),
        ("backends", "UCX"),
        ("backends", []),
        ("backends", ["UCX", "UCX"]),
        ("backends", ["UCX", ""]),
        ("backends", ["ucx transport"]),
        ("backends", [1]),
        ("backends", ["B"] * 17),
    ],
)
def test_every_non_numeric_key_rejects(key, value):
    with pytest.raises(TierConfigError) as exc:
        build(key, value)
    assert_names(exc.value, key, value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("type", "MyTier"),
        ("module_path", "my_pkg.sub.mod"),
        ("host", "0.0.0.0"),
        ("host", "::1"),
        ("host", "[::1]"),
        ("host", "fe80::1%eth0"),
        ("host", "node-7.example.org"),
        ("hash_seed", ""),
        ("hash_seed", "12345"),
        ("locality", None),
        ("locality", "REMOTE"),
        ("park_clock", "first_store"),
        ("park_clock", "last_store"),
        ("background_poll", True),
        ("background_poll", False),
        ("data_plane", "nixl"),
    ],
)
def test_non_numeric_key_accepts(key, value):
    assert getattr(build(key, value), key) == value


@pytest.mark.parametrize("value", [["UCX"], ("UCX", "GPUNETIO"), ["MOONCAKE"], ["LIBFABRIC", "UCX"]])
def test_backends_accepts_lists_of_backend_names(value):
    cfg = build("backends", value)
    assert cfg.backends == tuple(value)
    assert TierConfig.from_dict(cfg.to_dict()) == cfg


def test_park_clock_suggests_the_close_choice():
    with pytest.raises(TierConfigError, match="did you mean 'last_store'"):
        build("park_clock", "last-store")


@pytest.mark.parametrize(
    "value", [{}, {"backpressure_cls": "EMABackpressureDetector"}, "on", True, 0, object()]
)
def test_backpressure_must_be_absent(value):
    with pytest.raises(TierConfigError) as exc:
        build("backpressure", value)
    msg = str(exc.value)
    assert msg.startswith("backpressure=")
    assert "own flow control" in msg
    assert "top level" in msg


def test_backpressure_none_is_the_same_as_absent():
    assert build("backpressure", None) == TierConfig()


# -- metrics_port: null (off) or a port, converted like the integer keys -----------------------------


@pytest.mark.parametrize("value", [v for v in _INT_BAD if v is not None] + [-1, 65536, "65536", "-1"], ids=value_id)
def test_metrics_port_rejects(value):
    with pytest.raises(TierConfigError) as exc:
        build("metrics_port", value)
    assert_names(exc.value, "metrics_port", value)


@pytest.mark.parametrize(("value", "expected"), [(None, None), (0, 0), (9464, 9464), ("9464", 9464),
                                                 (" 9464\n", 9464), (9464.0, 9464), (65535, 65535)])
def test_metrics_port_accepts(value, expected):
    cfg = build("metrics_port", value)
    assert cfg.metrics_port == expected
    assert TierConfig.from_dict(cfg.to_dict()) == cfg
