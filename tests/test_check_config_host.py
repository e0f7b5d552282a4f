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


def test_a_config_for_another_connector_names_the_connector_first_and_no_entry_as_ok() -> None:
    """A config whose top-level connector is not vLLM's offloading connector: the connector is the
    first problem (kvtier would not be loaded at all), also when the extra config is missing; an
    entry that passes its own checks beside it is "entry ok", never a bare "ok" for the config."""
    res = CliRunner().invoke(cli, ["check-config", json.dumps(
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"})])
    assert res.exit_code == 1, res.output
    lines = res.stderr.splitlines()
    assert lines[0].startswith("problem: kv_connector is 'NixlConnector'"), lines
    assert any("kv_connector_extra_config is missing" in x for x in lines[1:]), lines
    doc = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 1 << 30, "secondary_tiers": [ENTRY]}}
    res = CliRunner().invoke(cli, ["check-config", json.dumps(doc)])
    assert res.exit_code == 1 and res.stderr.startswith("problem: kv_connector is 'NixlConnector'"), res.stderr
    assert res.stdout.startswith("entry ok: secondary_tiers[0]: kvtier"), res.stdout


def _offloading(extra: dict, entry: dict = ENTRY) -> str:
    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "secondary_tiers": [entry], **extra}})


def test_the_cpu_tiers_size_vllm_needs_is_checked_and_a_missing_one_is_a_note() -> None:
    """vLLM's CPU tier under the secondary tiers reads ``cpu_bytes_to_use`` with ``int()`` and
    refuses to start without a non-zero one: a value it cannot read is a problem naming what to
    write; a missing one is a note (``--kv-offloading-size`` may add it), never a bare "ok"."""
    for value in ("10GB", 0, None, "1e10", True):
        res = CliRunner().invoke(cli, ["check-config", _offloading({"cpu_bytes_to_use": value})])
        assert res.exit_code == 1, (value, res.output)
        assert "problem: kv_connector_extra_config.cpu_bytes_to_use=" in res.stderr, (value, res.stderr)
        assert '"cpu_bytes_to_use": 10737418240' in res.stderr
    for value in (10737418240, "10737418240"):
        res = CliRunner().invoke(cli, ["check-config", _offloading({"cpu_bytes_to_use": value})])
        assert res.exit_code == 0 and "cpu_bytes_to_use" not in res.output, (value, res.output)
    res = CliRunner().invoke(cli, ["check-config", _offloading({})])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("note: kv_connector_extra_config.cpu_bytes_to_use is missing: vLLM refuses to "
                                 "start without it unless --kv-offloading-size sets it"), res.stdout


def test_an_entry_that_passes_says_the_security_warnings_the_engine_will_log() -> None:
    """check-config's "ok" line for an entry ends with the SECURITY lines the engine logs at start
    with it (auth none beyond loopback, allowed_peers open), and says nothing of them when neither
    holds; a key that is absent is named missing, not None."""
    full = {"cpu_bytes_to_use": 1 << 30}
    res = CliRunner().invoke(cli, ["check-config", _offloading(full)])
    assert res.exit_code == 0 and "the engine will warn at start: auth none on 10.0.0.6" in res.stdout, res.stdout
    assert "allowed_peers is open" in res.stdout
    # serving peers' probes without authentication beyond loopback is one more (decision S17)
    res = CliRunner().invoke(cli, ["check-config", _offloading(full, ENTRY | {"serve_external": True})])
    assert "and serve_external on with auth none (anyone who can reach the port can learn which prompts" \
        in res.stdout, res.stdout
    quiet = ENTRY | {"host": "127.0.0.1", "allowed_peers": ["10.0.0.5:5710"]}
    res = CliRunner().invoke(cli, ["check-config", _offloading(full, quiet)])
    assert res.exit_code == 0 and "warn" not in res.stdout, res.stdout
    res = CliRunner().invoke(cli, ["check-config", json.dumps({"kv_role": "kv_both", "kv_connector_extra_config": {
        "cpu_bytes_to_use": 1 << 30, "secondary_tiers": [ENTRY]}})])
    assert "problem: kv_connector is missing:" in res.stderr, res.stderr
    assert "problem: kv_connector_extra_config.spec_name is missing:" in res.stderr, res.stderr


def test_one_entry_alone_is_checked_without_a_note_about_the_wrapper_it_lacks() -> None:
    """A bare tier entry is checked as the only entry of a config the first note describes (the
    CPU tier's size named there), not told that this wrapper misses ``cpu_bytes_to_use``."""
    res = CliRunner().invoke(cli, ["check-config", json.dumps(ENTRY)])
    assert res.exit_code == 0 and res.stdout.count("note:") == 1, res.stdout
    assert 'and a "cpu_bytes_to_use"' in res.stdout and "is missing" not in res.stdout, res.stdout


