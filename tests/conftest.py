"""Shared pytest configuration: Hypothesis profiles and markers.

Profiles (``HYPOTHESIS_PROFILE=<name>`` selects one; otherwise ``ci`` when ``$CI`` is set — which
replaces the ``ci`` profile Hypothesis would load by itself — else ``dev``):

* ``dev`` — 50 examples, quick local runs;
* ``ci`` — derandomized, no example database, no deadline, failure blobs printed, ~200 examples;
* ``explore`` — randomized, 20 000 examples, for long nightly runs
  (``HYPOTHESIS_PROFILE=explore timeout 3600 pytest tests/stateful tests/lifecycle``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci",
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    max_examples=20_000,
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config):  # type: ignore[no-untyped-def]
    for line in (
        "slow: long runs kept out of the default suite (run with -m slow)",
        "model: uses the real SmolLM2 model",
        "e2e: multi-process end-to-end",
        "vllm: drives real vLLM code",
    ):
        config.addinivalue_line("markers", line)
