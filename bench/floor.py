"""The floor of a Python tier's late-fetch refusal (P3): the least any tier written in Python pays
for one fetch refused by its producer, measured between the same two processes as kvtier and the
raw round trip (decision C42).

The floor does only what no such tier can skip: the consumer encodes a real ``fetch`` with
kvtier's wire codec and sends it on a DEALER, then waits in a poller (its sockets and a wake-up
socket, as a tier's loop waits) and decodes the answer; the producer's server thread sleeps in a
poller over its ROUTER and a wake-up socket, decodes the fetch, looks its ``kv_request_id`` up in a
dict of tombstones and answers with an encoded ``transfer_done(reaped)``.  No lifecycle, timers,
sessions, metrics or records: what kvtier adds beyond this is its own cost; what the floor adds
beyond the raw round trip (one frame echoed by a blocking ``recv``) is the cost of being a Python
tier on this host at all.
"""

from __future__ import annotations

import threading
from typing import Any

STOP = b"stop"


class FloorServer:
    """The producer's side: a thread serving refusals on ``tcp://127.0.0.1:<port>``.

    Args:
        ctx: the pyzmq context to make its sockets in.
    """

    def __init__(self, ctx: Any) -> None:
        import zmq

        self._ctx = ctx
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind("tcp://127.0.0.1:*")
        self.port = int(self.router.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2])
        self._wake_addr = f"inproc://kvtier-bench-floor-{id(self)}"
        self._wake = ctx.socket(zmq.PAIR)
        self._wake.bind(self._wake_addr)
        self.tombstones: dict[str, str] = {}
        self._thread = threading.Thread(target=self._serve, name="bench-floor", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import zmq

        from kvtier.wire import codec
        from kvtier.wire.messages import Fetch, TransferDone

        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._wake, zmq.POLLIN)
        router = self.router
        while True:
            ready = dict(poller.poll(250))
            if self._wake in ready:
                return
            while router in ready:
                try:
                    rid, header = router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                msg, _ = codec.decode([header])
                if type(msg) is not Fetch:
                    continue
                reason = self.tombstones.get(msg.kv_request_id, "unknown_request")
                answer = TransferDone(gen=msg.gen, kv_request_id=msg.kv_request_id, round=msg.round, ok=False,
                                      reason=reason)
                router.send_multipart([rid, codec.encode(answer)])

    def close(self) -> None:
        """Stop the thread and close its sockets."""
        import zmq

        poke = self._ctx.socket(zmq.PAIR)
        poke.connect(self._wake_addr)
        poke.send(STOP)
        self._thread.join(5.0)
        poke.close(linger=0)
        self._wake.close(linger=0)
        self.router.close(linger=0)


class FloorClient:
    """The consumer's side: one refused fetch per :meth:`one` call.

    Args:
        ctx: the pyzmq context; port: the :class:`FloorServer`'s port on 127.0.0.1.
    """

    def __init__(self, ctx: Any, port: int) -> None:
        import zmq

        self.dealer = ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(f"tcp://127.0.0.1:{port}")
        self._wake = ctx.socket(zmq.PAIR)
        self._wake.bind(f"inproc://kvtier-bench-floor-client-{id(self)}")
        self._poller = zmq.Poller()
        self._poller.register(self.dealer, zmq.POLLIN)
        self._poller.register(self._wake, zmq.POLLIN)
        self.one("warm-up", (b"k",))  # connected, and both sides' paths run once, before anything is timed

    def one(self, kv_request_id: str, keys: tuple[bytes, ...], timeout_s: float = 10.0) -> str:
        """Send one fetch of ``kv_request_id`` (``keys``) and wait for its answer; the answer's reason.

        Raises:
            TimeoutError: no answer within ``timeout_s`` seconds."""
        import time

        from kvtier.wire import codec
        from kvtier.wire.messages import Fetch, TransferDone

        self.dealer.send(codec.encode(Fetch(gen=1, kv_request_id=kv_request_id, round=0, keys=list(keys))))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.dealer in dict(self._poller.poll(100)):
                msg, _ = codec.decode([self.dealer.recv()])
                if type(msg) is TransferDone and msg.kv_request_id == kv_request_id:
                    return msg.reason
        raise TimeoutError(f"the floor server did not answer a fetch of {kv_request_id!r} within {timeout_s} s")

    def close(self) -> None:
        self._wake.close(linger=0)
        self.dealer.close(linger=0)
