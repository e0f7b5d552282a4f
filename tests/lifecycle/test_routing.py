"""The spec's routing tables (decision C16): every wire message and every effect has exactly one
row, each row names code that exists, and the core and the shell take their dispatch from them."""

from __future__ import annotations

import typing

import msgspec
import pytest

from kvtier.lifecycle import effects as fx
from kvtier.lifecycle._table import PERFORM, WIRE
from kvtier.wire import messages as wm
from tools.spec import SpecError, loads


def _message_structs() -> set[type]:
    """Every message the wire defines (the tagged union ``kvtier.wire.messages.Message``)."""
    return set(typing.get_args(wm.Message))


def test_every_wire_message_has_one_row_and_only_wire_messages_have_one() -> None:
    structs = {getattr(wm, w.struct) for w in WIRE.values()}
    assert structs == _message_structs()
    assert len(structs) == len(WIRE)
    for tag, w in WIRE.items():  # the row's key is the message's wire tag
        assert getattr(wm, w.struct).__struct_config__.tag == tag


def test_exactly_one_message_lands_and_only_the_hello_carries_a_principal() -> None:
    assert [tag for tag, w in WIRE.items() if w.lands] == ["block_data"]
    assert [tag for tag, w in WIRE.items() if w.principal] == ["hello"]


def test_every_effect_has_one_performer_row() -> None:
    effects = set(typing.get_args(fx.Effect))
    assert {getattr(fx, cls) for cls in PERFORM} == effects


def test_the_core_and_the_shell_have_every_handler_the_tables_name() -> None:
    from kvtier.lifecycle.receive import Receive  # the core's part that takes peer messages
    from kvtier.shell.outbound import Outbound

    for w in WIRE.values():
        assert callable(getattr(Receive, f"_rx_{w.receive}", None)), w
    for cls, name in PERFORM.items():
        assert callable(getattr(Outbound, f"_{name}", None)), (cls, name)


def test_every_struct_in_the_messages_module_is_a_wire_message() -> None:
    """A new message struct cannot be added without joining the union, hence the table."""
    structs = {c for c in vars(wm).values() if isinstance(c, type) and issubclass(c, msgspec.Struct)
               and c.__module__ == wm.__name__ and getattr(c, "TYPE", None)}
    # besides the messages: the headers our core builds, a subclass encoded as its message
    assert structs - _message_structs() == {wm.BuiltBlockData}
    assert wm.BuiltBlockData.__mro__[1] is wm.BlockData and wm.BlockData in _message_structs()


@pytest.mark.parametrize("row, match", [
    ('[wire.fetch]\nstruct = "Fetch"\n', "receive is required"),
    ('[wire.fetch]\nstruct = "Fetch"\nreceive = "fetch"\nlands = "yes"\n', "lands must be a bool"),
    ('[wire.fetch]\nstruct = "Fetch"\nreceive = "Fetch"\n', "receive must be a lower_snake_case"),
    ('[wire.fetch]\nstruct = "Fetch"\nreceive = "fetch"\nhandler = "x"\n', "unknown key"),
    ('[effects]\nSend = "Send"\n', "performer must be a lower_snake_case"),
])
def test_the_spec_loader_refuses_a_bad_routing_row(row: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        loads(row, validate_spec=False)
