"""Incremental detokenization: multi-byte characters at every split, special tokens."""

from __future__ import annotations

from typing import Any

import pytest
from engine.tokenization import IncrementalDetokenizer

TEXTS = [
    "héllo 世界 😀 the END",
    "😀😀🎉 emoji only 👩‍👩‍👧",
    "中文字符和日本語のテキスト",
    "plain ascii, the quick brown fox",
    " leading space and  double  spaces ",
]


def _decode(tok: Any, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("text", TEXTS)
def test_every_prompt_output_split_one_token_at_a_time(any_tokenizer: Any, text: str) -> None:
    tok = any_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    full = _decode(tok, ids)
    assert full == text or full == text.lstrip()  # SentencePiece may drop one lead space
    for split in range(1, len(ids)):
        prompt, output = ids[:split], ids[split:]
        detok = IncrementalDetokenizer(tok, prompt)
        deltas = [detok.update([t]) for t in output]
        deltas.append(detok.flush())
        assert all("\ufffd" not in d for d in deltas), (split, deltas)
        # The prompt's complete characters plus the deltas rebuild the whole text.
        complete = max(j for j in range(split + 1) if "\ufffd" not in _decode(tok, ids[:j]))
        assert split - complete < 4
        prompt_text = _decode(tok, ids[:complete])
        assert prompt_text + "".join(deltas) == full, (split, deltas)
        assert detok.output_text == "".join(deltas)


@pytest.mark.parametrize("chunk", [2, 3, 5])
def test_multi_token_updates(any_tokenizer: Any, chunk: int) -> None:
    tok = any_tokenizer
    text = "a😀b 世界 c🎉"
    ids = tok.encode("x " + text, add_special_tokens=False)
    prompt, output = ids[:1], ids[1:]
    detok = IncrementalDetokenizer(tok, prompt)
    deltas = [detok.update(output[i : i + chunk]) for i in range(0, len(output), chunk)]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert _decode(tok, prompt) + "".join(deltas) == _decode(tok, ids)


def test_incomplete_character_is_held_until_complete(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    emoji_ids = tok.encode("😀", add_special_tokens=False)
    assert len(emoji_ids) == 4  # four byte tokens: the case under test
    detok = IncrementalDetokenizer(tok, tok.encode("hi", add_special_tokens=False))
    assert [detok.update([t]) for t in emoji_ids] == ["", "", "", "😀"]


def test_truncated_character_is_flushed_at_the_end(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    emoji_ids = tok.encode("😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, tok.encode("hi", add_special_tokens=False))
    assert detok.update(emoji_ids[:2]) == ""
    assert detok.flush() == "\ufffd" * len(_decode(tok, emoji_ids[:2]))


def test_special_tokens_skipped_or_kept(byte_tokenizer: Any) -> None:
    tok = byte_tokenizer
    eos = tok.eos_token_id
    body = tok.encode(" the end", add_special_tokens=False)
    prompt = tok.encode("hello", add_special_tokens=False)
    skip = IncrementalDetokenizer(tok, prompt, skip_special_tokens=True)
    keep = IncrementalDetokenizer(tok, prompt, skip_special_tokens=False)
    out_skip = "".join(skip.update([t]) for t in [*body, eos])
    out_keep = "".join(keep.update([t]) for t in [*body, eos])
    assert out_skip == " the end"
    assert out_keep == " the end<|endoftext|>"


def test_sentencepiece_leading_space_of_first_output_token(sp_tokenizer: Any) -> None:
    tok = sp_tokenizer
    ids = tok.encode("hello world the dog", add_special_tokens=True)
    pieces = tok.convert_ids_to_tokens(ids)
    split = next(k for k in range(1, len(ids)) if pieces[k].startswith("▁"))
    detok = IncrementalDetokenizer(tok, ids[:split])
    out = "".join(detok.update([t]) for t in ids[split:])
    assert _decode(tok, ids[:split]) + out == "hello world the dog"
    assert out.startswith(" ")  # decoding the new token alone would drop this space


@pytest.mark.parametrize("text", TEXTS)
def test_deferred_text_equals_the_per_token_text(any_tokenizer: Any, text: str) -> None:
    """``defer=True`` (one output at the end) decodes once at ``flush``: the same text as
    stepping every token, at every prompt/output split, with and without special tokens."""
    tok = any_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    for skip in (True, False):
        for split in range(1, len(ids)):
            prompt, output = ids[:split], ids[split:]
            stepped = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
            want = "".join(stepped.update([t]) for t in output) + stepped.flush()
            deferred = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip, defer=True)
            assert all(deferred.update([t]) == "" for t in output)  # nothing until the end
            assert deferred.flush() == want, (split, skip)
            assert deferred.output_text == want


def test_deferred_text_of_random_ids(any_tokenizer: Any) -> None:
    """Random ids (what a random-weight model samples): broken byte sequences, special
    tokens mid-text. The deferred text is the whole sequence's decode past the prompt's;
    byte-level BPE steps to the same text. (SentencePiece's byte fallback turns a whole run
    of byte tokens into U+FFFD once the run is invalid, including a valid byte the stepped
    path already emitted alone: there the deferred text is the one ``decode`` gives.)"""
    import random

    tok = any_tokenizer
    rng = random.Random(0)
    checked = 0
    for trial in range(60):
        prompt = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 6))]
        output = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        deferred = IncrementalDetokenizer(tok, prompt, defer=True)
        for t in output:
            deferred.update([t])
        text = deferred.flush()
        prefix, full = _decode(tok, prompt), _decode(tok, prompt + output)
        if not prefix.endswith("\ufffd") and full.startswith(prefix):
            assert text == full[len(prefix) :], trial
            checked += 1
        if tok.backend_tokenizer.decoder.__class__.__name__ == "ByteLevel":
            stepped = IncrementalDetokenizer(tok, prompt)
            assert text == "".join(stepped.update([t]) for t in output) + stepped.flush()
    assert checked > 20  # most trials compare with the whole decode
