"""Stateful property test of the composed core (producer + two consumers + lossy network + virtual
clock); the state machine lives in ``stateful_model.py``.

Profiles: ``dev`` 50 examples, ``ci`` ~200 derandomized, ``explore`` 20 000 randomized
(``HYPOTHESIS_PROFILE=explore pytest tests/stateful``).
"""

from __future__ import annotations

from hypothesis import settings

from stateful_model import Interleavings

TestInterleavings = Interleavings.TestCase
TestInterleavings.settings = settings(settings.default, stateful_step_count=40)
