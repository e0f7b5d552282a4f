"""A withdrawn NIXL window (a sink) kept for a producer not proven gone gives back the pages late
WRITEs touched, every ``SINK_RELEASE_S``, and stays mapped, so a later write still lands there
(decision N23): a wedged-then-recovered producer's late WRITEs no longer pin up to a pool's worth
of memory in the consumer for good."""

from __future__ import annotations

import ctypes
import mmap

from kvtier.dataplane.nixl_revoke import SINK_RELEASE_S, Window, reclaim_sinks, this_process
from kvtier.memory import shared

SIZE = 1 << 20


def test_a_kept_sink_gives_back_what_late_writes_touched() -> None:
    mm = mmap.mmap(-1, SIZE)
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        addr = ctypes.addressof(anchor)
        shared.withdraw(addr, SIZE)  # the window becomes a sink: fresh private pages, same addresses
        w = Window("prod", 1, addr, None, withdrawn_at=0.0)
        mm[:] = b"\x07" * SIZE  # the producer's late WRITE, into every page of the sink
        me = this_process()
        kept = reclaim_sinks([w], SINK_RELEASE_S / 2, False, me, SIZE)
        assert kept == [w] and mm[:16] == b"\x07" * 16  # not yet
        kept = reclaim_sinks(kept, SINK_RELEASE_S, False, me, SIZE)
        assert kept == [w]  # still mapped: its producer was never proven gone
        assert mm[:] == bytes(SIZE)  # every touched page given back (a fresh zero page when read)
        mm[4096:4100] = b"late"  # a later write still lands in the sink
        assert mm[4096:4100] == b"late"
        kept = reclaim_sinks(kept, 1.5 * SINK_RELEASE_S, False, me, SIZE)
        assert mm[4096:4100] == b"late"  # at most once per SINK_RELEASE_S
    finally:
        del anchor
        mm.close()
