"""The engine's default model, SmolLM2-135M-Instruct (Q4_1 GGUF), loads and answers.

Greedy decoding through transformers' ``LlamaForCausalLM`` with the plugin's config,
tokenizer and weights must say "Paris"; wrong dequantization or a missing q/k
un-permutation turns the answer into noise. The weights are also compared with
transformers' own GGUF reader.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from engine_gguf.format import GGUFFormat
from transformers.initialization import no_init_weights


@pytest.fixture(scope="module")
def smollm2(smollm2_format: GGUFFormat):
    config = smollm2_format.load_config()
    weights = dict(smollm2_format.iter_weights(torch.float32))
    return smollm2_format, config, weights


def _empty_model(config) -> transformers.LlamaForCausalLM:
    # Skipping the random init saves seconds; every parameter is overwritten below.
    with no_init_weights():
        model = transformers.LlamaForCausalLM(config).eval()
    model.tie_weights()
    return model


def test_config(smollm2) -> None:
    # The same values as transformers.AutoConfig.from_pretrained(folder, gguf_file=...).
    _, config, _ = smollm2
    assert isinstance(config, transformers.LlamaConfig)
    assert config.architectures == ["LlamaForCausalLM"]
    got = (
        config.hidden_size,
        config.num_hidden_layers,
        config.intermediate_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.vocab_size,
        config.max_position_embeddings,
    )
    assert got == (576, 30, 1536, 9, 3, 64, 49152, 8192)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 100000.0}
    assert config.rms_norm_eps == 1e-5
    assert config.tie_word_embeddings is True
    assert (config.bos_token_id, config.eos_token_id) == (1, 2)


def test_weights_load_strictly_and_greedy_answer_is_paris(smollm2, smollm2_tokenizer) -> None:
    _, config, weights = smollm2
    model = _empty_model(config)
    all_keys = set(model.state_dict())
    assert set(weights) == all_keys - {"lm_head.weight"}  # tied: lm_head is embed_tokens
    for name, tensor in weights.items():
        assert tensor.shape == model.state_dict()[name].shape, name
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert missing == ["lm_head.weight"] and unexpected == []
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    tokenizer = smollm2_tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    input_ids = torch.tensor([tokenizer(prompt).input_ids])
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=10,
            do_sample=False,
            pad_token_id=config.pad_token_id,
        )
    answer = tokenizer.decode(out[0, input_ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_weights_equal_reference_loader(smollm2, smollm2_format: GGUFFormat) -> None:
    # Reference: gguf's own HF -> GGUF name map (the one llama.cpp's converter uses) and
    # transformers' LlamaTensorProcessor un-permute over gguf's dequantize: the steps of
    # transformers' load_gguf_checkpoint, without its slow decoding of every metadata array
    # (from_pretrained(gguf_file=...) itself needs accelerate, which is not installed).
    import gguf
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    _, config, weights = smollm2
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    processor = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    tensors = {t.name: t for t in smollm2_format.gguf_file.reader.tensors}
    assert len(tensors) == len(weights) == 272
    # Every permuted q/k, and every tensor of the first and last layers and outside layers.
    checked = [
        hf
        for hf in weights
        if "q_proj" in hf
        or "k_proj" in hf
        or not hf.startswith("model.layers.")
        or hf.startswith(("model.layers.0.", "model.layers.29."))
    ]
    assert len(checked) == 2 * 30 + 2 * 9 - 4 + 2
    for hf in checked:
        tensor = weights[hf]
        gguf_name = name_map.get_name(hf, try_suffixes=(".weight", ".bias"))
        t = tensors[gguf_name]
        values = gguf.dequantize(t.data, t.tensor_type)
        values = processor.process(weights=values, name=t.name).weights
        reference = torch.from_numpy(values.copy()).reshape(tensor.shape)
        torch.testing.assert_close(tensor, reference, rtol=0, atol=0, msg=hf)
