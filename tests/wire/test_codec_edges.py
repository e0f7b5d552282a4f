"""The codec at its edges: every limit exactly at and one past its bound, every refusal's reason,
field, request id, generation and wording, and the header classifications a big rejected header
gets from the decoder's text alone (docs/mutation.md: each test here kills mutants that
``test_codec.py`` let live)."""

from __future__ import annotations

import msgspec
import pytest

from kvtier.wire import (
    BlockData,
    Decoder,
    Fetch,
    Receipt,
    WireError,
    WireLimits,
    WireReason,
    decode,
    encode,
    encode_frames,
)
from kvtier.wire.messages import MAX_ID_CHARS

from tests.wire.refusals import BAD_FIELD, BAD_PAYLOAD, MALFORMED, OVERSIZE, UNKNOWN_TYPE

pytestmark = pytest.mark.timeout(60)

G = 0x1234_5678_9ABC_DEF0
BB = 16


def _refused(frames, **kw) -> WireError:
    with pytest.raises(WireError) as exc:
        decode(frames, **kw)
    return exc.value


# -- limits: exactly at the bound passes, one past it is refused ---------------------------------


@pytest.mark.parametrize("key", ["max_message_bytes", "max_blocks_per_fetch"])
def test_limits_accept_one_and_refuse_zero_naming_the_key(key: str) -> None:
    assert getattr(WireLimits(**{key: 1}), key) == 1
    for bad in (0, -1, True, 1.0, "2"):
        with pytest.raises(ValueError, match=rf"^{key} must be an int >= 1, got {bad!r}$"):
            WireLimits(**{key: bad})


def test_header_exactly_at_max_message_bytes_decodes_and_one_more_byte_is_oversize() -> None:
    header = encode(Receipt(gen=G, kv_request_id="r", round=1))
    msg, _ = decode([header], limits=WireLimits(max_message_bytes=len(header)))
    assert msg == Receipt(gen=G, kv_request_id="r", round=1)
    err = _refused([header], limits=WireLimits(max_message_bytes=len(header) - 1))
    assert err.reason == OVERSIZE
    assert err.detail == f"header is {len(header)} bytes > max_message_bytes {len(header) - 1}"


def test_fetch_keys_exactly_at_the_cap_pass_and_one_more_is_oversize_naming_the_request() -> None:
    limits = WireLimits(max_blocks_per_fetch=3)
    at = Fetch(gen=G, kv_request_id="A", round=1, keys=[b"a", b"b", b"c"])
    assert decode([encode(at)], limits=limits)[0] == at
    over = Fetch(gen=G, kv_request_id="A", round=1, keys=[b"a", b"b", b"c", b"d"])
    err = _refused([encode(over)], limits=limits)
    assert (err.reason, err.kv_request_id, err.msg_type, err.field, err.gen) == (OVERSIZE, "A", "fetch", "keys", G)


def test_block_data_first_plus_count_exactly_at_the_cap_passes() -> None:
    limits = WireLimits(max_blocks_per_fetch=4)
    at = BlockData(gen=G, kv_request_id="A", round=1, first=1, count=3)
    assert decode([encode(at)], limits=limits, block_bytes=BB)[0] == at
    err = _refused([encode(BlockData(gen=G, kv_request_id="A", round=1, first=2, count=3))], limits=limits,
                   block_bytes=BB)
    assert (err.reason, err.field, err.kv_request_id, err.msg_type, err.gen) == (OVERSIZE, "count", "A", "block_data", G)
    assert err.detail == "block_data first+count=5 > max_blocks_per_fetch 4"


# -- kv_request_id length: 1 and MAX_ID_CHARS are ids an error reply may name ------------------


@pytest.mark.parametrize("length", [1, MAX_ID_CHARS])
def test_a_refused_message_names_an_id_of_the_shortest_and_longest_valid_length(length: int) -> None:
    rid = "k" * length
    raw = msgspec.msgpack.encode({"type": "receipt", "gen": G, "kv_request_id": rid, "round": -1})
    err = _refused([raw])
    assert (err.reason, err.kv_request_id, err.msg_type, err.field, err.gen) == (BAD_FIELD, rid, "receipt", "round", G)


