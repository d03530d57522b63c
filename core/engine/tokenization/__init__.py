"""Tokenization: chat templates, prompt encoding, incremental detokenization, stop strings."""

from engine.tokenization.chat_template import (
    NoChatTemplateError,
    apply_chat_template,
    load_chat_template,
)
from engine.tokenization.detokenizer import IncrementalDetokenizer
from engine.tokenization.stop_strings import StopResult, StopStringChecker
from engine.tokenization.tokenizer import collect_eos_token_ids, encode_prompt, vocab_size_of

__all__ = [
    "IncrementalDetokenizer",
    "NoChatTemplateError",
    "StopResult",
    "StopStringChecker",
    "apply_chat_template",
    "collect_eos_token_ids",
    "encode_prompt",
    "load_chat_template",
    "vocab_size_of",
]
