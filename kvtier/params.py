"""Untrusted request parameters: ``kv_transfer_params`` → a validated :class:`TransferParams`.

``kv_transfer_params`` arrive with each request, and in many deployments a client can write them
(vllm#47843: a client that names ``remote_host``/``remote_port`` makes the engine dial anywhere).
So everything here runs *before* any connection, allocation or state change, checks type and
bounds of every field it reads, never indexes a mapping that may lack the key, and raises only
``ValueError`` (:class:`PeerNotAllowed` is one) with a message that names the field and quotes
at most 80 characters of the offending value.

Shapes accepted (unknown keys are ignored, so other connectors' params pass through):

* producer (prefill) leg: ``{"remote_decoder": {"kv_request_id": K, "consumer": NAME?, "life": L?}}``;
  ``consumer`` (optional) is the authenticated principal that alone may fetch ``K``.
* consumer (decode) leg:
  ``{"remote_prefiller": {"kv_request_id": K, "remote_host": H, "remote_port": P, "life": L?}}``.
* ``life`` (optional, both legs, the same value): an opaque id of this pairing, ≤ 64 characters
  of ``[A-Za-z0-9._:/@+=-]``, minted by whoever hands both engines their params (a PD router's
  request uuid).  With it, a message of an earlier life of a reused ``K`` can never end a later
  one (decision I20); without it, decision I6's limit holds.
* llm-d's names for the same roles: ``decode`` (= ``remote_decoder``) and ``prefill``
  (= ``remote_prefiller``); llm-d-router renamed its sub-dicts to vLLM's
  (llm-d/llm-d-router#2140), older routers still send the short ones.
* symmetric request (vLLM 0.33.0's meaning, decision Y1): ``{"remote_kv_source": {"kv_request_id":
  K, "remote_host": H, "remote_port": P}}`` — probe the peer ``H:P`` for whatever blocks of the
  prompt its engine holds and fetch those (role ``source``).  A request that also names a PD leg
  is that PD leg (``remote_kv_source`` is then ignored, as vLLM's own tier does).

Outbound dials must match the ``allowed_peers`` policy (:class:`PeerPolicy`); a request naming
any other endpoint raises :class:`PeerNotAllowed` and opens no socket.  ``"*"`` admits any
endpoint *except* addresses no KV producer lives at and an attacker would love to reach:
link-local (cloud metadata services among them), unspecified, multicast and broadcast addresses,
the cloud metadata addresses outside link-local, and loopback when this manager listens beyond
loopback (a remote client must not make the engine talk to itself).  Such an address is dialled
only if an entry names it explicitly (decision S11).  A hostname admitted by ``"*"`` alone is
resolved at dial time and the address it resolves to is checked the same way (and dialled, so a
second resolution cannot differ).
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

import attrs

from kvtier.errors import KvTierError
from kvtier.wire.messages import check_kv_request_id, check_life

__all__ = [
    "METADATA_ADDRESSES",
    "METADATA_NAMES",
    "never_by_wildcard",
    "Exposure",
    "exposures",
    "PRODUCER_KEYS",
    "CONSUMER_KEYS",
    "SOURCE_KEYS",
    "TransferParams",
    "PeerPolicy",
    "PeerNotAllowed",
    "parse_params",
    "parse_host",
    "parse_port",
    "clip",
    "HOST_CACHE",
    "in_use_message",
    "unread_role",
]

PRODUCER_KEYS: Final = ("remote_decoder", "decode")
"""Keys whose sub-dict makes a request the producer leg (the remote party is a decoder)."""
CONSUMER_KEYS: Final = ("remote_prefiller", "prefill")
"""Keys whose sub-dict makes a request the consumer leg (the remote party parked the KV)."""
SOURCE_KEYS: Final = ("remote_kv_source",)
"""Keys whose sub-dict makes a request symmetric (the remote party may hold blocks in its tiers)."""

_LABEL_RE: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_PRINCIPAL_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}|[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
_PORT_RE: Final = re.compile(r"[0-9]{1,5}")


def clip(value: object, n: int = 80) -> str:
    """``repr(value)`` cut to ``n`` characters: attacker strings never flood a log line."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not escape
        text = f"<{type(value).__name__}>"
    return text if len(text) <= n else text[: n - 3] + "..."


