"""``engine bench throughput | latency | serve``: measure the engine, print a table, save JSON.

``throughput`` and ``latency`` build the engine in-process and accept every engine flag of
``engine serve`` (``--model``, ``--load-format dummy``, ``--max-num-seqs`` ...);
``serve`` drives a server that is already running.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(name="bench", help="Benchmark the engine (offline or against a server).")

_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}

InputLen = Annotated[int, typer.Option("--random-input-len", "--input-len")]
OutputLen = Annotated[int, typer.Option("--random-output-len", "--output-len")]
SaveResult = Annotated[str | None, typer.Option("--save-result", help="Write the JSON here.")]


def _engine_from_args(argv: list[str]) -> Any:
    """Build ``LLM`` from engine flags (the same flags and parsing as ``engine serve``)."""
    from engine.cli.serve_args import UsageError, build_parser, flag_specs
    from engine.config import EngineArgs
    from engine.entrypoints.llm import LLM

    specs = [s for s in flag_specs() if s.owner == "engine"]
    try:
        ns = vars(build_parser(specs).parse_args(argv))
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None
    ns.pop("help", None)
    positional = ns.pop("model_positional", None)
    if positional:
        ns["model"] = positional
    if not ns.get("model"):
        raise typer.BadParameter("pass --model PATH (an HF folder, or config-only with dummy)")
    from engine.errors import StartupError

    try:
        return LLM(**{k: v for k, v in ns.items() if k in EngineArgs.field_names()})
    except StartupError as exc:  # a configuration the engine refuses: one line, exit 1
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _vocab_size(llm: Any) -> int:
    return int(llm.engine.vocab_size)


def _engine_facts(llm: Any) -> dict[str, Any]:
    """The memory plan the numbers were measured under (weights, KV capacity)."""
    runner = llm.engine.runner
    plan = getattr(runner, "plan", None)
    facts: dict[str, Any] = {"weights_bytes": getattr(runner, "weights_bytes", None)}
    if plan is not None:
        facts.update(
            kv_cache_bytes=plan.kv_cache_bytes,
            kv_tokens=plan.num_tokens,
            num_blocks=plan.num_blocks,
            block_size=plan.block_size,
        )
    return facts


def _finish(kind: str, result: dict[str, Any], save_result: str | None) -> None:
    from engine.benchmarks.report import envelope, save, table

    record = envelope(kind, result)
    save(save_result, record)
    rows = [(k, v) for k, v in result.items() if not isinstance(v, (dict, list))]
    for key, value in result.items():
        if isinstance(value, dict):
            rows += [(f"{key} {name}", number) for name, number in value.items()]
    typer.echo(table(rows))


@app.command(context_settings=_EXTRA)
def throughput(
    ctx: typer.Context,
    dataset_name: Annotated[str, typer.Option(help="random, nano-vllm or custom")] = "random",
    dataset_path: Annotated[
        str | None, typer.Option(help="custom: a JSONL file, vLLM's custom-dataset format.")
    ] = None,
    custom_output_len: Annotated[
        int, typer.Option(help="custom: output tokens of every request (-1: the file's).")
    ] = -1,
    num_prompts: int = 1000,
    input_len: InputLen = 512,
    output_len: OutputLen = 256,
    random_range_ratio: float = 0.0,
    random_prefix_len: int = 0,
    temperature: float = 1.0,
    save_result: SaveResult = None,
) -> None:
    """Offline throughput: every prompt submitted at once, output tokens per second."""
    from engine.benchmarks.datasets import custom_requests, nano_vllm_requests, random_requests
    from engine.benchmarks.offline import run_throughput

    if dataset_name not in ("random", "nano-vllm", "custom"):
        raise typer.BadParameter("--dataset-name must be random, nano-vllm or custom")
    if dataset_name == "custom" and (dataset_path is None or not Path(dataset_path).is_file()):
        raise typer.BadParameter(
            f"--dataset-name custom reads --dataset-path, a JSONL file; got {dataset_path!r}"
        )
    llm = _engine_from_args(list(ctx.args))
    if dataset_name == "custom":
        assert dataset_path is not None
        tokenizer = llm.get_tokenizer()
        try:
            requests = custom_requests(
                dataset_path, tokenizer.encode, num_prompts, custom_output_len
            )
        except ValueError as exc:  # the file's content: one line, exit 1
            typer.echo(f"error: --dataset-path {exc}", err=True)
            raise typer.Exit(1) from None
    elif dataset_name == "nano-vllm":
        requests = nano_vllm_requests()
    elif dataset_name == "random":
        requests = random_requests(
            num_prompts,
            input_len,
            output_len,
            _vocab_size(llm),
            random_range_ratio,
            random_prefix_len,
        )
    result = run_throughput(llm, requests, temperature)
    _finish("throughput", {**result, "engine": _engine_facts(llm)}, save_result)


@app.command(context_settings=_EXTRA)
def latency(
    ctx: typer.Context,
    batch_size: int = 1,
    input_len: InputLen = 128,
    output_len: OutputLen = 256,
    num_iters: int = 5,
    num_iters_warmup: int = 2,
    temperature: float = 1.0,
    save_result: SaveResult = None,
) -> None:
    """Latency of one batch, generated ``--num-iters`` times (sampled at ``--temperature``,
    1.0 by default as ``vllm bench latency`` samples; 0 for greedy)."""
    from engine.benchmarks.datasets import random_requests
    from engine.benchmarks.offline import run_latency

    llm = _engine_from_args(list(ctx.args))
    batch = random_requests(batch_size, input_len, output_len, _vocab_size(llm))
    result = run_latency(llm, batch, num_iters, num_iters_warmup, temperature)
    _finish("latency", {**result, "engine": _engine_facts(llm)}, save_result)


@app.command()
def serve(
    base_url: Annotated[str, typer.Option(help="The server's /v1 URL.")] = (
        "http://127.0.0.1:8000/v1"
    ),
    model: Annotated[str | None, typer.Option(help="Model name (default: the first).")] = None,
    dataset_name: str = "random",
    num_prompts: int = 1000,
    input_len: InputLen = 512,
    output_len: OutputLen = 256,
    random_range_ratio: float = 0.0,
    random_prefix_len: int = 0,
    vocab_size: Annotated[int, typer.Option(help="Token ids are drawn below this.")] = 10000,
    max_concurrency: int | None = None,
    request_rate: Annotated[float, typer.Option(help="Requests/s (inf: all at once).")] = float(
        "inf"
    ),
    api_key: Annotated[str | None, typer.Option(envvar="ENGINE_API_KEY")] = None,
    num_workers: Annotated[
        int, typer.Option(help="Client processes (split requests and concurrency).")
    ] = 1,
    save_result: SaveResult = None,
) -> None:
    """Drive a running server with concurrent streaming requests (TTFT, TPOT, ITL, E2E)."""
    import httpx

    from engine.benchmarks.datasets import nano_vllm_requests, random_requests
    from engine.benchmarks.serving import run_serving

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if model is None:
        resp = httpx.get(base_url.rstrip("/") + "/models", headers=headers, timeout=30)
        resp.raise_for_status()
        model = resp.json()["data"][0]["id"]
    if dataset_name == "nano-vllm":
        requests = nano_vllm_requests()
    else:
        requests = random_requests(
            num_prompts, input_len, output_len, vocab_size, random_range_ratio, random_prefix_len
        )
    result = asyncio.run(
        run_serving(
            base_url,
            model,
            requests,
            max_concurrency,
            request_rate,
            api_key,
            num_workers=num_workers,
        )  # fmt: skip
    )
    _finish("serve", result, save_result)
