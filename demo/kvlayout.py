"""The demo's KV layout: one block of SmolLM2's KV cache, and a ``DynamicCache`` <-> blocks.

A block holds the keys and values of ``tokens_per_block`` consecutive tokens for
*all* layers, as one contiguous tensor of shape
``[num_layers, 2, num_kv_heads, tokens_per_block, head_dim]`` (index 0 = K,
1 = V; native byte order), i.e. ``block_bytes`` raw bytes.  The last, partial
block is zero-padded; the number of valid tokens travels separately.
:meth:`KvLayout.fingerprint` names this layout (+ model id) for the handshake.

transformers 5.x notes: a ``DynamicCache`` is a list of ``DynamicLayer`` objects
with ``.keys`` / ``.values`` tensors of shape ``[batch, kv_heads, seq, head_dim]``
(no ``key_cache`` / ``value_cache`` lists).
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["DEFAULT_TOKENS_PER_BLOCK", "MODEL_ID", "KvLayout", "blocks_to_cache", "cache_to_blocks"]

#: Names the weights in the layout fingerprint (both sides must run the same model).
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1->f32"
DEFAULT_TOKENS_PER_BLOCK = 16
_LAYOUT_TAG = "kvtier-kv/1;[layers,2,kv_heads,tokens,head_dim]"


# --------------------------------------------------------------------------- KV layout


def _positive_int(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive int, got {value!r}")


def _is_dtype(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"{attribute.name} must be a floating torch.dtype, got {value!r}")


@attrs.frozen
class KvLayout:
    """Geometry of one KV block: ``[num_layers, 2, num_kv_heads, tokens_per_block, head_dim]``."""

    num_layers: int = attrs.field(validator=_positive_int)
    num_kv_heads: int = attrs.field(validator=_positive_int)
    head_dim: int = attrs.field(validator=_positive_int)
    dtype: torch.dtype = attrs.field(default=torch.float32, validator=_is_dtype)
    tokens_per_block: int = attrs.field(default=DEFAULT_TOKENS_PER_BLOCK, validator=_positive_int)
    model_id: str = attrs.field(default=MODEL_ID, validator=attrs.validators.instance_of(str))

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
        dtype: torch.dtype = torch.float32,
        model_id: str = MODEL_ID,
    ) -> KvLayout:
        """Layout of a (Llama-style) transformers config."""
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            num_layers=config.num_hidden_layers,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            tokens_per_block=tokens_per_block,
            model_id=model_id,
        )

    @classmethod
    def for_model(cls, model: Any, **kwargs: Any) -> KvLayout:
        """Layout of a loaded model (dtype taken from its parameters unless given)."""
        kwargs.setdefault("dtype", next(model.parameters()).dtype)
        return cls.from_config(model.config, **kwargs)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.num_kv_heads, self.tokens_per_block, self.head_dim)

    @property
    def token_bytes(self) -> int:
        """Bytes of K+V of one token over all layers."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def block_bytes(self) -> int:
        return self.token_bytes * self.tokens_per_block

    def num_blocks(self, num_tokens: int) -> int:
        """Blocks needed for ``num_tokens`` tokens (ceil)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self.tokens_per_block)

    def fingerprint(self) -> str:
        """Stable 16-hex-digit name of this layout and model, for the handshake."""
        text = (
            f"{_LAYOUT_TAG};model={self.model_id};layers={self.num_layers};"
            f"kv_heads={self.num_kv_heads};head_dim={self.head_dim};dtype={self.dtype};"
            f"tokens_per_block={self.tokens_per_block};byteorder={sys.byteorder}"
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- cache <-> blocks


def cache_to_blocks(cache: DynamicCache, layout: KvLayout) -> tuple[list[torch.Tensor], int]:
    """Pack a batch-1 ``DynamicCache`` into blocks.

    Returns ``(blocks, num_tokens)``: ``blocks`` are 1-D contiguous ``uint8``
    tensors of ``layout.block_bytes`` each (rows of one freshly allocated
    ``[n, block_bytes]`` tensor), ``ceil(num_tokens / tokens_per_block)`` of
    them; the tail of the last block is zero.
    """
    kv, num_tokens = _stack_cache(cache, layout)  # [L, 2, H, N, D]
    t = layout.tokens_per_block
    n = layout.num_blocks(num_tokens)
    out = torch.empty((n, layout.block_bytes), dtype=torch.uint8)
    for b in range(n):
        lo, hi = b * t, min(num_tokens, (b + 1) * t)
        dst = out[b].view(layout.dtype).view(layout.block_shape)
        dst[:, :, :, : hi - lo].copy_(kv[:, :, :, lo:hi])
        if hi - lo < t:
            dst[:, :, :, hi - lo :].zero_()
    return list(out.unbind(0)), num_tokens


def blocks_to_cache(
    blocks: Sequence[torch.Tensor | memoryview | bytes | bytearray],
    num_tokens: int,
    layout: KvLayout,
    *,
    device: torch.device | str | None = None,
) -> DynamicCache:
    """Rebuild a batch-1 ``DynamicCache`` from blocks made by :func:`cache_to_blocks`.

    ``blocks`` may be uint8 tensors (e.g. pool views) or any C-contiguous
    bytes-like objects (memoryviews of received frames), each exactly
    ``layout.block_bytes``.  The data is copied, so the blocks can be freed or
    reused as soon as this returns.  Padding past ``num_tokens`` is ignored.
    The cache tensors live on ``device`` (default: CPU).
    """
    from transformers import DynamicCache

    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens <= 0:
        raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
    n = layout.num_blocks(num_tokens)
    if len(blocks) != n:
        raise ValueError(
            f"{num_tokens} tokens need {n} blocks of {layout.tokens_per_block}, got {len(blocks)}"
        )
    t = layout.tokens_per_block
    kv = torch.empty(
        (layout.num_layers, 2, layout.num_kv_heads, num_tokens, layout.head_dim),
        dtype=layout.dtype,
    )
    for b, block in enumerate(blocks):
        src = _as_block(block, layout, b)
        lo, hi = b * t, min(num_tokens, (b + 1) * t)
        kv[:, :, :, lo:hi].copy_(src[:, :, :, : hi - lo])
    if device is not None:
        kv = kv.to(device)
    cache = DynamicCache()
    for layer in range(layout.num_layers):
        # update() concatenates onto an empty tensor, i.e. copies into fresh,
        # contiguous storage exactly like the prefill forward pass does.
        cache.update(kv[layer, 0].unsqueeze(0), kv[layer, 1].unsqueeze(0), layer)
    return cache


def _stack_cache(cache: Any, layout: KvLayout) -> tuple[torch.Tensor, int]:
    """All layers' K and V as one ``[L, 2, H, N, D]`` tensor, after validating shapes."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"expected a transformers DynamicCache, got {type(cache).__name__}")
    if len(layers) != layout.num_layers:
        raise ValueError(f"cache has {len(layers)} layers, layout has {layout.num_layers}")
    num_tokens = None
    for i, layer in enumerate(layers):
        if not isinstance(layer, DynamicLayer) or getattr(layer, "is_sliding", False):
            raise TypeError(f"layer {i} is {type(layer).__name__}; only full-attention DynamicLayer")
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not getattr(layer, "is_initialized", False) or keys is None or values is None:
            raise ValueError(f"layer {i} of the cache is empty")
        expect = (1, layout.num_kv_heads, keys.shape[-2], layout.head_dim)
        for name, x in (("keys", keys), ("values", values)):
            if tuple(x.shape) != expect:
                raise ValueError(f"layer {i} {name} shape {tuple(x.shape)}, expected {expect}")
            if x.dtype != layout.dtype:
                raise ValueError(f"layer {i} {name} dtype {x.dtype}, layout dtype {layout.dtype}")
        if num_tokens is None:
            num_tokens = keys.shape[-2]
        elif keys.shape[-2] != num_tokens:
            raise ValueError(f"layer {i} holds {keys.shape[-2]} tokens, layer 0 {num_tokens}")
    if not num_tokens:
        raise ValueError("the cache holds no tokens")
    with torch.no_grad():
        kv = torch.stack(
            [torch.stack((layer.keys[0], layer.values[0])) for layer in layers]
        ).cpu()
    return kv, num_tokens


