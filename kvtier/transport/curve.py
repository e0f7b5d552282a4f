"""CURVE keys for kvtier: who we are, whom we let in, and which key a producer must hold.

Everything cryptographic is libzmq's CURVE (CurveZMQ: Curve25519 key exchange, per-connection
encryption and authentication) and pyzmq's :mod:`zmq.auth` (certificate files, the ZAP
handler). This module only loads key files and maps keys to names.

Files (the format ``zmq.auth.create_certificates`` writes, see ``kvtier keys generate``):

- ``auth_secret_key_file``: this instance's ``NAME.key_secret``. Its public key is our identity;
  its secret key never leaves the process.
- ``auth_allowed_keys_dir``: public certificates (``*.key``) of the peers allowed to talk to us.
  The file name's stem is the peer's **principal** (``decode-0.key`` → ``"decode-0"``): the name
  the producer attributes every message of that connection to (ZAP ``User-Id``).

How a consumer learns its producer's key before it dials: a certificate in the allowed directory
whose metadata ``endpoints`` lists the dialled ``host:port`` (or just ``host``: any port)::

    metadata
        endpoints = "10.0.0.5:5710, prefill-0.svc:5710"

``kvtier keys generate DIR NAME --endpoint HOST[:PORT]`` writes it. A dial to an address no
allowed certificate names is refused before any socket exists (the consumer would otherwise have
to trust whichever key the network hands it).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from pathlib import Path
from typing import Any, Final

import attrs
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from kvtier.transport.zmq_options import is_ip_literal

__all__ = [
    "CurveIdentity",
    "AllowedKeys",
    "CurveSettings",
    "PrincipalAuthenticator",
    "load_identity",
    "load_allowed",
    "generate_keys",
    "curve_settings",
]

log = logging.getLogger("kvtier.transport.curve")

ZAP_DOMAIN: Final = "kvtier"
"""The ZAP domain our ROUTER asks the authenticator about (certificates are configured for it)."""

_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@attrs.frozen(repr=False)
class CurveIdentity:
    """This instance's key pair (32-byte z85-encoded keys, 40 ASCII bytes each)."""

    name: str
    public: bytes
    secret: bytes

    def __repr__(self) -> str:  # never print the secret key
        return f"CurveIdentity(name={self.name!r}, public={self.public.decode()!r})"


@attrs.frozen
class AllowedKeys:
    """The public keys we accept, by principal name, and the endpoints each one serves.

    Attributes:
        names: z85 public key → principal (certificate file stem).
        endpoints: ``(host, port or None)`` → z85 public key of the producer serving there.
    """

    names: dict[bytes, str]
    endpoints: dict[tuple[str, int | None], bytes]

    def principal(self, public: bytes) -> str:
        """The principal for a z85 public key (the key itself if no certificate names it)."""
        return self.names.get(public) or public.decode("ascii", "replace")

    def server_key_for(self, host: str, port: int) -> bytes | None:
        """The producer key for a dial to ``host:port``: an exact ``host:port`` entry wins over a
        ``host`` entry. ``None`` when no allowed certificate names the address."""
        host = _norm_host(host)
        return self.endpoints.get((host, port)) or self.endpoints.get((host, None))


@attrs.frozen
class CurveSettings:
    """What a :class:`~kvtier.transport.ZmqTransport` needs to run CURVE."""

    identity: CurveIdentity
    allowed: AllowedKeys
    allowed_dir: str


def _norm_host(host: str) -> str:
    host = host.strip().strip("[]").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _metadata(path: Path) -> dict[str, str]:
    """The ``metadata`` section of a ZPL certificate file (``key = value`` lines)."""
    out: dict[str, str] = {}
    section = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            section = line.strip()
            continue
        if section == "metadata" and "=" in line:
            k, _, v = line.partition("=")
            v = v.strip()
            out[k.strip()] = v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v  # ZPL: '' or ""
    return out


_HOSTNAME_RE = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                          r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


