"""Bytes arriving on a dialled connection before a whole message has (decision T22).

libzmq hands a message over only once all of it arrived, and the blocks of a fetch travel as
messages of up to 8 MiB on the same connection as everything else the producer sends — its
pongs queue behind them.  On a link slower than one such message per ``peer_timeout_s`` the
consumer would hear nothing whole for longer than that while the producer's bytes stream in.
The kernel counts what each TCP connection received (``TCP_INFO``'s ``tcpi_bytes_received``,
Linux 4.1+): a count that grew since it was last read proves the peer's side of the connection
alive as well as a whole message would.  Only a count that grew by :data:`MIN_BYTES` or more
counts: a ping or pong is a whole message, heard as such, and the bytes of one must not pass for
the producer still sending data (decision L19 reads that as work it may answer behind); nor do
thousands of them a second — the shell drops a peer's growth in a window in which a whole ping
or pong came from it (``kvtier.shell.inbound``, decision L20).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["MIN_BYTES", "progressed", "tcp_bytes_received"]

MIN_BYTES = 4096
"""Growth of a connection's received count that reports its peer: a message still crossing a link
of 128 kbit/s or more grows it by that much between two reads (0.25 s apart)."""

_TCP_INFO_BYTES = 256
_RECEIVED_AT = 128  # struct tcp_info's tcpi_bytes_received (linux/tcp.h, since 4.1)


def tcp_bytes_received(fd: int) -> int | None:
    """Bytes the kernel has received on TCP socket ``fd`` in all; None for an fd that is closed or
    not a TCP socket (a number libzmq closed may have been reused)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        s = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    try:
        with s:
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    except OSError:
        return None
    if len(info) < _RECEIVED_AT + 8:
        return None
    return int.from_bytes(info[_RECEIVED_AT:_RECEIVED_AT + 8], "little")


def progressed(fds: Mapping[str, int], seen: dict[str, int]) -> list[str]:
    """The peers of ``fds`` (peer -> its connection's fd) whose connection received at least
    :data:`MIN_BYTES` since ``seen`` (peer -> the count last read; updated, and pruned to ``fds``)."""
    out = []
    for peer in [p for p in seen if p not in fds]:
        del seen[peer]
    for peer, fd in fds.items():
        n = tcp_bytes_received(fd)
        if n is None:
            continue
        last = seen.get(peer)
        seen[peer] = n
        if last is not None and n - last >= MIN_BYTES:
            out.append(peer)
    return out
