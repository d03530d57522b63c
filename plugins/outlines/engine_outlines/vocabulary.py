"""The bytes each token id stands for, and the outlines-core ``Vocabulary`` built from them.

outlines-core matches regexes over bytes, so every token must map to the exact bytes it
adds to the output, not to a display string: a byte-level BPE token such as ``"Ġw"`` is
``b" w"``, and ``"ðŁ"`` is the first two bytes of an emoji (not valid UTF-8 alone, yet a
legal step towards one). The mapping follows the tokenizer's own decoder:

- ``ByteLevel`` (GPT-2, Llama 3, Qwen): each character of a token is one byte through the
  GPT-2 byte/unicode table; a token with a character outside that table (an added token
  such as ``"\\n\\n"``) is its UTF-8 text. This is exactly what the decoder does.
- SentencePiece style (``Metaspace``, or ``Replace("▁", " ")`` with ``ByteFallback``):
  ``▁`` is a space and ``<0xAB>`` is the byte 0xAB.
- Anything else: ``convert_tokens_to_string``; a token that only decodes to U+FFFD is left
  out, since its bytes are unknown.

Left out, so no grammar can ever allow them: special tokens (BOS, EOS, chat markers), ids
at or past the model's ``vocab_size``, and tokens that decode to nothing. The EOS id is
handed to outlines-core separately: it ends the output once the grammar may end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPIECE_UNDERLINE = "\u2581"


def _gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible table: printable bytes map to themselves, the rest to 256+n."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


# str.translate table: byte-level character -> the latin-1 character of its byte, so that
# ``token.translate(_UNICODE_TO_LATIN1).encode("latin-1")`` is the token's bytes.
_UNICODE_TO_LATIN1 = {ord(c): chr(b) for b, c in _gpt2_bytes_to_unicode().items()}
# Deletes every character of the table: what remains is outside it.
_DROP_TABLE_CHARS: dict[int, None] = dict.fromkeys(_UNICODE_TO_LATIN1)


@dataclass(frozen=True)
class DecoderStyle:
    """How the tokenizer's decoder turns one token into bytes."""

    kind: str  # "byte_level" | "sentencepiece" | "other"
    space_marker: str = _SPIECE_UNDERLINE


def decoder_style(tokenizer: Any) -> DecoderStyle:
    """Read the decoder of a fast (``tokenizers``-backed) tokenizer; ``other`` if unknown."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.decoder is None:
        return DecoderStyle("other")
    # The decoder's own JSON (serializing the whole tokenizer would take a second).
    decoder = json.loads(backend.decoder.__getstate__())
    steps = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    types = [step.get("type") for step in steps]
    if "ByteLevel" in types:
        return DecoderStyle("byte_level")
    if "Metaspace" in types:
        step = steps[types.index("Metaspace")]
        return DecoderStyle("sentencepiece", step.get("replacement", _SPIECE_UNDERLINE))
    for step in steps:
        pattern = step.get("pattern", {})
        if step.get("type") == "Replace" and step.get("content") == " ":
            return DecoderStyle("sentencepiece", pattern.get("String", _SPIECE_UNDERLINE))
    if "ByteFallback" in types:
        return DecoderStyle("sentencepiece")
    return DecoderStyle("other")


def _byte_level_bytes(token: str) -> bytes:
    if token.translate(_DROP_TABLE_CHARS):
        # A character outside the byte table: the decoder keeps the token's UTF-8 text.
        return token.encode("utf-8")
    return token.translate(_UNICODE_TO_LATIN1).encode("latin-1")


def _sentencepiece_bytes(token: str, space_marker: str) -> bytes:
    fallback = _BYTE_FALLBACK.match(token)
    if fallback is not None:
        return bytes([int(fallback.group(1), 16)])
    return token.replace(space_marker, " ").encode("utf-8")


def _other_bytes(tokenizer: Any, token: str) -> bytes | None:
    text = str(tokenizer.convert_tokens_to_string([token]))
    if "\ufffd" in text and "\ufffd" not in token:
        return None  # a partial character whose bytes the tokenizer does not reveal
    if token.startswith(_SPIECE_UNDERLINE) and not text.startswith(" "):
        text = " " + text
    return text.encode("utf-8")


def token_bytes(tokenizer: Any, vocab_size: int) -> Iterator[tuple[int, bytes]]:
    """``(token_id, bytes)`` for every token a grammar may use (see the module docstring)."""
    style = decoder_style(tokenizer)
    special_ids = {int(i) for i in tokenizer.all_special_ids}
    if tokenizer.eos_token_id is not None:
        special_ids.add(int(tokenizer.eos_token_id))
    added = {
        int(i): tok.content
        for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if not getattr(tok, "special", False)
    }
    for token, token_id in tokenizer.get_vocab().items():
        if token_id >= vocab_size or token_id in special_ids:
            continue
        data: bytes | None
        if style.kind == "byte_level":
            data = _byte_level_bytes(token)
        elif token_id in added:
            data = added[token_id].encode("utf-8")
        elif style.kind == "sentencepiece":
            data = _sentencepiece_bytes(token, style.space_marker)
        else:
            data = _other_bytes(tokenizer, token)
        if data:
            yield token_id, data


def bytes_to_token_ids(tokenizer: Any, vocab_size: int) -> dict[bytes, list[int]]:
    """Group token ids by their bytes (several ids can spell the same bytes)."""
    table: dict[bytes, list[int]] = {}
    for token_id, data in token_bytes(tokenizer, vocab_size):
        table.setdefault(data, []).append(token_id)
    return table


def eos_token_id_of(tokenizer: Any, vocab_size: int) -> int:
    """The tokenizer's EOS id, checked to lie inside the model's vocabulary."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError(
            "the tokenizer defines no eos_token, so a structured output could never end; "
            "set eos_token in tokenizer_config.json"
        )
    if not 0 <= int(eos) < vocab_size:
        raise ValueError(
            f"the tokenizer's eos_token_id {eos} is outside the model's vocabulary of "
            f"{vocab_size} tokens; check the tokenizer matches the model"
        )
    return int(eos)


def build_vocabulary(tokenizer: Any, vocab_size: int) -> Any:
    """The outlines-core ``Vocabulary`` of ``tokenizer`` restricted to ``vocab_size`` ids."""
    from outlines_core import Vocabulary

    eos = eos_token_id_of(tokenizer, vocab_size)
    table = bytes_to_token_ids(tokenizer, vocab_size)
    if not table:
        raise ValueError("the tokenizer has no usable tokens for structured outputs")
    return Vocabulary(eos, table)
