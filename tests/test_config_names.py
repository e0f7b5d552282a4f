"""The name lists of the configuration (``backends``, ``serve_allowed_principals``), the string
keys and how a refused value is shown: each refusal's exact message and key, every size limit
exactly at its bound and one past it, a duplicate, and the shortening of a long value in a message
(an operator reads these lines; a log line never floods)."""

from __future__ import annotations

import pytest

from kvtier.config import TierConfig, TierConfigError
from kvtier.config_kinds import safe_repr, shown
from tests.config_helpers import CURVE, refused

# -- backends: 1..16 distinct names of 1..64 [A-Za-z0-9_] ---------------------------------------


def test_backends_take_sixteen_names_and_refuse_seventeen() -> None:
    sixteen = [f"B{i}" for i in range(16)]
    assert TierConfig.from_dict({"backends": sixteen}).backends == tuple(sixteen)
    over = [*sixteen, "B16"]
    err = refused({"backends": over})
    assert str(err) == f"backends={safe_repr(over)}: must list 1..16 names"
    assert err.keys == ("backends",)


def test_backends_refuse_an_empty_list_and_a_name_twice() -> None:
    assert str(refused({"backends": []})) == "backends=[]: must list 1..16 names"
    assert TierConfig.from_dict({"backends": ["UCX"]}).backends == ("UCX",)  # one is enough
    err = refused({"backends": ["UCX", "LIBFABRIC", "UCX"]})
    assert str(err) == "backends=['UCX', 'LIBFABRIC', 'UCX']: names a backend twice"
    assert err.keys == ("backends",)


def test_a_backend_name_is_shown_shortened_to_forty_characters() -> None:
    long_name = "U" * 65  # one past the 64 a name may have
    err = refused({"backends": [long_name]})
    shown = "'" + "U" * 36 + "..."  # safe_repr(_, 40): 37 characters of the repr, then "..."
    assert str(err) == f"backends={safe_repr([long_name])}: {shown} is not a name of 1..64 [A-Za-z0-9_] characters"
    at_limit = "U" * 64
    assert TierConfig.from_dict({"backends": [at_limit]}).backends == (at_limit,)
    # a repr of exactly 40 characters is shown whole
    err = refused({"backends": ["U" * 37 + "-"]})
    assert str(err).endswith(": '" + "U" * 37 + "-' is not a name of 1..64 [A-Za-z0-9_] characters")
    err = refused({"backends": ["UCX", 7]})
    assert str(err) == "backends=['UCX', 7]: 7 is not a name of 1..64 [A-Za-z0-9_] characters"


# -- serve_allowed_principals: 1..4096 principal names, or "*" -----------------------------------


def test_principals_take_4096_names_and_refuse_4097() -> None:
    names = [f"decode-{i}" for i in range(4096)]
    assert TierConfig.from_dict({**CURVE, "serve_allowed_principals": names}).serve_allowed_principals == tuple(names)
    over = [*names, "decode-4096"]
    err = refused({**CURVE, "serve_allowed_principals": over})
    assert str(err) == (f"serve_allowed_principals={safe_repr(over)}: must list 1..4096 principals "
                        '(["*"]: any authenticated peer)')
    assert err.keys == ("serve_allowed_principals",)


def test_principals_refuse_an_empty_list_and_a_bad_name_by_value() -> None:
    err = refused({**CURVE, "serve_allowed_principals": []})
    assert str(err) == 'serve_allowed_principals=[]: must list 1..4096 principals (["*"]: any authenticated peer)'
    err = refused({**CURVE, "serve_allowed_principals": ["decode-0", "-dash-first"]})
    assert str(err) == ("serve_allowed_principals=['decode-0', '-dash-first']: '-dash-first' is neither \"*\" "
                        "nor a principal name")
    assert err.keys == ("serve_allowed_principals",)
    long_name = "p" * 129  # one past the 128 characters a principal name may have
    err = refused({**CURVE, "serve_allowed_principals": [long_name]})
    assert str(err).endswith(": '" + "p" * 36 + "... is neither \"*\" nor a principal name")
    at_limit = "p" * 128
    assert TierConfig.from_dict({**CURVE, "serve_allowed_principals": [at_limit]}).serve_allowed_principals == (
        at_limit,)


# -- allowed_peers: the entry's own refusal is passed on word for word ----------------------------


@pytest.mark.parametrize(("entry", "why"), [
    ("10.0.0.0/33", "allowed_peers entry '10.0.0.0/33' is not a valid CIDR network"),
    ("bad host!", "allowed_peers entry 'bad host!' must be a hostname or IP address, got 'bad host!'"),
    # a mistyped address no resolver returns, and a network that says a host: each could never
    # match what it says, so each is refused with what to write
    ("10.0.0.300", "allowed_peers entry '10.0.0.300' is not a valid IPv4 address (four numbers 0-255 without "
                   "leading zeros, e.g. 10.0.0.5)"),
    ("10.0.0.05:5710", "allowed_peers entry '10.0.0.05:5710' is not a valid IPv4 address (four numbers 0-255 "
                       "without leading zeros, e.g. 10.0.0.5)"),
    ("10.0.0.5/8", "allowed_peers entry '10.0.0.5/8' has host bits set: write '10.0.0.0/8' for the network, or "
                   "'10.0.0.5' alone for that one host"),
])
def test_allowed_peers_pass_on_why_an_entry_is_refused(entry: str, why: str) -> None:
    err = refused({"allowed_peers": [entry]})
    assert str(err) == f"allowed_peers={safe_repr([entry])}: {why}"
    assert err.keys == ("allowed_peers",)


