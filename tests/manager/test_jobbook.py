"""The job book (kvtier.shell.jobs.JobBook): exactly one result per engine job, handed over once;
an id stays taken until its result was collected; the manager's own jobs (a load of nothing it
runs for a request whose lookups found nothing) are counted and ended like the engine's but never
reported, listed or counted as the engine's."""

from __future__ import annotations

import logging

import pytest

from kvtier.api import DuplicateJob
from kvtier.lifecycle import Reason
from kvtier.shell.jobs import JobBook


def _book() -> JobBook:
    book = JobBook()
    book.open(1, store=False, kv_request_id="A", now=1.0, nbytes=128)
    book.open(2, store=True, kv_request_id="A", now=2.0, nbytes=64)
    book.open(9, store=False, kv_request_id="A", now=3.0, nbytes=0, internal=True)
    return book


def test_the_managers_own_job_is_never_the_engines() -> None:
    book = _book()
    assert len(book) == 2
    assert book.outstanding() == frozenset({1, 2})
    assert sorted(book.open_ids()) == [1, 2] and sorted(book.open_ids("A")) == [1, 2]
    assert book.info(9) is None and book.info(1) == (False, "A", 1.0, 128)
    assert book.finish(9, True, None, 4.0) == (False, 0, 1.0, True)  # ended, no engine's job...
    assert book.take() == [] and not book.ready  # ...never handed over
    assert len(book) == 2 and book.outstanding() == frozenset({1, 2})
    assert book.finish(9, True, None, 5.0) is None  # ended once


def test_a_result_keeps_its_id_taken_until_it_is_collected() -> None:
    book = _book()
    assert book.finish(1, True, None, 3.5) == (False, 128, 2.5, False)
    # reported, not collected: still outstanding, no longer open, a resubmission is a duplicate
    assert book.outstanding() == frozenset({1, 2}) and book.is_outstanding(1)
    assert sorted(book.open_ids()) == [2] and len(book) == 1 and book.ready
    with pytest.raises(DuplicateJob, match=r"^job 1 is already outstanding \(its result has not been collected yet\)$"):
        book.check_new(1)
    with pytest.raises(DuplicateJob, match=r"^job 2 is already outstanding$"):
        book.check_new(2)
    (r,) = book.take()
    assert (r.job_id, r.success, r.reason, r.transfer_bytes, r.transfer_time_s) == (1, True, None, 128, 2.5)
    assert book.take() == []  # exactly one result
    assert book.outstanding() == frozenset({2}) and not book.is_outstanding(1)
    book.check_new(1)  # free again


def test_open_refuses_an_id_outstanding_without_a_check_first() -> None:
    """The engine's store path registers without a separate check (one call): open itself refuses
    an open or reported id and registers nothing, so two threads submitting one id get one job."""
    book = _book()
    book.finish(1, True, None, 3.5)  # reported, not collected
    for job_id, store in ((1, True), (2, False)):
        with pytest.raises(DuplicateJob, match=rf"^job {job_id} is already outstanding"):
            book.open(job_id, store=store, kv_request_id="B", now=9.0, nbytes=1, slots=(7,))
    assert book.info(2) == (True, "A", 2.0, 64)  # the first registration stands
    book.open(3, store=False, kv_request_id="B", now=9.0, nbytes=1, slots=(7,))  # slot 7 was not taken above


def test_outstanding_without_internal_jobs_is_open_and_reported() -> None:
    book = JobBook()
    book.open(1, store=False, kv_request_id="A", now=0.0, nbytes=1)
    book.open(2, store=False, kv_request_id="B", now=0.0, nbytes=1)
    book.finish(2, False, Reason.LOAD_TIMEOUT, 1.0)
    assert book.outstanding() == frozenset({1, 2}) and len(book) == 1
    assert book.open_ids("B") == [] and book.open_ids("A") == [1]


def test_what_each_kind_of_result_reports() -> None:
    book = _book()
    book.open(3, store=False, kv_request_id="B", now=0.0, nbytes=256)
    book.open(4, store=False, kv_request_id="C", now=0.0, nbytes=256)
    book.finish(2, True, None, 4.0, successful_keys=(b"k",))  # a store reports neither bytes nor keys
    book.finish(1, False, None, 4.0, successful_keys=(b"k0",))  # a failure without a reason: transfer_failed
    book.finish(3, True, Reason.LOCAL, 4.0)  # a load served locally moved nothing over the network
    book.finish(4, False, Reason.CORRUPT, 4.0, successful_keys=())  # no verified key: None, not ()
    got = {r.job_id: (r.success, r.reason, r.transfer_bytes, r.transfer_time_s, r.successful_keys)
           for r in book.take()}
    assert got == {2: (True, None, None, None, None), 1: (False, "transfer_failed", None, None, (b"k0",)),
                   3: (True, None, None, None, None), 4: (False, "corrupt", None, None, None)}


