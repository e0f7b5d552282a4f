"""TierConfig properties (Hypothesis): in-range values round-trip in every spelling; any value
either builds or fails with a ``ValueError`` naming the key."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import DEFAULTS, MAX_TIMEOUT_S, MIN_DURATION_S, TierConfig, TierConfigError
from tests.config_helpers import FREE_FLOAT_KEYS, INT_KEYS, build, row


# ------------------------------------------------------------------ properties

_in_range = st.floats(
    min_value=MIN_DURATION_S, max_value=MAX_TIMEOUT_S, allow_nan=False, allow_infinity=False
)


@given(
    key=st.sampled_from(FREE_FLOAT_KEYS),
    x=_in_range,
    spelling=st.sampled_from(["{x!r}", " {x!r}\n", "{x:.17e}", "{x:.17g}", "{x!r}"]),
)
@settings(max_examples=300)
def test_any_finite_positive_float_string_within_cap_round_trips(key, x, spelling):
    text = spelling.format(x=x)
    cfg = build(key, text)
    assert getattr(cfg, key) == x
    assert TierConfig.from_dict(cfg.to_dict()) == cfg


@given(key=st.sampled_from(INT_KEYS), data=st.data())
def test_any_int_within_bounds_round_trips_as_string(key, data):
    kind = row(key)
    n = data.draw(st.integers(kind.minimum, kind.maximum))
    assert getattr(build(key, str(n)), key) == n
    assert getattr(build(key, float(n)), key) == n


_json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=8)
    | st.decimals(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@given(key=st.sampled_from(list(DEFAULTS)), value=_json_like)
@settings(max_examples=500)
def test_any_value_either_builds_or_fails_with_a_keyed_value_error(key, value):
    try:
        cfg = build(key, value)
    except TierConfigError as err:
        assert key in err.keys
        assert str(err).startswith(f"{key}=") or key in str(err)
    else:
        got = getattr(cfg, key)
        if isinstance(got, float):
            assert math.isfinite(got) and got > 0
        assert TierConfig.from_dict(cfg.to_dict()) == cfg