def _parse_endpoint(text: str) -> tuple[str, int | None]:
    """``(host, port or None)`` of a certificate's endpoint ``HOST`` or ``HOST:PORT`` (an IP
    address, ``[v6]`` with a port, or a DNS name): what a dial's ``remote_host``/``remote_port``
    are matched against, so anything a dial can never name (a scheme, a space) is refused."""
    text = text.strip()
    host, port = text, None
    if text.count(":") == 1 or (text.startswith("[") and "]:" in text):
        host, _, p = text.rpartition(":")
        if not (p.isascii() and p.isdigit()) or not 1 <= int(p) <= 65535:
            raise ValueError(f"bad port in endpoint {text!r}")
        port = int(p)
    norm = _norm_host(host)
    if not (_HOSTNAME_RE.fullmatch(norm) or is_ip_literal(norm)):
        raise ValueError(f"bad endpoint {text!r}: write HOST or HOST:PORT, HOST an IP address or a DNS name "
                         "(no scheme, no spaces; [v6]:PORT for an IPv6 address with a port)")
    return norm, port



def _check_path(path: Path, key: str, *, directory: bool, fix: str) -> None:
    """Raise a ValueError naming ``key``, the path and ``fix`` when ``path`` is missing or of the
    wrong kind (a file where a directory is wanted, or the reverse)."""
    if not path.exists():
        raise ValueError(f"{key} {str(path)!r} does not exist: {fix}")
    if path.is_dir() != directory:
        raise ValueError(f"{key} {str(path)!r} is not a {'directory' if directory else 'file'}: {fix}")


def _check_key(path: Path, what: str, field: str, key: bytes) -> None:
    """Raise a ValueError naming ``what`` and ``path`` unless ``key`` (the certificate's ``field``)
    is a CURVE key: 40 z85 characters encoding 32 bytes (libzmq would take the socket option
    apart only at bind or dial time, with an error that names neither)."""
    try:
        ok = len(key) == 40 and len(z85.decode(key)) == 32
    except Exception:  # noqa: BLE001 - not z85: a length, a character z85 lacks, a group over 32 bits
        ok = False
    if not ok:
        raise ValueError(f"{what} {str(path)!r}: its {field} is not a CURVE key (40 z85 characters); the file was "
                         "cut or edited: write a fresh one with `kvtier keys generate`, or copy it again")


def _one_line_each(path: Path, what: str, fields: tuple[str, ...]) -> None:
    """Raise a ValueError naming ``what``, ``path`` and the field when a key field is written more
    than once: pyzmq's reader keeps one of them without a word (the last public-key, the first
    secret-key), so an edit that added a key would bind the principal to a key nobody chose."""
    try:
        lines = [ln.split("=", 1)[0].strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return  # the certificate's own reader names it
    for field in fields:
        if (n := lines.count(field)) > 1:
            raise ValueError(f"{what} {str(path)!r}: {n} {field} lines (a key added by hand beside the old one?): a "
                             "certificate holds one key pair; write a fresh one with `kvtier keys generate`, or copy "
                             "the peer's again")


def load_identity(secret_file: str | os.PathLike[str]) -> CurveIdentity:
    """Read this instance's key pair from a ``*.key_secret`` certificate.

    Raises:
        ValueError: the file is missing, unreadable or has no secret key (the message names it).
    """
    path = Path(secret_file)
    _check_path(path, "auth_secret_key_file", directory=False,
                fix="point it at this instance's NAME.key_secret, or create one with `kvtier keys generate DIR NAME`")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"auth_secret_key_file {str(path)!r}: cannot read a certificate ({exc}); it must be "
                         "a NAME.key_secret written by `kvtier keys generate`") from None
    _one_line_each(path, "auth_secret_key_file", ("public-key", "secret-key"))
    if not secret and path.name.endswith(".key_secret"):
        raise ValueError(f"auth_secret_key_file {str(path)!r} holds no secret-key: the file was cut or edited; "
                         "write a fresh one with `kvtier keys generate`, or copy it again")
    if not secret:
        raise ValueError(f"auth_secret_key_file {str(path)!r} holds no secret-key: it is a public certificate; "
                         "use NAME.key_secret (NAME.key goes into the peers' auth_allowed_keys_dir)")
    _check_key(path, "auth_secret_key_file", "public-key", public)
    _check_key(path, "auth_secret_key_file", "secret-key", secret)
    if zmq.curve_public(secret) != public:
        raise ValueError(f"auth_secret_key_file {str(path)!r}: its public-key is not the secret-key's own (the "
                         "file mixes two key pairs): write a fresh one with `kvtier keys generate`")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:  # as ssh says of a private key: others who read it can pose as this instance
        log.warning("kvtier: auth_secret_key_file %r is readable or writable by other users (mode %o): anyone "
                    "who reads it can pose as this instance; `chmod 600 %s`", str(path), mode, path)
    # NAME of NAME.key_secret, as peers know it (a NAME.key's stem): a name may hold dots
    return CurveIdentity(path.name.removesuffix(".key_secret") if path.name.endswith(".key_secret") else path.stem,
                         public, secret)


