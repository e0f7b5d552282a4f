"""When a pass progresses a one-sided data plane (decisions N15, C26): before reading the sockets
only while a load of ours is out — a WRITE into our pool and the header that follows it are then
read as input that came before the time that dates ``quiet_since`` — and after reading them in
every pass.  A side with no load out (a producer) reads a fetch one progress call sooner."""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.shell.inbound import Inbound
from kvtier.wire import Decoder


class _Plane:
    def __init__(self, calls: list[str], one_sided: bool) -> None:
        self.calls, self.one_sided = calls, one_sided

    def poll(self) -> list[Any]:
        self.calls.append("plane.poll")
        return []


class _Transport:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def service(self, max_messages: int) -> tuple[list[Any], list[Any], bool]:
        self.calls.append("transport.service")
        return [], [], True


@pytest.mark.parametrize(("one_sided", "receiving", "order"), [
    (True, True, ["plane.poll", "transport.service", "plane.poll"]),
    (True, False, ["transport.service", "plane.poll"]),
    (False, True, ["transport.service", "plane.poll"]),
    (False, False, ["transport.service", "plane.poll"]),
])
def test_a_one_sided_plane_is_progressed_before_the_read_only_while_a_load_is_out(
        one_sided: bool, receiving: bool, order: list[str]) -> None:
    calls: list[str] = []
    inbound = Inbound(transport=_Transport(calls), plane=_Plane(calls, one_sided), decoder=Decoder(block_bytes=64),
                      metrics=None, logs=None, clock=lambda: 5.0, posted={}, work=None)  # type: ignore[arg-type]
    assert inbound.collect(receiving=receiving) == []
    assert calls == order
    assert inbound.quiet_since == 5.0  # every socket was emptied: the pass dates quiet_since


def test_the_reports_a_pass_turns_into_inputs_are_counted() -> None:
    """The loop's eager window follows the plane's activity (decision C27): every report counts,
    in a pass's early and late progress alike."""
    from kvtier.dataplane import Revoked

    class _Reporting(_Plane):
        def __init__(self) -> None:
            super().__init__([], True)
            self.queue: list[list[Any]] = [[Revoked("a")], [Revoked("b"), Revoked("c")]]

        def poll(self) -> list[Any]:
            return self.queue.pop(0) if self.queue else []

    inbound = Inbound(transport=_Transport([]), plane=_Reporting(), decoder=Decoder(block_bytes=64),
                      metrics=None, logs=None, clock=lambda: 5.0, posted={}, work=None)  # type: ignore[arg-type]
    assert inbound.reported == 0
    assert [i.peer for i in inbound.collect(receiving=True)] == ["a", "b", "c"]
    assert inbound.reported == 3
    assert inbound.collect(receiving=True) == [] and inbound.reported == 3