def test_a_second_or_unknown_result_is_dropped_and_logged(caplog) -> None:
    book = _book()
    book.finish(1, True, None, 2.0)
    with caplog.at_level(logging.ERROR, logger="kvtier.manager"):
        assert book.finish(1, False, Reason.SHUTDOWN, 3.0) is None
        assert book.finish(77, True, None, 3.0) is None
    assert [r.getMessage() for r in caplog.records] == [
        "kvtier: duplicate or unknown job result 1 dropped", "kvtier: duplicate or unknown job result 77 dropped"]
    assert [r.job_id for r in book.take()] == [1]


def test_internal_jobs_are_counted_one_by_one() -> None:
    book = JobBook()
    book.open(1, store=False, kv_request_id="A", now=0.0, nbytes=1, internal=True)
    book.open(2, store=False, kv_request_id="B", now=0.0, nbytes=1, internal=True)
    book.open(3, store=False, kv_request_id="C", now=0.0, nbytes=1)
    book.finish(1, True, None, 1.0)
    assert book.outstanding() == frozenset({3}) and book.open_ids() == [3] and len(book) == 1


# -- the JobDone performer (kvtier.shell.outbound): what a result changes besides the book ----------


class Calls:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args, **kw: self.calls.append((name, *args))


def _performer():
    import time

    from kvtier.shell.logs import RateLimitedLog
    from kvtier.shell.outbound import Outbound
    from kvtier.shell.perbyte import ByteWork
    from kvtier.testing.inproc import InprocNetwork, InprocTransport

    metrics, logs, book = Calls(), RateLimitedLog(time.monotonic, lambda p: ""), JobBook()
    work = ByteWork(algorithm="xxh3_64", digest_pool=None, block_bytes=64, metrics=metrics, logs=logs)
    out = Outbound(transport=InprocTransport(InprocNetwork(), "c:1"), plane=None, pool=None, jobs=book,
                   metrics=metrics, logs=logs, work=work, clock=lambda: 7.0)
    return out, book, metrics


def test_only_a_load_that_ended_changes_what_lookups_answer() -> None:
    """A load that failed (decision L11) or loaded (an id is fetched once, L8) makes the id's lookups
    MISS: the loop republishes that id's answers (only that id: decision C25), and nothing else asks
    for a republish; a store's result changes no lookup."""
    from kvtier.lifecycle import effects as fx

    for store, ok, changed in [(False, False, True), (False, True, True), (True, False, False), (True, True, False)]:
        out, book, _ = _performer()
        book.open(1, store=store, kv_request_id="A", now=0.0, nbytes=64)
        out.perform([fx.JobDone(1, ok, None if ok else Reason.ABORTED)])
        assert out.ended == ({"A"} if changed else set()), (store, ok)
        assert out.changed is False, (store, ok)  # the id is known: no rescan of every id



@pytest.mark.parametrize("internal", [True, False], ids=["own-job", "no-id"])
def test_a_failed_load_with_no_id_to_name_asks_to_look_at_every_id_again(internal: bool) -> None:
    """The manager's own load of nothing (the book keeps its id from the engine's views) and a load
    that failed before it had an id (its producer not in ``allowed_peers``, or ended by
    ``finish_job``) name no id to republish: the loop looks at every id in use again."""
    from kvtier.lifecycle import effects as fx

    out, book, _ = _performer()
    book.open(1, store=False, kv_request_id="A" if internal else None, now=0.0, nbytes=0, internal=internal)
    out.perform([fx.JobDone(1, False, Reason.PEER_LOST)])
    assert out.changed is True
    assert out.ended == set()

def test_a_failure_without_a_reason_is_counted_and_reported_as_transfer_failed() -> None:
    from kvtier.lifecycle import effects as fx

    out, book, metrics = _performer()
    book.open(1, store=False, kv_request_id="A", now=0.0, nbytes=64)
    book.open(2, store=False, kv_request_id="B", now=3.0, nbytes=64)
    out.perform([fx.JobDone(1, False), fx.JobDone(2, True)])
    assert metrics.calls == [("job_done", "load", False, Reason.TRANSFER_FAILED), ("job_done", "load", True, None),
                             ("transfer", "consumer", 64, 4.0)]
    assert [(r.job_id, r.reason) for r in book.take()] == [(1, "transfer_failed"), (2, None)]


@pytest.mark.parametrize(("store", "kind"), [(True, "store"), (False, "load")])
def test_a_job_refused_as_not_authorised_says_where_to_look(store: bool, kind: str, caplog) -> None:
    from kvtier.lifecycle import effects as fx

    out, book, metrics = _performer()
    book.open(4, store=store, kv_request_id="A", now=0.0, nbytes=64)
    with caplog.at_level(logging.WARNING, logger="kvtier.manager"):
        out.perform([fx.JobDone(4, False, Reason.NOT_AUTHORISED)])
    said = (f"kvtier: {kind} job 4 refused: not_authorised (the producer request named another consumer for this "
            "id; check remote_decoder.consumer and this manager's CURVE principal)")
    assert [r.getMessage() for r in caplog.records] == [said]
    assert metrics.calls == [("job_done", kind, False, Reason.NOT_AUTHORISED)]