# -- strings and choices ------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "kind"), [(5, "an integer"), (None, "null"), (["zmq"], "a list")])
def test_a_string_key_names_the_type_it_was_given(value: object, kind: str) -> None:
    err = refused({"host": value})
    assert str(err) == f"host={shown(value)}: expected a string, got {kind}"
    assert err.keys == ("host",)


def test_a_choice_suggests_an_option_at_least_half_alike_and_none_below() -> None:
    # "last" is 0.57 alike "last_store" (difflib's ratio): suggested; "lst" is 0.46 alike: not
    err = refused({"park_clock": "last"})
    assert str(err) == "park_clock='last': must be one of 'last_store', 'first_store'; did you mean 'last_store'?"
    err = refused({"park_clock": "lst"})
    assert str(err) == "park_clock='lst': must be one of 'last_store', 'first_store'"
    assert err.keys == ("park_clock",)


# -- how a value is shown -----------------------------------------------------------------------


def test_a_value_is_shown_whole_up_to_120_characters_and_shortened_past_them() -> None:
    at = "a" * 118  # its repr, quotes included, is 120 characters
    assert safe_repr(at) == repr(at)
    past = "a" * 119
    assert safe_repr(past) == "'" + "a" * 116 + "..."
    assert len(safe_repr(past)) == 120
    err = refused({"hash_seed": "s" * 1025})
    assert str(err) == f"hash_seed='{'s' * 116}...: longer than 1024 characters"


def test_a_value_whose_repr_fails_is_shown_by_its_kind() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert safe_repr(Broken()) == "<unrepresentable Broken>"
    huge = 10 ** 5000  # repr refuses an int of more than 4300 digits
    assert safe_repr(huge) == f"<int of {huge.bit_length()} bits>"
    err = refused({"max_peers": huge})
    assert str(err) == f"max_peers=<int of {huge.bit_length()} bits>: above the maximum 4096"


# -- type: vLLM's own tier names are refused, whatever their case or spacing --------------------


@pytest.mark.parametrize("name", ["p2p", "fs", "obj", "kvcr", "example", " P2P ", "Fs"])
def test_a_type_naming_a_vllm_builtin_tier_is_refused_with_what_to_write(name: str) -> None:
    """Any case or spacing is a copied entry; only the exact name is in vLLM's registry, so only it
    would load vLLM's own tier (another is looked up in module_path, and fails there)."""
    err = refused({"type": name})
    builtin = name.strip().lower()
    what = ("vLLM's factory looks registered names up before module_path, so this entry would load vLLM's own tier"
            if name == builtin else
            f"vLLM matches names exactly, so it would look a class {name!r} up in module_path and fail")
    assert str(err) == (
        f"type={name!r} names vLLM's built-in {builtin!r} tier, not kvtier: {what}. Write "
        '"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm" '
        "(docs/migrating-from-p2p.md maps the p2p keys)")
    assert err.keys == ("type",)


@pytest.mark.parametrize("name", ["p2p2", "KvTierSecondaryTier", "my_fs"])
def test_a_type_that_only_resembles_a_vllm_tier_is_taken(name: str) -> None:
    assert TierConfig.from_dict({"type": name}).type == name


# -- the entry itself: a mapping of known string keys ---------------------------------------------


@pytest.mark.parametrize(("entry", "shown"), [(None, "NoneType: None"), ([("port", 1)], "list: [('port', 1)]")])
def test_an_entry_that_is_not_a_mapping_is_refused_with_its_type_and_value(entry: object, shown: str) -> None:
    with pytest.raises(TierConfigError) as info:
        TierConfig.from_dict(entry)  # type: ignore[arg-type]
    assert str(info.value) == f"kvtier tier config must be a mapping (a JSON object), got {shown}"


def test_keys_that_are_not_strings_are_listed() -> None:
    err = refused({1: 2, "port": 5710, (3,): 4})
    assert str(err) == "kvtier tier config keys must be strings, got [1, (3,)]"


def test_unknown_keys_are_listed_in_order_with_a_suggestion_from_six_tenths_alike() -> None:
    # "porqqq" is exactly 0.6 alike "port" (difflib's ratio): suggested; "porqqqq" (0.55) is not
    err = refused({"porqqq": 1, "port": 5710, "porqqqq": 2, "zzz_qqq": 3})
    assert str(err) == ("unknown kvtier tier config key(s): 'porqqq' (did you mean 'port'?), 'porqqqq', 'zzz_qqq'. "
                        "Every key, with its range: docs/configuration.md")
    assert err.keys == ("porqqq", "porqqqq", "zzz_qqq")


@pytest.mark.parametrize(("key", "longest"), [("type", 128), ("module_path", 256), ("host", 255)])
def test_a_string_key_takes_one_character_up_to_its_longest_and_refuses_one_more(key: str, longest: int) -> None:
    assert getattr(TierConfig.from_dict({key: "h"}), key) == "h"
    assert getattr(TierConfig.from_dict({key: "h" * longest}), key) == "h" * longest
    err = refused({key: "h" * (longest + 1)})
    assert str(err) == f"{key}={safe_repr('h' * (longest + 1))}: longer than {longest} characters"
    assert str(refused({key: ""})) == f"{key}='': must not be empty"


# -- numbers beyond a float keep their sign --------------------------------------------------------


@pytest.mark.parametrize("value", ["-1e999", -(10 ** 400)])
def test_a_number_too_negative_for_a_float_is_refused_as_below_its_range(value: object) -> None:
    err = refused({"load_timeout_s": value})
    assert str(err) == f"load_timeout_s={safe_repr(value)}: must be > 0 (range 0.001..86400.0 s)"
    err = refused({"max_peers": value})
    assert str(err) == f"max_peers={safe_repr(value)}: below the minimum 1"
