"""Test machinery that runs kvtier in real processes and on real hosts (not part of the wheel).

* :mod:`tests.support.peer_process`: a manager in a child process, driven call by call;
* :mod:`tests.support.nixl_peer`: a NIXL block agent in a child process (tests and the NIXL probe);
* :mod:`tests.support.raw_peer`: a consumer speaking the wire protocol message by message;
* :mod:`tests.support.wedge`: wedged and slow processes (SIGSTOP / SIGCONT);
* :mod:`tests.support.netns`: two hosts on one machine (network namespaces, a veth pair).

The children are :class:`tools.child.Child` processes.  The small doubles a user may import stay
in the wheel, in :mod:`kvtier.testing`.  Layers: docs/design.md, *Layers*.
"""