class PeerNotAllowed(KvTierError, ValueError):
    """A request names a producer endpoint outside ``allowed_peers``. Nothing was dialled."""

    def __init__(self, message: str, endpoint: str, kv_request_id: str = "", why: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.kv_request_id = kv_request_id
        self.why = why or "not in allowed_peers"
        """Which rule refused it (a fixed text: never the request's own strings)."""


@attrs.frozen(slots=True)
class TransferParams:
    """A request's validated role in a KV hand-off.

    Attributes:
        role: ``"producer"``, ``"consumer"``, ``"source"`` (symmetric: probe the peer) or
            ``"local"`` (no hand-off).
        kv_request_id: the id the two legs share (``None`` for local); for ``source``, the id of
            this consumer's probe/fetch exchange with the peer.
        peer: consumer and source: the peer's ``host:port`` (``[v6]:port`` for IPv6), else None.
        consumer: producer leg: the principal allowed to fetch the id, if the request names one.
        life: the pairing's life id (``""`` when the params name none).
    """

    role: str
    kv_request_id: str | None = None
    peer: str | None = None
    consumer: str | None = None
    life: str = ""


LOCAL: Final = TransferParams("local")


def parse_host(value: object, field: str) -> str:
    """A hostname (RFC 1123 labels, ≤ 253 chars) or an IPv4/IPv6 literal (brackets allowed),
    normalised: lower-case, IPs in canonical form, no brackets.

    Raises:
        ValueError: anything else (the message names ``field``).
    """
    if isinstance(value, str) and 0 < len(value) <= 255:
        host = _normal_host(value)
        if host is not None:
            return host
    raise ValueError(f"{field} must be a hostname or IP address, got {clip(value)}")


#: Hosts and verdicts remembered (each cache): a consumer names its few producers again and again.
HOST_CACHE: Final = 4096


@functools.lru_cache(maxsize=HOST_CACHE)
def _normal_host(value: str) -> str | None:
    """:func:`parse_host`'s normal form of ``value``, or None; remembered: ``ipaddress`` parses
    an address in microseconds, and every consumer request on the engine's thread names one."""
    text = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    name = text.rstrip(".").lower()
    if 0 < len(name) <= 253 and all(_LABEL_RE.fullmatch(label) for label in name.split(".")):
        return name
    return None


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An ``allowed_peers`` CIDR entry; one with host bits set is refused with the network it
    would have meant, since an entry that matches other than what it says is a mistake."""
    try:
        return ipaddress.ip_network(entry, strict=True)
    except ValueError:
        pass
    try:
        net = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        raise ValueError(f"allowed_peers entry {clip(entry)} is not a valid CIDR network") from None
    raise ValueError(f"allowed_peers entry {entry!r} has host bits set: write {str(net)!r} for the network, or "
                     f"{entry.partition('/')[0]!r} alone for that one host")


def _listed_host(host: str, entry: str) -> str:
    """An ``allowed_peers`` host; dotted digits that are no IPv4 address (an octet above 255, a
    missing one) are refused: no resolver returns such a name, so the entry could never match."""
    if host and all(c.isdigit() or c == "." for c in host):
        try:
            ipaddress.IPv4Address(host.rstrip("."))
        except ValueError:
            raise ValueError(f"allowed_peers entry {entry!r} is not a valid IPv4 address (four numbers "
                             "0-255 without leading zeros, e.g. 10.0.0.5)") from None
    return parse_host(host, f"allowed_peers entry {entry!r}")


def parse_port(value: object, field: str) -> int:
    """A TCP port 1..65535 given as an int or a decimal string (``5710`` or ``"5710"``; whitespace
    around the digits is ignored, as ``int()`` ignores it).

    Raises:
        ValueError: bool, float, other types, or out of range (the message names ``field``).
    """
    if isinstance(value, str) and _PORT_RE.fullmatch(value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError(f"{field} must be a port 1..65535 (int or decimal string), got {clip(value)}")
    return value


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: Addresses outside link-local that clouds serve instance metadata (and credentials) on.
METADATA_ADDRESSES: Final = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200"))
#: Hostnames of metadata services (refused under ``"*"`` before anything is resolved).
METADATA_NAMES: Final = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
                                   "instance-data.ec2.internal", "metadata.azure.com"})


#: NAT64's well-known prefix (RFC 6052): an address in it reaches the IPv4 address in its last 32 bits.
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches through a translator or tunnel that embeds it:
    IPv4-mapped, NAT64's well-known prefix, 6to4 and Teredo's server (None: none)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    return ip.teredo[0] if ip.teredo is not None else None


def never_by_wildcard(ip: Any, *, listens_beyond_loopback: bool) -> str | None:
    """Why ``"*"`` does not admit IP address ``ip`` (None: it does).  An IPv6 address that embeds
    an IPv4 one a translator or tunnel would reach (:func:`_embedded_ipv4`) is judged as that one
    too: ``64:ff9b::a9fe:a9fe`` is the metadata service behind a NAT64 gateway."""
    if isinstance(ip, ipaddress.IPv6Address) and (v4 := _embedded_ipv4(ip)) is not None:
        if ip.ipv4_mapped is None:  # translated or tunnelled: another host reaches it, its loopback too
            why = "a loopback address" if v4.is_loopback else never_by_wildcard(v4, listens_beyond_loopback=False)
            if why is not None:
                return f"{why} (embedded in an IPv6 address)"
        ip = v4
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast or (isinstance(ip, ipaddress.IPv4Address) and ip == ipaddress.IPv4Address("255.255.255.255")):
        return "a multicast or broadcast address"
    if ip.is_loopback and listens_beyond_loopback:
        return "loopback, while this manager listens beyond loopback"
    return None


@attrs.frozen(slots=True)
class PeerPolicy:
    """Which producer endpoints a consumer may dial (config ``allowed_peers``).

    Entries: ``"*"`` (any, with the exceptions of :func:`never_by_wildcard`), ``"host:port"``,
    ``"host"`` (any port), or a CIDR network (``"10.0.0.0/8"``, any port; matches IP-literal
    hosts only). Listed hostnames match by name, case insensitively, and are not resolved (S4);
    a hostname admitted only by ``"*"`` is checked again at dial time on what it resolves to
    (:meth:`vet_resolved`).
    """

    any: bool = False
    endpoints: frozenset[tuple[str, int]] = frozenset()
    hosts: frozenset[str] = frozenset()
    networks: tuple[Any, ...] = ()
    beyond_loopback: bool = False
    """This manager listens beyond loopback: ``"*"`` does not admit loopback then."""
    _verdicts: dict[tuple[str, int], str | None] = attrs.field(factory=dict, init=False, eq=False, repr=False)
    """:meth:`why_not` by endpoint, at most :data:`HOST_CACHE`: a verdict depends only on the
    endpoint and this frozen policy (a name ``"*"`` admits is vetted at dial time, uncached)."""

    @property
    def open(self) -> bool:
        """``"*"`` is among the entries."""
        return self.any

    def open_warning(self) -> str | None:
        """The SECURITY line a manager logs at start when ``"*"`` is among the entries, else None."""
        if not self.any:
            return None
        return ("kvtier: SECURITY: allowed_peers is open ('*'): a request's kv_transfer_params may make this engine "
                "dial any producer address (link-local, metadata, multicast and unspecified addresses"
                f"{', and loopback,' if self.beyond_loopback else ''} excepted). List your prefill endpoints or "
                "networks in allowed_peers (docs/security.md).")

    @classmethod
    def from_entries(cls, entries: Iterable[str], *, listen_host: str | None = None) -> PeerPolicy:
        """``listen_host``: the manager's own ``host`` (whether it listens beyond loopback).
        Raises ValueError naming the first bad entry."""
        any_ = False
        endpoints, hosts, networks = set(), set(), []
        for entry in entries:
            if not isinstance(entry, str) or not entry.strip():
                raise ValueError(f"allowed_peers entry {clip(entry)} is not a non-empty string")
            e = entry.strip()
            if e == "*":
                any_ = True
            elif "://" in e:  # a URL: the scheme is no part of an address
                raise ValueError(f"allowed_peers entry {clip(entry)} is a URL: write the host, host:port or "
                                 "CIDR network alone, without a scheme (e.g. 10.0.0.5:5710)")
            elif "/" in e:
                networks.append(_network(e))
            elif e.startswith("[") and "]:" in e or (e.count(":") == 1):
                host, _, port = e.rpartition(":")
                endpoints.add((_listed_host(host, e), parse_port(port, f"allowed_peers entry {e!r}")))
            else:
                hosts.add(_listed_host(e, e))
        return cls(any_, frozenset(endpoints), frozenset(hosts), tuple(networks), _beyond_loopback(listen_host))

    def listed(self, host: str, port: int) -> bool:
        """An entry other than ``"*"`` names the (normalised) ``host``:``port``."""
        if (host, port) in self.endpoints or host in self.hosts:
            return True
        if self.networks:
            try:
                ip = ipaddress.ip_address(host)
            except ValueError:
                return False
            return any(ip in net for net in self.networks)
        return False

    def allows(self, host: str, port: int) -> bool:
        """Whether a dial to the (normalised) ``host``:``port`` is allowed."""
        return self.why_not(host, port) is None

    def why_not(self, host: str, port: int) -> str | None:
        """None if a dial to ``host``:``port`` is allowed, else why not."""
        verdicts = self._verdicts
        try:
            return verdicts[host, port]
        except KeyError:
            why = self._why_not(host, port)
        if len(verdicts) >= HOST_CACHE:
            verdicts.clear()
        verdicts[host, port] = why
        return why

    def _why_not(self, host: str, port: int) -> str | None:
        if self.listed(host, port):
            return None
        if not self.any:
            return "allowed_peers does not list it; entries match the address as written, never resolved"
        if host in METADATA_NAMES:
            return "allowed_peers '*' does not admit a metadata service's name; list it explicitly"
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return None  # a name: checked on what it resolves to, at dial time
        why = never_by_wildcard(ip, listens_beyond_loopback=self.beyond_loopback)
        return None if why is None else f"allowed_peers '*' does not admit {why}; list it explicitly"

    def vet_resolved(self, host: str, port: int, ip: str) -> str | None:
        """At dial time: ``host`` (a name ``"*"`` admitted) resolved to ``ip``; None if that may
        be dialled, else why not.  A listed name is never vetted (decision S4)."""
        if not self.any or self.listed(host, port):
            return None
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return f"{host} resolved to {ip!r}, not an address"
        why = never_by_wildcard(addr, listens_beyond_loopback=self.beyond_loopback)
        return None if why is None else f"{host} resolves to {ip}, {why}, which allowed_peers '*' does not admit"


def _beyond_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host != "localhost"


ANY_PEER: Final = PeerPolicy(any=True)


class Exposure(NamedTuple):
    """One SECURITY warning a manager logs at start: ``kind`` says where (``listen``: its
    transport, ``serve``: the symmetric path, ``dial``: its ``allowed_peers``), ``line`` is the log
    line, ``short`` what ``kvtier check-config`` says of it."""

    kind: str
    short: str
    line: str


def exposures(*, host: str, auth: str, serve_external: bool, policy: PeerPolicy) -> list[Exposure]:
    """Every SECURITY warning a manager with these settings logs at start, in that order — the
    one list the manager's start and ``kvtier check-config`` both read (decision S17)."""
    out = []
    if auth == "none" and _beyond_loopback(host):
        out.append(Exposure("listen", f"auth none on {host} (anyone who can reach the port can fetch parked blocks)",
                            f"kvtier: SECURITY: listening on {host} with auth='none': anyone who can reach this port "
                            "can fetch, abort or probe parked KV blocks (users' prompts). Set auth='curve' "
                            "(docs/security.md)."))
        if serve_external:
            out.append(Exposure("serve", "serve_external on with auth none (anyone who can reach the port can "
                                "learn which prompts were served and read their KV blocks)",
                                f"kvtier: SECURITY: serve_external is on with auth='none' on {host}: anyone who can "
                                "reach this port can learn which prompts this engine served and read their KV "
                                "blocks. Set auth='curve' and serve_allowed_principals (docs/security.md)."))
    if (line := policy.open_warning()) is not None:
        out.append(Exposure("dial", "allowed_peers is open ('*': a request may make it dial any address)", line))
    return out


def _sub(params: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    found = [(k, params[k]) for k in keys if params.get(k) is not None]
    if len(found) > 1:
        raise ValueError(f"kv_transfer_params names the same role twice: {', '.join(k for k, _ in found)}")
    return found[0] if found else None


def _value(exc: Exception, value: object) -> str:
    """``": <value>"`` for an error, unless the checker's message quotes the value already (it
    cuts a long one where it likes: the quote's first characters tell)."""
    if isinstance(value, str) and repr(value)[:24] in str(exc):
        return ""
    return f": {clip(value)}"


def _kv_request_id(sub: Mapping[str, Any], field: str) -> str:
    kid = sub.get("kv_request_id")
    if kid is None:
        raise ValueError(f"{field}.kv_request_id is missing: the {field} entry must name the request's "
                         "kv_request_id (a string both engines use for this hand-off)")
    try:
        check_kv_request_id(kid)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field}.kv_request_id is invalid ({exc}){_value(exc, kid)}") from None
    return kid  # type: ignore[return-value]


def _life(sub: Mapping[str, Any], field: str) -> str:
    life = sub.get("life")
    if life is None:
        return ""
    try:
        check_life(life)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field}.life is invalid ({exc}){_value(exc, life)}") from None
    return life  # type: ignore[return-value]


