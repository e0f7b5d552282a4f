"""Honest results in the PD stateful suite: the rules and checks that make every load result true
and keep a hiccup from condemning a live producer (decisions I21, I23, I25, I26).

The fake network plays a data plane that is as unhelpful as the seam allows:

* a transfer's blocks travel one ``block_data`` each (``split_batches``), so a load can end with
  some blocks landed and others not;
* a landing is answered in a later step (``land_later``, the ``finish_landing`` rule): on zmq a
  landing of more than 1 MiB copies into the slots on the digest pool while the core goes on;
* one block of a live round may land corrupt (``corrupt_block``);
* the producer's plane path to a consumer may break (``plane_fault``): every later transfer of
  that session fails at its post, as a NIXL agent's do after a remote disconnect.

The checks (:func:`check_load_result`, :func:`check_sends`) run on every core input, through the
state machine's ``Checked`` proxy, beside the spec's other properties:

* ``partial_keys_verified``: a failed load's ``successful_keys`` are exactly the verified prefix of
  its fetch — the leading positions whose landing *this network* answered ok — never a key whose
  landing failed, was never answered, or follows a hole (vLLM keeps a prefix);
* ``result_after_last_write``: no load result (success or failure) while a landing of that load is
  still running: the engine may reuse the slots the moment it has the result;
* ``instance_fate_proven``: no load fails ``instance_down`` and no consumer holds a producer instance
  gone, because nothing here proves one gone (it never restarts, no dial is refused) — a
  disconnect or a plane fault is a hiccup;
* ``plane_fault_ends_session``: the producer never starts a transfer on a session whose plane path
  broke (the fault ended it; the next load dials afresh).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from kvtier.lifecycle import Reason
from kvtier.lifecycle.effects import JobDone, SendBlocks


def verified_prefix(verified: set[int], n: int) -> int:
    """How many positions from 0 are in ``verified`` (at most ``n``)."""
    k = 0
    while k < n and k in verified:
        k += 1
    return k


def check_load_result(net: Any, who: str, eff: JobDone, kid: str, rnd: int, keys: tuple[bytes, ...]) -> None:
    """The load result ``eff`` of ``who``'s load of ``kid`` round ``rnd`` (fetching ``keys``)."""
    pending = [x for x in net.landings if (x.src, x.eff.kv_request_id, x.eff.round) == (who, kid, rnd)]
    assert not pending, (
        f"result_after_last_write: {who} reported load {kid} round {rnd} (ok={eff.ok}, {eff.reason}) while "
        f"{len(pending)} of its landings still run: a copy may write into slots the engine reuses")
    if eff.ok:
        return
    n = verified_prefix(net.verified.get((who, kid, rnd), set()), len(keys))
    want = keys[:n] or None
    assert eff.successful_keys == want, (
        f"partial_keys_verified: {who}'s failed load of {kid} round {rnd} reports successful_keys "
        f"{eff.successful_keys}, but its verified prefix is {want}")


def check_instance_fate(who: str, eff: JobDone) -> None:
    """No load fails ``instance_down``: nothing in this suite proves a producer gone."""
    assert eff.reason is not Reason.INSTANCE_DOWN, (
        f"instance_fate_proven: {who}'s load job {eff.job_id} failed instance_down, but no restart or refused "
        "dial proved the producer gone (a disconnect alone proves nothing)")


def check_instances_held(who: str, gone: frozenset[str]) -> None:
    """No consumer holds a producer instance gone: nothing in this suite proves one (a fresh dial
    waits for its own outcome, decision I30, so a wrong proof shows here before any load)."""
    assert not gone, (
        f"instance_fate_proven: {who} holds producer instance(s) {sorted(gone)} gone, but no restart or refused "
        "dial proved it (a disconnect alone proves nothing)")


def check_sends(net: Any, who: str, effects: list[Any]) -> None:
    """A producer step never starts a transfer on a session whose plane path broke."""
    if who != "p":
        return
    for e in effects:
        if isinstance(e, SendBlocks) and net.faulted.get((who, e.peer)) == e.gen:
            raise AssertionError(
                f"plane_fault_ends_session: the producer starts a transfer of {e.kv_request_id} to {e.peer} on session "
                f"generation {e.gen}, whose data-plane path broke: the fault must end the session")


def honest_rules(ids: tuple[str, ...], consumers: tuple[str, ...], chunks: int) -> type:
    """The rules that drive the fake plane's unhelpful behaviour (a mixin of the state machine;
    it reads ``self.net``, ``self.cores``, ``self.clock``, ``self.shut``)."""

    class HonestRules:
        net: Any
        cores: dict[str, Any]
        clock: Any
        shut: set[str]

        @rule(i=st.integers(0, 3))
        def finish_landing(self, i: int) -> None:
            """A landing running on the consumer's digest pool ends (ok, or corrupt)."""
            if self.net.landings:
                self.net.finish_landing(i, self.clock.now())

        @rule(k=st.sampled_from(ids), c=st.sampled_from(consumers), pos=st.integers(0, max(0, chunks - 1)))
        def corrupt_block(self, k: str, c: str, pos: int) -> None:
            """One block of ``c``'s live round of ``k`` lands with a digest mismatch."""
            core = self.cores.get(c)
            v = core.consumer(k) if core is not None else None
            if v is not None and v.round >= 0:
                self.net.corrupt_blocks.add((k, v.round, pos))

        @rule(c=st.sampled_from(consumers))
        def plane_fault(self, c: str) -> None:
            """The producer's data-plane path to ``c`` breaks (a NIXL remote disconnect)."""
            if "p" not in self.shut and "p" in self.net.cores:
                self.net.plane_fault("p", c, self.clock.now())

    return HonestRules
