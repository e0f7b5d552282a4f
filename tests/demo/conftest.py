"""Fixtures for the real-model demo tests: one SmolLM2 load per session.

The converted model is cached under ``/tmp/kvtier-test-cache`` (override with
``KVTIER_TEST_CACHE_DIR``), which survives between runs, so the ~25 s GGUF
dequantization happens once per machine.  When that cache is empty but the
user's default cache already holds the converted model, it is hard-linked
(or copied) from there instead of converting again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

TEST_CACHE_DIR = Path(os.environ.get("KVTIER_TEST_CACHE_DIR", "/tmp/kvtier-test-cache"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "model: uses the real SmolLM2 model")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _seed_from_default_cache(entry: Path) -> None:
    from demo import weights as W

    saved = os.environ.pop("KVTIER_CACHE_DIR", None)
    try:
        source = W.cache_entry()  # the user's default cache
    finally:
        if saved is not None:
            os.environ["KVTIER_CACHE_DIR"] = saved
    if source == entry or not W._entry_complete(source):
        return

    def build(dest: Path) -> None:
        for item in source.iterdir():
            if item.is_file() and item.name != W._MANIFEST:
                _link_or_copy(str(item), str(dest / item.name))

    W._publish_entry(entry, build)


@pytest.fixture(scope="session")
def model_cache_dir() -> Iterator[Path]:
    """``KVTIER_CACHE_DIR`` pointed at the persistent test cache for the whole session."""
    from demo import weights as W

    saved = os.environ.get("KVTIER_CACHE_DIR")
    os.environ["KVTIER_CACHE_DIR"] = str(TEST_CACHE_DIR)
    try:
        entry = W.cache_entry()
        if not W._entry_complete(entry):
            _seed_from_default_cache(entry)
        yield TEST_CACHE_DIR
    finally:
        if saved is None:
            os.environ.pop("KVTIER_CACHE_DIR", None)
        else:
            os.environ["KVTIER_CACHE_DIR"] = saved


@pytest.fixture(scope="session")
def smollm2(model_cache_dir: Path):
    """``(model, tokenizer)``, loaded once per session from the test cache.

    Runs torch on one thread while in use: test runners and other jobs share the
    CPUs, and oversubscribed intra-op threads slow the model down several-fold.
    """
    import torch

    from demo import weights as W

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield W.load_model()
    finally:
        torch.set_num_threads(threads)