def test_an_id_one_past_the_longest_is_not_named() -> None:
    raw = msgspec.msgpack.encode({"type": "receipt", "gen": G, "kv_request_id": "k" * (MAX_ID_CHARS + 1), "round": 1})
    err = _refused([raw])
    assert err.reason == BAD_FIELD and err.kv_request_id == ""


def test_an_unknown_type_names_the_request_and_generation() -> None:
    raw = msgspec.msgpack.encode({"type": "gossip", "gen": G, "kv_request_id": "A"})
    err = _refused([raw])
    assert (err.reason, err.kv_request_id, err.gen, err.msg_type) == (UNKNOWN_TYPE, "A", G, "")
    assert err.detail == "unknown message type 'gossip'"


# -- payload refusals say which message and request ------------------------------------------------


def test_payloads_on_a_message_that_carries_none_are_refused_naming_it() -> None:
    err = _refused([encode(Receipt(gen=G, kv_request_id="A", round=2)), b"x" * BB], block_bytes=BB)
    assert (err.reason, err.kv_request_id, err.msg_type, err.gen) == (BAD_PAYLOAD, "A", "receipt", G)
    assert err.detail == "receipt carries no payloads, got 1 frames"


def test_payloads_on_a_message_without_an_id_name_no_request() -> None:
    from kvtier.wire import Ping

    err = _refused([encode(Ping(gen=G, t=1.0)), b"x"], block_bytes=BB)
    assert (err.reason, err.kv_request_id, err.msg_type, err.gen) == (BAD_PAYLOAD, "", "ping", G)


def test_block_data_refusals_name_the_request_and_generation() -> None:
    bd = BlockData(gen=G, kv_request_id="A", round=1, first=0, count=2)
    cases = [
        ({}, [b"x" * BB] * 2, "this side does not accept block_data"),
        ({"block_bytes": BB}, [b"x" * BB], "block_data count=2 but 1 payload frames"),
        ({"block_bytes": BB}, [b"x" * BB, b"x" * (BB - 1)], f"payload 1 is {BB - 1} bytes, block_bytes is {BB}"),
    ]
    for kw, payloads, detail in cases:
        err = _refused([encode(bd), *payloads], **kw)
        assert (err.reason, err.kv_request_id, err.msg_type, err.gen, err.detail) == (
            BAD_PAYLOAD, "A", "block_data", G, detail)


# -- encoding refusals say what was wrong -------------------------------------------------------


def test_encode_refuses_a_non_message_naming_its_type() -> None:
    with pytest.raises(TypeError, match=r"^not a kvtier wire message: dict$"):
        encode({"type": "receipt"})  # type: ignore[arg-type]


def test_encode_frames_refuses_a_payload_count_that_does_not_match() -> None:
    bd = BlockData(gen=G, kv_request_id="A", round=1, first=0, count=2)
    with pytest.raises(ValueError, match=r"^block_data count=2 but 1 payloads given$"):
        encode_frames(bd, [b"x"])
    with pytest.raises(ValueError, match=r"^receipt carries no payloads, got 1$"):
        encode_frames(Receipt(gen=G, kv_request_id="A", round=1), [b"x"])
    assert len(encode_frames(bd)) == 1  # none: a one-sided plane writes the blocks


# -- a rejected header larger than the probe bound is classified from the decoder's text ------------


def _big(obj) -> bytes:
    from kvtier.wire.codec import PROBE_MAX_BYTES

    raw = msgspec.msgpack.encode(obj)
    assert len(raw) > PROBE_MAX_BYTES
    return raw


def test_a_big_header_that_is_not_a_map_is_malformed() -> None:
    err = _refused([_big(["x" * 70_000])], limits=WireLimits(max_message_bytes=1 << 20))
    assert (err.reason, err.detail) == (MALFORMED, "header is not a msgpack map")


def test_a_big_header_without_a_string_type_is_malformed() -> None:
    for obj in ({"pad": "x" * 70_000}, {"type": 5, "pad": "x" * 70_000}):
        err = _refused([_big(obj)], limits=WireLimits(max_message_bytes=1 << 20))
        assert (err.reason, err.detail) == (MALFORMED, "header has no string 'type'"), obj


def test_a_big_header_of_an_unknown_type_is_unknown_type() -> None:
    err = _refused([_big({"type": "gossip", "pad": "x" * 70_000})], limits=WireLimits(max_message_bytes=1 << 20))
    assert (err.reason, err.detail) == (UNKNOWN_TYPE, "unknown message type 'gossip'")


