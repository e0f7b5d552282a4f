"""Errors a new user meets name what to change: the config key, the file or address, the fix.

Each case is the real failure (a taken port, a missing key file, a CURVE mismatch between real
managers, an integrity mismatch in a real handshake, a vLLM config that would load vLLM's own
tier) and the assertion is on the text the user reads.
"""

from __future__ import annotations

import json
import logging
import socket

import pytest
from click.testing import CliRunner
from mgr_helpers import Jobs, consumer_req, job, keys_for, metric, producer_req, pump_until

from kvtier.cli import cli
from kvtier.config import TierConfig, TierConfigError
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.transport import TransportError
from kvtier.transport.curve import generate_keys

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_taken_port_names_the_key(taken_port: int) -> None:
    with pytest.raises(TransportError) as exc:
        KvTierManager({"host": "127.0.0.1", "port": taken_port}, BlockPool(4, 4096, pin=False))
    assert str(exc.value).startswith(f"port={taken_port}: ") and "choose a free port" in str(exc.value)
    with pytest.raises(TransportError) as exc:
        KvTierManager({"host": "127.0.0.1", "metrics_port": taken_port}, BlockPool(4, 4096, pin=False))
    assert str(exc.value).startswith(f"metrics_port={taken_port}: ") and "free port" in str(exc.value)


def test_a_missing_key_file_says_it_does_not_exist(tmp_path) -> None:
    generate_keys(tmp_path / "allowed", "p0")
    cfg = {"host": "127.0.0.1", "auth": "curve", "auth_secret_key_file": str(tmp_path / "nope.key_secret"),
           "auth_allowed_keys_dir": str(tmp_path / "allowed")}
    with pytest.raises(ValueError) as exc:
        KvTierManager(cfg, BlockPool(4, 4096, pin=False))
    msg = str(exc.value)
    assert msg.startswith("auth_secret_key_file ") and "does not exist" in msg and "kvtier keys generate" in msg


def test_the_public_key_file_says_where_it_goes(tmp_path) -> None:
    res = CliRunner().invoke(cli, ["keys", "generate", str(tmp_path), "prefill-0", "--endpoint", "10.0.0.5:5710"])
    assert res.exit_code == 0 and "auth_allowed_keys_dir" in res.output
    public = (tmp_path / "prefill-0.key").read_text()
    assert "auth_allowed_keys_dir" in public and ".curve" not in public
    assert '"prefill-0" the principal' in public
    secret = (tmp_path / "prefill-0.key_secret").read_text()
    assert "auth_secret_key_file" in secret and ".curve" not in secret


