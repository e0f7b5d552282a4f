"""kvtier.params: untrusted kv_transfer_params (B39, B40).

Unit rules, the allowed_peers policy, and a Hypothesis fuzz through a real KvTierManager (on an
in-memory transport) that never sees an exception other than the documented ValueError, and
never dials an endpoint outside allowed_peers.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.api import LookupResult, RequestContext, TransferJob
from kvtier.config import TierConfig, TierConfigError
from kvtier.manager import KvTierManager
from kvtier.memory import BlockPool
from kvtier.params import HOST_CACHE, PeerNotAllowed, PeerPolicy, TransferParams, clip, parse_params
from kvtier.testing.inproc import InprocNetwork, InprocTransport

POLICY = PeerPolicy.from_entries(["10.0.0.0/8", "prefill-0.svc:5710", "fd00::/8", "127.0.0.1"])


def pref(**kw):
    sub = {"kv_request_id": "kv-1", "remote_host": "10.1.2.3", "remote_port": 5710, **kw}
    return {"remote_prefiller": {k: v for k, v in sub.items() if v is not ...}}


@pytest.mark.parametrize(
    "params, expected",
    [
        (None, TransferParams("local")),
        ({}, TransferParams("local")),
        ({"do_remote_decode": True}, TransferParams("local")),  # another connector's keys pass through
        (pref(), TransferParams("consumer", "kv-1", "10.1.2.3:5710")),
        (pref(remote_port="5710"), TransferParams("consumer", "kv-1", "10.1.2.3:5710")),
        (pref(remote_port=" 5710 "), TransferParams("consumer", "kv-1", "10.1.2.3:5710")),
        (pref(remote_host="PREFILL-0.svc."), TransferParams("consumer", "kv-1", "prefill-0.svc:5710")),
        (pref(remote_host="[fd00::1]"), TransferParams("consumer", "kv-1", "[fd00::1]:5710")),
        ({"prefill": pref()["remote_prefiller"]}, TransferParams("consumer", "kv-1", "10.1.2.3:5710")),
        # vLLM 0.33.0's symmetric request (decision Y1), not an alias of remote_prefiller any more
        ({"remote_kv_source": pref()["remote_prefiller"]}, TransferParams("source", "kv-1", "10.1.2.3:5710")),
        # a request that names a PD leg is that leg; remote_kv_source is then ignored (as vLLM does)
        ({**pref(), "remote_kv_source": pref(remote_host="10.9.9.9")["remote_prefiller"]},
         TransferParams("consumer", "kv-1", "10.1.2.3:5710")),
        ({"remote_decoder": {"kv_request_id": "kv-2"}, "remote_kv_source": pref()["remote_prefiller"]},
         TransferParams("producer", "kv-2")),
        ({"remote_decoder": {"kv_request_id": "kv-2"}}, TransferParams("producer", "kv-2")),
        ({"decode": {"kv_request_id": "kv-2", "consumer": "decode-0"}}, TransferParams("producer", "kv-2", None, "decode-0")),
    ],
)
def test_accepted_shapes(params, expected) -> None:
    assert parse_params(params, POLICY) == expected


@pytest.mark.parametrize(
    "params, names",
    [
        ("x", "mapping"),
        (pref(kv_request_id=...), "remote_prefiller.kv_request_id"),
        (pref(kv_request_id="a" * 257), "remote_prefiller.kv_request_id"),
        (pref(kv_request_id="has space"), "remote_prefiller.kv_request_id"),
        (pref(remote_host="evil host"), "remote_prefiller.remote_host"),
        (pref(remote_host="a/b"), "remote_prefiller.remote_host"),
        (pref(remote_host="x" * 300), "remote_prefiller.remote_host"),
        (pref(remote_host=7), "remote_prefiller.remote_host"),
        (pref(remote_port=0), "remote_prefiller.remote_port"),
        (pref(remote_port=True), "remote_prefiller.remote_port"),
        (pref(remote_port=5710.0), "remote_prefiller.remote_port"),
        (pref(remote_port="5e3"), "remote_prefiller.remote_port"),
        (pref(remote_port=10**100), "remote_prefiller.remote_port"),
        ({"remote_prefiller": pref()["remote_prefiller"], "prefill": pref()["remote_prefiller"]}, "twice"),
        ({**pref(), "remote_decoder": {"kv_request_id": "k"}}, "both"),
        ({"remote_decoder": {"kv_request_id": "k", "consumer": "no spaces"}}, "remote_decoder.consumer"),
        ({"decode": []}, "decode must be a mapping"),
    ],
)
def test_refused_shapes_name_the_field(params, names) -> None:
    with pytest.raises(ValueError, match=names) as ei:
        parse_params(params, POLICY)
    assert len(str(ei.value)) < 400  # attacker strings are clipped


def test_peer_policy() -> None:
    assert POLICY.allows("10.200.0.1", 1) and POLICY.allows("prefill-0.svc", 5710)
    assert POLICY.allows("127.0.0.1", 9) and POLICY.allows("fd00::5", 1)
    assert not POLICY.allows("prefill-0.svc", 5711) and not POLICY.allows("169.254.169.254", 80)
    assert not POLICY.allows("evil.example", 5710)
    with pytest.raises(PeerNotAllowed) as ei:
        parse_params(pref(remote_host="169.254.169.254", remote_port=80), POLICY)
    assert ei.value.endpoint == "169.254.169.254:80" and isinstance(ei.value, ValueError)
    # allowed_peers bounds whom a symmetric request probes exactly as whom a PD consumer fetches from
    with pytest.raises(PeerNotAllowed) as ei:
        parse_params({"remote_kv_source": pref(remote_host="169.254.169.254", remote_port=80)["remote_prefiller"]},
                     POLICY)
    assert ei.value.endpoint == "169.254.169.254:80"
    # a malformed field is malformed whatever the peer: refused as such, not as a peer (counted, named)
    with pytest.raises(ValueError, match=r"remote_prefiller\.life is invalid") as ei:
        parse_params(pref(remote_host="169.254.169.254", remote_port=80, life=5), POLICY)
    assert not isinstance(ei.value, PeerNotAllowed)
    assert PeerPolicy.from_entries(["*"]).allows("anything", 1)
    for bad in (["10.0.0.0/33"], ["h:0"], [""], [5], ["a b"]):
        with pytest.raises(ValueError):
            PeerPolicy.from_entries(bad)


def test_a_remembered_verdict_is_the_policys_own_and_stays_true_past_the_cache() -> None:
    """Verdicts and host forms are remembered (the engine's thread parses one per request): two
    policies asked about one endpoint each keep their own answer, asked again and past the bound."""
    listed, wildcard = PeerPolicy.from_entries(["10.0.0.1:5710"]), PeerPolicy.from_entries(["*"], listen_host="0.0.0.0")
    for _ in range(2):
        assert listed.allows("10.0.0.1", 5710) and not wildcard.allows("127.0.0.1", 5710)
        assert not listed.allows("127.0.0.1", 5710) and wildcard.allows("10.0.0.1", 5710)
    for i in range(HOST_CACHE + 10):  # beyond the bound: forgotten, never wrong
        host = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        assert listed.allows(host, 5710) is (host == "10.0.0.1")
        assert parse_params(pref(remote_host=f"[{host}]", remote_port=1), wildcard).peer == f"{host}:1"
    assert not wildcard.allows("169.254.169.254", 80) and listed.allows("10.0.0.1", 5710)
    with pytest.raises(ValueError, match="remote_prefiller.remote_host must be a hostname"):
        parse_params(pref(remote_host="bad host", remote_port=1), wildcard)  # refused twice, never remembered as good
    with pytest.raises(ValueError, match="remote_prefiller.remote_host must be a hostname"):
        parse_params(pref(remote_host="bad host", remote_port=1), wildcard)


def test_allowed_peers_config_key() -> None:
    assert TierConfig().allowed_peers == ("*",)
    cfg = TierConfig.from_dict({"allowed_peers": ["10.0.0.0/8", "prefill-0:5710"]})
    assert cfg.allowed_peers == ("10.0.0.0/8", "prefill-0:5710")
    for bad in ([], "10.0.0.1", ["10.0.0.0/99"], [None]):
        with pytest.raises(TierConfigError, match="allowed_peers"):
            TierConfig.from_dict({"allowed_peers": bad})
    with pytest.raises(TierConfigError, match="auth_secret_key_file"):
        TierConfig.from_dict({"auth": "curve"})


def test_clip() -> None:
    assert clip("x" * 10_000).endswith("...") and len(clip("x" * 10_000)) == 80


@pytest.mark.parametrize("host, why", [
    ("169.254.169.254", "cloud metadata"), ("169.254.170.2", "cloud metadata"), ("100.100.100.200", "cloud metadata"),
    ("fd00:ec2::254", "cloud metadata"), ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("224.0.0.251", "multicast"), ("ff02::1", "multicast"),
    ("255.255.255.255", "broadcast"), ("::ffff:169.254.169.254", "cloud metadata"),
    ("127.0.0.1", "loopback"), ("metadata.google.internal", "metadata service"),
    # the metadata service behind a NAT64 gateway, a 6to4 relay and a Teredo server (decision S16)
    ("64:ff9b::a9fe:a9fe", "cloud metadata"), ("2002:a9fe:a9fe::1", "cloud metadata"),
    ("2001:0:a9fe:a9fe::1", "cloud metadata"), ("64:ff9b::a9fe:101", "link-local"),
])
def test_the_wildcard_never_admits_addresses_no_producer_lives_at(host, why) -> None:
    """Decision S11: ``"*"`` admits neither these nor (listening beyond loopback) loopback; an
    explicit entry still does, and the refusal says why."""
    wild = PeerPolicy.from_entries(["*"], listen_host="10.0.0.5")
    with pytest.raises(PeerNotAllowed, match=why):
        parse_params(pref(remote_host=host), wild)
    explicit = PeerPolicy.from_entries(["*", host], listen_host="10.0.0.5")
    assert parse_params(pref(remote_host=host), explicit).role == "consumer"


def test_the_wildcard_admits_ordinary_endpoints_and_loopback_on_a_loopback_listener() -> None:
    assert parse_params(pref(remote_host="10.9.8.7"), PeerPolicy.from_entries(["*"], listen_host="10.0.0.5")).role == "consumer"
    assert parse_params(pref(remote_host="prefill-0.svc"), PeerPolicy.from_entries(["*"], listen_host="10.0.0.5")).role == "consumer"
    assert parse_params(pref(remote_host="127.0.0.1"), PeerPolicy.from_entries(["*"], listen_host="127.0.0.1")).role == "consumer"
    # an IPv6 address that embeds an ordinary IPv4 one is ordinary; one embedding loopback reaches the
    # loopback of the host that translates it, never ours (S16)
    assert parse_params(pref(remote_host="64:ff9b::a00:5"), PeerPolicy.from_entries(["*"])).role == "consumer"
    with pytest.raises(PeerNotAllowed, match="loopback"):
        parse_params(pref(remote_host="64:ff9b::7f00:1"), PeerPolicy.from_entries(["*"], listen_host="127.0.0.1"))


def test_a_name_the_wildcard_admitted_is_vetted_on_what_it_resolves_to() -> None:
    wild = PeerPolicy.from_entries(["*", "listed.svc"], listen_host="10.0.0.5")
    assert "169.254.169.254" in wild.vet_resolved("evil.example", 80, "169.254.169.254")
    assert wild.vet_resolved("evil.example", 80, "10.1.1.1") is None
    assert wild.vet_resolved("listed.svc", 80, "169.254.169.254") is None  # listed names are trusted (S4)
    assert PeerPolicy.from_entries(["10.0.0.0/8"]).vet_resolved("x", 1, "169.254.169.254") is None  # not open


def test_a_resolved_metadata_address_is_never_dialled() -> None:
    """Through the real transport: a name resolving to a metadata address is refused before any
    socket connects (DialNotAllowed), and the name is never dialled by libzmq."""
    from kvtier.transport import DialNotAllowed, ZmqTransport

    wild = PeerPolicy.from_entries(["*"], listen_host="10.0.0.5")
    t = ZmqTransport("127.0.0.1", 0)
    try:
        with pytest.raises(DialNotAllowed, match="loopback"):
            t.connect("localhost:5710", fail_fast=True, vet=wild.vet_resolved)
        assert t.peers() == []
    finally:
        t.close()


@pytest.mark.parametrize("leg", ["remote_prefiller", "remote_decoder"])
def test_life_is_optional_and_checked(leg) -> None:
    base = pref()["remote_prefiller"] if leg == "remote_prefiller" else {"kv_request_id": "kv-2"}
    assert parse_params({leg: {**base, "life": "uuid-1"}}, POLICY).life == "uuid-1"
    assert parse_params({leg: base}, POLICY).life == ""
    for bad in ("x" * 65, "no spaces", 7, b"b"):
        with pytest.raises(ValueError, match=f"{leg}.life"):
            parse_params({leg: {**base, "life": bad}}, POLICY)


# -- through the manager ---------------------------------------------------------------------------


class _SpyTransport(InprocTransport):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.dialled: list[str] = []

    def connect(self, address: str, **kw) -> str:
        self.dialled.append(address)
        return super().connect(address, **kw)


@pytest.fixture(scope="module")
def spy_mgr():
    t = _SpyTransport(InprocNetwork(), "decode:1")
    cfg = {"allowed_peers": ["10.0.0.0/8", "prefill-0.svc:5710", "127.0.0.1"]}
    m = KvTierManager(cfg, BlockPool(8, 64, pin=False), transport=t)
    yield m, t
    m.shutdown()


def test_unlisted_producer_is_never_dialled(spy_mgr) -> None:
    m, t = spy_mgr
    before = len(t.dialled)
    req = RequestContext(req_id="ssrf-1", kv_transfer_params={"remote_prefiller": {"kv_request_id": "A", "remote_host": "169.254.169.254", "remote_port": 80}})
    assert m.on_new_request(req) == "local"
    assert len(t.dialled) == before
    assert m.lookup(b"k", req) is LookupResult.MISS
    m.submit_load(TransferJob(job_id=901, keys=(b"k",), slots=(0,), req=req))
    [r] = [r for r in m.get_finished_jobs() if r.job_id == 901]
    assert (r.success, r.reason) == (False, "peer_not_allowed")
    assert m.stats()["kvtier_rejected_peer_total"] >= 1
    assert len(t.dialled) == before
    m.on_request_finished(req)


def test_a_request_announced_again_naming_a_refused_peer_is_refused_and_keeps_its_first_registration(spy_mgr) -> None:
    """Announced with an allowed producer, then again with one allowed_peers refuses: the second
    call raises as any different re-announce does, so the first registration (its id in use) is
    not orphaned: once the request finished, the id can be announced again."""
    m, _ = spy_mgr

    def req(host: str, rid: str = "twice-1") -> RequestContext:
        return RequestContext(req_id=rid, kv_transfer_params={"remote_prefiller": {
            "kv_request_id": "T", "remote_host": host, "remote_port": 80}})
    assert m.on_new_request(req("10.1.2.3")) == "consumer"
    rejected = m.stats()["kvtier_rejected_peer_total"]
    with pytest.raises(ValueError, match="announced twice with different kv_transfer_params"):
        m.on_new_request(req("169.254.169.254"))
    assert m.stats()["kvtier_rejected_peer_total"] == rejected  # nothing was refused: no count, no record
    m.on_request_finished(req("10.1.2.3"))
    assert m.on_new_request(req("10.1.2.3", "twice-2")) == "consumer"  # the id is free again
    m.on_request_finished(req("10.1.2.3", "twice-2"))
    refused = req("169.254.169.254", "twice-3")
    assert m.on_new_request(refused) == m.on_new_request(refused) == "local"  # the same refusal twice: no error
    assert m.stats()["kvtier_rejected_peer_total"] == rejected + 1  # and counted once
    m.on_request_finished(refused)


def test_a_refused_dial_names_the_rule_that_refused_it(caplog) -> None:
    """allowed_peers '*' on a manager listening beyond loopback does not admit loopback: the
    per-request line says so, not "not in allowed_peers" (the list is '*'), and names the
    kv_request_id `kvtier why` takes."""
    t = _SpyTransport(InprocNetwork(), "decode:1")
    m = KvTierManager({"host": "0.0.0.0", "port": 0}, BlockPool(8, 64, pin=False), transport=t)
    try:
        req = RequestContext(req_id="loop-1", kv_transfer_params={"remote_prefiller": {
            "kv_request_id": "L", "remote_host": "127.0.0.1", "remote_port": 5710}})
        with caplog.at_level(logging.WARNING, logger="kvtier"):
            assert m.on_new_request(req) == "local"
        (line,) = [r.getMessage() for r in caplog.records if "refusing to dial" in r.getMessage()]
        assert "loopback, while this manager listens beyond loopback" in line and "not in allowed_peers" not in line
        assert "(kv_request_id 'L')" in line, line
        assert not t.dialled
    finally:
        m.shutdown()


def test_each_refused_endpoint_gets_its_own_line(caplog) -> None:
    """security.md: one line per (peer, reason) per 10 s: every refused endpoint is named, not
    only the first of the interval (they shared one slot); the same endpoint again is not."""
    m = KvTierManager({"allowed_peers": ["10.0.0.0/8"]}, BlockPool(8, 64, pin=False),
                      transport=_SpyTransport(InprocNetwork(), "decode:2"))
    try:
        hosts = ["192.168.1.1", "192.168.1.2", "192.168.1.3", "192.168.1.1"]
        with caplog.at_level(logging.WARNING, logger="kvtier"):
            for i, host in enumerate(hosts):
                assert m.on_new_request(RequestContext(req_id=f"r{i}", kv_transfer_params={"remote_prefiller": {
                    "kv_request_id": f"k{i}", "remote_host": host, "remote_port": 5710}})) == "local"
        lines = [r.getMessage() for r in caplog.records if "refusing to dial" in r.getMessage()]
        assert [h for h in hosts[:3] if any(f"dial '{h}:5710'" in line for line in lines)] == hosts[:3], lines
        assert len(lines) == 3, lines
    finally:
        m.shutdown()


# Hypothesis: arbitrary JSON-ish shapes, biased towards the keys the parser reads.
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True), st.text(max_size=40),
    st.sampled_from(["5710", "0", "65536", "127.0.0.1", "10.1.2.3", "::1", "[fd00::1]", "169.254.169.254",
                     "prefill-0.svc", "kv-1", "a" * 300, "evil host", "", " 80 "]),
)
_json = st.recursive(_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                     max_leaves=8)
_sub = st.fixed_dictionaries({}, optional={
    "kv_request_id": _json, "remote_host": _json, "remote_port": _json, "consumer": _json})
_params = st.one_of(
    _json,
    st.dictionaries(st.sampled_from(["remote_prefiller", "remote_decoder", "prefill", "decode",
                                     "remote_kv_source", "other"]), st.one_of(_sub, _json), max_size=3),
)


def _drive(m: KvTierManager, t: _SpyTransport, params, n: int) -> None:
    before = len(t.dialled)
    req = RequestContext(req_id=f"fz-{n}", kv_transfer_params=params)
    try:
        role = m.on_new_request(req)
    except ValueError as exc:  # the documented one: it names the request (and the field)
        assert str(exc).startswith(f"request 'fz-{n}': "), exc
        assert len(t.dialled) == before
        assert m.lookup(b"k", req) is LookupResult.MISS
        return
    for address in t.dialled[before:]:  # a dial only ever goes to an allowed endpoint
        host, _, port = address.rpartition(":")
        assert PeerPolicy.from_entries(m.config.allowed_peers).allows(host.strip("[]"), int(port)), address
    m.lookup(b"k", req)
    if role == "consumer":
        m.submit_load(TransferJob(job_id=10_000_000 + n, keys=(b"k",), slots=(0,), req=req))
    m.get_finished_jobs()
    m.on_request_finished(req)
    m.get_finished_jobs()


_counter = iter(range(10**9))


@given(_params)
def test_fuzz_kv_transfer_params_never_escape(spy_mgr, params) -> None:
    m, t = spy_mgr
    _drive(m, t, params, next(_counter))


@pytest.mark.slow
@settings(max_examples=10_000)
@given(_params)
def test_fuzz_kv_transfer_params_10k(spy_mgr, params) -> None:
    m, t = spy_mgr
    _drive(m, t, params, next(_counter))


@pytest.mark.parametrize(("params", "value"), [
    ({"remote_prefiller": {"kv_request_id": "kv 43", "remote_host": "h", "remote_port": 1}}, "'kv 43'"),
    ({"remote_decoder": {"kv_request_id": "k", "life": "a b"}}, "'a b'"),
    ({"remote_prefiller": {"kv_request_id": "x" * 300, "remote_host": "h", "remote_port": 1}}, "'xxx"),
    ({"remote_decoder": {"kv_request_id": "a b" + "y" * 100}}, "'a byyy"),  # quoted, and cut, by the checker
    ({"remote_decoder": {"kv_request_id": "k", "life": "z y" * 40}}, "'z yz y"),
])
def test_a_malformed_id_or_life_is_shown_once(params, value) -> None:
    """The checker's message may quote the value already: the error shows it once, never twice."""
    with pytest.raises(ValueError) as ei:
        parse_params(params)
    assert str(ei.value).count(value) == 1, ei.value


def test_a_name_refused_beside_its_listed_address_says_entries_are_not_resolved() -> None:
    """``localhost`` is not ``127.0.0.1`` to allowed_peers: the refusal says why a newcomer's
    obvious equivalent was refused."""
    policy = PeerPolicy.from_entries(["127.0.0.1:5710"])
    with pytest.raises(PeerNotAllowed) as ei:
        parse_params({"remote_prefiller": {"kv_request_id": "k", "remote_host": "localhost", "remote_port": 5710}},
                     policy)
    assert ei.value.why == "allowed_peers does not list it; entries match the address as written, never resolved"
