"""``kvtier check-config`` finds what the engine would refuse on this host before it starts: the
CURVE key files (read as the engine reads them) and a data plane that cannot start here."""

from __future__ import annotations

import json
import sys

from click.testing import CliRunner

from kvtier.cli import cli

ENTRY = {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "host": "10.0.0.6", "port": 0}


def _without_nixl(monkeypatch) -> None:
    """NIXL as on a host without it: each module the plane tries (its docstring's order) fails to import."""
    for name in ("nixl._api", "nixl_cu13._api", "nixl_cu12._api"):
        monkeypatch.setitem(sys.modules, name, None)


def test_a_nixl_entry_on_a_host_without_nixl_is_a_problem_naming_the_install(monkeypatch) -> None:
    _without_nixl(monkeypatch)
    res = CliRunner().invoke(cli, ["check-config", json.dumps(ENTRY | {"data_plane": "nixl"})])
    assert res.exit_code == 1, res.output
    assert "problem: secondary_tiers[0]: data_plane 'nixl' cannot start on this host: NIXL is not installed" \
        in res.output, res.output
    assert "pip install --no-deps nixl-cu12" in res.output and "ok: secondary_tiers[0]" not in res.output
    # the zmq plane needs nothing more on this host
    res = CliRunner().invoke(cli, ["check-config", json.dumps(ENTRY | {"data_plane": "zmq"})])
    assert res.exit_code == 0 and "ok: secondary_tiers[0]: kvtier, zmq plane" in res.output, res.output


def test_an_entry_with_a_bad_value_still_says_its_nixl_plane_cannot_start_here(monkeypatch) -> None:
    """Every problem in one run: a value kvtier refuses does not hide that NIXL does not import."""
    _without_nixl(monkeypatch)
    res = CliRunner().invoke(cli, ["check-config", json.dumps(ENTRY | {"data_plane": "nixl", "port": -1})])
    assert res.exit_code == 1, res.output
    assert "port" in res.output and "data_plane 'nixl' cannot start on this host: NIXL is not installed" \
        in res.output, res.output
