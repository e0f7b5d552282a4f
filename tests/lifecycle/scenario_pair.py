"""The harness of the bug-scenario regression tests (``test_bug_scenarios*.py``): a producer and a
consumer :class:`~kvtier.lifecycle.TierCore` with one session between them, the scenario
parameters, and helpers that pick effects by kind.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvtier.lifecycle import TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import CoreSettings
from kvtier.lifecycle.effects import (
    RevokeAccess,
    Send,
    SessionEnded,
)
from kvtier.lifecycle.session import HelloInput
from kvtier.wire import messages as wm
from tools import snapshot
from tools.coreview import CoreView

LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="scenarios", hash_seed="", instance="scen")
BASE = {
    "unbound_store_timeout_s": 60.0,  # T_park
    "tombstone_retention_s": 60.0,  # T_tomb
    "load_timeout_s": 30.0,  # T_load
    "fetch_supply_timeout_s": 10.0,  # T_orphan (B15)
    "transfer_timeout_s": 30.0,
    "abort_ack_timeout_s": 5.0,
    "handshake_timeout_s": 5.0,
    "revoke_timeout_s": 1.0,
    "heartbeat_interval_s": 1000.0,  # a live peer is heard; scenarios that kill a peer ping and lower the timeout
    "peer_timeout_s": 1000.0,
}
C = "decode-1"  # the consumer as the producer sees it
P = "prefill:5710"  # the producer as the consumer dials it


def of(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def sent(effects: list[Any], kind: type) -> list[Any]:
    """The wire messages of type ``kind`` the effects send."""
    return [e.msg for e in effects if isinstance(e, Send) and isinstance(e.msg, kind)]


def ended(effects: list[Any]) -> list[tuple[str, str]]:
    """(peer, reason) of every session the effects say ended."""
    return [(e.peer, e.reason) for e in of(effects, SessionEnded)]


def keys(kid: str, n: int, start: int = 0) -> tuple[bytes, ...]:
    return tuple(f"{kid}:{i}".encode() for i in range(start, start + n))


def entry(core: TierCore, kid: str) -> snapshot.ProducerEntry:
    """The producer record of ``kid`` as the core exports it (owner and block map included)."""
    return next(e for e in snapshot.export(core).producer if e.kv_request_id == kid)


class Pair:
    """A producer core and a consumer core with a ready session (handshake at t=0)."""

    def __init__(self, *, park_clock: str = "last_store", tombstone_max: int = 65536, max_pending: int = 1024,
                 options: dict[str, Any] | None = None, **durations: float) -> None:
        """``options``: more :class:`CoreSettings` fields for both cores (``one_sided``,
        ``revoke_bounded``, ``integrity``, ...); ``durations``: timers replacing ``BASE``'s."""
        settings = CoreSettings(
            durations={**BASE, **durations}, park_clock=park_clock, tombstone_max=tombstone_max,
            max_pending_fetches_per_peer=max_pending, **(options or {}),
        )
        self.p = TierCore(settings, LOCAL, gen_base=0)
        self.c = TierCore(settings, msgspec.structs.replace(LOCAL, instance="cons"), gen_base=100)
        self.c.handle(ix.LoadAnnounced("__warmup__", P), 0.0)  # dials
        (hello,) = sent(self.c.handle(ix.ConnectionUp(P), 0.0), wm.Hello)
        self.gen = CoreView(self.c).session_gen(P)
        assert hello.gen == self.gen
        self.p.handle(ix.Received(C, hello), 0.0)
        (ack,) = sent(self.p.handle(ix.PeerAttached(C, self.gen), 0.0), wm.HelloAck)
        self.c.handle(ix.Received(P, ack), 0.0)
        self.c.handle(ix.PeerAttached(P, self.gen), 0.0)
        assert CoreView(self.c).session_ready(P) and CoreView(self.p).session_ready(C)
        self.c.handle(ix.RequestFinished("__warmup__", producer=False), 0.0)
        self.job = 0

    rounds = -1  # the last round fresh_round handed out

    def next_job(self) -> int:
        self.job += 1
        return self.job

    # producer side
    def store(self, kid: str, n: int, t: float, *, owner: str | None = None, start: int = 0,
              blocks: tuple[int, ...] | None = None, consumer: str | None = None,
              life: str = "") -> tuple[int, list[Any]]:
        job = self.next_job()
        b = blocks if blocks is not None else tuple(range(start, start + n))
        return job, self.p.handle(ix.StoreSubmitted(kid, owner or f"req-{kid}", job, keys(kid, n, start), b,
                                                    consumer=consumer, life=life), t)

    def to_p(self, msg: Any, t: float) -> list[Any]:
        """``msg`` from the consumer reaches the producer at ``t``."""
        return self.p.handle(ix.Received(C, msg), t)

    def to_c(self, msg: Any, t: float) -> list[Any]:
        """``msg`` from the producer reaches the consumer at ``t``."""
        return self.c.handle(ix.Received(P, msg), t)

    def fresh_round(self) -> int:
        """A round this session has not used: a consumer numbers its rounds once per manager, and
        a producer drops a round it already answered (decision I11)."""
        self.rounds += 1
        return self.rounds

    def fetch(self, kid: str, ks: tuple[bytes, ...], t: float, rnd: int | None = None) -> list[Any]:
        """A fetch of round ``rnd`` (default: the first fetch round 0, later ones fresh rounds)."""
        rnd = self.fresh_round() if rnd is None else rnd
        return self.to_p(wm.Fetch(gen=self.gen, kv_request_id=kid, round=rnd, keys=list(ks)), t)

    def abort(self, kid: str, t: float, rnd: int | None = None, *, fetched: bool = False) -> list[Any]:
        rnd = self.fresh_round() if rnd is None else rnd
        return self.to_p(wm.AbortFetch(gen=self.gen, kv_request_id=kid, round=rnd, fetched=fetched), t)

    def receipt(self, kid: str, rnd: int, t: float) -> list[Any]:
        return self.to_p(wm.Receipt(gen=self.gen, kv_request_id=kid, round=rnd), t)

    def done(self, kid: str, rnd: int, t: float, *, ok: bool = True, reason: str = "") -> list[Any]:
        """The producer's ``transfer_done`` for round ``rnd`` reaches the consumer."""
        return self.to_c(wm.TransferDone(gen=self.gen, kv_request_id=kid, round=rnd, ok=ok, reason=reason), t)

    def revoked(self, out: list[Any], t: float) -> list[Any]:
        """The consumer's zmq plane confirms the ``RevokeAccess`` in ``out`` at once (it is
        receiver-applied); returns ``out`` plus what the confirmations caused."""
        more: list[Any] = []
        for peer in dict.fromkeys(e.peer for e in of(out, RevokeAccess)):
            more += self.c.handle(ix.AccessRevoked(peer), t)
        return out + more

    def complete(self, kid: str, rnd: int, t: float) -> list[Any]:
        """The data plane released the transfer and the consumer's receipt arrived."""
        out = self.p.handle(ix.TransferReleased(kid, rnd), t)
        return out + self.receipt(kid, rnd, t)

    # consumer side
    def load(self, kid: str, n: int, t: float) -> tuple[int, int, list[Any]]:
        job = self.next_job()
        out = self.c.handle(ix.LoadAnnounced(kid, P), t)
        out += self.c.handle(ix.LoadSubmitted(kid, job, keys(kid, n), tuple(range(100, 100 + n))), t)
        fetches = sent(out, wm.Fetch)
        rnd = fetches[0].round if fetches else -1
        return job, rnd, out

    def forward_fetch(self, out: list[Any], t: float) -> list[Any]:
        """The consumer's fetch in ``out`` reaches the producer."""
        (f,) = sent(out, wm.Fetch)
        return self.to_p(f, t)


def done_fail(effects: list[Any], kid: str) -> wm.TransferDone:
    fails = [m for m in sent(effects, wm.TransferDone) if m.kv_request_id == kid and not m.ok]
    assert len(fails) == 1, effects
    return fails[0]
