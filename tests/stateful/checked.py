"""The proxy between the fake network (the shell) and each core of the PD stateful suite."""

from __future__ import annotations

from typing import Any

from kvtier.lifecycle import TierCore
from kvtier.lifecycle import inputs as ix


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
            early = [f"{d.machine} {d.key} ({d.timer}, due {d.when})" for d in self.core.deadlines()
                     if first < d.when <= now]
            if early:
                self.machine.broken = True
                raise AssertionError(
                    f"input_before_deadline: {self.name}'s tick at {now} fires {early} before applying "
                    f"{[w.msg.TYPE for _, w in self.unread]} that arrived at {[t for t, _ in self.unread]}")
        return self.machine._checked(self.name, lambda: self.core.fire(now), None)
