"""CURVE on ZmqTransport (loopback): allowed peers talk encrypted and are named; strangers are
refused by the ZAP handler before any message reaches us; consumers never dial unnamed keys."""

from __future__ import annotations

import time

import pytest
import zmq
from click.testing import CliRunner

from kvtier.cli import cli
from kvtier.transport import PeerInfo, TransportError, ZmqTransport
from kvtier.transport.curve import curve_settings, generate_keys, load_allowed, load_identity

from test_zmq_transport import FAST, recv_until

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def keys(tmp_path):
    """prefill-0 (serves 127.0.0.1), decode-0 (allowed), mallory (not allowed anywhere)."""
    mine = tmp_path / "keys"
    generate_keys(mine, "prefill-0", ("127.0.0.1",))
    generate_keys(mine, "decode-0")
    generate_keys(tmp_path / "other", "mallory")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    for n in ("prefill-0", "decode-0"):
        (allowed / f"{n}.key").write_text((mine / f"{n}.key").read_text())
    return {"dir": mine, "allowed": allowed, "mallory": tmp_path / "other" / "mallory.key_secret"}


@pytest.fixture
def pair(keys):
    made = []
    p = ZmqTransport(**FAST, curve=curve_settings(str(keys["dir"] / "prefill-0.key_secret"), str(keys["allowed"])))
    made.append(p)
    c = ZmqTransport(**FAST, curve=curve_settings(str(keys["dir"] / "decode-0.key_secret"), str(keys["allowed"])))
    made.append(c)
    yield p, c
    for t in made:
        t.close()


def test_allowed_peer_is_served_and_named(pair) -> None:
    p, c = pair
    peer = c.connect(p.address)
    c.send(peer, [b"hello", b"x" * 100_000])
    [(in_peer, frames)] = recv_until(p, 1)
    assert bytes(frames[1]) == b"x" * 100_000
    info = p.peer_info(in_peer)
    assert info is not None and info.principal == "decode-0"
    assert c.peer_info(peer) == PeerInfo(p.address, "prefill-0")
    p.send(in_peer, [b"reply"])
    assert [bytes(f[0]) for _, f in recv_until(c, 1)] == [b"reply"]


def test_a_certificate_whose_name_starts_with_a_dot_is_admitted_as_it_was_read(keys) -> None:
    """The keys the handshake admits are the ones the loader read: pyzmq's own reader of the
    directory skipped `.decode-1.key`, which passed start-up and then failed every handshake."""
    generate_keys(keys["dir"], "decode-1")  # its certificate copied in under a hidden name
    (keys["allowed"] / ".decode-1.key").write_text((keys["dir"] / "decode-1.key").read_text())
    p = ZmqTransport(**FAST, curve=curve_settings(str(keys["dir"] / "prefill-0.key_secret"), str(keys["allowed"])))
    c = ZmqTransport(**FAST, curve=curve_settings(str(keys["dir"] / "decode-1.key_secret"), str(keys["allowed"])))
    try:
        peer = c.connect(p.address)
        c.send(peer, [b"hello"])
        [(in_peer, frames)] = recv_until(p, 1)
        assert bytes(frames[0]) == b"hello"
        assert p.peer_info(in_peer).principal == ".decode-1"
    finally:
        c.close()
        p.close()


def _raw_dealer(ctx: zmq.Context, address: str, *, secret_file=None, server_key=None) -> zmq.Socket:
    d = ctx.socket(zmq.DEALER)
    d.linger = 0
    if secret_file is not None:
        pub, sec = zmq.auth.load_certificate(secret_file)
        d.curve_publickey, d.curve_secretkey, d.curve_serverkey = pub, sec, server_key
    d.connect(f"tcp://{address}")
    return d


