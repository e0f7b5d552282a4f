"""How a configuration key is declared and checked, and the error every bad value raises.

A key is one attrs field (:func:`key`): its default, a strict **converter** from the JSON value
(:func:`number`, :func:`integer`, :func:`text`, :func:`flag`, the list converters), then attrs'
own **validators** (``attrs.validators.gt/ge/le``, ``min_len``/``max_len``, ``matches_re``,
``in_``), its unit and its text.  The converters are ours because no library converts the way the
rules of :mod:`kvtier.config` require (a decimal string is a number, a ``bool`` is not); bounds,
lengths, patterns and choices are attrs' validators, read back as data for the configuration table
(:func:`describe`, :func:`bounds`) and turned into one message format here (decision W8).
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import attrs

from kvtier.errors import KvTierError

__all__ = ["KEY", "Key", "TierConfigError", "absent", "bounds", "describe", "flag", "integer", "key", "maybe_integer",
           "maybe_text", "names", "number", "peers", "principals", "safe_repr", "text"]

KEY = "kvtier.key"
"""The field-metadata entry that holds a key's :class:`Key` declaration."""


class TierConfigError(KvTierError, ValueError):
    """A configuration value or combination of values is invalid.

    ``keys`` names the offending key(s) (one key for a value error, two for a
    cross-field rule, the unknown names for an unknown-key error).
    """

    def __init__(self, message: str, *, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


def safe_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)`` that never raises and never floods a log line.

    ``repr`` of a huge ``int`` raises ``ValueError`` (the 4300-digit
    int-to-str limit) -- that must not replace our keyed error message.
    """
    try:
        out = repr(value)
    except Exception:  # noqa: BLE001 - any repr failure gets a stand-in
        if isinstance(value, int):
            return f"<int of {value.bit_length()} bits>"
        return f"<unrepresentable {type(value).__name__}>"
    return out if len(out) <= limit else out[: limit - 3] + "..."


def shown(value: Any) -> str:
    """A config value as its JSON reads (``null``, ``true``, a number as written), else :func:`safe_repr`."""
    if type(value) is WrittenNumber:
        return value if len(value) <= 120 else value[:117] + "..."
    return "null" if value is None else ("true" if value else "false") if isinstance(value, bool) else safe_repr(value)


def _kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (the config is JSON: not Python's type names)."""
    return "a number" if type(value) is WrittenNumber else _KINDS.get(type(value), type(value).__name__)


_KINDS = {type(None): "null", bool: "a bool", int: "an integer", float: "a number", str: "a string", list: "a list",
          tuple: "a list", dict: "an object"}


def fmt(x: float) -> str:
    return repr(x) if isinstance(x, float) else str(x)


class _Invalid(Exception):
    """Why a value is refused; :func:`key` adds the key and the value."""


# --------------------------------------------------------------------------
# converters: the JSON value to its Python value, strictly
# --------------------------------------------------------------------------

# Decimal numbers only, ASCII digits only: no "nan"/"inf", no "0x10", no
# "1_000", no Unicode digits.  Surrounding whitespace is stripped first.
_NUMERIC_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_FLOAT_MAX = Decimal(sys.float_info.max)


def _parse_number(value: Any) -> int | float | Decimal:
    """An int, a float or a decimal numeric string (as an exact ``Decimal``, so that range checks
    never overflow: ``"1e999"`` is compared, not converted); everything else is refused."""
    if isinstance(value, bool):
        raise _Invalid("a bool is not accepted as a number (Python's bool is an int; write a number)")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        if not _NUMERIC_RE.fullmatch(value.strip()):
            raise _Invalid("not a decimal number")
        return Decimal(value.strip())
    raise _Invalid(f"expected a number or numeric string, got {_kind(value)}")


def number(value: Any) -> float:
    """The value as a float, correctly rounded (so ``"0.001"`` equals the bound ``0.001``); NaN and
    ±inf refused.  A number too large for a float (``10**400``, ``"1e999"``) becomes ±inf and fails
    the key's maximum, never as an ``OverflowError``; a positive one too small (``"1e-999"``)
    becomes the smallest positive float and fails its minimum."""
    n = _parse_number(value)
    if isinstance(n, float):
        if math.isnan(n):
            raise _Invalid("NaN is not allowed")
        if math.isinf(n):
            raise _Invalid("must be finite")
        return n
    if abs(n) > (sys.float_info.max if isinstance(n, int) else _FLOAT_MAX):  # exact, no overflow
        return math.inf if n > 0 else -math.inf
    x = float(n)
    return math.ulp(0.0) if x == 0.0 and n > 0 else x


def integer(value: Any) -> int:
    """The value as an int when it is integral (``128.0``, ``"1e3"``); otherwise the number as
    parsed, which the key's ``instance_of(int)`` check refuses after its range checks."""
    n = _parse_number(value)
    if isinstance(n, float) and not math.isfinite(n):
        raise _Invalid("must be a finite integer")
    if isinstance(n, Decimal) and n.adjusted() > 18:  # beyond every bound: fails it, never built as an int
        return math.inf if n > 0 else -math.inf  # type: ignore[return-value]
    return int(n) if n == int(n) else n  # type: ignore[return-value]


