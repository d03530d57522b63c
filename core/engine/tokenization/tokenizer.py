"""Small helpers around a transformers tokenizer: prompt encoding and EOS ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def encode_prompt(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of a text prompt (BOS added when the tokenizer adds one by default).

    Chat prompts rendered from a template already contain their special tokens, so the
    caller passes ``add_special_tokens=False`` for those.
    """
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return [int(i) for i in ids]


def collect_eos_token_ids(tokenizer: Any, generation_config: Mapping[str, Any]) -> list[int]:
    """The tokenizer's EOS id plus ``eos_token_id`` of generation_config.json (int or list)."""
    ids: list[int] = []
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.append(int(tok_eos))
    gen_eos = generation_config.get("eos_token_id")
    if isinstance(gen_eos, int):
        gen_eos = [gen_eos]
    for i in gen_eos or []:
        if int(i) not in ids:
            ids.append(int(i))
    return ids


def vocab_size_of(tokenizer: Any) -> int:
    """Number of ids the tokenizer can produce (base vocabulary plus added tokens)."""
    return len(tokenizer)
