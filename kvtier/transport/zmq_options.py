"""ZmqTransport's arguments in libzmq's terms: ``host:port`` addresses and ``tcp://`` endpoints,
the vetted resolution of a dialled name (decided before libzmq sees it), and the checks of the
numeric arguments (seconds to milliseconds, counts).
"""

from __future__ import annotations

import ipaddress
import math
import socket
from typing import Any

from kvtier.transport import DialNotAllowed, NameNotResolved

__all__ = ["parse_address"]


def parse_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` (or ``"[v6]:port"``) into ``(host, port)``.

    Raises:
        ValueError: not ``host:port`` with a port in 1..65535.
    """
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"address must be 'host:port', got {address!r}")
    host, _, port_s = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not (port_s.isascii() and port_s.isdigit()) or not 1 <= int(port_s) <= 65535:
        raise ValueError(f"address must be 'host:port' with port 1..65535, got {address!r}")
    return host, int(port_s)


def tcp_endpoint(host: str, port: int | str) -> str:
    """``tcp://host:port``; an IPv6 host in brackets, whether or not it came with them."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def seconds_to_ms(name: str, value: float, *, maximum_ms: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or value * 1000 > maximum_ms:
        raise ValueError(f"{name} must be in [0, {maximum_ms / 1000}] s, got {value}")
    return int(round(value * 1000))


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` is an IPv4/IPv6 address (dialling it needs no name lookup)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def resolve_vetted(host: str, port: int, vet: Any) -> tuple[str, ...]:
    """``(host,)`` if it is an IP literal; else every address it resolves to (the resolver's
    order, each once), once ``vet`` accepted every one (see :meth:`ZmqTransport.connect`)."""
    if is_ip_literal(host):
        return (host,) if (why := vet(host, port, host)) is None else (_refuse(why),)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise NameNotResolved(f"cannot resolve {host}: {exc}") from None
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    for ip in addresses:
        why = vet(host, port, ip)
        if why is not None:
            _refuse(why)
    if not addresses:
        raise NameNotResolved(f"{host} resolves to no address")
    return addresses


def _refuse(why: str) -> str:
    raise DialNotAllowed(why)