def load_allowed(directory: str | os.PathLike[str]) -> AllowedKeys:
    """Read every public certificate (``*.key``) of ``directory``.

    Raises:
        ValueError: not a directory, no certificate in it, a certificate that cannot be read, two
            certificates naming one endpoint with different keys, or one key under two names
            (decision S13).
    """
    d = Path(directory)
    _check_path(d, "auth_allowed_keys_dir", directory=True,
                fix="point it at a directory holding every allowed peer's public certificate (NAME.key from "
                    "`kvtier keys generate`)")
    names: dict[bytes, str] = {}
    files: dict[bytes, list[Path]] = {}
    endpoints: dict[tuple[str, int | None], bytes] = {}
    named_by: dict[tuple[str, int | None], Path] = {}
    for path in sorted(d.glob("*.key")):
        try:
            public, secret = zmq.auth.load_certificate(path)
            meta = _metadata(path)
            eps = [_parse_endpoint(e) for e in meta.get("endpoints", "").split(",") if e.strip()]
        except (OSError, ValueError) as exc:
            raise ValueError(f"auth_allowed_keys_dir: cannot read {str(path)!r}: {exc}; it must be a peer's public "
                             "NAME.key written by `kvtier keys generate`: copy it again from the peer") from None
        _one_line_each(path, "auth_allowed_keys_dir: certificate", ("public-key", "secret-key"))
        _check_key(path, "auth_allowed_keys_dir: certificate", "public-key", public)
        if secret:  # a secret key handed out with the public one: whoever reads this directory owns the principal
            raise ValueError(f"auth_allowed_keys_dir: {str(path)!r} holds a secret-key (a NAME.key_secret copied as "
                             "NAME.key?): copy the peer's public NAME.key instead, and replace the key pair whose "
                             "secret was copied (`kvtier keys generate`)")
        names[public] = path.stem
        files.setdefault(public, []).append(path)
        for ep in eps:
            if endpoints.get(ep, public) != public:  # a dial there could prove only one of them
                shown = f"{ep[0]}:{ep[1]}" if ep[1] is not None else ep[0]
                raise ValueError(f"auth_allowed_keys_dir: {str(named_by[ep])!r} and {str(path)!r} both name endpoint "
                                 f"{shown} with different keys (a key rotated with the old certificate left "
                                 "behind?): keep only the certificate of the producer serving there now")
            endpoints[ep], named_by[ep] = public, path
    for paths in files.values():  # its principal would be whichever name sorts last (S13)
        if len(paths) > 1:
            shown = ", ".join(repr(str(p)) for p in paths[:-1]) + f" and {str(paths[-1])!r}"
            raise ValueError(f"auth_allowed_keys_dir: {shown} hold the same key under {len(paths)} names (a backup or "
                             "renamed copy?): a key is one peer's principal, named by its file's stem; keep only the "
                             "file named as the peer's principal")
    for path in sorted(d.glob("*.key_secret")):  # never read; but this directory is the one copied to peers
        log.warning("kvtier: auth_allowed_keys_dir holds a secret key, %r: kvtier does not read it, but whoever "
                    "gets a copy of this directory can pose as its instance; keep NAME.key_secret elsewhere "
                    "(`kvtier keys generate KEYS_DIR NAME`, then copy NAME.key here)", str(path))
    if not names:
        raise ValueError(f"auth_allowed_keys_dir {str(d)!r} holds no public certificate (*.key): copy every "
                         "allowed peer's NAME.key (from `kvtier keys generate`) into it")
    return AllowedKeys(names, endpoints)


