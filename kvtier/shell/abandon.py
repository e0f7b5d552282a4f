"""A manager the engine dropped without ``shutdown()`` — collected, or still alive at the
interpreter's exit — closes its sockets and its data plane then, with no goodbyes, and says so
(decision A7): else pyzmq's context would wait at exit for sockets nothing closes any more, and a
NIXL agent left to the exit's teardown can abort the process.

At the exit the close runs at once, on the exiting thread; collected at any other time it runs on
a thread of its own (the collector runs on whatever thread allocates: one of the manager's own,
or one that holds its pass lock), which the exit waits for if it is still running then.  Python's own flag for the exit is set only after every
finalizer ran, so the exit is noted by a hook of our own that runs before them (:func:`watch`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from typing import Any

__all__ = ["watch"]

log = logging.getLogger("kvtier.manager")

_exiting = False
_hooked = False
_closing: set[threading.Thread] = set()  # closes of collected managers still running
JOIN_AT_EXIT_S = 5.0
"""How long the exit waits for each close still running (a NIXL agent torn down mid-close by the
exit's teardown can abort the process)."""


def watch(manager: Any, loop: Any, metrics: Any) -> weakref.finalize:
    """Close ``loop`` (the manager's :class:`~kvtier.shell.loop.IoLoop`) and ``metrics`` when
    ``manager`` is collected or the interpreter exits; the caller detaches the returned finalizer
    when it closes the manager itself."""
    global _hooked
    finalizer = weakref.finalize(manager, _close_abandoned, loop, metrics)
    if not _hooked:
        # registered after the finalizers' own exit hook (the finalize above registered it, if
        # nothing had before): exit hooks run last-in first-out, so this one runs first
        atexit.register(_note_exit)
        _hooked = True
    return finalizer


def _note_exit() -> None:
    global _exiting
    _exiting = True
    for t in list(_closing):  # managers collected just before the exit: their closes end first
        t.join(JOIN_AT_EXIT_S)


def _close_abandoned(loop: Any, metrics: Any) -> None:
    log.warning("kvtier: a KvTierManager was dropped without shutdown(): its sockets are closed now, without "
                "goodbyes (its peers see a crash); call shutdown() when you are done with it")
    if _exiting or getattr(weakref.finalize, "_shutdown", False):  # nothing else runs now
        _close_now(loop, metrics)
    else:
        t = threading.Thread(target=_close_in_thread, args=(loop, metrics), name="kvtier-abandoned", daemon=True)
        _closing.add(t)
        t.start()


def _close_in_thread(loop: Any, metrics: Any) -> None:
    try:
        _close_now(loop, metrics)
    finally:
        _closing.discard(threading.current_thread())


def _close_now(loop: Any, metrics: Any) -> None:
    loop.stop()
    loop.close_abruptly()
    metrics.close()
