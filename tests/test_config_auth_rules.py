"""The cross-field rules of ``TierConfig`` about authentication and who may be served, each with its
exact message and the keys it names (what an operator reads, and what ``first-day`` tooling keys
on), at the boundary where the rule starts to hold and one step inside it."""

from __future__ import annotations

import pytest

from kvtier.config import TierConfig, TierConfigError

CURVE = {"auth": "curve", "auth_secret_key_file": "/keys/p.key_secret", "auth_allowed_keys_dir": "/keys/allowed"}


def refused(entry: dict) -> TierConfigError:
    with pytest.raises(TierConfigError) as info:
        TierConfig.from_dict(entry)
    return info.value


def test_named_principals_need_curve() -> None:
    err = refused({"serve_allowed_principals": ["decode-0"]})
    assert str(err) == (
        "serve_allowed_principals=['decode-0'] needs auth='curve': without authentication a principal is "
        "whatever the peer claims (use [\"*\"] or turn CURVE on)")
    assert err.keys == ("serve_allowed_principals", "auth")
    ok = TierConfig.from_dict({**CURVE, "serve_allowed_principals": ["decode-0"]})
    assert ok.serve_allowed_principals == ("decode-0",)
    assert TierConfig.from_dict({"serve_allowed_principals": ["*"]}).auth == "none"  # everyone: no auth needed


def test_a_star_with_other_names_is_refused_from_two_entries_on() -> None:
    err = refused({**CURVE, "serve_allowed_principals": ["*", "decode-0"]})
    assert str(err) == 'serve_allowed_principals lists "*" with other names: "*" already allows every peer'
    assert err.keys == ("serve_allowed_principals",)
    assert TierConfig.from_dict({**CURVE, "serve_allowed_principals": ["*"]}).serve_allowed_principals == ("*",)
    two = TierConfig.from_dict({**CURVE, "serve_allowed_principals": ["decode-0", "decode-1"]})
    assert two.serve_allowed_principals == ("decode-0", "decode-1")


@pytest.mark.parametrize("missing", ["auth_secret_key_file", "auth_allowed_keys_dir"])
def test_curve_needs_both_key_paths(missing: str) -> None:
    err = refused({k: v for k, v in CURVE.items() if k != missing})
    assert str(err) == f"auth='curve' needs {missing} (see docs/security.md)"
    assert err.keys == ("auth", missing)


def test_curve_with_both_key_paths_is_taken() -> None:
    cfg = TierConfig.from_dict(CURVE)
    assert (cfg.auth, cfg.auth_secret_key_file, cfg.auth_allowed_keys_dir) == (
        "curve", "/keys/p.key_secret", "/keys/allowed")


@pytest.mark.parametrize(("given", "pronoun"), [
    (("auth_secret_key_file",), "it"),
    (("auth_allowed_keys_dir",), "it"),
    (("auth_secret_key_file", "auth_allowed_keys_dir"), "them"),
])
def test_key_paths_without_curve_fail_closed(given: tuple[str, ...], pronoun: str) -> None:
    err = refused({k: CURVE[k] for k in given})
    assert str(err) == (f"{' and '.join(given)} set but auth='none': nothing would be authenticated; set "
                        f"auth='curve' to use the keys, or remove {pronoun}")
    assert err.keys == ("auth", *given)
    assert TierConfig.from_dict({}).auth == "none"  # and without them, none is fine
