"""ZmqTransport.progress over real sockets on 127.0.0.1 (decision T22): a dialled peer is reported
once its connection received bytes since the last call — a message still arriving counts — and
not again until more arrive.  Nothing asserts on timing; the limits only stop a hung test."""

from __future__ import annotations

import time

import pytest

from test_zmq_transport import make  # noqa: F401 - the fixture: every transport made is closed

from kvtier.transport.zmq_progress import progressed, tcp_bytes_received

pytestmark = pytest.mark.timeout(60)


def _until(pred, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_a_dial_is_reported_once_per_growth_of_the_bytes_it_received(make) -> None:
    prod, cons = make(), make()
    peer = cons.connect(prod.address)
    cons.send(peer, [b"hello"])
    got: list = []

    def heard() -> bool:
        prod.wait(0.01)
        got.extend(prod.recv())
        return bool(got)

    assert _until(heard)
    in_peer = got[0][0]
    for _ in range(3):  # the dial's connection event (its fd) is taken in by a pass
        cons.service()
    cons.progress()  # the count now: nothing to compare with yet
    assert cons.progress() == []  # nothing arrived since
    prod.send(in_peer, [b"pong"])  # a few bytes, a whole message (heard as such): not progress (L19)
    assert _until(lambda: cons.service()[0] != [], 5.0)
    assert cons.progress() == []
    prod.send(in_peer, [b"x" * (4 << 20)])
    reported: list[str] = []
    assert _until(lambda: reported.extend(cons.progress()) or bool(reported))
    assert reported == [peer]
    assert _until(lambda: cons.service()[0] != [], 5.0)  # the whole message, read
    cons.progress()
    assert cons.progress() == []


def test_progressed_reports_growth_only_and_forgets_what_is_gone(tmp_path) -> None:
    assert tcp_bytes_received(-1) is None
    with open(tmp_path / "f", "w") as f:  # not a TCP socket
        assert tcp_bytes_received(f.fileno()) is None
    seen = {"gone": 5}
    assert progressed({}, seen) == [] and seen == {}
