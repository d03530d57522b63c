"""Token ids to bytes: byte-level BPE (tiny, Qwen3) and SentencePiece style tokenizers."""

from __future__ import annotations

from typing import Any

import pytest
from engine_outlines.vocabulary import (
    build_vocabulary,
    bytes_to_token_ids,
    decoder_style,
    eos_token_id_of,
    token_bytes,
)

TEXTS = [
    "The quick brown fox, 42 times!",
    '{"name": "Zoë", "tags": ["a b", "\\n"]}',
    "Café naïve 東京 and 北京 😀🚀 ✨\n\tend",
    "  leading spaces and trailing  ",
]


def _table(tokenizer: Any, vocab_size: int) -> dict[int, bytes]:
    return dict(token_bytes(tokenizer, vocab_size))


def _assert_round_trip(tokenizer: Any, table: dict[int, bytes], text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(table[i] for i in ids) == text.encode("utf-8"), (text, ids)


def test_tiny_byte_level_round_trip(tiny_tokenizer: Any) -> None:
    assert decoder_style(tiny_tokenizer).kind == "byte_level"
    table = _table(tiny_tokenizer, len(tiny_tokenizer))
    for text in TEXTS:
        _assert_round_trip(tiny_tokenizer, table, text)


def test_tiny_every_token_matches_its_decode(tiny_tokenizer: Any) -> None:
    table = _table(tiny_tokenizer, len(tiny_tokenizer))
    special = set(tiny_tokenizer.all_special_ids)
    partial = 0
    for token_id in range(len(tiny_tokenizer)):
        if token_id in special:
            assert token_id not in table
            continue
        decoded = tiny_tokenizer.decode([token_id])
        if "\ufffd" in decoded:
            partial += 1  # a piece of a multi-byte character: not valid UTF-8 alone
            with pytest.raises(UnicodeDecodeError):
                table[token_id].decode("utf-8")
        else:
            assert table[token_id] == decoded.encode("utf-8"), token_id
    assert partial > 0, "the tiny tokenizer should have partial-character tokens"


def test_special_and_out_of_range_tokens_are_left_out(tiny_tokenizer: Any) -> None:
    table = _table(tiny_tokenizer, 100)
    assert table and max(table) < 100
    for special in tiny_tokenizer.all_special_ids:
        assert special not in table
    think = tiny_tokenizer.convert_tokens_to_ids("<think>")
    assert _table(tiny_tokenizer, len(tiny_tokenizer))[think] == b"<think>"


def test_ids_sharing_bytes_are_grouped(tiny_tokenizer: Any) -> None:
    grouped = bytes_to_token_ids(tiny_tokenizer, len(tiny_tokenizer))
    flat = sorted(i for ids in grouped.values() for i in ids)
    assert flat == sorted(_table(tiny_tokenizer, len(tiny_tokenizer)))


def test_qwen3_round_trip_and_decode(qwen3_tokenizer: Any) -> None:
    tok = qwen3_tokenizer
    table = _table(tok, 151936)
    for text in TEXTS:
        _assert_round_trip(tok, table, text)
    for token_id in range(0, len(tok), 97):
        if token_id in table:
            decoded = tok.decode([token_id])
            if "\ufffd" not in decoded:
                assert table[token_id] == decoded.encode("utf-8"), token_id
    assert tok.eos_token_id not in table
    assert tok.convert_tokens_to_ids("<think>") in table  # plain added token


def test_no_eos_is_a_clear_error(tiny_tokenizer: Any) -> None:
    class NoEos:
        eos_token_id = None

    with pytest.raises(ValueError, match="no eos_token"):
        eos_token_id_of(NoEos(), 10)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        eos_token_id_of(tiny_tokenizer, 0)


def _sentencepiece_tokenizer() -> Any:
    """A Llama-2 style tokenizer: ``▁`` for spaces, ``<0xAB>`` byte fallback tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in "▁abcdefghijklmnopqrstuvwxyz.,":
        vocab[ch] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_sentencepiece_byte_fallback_round_trip() -> None:
    tok = _sentencepiece_tokenizer()
    style = decoder_style(tok)
    assert style.kind == "sentencepiece" and style.space_marker == "▁"
    table = _table(tok, len(tok))
    assert table[tok.convert_tokens_to_ids("<0xC3>")] == b"\xc3"
    assert table[tok.convert_tokens_to_ids("▁the")] == b" the"
    text = "the café 東 is here."
    ids = tok.encode(text, add_special_tokens=False)
    assert any(tok.convert_ids_to_tokens(i).startswith("<0x") for i in ids)
    # Metaspace prepends a space to the text; the decoder strips it from the first token.
    assert b"".join(table[i] for i in ids) == b" " + text.encode("utf-8")
    assert tok.decode(ids) == text


def test_build_vocabulary(tiny_tokenizer: Any) -> None:
    vocabulary = build_vocabulary(tiny_tokenizer, len(tiny_tokenizer))
    assert vocabulary.get_eos_token_id() == tiny_tokenizer.eos_token_id
    assert vocabulary.get(b"<think>") == [tiny_tokenizer.convert_tokens_to_ids("<think>")]
