"""A wire message is declared once, as its struct in ``kvtier/wire/messages.py`` (decision C1):
the codec's union, ``MESSAGE_TYPES``, ``kvtier.wire``'s names and docs/protocol.md's message table
all follow from the classes that module declares."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import msgspec

import kvtier.wire
from kvtier.wire import messages as wm

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def _declared() -> list[type]:
    """Every message class the module declares, in declaration order (read from its source)."""
    src = Path(wm.__file__).read_text(encoding="utf-8")
    return [getattr(wm, name) for name in re.findall(r'^class (\w+)\(\w+, tag="\w+"\):', src, re.M)]


def test_every_declared_struct_is_in_the_union_and_the_tag_table() -> None:
    declared = _declared()
    assert len(declared) >= 15
    assert list(typing.get_args(wm.Message)) == declared
    assert list(wm.MESSAGE_TYPES.values()) == declared
    assert all(wm.MESSAGE_TYPES[cls.TYPE] is cls for cls in declared)


def test_kvtier_wire_exports_every_message_by_name() -> None:
    for cls in _declared():
        assert getattr(kvtier.wire, cls.__name__) is cls
        assert cls.__name__ in kvtier.wire.__all__


def test_the_protocol_table_has_one_row_per_message_with_its_fields() -> None:
    text = PROTOCOL.read_text(encoding="utf-8")
    block = text[text.index("<!-- BEGIN GENERATED: messages"):]
    block = block[:block.index("<!-- END GENERATED -->")]
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| `([^`]*)` \|", block, re.M)
    assert [tag for tag, _ in rows] == list(wm.MESSAGE_TYPES)
    for tag, fields in rows:
        names = [f.split(":")[0] for f in fields.split(", ")]
        assert names == [f.name for f in msgspec.structs.fields(wm.MESSAGE_TYPES[tag])], tag


def test_ping_and_pong_are_one_body_under_two_tags() -> None:
    """Decision C23: the liveness pair shares its fields; the wire keeps both tags (protocol 3)."""
    assert wm.Ping.__struct_fields__ == wm.Pong.__struct_fields__ == ("gen", "t")
    assert (wm.Ping.__struct_config__.tag, wm.Pong.__struct_config__.tag) == ("ping", "pong")
    ping = kvtier.wire.encode(wm.Ping(gen=7, t=1.5))
    assert kvtier.wire.decode([ping]) == (wm.Ping(gen=7, t=1.5), [])
    pong, _ = kvtier.wire.decode([kvtier.wire.encode(wm.Pong(gen=7, t=1.5))])
    assert type(pong) is wm.Pong and pong != wm.Ping(gen=7, t=1.5)
