"""kvtier wire protocol: msgspec message types and the frame codec. Pure (no zmq, no torch).

See docs/protocol.md for the message table, framing, limits and reason codes.
"""

from kvtier.wire.codec import (
    DEFAULT_LIMITS,
    Decoder,
    WireReason,
    WireError,
    WireLimits,
    decode,
    encode,
    encode_frames,
)
from kvtier.wire.messages import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    AbortAck,
    AbortFetch,
    BlockData,
    Disconnect,
    Error,
    Fetch,
    Hello,
    HelloAck,
    HelloReject,
    Message,
    Ping,
    Pong,
    Probe,
    ProbeReply,
    Receipt,
    TransferDone,
)

__all__ = [
    "PROTOCOL_VERSION",
    "MESSAGE_TYPES",
    "Message",
    "Hello",
    "HelloAck",
    "HelloReject",
    "Fetch",
    "BlockData",
    "TransferDone",
    "AbortFetch",
    "AbortAck",
    "Receipt",
    "Probe",
    "ProbeReply",
    "Ping",
    "Pong",
    "Disconnect",
    "Error",
    "WireReason",
    "WireError",
    "WireLimits",
    "DEFAULT_LIMITS",
    "Decoder",
    "encode",
    "encode_frames",
    "decode",
]
