"""``engine run-batch -i in.jsonl -o out.jsonl [MODEL] [serve flags]``: an OpenAI batch file
through the engine, offline (``engine.entrypoints.run_batch`` does the work).

Batch flags: ``-i/--input-file``, ``-o/--output-file``, ``--max-concurrency N`` (lines in
flight, default 32) and ``--no-progress``. Every other flag is ``engine serve``'s (model,
engine sizing, parsers, chat template). Exit code 0 when the run finished, even with failed
lines (they are in the output with their error); 2 for a usage error, 1 when the engine
could not start.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

import typer

from engine.cli.serve_args import UsageError, parse_serve_args

logger = logging.getLogger("engine.server")
DEFAULT_MAX_CONCURRENCY = 32


def _batch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine run-batch", add_help=False)
    parser.add_argument("-i", "--input-file", required=True)
    parser.add_argument("-o", "--output-file", required=True)
    parser.add_argument("--max-concurrency", type=int, default=DEFAULT_MAX_CONCURRENCY)
    parser.add_argument("--no-progress", action="store_true")
    return parser


def run_batch_main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        batch, rest = _batch_parser().parse_known_args(argv)
    except SystemExit:
        print(
            "engine run-batch: error: needs -i/--input-file IN.jsonl and -o/--output-file "
            "OUT.jsonl (and --max-concurrency N: an integer)",
            file=sys.stderr,
        )
        return 2
    try:
        if batch.max_concurrency < 1:
            raise UsageError(f"--max-concurrency must be at least 1, got {batch.max_concurrency}")
        if not Path(batch.input_file).is_file():
            raise UsageError(f"-i/--input-file {batch.input_file!r} is not a file")
        parsed = parse_serve_args(rest)
        if isinstance(parsed, str):
            print(parsed)
            return 0
        from engine.cli.serve import check_lora_flags, find_default_model, setup_logging

        setup_logging(parsed.server_args.log_level)
        if parsed.engine_args.model is None:
            parsed.engine_args.model = find_default_model()
        check_lora_flags(parsed.engine_args, parsed.server_args)
    except UsageError as exc:
        print(f"engine run-batch: error: {exc}", file=sys.stderr)
        return 2
    from engine.errors import EngineError

    try:
        summary = _run(parsed.engine_args, parsed.server_args, batch)
    except EngineError as exc:
        logger.error("%s", exc)
        return 1
    print(
        f"engine run-batch: {summary.num_lines} line(s): {summary.num_succeeded} succeeded, "
        f"{summary.num_failed} failed; results in {batch.output_file}",
        file=sys.stderr,
    )
    return 0


def _run(engine_args: Any, server_args: Any, batch: argparse.Namespace) -> Any:
    from tqdm import tqdm

    from engine.async_llm import AsyncLLM
    from engine.entrypoints.openai.api_server import build_app
    from engine.entrypoints.openai.chat_features import load_chat_features
    from engine.entrypoints.openai.metrics import ServerMetrics
    from engine.entrypoints.openai.server import attach_stats_listener, default_served_name
    from engine.entrypoints.openai.serving_base import ServingContext
    from engine.entrypoints.run_batch import run_batch
    from engine.lora.registry import build_lora_registry

    # No HTTP listener: the key and the stats log line serve nobody here.
    server_args = dataclasses.replace(server_args, api_key=None, log_stats_interval=0)
    features = load_chat_features(engine_args, server_args)
    with open(batch.input_file, encoding="utf-8") as f:
        total = sum(1 for line in f if line.strip())
    engine = AsyncLLM.from_args(engine_args)
    try:
        names = server_args.served_model_name or [default_served_name(engine_args.model)]
        ctx = ServingContext(
            engine=engine, served_model_names=list(names),
            metrics=ServerMetrics(names[0], lambda: engine.stats()),
            max_logprobs=engine_args.max_logprobs, features=features,
            lora=build_lora_registry(engine_args, server_args, list(names)),
        )  # fmt: skip
        attach_stats_listener(engine, ctx.metrics)
        app = build_app(ctx, server_args)
        bar = tqdm(total=total, unit="req", disable=batch.no_progress, desc="run-batch")
        failed = 0

        def on_done(ok: bool) -> None:
            nonlocal failed
            failed += not ok
            bar.update(1)
            bar.set_postfix(failed=failed, refresh=False)

        with (
            open(batch.input_file, encoding="utf-8") as lines,
            open(batch.output_file, "w", encoding="utf-8") as out,
        ):
            summary = asyncio.run(run_batch(app, lines, out, batch.max_concurrency, on_done))
        bar.close()
        return summary
    finally:
        engine.shutdown()


def register(app: typer.Typer) -> None:
    """Add ``run-batch`` to the root CLI; flags are parsed here, not by Typer."""

    @app.command(
        "run-batch",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "help_option_names": [],
        },
        add_help_option=False,
        help="Run an OpenAI batch file (JSONL) through a model (see engine run-batch --help).",
    )
    def run_batch(ctx: typer.Context) -> None:
        raise typer.Exit(run_batch_main(list(ctx.args)))


if __name__ == "__main__":
    sys.exit(run_batch_main(sys.argv[1:]))