def _load_one(p, c, kid: str):
    """Consumer ``c`` loads one block of ``kid`` from producer ``p`` (job 2, slot 0): its result."""
    cjobs = Jobs(c)
    creq = consumer_req("c1", kid, p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(job(2, keys_for(kid, 1), [0], creq))
    assert pump_until(lambda: cjobs.has(2), managers=[p, c], jobs=[cjobs])
    return cjobs.one(2)


@pytest.fixture
def keys(tmp_path):
    generate_keys(tmp_path / "k", "prefill-0", ("127.0.0.1",))
    generate_keys(tmp_path / "k", "decode-0")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    for name in ("prefill-0", "decode-0"):
        (allowed / f"{name}.key").write_text((tmp_path / "k" / f"{name}.key").read_text())
    return lambda name: {"auth": "curve", "auth_secret_key_file": str(tmp_path / "k" / f"{name}.key_secret"),
                         "auth_allowed_keys_dir": str(allowed)}


@pytest.mark.parametrize("curve_side", ["producer", "consumer"])
def test_only_one_side_running_curve_fails_auth_failed_on_both(make_manager, keys, curve_side, caplog) -> None:
    """A consumer without CURVE dialling a CURVE producer (and the reverse): the load fails
    ``auth_failed`` — not ``peer_disconnected`` — and the producer counts and logs the refused
    connection with the same reason; each side's line says what the other lacks."""
    p = make_manager(keys("prefill-0") if curve_side == "producer" else {})
    c = make_manager(keys("decode-0") if curve_side == "consumer" else {})
    cjobs = Jobs(c)
    preq = producer_req("p1", "kv-auth")
    p.on_new_request(preq)
    p.submit_store(job(1, keys_for("kv-auth", 2), [0, 1], preq))
    creq = consumer_req("c1", "kv-auth", p.host, p.port)
    with caplog.at_level(logging.WARNING):
        c.on_new_request(creq)
        c.submit_load(job(2, keys_for("kv-auth", 2), [2, 3], creq))
        assert pump_until(lambda: cjobs.has(2), managers=[p, c], jobs=[cjobs])
        assert (cjobs.one(2).success, cjobs.one(2).reason) == (False, "auth_failed")
        # the producer knows only when it read the consumer's greeting before the consumer hung up:
        # an early hang-up alone is no authentication failure (E7)
        pump_until(lambda: False, managers=[p], timeout_s=0.3)
    assert metric(c, "kvtier_session_ends_total", reason="auth_failed") == 1
    assert metric(c, "kvtier_session_ends_total", reason="peer_disconnected") == 0
    lines = [r.getMessage() for r in caplog.records]
    consumer_line = next(x for x in lines if "handshake with producer" in x)
    producer_lines = [x for x in lines if "refused an inbound connection" in x]
    assert all("(auth_failed)" in x for x in producer_lines)
    assert metric(p, "kvtier_session_ends_total", reason="auth_failed") == len(producer_lines) <= 1
    if curve_side == "producer":
        # a mismatch the consumer saw itself is certain; a hang-up on its greeting also names the address
        assert ("the producer requires CURVE" in consumer_line or (
            "may require CURVE" in consumer_line and "remote_port" in consumer_line)), consumer_line
        assert "auth_secret_key_file" in consumer_line
        assert all("the peer does not run CURVE" in x for x in producer_lines)
    else:
        assert all("the peer requires CURVE" in x for x in producer_lines)
        assert "auth='curve'" in consumer_line


def test_a_producer_whose_certificate_the_consumer_lacks_fails_auth_failed_not_connect_refused(
        make_manager, keys, tmp_path, caplog) -> None:
    """The newcomer forgot to copy ``prefill-0.key`` into the consumer's allowed directory: the
    producer runs and listens, but no certificate names its endpoint, so it is never dialled.  The
    load fails ``auth_failed`` (an authentication setting), not ``connect_refused`` ("nothing
    listens there"), and the log line says which file to copy."""
    p = make_manager(keys("prefill-0"))
    mine = keys("decode-0")
    lacking = tmp_path / "lacking"
    lacking.mkdir()
    (lacking / "decode-0.key").write_text((tmp_path / "k" / "decode-0.key").read_text())
    c = make_manager({**mine, "auth_allowed_keys_dir": str(lacking)})
    with caplog.at_level(logging.WARNING):
        result = _load_one(p, c, "kv-nokey")
    assert (result.success, result.reason) == (False, "auth_failed")
    assert any("no certificate in auth_allowed_keys_dir names this endpoint" in r.getMessage()
               and "copy its NAME.key there" in r.getMessage() for r in caplog.records)


def test_an_auth_none_producer_does_not_count_clients_that_hang_up_as_auth_failures(make_manager) -> None:
    """A client that hangs up while the producer writes to it (a health check, a pooled client
    leaving) is no authentication failure: without CURVE it was counted ``auth_failed`` ("the
    peer requires CURVE") about every other time (decision E7)."""
    import socket as socket_

    p = make_manager({})
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
    for i in range(40):
        with socket_.create_connection((p.host, p.port)) as s:
            if i % 2:
                s.sendall(greeting)  # a ZMTP client's greeting, then gone
        p.poll(0.001)
    pump_until(lambda: False, managers=[p], timeout_s=0.5)
    assert metric(p, "kvtier_session_ends_total", reason="auth_failed") == 0


def test_an_integrity_mismatch_names_the_integrity_key(make_manager, caplog) -> None:
    p = make_manager({"integrity": "xxh3_64"})
    c = make_manager({"integrity": "none"})
    with caplog.at_level(logging.ERROR):
        result = _load_one(p, c, "kv-int")
    assert result.reason == "handshake_mismatch"
    lines = [r.getMessage() for r in caplog.records if "differs" in r.getMessage()]
    assert len(lines) == 2 and all("set config key integrity to the same value on both tiers" in x for x in lines)


def test_a_vllm_entry_naming_vllms_own_tier_is_refused_with_the_right_type() -> None:
    with pytest.raises(TierConfigError) as exc:
        TierConfig.from_dict({"type": "p2p", "port": 5710})
    assert exc.value.keys == ("type",)
    assert '"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm"' in str(exc.value)

    def config(entry: dict, **top) -> str:
        return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "secondary_tiers": [entry], **top}})

    ok = {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "port": 5710}
    res = CliRunner().invoke(cli, ["check-config", config(ok)])
    assert res.exit_code == 0 and "secondary_tiers[0]: kvtier" in res.output, res.output
    res = CliRunner().invoke(cli, ["check-config", config(ok, backpressure=None)])  # vLLM ignores a top-level null
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["check-config", config({**ok, "backpressure": None})])
    assert res.exit_code == 1 and "remove the 'backpressure' key" in res.output, res.output
    res = CliRunner().invoke(cli, ["check-config", config({"type": "p2p", "port": 5710, "load_timeout_s": 30})])
    assert res.exit_code == 1, res.output
    assert "type='p2p' makes vLLM load its own 'p2p' tier" in res.output and "ignores load_timeout_s" in res.output
    assert '"type": "KvTierSecondaryTier"' in res.output
    res = CliRunner().invoke(cli, ["check-config", config({**ok, "unbound_store_timout_s": 3})])
    assert res.exit_code == 1 and "did you mean 'unbound_store_timeout_s'" in res.output
    res = CliRunner().invoke(cli, ["check-config", "{not json"])
    assert res.exit_code == 2 and "not JSON" in res.output
    # the migration guide's "before" entry alone: the problem says what to write instead
    res = CliRunner().invoke(cli, ["check-config", config({"type": "p2p", "host": "10.0.0.5", "port": 5710})])
    assert res.exit_code == 1 and "secondary_tiers[0] is vLLM's own 'p2p' tier" in res.output, res.output
    assert '"type": "KvTierSecondaryTier"' in res.output, res.output
    for entry, code, says in (({"type": "p2p", "host": "10.0.0.5", "port": 5710}, 1, "own 'p2p' tier"),
                              (ok, 0, "secondary_tiers[0]: kvtier")):
        res = CliRunner().invoke(cli, ["check-config", json.dumps(entry)])  # the guide's entries, unwrapped
        assert (res.exit_code, says in res.output, "kv_connector_extra_config is missing" in res.output, "note: checked "
                "as one tier entry, not a whole" in res.output, "ok: checked" in res.output) == (code, 1, 0, 1, 0), res.output


