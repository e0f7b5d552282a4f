"""The demo's prompts (``prompts.txt``), fitted to a token budget."""

from __future__ import annotations

import importlib.resources
import math
from typing import Any

import attrs

from demo.model import encode_prompt

__all__ = ["DEFAULT_MAX_PROMPT_TOKENS", "demo_prompts"]

#: Default token budget of the longest demo prompt (see :func:`demo_prompts`).
DEFAULT_MAX_PROMPT_TOKENS = 1024


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
