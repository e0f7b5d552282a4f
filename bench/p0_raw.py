"""P0's raw baselines per phase: a raw pyzmq stream beside the raw NIXL WRITE, and the table that
puts each kvtier plane's phases beside its raw baseline's (docs/benchmarks.md, P0).

The raw pyzmq stream runs in the limits pair (``bench.seed``): the producer's ROUTER sends the
blocks zero-copy from its region in messages of ``MAX_BATCH_BYTES`` (as the zmq plane groups
them), the consumer's DEALER lands each frame with ``recv_into`` into its region, n-1..0 (the one
copy the zmq plane's landing makes), and every block is checked byte-exact after the clock stops.
Times are ``perf_counter`` stamps (CLOCK_MONOTONIC: one clock for both processes of a host).
"""

from __future__ import annotations

import time
from typing import Any

MiB = 1 << 20

#: (row, kvtier hop key or "load_s", raw NIXL WRITE key, raw pyzmq key); None: no such phase
PHASES = (
    ("`submit_load` → the producer's first post", "hop_fetch", None, None),
    ("post → every block released (raw: post → `DONE` / every tracker done)", "hop_write", "load_s", "done_s"),
    ("post → the consumer's first landing starts (raw: notification / first frame landed)",
     "hop_first", "notified_s", "first_s"),
    ("whole hand-off (raw: post → the consumer has every byte)", "load_s", "notified_s", "load_s"),
)


class RawZmq:
    """A mixin of the P0 child (``bench.seed.Side``): ``self.region`` (``max_blocks x ROW``
    uint8), ``self._fill``/``self._exact``, ``self.np``."""

    region: Any
    np: Any
    host: str

    def op_zraw_bind(self) -> str:
        """Producer: bind the raw ROUTER on this side's host; its ``host:port``."""
        import zmq

        self._zctx = zmq.Context()
        self._zsock = self._zctx.socket(zmq.ROUTER)
        self._zsock.setsockopt(zmq.LINGER, 0)
        self._zrid = None
        return f"{self.host}:{self._zsock.bind_to_random_port(f'tcp://{self.host}')}"

    def op_zraw_connect(self, address: str) -> None:
        """Consumer: dial the producer's ROUTER and say hello (it learns our routing id)."""
        import zmq

        self._zctx = zmq.Context()
        self._zsock = self._zctx.socket(zmq.DEALER)
        self._zsock.setsockopt(zmq.LINGER, 0)
        self._zsock.connect(f"tcp://{address}")
        self._zsock.send(b"hello")

    def op_zraw_send(self, kid: str, n: int, per_msg: int, wait_s: float = 60.0) -> dict[str, float]:
        """Producer: send blocks 0..n-1 zero-copy with trackers, ``per_msg`` blocks a message;
        ``posted`` (stamp before the first send) and ``done_s`` (post → every tracker done)."""

        sock = self._zsock
        if self._zrid is None:
            self._zrid = sock.recv_multipart()[0]
        r64 = self.region.view(self.np.uint64)
        for i in range(n):
            self._fill(kid, i, r64[i])
        trackers = []
        t0 = time.perf_counter()
        for first in range(0, n, per_msg):
            frames = [self._zrid, kid.encode(), *(self.region[i] for i in range(first, min(n, first + per_msg)))]
            trackers.append(sock.send_multipart(frames, copy=False, track=True))
        deadline = t0 + wait_s
        for t in trackers:
            t.wait(max(0.0, deadline - time.perf_counter()))
        if not all(t.done for t in trackers):
            raise TimeoutError(f"raw pyzmq send of {n} blocks not released within {wait_s} s")
        return {"posted": t0, "done_s": time.perf_counter() - t0}

    def op_zraw_recv(self, kid: str, n: int, wait_s: float = 60.0) -> dict[str, Any]:
        """Consumer: land every frame with ``recv_into`` into slots n-1..0; stamps of the first
        and the last frame landed, then a byte-exact check of every slot."""
        import zmq

        sock, region = self._zsock, self.region
        if not sock.poll(int(wait_s * 1000)):
            raise TimeoutError(f"no raw pyzmq stream for {kid} within {wait_s} s")
        got = 0
        first = last = 0.0
        while got < n:
            if sock.recv() != kid.encode():
                raise RuntimeError("raw pyzmq: a message of another stream")
            while sock.getsockopt(zmq.RCVMORE):
                sock.recv_into(region[n - 1 - got])
                got += 1
                last = time.perf_counter()
                if got == 1:
                    first = last
        r64 = region.view(self.np.uint64)
        exact = all(self._exact(r64[n - 1 - i], kid, i) for i in range(n))
        return {"first": first, "last": last, "exact": exact}


def raw_zmq(prod: Any, cons: Any, kid: str, n: int, per_msg: int) -> dict[str, float]:
    """One raw pyzmq stream of ``n`` blocks between the limits pair's children."""
    cons.send("zraw_recv", kid=kid, n=n)
    w = prod.call("zraw_send", kid=kid, n=n, per_msg=per_msg)
    got = cons.result()
    if not got["exact"]:
        raise RuntimeError("raw pyzmq: the consumer's bytes differ")
    return {"load_s": got["last"] - w["posted"], "first_s": got["first"] - w["posted"], "done_s": w["done_s"]}


def phase_table(by: dict[tuple[int, str], dict[str, Any]], sizes: list[int], names: dict[str, str]) -> list[str]:
    """Markdown: each kvtier plane's phases beside its raw baseline's, median ms, per size."""
    pairs = [(s, raw, k) for s, raw, k in (("kvtier_nixl", "raw_nixl", 2), ("kvtier_zmq", "raw_zmq", 3))
             if any((m, s) in by for m in sizes) and any((m, raw) in by for m in sizes)]
    if not pairs:
        return []
    lines = ["", "| phase, median ms (kvtier / its raw baseline) | " + " | ".join(
        f"{names[s]} / {names[raw]}, {m} MiB" for s, raw, _ in pairs for m in sizes) + " |",
        "|---|" + "---|" * (len(pairs) * len(sizes))]

    def cell(row: dict[str, Any] | None, key: str | None) -> str:
        if row is None or key is None:
            return "—"
        v = row[key] if key in row else row.get("hops_s", {}).get(key)
        return "—" if v is None else f"{v['median'] * 1e3:.2f}"

    for text, hop, nixl_key, zmq_key in PHASES:
        cells = []
        for s, raw, k in pairs:
            raw_key = nixl_key if k == 2 else zmq_key
            for m in sizes:
                cells.append(f"{cell(by.get((m, s)), hop)} / {cell(by.get((m, raw)), raw_key)}")
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
    return lines