@pytest.mark.parametrize(("text", "says"), [
    ('"load_timeout_s": 1e400', "load_timeout_s=1e400: above the maximum"),  # Python reads it as inf
    ('"tombstone_max": ' + "9" * 5000, "tombstone_max=99999"),  # past Python's 4300-digit conversion limit
    ('"load_timeout_s": null', "load_timeout_s=null: expected a number or numeric string, got null"),
    ('"allowed_peers": ["http://10.0.0.5:5710"]', "is a URL: write the host, host:port or CIDR network alone"),
    ('"data_plane": "ZMQ"', "data_plane='ZMQ': must be one of 'zmq', 'nixl'; did you mean 'zmq'?"),
    ('"load_timeout_s": -1, "load_timeout_s": 30',
     "kv_connector_extra_config.secondary_tiers[0].load_timeout_s is given twice (-1, then 30)"),
    ('"hash_seed": 1e400', "hash_seed=1e400: expected a string, got a number"),  # not taken as the text "1e400"
])
def test_check_config_shows_a_value_as_its_json_was_written(text: str, says: str) -> None:
    """A number JSON allows but Python cannot hold is quoted as written (not ``inf``, not Python's
    advice to call ``sys.set_int_max_str_digits``), ``null`` is not ``None``, a URL is named one, a
    choice written in capitals gets its name, and a key given twice (JSON keeps the last) is named."""
    entry = '{"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "port": 5710, ' + text + "}"
    blob = ('{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": '
            '{"spec_name": "TieringOffloadingSpec", "secondary_tiers": [' + entry + "]}}")
    res = CliRunner().invoke(cli, ["check-config", blob])
    assert res.exit_code == 1 and says in res.output, res.output
    assert "set_int_max_str_digits" not in res.output and "None" not in res.output


