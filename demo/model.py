"""Prefill and greedy decode with SmolLM2-135M-Instruct for the kvtier prefill/decode demo.

Who produces the first token
----------------------------
As in PD disaggregation, **the producer's prefill returns the first generated
token** (the argmax of the last prompt position).  The consumer receives that
token with the KV blocks and continues with :func:`decode_greedy`, feeding it as
the next input.  Nothing is recomputed on the consumer, so the consumer's output
equals the monolithic output token for token as long as the blocks arrive
bit-exact.  :func:`generate_monolithic` and :func:`recompute_decode` (the
consumer's fallback when no KV arrives) run the very same
``prefill`` -> ``decode_greedy`` path in one process.

All token lists returned by :func:`decode_greedy`, :func:`recompute_decode` and
:func:`generate_monolithic` are *the generated tokens*: they start with the first
generated token, hold at most ``max_new_tokens`` entries and end at (and include)
an EOS token if one is produced.  Decoding is greedy (argmax; ties go to the
lowest id), batch size 1.

Bit-exact reproducibility across processes assumes the same torch build and the
same ``torch.set_num_threads`` on both sides of a comparison (CPU GEMM reduction
order may depend on the thread count).

The weights are loaded by :mod:`demo.weights`, the KV cache is cut into blocks by
:mod:`demo.kvlayout`, the demo's prompts come from :mod:`demo.prompts`.
transformers 5.x: the forward kwarg is ``cache=`` (``past_key_values`` is a
deprecated alias) and the output field is ``.cache``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["decode_greedy", "encode_prompt", "eos_token_ids", "generate_monolithic", "prefill", "recompute_decode"]


# --------------------------------------------------------------------------- prefill / decode


def eos_token_ids(tokenizer: Any) -> frozenset[int]:
    """Token ids that end a reply (``<|im_end|>`` for SmolLM2-Instruct)."""
    ids = {tokenizer.eos_token_id}
    return frozenset(int(i) for i in ids if i is not None)


def encode_prompt(tokenizer: Any, prompt: str, *, system: str | None = None) -> list[int]:
    """Token ids of ``prompt`` as one user turn in the chat template, ready for the reply.

    Without ``system`` the SmolLM2 template inserts its default system message.
    """
    messages = [{"role": "user", "content": prompt}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    # tokenize=False + explicit encode: in transformers 5 apply_chat_template(tokenize=True)
    # returns a BatchEncoding, not a list.  The template already holds the special tokens.
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _as_input_ids(input_ids: Any) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"expected a non-empty 1-D token id sequence, got shape {tuple(ids.shape)}")
    return ids.unsqueeze(0)


def _greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits[0, -1]).item())


def prefill(model: Any, input_ids: Sequence[int] | torch.Tensor) -> tuple[DynamicCache, int]:
    """Run the prompt through the model.

    Returns ``(cache, first_token)``: the ``DynamicCache`` holding K/V of every
    prompt token and the greedy first generated token (argmax at the last
    prompt position), which the producer hands to the consumer.
    """
    from transformers import DynamicCache

    ids = _as_input_ids(input_ids).to(model.device)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return out.cache, _greedy(out.logits)


def _eos_set(eos: int | Iterable[int] | None) -> frozenset[int]:
    if eos is None:
        return frozenset()
    if isinstance(eos, int):
        return frozenset((eos,))
    return frozenset(int(e) for e in eos)


def decode_greedy(
    model: Any,
    cache: DynamicCache,
    next_input_token: int,
    max_new_tokens: int,
    eos: int | Iterable[int] | None,
) -> list[int]:
    """Greedy decode continuing from ``cache`` (mutated: it grows by one per step).

    ``next_input_token`` is the first generated token (from :func:`prefill`);
    it is the first element of the result and is fed at position
    ``cache.get_seq_length()``.  Stops after ``max_new_tokens`` tokens in all or
    right after an ``eos`` token.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    stop = _eos_set(eos)
    tokens = [int(next_input_token)]
    with torch.no_grad():
        while len(tokens) < max_new_tokens and tokens[-1] not in stop:
            step = torch.tensor([[tokens[-1]]], dtype=torch.long, device=model.device)
            out = model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=1)
            cache = out.cache
            tokens.append(_greedy(out.logits))
    return tokens


def recompute_decode(
    model: Any,
    input_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    eos: int | Iterable[int] | None,
) -> list[int]:
    """Consumer fallback without transferred KV: prefill locally, then decode."""
    cache, first = prefill(model, input_ids)
    return decode_greedy(model, cache, first, max_new_tokens, eos)


def generate_monolithic(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int) -> list[int]:
    """Reference: chat-template ``prompt``, prefill and decode in this process."""
    ids = encode_prompt(tokenizer, prompt)
    return recompute_decode(model, ids, max_new_tokens, eos_token_ids(tokenizer))
