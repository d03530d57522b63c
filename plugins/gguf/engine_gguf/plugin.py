"""Entry point of the ``gguf`` plugin: declares the GGUF checkpoint format.

Imports neither torch nor gguf: the spec names its target lazily.
"""

from __future__ import annotations

from engine_sdk import ModelFormatSpec, hookimpl


@hookimpl
def register_model_formats() -> list[ModelFormatSpec]:
    """The GGUF loader: claims a ``.gguf`` file or a folder holding exactly one."""
    return [
        ModelFormatSpec(
            name="gguf",
            target="engine_gguf.format:GGUFFormat",
            description="GGUF (llama.cpp): llama, phi3, qwen2, qwen3; dequantized on load",
            suffixes=(".gguf",),
        )
    ]