def test_check_config_names_a_file_given_without_at_and_a_file_that_is_not_json(tmp_path) -> None:
    good = tmp_path / "prefill.json"
    good.write_text(json.dumps({"kv_connector": "OffloadingConnector"}))
    res = CliRunner().invoke(cli, ["check-config", str(good)])
    assert res.exit_code == 2 and f"did you mean @{good}?" in res.output, res.output
    yaml = tmp_path / "prefill.yaml"
    yaml.write_text("kv_connector: OffloadingConnector\n")
    res = CliRunner().invoke(cli, ["check-config", f"@{yaml}"])
    assert res.exit_code == 2 and "is not JSON" in res.output and "YAML" in res.output, res.output


def test_check_config_says_a_file_it_cannot_read_was_not_read(tmp_path) -> None:
    """Exit 2 (never read), not 1 (a problem in the config), and no traceback: a UTF-16 file, JSON
    nested past the parser's depth."""
    utf16 = tmp_path / "prefill.json"
    utf16.write_text(json.dumps({"kv_connector": "OffloadingConnector"}), encoding="utf-16")
    res = CliRunner().invoke(cli, ["check-config", f"@{utf16}"])
    assert res.exit_code == 2 and "is not UTF-8 text: save it as UTF-8" in res.output, res.output
    res = CliRunner().invoke(cli, ["check-config", "[" * 100_000])
    assert res.exit_code == 2 and "nested too deeply" in res.output, res.output


