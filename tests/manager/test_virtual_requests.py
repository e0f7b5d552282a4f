"""The real manager pair on an in-memory network, driven by a virtual clock (no sockets, no
sleeps): one ``kv_request_id`` and several requests, a confirmed transfer waiting for its release,
unbounded demand, and the fetch-size limits.  Expected values come from
docs/scenarios.md (B13, B15) with its parameters (T_park = 60 s,
T_tomb = 60 s, T_load = 30 s) unless a test says otherwise.
"""

from __future__ import annotations

import pytest

from kvtier.api import UnknownRequest
from kvtier.testing.inproc import InprocTransport
from mgr_helpers import digests, job, keys_for, metric
from virtual_helpers import BB, SCEN, outcome, store
from tools.coreview import CoreView

pytestmark = pytest.mark.timeout(60)


# -- one kv_request_id, two consumer requests ----------------------------------------------------


@pytest.mark.parametrize("first_request_state", ["cancelling", "loaded"])
def test_reused_kv_request_id_on_the_consumer_never_leaks_a_job(pairs, first_request_state):
    """A second consumer request for an id whose first load is still winding down is refused at
    on_new_request (ValueError naming the id); no job leaks, and once the first request's record
    is gone the id can be announced again."""
    v = pairs(SCEN, block_bytes=BB)
    C = v.C
    c1 = v.creq("c1", "A")
    C.on_new_request(c1)
    if first_request_state == "loaded":
        store(v, "A", 1, [0], seed=1)
    C.submit_load(job(1, keys_for("A", 1), [0], c1))
    v.step()
    c2 = v.creq("c2", "A")
    if first_request_state == "cancelling":
        C.on_request_finished(c1)  # abort_fetch on its way; the record is 'cancelling'
    else:
        assert outcome(v.cjobs, 1) == (True, None)
    # the message names what holds the id and the fix: the unfinished request, or the abort in flight
    why = (r"winding down \(its abort is in flight\); submit again once that load's result is in"
           if first_request_state == "cancelling" else
           r"by request 'c1', which has not finished: .* call on_request_finished for 'c1' first")
    with pytest.raises(ValueError, match=r"^request 'c2': kv_request_id 'A' is still in use on this consumer.*" + why):
        C.on_new_request(c2)
    with pytest.raises(UnknownRequest):
        C.submit_load(job(2, keys_for("A", 1), [1], c2))
    if first_request_state == "loaded":
        C.on_request_finished(c1)
    v.advance(40.0)
    assert C.core.consumer_state("A").value == "absent"
    assert 2 not in C.outstanding_jobs() and not v.cjobs.has(2)
    assert len(v.cjobs.by_id.get(1, [])) == 1
    assert C.on_new_request(c2) == "consumer"  # the id is free again


def test_a_reused_id_is_free_once_the_abort_ack_arrived_even_before_the_consumer_polls(pairs):
    """Caller-driven, the id-reuse check applies what the network delivered before it (C33), as the
    I/O thread would have on arrival: the producer acked the first request's abort, so the second
    request is accepted although the consumer has not polled since (it was refused: still in use)."""
    v = pairs(SCEN, block_bytes=BB)
    C, P = v.C, v.P
    c1 = v.creq("c1", "A")
    C.on_new_request(c1)
    C.submit_load(job(1, keys_for("A", 1), [0], c1))
    v.step()
    C.on_request_finished(c1)  # abort_fetch leaves; the record is 'cancelling'
    assert C.core.consumer_state("A").value == "cancelling"
    P.poll(0)  # the producer reads the abort and acks it; the consumer does not poll
    assert C.on_new_request(v.creq("c2", "A")) == "consumer"
    assert len(v.cjobs.by_id.get(1, [])) <= 1
    v.step()
    assert outcome(v.cjobs, 1)[0] is False  # the first load still has its one result


# -- more scenarios: transfer timeout, B12, B13, B15, B20, B29 -----------------------------------


def test_confirmed_transfer_waits_for_the_release_and_quarantines_past_its_deadline(pairs):
    """The transport keeps the blocks (zmq still holds the frames) although the consumer has every
    block: its load succeeded and its receipt arrived, so the producer is ``confirmed``.  The store
    job's result -- the moment the engine may reuse the blocks -- still waits until the transport
    lets go.  Past the cancel deadline the session is ended to force the release and the id is
    quarantined, its job outstanding; when the transport finally releases, the job succeeds (the
    consumer confirmed every block)."""
    v = pairs(
        {**SCEN, "transfer_timeout_s": 10.0},
        block_bytes=BB,
        p_transport=lambda net, addr: InprocTransport(net, addr, hold_completion=True, hold_after_drop=True),
    )
    P, C = v.P, v.C
    store(v, "A", 1, [0, 1], seed=1)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    v.advance_to(1.0)
    C.submit_load(job(10, keys_for("A", 2), [0, 1], ca))
    v.step()
    assert outcome(v.cjobs, 10) == (True, None)  # the last block landed and matched
    assert P.core.producer_state("A").value == "confirmed"  # receipt in, frames still held
    v.advance_to(10.75)
    assert not v.pjobs.has(1)
    v.advance_to(11.0)
    assert P.core.producer_state("A").value == "quarantined"
    assert not v.pjobs.has(1)  # never reported while the transport references the blocks
    assert P.quarantined() == (1, 2)
    assert metric(P, "kvtier_session_ends_total", reason="transfer_stalled") == 1
    assert metric(P, "kvtier_quarantined_blocks", role="producer") == 2
    v.advance_to(15.0)
    P.transport.complete()
    v.step()
    assert outcome(v.pjobs, 1) == (True, None)
    assert P.core.producer_state("A").value == "done"
    v.advance_to(60.0)
    assert v.cjobs.total() == 1 and v.pjobs.total() == 1


