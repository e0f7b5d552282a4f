"""Test doubles for code that uses kvtier: part of the installed package; no threads, no
sockets, no sleeps.

* :class:`kvtier.testing.clock.VirtualClock`: time that moves only when the test says so; pass
  ``clock=vc.now`` to :class:`~kvtier.manager.KvTierManager`.
* :class:`kvtier.testing.inproc.InprocNetwork` and :class:`~kvtier.testing.inproc.InprocTransport`:
  an in-memory network between managers (``transport=``), with partitions, kills and restarts.
* :class:`kvtier.testing.pair.VirtualPair`: a producer and a consumer manager on one in-memory
  network and one virtual clock, stepped by the test; :class:`~kvtier.testing.pair.Jobs` collects
  a manager's job results.

kvtier's own test machinery (the sans-I/O cores' fake network ``tools.fakenet``, the core's
export ``tools.snapshot``, peer processes, planted bugs, network namespaces) is not installed: it
lives in the repository (``tools``, ``tests/support``; docs/decisions.md W10).
"""