@pytest.mark.parametrize("who", ["plain", "unlisted key"])
def test_stranger_gets_nothing_in(pair, keys, who) -> None:
    p, c = pair
    server_key = load_identity(keys["dir"] / "prefill-0.key_secret").public
    ctx = zmq.Context()
    try:
        kw = {} if who == "plain" else {"secret_file": keys["mallory"], "server_key": server_key}
        d = _raw_dealer(ctx, p.address, **kw)
        for _ in range(20):
            d.send_multipart([b"hello"])
        end = time.monotonic() + 1.0
        got = []
        while time.monotonic() < end:
            p.wait(0.05)
            got += p.recv()
        assert got == []  # nothing of the stranger's reached the transport
        # ...while the allowed consumer is served all along
        peer = c.connect(p.address)
        c.send(peer, [b"legit"])
        assert [bytes(f[0]) for _, f in recv_until(p, 1)] == [b"legit"]
    finally:
        ctx.destroy(linger=0)


def test_consumer_refuses_to_dial_an_endpoint_no_certificate_names(pair) -> None:
    _, c = pair
    with pytest.raises(TransportError, match="no certificate"):
        c.connect("10.9.9.9:5710")
    assert c.peers() == []


def test_consumer_does_not_talk_to_an_impostor(keys) -> None:
    # Someone else listens at the address prefill-0's certificate names: CURVE fails, nothing flows.
    impostor = ZmqTransport(**FAST, curve=curve_settings(str(keys["mallory"]), str(keys["allowed"])))
    c = ZmqTransport(**FAST, curve=curve_settings(str(keys["dir"] / "decode-0.key_secret"), str(keys["allowed"])))
    try:
        c.send(c.connect(impostor.address), [b"secret prompt"])
        end = time.monotonic() + 1.0
        got = []
        while time.monotonic() < end:
            impostor.wait(0.05)
            got += impostor.recv()
        assert got == []
    finally:
        impostor.close()
        c.close()


def test_key_files_are_checked(tmp_path, keys) -> None:
    with pytest.raises(ValueError, match="auth_secret_key_file"):
        load_identity(tmp_path / "missing.key_secret")
    with pytest.raises(ValueError, match="secret-key"):
        load_identity(keys["dir"] / "decode-0.key")  # a public certificate
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no public certificate"):
        load_allowed(tmp_path / "empty")
    with pytest.raises(ValueError, match="does not exist"):
        load_allowed(tmp_path / "nope")
    with pytest.raises(ValueError, match="not a directory"):
        load_allowed(keys["dir"] / "decode-0.key")
    with pytest.raises(ValueError, match="exists already"):
        generate_keys(keys["dir"], "decode-0")
    assert "secret" not in repr(load_identity(keys["dir"] / "decode-0.key_secret")).replace("CurveIdentity", "")


def test_an_identity_is_named_as_its_peers_name_it_dots_and_all(tmp_path) -> None:
    """Peers name a key by its NAME.key's stem; the identity's NAME.key_secret says the same name."""
    pub, sec = generate_keys(tmp_path, "decode.rack-2.0")
    assert load_identity(sec).name == "decode.rack-2.0" == pub.stem
    assert load_allowed(tmp_path).principal(load_identity(sec).public) == "decode.rack-2.0"


def test_both_key_paths_wrong_are_named_at_once(tmp_path) -> None:
    """An operator fixing one path should not then learn of the other: both in one error."""
    with pytest.raises(ValueError) as err:
        curve_settings(str(tmp_path / "missing.key_secret"), str(tmp_path / "nope"))
    text = str(err.value)
    assert "auth_secret_key_file" in text and "auth_allowed_keys_dir" in text and text.count("does not exist") == 2


def test_a_secret_key_left_in_the_allowed_directory_is_warned_about(keys, caplog) -> None:
    """The allowed directory is the one copied to every peer: a secret there goes with it."""
    import logging

    with caplog.at_level(logging.WARNING, logger="kvtier.transport.curve"):
        load_allowed(keys["allowed"])
        assert not [r for r in caplog.records if "holds a secret key" in r.getMessage()]
        (keys["allowed"] / "decode-0.key_secret").write_text((keys["dir"] / "decode-0.key_secret").read_text())
        allowed = load_allowed(keys["allowed"])  # still loads: the secret is not read
    said = [r.getMessage() for r in caplog.records if "holds a secret key" in r.getMessage()]
    assert len(said) == 1 and "decode-0.key_secret" in said[0] and "keep NAME.key_secret elsewhere" in said[0]
    assert "decode-0" in {allowed.principal(k) for k in allowed.names}