def generate_keys(directory: str | os.PathLike[str], name: str, endpoints: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Write ``NAME.key`` (public, give it to peers) and ``NAME.key_secret`` (keep it) into
    ``directory``, with ``endpoints`` in the public certificate's metadata.

    Returns:
        ``(public_file, secret_file)``.

    Raises:
        ValueError: a bad name or endpoint, or the files exist already (never overwritten).
    """
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"key name {name!r} must be 1..128 chars of [A-Za-z0-9._-], starting alphanumeric")
    for e in endpoints:
        _parse_endpoint(e)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    pub, sec = d / f"{name}.key", d / f"{name}.key_secret"
    for p in (pub, sec):
        if p.exists():
            raise ValueError(f"{str(p)!r} exists already; refusing to overwrite a key")
    pub_s, sec_s = zmq.auth.create_certificates(d, name)
    os.chmod(sec_s, 0o600)
    for path, header in ((Path(pub_s), _PUBLIC_HEADER), (Path(sec_s), _SECRET_HEADER)):
        # pyzmq's header says to keep public certificates in ~/.curve; kvtier reads them from
        # auth_allowed_keys_dir, so the file says that instead (ZPL comments: '#' lines)
        body = path.read_text(encoding="utf-8")
        body = body[body.index("\nmetadata\n") + 1:]
        if endpoints and path == Path(pub_s):
            # pyzmq writes metadata into the secret file only; peers read it from the public one.
            line = '    endpoints = "' + ", ".join(e.strip() for e in endpoints) + '"'
            body = body.replace("metadata\n", f"metadata\n{line}\n", 1)
        path.write_text(header.format(name=name) + "\n" + body, encoding="utf-8")
    return Path(pub_s), Path(sec_s)


_PUBLIC_HEADER = """\
#   kvtier CURVE public certificate of {name} (written by `kvtier keys generate`).
#   Copy this file, unchanged, into the auth_allowed_keys_dir of every peer that talks to {name}:
#   its name ({name}.key) makes "{name}" the principal those peers know it by. A producer's
#   certificate lists the endpoints it serves, which tells consumers the key to expect there.
"""
_SECRET_HEADER = """\
#   kvtier CURVE secret certificate of {name} (written by `kvtier keys generate`): this
#   instance's auth_secret_key_file. Keep it on this host, readable by kvtier only (mode 0600);
#   never copy it into an auth_allowed_keys_dir or to another host.
"""


def curve_settings(secret_file: str, allowed_dir: str) -> CurveSettings:
    """Load both key files (config ``auth_secret_key_file`` / ``auth_allowed_keys_dir``).

    Raises:
        ValueError: either cannot be read (the message names the config key and the path).
    """
    loaded: list[Any] = []
    for load, arg in ((load_identity, secret_file), (load_allowed, allowed_dir)):  # both named at once
        try:
            loaded.append(load(arg))
        except ValueError as exc:
            loaded.append(exc)
    bad = [str(x) for x in loaded if isinstance(x, ValueError)]
    if bad:
        raise ValueError("; and ".join(bad))
    return CurveSettings(loaded[0], loaded[1], str(allowed_dir))


class PrincipalAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP handler, admitting the keys :func:`load_allowed` read and reporting each one's
    certificate name as the connection's ``User-Id``."""

    def __init__(self, context: zmq.Context, allowed: AllowedKeys) -> None:
        super().__init__(context, log=logging.getLogger("kvtier.transport.zap"))
        # not "_allowed": pyzmq's Authenticator uses that name for its IP allow-list
        self._kv_allowed = allowed

    def start(self) -> None:
        super().start()
        # the keys kvtier read, not the directory read again by pyzmq's own reader: that one skips
        # names starting with '.', so a `.decode-1.key` passed start-up and failed every handshake
        self.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """Whether the z85 public ``key`` is one of the allowed certificates' (pyzmq's credentials
        provider protocol; called on the ZAP thread, over a dict nothing changes after start)."""
        return key in self._kv_allowed.names

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self._kv_allowed.principal(z85.encode(client_public_key))

    def stop(self) -> None:
        """Stop the ZAP thread; never hangs, even if the thread died (its pipe has no reader)."""
        thread = getattr(self, "thread", None)
        if thread is not None and thread.is_alive():
            super().stop()
        elif self.pipe is not None:
            self.pipe.close(linger=0)
            self.pipe = None
