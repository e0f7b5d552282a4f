"""kvtier's I/O shell: everything between the engine-facing façade (:mod:`kvtier.manager`) and the
sans-I/O core (:mod:`kvtier.lifecycle`).  One module, one job:

* :mod:`~kvtier.shell.loop` — the I/O loop: the one owner of transport, plane and core (commands,
  one pass, the wait, the ``kvtier-io`` thread);
* :mod:`~kvtier.shell.waker` — the loop's wake-up eventfd;
* :mod:`~kvtier.shell.published` — what the loop publishes for engine calls that answer at once;
* :mod:`~kvtier.shell.jobs` — the job book (exactly one result per job, handed over once);
* :mod:`~kvtier.shell.inbound` — one service pass of the transport and the plane, as stamped inputs;
* :mod:`~kvtier.shell.outbound` — effect → performer (the spec's ``PERFORM`` table);
* :mod:`~kvtier.shell.perbyte` — digests and landings on the digest pool, and what waits for them;
* :mod:`~kvtier.shell.serving` — serve windows (the symmetric path's lookups in the engine's tiers);
* :mod:`~kvtier.shell.checks` — engine API argument checks;
* :mod:`~kvtier.shell.logs` — rate-limited log lines with peers named for operators;
* :mod:`~kvtier.shell.build` — constructing the loop's parts from the config.
"""
