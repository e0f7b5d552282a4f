"""The spec's properties, checked one core input at a time, for the Hypothesis machine of
``stateful_model.py`` (:func:`stateful_model.make_machine`).

:class:`Checked` stands between the fake network's shell and each core: every ``handle`` and
``fire`` passes through :class:`PropertyChecks`, which compares the records before and after that
one call (``exactly_once_job_result``, ``no_bytes_for_tombstoned``, ``no_write_after_terminal``,
``late_fetch_one_rtt``, ``tombstoned_never_reparks``, ``lives_never_mix``,
``no_block_returned_while_referenced``, ``no_success_without_receipt``, and ``honest.py``'s
``partial_keys_verified``, ``result_after_last_write``, ``instance_fate_proven``,
``plane_fault_ends_session``) and checks
``input_before_deadline`` on every firing.  The machine's invariants and its liveness teardown
stay with the machine.
"""

from __future__ import annotations

from typing import Any

from honest import check_instance_fate, check_instances_held, check_load_result, check_sends

from kvtier.lifecycle import TierCore
from kvtier.lifecycle import inputs as ix
from kvtier.lifecycle.effects import JobDone, LandBlocks, Send, SendBlocks
from kvtier.wire import messages as wm
from tools import snapshot
from tools.coreview import CoreView

P_LIVE = {"parked", "awaiting", "serving", "delivering", "confirmed", "cancelling", "quarantined"}
P_RETAINED = {"done", "tombstoned"}
P_LATE = {"done", "tombstoned", "cancelling", "quarantined"}
C_LIVE = {"queued", "in_flight", "aborting", "cancelling", "revoking", "settling"}


class Checked:
    """The core as the fake network's shell sees it: every ``handle`` and ``fire`` passes through
    to the real core and is checked by the state machine against the spec's properties (one
    input — or one firing of the deadlines — at a time, whatever the driver batches); everything
    else (the read API) is the core's own.  ``unread``: during a tick, the messages that waited
    unread in the socket, with their arrival times, until the driver applies them."""

    def __init__(self, machine: Any, name: str, core: TierCore) -> None:
        self.machine = machine
        self.name = name
        self.core = core
        self.unread: list[tuple[float, ix.Received]] = []

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.core, attr)

    def handle(self, inp: Any, now: float) -> list[Any]:
        for i, (_, waiting) in enumerate(self.unread):
            if waiting == inp:
                del self.unread[i]
                break
        return self.machine._checked(self.name, lambda: self.core.handle(inp, now), inp)

    def fire(self, now: float) -> list[Any]:
        if self.unread:  # input_before_deadline: nothing due after the first unread arrival fires first
            first = min(t for t, _ in self.unread)
            early = [f"{d.machine} {d.key} ({d.timer}, due {d.when})" for d in CoreView(self.core).deadlines()
                     if first < d.when <= now]
            if early:
                self.machine.broken = True
                raise AssertionError(
                    f"input_before_deadline: {self.name}'s tick at {now} fires {early} before applying "
                    f"{[w.msg.TYPE for _, w in self.unread]} that arrived at {[t for t, _ in self.unread]}")
        return self.machine._checked(self.name, lambda: self.core.fire(now), None)