def test_the_transfer_config_keys_vllm_refuses_at_start_are_problems() -> None:
    """vLLM's ``KVTransferConfig`` refuses a ``kv_connector`` without ``kv_role``, a role or a
    ``kv_load_failure_policy`` it does not know and any key it does not have, before kvtier runs:
    each is a problem naming what to write, also for a MultiConnector's connectors; a right one is
    silent."""
    base = json.loads(_offloading({"cpu_bytes_to_use": 1 << 30}))
    for change, says in [
        ({"kv_role": None}, 'kv_role is missing: vLLM refuses a kv_connector without one; write "kv_role": "kv_both"'),
        ({"kv_role": "kv_producer_typo"}, 'kv_role is "kv_producer_typo": vLLM takes only \'kv_producer\''),
        ({"kv_buffer_devise": "cpu"}, '"kv_buffer_devise" is not a key of vLLM\'s KV transfer config, which refuses to '
                                      'start with it: did you mean "kv_buffer_device"?'),
        ({"kv_load_failure_policy": "retry"}, "kv_load_failure_policy is \"retry\": vLLM takes only 'recompute' or"),
    ]:
        doc = {k: v for k, v in (base | change).items() if v is not None}
        res = CliRunner().invoke(cli, ["check-config", json.dumps(doc)])
        assert res.exit_code == 1 and f"problem: {says}" in res.stderr, (change, res.output)
        assert res.stdout.startswith("entry ok: secondary_tiers[0]"), res.stdout
    for role in ("kv_producer", "kv_consumer", "kv_both"):
        res = CliRunner().invoke(cli, ["check-config", json.dumps(base | {"kv_role": role})])
        assert res.exit_code == 0, (role, res.output)
    multi = {"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector"}, {**base, "kv_rol": "kv_both"}]}}
    res = CliRunner().invoke(cli, ["check-config", json.dumps(multi)])
    assert res.exit_code == 1, res.output
    assert "problem: connectors[0].kv_role is missing" in res.stderr, res.stderr
    assert 'problem: connectors[1]: "kv_rol" is not a key of vLLM\'s KV transfer config' in res.stderr, res.stderr


def test_the_transfer_config_keys_check_config_knows_are_vllms() -> None:
    """The keys and literal values ``kvtier.vllmconfig`` holds for vLLM 0.33.0 (it reads the JSON
    without importing vLLM, which takes seconds) are those of vLLM's own class."""
    import dataclasses
    import typing

    from vllm.config import kv_transfer

    from kvtier.vllmconfig import KV_ROLES, LOAD_FAILURE_POLICIES, TRANSFER_CONFIG_KEYS

    assert {f.name for f in dataclasses.fields(kv_transfer.KVTransferConfig)} == TRANSFER_CONFIG_KEYS
    assert set(typing.get_args(kv_transfer.KVRole)) == set(KV_ROLES)  # a Literal of Literals reads flat
    hints = typing.get_type_hints(kv_transfer.KVTransferConfig)
    assert set(typing.get_args(hints["kv_load_failure_policy"])) == set(LOAD_FAILURE_POLICIES)


def test_a_tier_entry_without_type_and_module_path_is_read_as_one() -> None:
    """An object of tier keys only (``host``, ``port``, a misspelt one) is a tier entry that lacks
    the two keys vLLM loads a tier by — said so, its other keys checked as kvtier's — not a whole
    config told that vLLM's transfer config has no ``port``."""
    res = CliRunner().invoke(cli, ["check-config", json.dumps({"host": "10.0.0.5", "port": 5710, "portt": 1})])
    assert res.exit_code == 1, res.output
    assert 'problem: this reads as a tier entry without "type" and "module_path"' in res.stderr, res.stderr
    assert "'portt' (did you mean 'port'?)" in res.stderr and "kv_port" not in res.stderr, res.stderr


def test_the_engine_logs_the_serving_warning_check_config_says(caplog) -> None:
    """The SECURITY line the engine logs when it serves peers' probes without auth beyond loopback is
    the one check-config's ``ok:`` line names (one list, decision S17); on loopback neither says it."""
    import logging

    from kvtier.config import TierConfig
    from kvtier.params import PeerPolicy, exposures
    from kvtier.shell.build import warn_if_serving_open

    for host, expected in (("10.0.0.6", 1), ("127.0.0.1", 0)):
        cfg = TierConfig.from_dict({"host": host, "serve_external": True, "allowed_peers": ["10.0.0.5:5710"]})
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            warn_if_serving_open(cfg)
        said = [e for e in exposures(host=host, auth="none", serve_external=True,
                                     policy=PeerPolicy.from_entries(cfg.allowed_peers, listen_host=host))
                if e.kind == "serve"]
        assert [r.getMessage() for r in caplog.records] == [e.line for e in said] and len(said) == expected
        res = CliRunner().invoke(cli, ["check-config", json.dumps(ENTRY | {"host": host, "serve_external": True})])
        assert (said[0].short in res.stdout) if said else ("serve_external" not in res.stdout), res.stdout
