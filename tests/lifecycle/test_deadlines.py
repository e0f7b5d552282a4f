"""The deadline lanes (kvtier.lifecycle.deadlines.DeadlineQueue): entries come out in firing
order (when, then arm order) across lanes, an entry is found only by its own key *and* seq, stale
entries are dropped by a compaction exactly past its thresholds (decision C9), and a cleared
queue starts afresh."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.lifecycle.deadlines import STALE_FLOOR, DeadlineQueue


def _always(key, seq) -> bool:
    return True


def test_live_entries_are_in_firing_order_across_lanes_ties_in_arm_order() -> None:
    q = DeadlineQueue()
    a = q.arm(5.0, "late", lane="park")
    b = q.arm(1.0, "early", lane="tomb")
    c = q.arm(3.0, "z", lane="park2")
    d = q.arm(3.0, "a", lane="tomb2")  # same time as "z", armed after it
    assert q.live(_always) == [(1.0, b, "early", "tomb"), (3.0, c, "z", "park2"), (3.0, d, "a", "tomb2"),
                               (5.0, a, "late", "park")]
    assert [q.pop_due(9.0, _always) for _ in range(4)] == ["early", "z", "a", "late"]


def test_an_entry_is_found_by_its_key_and_its_seq_together() -> None:
    q = DeadlineQueue()
    s1 = q.arm(2.0, "A")
    s2 = q.arm(4.0, "B")
    assert q.when_of("A", s1) == 2.0 and q.when_of("B", s2) == 4.0
    assert q.when_of("A", s2) is None and q.when_of("B", s1) is None  # a re-armed key's old entry is not it


def _fill(q: DeadlineQueue, n_live: int, n_stale: int):
    """Arm a live head, then ``n_stale`` entries that are stale, then ``n_live - 1`` live ones;
    return the liveness test, which (like the core's) asks the key's record for its live seq."""
    live: dict[str, int] = {"head": q.arm(0.0, "head")}
    for i in range(n_stale):
        q.arm(1.0 + i, f"s{i}")  # its record moved on: no live seq
    for i in range(n_live - 1):
        live[f"l{i}"] = q.arm(1e6 + i, f"l{i}")
    return lambda key, seq: live.get(key) == seq


def test_reported_stale_entries_are_compacted_only_past_the_floor_and_half_the_queue() -> None:
    q = DeadlineQueue()
    is_live = _fill(q, n_live=STALE_FLOOR - 2, n_stale=STALE_FLOOR + 1)
    for _ in range(STALE_FLOOR):
        q.retire(is_live)  # the head is live: nothing is dropped on the way
    assert len(q) == 2 * STALE_FLOOR - 1  # reported stale entries at the floor: no compaction
    q.retire(is_live)  # one past the floor, and more than half the queue
    assert len(q) == STALE_FLOOR - 2
    assert [e[2] for e in q.live(is_live)][:2] == ["head", "l0"] and q.next_when(is_live) == 0.0
    q.retire(is_live)  # reports after a compaction are counted afresh
    assert len(q) == STALE_FLOOR - 2
    half = DeadlineQueue()
    is_live = _fill(half, n_live=STALE_FLOOR + 1, n_stale=STALE_FLOOR + 1)
    for _ in range(STALE_FLOOR + 1):
        half.retire(is_live)  # past the floor, but exactly half the queue: kept
    assert len(half) == 2 * STALE_FLOOR + 2


def test_unreported_stale_entries_are_compacted_past_four_per_live_record() -> None:
    q = DeadlineQueue()
    is_live = _fill(q, n_live=1, n_stale=STALE_FLOOR + 3)  # size = floor + 4 * 1 exactly
    q.maybe_compact(live_records=1, is_live=is_live)
    assert len(q) == STALE_FLOOR + 4
    new = q.arm(2e6, "new")

    def also_new(key, seq):
        return (key, seq) == ("new", new) or is_live(key, seq)

    q.maybe_compact(live_records=1, is_live=also_new)  # one past it
    assert len(q) == 2 and [e[2] for e in q.live(also_new)] == ["head", "new"]


def test_a_cleared_queue_starts_afresh() -> None:
    q = DeadlineQueue()
    is_live = _fill(q, n_live=3, n_stale=2)
    q.retire(is_live)
    q.clear()
    assert len(q) == 0 and q.next_when(_always) is None and q.live(_always) == []
    assert q.arm(1.0, "A") == 1  # seqs restart
    q.clear()
    # and so does the count of reported stale entries: a compaction needs as many reports as in
    # a new queue
    is_live = _fill(q, n_live=STALE_FLOOR, n_stale=STALE_FLOOR + 1)
    for _ in range(STALE_FLOOR):
        q.retire(is_live)
    assert len(q) == 2 * STALE_FLOOR + 1


def test_len_counts_the_entries_held_through_every_way_one_leaves() -> None:
    q = DeadlineQueue()
    assert q.arm(1.0, "a", lane="x") == 1  # seqs start at 1
    dead = {q.arm(2.0, "b", lane="x"), q.arm(0.5, "c", lane="y")}
    q.arm(3.0, "d", lane="y")
    q.arm(4.0, "e", lane="z")

    def is_live(key, seq):
        return seq not in dead

    assert len(q) == 5
    assert q.next_when(is_live) == 1.0 and len(q) == 4  # the stale head of lane y went on the way
    assert q.pop_due(1.0, is_live) == "a" and len(q) == 3
    q.retire(is_live, lane="x")  # lane x's stale head goes at once
    assert len(q) == 2
    q.maybe_compact(live_records=0, is_live=is_live)  # nothing stale left: the two live ones stay
    assert len(q) == 2 and [e[2] for e in q.live(is_live)] == ["d", "e"]


def test_an_entry_armed_out_of_order_in_its_lane_fires_in_its_place() -> None:
    """A caller's clock that stepped back: the later-armed, earlier deadline is not stuck behind
    the lane's tail, and the lane stays sorted."""
    q = DeadlineQueue()
    q.arm(10.0, "late", lane="t")
    q.arm(11.0, "later", lane="t")
    q.arm(3.0, "early", lane="t")
    assert q.next_when(_always) == 3.0
    assert q.pop_due(5.0, _always) == "early" and q.pop_due(5.0, _always) is None
    assert [q.pop_due(20.0, _always) for _ in range(2)] == ["late", "later"]


class _Owners:
    """The records behind a queue's entries: each key's live seq (an entry whose key moved on is
    stale), and the count the queue's rule is stated in — stale entries reported with
    ``retire`` and still queued."""

    def __init__(self, q: DeadlineQueue) -> None:
        self.q, self.seq, self.stale = q, {}, 0

    def live(self, key, seq) -> bool:
        return self.seq.get(key) == seq

    def arm(self, when: float, key: str, lane: str) -> None:
        self.seq[key] = self.q.arm(when, key, lane)

    def retire(self, key: str, lane: str, *, at_head: int = 0) -> None:
        """``key``'s record drops its timer and says so; ``at_head``: stale entries the retire
        finds at its lane's head and drops (this one included, if it is there)."""
        del self.seq[key]
        before = len(self.q)
        self.stale += 1
        self.q.retire(self.live, lane)
        self.stale -= at_head
        if self.stale > STALE_FLOOR and 2 * self.stale > before - at_head:
            assert len(self.q) == before - at_head - self.stale, "a compaction drops every stale entry"
            self.stale = 0
        else:
            assert len(self.q) == before - at_head, f"no compaction at {self.stale} stale of {before - at_head}"


def _to_compaction(o: _Owners, lane: str, when: float) -> None:
    """Retire entries behind a live head of a fresh ``lane`` until the rule compacts (each
    retire checked against it): a count that drifted shows as a compaction one retire early or
    late."""
    o.arm(when, f"{lane}-head", lane)
    for i in range(STALE_FLOOR + 200):
        o.arm(when + 1 + i, f"{lane}{i}", lane)
    i = 0
    while o.stale or i == 0:
        o.retire(f"{lane}{i}", lane)
        i += 1
        assert i < STALE_FLOOR + 200, "no compaction"


def test_a_compaction_comes_exactly_when_the_stale_entries_still_queued_pass_its_thresholds() -> None:
    """After compactions, across lanes, after stale entries left at a lane's head (as it was read
    or as a retire found them there): the queue's count of stale entries never drifts, so each
    compaction comes at the exact retire the rule names (decision C9) and leaves exactly the live
    entries."""
    q = DeadlineQueue()
    o = _Owners(q)
    for i in range(100):
        o.arm(float(i), f"b{i}", "b")  # a second lane, all live
    _to_compaction(o, "a", 0.0)
    assert o.stale == 0 and len(q) == 100 + 1 + 200 - 1 + 0  # b, a's head and a's live tail
    _to_compaction(o, "d", 1e5)  # the count starts from zero again
    # stale entries that reach a lane's head as it is read leave and no longer count: down to zero
    for i in range(100):
        o.arm(-1000.0 + i, f"c{i}", "c")  # the earliest of all
    for i in range(1, 100):
        o.retire(f"c{i}", "c")  # behind c0, which is live
    assert q.pop_due(-1000.0, o.live) == "c0"
    del o.seq["c0"]
    q.next_when(o.live)  # reads the heads: c1..c99 leave
    o.stale -= 99
    assert o.stale == 0 and len(q) == 100 + 1 + 200 - 1 + 1 + 200 - 1
    _to_compaction(o, "e", 2e5)
    # ... and down to some, not zero
    for i in range(50):
        o.arm(-900.0 + i, f"f{i}", "f")
    for i in range(1, 50):
        o.retire(f"f{i}", "f")
    o.retire("b99", "b")  # not at its lane's head: it stays, counted
    assert q.pop_due(-900.0, o.live) == "f0"
    del o.seq["f0"]
    q.next_when(o.live)
    o.stale -= 49
    assert o.stale == 1
    _to_compaction(o, "g", 3e5)
    # a retire that finds its own entry at its lane's head drops it at once: down to zero
    o.arm(-800.0, "h0", "h")
    o.retire("h0", "h", at_head=1)
    assert o.stale == 0
    _to_compaction(o, "i", 4e5)
    # ... down to some, not zero
    o.retire("b98", "b")  # behind b's live head: it stays, counted
    o.arm(-700.0, "j0", "j")
    o.retire("j0", "j", at_head=1)
    assert o.stale == 1
    _to_compaction(o, "k", 5e5)


_OPS = st.lists(st.one_of(
    st.tuples(st.just("arm"), st.integers(0, 3), st.integers(0, 40)),  # key, when
    st.tuples(st.just("rearm"), st.integers(0, 3), st.integers(0, 40)),  # the key's live entry goes stale
    st.tuples(st.just("drop"), st.integers(0, 3), st.just(0)),  # the record leaves, unreported
    st.tuples(st.just("next"), st.just(0), st.just(0)),
    st.tuples(st.just("pop"), st.just(0), st.integers(0, 40)),  # now
    st.tuples(st.just("clear"), st.just(0), st.just(0)),
), max_size=60)


@given(_OPS)
@settings(max_examples=300, deadline=None)
def test_the_earliest_deadline_and_what_falls_due_match_a_scan_of_every_live_entry(ops: list) -> None:
    """The queue answers most asks without scanning its heads (decision C26); whatever the order of
    arms, re-arms, records leaving unannounced, pops and clears, ``next_when`` is the
    earliest live entry and ``pop_due`` pops it exactly when it is due — as a scan of every live
    entry says.  Keys map to lanes (``key % 2``), so lanes interleave."""
    q = DeadlineQueue()
    live: dict[int, int] = {}  # key -> the seq of its live entry
    armed: dict[tuple[int, int], float] = {}  # (key, seq) -> when

    def is_live(key: int, seq: int) -> bool:
        return live.get(key) == seq

    def earliest() -> tuple[float, int, int] | None:
        entries = [(armed[(k, s)], s, k) for k, s in live.items()]
        return min(entries) if entries else None

    for op, key, t in ops:
        if op in ("arm", "rearm"):
            if op == "rearm" and key in live:
                del live[key]  # as a record re-arms: its entry goes stale first, then is reported
                q.retire(is_live, key % 2)
            seq = q.arm(float(t), key, key % 2)
            live[key], armed[(key, seq)] = seq, float(t)
        elif op == "drop":
            live.pop(key, None)
        elif op == "next":
            e = earliest()
            assert q.next_when(is_live) == (e[0] if e else None)
        elif op == "pop":
            e = earliest()
            got = q.pop_due(float(t), is_live)
            if e is None or e[0] > t:
                assert got is None
            else:
                # ties: any live entry due at the earliest time may come first (lanes are FIFO)
                assert got in {k for k, s in live.items() if armed[(k, s)] == e[0]}
                del live[got]
        else:
            q.clear()
            live.clear()


def test_an_entry_that_never_falls_due_is_still_the_earliest_when_it_is_the_only_one() -> None:
    """A timeless state is armed at +inf (``tools/snapshot``): the earliest deadline is then +inf,
    not "none" — an empty queue and one whose only entry is at +inf answer differently."""
    q = DeadlineQueue()
    assert q.next_when(_always) is None
    q.arm(float("inf"), "k")
    assert q.next_when(_always) == float("inf") and q.next_when(_always) == float("inf")
    assert q.pop_due(1e300, _always) is None and q.pop_due(float("inf"), _always) == "k"
    assert q.next_when(_always) is None and len(q) == 0


def test_asking_again_for_an_unchanged_earliest_asks_about_one_entry() -> None:
    """Every pass of the I/O loop asks for the next deadline and fires what is due (decision C26):
    with the earliest unchanged since the last scan, the queue asks whether that one entry is still
    live instead of scanning every lane's head again, and with nothing due it asks about none."""
    q = DeadlineQueue()
    for lane in range(5):
        q.arm(10.0 + lane, f"k{lane}", lane)
    asked: list[str] = []

    def is_live(key: str, seq: int) -> bool:
        asked.append(key)
        return True

    assert q.next_when(is_live) == 10.0 and sorted(asked) == [f"k{lane}" for lane in range(5)]  # a scan
    asked.clear()
    assert q.next_when(is_live) == 10.0 and asked == ["k0"]
    assert q.pop_due(9.5, is_live) is None and asked == ["k0"]
    q.arm(9.0, "early", 7)  # earlier than the known earliest: the next ask scans again
    asked.clear()
    assert q.next_when(is_live) == 9.0 and len(asked) == 6