class PropertyChecks:
    """What the machine checks on every core call.  The machine supplies ``ids`` (the
    kv_request_ids it drives), the cores (``p``, ``cores``), the fake network (``net``) and the
    bookkeeping the checks read and keep (``outstanding``, ``store_of``, ``retired``, ``fetched_ids``,
    ``receipts``, ``gone``, ``disordered``, ``shut``, ``stores``, ``p_finished``, ``loaded``,
    ``broken``)."""

    ids: tuple[str, ...]

    def _pstates(self) -> dict[str, str]:
        return {k: self.p.producer_state(k).value for k in self.ids}

    def _cstates(self, c: str) -> dict[str, tuple[str, int]]:
        out = {}
        for k in self.ids:
            v = self.cores[c].consumer(k)
            out[k] = (v.state.value, v.round) if v is not None else ("absent", -1)
        return out

    def _loads(self, c: str) -> dict[int, tuple[str, int]]:
        """Live load jobs of consumer ``c``: job -> (id, round)."""
        return {v.job_id: (v.kv_request_id, v.round) for v in self.cores[c].records().consumers if v.job_id is not None}

    def _checked(self, who: str, apply: Any, inp: Any) -> list[Any]:
        try:
            return self._check(who, apply, inp)
        except AssertionError:
            self.broken = True  # Hypothesis still runs teardown: do not bury this failure under another
            raise

    def _check(self, who: str, apply: Any, inp: Any) -> list[Any]:
        """Run ``apply()`` (one ``handle(inp)`` of ``who``'s core, or, ``inp`` None, one
        ``fire``) and check every property that one core call can break."""
        msg = inp.msg if isinstance(inp, ix.Received) else None
        src = inp.peer if msg is not None else None
        pre_p = self._pstates()
        pre_c = self._cstates(who) if who != "p" else {}
        pre_loads = self._loads(who) if who != "p" else {}
        pre_bind = {v.kv_request_id: (v.peer, v.round) for v in self.p.records().producers}
        fetch = msg if who == "p" and isinstance(msg, wm.Fetch) else None
        pre_gate = None
        stale = False
        if fetch is not None:
            # a round the session already answered, or below the consumer's watermark: a
            # duplicate or overtaken fetch, dropped unanswered (decision I11)
            low, answered = next((e.rounds for e in snapshot.export(self.p).sessions if e.peer == src), (0, ()))
            stale = fetch.round < low or fetch.round in answered
            sess = CoreView(self.p).session(src)
            pre_gate = sess is not None and sess.state.value == "ready" and sess.gen == fetch.gen
            if fetch.keys and pre_p[fetch.kv_request_id] in ("absent", "parked"):
                self.fetched_ids.add(fetch.kv_request_id)
        effects = apply()
        check_sends(self.net, who, effects)
        if who != "p":
            check_instances_held(who, CoreView(self.cores[who]).suspect_instances())
        post_p = self._pstates()
        if who == "p" and (isinstance(msg, wm.Receipt) or (isinstance(msg, wm.AbortFetch) and msg.fetched)):
            k = msg.kv_request_id
            if pre_p[k] != post_p[k]:
                assert pre_bind.get(k) == (src, msg.round), (
                    f"lives_never_mix: {msg.TYPE} of {src} round {msg.round} moved {k} {pre_p[k]} -> "
                    f"{post_p[k]}, but that life was bound to {pre_bind.get(k)}"
                )
            if isinstance(msg, wm.Receipt) and pre_bind.get(k) == (src, msg.round):
                self.receipts.add(k)
        for eff in effects:
            if isinstance(eff, JobDone):
                owner = self.outstanding.pop(eff.job_id, None)
                assert owner == who, f"exactly_once_job_result: {who} reported job {eff.job_id} (ok={eff.ok}, " \
                                     f"{eff.reason}) that {'had its result already' if owner is None else 'is ' + owner + 's'}"
                # a result from GraceEnded on is held until the data plane is closed, which revokes every
                # peer's access (decision I41; the model closes it in the same step)
                self._check_job_result(who, eff, pre_loads,
                                       revoked=isinstance(inp, ix.AccessRevoked) or who in self.closing)
            elif isinstance(eff, SendBlocks):
                k = eff.kv_request_id
                assert pre_p[k] in ("parked", "awaiting") and post_p[k] == "serving", (
                    f"no_bytes_for_tombstoned: blocks of {k} sent on a {pre_p[k]} -> {post_p[k]} step"
                )
            elif isinstance(eff, LandBlocks):
                state, rnd = pre_c.get(eff.kv_request_id, ("absent", -1))
                assert state == "in_flight", f"no_write_after_terminal: {who} landed {eff.kv_request_id} while {state}"
                assert not isinstance(msg, wm.BlockData) or msg.round == rnd, (
                    f"no_write_after_terminal: {who} landed block data of round {msg.round} into the load of "
                    f"round {rnd}")
        if fetch is not None and pre_gate and not stale:
            k = fetch.kv_request_id
            own = pre_bind.get(k) == (src, fetch.round)  # a duplicate of the bound fetch:
            # its terminal answer waits for the data plane's release (no write may land after it)
            if (pre_p[k] in P_LATE or self.retired[k]) and not (own and pre_p[k] in ("cancelling", "quarantined")):
                assert any(
                    isinstance(e, Send) and isinstance(e.msg, wm.TransferDone) and not e.msg.ok
                    and (e.msg.kv_request_id, e.msg.round) == (k, fetch.round)
                    for e in effects
                ), f"late_fetch_one_rtt: fetch for {k} while {pre_p[k]} (retired={self.retired[k]}) not refused at once"
        for k in self.ids:
            before, after = pre_p[k], post_p[k]
            if before == after:
                continue
            if after in ("parked", "awaiting", "serving"):
                assert not self.retired[k], f"tombstoned_never_reparks: {k} went {before} -> {after} after it ended"
            if after in P_RETAINED:
                self.retired[k] = True
            elif before in P_RETAINED and after == "absent":
                self._new_life(k)
            elif before in P_LIVE and after == "absent" and "p" not in self.shut:
                self.retired[k] = True
        return effects

    def _check_job_result(self, who: str, eff: JobDone, pre_loads: dict[int, tuple[str, int]], *,
                          revoked: bool) -> None:
        if who == "p":
            k = self.store_of[eff.job_id]
            assert not any(t.src == "p" and t.kv_request_id == k for t in self.net.transfers), (
                f"no_block_returned_while_referenced: store job {eff.job_id} of {k} reported "
                f"(ok={eff.ok}, {eff.reason}) while the data plane still references its blocks"
            )
            assert not eff.ok or k in self.receipts or k not in self.fetched_ids, (
                f"no_success_without_receipt: store job {eff.job_id} of {k} succeeded without the consumer's receipt"
            )
            return
        check_instance_fate(who, eff)
        load = pre_loads.get(eff.job_id)
        if load is None:  # a new job refused alone: it never fetched
            return
        kid, rnd = load
        check_load_result(self.net, who, eff, kid, rnd, self.load_keys[eff.job_id])
        if eff.ok:
            assert (kid, rnd) not in self.net.corrupt, (
                f"no_success_without_receipt: {who} reported load {kid} round {rnd} ok with a corrupt block"
            )
        elif not revoked and who not in self.disordered:  # a revocation proves no write can land any more
            assert not any(
                (t.src, t.dst, t.kv_request_id, t.round) == ("p", who, kid, rnd) and id(t) not in self.gone
                for t in self.net.transfers
            ), (f"no_write_after_terminal: {who} reported load {kid} round {rnd} failed while the "
                "producer may still write into its slots")

    def _new_life(self, k: str) -> None:
        """The tombstone of ``k`` was pruned: the id may be reused (a brand-new life)."""
        self.retired[k] = False
        self.stores[k] = 0
        self.p_finished[k] = False
        self.receipts.discard(k)
        self.fetched_ids.discard(k)
        self.loaded = {(c, kk) for c, kk in self.loaded if kk != k}
