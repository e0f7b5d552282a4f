"""kvtier's sans-I/O lifecycle core (stdlib, attrs and msgspec only; no zmq, no torch, no clock).

Generated tables live in :mod:`kvtier.lifecycle._table` (from ``spec/lifecycle.toml``);
:class:`TierCore` applies them.  The shell hands it :mod:`~kvtier.lifecycle.inputs` and performs
the :mod:`~kvtier.lifecycle.effects` it returns.
"""

from kvtier.lifecycle import effects, inputs
from kvtier.lifecycle._table import (
    REASON_DOCS,
    ConsumerState,
    ProbeState,
    ProducerState,
    Reason,
    ServeState,
    SessionState,
)
from kvtier.lifecycle.core import CoreSettings, TierCore
from kvtier.lifecycle.errors import InvalidTransition, LifecycleError
from kvtier.lifecycle.probe import Answer
from kvtier.lifecycle.session import HelloInput
from kvtier.lifecycle.views import (
    ConsumerView,
    CoreRecords,
    CoreSnapshot,
    DeadlineView,
    ProbeView,
    ProducerView,
    ServeView,
    SessionView,
)

__all__ = [
    "REASON_DOCS",
    "Answer",
    "ConsumerState",
    "ConsumerView",
    "CoreRecords",
    "CoreSettings",
    "CoreSnapshot",
    "DeadlineView",
    "HelloInput",
    "InvalidTransition",
    "LifecycleError",
    "ProbeState",
    "ProbeView",
    "ProducerState",
    "ProducerView",
    "Reason",
    "ServeState",
    "ServeView",
    "SessionState",
    "SessionView",
    "TierCore",
    "effects",
    "inputs",
]
