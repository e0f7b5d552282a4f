"""kvtier's sans-I/O lifecycle core (stdlib + attrs only; no zmq, no torch, no clock).

Generated tables live in :mod:`kvtier.lifecycle._table` (from ``spec/lifecycle.toml``);
:class:`TierCore` applies them.
"""

from kvtier.lifecycle._table import (
    ConsumerState,
    ProducerState,
    Reason,
    SessionState,
)
from kvtier.lifecycle.consumer import LoadInput, MessageInput
from kvtier.lifecycle.core import CoreSettings, TierCore
from kvtier.lifecycle.errors import InvalidTransition, LifecycleError
from kvtier.lifecycle.producer import FetchInput, StoreInput
from kvtier.lifecycle.session import HelloInput

__all__ = [
    "ConsumerState",
    "CoreSettings",
    "FetchInput",
    "HelloInput",
    "InvalidTransition",
    "LifecycleError",
    "LoadInput",
    "MessageInput",
    "ProducerState",
    "Reason",
    "SessionState",
    "StoreInput",
    "TierCore",
]