def test_a_secret_key_others_can_read_is_warned_about(keys, caplog) -> None:
    import logging
    import os

    path = keys["dir"] / "decode-0.key_secret"
    with caplog.at_level(logging.WARNING, logger="kvtier.transport.curve"):
        load_identity(path)  # as written by `kvtier keys generate`: 600, nothing said
        assert not [r for r in caplog.records if "other users" in r.getMessage()]
        os.chmod(path, 0o644)
        try:
            load_identity(path)
        finally:
            os.chmod(path, 0o600)  # the fixture's keys serve other tests
    said = [r.getMessage() for r in caplog.records if "other users" in r.getMessage()]
    assert len(said) == 1 and "mode 644" in said[0] and "chmod 600" in said[0], said


def _edit_key(path, field: str, new_value: str):
    import re

    text = path.read_text()
    edited = re.sub(rf'({field} = ")[^"]*(")', lambda m: m.group(1) + new_value + m.group(2), text)
    assert edited != text
    path.write_text(edited)
    return path


@pytest.mark.parametrize("field, value", [("secret-key", "TRUNCATED"), ("public-key", "x" * 39),
                                          ("secret-key", "~" * 40), ("public-key", "#" * 40)])
def test_a_cut_or_edited_key_is_named_with_its_file_not_at_bind_time(keys, field, value) -> None:
    """libzmq would refuse the key only at bind or dial ("Invalid argument", blamed on the host or
    reported as a refused dial); the load names the file, the field and the fix."""
    path = _edit_key(keys["dir"] / "decode-0.key_secret", field, value)
    with pytest.raises(ValueError, match=f"auth_secret_key_file .*decode-0.key_secret.*its {field} is not a CURVE key"):
        load_identity(path)
    cert = _edit_key(keys["allowed"] / "prefill-0.key", "public-key", "TOO-SHORT")
    with pytest.raises(ValueError, match="certificate .*prefill-0.key.*public-key is not a CURVE key"):
        load_allowed(keys["allowed"])
    assert cert.exists()


def test_a_secret_file_that_lost_its_secret_key_line_is_called_cut_not_a_public_certificate(keys) -> None:
    path = keys["dir"] / "decode-0.key_secret"
    path.write_text("".join(line for line in path.read_text().splitlines(True) if "secret-key" not in line))
    with pytest.raises(ValueError, match="holds no secret-key: the file was cut or edited") as err:
        load_identity(path)
    assert "public certificate" not in str(err.value)


def test_a_secret_file_copied_into_the_allowed_directory_is_refused(keys) -> None:
    """Its secret key would go wherever the directory goes: the principal is no longer its own."""
    (keys["allowed"] / "decode-0.key").write_text((keys["dir"] / "decode-0.key_secret").read_text())
    with pytest.raises(ValueError, match="decode-0.key' holds a secret-key"):
        load_allowed(keys["allowed"])


@pytest.mark.parametrize("copy", ["decode-0.old.key", "Decode-0.key"])
def test_one_key_under_two_names_is_refused_naming_both_files(keys, copy) -> None:
    """A certificate's stem is its principal: a backup copy under another name made the principal
    whichever name sorted last, so the named consumer was refused ``not_authorised`` (or not, by
    the copy's name)."""
    (keys["allowed"] / copy).write_text((keys["allowed"] / "decode-0.key").read_text())
    with pytest.raises(ValueError, match="hold the same key under 2 names") as err:
        load_allowed(keys["allowed"])
    assert f"/{copy}'" in str(err.value) and "/decode-0.key'" in str(err.value), err.value
    assert "keep only the file named as the peer's principal" in str(err.value)
    (keys["allowed"] / "decode-0.bak.key").write_text((keys["allowed"] / "decode-0.key").read_text())
    with pytest.raises(ValueError, match="hold the same key under 3 names") as err:  # every one named at once
        load_allowed(keys["allowed"])
    assert all(f"/{n}'" in str(err.value) for n in (copy, "decode-0.key", "decode-0.bak.key")), err.value


