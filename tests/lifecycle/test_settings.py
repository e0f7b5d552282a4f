"""The core's settings: the durations it reads are the spec's (``TIMER_KEYS`` is generated), every
default is the config's, and ``from_config`` carries each value of a validated config
(docs/decisions.md C23)."""

from __future__ import annotations

import attrs
import pytest

from kvtier.config import DEFAULTS, TierConfig, config_table
from kvtier.lifecycle import CoreSettings
from kvtier.lifecycle.core import TIMER_KEYS
from tools import specgen
from tools.spec import load, loads, spec_path


def test_timer_keys_are_the_specs_timers_and_durations() -> None:
    spec = load()
    want: list[str] = []
    for m in spec.machines.values():
        for key in [*(t.config_key for t in m.timers.values()), *m.durations]:
            if key not in want:
                want.append(key)
    assert TIMER_KEYS == tuple(want)
    assert "peer_timeout_s" in want  # a guard's duration, declared in [machines.session.durations]
    units = {row.key: row.unit for row in config_table()}
    assert all(units.get(k) == "s" for k in TIMER_KEYS), [k for k in TIMER_KEYS if units.get(k) != "s"]


def test_a_new_timer_row_reaches_the_generated_keys() -> None:
    """Adding a timer is its spec row and its config key: the key list follows from the row."""
    text = spec_path().read_text(encoding="utf-8")
    row = 'probe = { event = "probe_deadline", config_key = "probe_timeout_s"'
    assert row in text
    grown = text.replace(row, 'linger = { event = "probe_deadline", config_key = "probe_linger_s", doc = "x" }\n' + row)
    keys = specgen.timer_keys(loads(grown))
    assert sorted(keys) == sorted((*TIMER_KEYS, "probe_linger_s"))
    assert '    "probe_linger_s",\n' in specgen.render(loads(grown))


def test_hand_built_settings_take_the_configs_defaults() -> None:
    assert CoreSettings(durations={}) == CoreSettings.from_config(TierConfig())
    s = CoreSettings(durations={"load_timeout_s": 7.0})
    assert s.durations == {**{k: DEFAULTS[k] for k in TIMER_KEYS}, "load_timeout_s": 7.0}
    assert list(s.durations) == list(TIMER_KEYS)


def test_a_duration_the_core_does_not_read_is_refused() -> None:
    with pytest.raises(ValueError, match="unbound_store_timout_s"):
        CoreSettings(durations={"unbound_store_timout_s": 1.0})


def test_from_config_carries_every_value() -> None:
    cfg = TierConfig(**{k: v * 2 for k, v in DEFAULTS.items() if k in TIMER_KEYS and k != "serve_lookup_timeout_s"},
                     park_clock="first_store", tombstone_max=7, max_pending_fetches_per_peer=9, max_peers=11,
                     shutdown_grace_s=0.5, integrity="none", serve_external=True, serve_max_rounds_per_peer=3,
                     serve_max_probes_per_round=4, serve_max_pinned_blocks_per_peer=5, serve_max_pinned_fraction=0.25,
                     auth="curve", auth_secret_key_file="k", auth_allowed_keys_dir="d",
                     serve_allowed_principals=("a", "b"))
    s = CoreSettings.from_config(cfg, one_sided=True, revoke_bounded=False, pool_blocks=100, block_bytes=64,
                                 max_header_bytes=99)
    assert s.durations == {k: getattr(cfg, k) for k in TIMER_KEYS}
    assert (s.park_clock, s.tombstone_max, s.max_pending_fetches_per_peer, s.max_peers, s.shutdown_grace_s) == (
        "first_store", 7, 9, 11, 0.5)
    assert (s.one_sided, s.revoke_bounded, s.integrity, s.serve_external) == (True, False, False, True)
    assert s.serve_allowed_principals == frozenset({"a", "b"})
    assert (s.serve_max_rounds_per_peer, s.serve_max_probes_per_round, s.serve_max_pinned_blocks_per_peer) == (3, 4, 5)
    assert (s.serve_max_pinned_blocks, s.block_bytes, s.max_header_bytes) == (25, 64, 99)
    assert attrs.evolve(cfg) == cfg


@pytest.mark.parametrize(("pool_blocks", "fraction", "want"), [
    (3, 0.25, 1),  # 0.75 of a block: still one block may be pinned for peers
    (4, 0.25, 1),  # exactly one
    (8, 0.25, 2),
    (9, 0.5, 4),  # rounded down
    (None, 0.5, 1 << 62),  # no pool: no bound from it
])
def test_the_serve_pin_budget_is_a_fraction_of_the_pool_and_never_less_than_one_block(pool_blocks, fraction,
                                                                                       want) -> None:
    cfg = TierConfig(serve_max_pinned_fraction=fraction)
    assert CoreSettings.from_config(cfg, pool_blocks=pool_blocks).serve_max_pinned_blocks == want


def test_plane_settings_are_built_from_the_config_with_its_defaults() -> None:
    from kvtier.dataplane.settings import PlaneSettings

    assert PlaneSettings() == PlaneSettings.from_config(TierConfig())
    cfg = TierConfig(integrity="none", backends=("UCX", "LIBFABRIC"), nixl_progress_interval_s=0.002, instance="pod-1",
                     revoke_timeout_s=2.0)
    p = PlaneSettings.from_config(cfg)
    assert (p.integrity, p.backends, p.nixl_progress_interval_s, p.instance, p.revoke_timeout_s) == (
        "none", ("UCX", "LIBFABRIC"), 0.002, "pod-1", 2.0)
