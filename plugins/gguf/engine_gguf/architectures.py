"""What each supported GGUF ``general.architecture`` becomes on the Hugging Face side."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one llama.cpp architecture maps to transformers.

    ``config_class`` is the transformers config class name; ``hf_architecture`` the
    ``architectures`` entry the engine looks up; ``permuted_qk`` whether llama.cpp's
    converter permuted the rows of ``attn_q`` / ``attn_k`` for its interleaved rope (the
    loader undoes it); ``defaults`` are config fields the GGUF does not store.
    """

    name: str
    config_class: str
    hf_architecture: str
    permuted_qk: bool
    defaults: tuple[tuple[str, object], ...] = ()


ARCHITECTURES: dict[str, GGUFArchitecture] = {
    arch.name: arch
    for arch in (
        GGUFArchitecture("llama", "LlamaConfig", "LlamaForCausalLM", permuted_qk=True),
        # qwen2/qwen3 use NEOX-style (rotate_half) rope in llama.cpp: no permutation.
        GGUFArchitecture(
            "qwen2",
            "Qwen2Config",
            "Qwen2ForCausalLM",
            permuted_qk=False,
            defaults=(("use_sliding_window", False),),
        ),
        # phi3: NEOX rope, fused attn_qkv and ffn_up (gate rows, then up rows).
        GGUFArchitecture("phi3", "Phi3Config", "Phi3ForCausalLM", permuted_qk=False),
        GGUFArchitecture(
            "qwen3",
            "Qwen3Config",
            "Qwen3ForCausalLM",
            permuted_qk=False,
            defaults=(("use_sliding_window", False),),
        ),
    )
}


def get_architecture(name: str) -> GGUFArchitecture:
    """The mapping for ``general.architecture`` = ``name``, or a ValueError naming the supported."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(
            f"GGUF general.architecture {name!r} is not supported by the gguf plugin; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}. Use a Hugging Face checkpoint "
            "folder for other architectures."
        ) from None