def test_a_big_known_header_with_a_bad_field_is_bad_field() -> None:
    keys = [b"k" * 64] * 1200
    raw = _big({"type": "fetch", "gen": G, "kv_request_id": "A", "round": -1, "keys": keys})
    err = _refused([raw], limits=WireLimits(max_message_bytes=1 << 20))
    assert err.reason == BAD_FIELD and err.detail.startswith("header: ")


def test_decoder_refuses_a_bad_block_bytes_argument() -> None:
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match=r"block_bytes must be None or an int >= 1"):
            Decoder(block_bytes=bad)  # type: ignore[arg-type]
    assert Decoder(block_bytes=1).block_bytes == 1


# -- which field a refusal names ------------------------------------------------------------------


def test_a_rule_across_fields_names_no_single_field() -> None:
    """A notice that says ok breaks a rule of two fields: ``bad_field``, no field named, but the
    request and generation are."""
    raw = msgspec.msgpack.encode({"type": "transfer_done", "gen": G, "kv_request_id": "A", "round": 1, "ok": True,
                                  "reason": "", "final": False})
    err = _refused([raw])
    assert (err.reason, err.field, err.kv_request_id, err.msg_type, err.gen) == (BAD_FIELD, "", "A", "transfer_done", G)


def test_a_rule_on_one_field_names_it_from_its_message() -> None:
    raw = msgspec.msgpack.encode({"type": "fetch", "gen": G, "kv_request_id": "A", "round": 1, "keys": [b"k", b"k"]})
    err = _refused([raw])
    assert (err.reason, err.field, err.kv_request_id) == (BAD_FIELD, "keys", "A")


# -- frames: any contiguous buffer, a zmq.Frame-like ``.buffer``, nothing else --------------------


class _FrameLike:
    """What a zmq.Frame offers the codec: no buffer protocol of its own, a ``buffer`` memoryview."""

    def __init__(self, data: bytes) -> None:
        self.buffer = memoryview(data)


