"""kvtier's I/O shell: everything between the engine-facing façade (:mod:`kvtier.manager`) and the
sans-I/O core (:mod:`kvtier.lifecycle`).  One module, one job:

* :mod:`~kvtier.shell.checks` — engine API argument checks;
* :mod:`~kvtier.shell.jobs` — the job ledger (exactly one result per job, handed over once);
* :mod:`~kvtier.shell.inbound` — one service pass of the transport and the plane, as core inputs;
* :mod:`~kvtier.shell.outbound` — one table from effect type to performer;
* :mod:`~kvtier.shell.loop` — the tick (inputs → core → performers → core) and the poll thread;
* :mod:`~kvtier.shell.logs` — rate-limited log lines with peers named for operators;
* :mod:`~kvtier.shell.build` — constructing transport, plane and core from the config.
"""
