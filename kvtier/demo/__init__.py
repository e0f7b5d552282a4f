"""The SmolLM2 prefill/decode demo (``kvtier demo``); the model layer is :mod:`kvtier.demo.model`."""
