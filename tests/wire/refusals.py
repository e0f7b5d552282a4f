"""The wire codec's refusal codes, by the short names the codec tests use."""

from kvtier.wire import WireReason

BAD_FIELD = WireReason.BAD_FIELD.value
BAD_PAYLOAD = WireReason.BAD_PAYLOAD.value
MALFORMED = WireReason.MALFORMED.value
OVERSIZE = WireReason.OVERSIZE.value
UNKNOWN_TYPE = WireReason.UNKNOWN_TYPE.value
VERSION_MISMATCH = WireReason.VERSION_MISMATCH.value
