"""Refusing prompt text no context window could hold, before the tokenizer sees it.

No token decodes to more characters than the longest entry of the vocabulary, so a text
longer than ``max_model_len`` times that length cannot fit in the context, whatever it
says. Tokenizing it anyway costs seconds and gigabytes (a 15 MB message peaks above 3 GB)
for a request that ends in the context-length 400 regardless; counting characters costs
nothing. The bound keeps a factor of two in hand for normalizers that drop characters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.entrypoints.openai.errors import APIError

SLACK = 2


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the vocabulary's longest entry (its raw spelling, which is never
    shorter than its decoded text); 1 when the tokenizer has no readable vocabulary."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    try:
        vocab = get_vocab() if callable(get_vocab) else {}
        return max((len(str(token)) for token in vocab), default=1)
    except Exception:  # an unusual tokenizer: fall back to a generous constant
        return 64


def max_prompt_chars(tokenizer: Any, max_model_len: int) -> int:
    return max_model_len * longest_token_chars(tokenizer) * SLACK


def chat_text_chars(messages: Iterable[Any]) -> int:
    """Characters of the messages' text (string content and text parts)."""
    total = 0
    for msg in messages:
        content = msg.content
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    total += len(text)
    return total


def check_prompt_chars(num_chars: int, limit: int, max_model_len: int, param: str) -> None:
    """The context-length 400 for text longer than any prompt that could fit."""
    if num_chars > limit:
        raise APIError(
            f"This model's maximum context length is {max_model_len} tokens, but the "
            f"{param} has {num_chars} characters, more than any text of {max_model_len} "
            f"tokens can have (at most {limit}). Shorten the {param}.",
            400,
            param,
            "context_length_exceeded",
        )
