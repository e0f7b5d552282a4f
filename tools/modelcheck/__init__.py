"""Bounded exhaustive model check of the composed kvtier system (``python -m tools check``).

What is explored
----------------
One producer and ``consumers`` consumers, each a **real** :class:`~kvtier.lifecycle.TierCore`
(so every lifecycle step runs the generated table through the real producer, consumer and
session classes) driven through :func:`kvtier.lifecycle.driver.drive`, as the shell drives it,
living in an environment of four parts:

* the **engines** (:mod:`.engines`): the prefill engine stores chunks and finishes requests (or
  abandons them early), and stores an id again once it was pruned (``lives``); the decode engines
  load ids, may finish a live load, and load an id again; an operator may drain the producer and
  shut each manager down (begin, then the grace ends: ``close``) with traffic in flight;
* the **network** (:mod:`.network`): FIFO channels per direction and per consumer (``--reorder``:
  any message), receive batching (a message may wait unread in the receiver's socket), lost,
  duplicated or corrupt-landing messages (``faults``), heartbeats (``pings``), session deaths by
  disconnect, connection close or a heartbeat finding the peer silent (``crashes``), connection
  set-up (or the whole handshake: ``connected=False``), closed managers;
* the **transport** (:mod:`.transport`): the data plane — a ``SendBlocks`` leaves a transfer whose
  references outlive a cancel until the plane reports ``released`` (or ``failed``); a report is a
  completion step only once the session that carried it ended — and the consumer's shell, which
  lands blocks (``blocks_landed``) and has access revoked (``access_revoked``, at once or, on a
  one-sided plane, later) and the planes taking peers' descriptors (at once, or later:
  ``attach_later``);
* the **clock** (:mod:`.clock`): abstract time — any armed deadline may fall due at any step; the
  tick that follows reads the unread messages that concern it first (the driver's contract), so
  every ordering of deadlines is covered, whatever the configured durations.

A state (:mod:`.state`) is the tuple of the cores' interned exports (:mod:`.encoding`, on
:mod:`tools.snapshot`) plus the environment's fields.  Core steps are memoised, so each distinct local step runs the real core
once.  :mod:`.search` explores the states breadth-first (:mod:`.reduction`: partial-order
reduction over ids, finished pairs merged), checks the properties (:mod:`.properties`, the spec's
``[properties]``) on every transition and state, then proves that no id is ever stuck; a
violation comes back as a :class:`Result` with a text trace and structured steps (:mod:`.trace`,
:func:`to_chart_steps`), which :mod:`.chart` draws as a sequence chart.  A plain ``python -m tools check``
explores every named configuration of :data:`PROFILES` in turn.

Modules
-------
=================  ==========================================================================
``bounds``         :class:`Bounds`: the size of the explored system; :data:`PROFILES`
``encoding``       TierCore exports (tools.snapshot), interning, memoised core steps
``state``          the global state tuple (which module owns which field) and its working copy
``part``           the interface of an environment part (actions, labels, apply, core inputs)
``engines``        prefill/decode engines and the operator: store, finish, load, reuse, drain,
                   shutdown, close
``symmetric``      the symmetric path's engines: the probed request, serve windows, pins
``network``        channels, receive batching, faults, crashes, connection set-up
``transport``      the data plane (transfers, their reports) and the consumer's shell
``clock``          abstract time: which deadlines may fall due, and the tick that follows
``system``         the composed system: action order, apply, core steps, effects routing
``properties``     each property as a documented checker; the registry (spec names)
``reduction``      partial-order reduction (ample sets over id/consumer pairs; finished pairs)
``search``         BFS, completion (liveness) search, counterexample reconstruction, profiles
``trace``          trace lanes, structured steps, :func:`to_chart_steps`
``chart``          counterexamples as sequence charts (``--chart DIR``, ``python -m tools diagram``)
``result``         :class:`Result`, :class:`Violation`, :func:`format_result`
``cli``            ``python -m tools check`` options (:func:`main`)
=================  ==========================================================================

See ``docs/modelcheck.md`` for what the model covers, what it costs, and where to add an
environment behaviour or a property.
"""

from __future__ import annotations

from tools.modelcheck.bounds import PROFILES, Bounds
from tools.modelcheck.chart import chart_dot, chart_steps, write_chart
from tools.modelcheck.cli import main
from tools.modelcheck.properties import PROPERTIES, REGISTRY
from tools.modelcheck.result import Result, Violation, format_result
from tools.modelcheck.search import check, check_profiles
from tools.modelcheck.trace import TraceStep, to_chart_steps

__all__ = [
    "PROFILES", "PROPERTIES", "REGISTRY", "Bounds", "Result", "TraceStep", "Violation", "chart_dot", "chart_steps",
    "check", "check_profiles", "format_result", "main", "to_chart_steps", "write_chart",
]
