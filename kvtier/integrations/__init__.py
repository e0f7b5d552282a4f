"""Engine integrations for kvtier.

* :mod:`kvtier.integrations.vllm` — ``KvTierSecondaryTier``, a vLLM 0.33.0 ``SecondaryTierManager``
  that vLLM loads by ``module_path`` (see ``docs/integrations/vllm.md``).

This package imports nothing from any engine: ``import kvtier`` and ``import kvtier.integrations``
work without vLLM installed. Only importing :mod:`kvtier.integrations.vllm` itself needs vLLM.
"""

__all__: list[str] = []
