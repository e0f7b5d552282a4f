"""TierConfig: strict conversion, unknown keys, cross-field rules, docs (B25)."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import config as config_mod
from tools import docgen
from tools.cli import run
from tools.docgen import render_page
from kvtier.config import (
    CROSS_FIELD_RULES,
    DEFAULTS,
    MAX_TIMEOUT_S,
    MIN_DURATION_S,
    TierConfig,
    TierConfigError,
    config_table,
)

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "configuration.md"

# The defaults the design fixes (written out independently of the code, so a
# silent change of a code default fails here as well as in the doc test).
EXPECTED_DEFAULTS = {
    "type": "KvTierSecondaryTier",
    "module_path": "kvtier.integrations.vllm",
    "host": "127.0.0.1",
    "port": 0,
    "metrics_port": None,
    "locality": None,
    "backpressure": None,
    "unbound_store_timeout_s": 60.0,
    "park_clock": "last_store",
    "tombstone_retention_s": 600.0,
    "tombstone_max": 65536,
    "fetch_supply_timeout_s": 10.0,
    "transfer_timeout_s": 30.0,
    "load_timeout_s": 30.0,
    "abort_ack_timeout_s": 5.0,
    "revoke_timeout_s": 1.0,
    "handshake_timeout_s": 5.0,
    "connect_timeout_s": 2.0,
    "heartbeat_interval_s": 1.0,
    "peer_timeout_s": 5.0,
    "shutdown_grace_s": 3.0,
    "max_peers": 128,
    "max_blocks_per_fetch": 65536,
    "max_pending_fetches_per_peer": 1024,
    "max_message_bytes": 1 << 20,
    "hash_seed": "",
    "data_plane": "zmq",
    "backends": ("UCX",),
    "nixl_progress_interval_s": 0.001,
    "integrity": "xxh3_64",
    "digest_threads": None,
    "instance": "",

    "auth": "none",
    "auth_secret_key_file": "",
    "auth_allowed_keys_dir": "",
    "allowed_peers": ("*",),
    # the symmetric path (decisions Y6, Y7)
    "serve_external": False,
    "serve_allowed_principals": ("*",),
    "probe_timeout_s": 1.0,
    "serve_lookup_timeout_s": 0.25,
    "offer_timeout_s": 10.0,
    "serve_max_rounds_per_peer": 256,
    "serve_max_probes_per_round": 8,
    "serve_max_pinned_blocks_per_peer": 16384,
    "serve_max_pinned_fraction": 0.5,
    "poll_interval_s": 0.001,
    "background_poll": False,
}

FLOAT_KEYS = [k for k, v in EXPECTED_DEFAULTS.items() if isinstance(v, float)]
INT_KEYS = [
    k for k, v in EXPECTED_DEFAULTS.items() if isinstance(v, int) and not isinstance(v, bool)
]
# Duration keys that no cross-field rule constrains: any in-range value is valid.
FREE_FLOAT_KEYS = ["unbound_store_timeout_s", "tombstone_retention_s", "transfer_timeout_s"]


def _id(value) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


def _build(key, value):
    return TierConfig.from_dict({key: value})


def _assert_names(err: TierConfigError, key: str, value) -> None:
    msg = str(err)
    assert key in msg, msg
    text = repr(value)
    if len(text) < 100:
        assert text in msg, msg
    assert key in err.keys


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
    cfg = _build("unbound_store_timeout_s", value)
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
    ids=_id,
)
def test_b25_rejected_naming_the_key(value):
    with pytest.raises(TierConfigError) as exc:
        _build("unbound_store_timeout_s", value)
    _assert_names(exc.value, "unbound_store_timeout_s", value)


def test_b25_specific_reasons():
    def msg(v):
        with pytest.raises(TierConfigError) as exc:
            _build("unbound_store_timeout_s", v)
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


def test_huge_int_whose_repr_would_raise_still_names_the_key():
    # repr(10**5000) itself raises ValueError (int->str digit limit).
    with pytest.raises(TierConfigError) as exc:
        _build("unbound_store_timeout_s", 10**5000)
    assert str(exc.value).startswith("unbound_store_timeout_s=<int of ")
    with pytest.raises(TierConfigError, match="max_peers"):
        _build("max_peers", 10**5000)


def test_long_bad_value_is_truncated_in_the_message():
    with pytest.raises(TierConfigError) as exc:
        _build("unbound_store_timeout_s", "x" * 10_000)
    assert len(str(exc.value)) < 300


# ------------------------------------------------------------ per-key bad values

_FLOAT_BAD = [
    True, False, float("nan"), float("inf"), float("-inf"), 0, 0.0, -1, -0.5,
    10**400, "1e999", "nan", "inf", "", "1 0", None, [1], {"a": 1}, b"1", Decimal("1"),
]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", _FLOAT_BAD, ids=_id)
def test_every_float_key_rejects(key, value):
    with pytest.raises(TierConfigError) as exc:
        _build(key, value)
    _assert_names(exc.value, key, value)


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_has_a_cap_and_a_floor(key):
    kind = attrs.fields_dict(TierConfig)[key].metadata[config_mod._KIND]
    assert 0 < kind.lo < kind.hi <= MAX_TIMEOUT_S
    with pytest.raises(TierConfigError, match=re.escape(key) + ".*maximum"):
        _build(key, kind.hi * 2)
    with pytest.raises(TierConfigError, match=re.escape(key) + ".*minimum"):
        _build(key, kind.lo / 2)


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_accepts_its_default_as_a_string(key):
    cfg = _build(key, f" {EXPECTED_DEFAULTS[key]!r}\n")
    assert getattr(cfg, key) == EXPECTED_DEFAULTS[key]


_INT_BAD = [
    True, False, 1.5, "1.5", "1e-3", float("nan"), float("inf"), "inf", "nan", 10**400,
    "1e999", None, "", "abc", "0x10", [1], b"1", Decimal("1"), 1e300,
]


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", _INT_BAD, ids=_id)
def test_every_int_key_rejects(key, value):
    with pytest.raises(TierConfigError) as exc:
        _build(key, value)
    _assert_names(exc.value, key, value)


@pytest.mark.parametrize("key", INT_KEYS)
def test_every_int_key_has_documented_bounds(key):
    kind = attrs.fields_dict(TierConfig)[key].metadata[config_mod._KIND]
    with pytest.raises(TierConfigError, match=re.escape(key) + ".*maximum"):
        _build(key, kind.hi + 1)
    with pytest.raises(TierConfigError, match=re.escape(key) + ".*minimum"):
        _build(key, kind.lo - 1)
    assert getattr(_build(key, kind.hi), key) == kind.hi
    assert getattr(_build(key, kind.lo), key) == kind.lo
    assert str(kind.hi) in kind.describe()


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("spelling", ["{n}", " {n}\n", "{n}.0", "{n}.000", "+{n}"])
def test_every_int_key_accepts_integral_spellings(key, spelling):
    n = EXPECTED_DEFAULTS[key] or 1
    cfg = _build(key, spelling.format(n=n))
    assert getattr(cfg, key) == n
    assert type(getattr(cfg, key)) is int


def test_float_bounds_given_as_strings_are_inclusive():
    assert _build("poll_interval_s", "0.0001").poll_interval_s == 0.0001
    cfg = TierConfig.from_dict(
        {"poll_interval_s": "1.0", "heartbeat_interval_s": "1", "peer_timeout_s": "2"}
    )
    assert cfg.poll_interval_s == 1.0


def test_int_accepts_integral_float_and_exponent_string():
    assert _build("max_peers", 128.0).max_peers == 128
    assert _build("max_peers", "1e3").max_peers == 1000
    assert _build("port", "0").port == 0
    assert _build("port", 65535).port == 65535


@pytest.mark.parametrize("value", [-1, 65536, "70000", 5710.9, True])
def test_port_range(value):
    with pytest.raises(TierConfigError, match="port"):
        _build("port", value)


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
        _build(key, value)
    _assert_names(exc.value, key, value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("type", "MyTier"),
        ("module_path", "my_pkg.sub.mod"),
        ("host", "0.0.0.0"),
        ("host", "::1"),
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
    assert getattr(_build(key, value), key) == value


@pytest.mark.parametrize("value", [["UCX"], ("UCX", "GDS"), ["MOONCAKE"], ["LIBFABRIC", "UCX"]])
def test_backends_accepts_lists_of_backend_names(value):
    cfg = _build("backends", value)
    assert cfg.backends == tuple(value)
    assert TierConfig.from_dict(cfg.to_dict()) == cfg


def test_park_clock_suggests_the_close_choice():
    with pytest.raises(TierConfigError, match="did you mean 'last_store'"):
        _build("park_clock", "last-store")


@pytest.mark.parametrize(
    "value", [{}, {"backpressure_cls": "EMABackpressureDetector"}, "on", True, 0, object()]
)
def test_backpressure_must_be_absent(value):
    with pytest.raises(TierConfigError) as exc:
        _build("backpressure", value)
    msg = str(exc.value)
    assert msg.startswith("backpressure=")
    assert "own flow control" in msg
    assert "top level" in msg


def test_backpressure_none_is_the_same_as_absent():
    assert _build("backpressure", None) == TierConfig()


# ------------------------------------------------------------------ cross-field


def test_cross_field_rules_are_the_designed_ones():
    texts = {r.text() for r in CROSS_FIELD_RULES}
    assert {
        "peer_timeout_s >= 2 * heartbeat_interval_s",
        "load_timeout_s > fetch_supply_timeout_s",
        "handshake_timeout_s < load_timeout_s",
        "abort_ack_timeout_s < load_timeout_s",
    } <= texts


@pytest.mark.parametrize(
    ("kwargs", "keys"),
    [
        ({"peer_timeout_s": 1.9, "heartbeat_interval_s": 1.0}, ("peer_timeout_s", "heartbeat_interval_s")),
        ({"heartbeat_interval_s": 3.0}, ("peer_timeout_s", "heartbeat_interval_s")),
        ({"load_timeout_s": 10.0}, ("load_timeout_s", "fetch_supply_timeout_s")),
        ({"fetch_supply_timeout_s": 31.0}, ("load_timeout_s", "fetch_supply_timeout_s")),
        ({"handshake_timeout_s": 30.0}, ("handshake_timeout_s", "load_timeout_s")),
        ({"abort_ack_timeout_s": 30.0}, ("abort_ack_timeout_s", "load_timeout_s")),
        ({"abort_ack_timeout_s": 40.0}, ("abort_ack_timeout_s", "load_timeout_s")),
        ({"poll_interval_s": 0.5, "heartbeat_interval_s": 0.1, "peer_timeout_s": 1.0},
         ("heartbeat_interval_s", "poll_interval_s")),
    ],
)
def test_cross_field_violation_names_both_keys_and_values(kwargs, keys):
    with pytest.raises(TierConfigError) as exc:
        TierConfig(**kwargs)
    msg = str(exc.value)
    assert set(exc.value.keys) == set(keys)
    cfg_values = {**EXPECTED_DEFAULTS, **kwargs}
    for key in keys:
        assert f"{key}={cfg_values[key]!r}" in msg, msg


@pytest.mark.parametrize(
    "kwargs",
    [
        {"peer_timeout_s": 2.0, "heartbeat_interval_s": 1.0},  # equality allowed
        {"load_timeout_s": 10.001},
        {"handshake_timeout_s": 29.999},
        {"abort_ack_timeout_s": 29.999},
        {"heartbeat_interval_s": 0.001, "poll_interval_s": 0.001},
        {"load_timeout_s": 600, "fetch_supply_timeout_s": 599, "handshake_timeout_s": 120},
    ],
)
def test_cross_field_boundaries_accepted(kwargs):
    TierConfig(**kwargs)


def test_cross_field_checks_run_after_conversion():
    # strings are converted first, then compared as numbers (not as strings:
    # "9" > "10" lexically)
    cfg = TierConfig.from_dict({"load_timeout_s": "11", "fetch_supply_timeout_s": "9"})
    assert cfg.load_timeout_s == 11.0


# ------------------------------------------------------------- evolve, frozen


def test_evolve_revalidates_values():
    cfg = TierConfig()
    assert attrs.evolve(cfg, unbound_store_timeout_s="180").unbound_store_timeout_s == 180.0
    with pytest.raises(TierConfigError, match="unbound_store_timeout_s=True"):
        attrs.evolve(cfg, unbound_store_timeout_s=True)
    with pytest.raises(TierConfigError, match="max_peers"):
        attrs.evolve(cfg, max_peers=0)


def test_evolve_revalidates_cross_field_rules():
    cfg = TierConfig()
    with pytest.raises(TierConfigError, match="load_timeout_s=5.0"):
        attrs.evolve(cfg, load_timeout_s=5.0)
    ok = attrs.evolve(cfg, load_timeout_s=60.0, fetch_supply_timeout_s=50.0)
    assert (ok.load_timeout_s, ok.fetch_supply_timeout_s) == (60.0, 50.0)


def test_frozen():
    cfg = TierConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.unbound_store_timeout_s = 1.0  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        del cfg.port  # type: ignore[misc]
    assert not hasattr(cfg, "__dict__")


def test_keyword_only_and_hashable():
    with pytest.raises(TypeError):
        TierConfig(60.0)  # type: ignore[misc]
    assert hash(TierConfig()) == hash(TierConfig())
    assert TierConfig(port=5710) != TierConfig()


# ----------------------------------------------------------- from_dict / to_dict


@pytest.mark.parametrize("mapping", [None, [], "port=1", [("port", 1)], 3])
def test_from_dict_requires_a_mapping(mapping):
    with pytest.raises(TierConfigError, match="mapping"):
        TierConfig.from_dict(mapping)  # type: ignore[arg-type]


def test_from_dict_rejects_non_string_keys():
    with pytest.raises(TierConfigError, match="keys must be strings"):
        TierConfig.from_dict({1: 2})  # type: ignore[dict-item]


def test_from_dict_reports_all_unknown_keys():
    with pytest.raises(TierConfigError) as exc:
        TierConfig.from_dict({"prot": 1, "zzz_qqq": 2, "port": 5})
    msg = str(exc.value)
    assert "'prot' (did you mean 'port'?)" in msg
    assert "'zzz_qqq'" in msg and "zzz_qqq' (did you mean" not in msg
    assert set(exc.value.keys) == {"prot", "zzz_qqq"}
    # the did-you-mean and a pointer to every key's documentation, not a list of all keys
    assert "docs/configuration.md" in msg and "unbound_store_timeout_s" not in msg and len(msg) < 200, msg


def test_from_dict_vllm_entry_shape():
    entry = {
        "type": "KvTierSecondaryTier",
        "module_path": "kvtier.integrations.vllm",
        "host": "10.0.0.5",
        "port": "5710",
        "locality": "REMOTE",
        "unbound_store_timeout_s": "180",
    }
    cfg = TierConfig.from_dict(entry)
    assert cfg.port == 5710 and cfg.unbound_store_timeout_s == 180.0
    assert cfg.locality == "REMOTE"


def test_from_dict_does_not_mutate_its_input():
    entry = {"port": "5710"}
    TierConfig.from_dict(entry)
    assert entry == {"port": "5710"}


def test_to_dict_round_trip_and_json():
    cfg = TierConfig(port=5710, park_clock="first_store", hash_seed="42", background_poll=True)
    d = cfg.to_dict()
    assert TierConfig.from_dict(d) == cfg
    assert TierConfig.from_dict(json.loads(json.dumps(d))) == cfg


def test_to_dict_omits_none_locality_and_backpressure():
    d = TierConfig().to_dict()
    assert "backpressure" not in d and "locality" not in d
    assert set(d) == set(DEFAULTS) - {"backpressure", "locality"}
    assert TierConfig(locality="LOCAL").to_dict()["locality"] == "LOCAL"


# ----------------------------------------------------------------- docs (B25)


def _doc_table() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        key = cells[0].strip("`")
        assert key not in rows, f"{key} documented twice"
        rows[key] = cells
    return rows


def test_doc_documents_every_key_with_the_code_default():
    rows = _doc_table()
    assert list(rows) == list(DEFAULTS), "doc keys differ from code keys"
    for key, cells in rows.items():
        documented = json.loads(cells[1].strip("`"))
        default = DEFAULTS[key]
        if isinstance(default, tuple):  # JSON has lists only
            default = list(default)
        assert documented == default, key
        assert type(documented) is type(default), key


def test_doc_generated_block_is_fresh():
    current = DOC.read_text(encoding="utf-8")
    assert render_page(current, ("config table",)) == current, (
        "docs/configuration.md is stale: run python -m tools docs"
    )
    assert run(["docs", "--check"]) == 0


def test_docs_command_finds_and_rewrites_a_stale_table(tmp_path):
    for rel in docgen.PAGES:  # a copy of the pages, one of them with an old table
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text(encoding="utf-8"), encoding="utf-8")
    page = tmp_path / "docs" / "configuration.md"
    fresh = page.read_text(encoding="utf-8")
    start = fresh.index(docgen.begin_marker("config table")) + len(docgen.begin_marker("config table"))
    page.write_text(fresh[:start] + "\nold\n" + fresh[fresh.index(docgen.END, start):], encoding="utf-8")
    assert docgen.stale_pages(tmp_path) == [page]
    assert docgen.write_pages(tmp_path) == [page]
    assert docgen.stale_pages(tmp_path) == [] and page.read_text(encoding="utf-8") == fresh


def test_the_runtime_renders_no_docs():
    """The tables are rendered by the repository's tools from declarations (docs/decisions.md W4):
    the config module neither parses its own source nor carries a renderer."""
    source = (REPO / "kvtier" / "config.py").read_text(encoding="utf-8")
    assert "import ast" not in source and "getsource" not in source
    assert not hasattr(config_mod, "render_config_doc") and not hasattr(config_mod, "main")


def test_doc_mentions_every_cross_field_rule():
    text = DOC.read_text(encoding="utf-8")
    for rule in CROSS_FIELD_RULES:
        assert rule.text() in text


def test_config_table_rows():
    rows = config_table()
    assert [r.key for r in rows] == list(DEFAULTS)
    for row in rows:
        assert row.default == DEFAULTS[row.key]
        assert row.description, f"{row.key} has no docstring"
        assert row.validation
        if row.key.endswith("_s"):
            assert row.unit == "s", row.key


# ------------------------------------------------------------------ properties

_in_range = st.floats(
    min_value=MIN_DURATION_S, max_value=MAX_TIMEOUT_S, allow_nan=False, allow_infinity=False
)


@given(
    key=st.sampled_from(FREE_FLOAT_KEYS),
    x=_in_range,
    spelling=st.sampled_from(["{x!r}", " {x!r}\n", "{x:.17e}", "{x:.17g}", "{x!r}"]),
)
@settings(max_examples=300)
def test_any_finite_positive_float_string_within_cap_round_trips(key, x, spelling):
    text = spelling.format(x=x)
    cfg = _build(key, text)
    assert getattr(cfg, key) == x
    assert TierConfig.from_dict(cfg.to_dict()) == cfg


@given(key=st.sampled_from(INT_KEYS), data=st.data())
def test_any_int_within_bounds_round_trips_as_string(key, data):
    kind = attrs.fields_dict(TierConfig)[key].metadata[config_mod._KIND]
    n = data.draw(st.integers(kind.lo, kind.hi))
    assert getattr(_build(key, str(n)), key) == n
    assert getattr(_build(key, float(n)), key) == n


_json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=8)
    | st.decimals(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@given(key=st.sampled_from(list(DEFAULTS)), value=_json_like)
@settings(max_examples=500)
def test_any_value_either_builds_or_fails_with_a_keyed_value_error(key, value):
    try:
        cfg = _build(key, value)
    except TierConfigError as err:
        assert key in err.keys
        assert str(err).startswith(f"{key}=") or key in str(err)
    else:
        got = getattr(cfg, key)
        if isinstance(got, float):
            assert math.isfinite(got) and got > 0
        assert TierConfig.from_dict(cfg.to_dict()) == cfg


# ------------------------------------------------------------ spec cross-check


def _config_keys_in(node) -> list[str]:
    if isinstance(node, dict):
        found = [node["config_key"]] if isinstance(node.get("config_key"), str) else []
        for value in node.values():
            found += _config_keys_in(value)
        return found
    if isinstance(node, list):
        return [k for item in node for k in _config_keys_in(item)]
    return []


def test_every_timer_key_named_by_the_lifecycle_spec_exists():
    """B25: a timer must read a key that exists (not a misspelled or stale one)."""
    import tomllib

    spec = REPO / "spec" / "lifecycle.toml"
    if not spec.exists():
        pytest.skip("spec/lifecycle.toml not present")
    keys = _config_keys_in(tomllib.loads(spec.read_text(encoding="utf-8")))
    assert keys, "spec names no config_key"
    units = {row.key: row.unit for row in config_table()}
    for key in keys:
        assert key in DEFAULTS, f"spec timer reads unknown config key {key!r}"
        assert units[key] == "s", key


# -- metrics_port: null (off) or a port, converted like the integer keys -----------------------------


@pytest.mark.parametrize("value", [v for v in _INT_BAD if v is not None] + [-1, 65536, "65536", "-1"], ids=_id)
def test_metrics_port_rejects(value):
    with pytest.raises(TierConfigError) as exc:
        _build("metrics_port", value)
    _assert_names(exc.value, "metrics_port", value)


@pytest.mark.parametrize(("value", "expected"), [(None, None), (0, 0), (9464, 9464), ("9464", 9464),
                                                 (" 9464\n", 9464), (9464.0, 9464), (65535, 65535)])
def test_metrics_port_accepts(value, expected):
    cfg = _build("metrics_port", value)
    assert cfg.metrics_port == expected
    assert TierConfig.from_dict(cfg.to_dict()) == cfg
