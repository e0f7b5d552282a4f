"""The value kinds of kvtier's configuration keys, and the error every bad value raises.

Each kind converts a user's value strictly (failing closed with a :class:`TierConfigError` that
names the key and the value), describes its accepted range for the configuration table, and
names its unit.  :mod:`kvtier.config` declares every key of ``TierConfig`` with one of them; the
rules the kinds enforce are listed in that module's docstring (scenario B25, docs/scenarios.md).
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from decimal import Decimal
from typing import Any

import attrs


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------

_NO_VALUE: Any = object()


class TierConfigError(ValueError):
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
        text = repr(value)
    except Exception:  # noqa: BLE001 - any repr failure gets a stand-in
        if isinstance(value, int):
            return f"<int of {value.bit_length()} bits>"
        return f"<unrepresentable {type(value).__name__}>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _fail(key: str, value: Any, why: str) -> TierConfigError:
    return TierConfigError(f"{key}={safe_repr(value)}: {why}", keys=(key,))


# --------------------------------------------------------------------------
# value kinds: each knows how to convert, how to describe itself, and its unit
# --------------------------------------------------------------------------

# Decimal numbers only, ASCII digits only: no "nan"/"inf", no "0x10", no
# "1_000", no Unicode digits.  Surrounding whitespace is stripped first.
_NUMERIC_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
DOTTED_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)


def _parse_number(key: str, value: Any) -> int | float | Decimal:
    """Accept int, float or a decimal numeric string; reject everything else.

    Strings become an exact ``Decimal`` so that range checks never overflow
    (``"1e999"`` is compared, not converted).
    """
    if isinstance(value, bool):
        raise _fail(key, value, "a bool is not accepted as a number (Python's bool is an int; write a number)")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        text = value.strip()
        if not _NUMERIC_RE.fullmatch(text):
            raise _fail(key, value, "not a decimal number")
        return Decimal(text)
    raise _fail(key, value, f"expected a number or numeric string, got {type(value).__name__}")


_FLOAT_MAX_DEC = Decimal(sys.float_info.max)


def _to_float(key: str, value: Any) -> float:
    """The value as a float, correctly rounded; NaN and +-inf inputs rejected.

    Ranges are then checked on the float, so that ``"0.001"`` equals the float
    bound ``0.001`` (the exact decimal 0.001 is below that float).  A number
    too large for a float (``10**400``, ``"1e999"``) becomes +-inf here and
    fails the caller's range check as "above the maximum", never as an
    ``OverflowError``; a positive number too small for a float (``"1e-999"``)
    becomes the smallest positive float and fails as "below the minimum".
    """
    n = _parse_number(key, value)
    if isinstance(n, float):
        if math.isnan(n):
            raise _fail(key, value, "NaN is not allowed")
        if math.isinf(n):
            raise _fail(key, value, "must be finite")
        return n
    if isinstance(n, int):
        if abs(n) > sys.float_info.max:  # exact int/float comparison, no overflow
            return math.inf if n > 0 else -math.inf
        return float(n)
    if n.copy_abs() > _FLOAT_MAX_DEC:
        return math.inf if n > 0 else -math.inf
    x = float(n)
    if x == 0.0 and n > 0:
        return math.ulp(0.0)
    return x


def fmt(x: float | int) -> str:
    return repr(x) if isinstance(x, float) else str(x)


@attrs.frozen
class Float:
    """A positive, finite real number within ``[lo, hi]`` (seconds)."""

    lo: float
    hi: float
    unit: str = "s"

    def convert(self, key: str, value: Any) -> float:
        x = _to_float(key, value)
        if x <= 0:
            raise _fail(
                key, value, f"must be > 0 (range {fmt(self.lo)}..{fmt(self.hi)} {self.unit})"
            )
        if x > self.hi:
            raise _fail(key, value, f"above the maximum {fmt(self.hi)} {self.unit}")
        if x < self.lo:
            raise _fail(key, value, f"below the minimum {fmt(self.lo)} {self.unit}")
        return x

    def describe(self) -> str:
        return (
            f"number or numeric string, {fmt(self.lo)} ≤ x ≤ {fmt(self.hi)}; "
            "bool, NaN, ±inf, ≤ 0 rejected"
        )


@attrs.frozen
class Int:
    """An integer within ``[lo, hi]``."""

    lo: int
    hi: int
    unit: str = ""

    def convert(self, key: str, value: Any) -> int:
        n = _parse_number(key, value)
        if isinstance(n, float) and not math.isfinite(n):
            raise _fail(key, value, "must be a finite integer")
        if n > self.hi:
            raise _fail(key, value, f"above the maximum {self.hi}")
        if n < self.lo:
            raise _fail(key, value, f"below the minimum {self.lo}")
        if isinstance(n, float):
            if not n.is_integer():
                raise _fail(key, value, "must be an integer (has a fractional part)")
            return int(n)
        if isinstance(n, Decimal):
            if n != n.to_integral_value():
                raise _fail(key, value, "must be an integer (has a fractional part)")
            return int(n)
        return n

    def describe(self) -> str:
        return (
            f"integer or integral numeric string, {self.lo} ≤ n ≤ {self.hi}; "
            "bool and fractional values rejected"
        )


@attrs.frozen
class Str:
    """A string matching ``pattern`` (if given), at most ``max_len`` long."""

    max_len: int
    pattern: re.Pattern[str] | None = None
    pattern_text: str = ""
    allow_empty: bool = False
    unit: str = ""

    def convert(self, key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _fail(key, value, f"expected a string, got {type(value).__name__}")
        if not value and not self.allow_empty:
            raise _fail(key, value, "must not be empty")
        if len(value) > self.max_len:
            raise _fail(key, value, f"longer than {self.max_len} characters")
        if value and self.pattern is not None and not self.pattern.fullmatch(value):
            raise _fail(key, value, f"must be {self.pattern_text}")
        return value

    def describe(self) -> str:
        text = "string" if self.allow_empty else "non-empty string"
        if self.pattern_text:
            text += f", {self.pattern_text}"
        return f"{text}, ≤ {self.max_len} chars"


@attrs.frozen
class Choice:
    """Exactly one of ``choices`` (case-sensitive)."""

    choices: tuple[str, ...]
    unit: str = ""

    def convert(self, key: str, value: Any) -> str:
        if isinstance(value, str) and value in self.choices:
            return value
        hint = ""
        if isinstance(value, str):
            close = difflib.get_close_matches(value, self.choices, n=1, cutoff=0.5)
            if close:
                hint = f"; did you mean {close[0]!r}?"
        allowed = ", ".join(repr(c) for c in self.choices)
        raise _fail(key, value, f"must be one of {allowed}{hint}")

    def describe(self) -> str:
        return "one of " + ", ".join(f"`{c}`" for c in self.choices)


@attrs.frozen
class Bool:
    """A real ``bool`` only."""

    unit: str = ""

    def convert(self, key: str, value: Any) -> bool:
        if isinstance(value, bool):  # bool cannot be subclassed
            return value
        raise _fail(key, value, "expected true or false (a real bool; 0/1 and strings are rejected)")

    def describe(self) -> str:
        return "`true` or `false` only (no 0/1, no strings)"


@attrs.frozen
class OptionalStr:
    """``None`` or a string; accepted for vLLM compatibility and otherwise ignored."""

    max_len: int = 64
    unit: str = ""

    def convert(self, key: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise _fail(key, value, f"expected a string or null, got {type(value).__name__}")
        if len(value) > self.max_len:
            raise _fail(key, value, f"longer than {self.max_len} characters")
        return value

    def describe(self) -> str:
        return "string or `null`; accepted and ignored"


@attrs.frozen
class MustBeNone:
    """Only ``None`` (i.e. absent) is valid; ``why`` explains the refusal."""

    why: str
    unit: str = ""

    def convert(self, key: str, value: Any) -> None:
        if value is None:
            return None
        raise _fail(key, value, self.why)

    def describe(self) -> str:
        return "absent (or null through the Python API); any other value is rejected"


@attrs.frozen
class OptionalInt:
    """``None`` (off) or an integer within ``[lo, hi]`` (same conversion as :class:`Int`)."""

    lo: int
    hi: int
    unit: str = ""

    def convert(self, key: str, value: Any) -> int | None:
        if value is None:
            return None
        return Int(self.lo, self.hi).convert(key, value)

    def describe(self) -> str:
        return f"`null` (off), or an integer or integral numeric string, {self.lo} ≤ n ≤ {self.hi}"


class PeerList:
    """A JSON list of ``allowed_peers`` entries (see :class:`kvtier.params.PeerPolicy`)."""

    max_items: int = 4096
    unit: str = ""

    def convert(self, key: str, value: Any) -> tuple[str, ...]:
        from kvtier.params import PeerPolicy

        if not isinstance(value, (list, tuple)):
            raise _fail(key, value, f"expected a list of strings, got {type(value).__name__}")
        if not value:
            raise _fail(key, value, 'must not be empty (use ["*"] for any peer)')
        if len(value) > self.max_items:
            raise _fail(key, value, f"more than {self.max_items} entries")
        try:
            PeerPolicy.from_entries(value)
        except ValueError as exc:
            raise _fail(key, value, str(exc)) from None
        return tuple(e.strip() for e in value)

    def describe(self) -> str:
        return 'list of `"*"`, `"host:port"`, `"host"` or CIDR (`"10.0.0.0/8"`), non-empty'


class NameList:
    """A non-empty JSON list of distinct names (``[A-Za-z0-9_]``, at most 64 characters each)."""

    max_items: int = 16
    unit: str = ""
    _NAME = re.compile(r"[A-Za-z0-9_]{1,64}")

    def convert(self, key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)):
            raise _fail(key, value, f"expected a list of strings, got {type(value).__name__}")
        if not value or len(value) > self.max_items:
            raise _fail(key, value, f"must list 1..{self.max_items} names")
        for v in value:
            if not isinstance(v, str) or not self._NAME.fullmatch(v):
                raise _fail(key, value, f"{safe_repr(v, 40)} is not a name of 1..64 [A-Za-z0-9_] characters")
        if len(set(value)) != len(value):
            raise _fail(key, value, "names a backend twice")
        return tuple(value)

    def describe(self) -> str:
        return f"list of 1..{self.max_items} distinct names (`[A-Za-z0-9_]`, ≤ 64 chars)"


class PrincipalList:
    """A non-empty JSON list of principals (certificate stems, docs/security.md) or ``["*"]``."""

    max_items: int = 4096
    unit: str = ""
    _NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

    def convert(self, key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)):
            raise _fail(key, value, f"expected a list of strings, got {type(value).__name__}")
        if not value or len(value) > self.max_items:
            raise _fail(key, value, f'must list 1..{self.max_items} principals (["*"]: any authenticated peer)')
        for v in value:
            if not isinstance(v, str) or not (v == "*" or self._NAME.fullmatch(v)):
                raise _fail(key, value, f"{safe_repr(v, 40)} is neither \"*\" nor a principal name")
        return tuple(value)

    def describe(self) -> str:
        return 'list of principal names (certificate stems) or `["*"]`, non-empty'


Kind = (Float | Int | Str | Choice | Bool | OptionalStr | OptionalInt | MustBeNone | PeerList | NameList
         | PrincipalList)
