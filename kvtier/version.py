"""What this kvtier is and what it talks to: the package version, the wire protocol version, and
the vLLM and NIXL releases it is written and tested against (``kvtier --version``;
docs/compatibility.md is rendered from here and from pyproject.toml by ``python -m tools docs``).
"""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Final

from kvtier.wire.messages import PROTOCOL_VERSION

__all__ = ["PROTOCOL_VERSION", "TESTED_NIXL_VERSION", "TESTED_VLLM_VERSION", "__version__", "describe"]

TESTED_VLLM_VERSION: Final = "0.33.0"
"""The vLLM release the adapter (:mod:`kvtier.integrations.vllm`) is written and tested against;
its tiering API is experimental, so another version logs a warning at construction."""

TESTED_NIXL_VERSION: Final = "1.5.1"
"""The NIXL release (``nixl-cu12``) the ``nixl`` data plane is tested against."""


def _version() -> str:
    try:
        return importlib.metadata.version("kvtier")
    except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path, never installed
        return "0+unknown"


__version__: Final = _version()
"""The installed package's version (pyproject.toml ``[project] version``)."""


def describe() -> str:
    """One line: ``kvtier 0.1.0 (wire protocol 3; vLLM adapter for 0.33.0; NIXL 1.5.1; Python 3.11.7)``."""
    return (f"kvtier {__version__} (wire protocol {PROTOCOL_VERSION}; vLLM adapter for {TESTED_VLLM_VERSION}; "
            f"NIXL {TESTED_NIXL_VERSION}; Python {platform.python_version()})")
