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


class _Counting(_Transport):
    """A transport whose dials' byte counts grew, one list of peers per read."""

    def __init__(self) -> None:
        super().__init__([])
        self.grown: list[list[str]] = []

    def progress(self) -> list[str]:
        return self.grown.pop(0) if self.grown else []


def test_bytes_counted_across_a_stretch_without_reads_are_no_news_of_the_peer() -> None:
    """The dials' byte counts are read only while a load is out (T22): the first read after a
    stretch without one counts bytes that may have come long before (the last load's), which as
    ``PeerProgress`` lifted an instance a refused dial had just proven gone (I43).  It is a
    baseline; growth seen by later reads of a stretch is reported."""
    now = [0.0]
    t = _Counting()
    inbound = Inbound(transport=t, plane=_Plane([], False), decoder=Decoder(block_bytes=64), metrics=None,
                      logs=None, clock=lambda: now[0], posted={}, work=None)  # type: ignore[arg-type]
    for stretch in range(2):
        t.grown = [["p"], ["p"]]
        now[0] += 1.0
        assert inbound.collect(receiving=True) == [], stretch  # the stretch's first read: a baseline
        now[0] += 1.0
        assert [i.peer for i in inbound.collect(receiving=True)] == ["p"], stretch
        now[0] += 1.0
        assert inbound.collect(receiving=False) == []  # no load out: nothing is read


def test_bytes_that_pings_or_pongs_explain_are_no_progress_of_a_message() -> None:
    """A peer whose connection grew while whole pings or pongs arrived from it is heard through
    them; the growth is not reported as part of a message still crossing (T22), which would read
    as the producer sending work and keep an unanswered abort waiting (L19, L20): a raw producer
    flooding 2,000 pongs a second grew its connection by the 4 KiB a read counts.  A window with
    only data in flight reports it."""
    from kvtier.wire import messages as wm
    from kvtier.wire.codec import encode_frames

    now = [0.0]

    class _Chatty(_Counting):
        def __init__(self) -> None:
            super().__init__()
            self.inbox: list[tuple[str, list[Any]]] = []

        def service(self, max_messages: int) -> tuple[list[Any], list[Any], bool]:
            got, self.inbox = self.inbox, []
            return got, [], True

    t = _Chatty()
    inbound = Inbound(transport=t, plane=_Plane([], False), decoder=Decoder(block_bytes=64), metrics=None,
                      logs=None, clock=lambda: now[0], posted={}, work=None)  # type: ignore[arg-type]
    t.grown = [["p", "q"], ["p", "q"], ["p", "q"], ["p", "q"]]
    now[0] += 1.0
    inbound.collect(receiving=True)  # a baseline
    for msg in (wm.Pong(gen=1, t=0.5), wm.Ping(gen=1, t=0.5)):
        now[0] += 1.0
        t.inbox = [("p", encode_frames(msg))]
        got = inbound.collect(receiving=True)
        assert [type(i).__name__ for i in got if i.peer == "p"] == ["Received"], got  # heard, no progress
        assert [i.peer for i in got if type(i).__name__ == "PeerProgress"] == ["q"], got
    now[0] += 1.0
    assert [i.peer for i in inbound.collect(receiving=True)] == ["p", "q"]  # only bytes: a message crossing
