"""kvtier wire protocol: msgspec message types and the frame codec. Pure (no zmq, no torch).

See docs/protocol.md for the message table, framing, limits and reason codes.  Every message
class of :mod:`kvtier.wire.messages` is importable from here; a new one needs no edit here.
"""

from kvtier.wire import messages as _messages
from kvtier.wire.codec import (
    DEFAULT_LIMITS,
    Decoder,
    WireError,
    WireLimits,
    WireReason,
    decode,
    encode,
    encode_frames,
)
from kvtier.wire.messages import *  # noqa: F403 -- the messages' own __all__: every message class

__all__ = [
    *_messages.__all__,
    "WireReason",
    "WireError",
    "WireLimits",
    "DEFAULT_LIMITS",
    "Decoder",
    "encode",
    "encode_frames",
    "decode",
]