maybe_integer: Callable[[Any], int | None] = attrs.converters.optional(integer)
"""``None`` (off) or :func:`integer`."""

maybe_number: Callable[[Any], float | None] = attrs.converters.optional(number)
"""``None`` (off) or :func:`number`."""


class WrittenNumber(str):
    """A JSON number Python cannot hold (``1e400``, thousands of digits), kept as written so its
    error quotes it (``kvtier check-config``): a number to a number key, never a string to a text key."""


def text(value: Any) -> str:
    if not isinstance(value, str) or type(value) is WrittenNumber:
        raise _Invalid(f"expected a string, got {_kind(value)}")
    return value


def maybe_text(value: Any) -> str | None:
    if value is None or isinstance(value, str) and type(value) is not WrittenNumber:
        return value
    raise _Invalid(f"expected a string or null, got {_kind(value)}")


def flag(value: Any) -> bool:
    if isinstance(value, bool):  # bool cannot be subclassed
        return value
    raise _Invalid("expected true or false (a real bool; 0/1 and strings are rejected)")


def absent(why: str) -> Callable[[Any], None]:
    """Only ``None`` (the key left out); ``why`` explains the refusal."""

    def convert(value: Any) -> None:
        if value is not None:
            raise _Invalid(why)

    return convert


def _strings(value: Any) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise _Invalid(f"expected a list of strings, got {_kind(value)}")
    if any(type(v) is WrittenNumber for v in value):
        raise _Invalid("expected a list of strings, got a number in it")
    return list(value)


#: Most entries ``allowed_peers`` takes (each is checked against every dial).
MAX_ALLOWED_PEERS = 4096


def peers(value: Any) -> tuple[str, ...]:
    """``allowed_peers``: a non-empty list of entries :class:`kvtier.params.PeerPolicy` takes."""
    from kvtier.params import PeerPolicy

    entries = _strings(value)
    if not entries:
        raise _Invalid('must not be empty (use ["*"] for any peer)')
    if len(entries) > MAX_ALLOWED_PEERS:
        raise _Invalid(f"more than {MAX_ALLOWED_PEERS} entries")
    try:
        PeerPolicy.from_entries(entries)
    except ValueError as exc:
        raise _Invalid(str(exc)) from None
    return tuple(e.strip() for e in entries)


#: NIXL 1.5's storage backends (files, objects): they cannot register host memory for peers' WRITEs
STORAGE_BACKENDS = frozenset({"POSIX", "GDS", "GDS_MT", "OBJ", "HF3FS", "AZURE_BLOB"})
#: NIXL 1.5's network backends, by the (case-sensitive) names NIXL gives them
NETWORK_BACKENDS = frozenset({"UCX", "LIBFABRIC", "GPUNETIO"})


def names(value: Any, *, most: int = 16, name: re.Pattern[str] = re.compile(r"[A-Za-z0-9_]{1,64}")) -> tuple[str, ...]:
    """``backends``: 1..16 distinct names of 1..64 ``[A-Za-z0-9_]`` characters; not a storage
    backend, and a network backend's name in NIXL's case."""
    entries = _strings(value)
    if not entries or len(entries) > most:
        raise _Invalid(f"must list 1..{most} names")
    for v in entries:
        if not isinstance(v, str) or not name.fullmatch(v):
            raise _Invalid(f"{safe_repr(v, 40)} is not a name of 1..64 [A-Za-z0-9_] characters")
        if v.upper() in STORAGE_BACKENDS:
            raise _Invalid(f"{v!r} is a NIXL storage backend (files, objects): it cannot carry blocks between "
                           "instances; use [\"UCX\"]")
        cased = next((b for b in NETWORK_BACKENDS if b.lower() == v.lower()), v)
        if cased != v:
            raise _Invalid(f"{v!r}: NIXL's backend names are case-sensitive; did you mean {cased!r}?")
    if len(set(entries)) != len(entries):
        raise _Invalid("names a backend twice")
    return tuple(entries)