@pytest.mark.parametrize("entry, says", [
    ({"type": "KvTierSecondaryTier", "port": 5710}, "module_path is missing: vLLM imports the tier class"),
    ({"type": "KvTierSecondaryTier", "module_path": "foo.bar"}, "module_path is 'foo.bar'"),
    ({"type": "Foo", "module_path": "kvtier.integrations.vllm"}, "type is 'Foo': vLLM looks this name up"),
    ({"type": "P2P", "module_path": "kvtier.integrations.vllm"}, "type is 'P2P': vLLM looks this name up"),
])
def test_check_config_refuses_an_entry_vllm_would_not_load(entry, says) -> None:
    """vLLM's tier factory imports ``module_path`` and takes the class ``type`` names from it: an
    entry with either wrong is a problem that names the key and what to write, never an ``ok``."""
    doc = json.dumps({"kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [entry]}})
    res = CliRunner().invoke(cli, ["check-config", doc])
    assert res.exit_code == 1 and says in res.output, res.output
    assert "ok:" not in res.output and res.output.count("problem: secondary_tiers[0]") == 1, res.output  # told once


def test_a_metrics_port_equal_to_port_is_refused_before_start() -> None:
    """Both bind ``host``: the clash was found only at start, as an "Address already in use" that did
    not say it was our own listener's port."""
    with pytest.raises(TierConfigError, match=r"metrics_port=5710 is port too: .* pick another \(0: a free one\)") as exc:
        TierConfig.from_dict({"port": 5710, "metrics_port": 5710})
    assert exc.value.keys == ("port", "metrics_port")
    assert TierConfig.from_dict({"port": 0, "metrics_port": 0}).metrics_port == 0  # two free ports
    entry = {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "port": 5710, "metrics_port": 5710}
    doc = json.dumps({"kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [entry]}})
    res = CliRunner().invoke(cli, ["check-config", doc])
    assert res.exit_code == 1 and "metrics_port=5710 is port too" in res.output and "ok:" not in res.output, res.output


def test_check_config_never_says_ok_and_problem_for_one_entry() -> None:
    entry = {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "backpressure": {}}
    doc = json.dumps({"kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [entry]}})
    res = CliRunner().invoke(cli, ["check-config", doc])
    assert res.exit_code == 1 and "remove the 'backpressure' key" in res.output and "ok:" not in res.output
    doc = json.dumps({"kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "secondary_tiers": "x"}})
    res = CliRunner().invoke(cli, ["check-config", doc])
    assert res.exit_code == 1 and "secondary_tiers must be a list of entries, got str" in res.output

def test_top_says_what_an_endpoint_looks_like() -> None:
    res = CliRunner().invoke(cli, ["top", "notaurl", "--once"])
    assert res.exit_code == 2
    assert "'notaurl' is not a metrics endpoint: give host:port (e.g. 10.0.0.5:9464)" in res.output, res.output


_DROPPED = """
import gc, socket, sys, threading
from kvtier.api import RequestContext
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool

def setup(background_poll):
    # a producer and a consumer that dialled it, both dropped without shutdown() by a setup
    # step that raised: they are garbage in a reference cycle (the exception's traceback)
    p = KvTierManager({"host": "127.0.0.1", "port": 0, "metrics_port": 0, "background_poll": background_poll},
                      BlockPool(8, 4096, pin=False))
    c = KvTierManager({"host": "127.0.0.1", "port": 0}, BlockPool(8, 4096, pin=False))
    host, port = p.address.rsplit(":", 1)
    c.on_new_request(RequestContext(req_id="d", kv_transfer_params={"remote_prefiller": {
        "kv_request_id": "A", "remote_host": host, "remote_port": int(port)}}))
    for _ in range(20):
        p.poll(0.002)
        c.poll(0.002)
    ports.append(int(port))
    raise RuntimeError("a later setup step failed")

ports = []
for background_poll in (False, True):
    try:
        setup(background_poll)
    except RuntimeError:
        pass
    gc.collect()
for t in threading.enumerate():  # the closing runs on a thread of its own (the collector's may hold a lock)
    if t.name == "kvtier-abandoned":
        t.join(10)
for port in ports:  # released: it listens again (a closed connection's TIME_WAIT aside, as zmq binds)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
print("collected", len(ports))
"""


def test_a_manager_dropped_without_shutdown_is_collected_and_says_so() -> None:
    """Managers a failed setup dropped without ``shutdown()`` are collected: their sockets close
    (the ports bind again) and a warning says to call ``shutdown()``.  The collector used to hang
    for ever in pyzmq's context, waiting for sockets it could no longer close (decision A7).  In a
    child process: a hang must not take the test worker with it."""
    import subprocess
    import sys

    try:
        r = subprocess.run([sys.executable, "-c", _DROPPED], capture_output=True, text=True, timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail("collecting a manager dropped without shutdown() hung")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "collected 2"
    assert r.stderr.count("dropped without shutdown(): its sockets are closed now") == 4


_LEFT_AT_EXIT = """
import atexit, socket, sys, threading

started = []  # threads started during the exit: a close handed to one the exit does not wait for
_start = threading.Thread.start
def start(self):
    started.append(self.name)
    _start(self)

def closed_by_now():  # registered before anything: runs after every other exit hook and finalizer
    threading.Thread.start = _start
    with socket.socket() as s:
        s.settimeout(2)
        print("port", "closed" if s.connect_ex(("127.0.0.1", port)) else "still listening", flush=True)
    print("threads started during the exit:", started, flush=True)

atexit.register(closed_by_now)
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
mgr = KvTierManager({"host": "127.0.0.1", "port": 0, "data_plane": sys.argv[1]}, BlockPool(4, 4096, pin=False))
port = mgr.port
threading.Thread.start = start
sys.exit(0)  # without shutdown(), the manager still referenced
"""


_COLLECTED_AT_EXIT = """
import atexit, gc, socket, sys, threading

def closed_by_now():  # registered before anything: runs after every other exit hook and finalizer
    running = [t for t in threading.enumerate() if t.name == "kvtier-abandoned"]  # before any GIL release
    print("closes still running:", len(running), flush=True)
    with socket.socket() as s:
        s.settimeout(2)
        print("port", "closed" if s.connect_ex(("127.0.0.1", port)) else "still listening", flush=True)

atexit.register(closed_by_now)
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
mgr = KvTierManager({"host": "127.0.0.1", "port": 0, "data_plane": sys.argv[1]}, BlockPool(4, 4096, pin=False))
port = mgr.port
mgr.cycle = mgr  # garbage only the collector finds
del mgr
sys.setswitchinterval(10)  # the exit runs on without handing the GIL over, unless it waits for the close
gc.collect()  # collected now: its close runs on a thread of its own
sys.exit(0)
"""


@pytest.mark.parametrize("plane", ["zmq", "nixl"])
def test_a_manager_collected_just_before_the_exit_is_closed_before_the_exit_ends(plane) -> None:
    """A manager dropped in a reference cycle and collected right before the exit: its close runs
    on a thread of its own, which the exit waits for — a NIXL agent torn down mid-close by the
    exit's teardown aborted the process (decision A7)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _COLLECTED_AT_EXIT, plane], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["closes still running: 0", "port closed"], r.stdout


@pytest.mark.parametrize("plane", ["zmq", "nixl"])
def test_a_manager_left_at_exit_without_shutdown_is_closed_during_the_exit(plane) -> None:
    """A manager still referenced at the interpreter's exit is closed by the exit's finalizers, on
    the exiting thread: its port no longer listens when the last exit hook runs.  The close used
    to go to a daemon thread the exit did not wait for; a NIXL producer whose agent was left to the
    exit's teardown then died of SIGABRT about one exit in three (decision A7)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _LEFT_AT_EXIT, plane], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["port closed", "threads started during the exit: []"], r.stdout
    assert "dropped without shutdown(): its sockets are closed now" in r.stderr


def test_a_listener_that_never_speaks_is_named_handshake_timeout_every_time(make_manager, silent_port) -> None:
    """A wrong ``remote_port`` (something that accepts TCP and never speaks): the load fails
    ``handshake_timeout``, whose advice names that cause, in every trial.  libzmq's own cut of a
    connection that never completes ZMTP came at the same instant as the core's hello timer and
    won 1 time in 6, reading as ``peer_disconnected`` ("the peer closed the connection"), which
    it never did (decision T14)."""
    reasons = []
    for trial in range(8):
        c = make_manager({"handshake_timeout_s": 0.5})
        jobs = Jobs(c)
        req = consumer_req(f"d{trial}", f"kv-{trial}", "127.0.0.1", silent_port)
        c.on_new_request(req)
        c.submit_load(job(1, keys_for(f"kv-{trial}", 1), [0], req))
        assert pump_until(lambda: jobs.has(1), jobs=[jobs], timeout_s=5.0)
        reasons.append(jobs.one(1).reason)
        c.shutdown(0.05)
    assert reasons == ["handshake_timeout"] * 8


@pytest.fixture
def rude_port():
    """A wrong ``remote_port`` where another service answers and hangs up (an HTTP server's 400)."""
    import threading

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = lst.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(64)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield lst.getsockname()[1]
    lst.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); a close alone leaves it blocked
    lst.close()
    t.join(5)
    assert not t.is_alive()


def test_a_service_that_is_not_kvtier_is_not_blamed_on_curve_alone(make_manager, rude_port, caplog) -> None:
    """With ``auth: none`` a hang-up during the handshake may be a CURVE producer — or the wrong
    port: whatever libzmq reports of it, the line names the address as a suspect too."""
    c = make_manager({"allowed_peers": ["127.0.0.1"], "handshake_timeout_s": 2.0})
    jobs = Jobs(c)
    req = consumer_req("d", "kv-rude", "127.0.0.1", rude_port)
    with caplog.at_level(logging.WARNING):
        c.on_new_request(req)
        c.submit_load(job(1, keys_for("kv-rude", 1), [0], req))
        assert pump_until(lambda: jobs.has(1), managers=[c], jobs=[jobs], timeout_s=10.0)
    assert not jobs.one(1).success
    lines = [r.getMessage() for r in caplog.records if "handshake with producer" in r.getMessage()]
    assert lines and all("remote_port" in x or "does not speak our ZMTP" in x for x in lines), lines


def test_a_name_that_does_not_resolve_fails_at_once_whatever_allowed_peers_says(make_manager, caplog) -> None:
    """An allowed_peers list that names the host admits it without resolving it; the dial still
    resolves it first, so a typo fails ``unresolved_host`` at once with "cannot resolve", not a
    silent ``handshake_timeout`` seconds later, nor ``connect_refused`` (T21)."""
    c = make_manager({"allowed_peers": ["no-such-host.invalid"], "handshake_timeout_s": 20.0})
    jobs = Jobs(c)
    req = consumer_req("d", "kv-typo", "no-such-host.invalid", 5710)
    with caplog.at_level(logging.WARNING):
        c.on_new_request(req)
        c.submit_load(job(1, keys_for("kv-typo", 1), [0], req))
        assert pump_until(lambda: jobs.has(1), managers=[c], jobs=[jobs], timeout_s=10.0)
    assert jobs.one(1).reason == "unresolved_host"
    assert any("cannot resolve no-such-host.invalid" in r.getMessage() for r in caplog.records)


_KVTIER = {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "port": 5710}


@pytest.mark.parametrize("value, says", [
    (-1, "below 0 vLLM silently starts no tier-poll thread"), ("fast", "vLLM reads it with float() and fails"),
    (None, "vLLM reads it with float() and fails at start"), (True, "a boolean, which vLLM reads with float() as 1.0 s"),
    ("nan", "not a number of seconds"), ("inf", "not a number of seconds"), (10 ** 400, "reads it with float() and fails"),
])
def test_check_config_refuses_a_tier_poll_interval_vllm_would_refuse_or_ignore(value, says) -> None:
    """vLLM's own ``tier_poll_interval_s`` beside the kvtier entry: one its ``float()`` fails on stops the
    engine at start, a negative one silently starts no tier-poll thread (both were ``ok``); a 0 is said."""
    extra = {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [_KVTIER]}
    top = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    res = CliRunner().invoke(cli, ["check-config", json.dumps(
        {**top, "kv_connector_extra_config": {**extra, "tier_poll_interval_s": value}})])
    assert res.exit_code == 1 and says in res.output and "write seconds, e.g. 0.001" in res.output, res.output
    for fine in (0.001, 1, "0.002"):
        res = CliRunner().invoke(cli, ["check-config", json.dumps(
            {**top, "kv_connector_extra_config": {**extra, "tier_poll_interval_s": fine}})])
        assert res.exit_code == 0 and "tier_poll" not in res.output, res.output
    res = CliRunner().invoke(cli, ["check-config", json.dumps(
        {**top, "kv_connector_extra_config": {**extra, "tier_poll_interval_s": 0}})])
    assert res.exit_code == 0 and "tier_poll_interval_s=0: vLLM starts no tier-poll thread" in res.output, res.output
    multi = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"tier_poll_interval_s": 0.001, "connectors": [
        {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}]}}  # one level too high
    res = CliRunner().invoke(cli, ["check-config", json.dumps(multi)])
    assert res.exit_code == 1 and "tier_poll_interval_s belongs in the OffloadingConnector's" in res.output, res.output


@pytest.mark.parametrize("doc, says", [
    ({"kv_connector": "P2pNcclConnector", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "secondary_tiers": [_KVTIER]}},
     "kv_connector is 'P2pNcclConnector'"),
    ({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "allowed_peers": ["10.0.0.5:5710"], "unbound_store_timeout_s": 180,
        "secondary_tiers": [_KVTIER]}},
     "allowed_peers, unbound_store_timeout_s belong inside the kvtier entry"),
    ({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "secondary_tiers": [_KVTIER, {**_KVTIER, "port": 5711}]}},
     "2 secondary_tiers entries load kvtier: one per engine"),
    ({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "secondary_tiers": [{
            **_KVTIER, "auth": "curve", "auth_secret_key_file": "/nonexistent.key_secret",
            "auth_allowed_keys_dir": "/nonexistent"}]}},
     "auth_secret_key_file"),
])
def test_check_config_finds_what_the_engine_would_ignore_or_refuse(doc, says) -> None:
    """A connector that never loads kvtier, kvtier keys one level too high (vLLM ignores them: an
    ``allowed_peers`` there leaves the tier open), two kvtier entries, CURVE key files the engine
    cannot read at start: each was ``ok``."""
    res = CliRunner().invoke(cli, ["check-config", json.dumps(doc)])
    assert res.exit_code == 1 and says in res.output, res.output


def test_check_config_reads_a_multiconnector_through_its_connectors() -> None:
    """vLLM's ``MultiConnector`` builds each of its ``connectors`` as a connector of its own:
    kvtier's entry in the offloading one is checked there (it was refused as the wrong
    ``kv_connector``), other connectors are not judged, and a MultiConnector without an
    offloading connector, or with two kvtier entries, is a problem."""
    ok = {"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", "port": 5710}

    def offloading(*entries: dict) -> dict:
        return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "secondary_tiers": list(entries)}}

    def multi(*children: dict) -> str:
        return json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {"connectors": list(children)}})

    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    res = CliRunner().invoke(cli, ["check-config", multi(nixl, offloading(ok))])
    assert res.exit_code == 0 and "ok: connectors[1]: secondary_tiers[0]: kvtier" in res.output, res.output
    res = CliRunner().invoke(cli, ["check-config", multi(nixl, offloading({**ok, "unbound_store_timout_s": 3}))])
    assert res.exit_code == 1 and "connectors[1]: secondary_tiers[0]:" in res.output, res.output
    assert "did you mean 'unbound_store_timeout_s'" in res.output
    res = CliRunner().invoke(cli, ["check-config", multi(nixl)])
    assert res.exit_code == 1 and 'is "kv_connector": "OffloadingConnector"' in res.output, res.output
    res = CliRunner().invoke(cli, ["check-config", multi(offloading(ok), offloading({**ok, "port": 5711}))])
    assert res.exit_code == 1 and "2 secondary_tiers entries load kvtier" in res.output, res.output
    res = CliRunner().invoke(cli, ["check-config", multi(offloading({"type": "p2p", "port": 5710}))])
    assert res.exit_code == 1 and "no secondary_tiers entry of an OffloadingConnector loads kvtier" in res.output
    doc = json.loads(multi(nixl, offloading(ok)))
    doc["kv_connector_extra_config"]["allowed_peers"] = ["10.0.0.6"]  # one level too high: ignored
    res = CliRunner().invoke(cli, ["check-config", json.dumps(doc)])
    assert res.exit_code == 1 and "allowed_peers belong inside the kvtier entry" in res.output, res.output
    connectors = doc["kv_connector_extra_config"]["connectors"]
    doc["kv_connector_extra_config"] = {"connectors": connectors, "backpressure": {}}
    res = CliRunner().invoke(cli, ["check-config", json.dumps(doc)])  # vLLM's key, not kvtier's to move
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["check-config", json.dumps({"kv_connector": "MultiConnector"})])
    assert res.exit_code == 1 and "connectors is missing or empty" in res.output, res.output
    res = CliRunner().invoke(cli, ["check-config", json.dumps({**offloading(ok), "kv_connector": "NixlConnector"})])
    assert res.exit_code == 1 and "or list it among a MultiConnector's connectors" in res.output, res.output
