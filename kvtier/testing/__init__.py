"""Test doubles for code that uses kvtier: part of the installed package; no threads, no
sockets, no sleeps.

* :class:`kvtier.testing.clock.VirtualClock`: time that moves only when the test says so; pass
  ``clock=vc.now`` to :class:`~kvtier.manager.KvTierManager`.
* :class:`kvtier.testing.inproc.InprocNetwork` and :class:`~kvtier.testing.inproc.InprocTransport`:
  an in-memory network between managers (``transport=``), with partitions, kills and restarts.
* :class:`kvtier.testing.fakenet.FakeNetwork`: the smallest shell between sans-I/O
  :class:`~kvtier.lifecycle.TierCore` instances; it delivers, drops, duplicates and reorders
  their messages when the test says so.

kvtier's own test machinery (peer processes, planted bugs, network namespaces) is not installed:
it lives in the repository (``tests/support``, ``tools``).
"""