def principals(value: Any, *, most: int = 4096,
               name: re.Pattern[str] = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")) -> tuple[str, ...]:
    """``serve_allowed_principals``: principal names (certificate stems, docs/security.md) or ``"*"``."""
    entries = _strings(value)
    if not entries or len(entries) > most:
        raise _Invalid(f'must list 1..{most} principals (["*"]: any authenticated peer)')
    for v in entries:
        if not isinstance(v, str) or not (v == "*" or name.fullmatch(v)):
            raise _Invalid(f"{safe_repr(v, 40)} is neither \"*\" nor a principal name")
    return tuple(entries)


# --------------------------------------------------------------------------
# a key: one attrs field, declared once
# --------------------------------------------------------------------------


class Key(NamedTuple):
    """A key's declaration, kept in its field's metadata (``KEY``): everything the configuration
    table says about it is read from here."""

    convert: Callable[[Any], Any] | None
    checks: tuple[Any, ...]
    """attrs validators, run in order on the converted value (not on ``None``)."""
    unit: str
    doc: str
    shape: str
    """What ``matches_re`` asks for, in words ("a Python identifier")."""
    text: str
    """The validation column, for a key whose converter checks everything itself."""


def key(default: Any, convert: Callable[[Any], Any] | None, *checks: Any, doc: str, unit: str = "",
        shape: str = "", text: str = "") -> Any:
    """An attrs field that converts with ``convert`` then runs the attrs validators ``checks``, both
    inside the field's converter, so a refusal names the value as written (``'1e999'``, not
    ``inf``) and ``attrs.evolve`` checks again; defaults go through it too.

    Raises (on construction): TierConfigError ``"<key>=<value repr>: <why>"``.
    """

    def convert_and_check(value: Any, field: attrs.Attribute) -> Any:
        try:
            out = convert(value) if convert is not None else value
            if out is not None or convert is None:
                for check in checks:
                    try:
                        check(None, field, out)
                    except (ValueError, TypeError):
                        raise _Invalid(_why(check, value, checks, unit, shape)) from None
        except _Invalid as exc:
            raise TierConfigError(f"{field.name}={shown(value)}: {exc}", keys=(field.name,)) from None
        return out

    declared = Key(convert, checks, unit, " ".join(doc.split()), shape, text)
    return attrs.field(default=default, converter=attrs.Converter(convert_and_check, takes_field=True),
                       metadata={KEY: declared})


def field_problems(cls: type, mapping: Mapping[str, Any]) -> list[TierConfigError]:
    """What each key of ``mapping`` that names a field of ``cls`` (built with :func:`key`) is
    refused for, in declaration order, so a config with several bad values is told all of them
    at once (the record's construction checks them again)."""
    out = []
    for a in attrs.fields(cls):
        if a.name in mapping:
            try:
                a.converter.converter(mapping[a.name], a)
            except TierConfigError as exc:
                out.append(exc)
    return out


def raise_all(problems: Sequence[TierConfigError]) -> None:
    """Raise ``problems`` as one error (the one itself when there is one), naming every key."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise TierConfigError(f"{len(problems)} problems:" + "".join(f"\n  - {p}" for p in problems),
                              keys=tuple(dict.fromkeys(k for p in problems for k in p.keys)))


def bounds(checks: tuple[Any, ...]) -> tuple[float | None, float | None]:
    """The ``ge`` and ``le`` bounds among attrs validators (``None`` where there is none)."""
    ops = {getattr(c, "compare_op", None): c.bound for c in checks if hasattr(c, "compare_op")}
    return ops.get(">="), ops.get("<=")


def _why(check: Any, value: Any, checks: tuple[Any, ...], unit: str, shape: str) -> str:
    u = " s" if unit == "s" else ""  # a duration's bounds say seconds; a count's unit is the table's
    op = getattr(check, "compare_op", None)
    if op == "<=":
        return f"above the maximum {fmt(check.bound)}{u}"
    if op == ">=":
        return f"below the minimum {fmt(check.bound)}{u}"
    if op is not None:
        lo, hi = bounds(checks)
        return f"must be {op} {fmt(check.bound)} (range {fmt(lo)}..{fmt(hi)}{u})"  # type: ignore[arg-type]
    if getattr(check, "type", None) is int:
        return "must be an integer (has a fractional part)"
    if hasattr(check, "max_length"):
        return f"longer than {check.max_length} characters"
    if hasattr(check, "min_length"):
        return "must not be empty"
    if hasattr(check, "pattern"):
        return f"must be {shape}"
    options = check.options
    folded = {o.casefold(): o for o in options if isinstance(o, str)}  # "ZMQ": the same name, cased
    close = ([folded[value.casefold()]] if value.casefold() in folded else
             difflib.get_close_matches(value, options, n=1, cutoff=0.5)) if isinstance(value, str) else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"must be one of {', '.join(repr(c) for c in options)}{hint}"


def describe(k: Key) -> str:
    """The configuration table's validation column for a key."""
    if k.text:
        return k.text
    lo, hi = bounds(k.checks)
    if k.convert is number:
        return f"number or numeric string, {lo!r} ≤ x ≤ {hi!r}; bool, NaN, ±inf, ≤ 0 rejected"
    if k.convert is integer:
        return f"integer or integral numeric string, {lo} ≤ n ≤ {hi}; bool and fractional values rejected"
    if k.convert is maybe_integer:
        return f"`null` (off), or an integer or integral numeric string, {lo} ≤ n ≤ {hi}"
    if k.convert is maybe_number:
        return f"`null` (off), or a number or numeric string, {lo!r} ≤ x ≤ {hi!r}; bool, NaN, ±inf, ≤ 0 rejected"
    if k.convert is flag:
        return "`true` or `false` only (no 0/1, no strings)"
    options = [c.options for c in k.checks if hasattr(c, "options")]
    if options:
        return "one of " + ", ".join(f"`{c}`" for c in options[0])
    empty = not any(hasattr(c, "min_length") for c in k.checks)
    longest = next(c.max_length for c in k.checks if hasattr(c, "max_length"))
    return f"{'string' if empty else 'non-empty string'}{', ' + k.shape if k.shape else ''}, ≤ {longest} chars"
