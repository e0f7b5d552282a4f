"""Every exception class kvtier defines derives from KvTierError (kvtier/errors.py says callers can
catch what kvtier refused in one clause); those that refuse a value stay ValueErrors."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import kvtier
from kvtier.errors import KvTierError


def _kvtier_exceptions() -> list[type]:
    found = []
    for mod in pkgutil.walk_packages(kvtier.__path__, "kvtier."):
        try:
            module = importlib.import_module(mod.name)
        except ImportError:  # an optional dependency (NIXL) this machine lacks
            continue
        found += [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, BaseException) and obj.__module__ == mod.name]
    return found


def test_every_exception_kvtier_defines_is_a_kvtier_error() -> None:
    classes = _kvtier_exceptions()
    names = {c.__name__ for c in classes}
    assert {"TierConfigError", "UnknownRequest", "DuplicateJob", "PeerNotAllowed", "WireError", "InvalidTransition",
            "NotAnEndpoint"} <= names
    public = [c for c in classes if not c.__name__.startswith("_")]  # a private one never leaves its module
    assert [c.__qualname__ for c in public if not issubclass(c, KvTierError)] == []
    assert all(issubclass(c, ValueError) for c in classes
               if c.__name__ in ("TierConfigError", "UnknownRequest", "DuplicateJob", "PeerNotAllowed"))
