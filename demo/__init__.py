"""The SmolLM2 prefill/decode demo (``python -m demo``, ``make demo``), run from a checkout: it is not
part of the kvtier wheel.  The processes are in :mod:`demo.run`; the model layer is
:mod:`demo.weights` (loading), :mod:`demo.kvlayout` (KV cache <-> blocks), :mod:`demo.model`
(prefill and decode) and :mod:`demo.prompts`.

Importing the package sets ``HF_HUB_OFFLINE=1`` unless the variable is already set: it must be
set before huggingface_hub reads its constants (the first transformers import), and the demo
never reaches the network."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
