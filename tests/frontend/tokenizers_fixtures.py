"""Tiny trained tokenizers for front-end tests (no downloads).

Two families the detokenizer must handle: GPT-2 style byte-level BPE (an emoji or CJK
character is split into byte tokens when the merges do not cover it) and Llama style
SentencePiece BPE with byte fallback (``<0xE4>`` tokens and the leading-space rule).
"""

from __future__ import annotations

import json
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if tools %}{{ '<|im_start|>tools\\n' }}{% for t in tools %}"
    "{{ t['function']['name'] }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)

CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "Stop here. The END is near; STOP words and stop strings: ### end ###",
    "numbers 0123456789 and punctuation !?;:'\"()[]{}<>",
    "tokens split across boundaries are tricky to detokenize",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_tokenizer(vocab_size: int = 400) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    hf.chat_template = CHATML_TEMPLATE
    return hf


def sentencepiece_tokenizer(vocab_size: int = 400) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(CORPUS * 20, trainer)
    # Byte-fallback tokens are ordinary vocabulary entries (not special), as in Llama.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for i in range(256):
        vocab.setdefault(f"<0x{i:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(data))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    return hf
