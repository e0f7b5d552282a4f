"""Log lines an operator reads: routine endings at INFO, faults at WARNING/ERROR, peers named by
address and instance (never by an inbound routing id alone), rate-limited per peer and reason."""

from __future__ import annotations

import logging

import pytest

from kvtier.wire import messages as wm
from kvtier.wire.codec import encode_frames
from mgr_helpers import consumer_req, pump_until
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)

HB = {"heartbeat_interval_s": 0.05, "peer_timeout_s": 0.3}


def _lines(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kvtier.manager" and text in r.getMessage()]


def _session(make_manager, cfg=None):
    p = make_manager(dict(cfg or {}))
    c = make_manager(dict(cfg or {}))
    c.on_new_request(consumer_req("c1", "kv-log", p.host, p.port))
    assert pump_until(lambda: CoreView(c.core).session_ready(p.address) and len(CoreView(p.core).sessions()) == 1,
                      managers=[p, c])
    return p, c


def test_a_goodbye_is_routine_and_names_both_peers(make_manager, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="kvtier.manager")
    p, c = _session(make_manager)
    c.shutdown()
    # the producer reads the consumer's goodbye: its session ends with the goodbye's reason
    inbound = lambda: [r for r in _lines(caplog, "ended: shutdown") if "(in:" in r.getMessage()]  # noqa: E731
    assert pump_until(inbound, managers=[p])
    (down,) = inbound()
    assert down.levelno == logging.INFO
    # the producer only knows the consumer by an inbound routing id: the line adds its IP and instance
    assert "session with 127.0.0.1:" in down.getMessage() and "(in:" in down.getMessage()
    assert f"instance {c.instance}" in down.getMessage()
    (bye,) = [r for r in _lines(caplog, "ended: shutdown") if "(in:" not in r.getMessage()]
    assert bye.levelno == logging.INFO
    assert f"session with {p.address} instance {p.instance} ended" in bye.getMessage()


def test_a_silent_peer_is_a_fault(make_manager, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="kvtier.manager")
    p, c = _session(make_manager, HB)
    # the producer stops answering (nobody polls it): the consumer's session times out
    assert pump_until(lambda: _lines(caplog, "ended: peer_timeout"), managers=[c])
    (line,) = _lines(caplog, "ended: peer_timeout")
    assert line.levelno == logging.WARNING
    assert f"{p.address} instance {p.instance}" in line.getMessage()


def test_a_connection_closed_without_a_goodbye_is_a_fault(make_manager, caplog) -> None:
    """The producer's process dies (its sockets close, no goodbye): the consumer's session ends
    ``peer_disconnected`` at WARNING — a crash or a kill, which an operator must see.  It logged
    at INFO, as a goodbye does, so a producer killed mid-transfer left no warning (O8)."""
    caplog.set_level(logging.DEBUG, logger="kvtier.manager")
    p, c = _session(make_manager)
    p.close_abruptly()
    assert pump_until(lambda: _lines(caplog, "ended: peer_disconnected"), managers=[c])
    (line,) = _lines(caplog, "ended: peer_disconnected")
    assert line.levelno == logging.WARNING
    assert f"{p.address} instance {p.instance}" in line.getMessage()


def test_bad_messages_log_once_per_peer_and_reason(make_manager, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="kvtier.manager")
    p, c = _session(make_manager)
    for i in range(30):
        c.transport.send(p.address, [b"\xc1 not msgpack"])  # malformed
        c.transport.send(p.address, encode_frames(wm.Error(gen=0, reason="oversize", detail=f"{i}",
                                                           kv_request_id="")))
    assert pump_until(lambda: p.stats().get("kvtier_wire_errors_total{reason=malformed}") == 30
                      and p.stats().get("kvtier_wire_errors_total{reason=peer_reported_oversize}") == 30,
                      managers=[p, c])
    bad = _lines(caplog, "bad message from")
    reported = _lines(caplog, "reports an error: oversize")
    assert len(bad) == 1 and len(reported) == 1, [r.getMessage() for r in bad + reported]
    assert bad[0].levelno == logging.WARNING
    assert f"instance {c.instance}" in bad[0].getMessage() and "127.0.0.1" in bad[0].getMessage()


def test_a_not_authorised_refusal_is_logged_on_both_sides(make_manager, caplog) -> None:
    """The producer request names consumer ``decode-x`` (unauthenticated: a consumer is its hello
    instance); another consumer fetches the id.  Both managers say so once, at WARNING, naming
    what to check — the refusal used to be silent."""
    from kvtier.api import RequestContext, TransferJob

    caplog.set_level(logging.DEBUG, logger="kvtier.manager")
    p = make_manager({})
    c = make_manager({"instance": "decode-y"})
    preq = RequestContext(req_id="p1", kv_transfer_params={"remote_decoder": {"kv_request_id": "kv-named",
                                                                               "consumer": "decode-x"}})
    p.on_new_request(preq)
    p.pool.write(0, b"\x01" * p.pool.block_bytes)
    p.submit_store(TransferJob(job_id=1, keys=(b"k",), slots=(0,), req=preq))
    creq = consumer_req("c1", "kv-named", p.host, p.port)
    c.on_new_request(creq)
    c.submit_load(TransferJob(job_id=2, keys=(b"k",), slots=(0,), req=creq))
    done: list = []
    assert pump_until(lambda: done.extend(c.get_finished_jobs()) or done, managers=[p])
    assert [(r.success, r.reason) for r in done] == [(False, "not_authorised")]
    (refused,) = _lines(caplog, "refused 127.0.0.1")
    assert refused.levelno == logging.WARNING and "kv-named" in refused.getMessage()
    assert "instance decode-y" in refused.getMessage()
    (told,) = _lines(caplog, "load job 2 refused: not_authorised")
    assert told.levelno == logging.WARNING and "remote_decoder.consumer" in told.getMessage()