def _as_block(block: Any, layout: KvLayout, index: int) -> torch.Tensor:
    """View one block's bytes as a ``layout.block_shape`` tensor (no copy when possible)."""
    if isinstance(block, torch.Tensor):
        if block.dtype != torch.uint8:
            raise TypeError(f"block {index}: expected uint8, got {block.dtype}")
        if not block.is_contiguous():
            raise ValueError(f"block {index}: tensor is not contiguous")
        raw = block.reshape(-1)
    else:
        try:
            mv = memoryview(block)
        except TypeError:
            raise TypeError(f"block {index}: not bytes-like ({type(block).__name__})") from None
        if not mv.c_contiguous:
            raise ValueError(f"block {index}: buffer is not C-contiguous")
        mv = mv.cast("B")
        if len(mv) != layout.block_bytes:
            raise ValueError(f"block {index}: {len(mv)} bytes, expected {layout.block_bytes}")
        with warnings.catch_warnings():  # read-only buffers: we only read (and copy)
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(mv, dtype=torch.uint8)
    if raw.numel() != layout.block_bytes:
        raise ValueError(f"block {index}: {raw.numel()} bytes, expected {layout.block_bytes}")
    if raw.data_ptr() % layout.itemsize or raw.storage_offset() % layout.itemsize:
        raw = raw.clone()  # misaligned for a dtype view
    return raw.view(layout.dtype).view(layout.block_shape)
