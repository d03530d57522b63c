"""Engine: continuous batching, paged KV cache and an OpenAI-compatible server.

``from engine import LLM, SamplingParams``. Heavy modules (torch) load on first use, so
``import engine`` stays cheap for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from engine.entrypoints.llm import LLM
    from engine.lora.request import LoRARequest
    from engine.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "LoRARequest", "SamplingParams", "StructuredOutputsParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.entrypoints.llm import LLM

        return LLM
    if name == "LoRARequest":
        from engine.lora.request import LoRARequest

        return LoRARequest
    if name in ("SamplingParams", "StructuredOutputsParams"):
        from engine import sampling_params

        return getattr(sampling_params, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
