"""Shared by the ``test_config*`` modules: the defaults the design fixes, the key groups, and
small helpers that build a :class:`kvtier.config.TierConfig` from one key and check an error names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.config import ConfigRow, TierConfig, TierConfigError, config_table

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
    "gil_switch_interval_s": None,
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


def value_id(value) -> str:
    # printable ASCII without backslashes: an id pytest escapes cannot be selected again by its
    # node id (mutmut selects each mutant's tests that way)
    text = ascii(value).replace("\\", "/")
    return text if len(text) <= 24 else text[:21] + "..."


def build(key, value):
    return TierConfig.from_dict({key: value})


def assert_names(err: TierConfigError, key: str, value) -> None:
    msg = str(err)
    assert key in msg, msg
    # the value as its JSON reads: null, true, false (the config is JSON, not Python)
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
    if len(text) < 100:
        assert text in msg, msg
    assert key in err.keys


def row(key: str) -> ConfigRow:
    """``key``'s row of the configuration table: its bounds (``minimum``, ``maximum``) and its
    validation text, as the docs show them."""
    return next(r for r in config_table() if r.key == key)


#: the keys CURVE needs besides ``auth`` (file paths are not opened by the config)
CURVE = {"auth": "curve", "auth_secret_key_file": "/keys/p.key_secret", "auth_allowed_keys_dir": "/keys/allowed"}


def refused(entry: dict) -> TierConfigError:
    """The error ``TierConfig.from_dict(entry)`` raises (fails the test if it raises none)."""
    with pytest.raises(TierConfigError) as info:
        TierConfig.from_dict(entry)
    return info.value
