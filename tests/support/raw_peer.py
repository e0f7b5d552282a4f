"""A consumer we control message by message: a raw zmq DEALER that speaks kvtier's wire protocol.

Runtime tests need consumers a real manager never is: one that stops reading after 8 of 200
blocks and is then ``kill -9``'d, one that never sends a receipt, one that replays a straggler
``abort_fetch`` of an earlier life or says ``hello`` twice.  :class:`RawConsumer` is that
consumer, in-process (no manager, no core: every message is sent because the test says so), and
:func:`raw_child` runs one in a child process of its own so that it can be killed with SIGKILL at
a chosen point.

Only :mod:`zmq` and :mod:`kvtier.wire` are imported (no torch): a child starts in well under a
second.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

import zmq

from kvtier.wire import messages as wm
from kvtier.wire.codec import Decoder, WireLimits, encode_frames
from tools.child import Child

__all__ = ["RawConsumer", "RawConsumerHandler", "RawError", "raw_child"]


class RawError(RuntimeError):
    """The producer did not answer as the test expected (wrong message, or nothing in time)."""


class RawConsumer:
    """A DEALER connected to a producer at ``address`` (``host:port``).

    Args:
        address: the producer's listener.
        block_bytes: our block size (sent in hello; block payloads are checked against it).
        layout / hash_seed / digest: hello fields; they must match the producer's to be accepted.
        rcvhwm: zmq receive high-water mark in messages (small: the socket stops reading soon).

    Messages are sent as the arguments say (generation, round, keys): nothing is checked here.
    """

    def __init__(
        self,
        address: str,
        *,
        block_bytes: int,
        layout: str = "raw",
        hash_seed: str = "",
        digest: str = "xxh3_64",
        rcvhwm: int = 1000,
        instance: str = "raw-consumer",
    ) -> None:
        self.address = address
        self.block_bytes = block_bytes
        self.hello_fields = {"block_bytes": block_bytes, "layout": layout, "hash_seed": hash_seed,
                             "digest": digest, "instance": instance}
        self.gen = secrets.randbits(62)
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.rcvhwm = rcvhwm
        self.sock.connect(f"tcp://{address}")
        self._decoder = Decoder(limits=WireLimits(max_message_bytes=1 << 24), block_bytes=block_bytes)

    # -- send ----------------------------------------------------------------------------------
    def send(self, msg: Any) -> None:
        self.sock.send_multipart(encode_frames(msg))

    def hello(self, *, gen: int | None = None, timeout_s: float = 10.0) -> wm.HelloAck:
        """Send hello (our generation unless ``gen``) and wait for its hello_ack."""
        self.send(wm.Hello(gen=self.gen if gen is None else gen, version=wm.PROTOCOL_VERSION, **self.hello_fields))
        return self.expect(wm.HelloAck, timeout_s=timeout_s)

    def fetch(self, kv_request_id: str, round: int, keys: Sequence[bytes]) -> None:
        self.send(wm.Fetch(gen=self.gen, kv_request_id=kv_request_id, round=round, keys=list(keys)))

    def abort(self, kv_request_id: str, round: int, *, fetched: bool = True) -> None:
        self.send(wm.AbortFetch(gen=self.gen, kv_request_id=kv_request_id, round=round, fetched=fetched))

    def receipt(self, kv_request_id: str, round: int) -> None:
        self.send(wm.Receipt(gen=self.gen, kv_request_id=kv_request_id, round=round))

    def ping(self) -> None:
        self.send(wm.Ping(gen=self.gen, t=time.monotonic()))

    # -- receive -------------------------------------------------------------------------------
    def recv(self, timeout_s: float = 10.0) -> tuple[Any, list[memoryview]] | None:
        """The next message and its payloads, or ``None`` after ``timeout_s``. Pings from the
        producer are answered and skipped (a live consumer would)."""
        end = time.monotonic() + timeout_s
        while True:
            left = end - time.monotonic()
            if left <= 0 or not self.sock.poll(max(1, int(left * 1000))):
                return None
            frames = self.sock.recv_multipart(copy=False)
            msg, payloads = self._decoder.decode([f.buffer for f in frames])
            if isinstance(msg, wm.Ping):
                self.send(wm.Pong(gen=msg.gen, t=msg.t))
                continue
            return msg, payloads

    def expect(self, kind: type, *, timeout_s: float = 10.0, skip: tuple[type, ...] = (wm.Pong,)) -> Any:
        """Wait for the next message of type ``kind`` (skipping ``skip`` types).

        Raises:
            RawError: another type arrived, or nothing within ``timeout_s``.
        """
        end = time.monotonic() + timeout_s
        while True:
            got = self.recv(max(0.0, end - time.monotonic()))
            if got is None:
                raise RawError(f"no {kind.__name__} from {self.address} within {timeout_s} s")
            if isinstance(got[0], skip):
                continue
            if not isinstance(got[0], kind):
                raise RawError(f"expected {kind.__name__}, got {got[0]!r}")
            return got[0]

    def close(self) -> None:
        self.sock.close(linger=0)
        self._ctx.destroy(linger=0)

    def __enter__(self) -> RawConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- a raw consumer in a child process -------------------------------------------------------------


class RawConsumerHandler:
    """The child's side of :func:`raw_child`: a :class:`RawConsumer` that said hello (its
    construction waits for the hello_ack, so the child is ready once the session is up)."""

    def __init__(self, address: str, block_bytes: int, digest: str = "xxh3_64", rcvhwm: int = 1) -> None:
        self.c = RawConsumer(address, block_bytes=block_bytes, digest=digest, rcvhwm=rcvhwm)
        self.c.hello()

    def hello(self) -> dict[str, Any]:
        return {"pid": os.getpid()}

    def op_consume(self, kv: str, keys: int, stop_after: int, round: int = 1) -> dict[str, Any]:
        """Fetch ``keys`` keys (``<kv>/blk<i>``), read block_data until at least ``stop_after``
        blocks arrived (or a transfer_done, or 30 s of silence), then stop reading for good: the
        child holds the connection open and reads nothing more (the parent kills it).  No receipt
        is ever sent.  Returns ``{"blocks": received, "end": "stopped" | "transfer_done" |
        "timeout", "ok", "reason"}`` (the last two from a transfer_done)."""
        self.c.fetch(kv, round, [f"{kv}/blk{i}".encode() for i in range(keys)])
        got, out = 0, {"end": "stopped", "ok": None, "reason": None}
        while got < stop_after:
            m = self.c.recv(timeout_s=30.0)
            if m is None:
                out["end"] = "timeout"
                break
            msg, payloads = m
            if isinstance(msg, wm.BlockData):
                got += len(payloads)
            elif isinstance(msg, wm.TransferDone):
                out.update(end="transfer_done", ok=msg.ok, reason=msg.reason)
                break
        return {"blocks": got, **out}


def raw_child(address: str, *, block_bytes: int, digest: str = "xxh3_64", rcvhwm: int = 1) -> Child:
    """Start a child process running a :class:`RawConsumer` of ``address`` (a
    :class:`tools.child.Child` of :class:`RawConsumerHandler`; it starts in well under a second,
    and is ready once its hello was answered, so poll :meth:`~tools.child.Child.is_ready` while
    the producer runs).  ``child.send("consume", ...)`` then starts :meth:`RawConsumerHandler.op_consume`;
    ``child.kill()`` is ``kill -9``."""
    return Child(__name__, "RawConsumerHandler",
                 {"address": address, "block_bytes": block_bytes, "digest": digest, "rcvhwm": rcvhwm},
                 name="raw-consumer", call_timeout_s=60.0).start()