def test_a_certificate_with_a_key_line_added_beside_its_own_is_refused(keys) -> None:
    """pyzmq's reader keeps the last public-key of a certificate without a word: an appended key
    would take the principal, and the real peer would fail its handshake with no cause named."""
    mallory = load_identity(keys["mallory"]).public.decode()
    cert = keys["allowed"] / "decode-0.key"
    cert.write_text(cert.read_text() + f'    public-key = "{mallory}"\n')
    with pytest.raises(ValueError, match="decode-0.key': 2 public-key lines"):
        load_allowed(keys["allowed"])
    secret = keys["dir"] / "decode-0.key_secret"
    secret.write_text(secret.read_text() + f'    public-key = "{mallory}"\n')
    with pytest.raises(ValueError, match="decode-0.key_secret': 2 public-key lines"):
        load_identity(secret)


@pytest.mark.parametrize("text", ["", "metadata\n", "\x00\x01garbage"])
def test_an_unreadable_allowed_certificate_is_named_with_the_fix(keys, text) -> None:
    (keys["allowed"] / "decode-0.key").write_text(text)
    with pytest.raises(ValueError, match="cannot read .*decode-0.key.*copy it again from the peer"):
        load_allowed(keys["allowed"])


def test_a_key_pair_mixed_from_two_certificates_is_refused(tmp_path, keys) -> None:
    other = (tmp_path / "other" / "mallory.key_secret").read_text()
    import re

    foreign_public = re.search(r'public-key = "([^"]*)"', other).group(1)
    path = _edit_key(keys["dir"] / "decode-0.key_secret", "public-key", foreign_public)
    with pytest.raises(ValueError, match="not the secret-key's own"):
        load_identity(path)


def test_two_certificates_naming_one_endpoint_with_different_keys_are_refused(tmp_path, keys) -> None:
    """After a key rotation, the stale certificate left beside the new one: a dial could prove
    only one of the two keys, and which one would depend on the files' names."""
    generate_keys(tmp_path / "rotated", "prefill-0-new", ("127.0.0.1",))
    (keys["allowed"] / "prefill-0-new.key").write_text((tmp_path / "rotated" / "prefill-0-new.key").read_text())
    with pytest.raises(ValueError, match="prefill-0-new.key.*prefill-0.key.*both name endpoint 127.0.0.1"):
        load_allowed(keys["allowed"])
    (keys["allowed"] / "prefill-0.key").unlink()
    assert load_allowed(keys["allowed"]).server_key_for("127.0.0.1", 5710) is not None


@pytest.mark.parametrize("endpoint", ["http://10.0.0.5:5710", "10.0.0.5 5710", "10.0.0.5:99999", "prefill 0", "10.0.0.5:５７１０"])
def test_an_endpoint_no_dial_could_name_is_refused_when_the_keys_are_made(tmp_path, endpoint) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        generate_keys(tmp_path, "prefill-0", (endpoint,))
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("endpoint", ["10.0.0.5", "10.0.0.5:5710", "[::1]:5710", "fe80::1", "prefill-0.pd.svc:5710"])
def test_an_endpoint_a_dial_can_name_is_kept(tmp_path, endpoint) -> None:
    pub, _ = generate_keys(tmp_path, "prefill-0", (endpoint,))
    assert load_allowed(tmp_path).endpoints


def test_a_single_quoted_endpoint_is_read_as_zpl_says(tmp_path) -> None:
    """ZPL quotes a value with '...' as well as "..." (pyzmq reads both for the keys)."""
    pub, _ = generate_keys(tmp_path, "prefill-0", ("127.0.0.1:5710",))
    pub.write_text(pub.read_text().replace('endpoints = "127.0.0.1:5710"', "endpoints = '127.0.0.1:5710'"))
    assert load_allowed(tmp_path).server_key_for("127.0.0.1", 5710) is not None


