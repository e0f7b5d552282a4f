"""TierConfig: the cross-field rules, ``evolve`` revalidation, frozen records, ``from_dict`` /
``to_dict`` (B25)."""

from __future__ import annotations

import json

import attrs
import pytest

from kvtier.config import CROSS_FIELD_RULES, DEFAULTS, TierConfig, TierConfigError
from tests.config_helpers import EXPECTED_DEFAULTS


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
        # poll_interval_s is not used: it relates to nothing (it refused this, saying heartbeats
        # cannot be sent more often than the transport is polled)
        {"poll_interval_s": 1.0, "heartbeat_interval_s": 0.5},
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
    with pytest.raises(TierConfigError, match="unbound_store_timeout_s=true"):
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
