"""A consumer we control message by message: a raw zmq DEALER that speaks kvtier's wire protocol.

Runtime tests need consumers a real manager never is: one that stops reading after 8 of 200
blocks and is then ``kill -9``'d, one that never sends a receipt, one that replays a straggler
``abort_fetch`` of an earlier life or says ``hello`` twice.  :class:`RawConsumer` is that
consumer, in-process (no manager, no core: every message is sent because the test says so), and
``python -m kvtier.testing.raw_peer`` runs one in a child process of its own (:class:`RawChild`)
so that it can be killed with SIGKILL at a chosen point.

Only :mod:`zmq` and :mod:`kvtier.wire` are imported (no torch): a child starts in well under a
second.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import zmq

from kvtier.wire import messages as wm
from kvtier.wire.codec import Decoder, WireLimits, encode_frames

__all__ = ["RawChild", "RawConsumer", "RawError"]


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


def _say(**kw: Any) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def _consume(args: argparse.Namespace) -> None:
    """Fetch ``--keys`` keys, read block_data until at least ``--stop-after`` blocks arrived,
    report, then stop reading for good (the parent kills us).  No receipt is ever sent."""
    keys = [f"{args.kv}/blk{i}".encode() for i in range(args.keys)]
    c = RawConsumer(args.address, block_bytes=args.block_bytes, digest=args.digest, rcvhwm=args.rcvhwm)
    c.hello()
    _say(event="ready", pid=os.getpid())
    c.fetch(args.kv, args.round, keys)
    got = 0
    while got < args.stop_after:
        m = c.recv(timeout_s=30.0)
        if m is None:
            _say(event="timeout", blocks=got)
            break
        msg, payloads = m
        if isinstance(msg, wm.BlockData):
            got += len(payloads)
        elif isinstance(msg, wm.TransferDone):
            _say(event="transfer_done", ok=msg.ok, reason=msg.reason, blocks=got)
            break
    _say(event="stopped", blocks=got)
    while True:  # hold the connection open, read nothing more
        time.sleep(3600)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvtier.testing.raw_peer")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("consume", help="fetch, read some blocks, then stop reading (no receipt)")
    c.add_argument("--address", required=True)
    c.add_argument("--kv", required=True)
    c.add_argument("--keys", type=int, required=True)
    c.add_argument("--round", type=int, default=1)
    c.add_argument("--block-bytes", type=int, required=True)
    c.add_argument("--stop-after", type=int, required=True, help="blocks to receive before we stop reading")
    c.add_argument("--digest", default="xxh3_64")
    c.add_argument("--rcvhwm", type=int, default=1)
    args = ap.parse_args(argv)
    if args.cmd == "consume":
        _consume(args)


class RawChild:
    """``python -m kvtier.testing.raw_peer consume ...`` in a child process; :meth:`event` reads
    its JSON progress lines; :meth:`kill` is ``kill -9``.  Use as a context manager: the child is
    always killed and reaped on exit."""

    def __init__(self, *args: str) -> None:
        import queue
        import threading

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvtier.testing.raw_peer", *args],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()

        def _read(out: Any = self.proc.stdout) -> None:
            for line in out:
                self._lines.put(line)
            self._lines.put(None)

        threading.Thread(target=_read, name="raw-child-stdout", daemon=True).start()

    def event(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The child's next progress line, parsed.

        Raises:
            RawError: nothing within ``timeout_s``, or the child exited.
        """
        import queue

        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RawError(f"raw consumer said nothing within {timeout_s} s") from None
        if line is None:
            raise RawError(f"raw consumer exited (code {self.proc.poll()})")
        return json.loads(line)

    def poll_event(self) -> dict[str, Any] | None:
        """The child's next progress line if one is waiting, else ``None`` (never blocks)."""
        import queue

        try:
            line = self._lines.get_nowait()
        except queue.Empty:
            return None
        if line is None:
            self._lines.put(None)  # stay at end of stream
            raise RawError(f"raw consumer exited (code {self.proc.poll()})")
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10.0)

    def __enter__(self) -> RawChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


if __name__ == "__main__":
    main()
