"""Wire codec: round trips, every validation rule, and fuzzing (decode raises only WireError)."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.wire import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    AbortAck,
    AbortFetch,
    BlockData,
    Decoder,
    Disconnect,
    Error,
    Fetch,
    Hello,
    HelloAck,
    HelloReject,
    Ping,
    Pong,
    Probe,
    ProbeReply,
    Receipt,
    TransferDone,
    WireError,
    WireLimits,
    WireReason,
    decode,
    encode,
    encode_frames,
)

from tests.wire.refusals import BAD_FIELD, BAD_PAYLOAD, MALFORMED, OVERSIZE, UNKNOWN_TYPE, VERSION_MISMATCH

pytestmark = pytest.mark.timeout(60)

BB = 16  # block_bytes used by these tests
G = 0x1234_5678_9ABC_DEF0  # a generation nonce (fits in 63 bits)

SAMPLES = [
    Hello(gen=G, version=PROTOCOL_VERSION, instance="prefill-0", block_bytes=BB, layout="L32.bf16",
          hash_seed="seed"),
    HelloAck(gen=G, instance="decode-1"),
    HelloReject(gen=G, reason="layout_mismatch", field="block_bytes", ours="16", theirs="32"),
    Fetch(gen=G, kv_request_id="req-1:a/b@c+d=e_f.g", round=3, keys=[b"\x00" * 32, b"k2", b"\xff"]),
    BlockData(gen=G, kv_request_id="req-1", round=3, first=1, count=2),
    BlockData(gen=G, kv_request_id="req-1", round=3, first=2, count=2, digests=[0, 2**64 - 1]),
    Fetch(gen=G, kv_request_id="req-2", round=5, keys=[b"a", b"b"], slots=[7, 3]),
    Receipt(gen=G, kv_request_id="req-1", round=3),
    AbortFetch(gen=G, kv_request_id="req-1", round=4, fetched=False),
    TransferDone(gen=G, kv_request_id="req-1", round=3, ok=True, reason=""),
    TransferDone(gen=G, kv_request_id="req-1", round=4, ok=False, reason="reaped"),
    AbortFetch(gen=G, kv_request_id="req-1", round=3),
    AbortAck(gen=G, kv_request_id="req-1", round=3),
    Ping(gen=G, t=12.5),
    Pong(gen=G, t=12.5),
    Disconnect(gen=G, reason="shutdown"),
    Error(gen=G, reason=MALFORMED, detail="bad", kv_request_id=""),
    Error(gen=G, reason=BAD_FIELD, detail="x", kv_request_id="req-9"),
    Probe(gen=G, kv_request_id="sym-1", round=7, keys=[b"\x01" * 36, b"\x02" * 36]),
    ProbeReply(gen=G, kv_request_id="sym-1", round=7, keys=[b"\x01" * 36, b"\x02" * 36], hits=[True, False]),
    Fetch(gen=G, kv_request_id="sym-1", round=7, keys=[b"\x01" * 36], offered=True),
    AbortFetch(gen=G, kv_request_id="sym-1", round=7, fetched=False, offered=True),
]


def frames_of(msg, payloads=None):
    if payloads is None:
        payloads = [bytes([i]) * BB for i in range(msg.count)] if isinstance(msg, BlockData) else []
    return encode_frames(msg, payloads)


def wire_error(frames, **kw) -> WireError:
    with pytest.raises(WireError) as ei:
        decode(frames, **kw)
    assert ei.value.reason in set(WireReason)
    return ei.value


def raw(**fields) -> bytes:
    """Encode an arbitrary map, bypassing the Struct checks (what a buggy peer could send)."""
    return msgspec.msgpack.encode(fields)


def fetch_map(**over):
    m = {"type": "fetch", "gen": 1, "kv_request_id": "r1", "round": 0, "keys": [b"a", b"b"]}
    m.update(over)
    return m


# -- round trips ----------------------------------------------------------------------------------


def test_every_message_type_has_a_sample() -> None:
    assert {type(m).TYPE for m in SAMPLES} == set(MESSAGE_TYPES)
    for tag, cls in MESSAGE_TYPES.items():
        assert cls.__struct_config__.tag == tag


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).TYPE)
def test_round_trip(msg) -> None:
    frames = frames_of(msg)
    got, payloads = decode(frames, block_bytes=BB)
    assert got == msg and type(got) is type(msg)
    assert [bytes(p) for p in payloads] == [bytes(f) for f in frames[1:]]
    # Also from memoryviews and bytearrays (what the transport hands over).
    got2, _ = decode([memoryview(f) for f in frames], block_bytes=BB)
    got3, _ = decode([bytearray(f) for f in frames], block_bytes=BB)
    assert got2 == msg == got3


def test_header_is_a_tagged_msgpack_map() -> None:
    m = msgspec.msgpack.decode(encode(SAMPLES[3]))
    assert m["type"] == "fetch" and m["gen"] == G and m["keys"][0] == b"\x00" * 32


def test_payloads_are_zero_copy_views() -> None:
    msg = BlockData(gen=1, kv_request_id="r", round=0, first=0, count=1)
    payload = bytearray(BB)
    _, [p] = decode([encode(msg), payload], block_bytes=BB)
    payload[0] = 0x7F
    assert p[0] == 0x7F


def test_decoder_object_reuse() -> None:
    d = Decoder(block_bytes=BB, limits=WireLimits(max_blocks_per_fetch=4))
    for msg in SAMPLES:
        assert d.decode(frames_of(msg))[0] == msg


def test_gen_extremes_round_trip() -> None:
    for gen in (0, 2**63 - 1):
        assert decode([encode(Ping(gen=gen, t=0.0))])[0].gen == gen


def test_encode_refuses_foreign_objects_and_bad_payload_counts() -> None:
    with pytest.raises(TypeError):
        encode({"type": "ping"})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_frames(BlockData(gen=1, kv_request_id="r", round=0, first=0, count=2), [b"x"])
    with pytest.raises(ValueError):
        encode_frames(Ping(gen=1, t=0.0), [b"x"])


# -- construction validates too -------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: Ping(gen=-1, t=0.0),
        lambda: Ping(gen=2**63, t=0.0),
        lambda: Ping(gen=True, t=0.0),
        lambda: Ping(gen=1, t=math.inf),
        lambda: Ping(gen=1, t=math.nan),
        lambda: Ping(gen=1, t=True),
        lambda: Fetch(gen=1, kv_request_id="r", round=0, keys=[b"a", b"a"]),
        lambda: Fetch(gen=1, kv_request_id="", round=0, keys=[b"a"]),
        lambda: Fetch(gen=1, kv_request_id="a b", round=0, keys=[b"a"]),
        lambda: Fetch(gen=1, kv_request_id="r", round=0, keys=["a"]),
        lambda: TransferDone(gen=1, kv_request_id="r", round=0, ok=1, reason=""),
        lambda: BlockData(gen=1, kv_request_id="r", round=0, first=0, count=0),
        lambda: Hello(gen=1, version=PROTOCOL_VERSION + 1, instance="x", block_bytes=1, layout="", hash_seed=""),
        lambda: Hello(gen=1, version=PROTOCOL_VERSION, instance="x", block_bytes=0, layout="", hash_seed=""),
        lambda: Hello(gen=1, version=PROTOCOL_VERSION, instance="x", block_bytes=1, layout="", hash_seed="",
                      descriptor=b"x" * 65537),
        lambda: BlockData(gen=1, kv_request_id="r", round=0, first=0, count=2, digests=[1]),
        lambda: BlockData(gen=1, kv_request_id="r", round=0, first=0, count=1, digests=[2**64]),
        lambda: Fetch(gen=1, kv_request_id="r", round=0, keys=[b"a", b"b"], slots=[1]),
        lambda: Fetch(gen=1, kv_request_id="r", round=0, keys=[b"a"], slots=[-1]),
        lambda: AbortFetch(gen=1, kv_request_id="r", round=0, fetched=1),
        lambda: Error(gen=1, reason="", detail="", kv_request_id=""),
        lambda: Probe(gen=1, kv_request_id="r", round=0, keys=[]),
        lambda: Probe(gen=1, kv_request_id="r", round=0, keys=[b"a", b"a"]),
        lambda: ProbeReply(gen=1, kv_request_id="r", round=0, keys=[b"a", b"b"], hits=[True]),
        lambda: ProbeReply(gen=1, kv_request_id="r", round=0, keys=[b"a"], hits=[1]),
        lambda: Fetch(gen=1, kv_request_id="r", round=0, keys=[b"a"], offered=1),
        lambda: AbortFetch(gen=1, kv_request_id="r", round=0, offered="yes"),
    ],
)
def test_constructor_rejects(make) -> None:
    with pytest.raises((ValueError, TypeError)):
        make()


def test_messages_are_frozen() -> None:
    with pytest.raises(AttributeError):
        SAMPLES[1].gen = 5  # type: ignore[misc]


# -- decode validation, one rule at a time --------------------------------------------------------


def test_duplicate_keys() -> None:
    e = wire_error([raw(**fetch_map(keys=[b"a", b"b", b"a"]))])
    assert e.reason == BAD_FIELD and e.field == "keys" and "duplicates" in e.detail
    assert e.kv_request_id == "r1" and e.msg_type == "fetch" and e.gen == 1


@pytest.mark.parametrize("keys", [[b""], [b"x" * 257], ["str"], [1], b"notalist"])
def test_bad_keys(keys) -> None:
    e = wire_error([raw(**fetch_map(keys=keys))])
    assert e.reason == BAD_FIELD and e.field == "keys"


def test_key_of_256_bytes_is_fine() -> None:
    msg, _ = decode([raw(**fetch_map(keys=[b"x" * 256]))])
    assert msg.keys == [b"x" * 256]


def test_too_many_keys() -> None:
    keys = [i.to_bytes(4, "big") for i in range(5)]
    limits = WireLimits(max_blocks_per_fetch=4)
    e = wire_error([raw(**fetch_map(keys=keys))], limits=limits)
    assert e.reason == OVERSIZE and e.kv_request_id == "r1"
    decode([raw(**fetch_map(keys=keys[:4]))], limits=limits)  # at the limit is fine


def test_block_data_beyond_fetch_limit() -> None:
    msg = BlockData(gen=1, kv_request_id="r", round=0, first=3, count=2)
    e = wire_error(frames_of(msg), block_bytes=BB, limits=WireLimits(max_blocks_per_fetch=4))
    assert e.reason == OVERSIZE


def test_oversize_header_rejected_before_decoding() -> None:
    limits = WireLimits(max_message_bytes=64)
    e = wire_error([b"\xc1" * 65], limits=limits)  # not even msgpack: size wins
    assert e.reason == OVERSIZE
    big = raw(**fetch_map(keys=[bytes([i]) * 8 for i in range(10)]))
    assert len(big) > 64
    e = wire_error([big], limits=limits)
    # only its id and generation are read, so the reply names the load its sender must fail (I36)
    assert (e.reason, e.kv_request_id, e.gen) == (OVERSIZE, "r1", fetch_map()["gen"])
    assert decode([big])[0].TYPE == "fetch"  # the default limit (1 MiB) accepts it


def test_wrong_payload_count() -> None:
    hdr = encode(BlockData(gen=1, kv_request_id="r", round=0, first=0, count=2))
    for payloads in ([bytes(BB)], [bytes(BB)] * 3):
        e = wire_error([hdr, *payloads], block_bytes=BB)
        assert e.reason == BAD_PAYLOAD and e.kv_request_id == "r" and e.gen == 1
    # none at all: a one-sided plane wrote the blocks; the data plane that lands them decides
    assert decode([hdr], block_bytes=BB)[1] == []


def test_wrong_payload_size() -> None:
    hdr = encode(BlockData(gen=1, kv_request_id="r", round=0, first=0, count=2))
    for bad in (bytes(BB - 1), bytes(BB + 1), b""):
        assert wire_error([hdr, bytes(BB), bad], block_bytes=BB).reason == BAD_PAYLOAD


def test_block_data_needs_configured_block_bytes() -> None:
    hdr = encode(BlockData(gen=1, kv_request_id="r", round=0, first=0, count=1))
    assert wire_error([hdr, bytes(BB)]).reason == BAD_PAYLOAD


def test_payload_on_non_block_message() -> None:
    e = wire_error([encode(SAMPLES[3]), b"junk"], block_bytes=BB)
    assert e.reason == BAD_PAYLOAD and e.kv_request_id == "req-1:a/b@c+d=e_f.g"


@pytest.mark.parametrize(
    "field, value",
    [
        ("gen", True),
        ("gen", -1),
        ("gen", 2**63),
        ("gen", 2**64 - 1),
        ("gen", 1.0),
        ("gen", "1"),
        ("round", False),
        ("round", None),
    ],
)
def test_bad_int_fields(field, value) -> None:
    e = wire_error([raw(**fetch_map(**{field: value}))])
    assert e.reason == BAD_FIELD and e.field == field


def test_bool_fields_are_strict() -> None:
    base = {"type": "transfer_done", "gen": 1, "kv_request_id": "r", "round": 0, "reason": ""}
    for v in (1, 0, "true", None):
        e = wire_error([raw(**base, ok=v)])
        assert e.reason == BAD_FIELD and e.field == "ok"
    assert decode([raw(**base, ok=False)])[0].ok is False


@pytest.mark.parametrize("t", [True, "1", None, float("inf"), float("-inf"), float("nan")])
def test_bad_float(t) -> None:
    e = wire_error([raw(type="ping", gen=1, t=t)])
    assert e.reason == BAD_FIELD and e.field == "t"


@pytest.mark.parametrize(
    "rid",
    ["", "a b", "a\nb", "ä", "a;b", "a*", "x" * 257, "é" * 10, 5, None, b"bytes"],
)
def test_bad_kv_request_id(rid) -> None:
    e = wire_error([raw(**fetch_map(kv_request_id=rid))])
    assert e.reason == BAD_FIELD and e.field == "kv_request_id"
    assert e.kv_request_id == ""  # never echo an invalid id


def test_kv_request_id_limits() -> None:
    ok = "A-z0.9_:/@+=" + "x" * 244  # exactly 256 chars of every allowed class
    assert len(ok) == 256
    assert decode([raw(**fetch_map(kv_request_id=ok))])[0].kv_request_id == ok


def test_unknown_field() -> None:
    e = wire_error([raw(**fetch_map(extra=1))])
    assert e.reason == BAD_FIELD and e.field == "extra"


def test_missing_field() -> None:
    m = fetch_map()
    del m["round"]
    e = wire_error([raw(**m)])
    assert e.reason == BAD_FIELD and e.field == "round"


def test_unknown_type() -> None:
    e = wire_error([raw(type="teleport", gen=1, kv_request_id="r7")])
    assert e.reason == UNKNOWN_TYPE and e.kv_request_id == "r7" and e.gen == 1
    assert wire_error([raw(type="teleport", gen=-5)]).gen is None


@pytest.mark.parametrize(
    "header",
    [
        b"",
        b"\xc1",
        raw(gen=1),  # no type
        raw(type=7, gen=1),  # type not a string
        msgspec.msgpack.encode([1, 2, 3]),
        msgspec.msgpack.encode("fetch"),
        raw(type="ping", gen=1, t=1.0) + b"\x00",  # trailing bytes
    ],
)
def test_malformed(header) -> None:
    assert wire_error([header]).reason == MALFORMED


@pytest.mark.parametrize("frames", [[], b"abc", "abc", [object()], [12], [None]])
def test_malformed_frame_lists(frames) -> None:
    assert wire_error(frames).reason == MALFORMED


def test_version_mismatch() -> None:
    hello = dict(type="hello", gen=1, version=PROTOCOL_VERSION + 1, instance="x", block_bytes=16, layout="",
                 hash_seed="")
    e = wire_error([raw(**hello)])
    assert e.reason == VERSION_MISMATCH and e.theirs == str(PROTOCOL_VERSION + 1) and e.field == "version"
    assert e.gen == 1  # so the producer can answer with hello_reject under the peer's gen
    # A future hello with fields we do not know still reports the version, not the field.
    e = wire_error([raw(**hello, features=["x"])])
    assert e.reason == VERSION_MISMATCH
    for v in (0, 1, True, "1", None):
        assert wire_error([raw(**{**hello, "version": v})]).reason == VERSION_MISMATCH
    hello["version"] = PROTOCOL_VERSION
    assert decode([raw(**hello)])[0].version == PROTOCOL_VERSION


def test_text_length_bounds() -> None:
    e = wire_error([raw(type="disconnect", gen=1, reason="r" * 257)])
    assert e.reason == BAD_FIELD and e.field == "reason"
    e = wire_error([raw(type="error", gen=1, reason="x", detail="d" * 4097, kv_request_id="")])
    assert e.reason == BAD_FIELD and e.field == "detail"


def test_wire_error_detail_is_bounded() -> None:
    assert len(WireError(MALFORMED, "x" * 10_000).detail) == 512


def test_limits_record_is_frozen_and_validated() -> None:
    lim = WireLimits()
    assert (lim.max_message_bytes, lim.max_blocks_per_fetch) == (1 << 20, 65536)
    with pytest.raises(AttributeError):
        lim.max_message_bytes = 1  # type: ignore[misc]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            WireLimits(max_message_bytes=bad)
    with pytest.raises(ValueError):
        Decoder(block_bytes=0)
    with pytest.raises(ValueError):
        decode([encode(SAMPLES[1])], block_bytes=True)


def test_no_pickle_anywhere() -> None:
    import pathlib
    import re

    import kvtier.wire

    forbidden = re.compile(r"^\s*(import|from)\s+(c?pickle|cloudpickle|marshal|dill)\b", re.M)
    for path in pathlib.Path(kvtier.wire.__file__).parent.glob("*.py"):
        assert not forbidden.search(path.read_text()), path


# -- fuzz -----------------------------------------------------------------------------------------

# No derandomize here: the suite's Hypothesis profile decides. Any failure is a real bug, since
# "decode raises only WireError" must hold for every input.
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode_only_wire_errors(frames, **kw) -> None:
    try:
        msg, payloads = decode(frames, **kw)
    except WireError as e:
        assert e.reason in set(WireReason)
        assert isinstance(e.detail, str) and len(e.detail) <= 512
    else:
        assert type(msg).TYPE in MESSAGE_TYPES
        assert all(isinstance(p, memoryview) for p in payloads)


@FUZZ
@given(st.lists(st.binary(max_size=256), min_size=0, max_size=4))
def test_fuzz_random_frames(frames) -> None:
    decode_only_wire_errors(frames, block_bytes=BB)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


@FUZZ
@given(
    st.sampled_from(SAMPLES),
    st.dictionaries(
        st.sampled_from(
            ["type", "gen", "kv_request_id", "round", "keys", "first", "count", "ok", "reason",
             "t", "version", "instance", "block_bytes", "layout", "hash_seed", "detail", "field",
             "ours", "theirs", "extra"]
        )
        | st.text(max_size=8),
        msgpack_values | st.sampled_from(list(MESSAGE_TYPES)),
        max_size=3,
    ),
    st.sets(st.text(max_size=12), max_size=2),
    st.lists(st.binary(max_size=2 * BB), max_size=3),
)
def test_fuzz_field_mutations(msg, overrides, deletions, payloads) -> None:
    m = msgspec.msgpack.decode(msgspec.msgpack.encode(msg))
    m.update(overrides)
    for k in deletions:
        m.pop(k, None)
    decode_only_wire_errors([msgspec.msgpack.encode(m), *payloads], block_bytes=BB)


@FUZZ
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.tuples(st.integers(min_value=0, max_value=10_000), st.integers(0, 255)),
             min_size=1, max_size=6),
    st.integers(min_value=0, max_value=8),
    st.integers(min_value=0, max_value=8),
)
def test_fuzz_byte_mutations(msg, flips, cut, extra) -> None:
    frames = frames_of(msg)
    hdr = bytearray(frames[0])
    for pos, val in flips:
        hdr[pos % len(hdr)] = val
    hdr = hdr[: max(0, len(hdr) - cut)] + bytes(extra)
    decode_only_wire_errors([bytes(hdr), *frames[1:]], block_bytes=BB)
    decode_only_wire_errors(
        [bytes(hdr), *frames[1:]], block_bytes=BB, limits=WireLimits(max_message_bytes=16)
    )


def test_empty_fetch_is_valid_and_means_no_blocks_are_needed() -> None:
    """A consumer that needs none of the blocks still tells the producer, which may then release
    them at once (bug-scenarios B20/B29)."""
    msg, payloads = decode(encode_frames(Fetch(gen=1, kv_request_id="r", round=0, keys=[])))
    assert isinstance(msg, Fetch) and msg.keys == [] and payloads == []


# -- a rejected header costs one pass over its bytes -------------------------------------


class _CountingProbe:
    def __init__(self, real) -> None:
        self.real, self.calls = real, 0

    def decode(self, buf):
        self.calls += 1
        return self.real.decode(buf)


@pytest.mark.parametrize(
    "header, reason",
    [
        ({"type": "fetch", "gen": 1, "kv_request_id": "a", "round": 0,
          "keys": [b"k%06d" % i for i in range(20000)] + [b"x" * 300]}, "bad_field"),
        ({"type": "bogus", "pad": "x" * 100_000}, "unknown_type"),
        ({"pad": "x" * 100_000}, "malformed"),
        ({"type": "ping", "gen": 1, "t": 0.0, "deep": [[[[[1] * 50] * 50] * 40]]}, "bad_field"),
    ],
)
def test_big_malformed_header_is_not_decoded_twice(monkeypatch, header, reason) -> None:
    import kvtier.wire.codec as codec

    frame = msgspec.msgpack.encode(header)
    assert len(frame) > codec.PROBE_MAX_BYTES
    counting = _CountingProbe(codec._probe_decoder)
    monkeypatch.setattr(codec, "_probe_decoder", counting)
    with pytest.raises(WireError) as ei:
        Decoder(limits=WireLimits(max_message_bytes=1 << 20)).decode([frame])
    assert ei.value.reason == reason
    assert counting.calls == 0


def test_small_malformed_header_still_names_its_request(monkeypatch) -> None:
    import kvtier.wire.codec as codec

    counting = _CountingProbe(codec._probe_decoder)
    monkeypatch.setattr(codec, "_probe_decoder", counting)
    frame = msgspec.msgpack.encode({"type": "fetch", "gen": 7, "kv_request_id": "kv-1", "round": -1, "keys": []})
    with pytest.raises(WireError) as ei:
        Decoder().decode([frame])
    assert (ei.value.reason, ei.value.kv_request_id, ei.value.gen, ei.value.field) == ("bad_field", "kv-1", 7, "round")
    assert counting.calls == 1


# -- the symmetric path's messages (protocol version 3) --------------------------------------------


def test_probe_and_reply_are_bounded_by_max_blocks_per_fetch() -> None:
    """A probe (or a reply) naming more keys than the receiver's max_blocks_per_fetch is refused
    as oversize before anything is built from it, like a fetch."""
    keys = [bytes([i]) * 4 for i in range(5)]
    limits = WireLimits(max_blocks_per_fetch=4)
    e = wire_error([encode(Probe(gen=1, kv_request_id="r", round=0, keys=keys))], limits=limits)
    assert e.reason == OVERSIZE and e.msg_type == "probe" and e.kv_request_id == "r"
    e = wire_error([encode(ProbeReply(gen=1, kv_request_id="r", round=0, keys=keys, hits=[True] * 5))],
                   limits=limits)
    assert e.reason == OVERSIZE and e.msg_type == "probe_reply"
    assert decode([encode(Probe(gen=1, kv_request_id="r", round=0, keys=keys[:4]))], limits=limits)[0].keys == keys[:4]


def test_a_version_2_peer_cannot_read_an_offered_fetch() -> None:
    """Why the version moved to 3: every field is encoded, so the new flag is on every fetch and a
    decoder without it refuses the message (bad_field) — a mixed fleet would fail requests one by
    one; the hello refuses it at once instead (decision Y12)."""
    assert PROTOCOL_VERSION == 3
    frame = encode(Fetch(gen=1, kv_request_id="r", round=0, keys=[b"a"]))
    assert b"offered" in frame
    hello = raw(type="hello", gen=1, version=2, instance="old", block_bytes=16, layout="", hash_seed="")
    e = wire_error([hello])
    assert e.reason == VERSION_MISMATCH and e.theirs == "2"


def test_probe_reply_hits_must_be_bools_one_per_key() -> None:
    e = wire_error([raw(type="probe_reply", gen=1, kv_request_id="r", round=0, keys=[b"a", b"b"], hits=[True])])
    assert e.reason == BAD_FIELD and e.msg_type == "probe_reply"
    e = wire_error([raw(type="probe_reply", gen=1, kv_request_id="r", round=0, keys=[b"a"], hits=[1])])
    assert e.reason == BAD_FIELD
    e = wire_error([raw(type="probe", gen=1, kv_request_id="r", round=0, keys=[])])
    assert e.reason == BAD_FIELD and e.field == "keys"
