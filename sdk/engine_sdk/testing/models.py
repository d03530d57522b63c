"""Tiny random Hugging Face checkpoints for tests: config, safetensors, tokenizer, template.

``build_tiny_model(path, "Qwen3ForCausalLM")`` writes a folder that both ``transformers``
(``AutoModelForCausalLM`` / ``AutoTokenizer``) and the engine load: config.json (hidden 64,
2 layers, 4 heads, 2 KV heads, head_dim 16), random weights from
``AutoModelForCausalLM.from_config`` (one ``model.safetensors`` or two shards with
``model.safetensors.index.json``), generation_config.json, and a byte-level BPE tokenizer
trained on a small built-in corpus (multi-byte UTF-8 round-trips) with ChatML special
tokens and a ChatML chat template. Needs torch, transformers and tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["CHATML_TEMPLATE", "SPECIAL_TOKENS", "build_tiny_model", "build_tiny_tokenizer"]

MODEL_TYPES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
}

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added as plain (non-special) tokens, as Qwen3 does, so parsers see them in decoded text.
EXTRA_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}"
    "{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a
single step. The engine serves language models over an OpenAI compatible HTTP API and
batches requests continuously while the key value cache is paged into fixed size blocks.
Hello world! How are you today? I am fine, thank you. What is the capital of France?
Paris is the capital of France, and Berlin is the capital of Germany.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159. Code: def main(): return {"a": [1, 2]}
Café, naïve, façade, jalapeño, Übermensch, smörgåsbord. 東京 and 北京 are cities. 😀 🚀 ✨
The weather is sunny, the sky is blue, and the birds are singing in the trees.
Once upon a time there was a little model that learned to predict the next token.
She said: "Streaming tokens one by one keeps the user happy." He replied: 'Indeed.'
"""


def build_tiny_tokenizer(path: Path, vocab_size: int = 384) -> Any:
    """Train a byte-level BPE tokenizer, save it under ``path`` and return it loaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines() * 4, trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.add_tokens(list(EXTRA_TOKENS))
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(path))
    # Also keep the template in tokenizer_config.json, where older readers look for it.
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = CHATML_TEMPLATE
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return AutoTokenizer.from_pretrained(str(path))


def _config(architecture: str, vocab_size: int, tokenizer: Any, overrides: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    if architecture not in MODEL_TYPES:
        raise ValueError(
            f"build_tiny_model has no recipe for {architecture!r}; known: {', '.join(MODEL_TYPES)}"
        )
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    settings: dict[str, Any] = {
        "architectures": [architecture],
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "initializer_range": 0.1,
        "bos_token_id": None,
        "eos_token_id": im_end,
        "pad_token_id": tokenizer.pad_token_id,
        "dtype": "float32",
    }
    if architecture == "MistralForCausalLM":
        settings["sliding_window"] = None
    settings.update(overrides)
    return AutoConfig.for_model(MODEL_TYPES[architecture], **settings)


def _save_sharded(model: Any, path: Path, num_shards: int = 2) -> None:
    """Split the state dict into ``num_shards`` files plus an HF index (tied weights once)."""
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    names = sorted(state)
    per_shard = -(-len(names) // num_shards)
    weight_map: dict[str, str] = {}
    for i in range(num_shards):
        shard_names = names[i * per_shard : (i + 1) * per_shard]
        file_name = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: state[n] for n in shard_names}, str(path / file_name), {"format": "pt"})
        weight_map.update({n: file_name for n in shard_names})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def build_tiny_model(
    path: str | Path,
    architecture: str = "Qwen3ForCausalLM",
    *,
    sharded: bool = False,
    seed: int = 0,
    tokenizer_vocab_size: int = 384,
    generation_config: dict[str, Any] | None = None,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random HF checkpoint of ``architecture`` into ``path``; return ``path``.

    ``config_overrides`` go to the HF config (``tie_word_embeddings=True``,
    ``rope_scaling={...}``, ``vocab_size=...`` larger than the tokenizer, ...).
    ``generation_config`` replaces the default generation_config.json content.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(path, tokenizer_vocab_size)
    vocab_size = int(config_overrides.pop("vocab_size", len(tokenizer)))
    config = _config(architecture, vocab_size, tokenizer, config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, dtype=torch.float32
    )
    if sharded:
        config.save_pretrained(str(path))
        _save_sharded(model, path)
    else:
        model.save_pretrained(str(path))
    gen = generation_config
    if gen is None:
        eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
        gen = {"eos_token_id": eos, "pad_token_id": tokenizer.pad_token_id}
        gen.update({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20})
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return path