def test_frames_are_read_through_any_contiguous_buffer_without_a_copy() -> None:
    import array

    bd = BlockData(gen=G, kv_request_id="A", round=1, first=0, count=2)
    header = encode(bd)
    payload = array.array("H", range(BB // 2))  # a 2-byte format: handed over as flat bytes
    for frames in ([header, b"x" * BB, payload], [bytearray(header), _FrameLike(b"y" * BB), memoryview(payload)],
                   [_FrameLike(header), memoryview(b"z" * BB), payload]):
        msg, payloads = decode(frames, block_bytes=BB)
        assert msg == bd
        assert [(p.format, p.ndim, p.nbytes) for p in payloads] == [("B", 1, BB)] * 2
    _, payloads = decode([header, b"x" * BB, payload], block_bytes=BB)
    assert payloads[1].obj is payload  # an alias of the caller's buffer, not a copy


@pytest.mark.parametrize("index", [0, 2])
def test_a_frame_that_is_no_buffer_is_malformed_naming_it(index: int) -> None:
    frames: list = [encode(BlockData(gen=G, kv_request_id="A", round=1, first=0, count=2)), b"x" * BB, b"x" * BB]
    frames[index] = object()
    err = _refused(frames, block_bytes=BB)
    assert (err.reason, err.detail) == (MALFORMED, f"frame {index} is not a buffer (object)")
    frames[index] = _FrameLike(b"")
    frames[index].buffer = b"not a memoryview"
    err = _refused(frames, block_bytes=BB)
    assert (err.reason, err.detail) == (MALFORMED, f"frame {index} is not a buffer (_FrameLike)")


def test_a_strided_frame_is_malformed_naming_it() -> None:
    header = encode(BlockData(gen=G, kv_request_id="A", round=1, first=0, count=1))
    strided = memoryview(b"x" * (2 * BB))[::2]
    err = _refused([header, strided], block_bytes=BB)
    assert (err.reason, err.detail) == (MALFORMED, "frame 1 is not contiguous")


def test_a_small_header_that_is_no_map_or_has_no_string_type_says_which() -> None:
    """The refusal's text is what the peer is told (``Error.detail``): it says what was wrong."""
    err = _refused([msgspec.msgpack.encode([1, 2])])
    assert (err.reason, err.detail) == (MALFORMED, "header is not a msgpack map with string keys")
    for obj in ({"gen": G}, {"type": 7, "gen": G}):
        err = _refused([msgspec.msgpack.encode(obj)])
        assert (err.reason, err.detail) == (MALFORMED, "header has no string 'type'"), obj
    err = _refused([b"\xc1"])  # a byte msgpack never uses
    assert err.reason == MALFORMED and err.detail.startswith("not msgpack: ")


def test_frame_lists_that_are_not_lists_of_frames_say_so() -> None:
    for frames, detail in ((b"\x80", "frames must be a list of frames, not one buffer"), ([], "no frames")):
        err = _refused(frames)
        assert (err.reason, err.detail, str(err)) == (MALFORMED, detail, f"malformed: {detail}")
        assert (err.kv_request_id, err.field, err.theirs, err.msg_type, err.gen) == ("", "", "", "", None)


def test_whatever_goes_wrong_inside_decode_comes_out_as_a_wire_error() -> None:
    def frames():
        yield encode(Receipt(gen=G, kv_request_id="A", round=1))
        raise RuntimeError("the socket went away")

    err = _refused(frames())
    assert (err.reason, err.detail) == (MALFORMED, "undecodable: RuntimeError: the socket went away")


def test_a_refusal_names_the_generation_from_0_to_below_2_63() -> None:
    from kvtier.wire.messages import MAX_U63

    for gen, named in ((0, 0), (1, 1), (MAX_U63 - 1, MAX_U63 - 1), (MAX_U63, None), (-1, None)):
        raw = msgspec.msgpack.encode({"type": "receipt", "gen": gen, "kv_request_id": "A", "round": -1})
        assert _refused([raw]).gen == named, gen


def test_a_hello_of_another_version_is_version_mismatch_naming_theirs() -> None:
    from kvtier.wire import WireReason

    VERSION_MISMATCH = WireReason.VERSION_MISMATCH

    for version, theirs in ((999, "999"), ("1", "1"), ("v" * 40, "v" * 32)):
        raw = msgspec.msgpack.encode({"type": "hello", "gen": G, "version": version})
        err = _refused([raw])
        assert (err.reason, err.msg_type, err.field, err.theirs, err.gen) == (
            VERSION_MISMATCH, "hello", "version", theirs, G), version
        assert err.detail.startswith(f"peer protocol version {theirs}, ours ")


def test_a_header_exactly_at_the_probe_bound_is_still_probed_for_its_request() -> None:
    from kvtier.wire.codec import PROBE_MAX_BYTES

    base = {"type": "receipt", "gen": G, "kv_request_id": "A", "round": -1, "pad": ""}
    pad = PROBE_MAX_BYTES - len(msgspec.msgpack.encode(base))
    raw = msgspec.msgpack.encode({**base, "pad": "x" * pad})
    raw = msgspec.msgpack.encode({**base, "pad": "x" * (pad - (len(raw) - PROBE_MAX_BYTES))})
    assert len(raw) == PROBE_MAX_BYTES
    err = _refused([raw], limits=WireLimits(max_message_bytes=1 << 20))
    assert (err.reason, err.kv_request_id, err.gen) == (BAD_FIELD, "A", G)


def test_a_decoder_refuses_limits_of_another_type_naming_it() -> None:
    with pytest.raises(TypeError, match=r"^limits must be WireLimits, got dict$"):
        Decoder(limits={"max_message_bytes": 1})  # type: ignore[arg-type]


def test_a_hello_of_our_version_with_a_bad_field_is_bad_field() -> None:
    from kvtier.wire import PROTOCOL_VERSION

    raw = msgspec.msgpack.encode({"type": "hello", "gen": G, "version": PROTOCOL_VERSION, "block_bytes": 0})
    err = _refused([raw])
    assert (err.reason, err.msg_type, err.gen, err.theirs) == (BAD_FIELD, "hello", G, "")


def test_an_unknown_type_is_named_up_to_64_characters() -> None:
    err = _refused([msgspec.msgpack.encode({"type": "g" * 70})])
    assert (err.reason, err.detail) == (UNKNOWN_TYPE, f"unknown message type {'g' * 64!r}")