def test_a_slot_takes_one_load_at_a_time_until_that_loads_result() -> None:
    """Decision A9: a load naming a slot an open load writes into is refused, naming both; the
    slots are free again once the first load's result is final (not only once it is collected);
    stores never take slots (one block may be parked under several ids)."""
    book = JobBook()
    book.open(1, store=False, kv_request_id="A", now=0.0, nbytes=3, slots=(0, 1, 2))
    book.open(2, store=True, kv_request_id="B", now=0.0, nbytes=3)  # a store from the same slots
    with pytest.raises(ValueError, match=r"^submit_load job 3: slots 2, 1 are still being loaded by job 1: "
                                         r"a slot takes one load at a time"):
        book.open(3, store=False, kv_request_id="C", now=0.0, nbytes=3, slots=(5, 2, 1))
    assert book.outstanding() == frozenset({1, 2})  # the refused job was not registered
    book.open(3, store=False, kv_request_id="C", now=0.0, nbytes=3, slots=(5, 6))  # other slots: fine
    many = tuple(range(10, 30))
    book.open(4, store=False, kv_request_id="D", now=0.0, nbytes=20, slots=many)
    with pytest.raises(ValueError, match=r"slots 10, 11, 12, 13, 14, 15, 16, 17, … \(20 in all\) are still "
                                         r"being loaded by job 4:"):
        book.open(5, store=False, kv_request_id="E", now=0.0, nbytes=20, slots=many)
    book.finish(1, False, Reason.LOAD_TIMEOUT, 1.0)  # final, not yet collected
    book.open(6, store=False, kv_request_id="F", now=1.0, nbytes=3, slots=(0, 1, 2))
    with pytest.raises(ValueError, match=r"slot 6 is still being loaded by job 3:"):
        book.open(7, store=False, kv_request_id="G", now=1.0, nbytes=1, slots=(6,))


def test_a_log_line_shows_the_start_of_a_long_inbound_routing_id_only() -> None:
    """A peer picks its own routing id (up to 255 bytes, 513 characters as ``in:<hex>``): a line
    names where it is and the id's first 40 characters; a short id is shown whole."""
    from kvtier.shell.logs import RateLimitedLog

    long_id = "in:" + "ab" * 255
    logs = RateLimitedLog(lambda: 0.0, lambda peer: "127.0.0.1:5000" if peer == long_id else "")
    assert logs.who(long_id) == f"127.0.0.1:5000 ({long_id[:39]}…)"
    assert logs.who("in:0011223344") == "in:0011223344"


def test_a_log_line_names_the_principal_a_connection_proved_beside_the_instance_it_claims() -> None:
    """Under CURVE a peer holding an allowed key may claim another instance's name in its hello:
    the line shows both, so an operator sees who holds the key; a principal equal to the claimed
    instance (or none, without CURVE) adds nothing."""
    from kvtier.shell.logs import RateLimitedLog

    logs = RateLimitedLog(lambda: 0.0, lambda peer: "127.0.0.1:5000")
    logs.name("in:01", "cons", "evil")
    logs.name("in:02", "cons", "cons")
    logs.name("in:03", "cons", None)
    assert logs.who("in:01") == "127.0.0.1:5000 (in:01) instance cons (principal evil)"
    assert logs.who("in:02") == "127.0.0.1:5000 (in:02) instance cons"
    assert logs.who("in:03") == "127.0.0.1:5000 (in:03) instance cons"


def test_an_effect_whose_performer_fails_does_not_take_the_rest_of_its_step_with_it(caplog) -> None:
    """A performer that raises (an internal error: a plane that could not post, a bug) is counted and
    logged, and the step's other effects are still performed — another job's result among them —
    as the core, which decided them all, assumes.  They were dropped with the step: a job whose
    result came later in that step never got one."""
    from kvtier.lifecycle import effects as fx

    out, book, metrics = _performer()
    book.open(1, store=False, kv_request_id="A", now=0.0, nbytes=64)
    book.open(2, store=False, kv_request_id="B", now=0.0, nbytes=64)

    def broken(e):
        raise RuntimeError("the plane could not post")

    out.PERFORMERS[fx.CancelTransfer] = broken
    out.perform([fx.JobDone(1, True), fx.CancelTransfer("A", 0), fx.JobDone(2, False, Reason.ABORTED)])
    assert [r.job_id for r in book.take()] == [1, 2]
    assert ("internal_error",) in metrics.calls
    assert "performing CancelTransfer failed; the rest of its step goes on" in caplog.text


def test_results_held_for_a_closing_plane_are_handed_over_once_it_is_closed() -> None:
    """Shutdown holds the results GraceEnded produced until its data plane is closed (decision
    I41): meanwhile nothing is handed over and none reads as ready; then each, once."""
    book = _book()
    book.held = True
    book.finish(1, False, Reason.SHUTDOWN, 4.0)
    assert book.take() == [] and not book.ready
    book.held = False
    assert book.ready and [(r.job_id, r.reason) for r in book.take()] == [(1, "shutdown")]
    assert book.take() == []
