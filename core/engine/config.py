"""Engine arguments: one dataclass whose field names are the CLI flags with underscores.

``LLM(model=..., max_num_batched_tokens=...)`` and ``engine serve --max-num-batched-tokens``
both fill ``EngineArgs``; each field's metadata carries its help text and help group so
the CLI, ``--config file.yaml`` and the docs are generated from this one place.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def arg(default: Any, help: str, group: str = "engine", **extra: Any) -> Any:
    """A dataclass field with CLI metadata."""
    meta = {"help": help, "group": group, **extra}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class EngineArgs:
    # model
    model: str | None = arg(None, "HF-format folder or GGUF file to serve.", "model")
    tokenizer: str | None = arg(None, "Tokenizer folder (default: the model's).", "model")
    revision: str | None = arg(None, "Model revision (hub checkouts only).", "model")
    download_dir: str | None = arg(None, "Where hub downloads are cached.", "model")
    trust_remote_code: bool = arg(False, "Allow custom code from the checkpoint.", "model")
    dtype: str = arg("auto", "auto, float16, bfloat16 or float32.", "model")
    max_model_len: int | None = arg(None, "Context length (default: the model's).", "model")
    load_format: str = arg("auto", "auto, or dummy for random weights from config.", "model")
    quantization: str | None = arg(None, "Quantization method (e.g. fp8).", "model")
    seed: int = arg(0, "Seed for weight init with --load-format dummy.", "model")
    chat_template: str | None = arg(None, "Chat template file or inline Jinja.", "model")
    generation_config: str = arg(
        "auto", "auto (the model's generation_config.json), vllm (neutral) or a folder.", "model"
    )
    override_generation_config: dict[str, Any] = arg(
        {}, "JSON dict overriding sampling defaults.", "model"
    )
    task: str = arg(
        "auto", "generate, embed, or auto (embed when only a pooling model serves the "
        "checkpoint's architecture, such as Qwen3Model; else generate).", "model",
    )  # fmt: skip
    pooling_type: str | None = arg(
        None, "Pooling of an embedding model: last or mean (default: the checkpoint's "
        "sentence-transformers pooling config, else the pooling model's own).", "model",
    )  # fmt: skip
    # cache
    block_size: int = arg(16, "Tokens per KV cache block.", "cache")
    gpu_memory_utilization: float = arg(0.92, "Fraction of device memory to use.", "cache")
    kv_cache_memory_bytes: int | None = arg(
        None, "KV cache size in bytes (required on CPU unless defaulted).", "cache"
    )
    kv_cache_dtype: str = arg("auto", "auto (model dtype) or fp8.", "cache")
    enable_prefix_caching: bool = arg(True, "Reuse KV blocks of shared prefixes.", "cache")
    prefix_caching_hash_algo: str = arg("sha256", "sha256 or xxhash.", "cache")
    # scheduler
    max_num_seqs: int = arg(256, "Most sequences in one step.", "scheduler")
    max_num_batched_tokens: int | None = arg(
        None, "Token budget per step (default 8192, at least max_num_seqs).", "scheduler"
    )
    enable_chunked_prefill: bool = arg(True, "Split long prompts across steps.", "scheduler")
    long_prefill_token_threshold: int = arg(
        0, "Cap on prompt tokens one request gets per step (0: off).", "scheduler"
    )
    scheduling_policy: str = arg("fcfs", "fcfs or priority.", "scheduler")
    max_num_queued_reqs: int | None = arg(None, "Reject new requests past this queue.", "scheduler")
    max_num_queued_tokens: int | None = arg(
        None, "Reject new requests past this many queued prompt tokens.", "scheduler"
    )
    # execution
    device: str = arg("auto", "auto, cpu or cuda.", "execution")
    attention_backend: str | None = arg(None, "Attention backend plugin name.", "execution")
    enforce_eager: bool = arg(False, "Disable CUDA graphs.", "execution")
    async_scheduling: bool = arg(
        True,
        "Schedule and prepare the next step while the device runs the current one "
        "(--no-async-scheduling: one step at a time). Tensor parallelism runs synchronously.",
        "execution",
    )
    tensor_parallel_size: int = arg(1, "Number of GPUs to shard the model over.", "execution")
    nnodes: int = arg(
        1, "Nodes the tensor-parallel ranks span (each runs tensor_parallel_size / nnodes).",
        "execution",
    )  # fmt: skip
    node_rank: int = arg(0, "This node's index (0: serves HTTP; others: --headless).", "execution")
    master_addr: str = arg(
        "127.0.0.1", "Node 0's address, which every node can reach (with --nnodes > 1).",
        "execution",
    )  # fmt: skip
    master_port: int = arg(
        29500, "torch.distributed rendezvous port on --master-addr; the next port carries "
        "the step inputs to the other nodes.", "execution",
    )  # fmt: skip
    max_logprobs: int = arg(20, "Most logprobs a request may ask for.", "execution")
    # LoRA adapters (vLLM's flags and defaults)
    enable_lora: bool = arg(
        False, "Serve LoRA adapters (PEFT folders) on top of the model.", "lora"
    )
    max_loras: int = arg(
        1, "Most distinct adapters in one batch (device slots); requests of further adapters "
        "wait.", "lora",
    )  # fmt: skip
    max_lora_rank: int = arg(
        16, "Largest adapter rank served; sizes the device slots (memory: see docs/lora.md).",
        "lora",
    )  # fmt: skip
    max_cpu_loras: int | None = arg(
        None, "Adapters kept loaded in host memory, least recently used dropped first "
        "(default: --max-loras).", "lora",
    )  # fmt: skip
    lora_merge_single_adapter: bool = arg(
        False, "While every running request uses the same adapter, add it into the weights "
        "and run the base model's kernels (batch-1 decode at the base model's speed); costs a "
        "device copy of the adapter-capable weights. Unquantized models only.", "lora",
    )  # fmt: skip
    # plugins
    plugins: list[str] = arg([], "Plugins to require (NAME) or block (no:NAME).", "plugins")
    # features (structured outputs, reasoning)
    structured_outputs_backend: str = arg(
        "auto",
        "Structured output backend plugin (e.g. outlines), or auto (highest priority "
        "installed). CLI: --structured-outputs-config.backend.",
        "features",
    )
    structured_outputs_max_repeat: int = arg(
        1024,
        "Largest repetition count a constraint may ask for (regex {m,n}, schema maxLength, "
        "maxItems, ...), multiplied along nesting; larger is a 400 before compiling. "
        "CLI: --structured-outputs-config.max-repeat.",
        "features",
    )
    structured_outputs_max_schema_depth: int = arg(
        64,
        "Deepest nesting of a JSON schema's objects and arrays; deeper is a 400. "
        "CLI: --structured-outputs-config.max-schema-depth.",
        "features",
    )
    structured_outputs_compile_timeout_s: float = arg(
        30.0,
        "Seconds a constraint may take to compile (in a worker process, killed past it); "
        "slower is a 400. CLI: --structured-outputs-config.compile-timeout-s.",
        "features",
    )
    structured_outputs_compile_memory_bytes: int = arg(
        4 << 30,
        "Memory (address space) a constraint's compile may use in its worker process on "
        "top of the worker's baseline; more is a 400 and the worker is replaced. "
        "CLI: --structured-outputs-config.compile-memory-bytes.",
        "features",
    )
    reasoning_parser: str | None = arg(
        None,
        "Reasoning parser plugin (e.g. qwen3, deepseek_r1): the think section goes to "
        "reasoning_content, and structured outputs constrain only the text after it.",
        "features",
    )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineArgs:
        """Build from keywords; an unknown keyword names the closest known ones."""
        known = set(cls.field_names())
        unknown = [k for k in kwargs if k not in known]
        if unknown:
            import difflib

            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, sorted(known), n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                hints.append(f"{name!r}{hint}")
            raise TypeError(f"unknown engine argument(s): {'; '.join(hints)}")
        return cls(**kwargs)

    def effective_max_num_batched_tokens(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(8192, self.max_num_seqs)


def field_defaults() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(EngineArgs):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out