def parse_params(params: object, policy: PeerPolicy = ANY_PEER) -> TransferParams:
    """Validate one request's ``kv_transfer_params`` (see the module docstring).

    Args:
        params: the request's ``kv_transfer_params`` (``None``: a local request).
        policy: the ``allowed_peers`` policy outbound dials must match.

    Returns:
        The request's :class:`TransferParams`.

    Raises:
        PeerNotAllowed: a consumer leg names a producer outside ``policy``.
        ValueError: anything malformed; the message names the field.
    """
    if params is None:
        return LOCAL
    if not isinstance(params, Mapping):
        raise ValueError(f"kv_transfer_params must be a mapping, got {type(params).__name__}")
    src = _sub(params, CONSUMER_KEYS)
    dst = _sub(params, PRODUCER_KEYS)
    if src is not None and dst is not None:
        raise ValueError(
            f"kv_transfer_params has both {src[0]} and {dst[0]}; a request is either the producer or the consumer leg"
        )
    role = "consumer"
    if src is None and dst is None:
        src = _sub(params, SOURCE_KEYS)
        role = "source"
    if src is not None:
        key, sub = src
        if not isinstance(sub, Mapping):
            raise ValueError(f"{key} must be a mapping, got {clip(sub)}")
        kid = _kv_request_id(sub, key)
        host = parse_host(sub.get("remote_host"), f"{key}.remote_host")
        port = parse_port(sub.get("remote_port"), f"{key}.remote_port")
        peer = _endpoint(host, port)
        life = _life(sub, key) if role == "consumer" else ""  # malformed before refused: every field checked
        why = policy.why_not(host, port)
        if why is not None:
            raise PeerNotAllowed(f"{key} names {clip(peer)}: {why}", peer, kid, why)
        return TransferParams(role, kid, peer, life=life)
    if dst is not None:
        key, sub = dst
        if not isinstance(sub, Mapping):
            raise ValueError(f"{key} must be a mapping, got {clip(sub)}")
        kid = _kv_request_id(sub, key)
        consumer = sub.get("consumer")
        if consumer is not None and not (isinstance(consumer, str) and _PRINCIPAL_RE.fullmatch(consumer)):
            raise ValueError(f"{key}.consumer must be a principal name or a z85 public key, got {clip(consumer)}")
        return TransferParams("producer", kid, None, consumer, _life(sub, key))
    return LOCAL


