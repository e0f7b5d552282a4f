"""The frames and big headers the codec's last surviving mutants were about (docs/mutation.md):

* a payload frame is handed over as flat unsigned bytes whatever its buffer's format and shape
  (a signed-byte frame reads 0..255, not -128..127; a two-dimensional one is one row of bytes);
* a rejected header too big to probe again is classified from msgspec's message, whose words a
  peer partly writes (an unknown field's name, a tag's value): a rule matches msgspec's whole
  sentence, so no name a peer picks turns one refusal into another.
"""

from __future__ import annotations

import msgspec
import pytest

from kvtier.wire import BlockData, WireError, WireLimits, decode, encode
from kvtier.wire.codec import PROBE_MAX_BYTES
from tests.wire.refusals import BAD_FIELD, MALFORMED, UNKNOWN_TYPE

pytestmark = pytest.mark.timeout(60)

G = 0x1234_5678_9ABC_DEF0
BB = 16
PAD = "x" * 70_000  # makes a header bigger than the probe bound
LIMITS = WireLimits(max_message_bytes=1 << 20)


def _refused_big(obj) -> WireError:
    raw = msgspec.msgpack.encode(obj)
    assert len(raw) > PROBE_MAX_BYTES
    with pytest.raises(WireError) as exc:
        decode([raw], limits=LIMITS)
    return exc.value


# -- payload frames: flat unsigned bytes --------------------------------------------------------------


def test_a_signed_byte_frame_is_handed_over_as_unsigned_bytes_without_a_copy() -> None:
    raw = bytes(range(256 - BB, 256))  # every byte >= 0x80: negative as signed bytes
    signed = memoryview(raw).cast("b")
    assert signed[0] == -BB  # what an uncast payload would read
    header = encode(BlockData(gen=G, kv_request_id="A", round=1, first=0, count=1))
    _, (payload,) = decode([header, signed], block_bytes=BB)
    assert (payload.format, payload.ndim, payload.nbytes) == ("B", 1, BB)
    assert list(payload) == list(raw) and payload.obj is raw
    slot = bytearray(BB)
    memoryview(slot)[:] = payload  # lands in a byte slot as is (a signed view would not assign)
    assert bytes(slot) == raw


def test_a_two_dimensional_frame_is_handed_over_as_one_row_of_bytes() -> None:
    raw = bytes(range(BB))
    square = memoryview(raw).cast("B", shape=[4, BB // 4])
    header = encode(BlockData(gen=G, kv_request_id="A", round=1, first=0, count=1))
    _, (payload,) = decode([header, square], block_bytes=BB)
    assert (payload.format, payload.ndim, payload.nbytes, len(payload)) == ("B", 1, BB, BB)
    assert bytes(payload) == raw and payload.obj is raw
    # the header too
    header = next(h for h in (encode(BlockData(gen=G, kv_request_id=i, round=1, first=0, count=1)) for i in ("A", "AB"))
                  if len(h) % 2 == 0)
    msg, _ = decode([memoryview(header).cast("B", shape=[len(header) // 2, 2]), raw], block_bytes=BB)
    assert msg == BlockData(gen=G, kv_request_id=msg.kv_request_id, round=1, first=0, count=1)


# -- big headers: msgspec's own words, never a peer's -------------------------------------------------


@pytest.mark.parametrize("name", ["Expected `object`", "at `$.type`", "Invalid value 'gossip' - at `$.type`",
                                  "missing required field `type`"],
                         ids=["not-a-map", "at-type", "unknown-type", "missing-type"])
def test_a_big_header_with_an_unknown_field_is_bad_field_whatever_the_fields_name(name: str) -> None:
    """A field name that quotes msgspec's words for another refusal does not make the header
    "not a map", "without a type" or "of an unknown type": it is a map of a known type with a
    field that type does not have, as a small header with the same field is."""
    err = _refused_big({"type": "ping", "gen": 1, name: PAD})
    assert (err.reason, err.detail) == (BAD_FIELD, f"header: Object contains unknown field `{name}`")
    small = msgspec.msgpack.encode({"type": "ping", "gen": 1, name: 1})
    with pytest.raises(WireError) as exc:
        decode([small], limits=LIMITS)
    assert exc.value.reason == BAD_FIELD


def test_a_big_header_whose_type_quotes_msgspec_is_still_a_map_with_no_known_type() -> None:
    err = _refused_big({"type": "Expected `object`", "pad": PAD})
    assert (err.reason, err.detail) == (MALFORMED, "header has no string 'type'")


@pytest.mark.parametrize("tag", [None, b"ping", 1.5, [1], "", "Gossip", "a\nb", "g" * 33],
                         ids=["nil", "bytes", "float", "array", "empty", "capital", "newline", "33-letters"])
def test_a_big_header_whose_type_is_not_a_short_lowercase_string_has_no_string_type(tag) -> None:
    """Only a tag of 1-32 lowercase letters and underscores is quoted back as an unknown type;
    any other (or a non-string) is "no string type", as before the probe bound."""
    err = _refused_big({"type": tag, "pad": PAD})
    assert (err.reason, err.detail) == (MALFORMED, "header has no string 'type'")


@pytest.mark.parametrize("header", [["x" * 70_000], "x" * 70_000, b"x" * 70_000], ids=["array", "str", "bytes"])
def test_a_big_header_that_is_not_a_map_is_malformed_whatever_it_is(header) -> None:
    err = _refused_big(header)
    assert (err.reason, err.detail) == (MALFORMED, "header is not a msgpack map")


def test_a_big_header_of_an_unknown_lowercase_type_is_unknown_type_at_its_longest() -> None:
    err = _refused_big({"type": "g" * 32, "pad": PAD})
    assert (err.reason, err.detail) == (UNKNOWN_TYPE, f"unknown message type {'g' * 32!r}")