def test_cli_keys_generate(tmp_path) -> None:
    r = CliRunner().invoke(cli, ["keys", "generate", str(tmp_path), "prefill-1", "--endpoint", "10.0.0.5:5710"])
    assert r.exit_code == 0, r.output
    allowed = load_allowed(tmp_path)
    assert allowed.principal(allowed.server_key_for("10.0.0.5", 5710)) == "prefill-1"
    assert (tmp_path / "prefill-1.key_secret").stat().st_mode & 0o077 == 0
    r = CliRunner().invoke(cli, ["keys", "generate", str(tmp_path), "x", "--endpoint", "h:99999"])
    assert r.exit_code != 0 and "port" in r.output
    afile = tmp_path / "afile"
    afile.write_text("")
    r = CliRunner().invoke(cli, ["keys", "generate", str(afile / "sub"), "x"])  # a directory that cannot be made
    assert r.exit_code == 2 and "cannot write the keys into" in r.output and r.exception is None or \
        isinstance(r.exception, SystemExit), r.output


def test_frame_of_exactly_the_cap_passes_under_curve(keys) -> None:
    # the caps count payload bytes; CURVE's framing overhead must not push a legal frame over
    cap = 64 * 1024
    kw = dict(FAST, max_frame_bytes=cap, max_accepted_frame_bytes=cap)
    p = ZmqTransport(**kw, curve=curve_settings(str(keys["dir"] / "prefill-0.key_secret"), str(keys["allowed"])))
    c = ZmqTransport(**kw, curve=curve_settings(str(keys["dir"] / "decode-0.key_secret"), str(keys["allowed"])))
    try:
        peer = c.connect(p.address)
        c.send(peer, [b"x" * cap])
        [(in_peer, frames)] = recv_until(p, 1)
        assert len(frames[0]) == cap
        p.send(in_peer, [b"y" * cap])
        [(_, back)] = recv_until(c, 1)
        assert len(back[0]) == cap
    finally:
        p.close()
        c.close()


def _dial_and_wait_for(c: ZmqTransport, address: str, event: int) -> None:
    c.send(c.connect(address), [b"hello"])
    end = time.monotonic() + 10.0
    while (address, event) not in c.handshake_failures and time.monotonic() < end:
        c.wait(0.05)
        c.recv()
        c.events()


KEY_PROBLEM = ("the CURVE handshake failed: the producer does not accept our key (is our public certificate in its "
               "auth_allowed_keys_dir?), the certificate in our auth_allowed_keys_dir that names this endpoint is not "
               "the producer's key, or it does not run auth='curve'")


def test_a_producer_refusing_our_key_is_named_in_the_log(pair, keys, caplog) -> None:
    """Found by a review: the consumer only saw peer_disconnected. libzmq tells the dialler why
    (HANDSHAKE_FAILED_AUTH); the operator gets one warning naming the producer and the fix."""
    p, _ = pair
    c = ZmqTransport(**FAST, curve=curve_settings(str(keys["mallory"]), str(keys["allowed"])))
    try:
        with caplog.at_level("WARNING", logger="kvtier.transport"):
            _dial_and_wait_for(c, p.address, int(zmq.EVENT_HANDSHAKE_FAILED_AUTH))
            for _ in range(10):  # libzmq keeps retrying: still one line
                c.wait(0.05)
                c.events()
        lines = [r.getMessage() for r in caplog.records if "handshake" in r.getMessage()]
        assert lines == [f"kvtier: handshake with producer {p.address} failed: {KEY_PROBLEM}"], lines
    finally:
        c.close()


def test_an_impostor_producer_is_named_in_the_log(keys, caplog) -> None:
    impostor = ZmqTransport(**FAST, curve=curve_settings(str(keys["mallory"]), str(keys["allowed"])))
    c = ZmqTransport(**FAST, curve=curve_settings(str(keys["dir"] / "decode-0.key_secret"), str(keys["allowed"])))
    try:
        with caplog.at_level("WARNING", logger="kvtier.transport"):
            _dial_and_wait_for(c, impostor.address, int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL))
        assert (impostor.address, int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)) in c.handshake_failures
        # libzmq says AUTH or NO_DETAIL for a key problem depending on timing: the operator reads
        # one text naming both places to check, whichever it said
        lines = [r.getMessage() for r in caplog.records if "handshake" in r.getMessage()]
        assert lines == [f"kvtier: handshake with producer {impostor.address} failed: {KEY_PROBLEM}"], lines
    finally:
        impostor.close()
        c.close()