_ROLE_KEYS: Final = (*PRODUCER_KEYS, *CONSUMER_KEYS, *SOURCE_KEYS)


def unread_role(params: object) -> str | None:
    """For a request :func:`parse_params` found local: a line naming a top-level key of
    ``params`` that holds a mapping with a ``kv_request_id`` — a role entry under a name kvtier
    does not read (a typo turns a hand-off into a local request) — with the nearest role key, or
    None.  Other connectors' keys (flags, ids, lists) never match: they hold no such mapping."""
    if not isinstance(params, Mapping):
        return None
    for key, sub in params.items():
        if key not in _ROLE_KEYS and isinstance(sub, Mapping) and "kv_request_id" in sub:
            near = difflib.get_close_matches(str(key), _ROLE_KEYS, n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            return (f"kv_transfer_params key {clip(key, 40)} holds a kv_request_id but is not a role kvtier "
                    f"reads{hint}; the roles are {', '.join(_ROLE_KEYS)}. The request runs locally: nothing "
                    "is parked or fetched for it")
    return None


def in_use_message(req_id: str, kv_request_id: str, requests: Mapping[str, TransferParams]) -> str:
    """Why a consumer request may not take ``kv_request_id`` yet, and the fix (``requests``: the
    manager's unfinished requests by id)."""
    head = f"request {clip(req_id)}: kv_request_id {clip(kv_request_id)} is still in use on this consumer"
    earlier = next((r for r, i in requests.items()
                    if i.kv_request_id == kv_request_id and i.role in ("consumer", "source")), None)
    if earlier is not None:
        return (f"{head} by request {clip(earlier)}, which has not finished: an id takes one request at a time, "
                f"so call on_request_finished for {clip(earlier)} first (once its load's result is in), or give "
                "this request a kv_request_id of its own")
    return (f"{head}: an earlier request's load of it is still winding down (its abort is in flight); submit "
            "again once that load's result is in, or give this request a kv_request_id of its own")
