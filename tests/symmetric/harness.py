"""Two real :class:`~kvtier.lifecycle.TierCore` instances on the symmetric path, wired by
:class:`~tools.fakenet.FakeNetwork`, with a fake engine on the producer side answering
serve windows through the shell's real :class:`~kvtier.shell.serving.ServeWindows`.

What the harness adds to the fake network: served rounds' transfers (their plane key and a
``block_data`` with the round's real id), the engine (:class:`FakeEngine`, a
:class:`~kvtier.blocksource.BlockSource` that records every context and pin and fails the test on
a second release or a release while a transfer still reads the pin's blocks), and the property
checks each step runs (:meth:`SymNet.check`): the spec's ``pin_released_once``,
``no_hit_without_pin``, ``no_block_after_release``, ``lookup_context_closed_once``,
``partial_keys_verified`` (a failed load's successful keys are exactly its verified prefix),
``result_after_last_write`` (no load result while a landing of it runs: ``land_later``),
``failed_keys_miss`` (a key whose block failed its check is held MISS and loaded at most twice per
request), ``probe_answered_in_bound`` and ``exactly_once_job_result``.  A block the engine holds
corrupt (:attr:`SymNet.corrupt_keys`) fails its digest check in every round that fetches it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from kvtier.blocksource import Pin, Presence
from kvtier.lifecycle import ProbeState, TierCore
from kvtier.lifecycle import effects as fx
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.core import TIMER_KEYS, CoreSettings
from kvtier.lifecycle.serve import transfer_key
from kvtier.lifecycle.session import HelloInput
from kvtier.shell.serving import ServeWindows
from kvtier.wire import messages as wm
from tools.coreview import CoreView
from tools.fakenet import Envelope, FakeNetwork, Transfer

__all__ = ["FakeEngine", "PropertyViolation", "SymNet", "make_core"]

LOCAL = HelloInput(version=wm.PROTOCOL_VERSION, block_bytes=16, layout="test", hash_seed="")
DURATIONS = {k: 10.0 for k in TIMER_KEYS} | {"probe_timeout_s": 1.0, "serve_lookup_timeout_s": 0.25,
                                              "offer_timeout_s": 5.0, "heartbeat_interval_s": 1.0,
                                              "peer_timeout_s": 100.0, "handshake_timeout_s": 2.0}


class PropertyViolation(AssertionError):
    """A spec property did not hold (the message names it)."""


def make_core(name: str, *, serve: bool = True, one_sided: bool = False, integrity: bool = True,
              durations: dict[str, float] | None = None, **settings: Any) -> TierCore:
    d = dict(DURATIONS, **(durations or {}))
    settings_ = CoreSettings(durations=d, one_sided=one_sided, serve_external=serve, integrity=integrity, **settings)
    return TierCore(settings_, msgspec.structs.replace(LOCAL, instance=name))


class FakeEngine:
    """The producer's engine: which blocks it holds (``blocks``: key -> pool block), which are on
    their way in (``pending``: found at the window after the next), its pins and contexts."""

    def __init__(self, net: SymNet, name: str) -> None:
        self.net = net
        self.name = name
        self.blocks: dict[bytes, int] = {}
        self.pending: dict[bytes, int] = {}
        self.pins: dict[int, tuple[int, ...]] = {}
        self.pin_round: dict[int, tuple[str, int]] = {}  # pin -> its round's (plane key, round)
        self.released: dict[int, bool] = {}
        self.opened: set[Any] = set()
        self.closed: set[Any] = set()
        self._next = 100

    def open(self, ctx_id: str) -> str:
        if ctx_id in self.opened:
            raise PropertyViolation(f"lookup_context_closed_once: context {ctx_id} opened twice")
        self.opened.add(ctx_id)
        return ctx_id

    def lookup(self, key: bytes, ctx: Any) -> Presence:
        if key in self.blocks:
            return Presence.FOUND
        if key in self.pending:
            self.blocks[key] = self.pending.pop(key)  # lands before the next window
            return Presence.PENDING
        return Presence.MISSING

    def pin(self, keys: Iterable[bytes], ctx: Any) -> Pin:
        self._next += 1
        blocks = tuple(self.blocks[k] for k in keys)
        self.pins[self._next] = blocks
        _, peer, kid, rnd = str(ctx).rsplit(":", 3)  # the shell's context id names the round
        self.pin_round[self._next] = (transfer_key(peer, kid), int(rnd))
        return Pin(self._next, blocks)

    def release(self, pin_id: int, ok: bool, reason: str | None) -> None:
        # the shell catches a source's exception (an engine bug must not crash the manager), so
        # a violation is recorded here and raised by the harness after the effect
        if pin_id in self.released:
            self.net.violations.append(f"pin_released_once: pin {pin_id} released twice")
        elif pin_id not in self.pins:
            self.net.violations.append(f"pin_released_once: pin {pin_id} was never taken")
        # the pin's own round's transfer must be over (another round pinning the same block holds
        # its own pin: the engine's reference count keeps the block)
        mine = self.pin_round.get(pin_id)
        reading = {b for t in self.net.transfers if t.src == self.name and (t.kv_request_id, t.round) == mine
                   for b in t.blocks}
        if reading & set(self.pins.get(pin_id, ())):
            self.net.violations.append(f"pin_released_once: pin {pin_id} released while the plane reads its blocks")
        self.released[pin_id] = ok

    def close(self, ctx: Any) -> None:
        if ctx in self.closed:
            raise PropertyViolation(f"lookup_context_closed_once: context {ctx} closed twice")
        if ctx not in self.opened:
            raise PropertyViolation(f"lookup_context_closed_once: context {ctx} closed but never opened")
        self.closed.add(ctx)

    def held(self) -> set[int]:
        return {b for p, blocks in self.pins.items() if p not in self.released for b in blocks}


class SymNet(FakeNetwork):
    """A :class:`FakeNetwork` for the symmetric path (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.engines: dict[str, FakeEngine] = {}
        self.windows: dict[str, ServeWindows] = {}
        self.results: dict[int, list[fx.JobDone]] = {}
        self.fetched: dict[tuple[str, str, int], tuple[bytes, ...]] = {}  # (core, id, round) -> the fetch's keys
        self.corrupt_keys: set[bytes] = set()  # blocks whose bytes never match their digest
        self.loads_of: dict[tuple[str, str, bytes], int] = {}  # (core, id, key) -> loads that named it
        self.job_round: dict[int, int] = {}  # load job -> the round its fetch named
        self.count_loads = False  # check that a key is loaded at most twice per request (an engine
        # that never looks up again a key it holds: SymmetricHonest's)
        self.load_jobs: dict[int, tuple[str, str]] = {}  # job -> (core, id)
        self.errors: list[str] = []
        self.violations: list[str] = []

    def attach(self, name: str, core: TierCore) -> None:
        super().attach(name, core)
        self.engines.setdefault(name, FakeEngine(self, name))
        self.windows.setdefault(name, ServeWindows(on_error=lambda: self.errors.append("internal")))

    # -- effects -------------------------------------------------------------------------------
    def performer(self, src: str, seen: list[fx.Effect] | None = None) -> Any:
        """The base network's performer, plus the symmetric path's effects: a served transfer
        becomes one block_data per block (a load can end part-landed), lookups, closes and pin
        releases go to ``src``'s real :class:`ServeWindows`, and the properties are checked as
        each effect is performed (in order, as the shell performs them)."""
        base = super().performer(src, seen)
        core = self.cores.get(src)

        def perform(effects: Iterable[fx.Effect]) -> list[ix.Input]:
            answers: list[ix.Input] = []
            for e in effects:
                t = type(e)
                if t is fx.SendBlocks and e.transfer:
                    if seen is not None:
                        seen.append(e)
                    self._check_served(src, e)
                    self.transfers.append(Transfer(src, e.peer, e.transfer, e.round, e.blocks))
                    for i, b in enumerate(e.blocks):
                        msg = wm.BlockData(gen=e.gen, kv_request_id=e.kv_request_id, round=e.round, first=i, count=1)
                        self._queue(Envelope(src, e.peer, msg, (b,)))
                    continue
                if t is fx.LookUpBlocks:
                    self.windows[src].queue_lookup(e)
                elif t is fx.CloseLookup:
                    self.windows[src].queue_close(e)
                elif t is fx.ReleasePins:
                    self.windows[src].release(e)
                    if self.violations:
                        raise PropertyViolation(self.violations[0])
                elif t is fx.Send and type(e.msg) is wm.Fetch:
                    self.fetched[(src, e.msg.kv_request_id, e.msg.round)] = tuple(e.msg.keys)
                    if core is not None:  # which load job (a round's, or a PD one) fetches this round
                        pd = core.consumer(e.msg.kv_request_id)
                        self.job_round.update((v.job_id, v.round) for v in (*core.round_loads(e.msg.kv_request_id),
                                                                            *((pd,) if pd is not None else ()))
                                              if v.round == e.msg.round and v.job_id is not None)
                    if e.msg.offered and self.count_loads:
                        for k in e.msg.keys:
                            n = self.loads_of[(src, e.msg.kv_request_id, k)] = self.loads_of.get(
                                (src, e.msg.kv_request_id, k), 0) + 1
                            if n > 2:
                                raise PropertyViolation(f"failed_keys_miss: {src} loads {k!r} of {e.msg.kv_request_id} "
                                                        f"for the {n}th time: a failed key must answer MISS")
                elif t is fx.Send and type(e.msg) is wm.ProbeReply and core is not None:
                    self._check_reply(src, core, e)
                elif t is fx.JobDone:
                    self.results.setdefault(e.job_id, []).append(e)
                    if len(self.results[e.job_id]) > 1:
                        raise PropertyViolation(f"exactly_once_job_result: job {e.job_id} reported twice")
                    self._check_load_result(src, e)
                elif t is fx.LandBlocks:
                    keys = self.fetched.get((src, e.kv_request_id, e.round), ())
                    for i in range(e.first, e.first + len(e.slots)):
                        if i < len(keys) and keys[i] in self.corrupt_keys:
                            self.corrupt_blocks.add((e.kv_request_id, e.round, i))
                answers.extend(base((e,)))
            return answers

        return perform

    def _check_served(self, src: str, e: fx.SendBlocks) -> None:
        held = self.engines[src].held()
        if not set(e.blocks) <= held:
            raise PropertyViolation(f"no_block_after_release: {src} sends blocks {e.blocks} not all pinned ({held})")
        if e.transfer != transfer_key(e.peer, e.kv_request_id):
            raise PropertyViolation("a served round's transfer has the wrong plane key")

    def _check_reply(self, src: str, core: TierCore, e: fx.Send) -> None:
        m = e.msg
        if not any(m.hits):
            return
        view = CoreView(core).serve(e.peer, m.kv_request_id, m.round)
        if view is None:
            raise PropertyViolation(f"no_hit_without_pin: a hit for {m.kv_request_id} r{m.round} without a record")
        held = self.engines[src].held()
        for k, hit in zip(m.keys, m.hits):
            if hit and (k not in view.found or view.found[k] not in held or not view.pins):
                raise PropertyViolation(f"no_hit_without_pin: {src} says hit for {k!r} without a held pin")

    def _check_load_result(self, src: str, e: fx.JobDone) -> None:
        """A load job's result: no landing of it still runs; a failed one reports exactly the
        verified prefix of the round it fetched (None when it fetched nothing)."""
        where = self.load_jobs.get(e.job_id)
        if where is None:
            if e.successful_keys:
                raise PropertyViolation(f"partial_keys_verified: job {e.job_id} reports keys but was no load")
            return
        rnd = self.job_round.get(e.job_id)
        keys = self.fetched.get((src, where[1], rnd), ()) if rnd is not None else ()
        running = [x for x in self.landings if (x.src, x.eff.kv_request_id, x.eff.round) == (src, where[1], rnd)]
        if running:
            raise PropertyViolation(f"result_after_last_write: job {e.job_id} reported while {len(running)} landing(s) "
                                    f"of its round {rnd} still run")
        if e.ok:
            return
        verified = self.verified.get((src, where[1], rnd), set()) if rnd is not None else set()
        n = 0
        while n < len(keys) and n in verified:
            n += 1
        checked = src not in self.cores or self.cores[src].settings.integrity  # integrity off: nothing verified
        want = (keys[:n] or None) if checked else None
        if e.successful_keys != want:
            raise PropertyViolation(f"partial_keys_verified: job {e.job_id} reports {e.successful_keys}, its verified "
                                    f"prefix is {want}")
        probe = CoreView(self.cores[src]).probe(where[1]) if src in self.cores else None
        lost = [k for k in keys[n:] if probe is not None and k not in probe.missed]
        if lost:
            raise PropertyViolation(f"failed_keys_miss: job {e.job_id} failed, yet {lost} are not held MISS for the "
                                    "request: the next lookup probes and loads them again")

    def deliver(self, src: str, dst: str, i: int, now: float):
        """As :meth:`FakeNetwork.deliver`, plus ``no_hit_without_pin``'s consumer half: once a
        ``transfer_done(fail)`` withdrew a round's offer (no load of ours fetched it), none of
        the keys it offered answers HIT any more."""
        q = self.queues.get((src, dst)) or []
        env = q[i % len(q)] if q else None
        before = None
        core = self.cores.get(dst)
        m = env.msg if env is not None else None
        if (core is not None and type(m) is wm.TransferDone and not m.ok
                and not any(v.round == m.round for v in core.round_loads(m.kv_request_id))):
            view = CoreView(core).probe(m.kv_request_id)
            if view is not None and view.round == m.round and view.peer == src:
                before = (m.kv_request_id, set(view.offered) - set(view.loading))
        out = super().deliver(src, dst, i, now)
        if before is not None:
            kid, offered = before
            for k in offered:
                if CoreView(core).probe_answer(kid, k).value == "hit":
                    raise PropertyViolation(f"no_hit_without_pin: {dst} answers HIT for {k!r} after the offer was "
                                            f"withdrawn ({m.reason})")
        return out

    # -- the engine's serve window ---------------------------------------------------------------
    def serve_window(self, name: str, now: float) -> list[fx.Effect]:
        core = self.cores[name]
        out: list[fx.Effect] = []

        def apply(inp: ix.Input) -> None:
            out.extend(self.route(name, core.handle(inp, now), now))

        self.windows[name].run(self.engines[name], core.serve_room, apply, core.serve_lookup_budget)
        return out

    def fire(self, name: str, now: float) -> list[fx.Effect]:
        core = self.cores.get(name)
        return self.route(name, core.fire(now), now) if core is not None else []

    def engine_input(self, name: str, inp: ix.Input, now: float) -> list[fx.Effect]:
        if type(inp) is ix.LoadSubmitted:
            self.load_jobs[inp.job_id] = (name, inp.kv_request_id)
        return self.route(name, self.cores[name].handle(inp, now), now)

    # -- checks ----------------------------------------------------------------------------------
    def check(self, consumer: str, kv_request_id: str, keys: Iterable[bytes], now: float) -> None:
        """State checks: RETRY only with the probe timer armed (``probe_answered_in_bound``)."""
        core = self.cores.get(consumer)
        if core is None:
            return
        view = CoreView(core).probe(kv_request_id)
        for k in keys:
            if CoreView(core).probe_answer(kv_request_id, k).value == "retry":
                if view is None or view.state not in (ProbeState.COLLECTING, ProbeState.PROBING):
                    raise PropertyViolation("probe_answered_in_bound: RETRY outside collecting/probing")
                if view.deadline is None or view.deadline > now + 1.0 + 1e-9:
                    raise PropertyViolation(f"probe_answered_in_bound: RETRY with deadline {view.deadline} at {now}")

    def quiet_checks(self, producer: str) -> None:
        """At quiescence: every pin released, every context closed, no serve record left."""
        eng = self.engines[producer]
        if set(eng.pins) != set(eng.released):
            raise PropertyViolation(f"pin_released_once: pins {set(eng.pins) - set(eng.released)} never released")
        if eng.opened != eng.closed:
            raise PropertyViolation(f"lookup_context_closed_once: contexts {eng.opened - eng.closed} never closed")
        core = self.cores.get(producer)
        if core is not None and (CoreView(core).serve_ids() or CoreView(core).pins_held()):
            raise PropertyViolation(f"serve records left at quiescence: {CoreView(core).serve_ids()}")
