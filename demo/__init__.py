"""The SmolLM2 prefill/decode demo (``python -m demo``, ``make demo``), run from a checkout: it is not
part of the kvtier wheel.  The processes are in :mod:`demo.run`, the model layer in :mod:`demo.model`."""