def test_b13_reused_kv_request_id_on_the_producer_is_refused_and_the_first_owner_served(pairs):
    v = pairs(SCEN, block_bytes=BB)
    P, C = v.P, v.C
    _, dig = store(v, "A", 1, [0, 1, 2, 3], seed=1, req_id="r1")
    v.advance_to(1.0)
    store(v, "A", 2, [4, 5, 6, 7], seed=2, req_id="r2")
    v.step()
    assert outcome(v.pjobs, 2) == (False, "id_in_use")  # its blocks are released at once
    v.advance_to(2.0)
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", 4), [0, 1, 2, 3], ca))
    v.step()
    assert outcome(v.cjobs, 10) == (True, None)
    assert digests(C.pool, [0, 1, 2, 3]) == dig  # r1's blocks, not r2's
    assert outcome(v.pjobs, 1) == (True, None)
    assert not P.jobs_in_flight() and CoreView(P.core).producer("A").parked == ()


def test_b15_demand_for_never_stored_ids_is_bounded_and_does_not_block_legit_transfers(pairs):
    cfg = {**SCEN, "max_pending_fetches_per_peer": 2}
    v = pairs(cfg, block_bytes=BB)
    P, C = v.P, v.C
    for jid, kv in ((10, "X1"), (11, "X2"), (12, "X3")):
        r = v.creq("c-" + kv, kv)
        C.on_new_request(r)
        C.submit_load(job(jid, [kv.encode()], [jid - 10], r))
    v.step()
    assert outcome(v.cjobs, 12) == (False, "too_many_pending")  # excess rejected at once
    assert not v.cjobs.has(10) and not v.cjobs.has(11)
    v.advance_to(0.1)
    _, dig = store(v, "Y", 1, [0, 1], seed=3)
    v.advance_to(0.2)
    cy = v.creq("c-Y", "Y")
    C.on_new_request(cy)
    C.submit_load(job(20, keys_for("Y", 2), [5, 6], cy))
    v.step()
    assert outcome(v.cjobs, 20) == (True, None)
    assert digests(C.pool, [5, 6]) == dig
    v.advance_to(10.0)  # T_orphan = fetch_supply_timeout_s
    assert outcome(v.cjobs, 10) == (False, "supply_timeout")
    assert outcome(v.cjobs, 11) == (False, "supply_timeout")


def test_fetch_over_the_producers_header_limit_is_refused_at_submit(pairs):
    """A load whose fetch header would exceed max_message_bytes is refused at the call."""
    n = 6000
    v = pairs(num_blocks=n, block_bytes=BB)  # default configs on both sides
    C = v.C
    keys = [f"A/{i:05d}/".encode().ljust(200, b"k") for i in range(n)]
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    with pytest.raises(ValueError, match="max_message_bytes"):
        C.submit_load(job(10, keys, list(range(n)), ca))
    assert 10 not in C.outstanding_jobs()


def test_fetch_refused_by_a_producer_with_a_smaller_limit_fails_at_once(pairs):
    """The producer's max_blocks_per_fetch is smaller than the consumer's: it answers
    error(oversize) naming the id, and the consumer fails that load at once (peer_error)."""
    n = 40
    v = pairs({"max_blocks_per_fetch": 16}, num_blocks=n, block_bytes=BB)
    C = v.C
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, keys_for("A", n), list(range(n)), ca))
    v.step()
    v.step()
    assert outcome(v.cjobs, 10) == (False, "peer_error")
    assert metric(v.P, "kvtier_wire_errors_total", reason="oversize") == 1


def test_fetch_over_a_producers_smaller_header_limit_fails_at_once(pairs):
    """The producer's max_message_bytes is smaller than the consumer's: the fetch header is over
    it (under twice it, so it is read).  Its error names the id (only the id is read from the
    header), and the consumer fails that load at once (peer_error), not at load_timeout_s."""
    n = 20
    v = pairs({"max_message_bytes": 4096}, num_blocks=n, block_bytes=BB)
    C = v.C
    ca = v.creq("c-A", "A")
    C.on_new_request(ca)
    C.submit_load(job(10, [f"A/{i:03d}/".encode().ljust(250, b"k") for i in range(n)], list(range(n)), ca))
    v.step()
    v.step()
    assert outcome(v.cjobs, 10) == (False, "peer_error")
    assert metric(v.P, "kvtier_wire_errors_total", reason="oversize") == 1


def test_a_role_entry_under_a_name_kvtier_does_not_read_is_named_with_the_nearest_role(pairs, caplog):
    """A typo in a role key turns a hand-off into a local request: the request stays local (other
    connectors' keys pass through, decision A10), and one warning names the key and
    the nearest role; other connectors' flags and ids warn nothing."""
    from kvtier.api import RequestContext

    v = pairs(SCEN, block_bytes=BB)
    caplog.set_level("WARNING", logger="kvtier")
    typo = RequestContext(req_id="d1", kv_transfer_params={"remote_prefill": {
        "kv_request_id": "A", "remote_host": "127.0.0.1", "remote_port": 5555}})
    assert v.C.on_new_request(typo) == "local"
    (line,) = [r.getMessage() for r in caplog.records if "kv_transfer_params key" in r.getMessage()]
    assert "request 'd1': kv_transfer_params key 'remote_prefill' holds a kv_request_id but is not a role" in line
    assert "(did you mean 'remote_prefiller'?)" in line and "runs locally" in line
    caplog.clear()
    nixl_style = RequestContext(req_id="d2", kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": "e", "remote_block_ids": [1, 2]})
    assert v.C.on_new_request(nixl_style) == "local"
    assert not [r for r in caplog.records if "kv_transfer_params key" in r.getMessage()]
