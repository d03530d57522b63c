"""Per-step host (CPU) time of the engine around the model, with a runner that costs nothing.

A decode step of a small model on a big GPU takes a few milliseconds; everything the host
does per step runs serially with it, so it must stay well under that. This script drives the
real scheduler, step packing, output processing and AsyncLLM delivery with a fake runner
that returns its tokens instantly, and reports the time of each phase per decode step:

    schedule   Scheduler.schedule()
    inputs     StepInputsBuilder.build (device cpu): the runner's host-side packing with
               block tables kept across steps
    inputs_fn  build_step_inputs (device cpu), the stateless form (whole tables each step;
               reported, not added to the host total)
    runner     the fake runner (building ModelRunnerOutput, as the real one does)
    update     Scheduler.update_from_output()
    outputs    OutputProcessor.process_outputs() + stop-string finishes (detokenize, stops)
    stats      LLMEngine._publish (scheduler stats, counters)
    deliver    ClientStreams.deliver to per-request asyncio queues

Default workload: 256 requests with 512-token prompts, 256 output tokens each, ignore_eos.
Only steps where every scheduled request decodes one token are counted.

    python benchmarks/host_overhead.py                      # trained byte-level BPE
    python benchmarks/host_overhead.py --tokenizer DIR      # a HF tokenizer folder
    python benchmarks/host_overhead.py --profile            # + cProfile of the decode steps
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from engine.async_llm import AsyncLLM
from engine.client_streams import Stream
from engine.core.engine_core import EngineCore
from engine.core.kv_cache import KVCacheConfig
from engine.core.request import ReqId, RequestStatus
from engine.core.scheduler import Scheduler
from engine.core.scheduler_config import SchedulerConfig
from engine.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from engine.llm_engine import LLMEngine
from engine.model_executor.inputs import StepInputsBuilder, build_step_inputs
from engine.outputs_processing import IterationStats
from engine.sampling_params import SamplingParams

PHASES = ("schedule", "inputs", "inputs_fn", "runner", "update", "outputs", "stats", "deliver")
HOST_PHASES = ("schedule", "inputs", "update", "outputs", "stats", "deliver")
# The host total is taken per step, so its min is not the sum of the phases' mins.
REPO = Path(__file__).resolve().parents[1]
# CPU time of this thread by default: on a shared machine, wall time mostly measures the
# other processes; on an idle core the two agree.
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}


class InstantRunner:
    """Returns each request's next token of a fixed text stream, at no cost."""

    def __init__(self, streams: dict[str, list[int]]) -> None:
        self.streams = streams

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        out = ModelRunnerOutput()
        sampled = out.sampled_token_ids
        for sr in so.scheduled:
            if sr.sample:
                stream = self.streams[sr.req_id]
                sampled[sr.req_id] = stream[len(sr.request.output_token_ids) % len(stream)]
        return out


def corpus_text() -> str:
    """Real text (the repository's docs and sources) so the detokenizer sees real merges."""
    parts = []
    for pattern in ("docs/**/*.md", "core/engine/**/*.py", "*.md"):
        for path in sorted(REPO.glob(pattern)):
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def load_tokenizer(path: str | None, text: str) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if path:
        return AutoTokenizer.from_pretrained(path)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.splitlines(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def build(args: argparse.Namespace) -> tuple[LLMEngine, AsyncLLM, asyncio.AbstractEventLoop]:
    text = corpus_text()
    tokenizer = load_tokenizer(args.tokenizer, text)
    corpus = tokenizer(text, add_special_tokens=False)["input_ids"]
    need = args.num_requests * 7 + args.prompt_len + args.output_len
    while len(corpus) < need:
        corpus = corpus + corpus
    max_model_len = args.prompt_len + args.output_len + 1
    blocks_per_seq = -(-max_model_len // args.block_size)
    scheduler = Scheduler(
        SchedulerConfig(args.num_requests, args.max_num_batched_tokens, max_model_len),
        KVCacheConfig(args.num_requests * blocks_per_seq + 1, args.block_size, True),
    )
    streams: dict[str, list[int]] = {}
    runner = InstantRunner(streams)
    engine = LLMEngine(
        EngineCore(scheduler, runner),
        tokenizer,
        max_model_len=max_model_len,
        vocab_size=len(tokenizer),
        eos_token_ids=[tokenizer.eos_token_id],
    )
    async_llm = AsyncLLM(engine, start=False)
    loop = asyncio.new_event_loop()  # not running: delivery only enqueues callbacks
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, stop=list(args.stop))
    for i in range(args.num_requests):
        start = i * 7  # distinct prompts (no prefix-cache sharing), real text
        prompt = corpus[start : start + args.prompt_len]
        request_id = f"req-{i}"
        streams[request_id] = corpus[start + args.prompt_len : start + args.prompt_len + 4096]
        engine.add_request(request_id, prompt, params)
        async_llm._streams.by_id[request_id] = Stream(loop, asyncio.Queue())
    return engine, async_llm, loop


def timed_step(
    engine: LLMEngine,
    async_llm: AsyncLLM,
    builder: StepInputsBuilder,
    clock: Callable[[], float] = time.thread_time,
) -> tuple[dict[str, float], int]:
    """One step split into phases (the same calls as ``LLMEngine.step``): seconds each, and
    the number of requests scheduled if every one of them decoded a single token (else 0)."""
    core = engine.engine_core
    scheduler = core.scheduler
    cpu = builder.device
    t0 = clock()
    so = scheduler.schedule()
    t1 = clock()
    builder.build(so, {})
    t1b = clock()
    build_step_inputs(so, builder.block_size, cpu, {})
    t2 = clock()
    runner_output = core.runner.execute(so)
    t3 = clock()
    core_outputs = scheduler.update_from_output(so, runner_output)
    t4 = clock()
    it = IterationStats(scheduler=None)
    processed = engine.output_processor.process_outputs(core_outputs, it)
    if processed.req_ids_to_finish:
        core.finish_requests(
            [ReqId(i) for i in processed.req_ids_to_finish], RequestStatus.FINISHED_STOPPED
        )
    t5 = clock()
    engine._publish(it)
    t6 = clock()
    async_llm._streams.deliver(processed.request_outputs)
    t7 = clock()
    stamps = (t0, t1, t1b, t2, t3, t4, t5, t6, t7)
    times = {phase: stamps[i + 1] - stamps[i] for i, phase in enumerate(PHASES)}
    is_decode = all(sr.num_tokens == 1 for sr in so.scheduled)
    return times, len(so.scheduled) if is_decode else 0


class GCTimer:
    """Time spent in the garbage collector (inside the phases), via ``gc.callbacks``."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._start = 0.0
        self._total = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = self._clock()
        else:
            self._total += self._clock() - self._start

    def take(self) -> float:
        total, self._total = self._total, 0.0
        return total

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def drain(async_llm: AsyncLLM, loop: asyncio.AbstractEventLoop) -> None:
    """Play the callers (untimed): run the queued callbacks and empty every stream."""

    async def consume() -> None:
        for stream in async_llm._streams.by_id.values():
            while not stream.queue.empty():
                stream.queue.get_nowait()

    loop.run_until_complete(consume())


def run(args: argparse.Namespace) -> dict[str, Any]:
    engine, async_llm, loop = build(args)
    if args.gc_freeze:
        # What the engine does once started (engine.gc_tuning): long-lived objects leave
        # the collector's generations, and the young generation's threshold is raised
        from engine.gc_tuning import settle_after_startup

        settle_after_startup()
    elif args.gc_freeze_only:  # the freeze alone (the engine before round 12)
        gc.collect()
        gc.freeze()
    builder = StepInputsBuilder(args.block_size, torch.device("cpu"))
    samples: list[dict[str, float]] = []
    profiler = cProfile.Profile() if args.profile else None
    gc_time = GCTimer(CLOCKS[args.clock])
    while engine.has_unfinished_requests():
        # Profile only once every request is admitted (decode steps, bar the first one).
        profiling = profiler is not None and len(samples) > 0
        if profiling:
            profiler.enable()
        times, num_decoded = timed_step(engine, async_llm, builder, CLOCKS[args.clock])
        if profiling:
            profiler.disable()
        if num_decoded == args.num_requests:
            times["gc"] = gc_time.take()
            samples.append(times)
        drain(async_llm, loop)
        gc_time.take()
    gc_time.close()
    loop.close()
    if not samples:
        raise SystemExit("no full decode steps were measured; check the workload arguments")
    result: dict[str, Any] = {"num_decode_steps": len(samples), "phases_ms": {}}
    for phase in PHASES:
        values = [s[phase] * 1e3 for s in samples]
        result["phases_ms"][phase] = {
            "mean": statistics.fmean(values),
            "median": statistics.median(values),
            "min": min(values),
        }
    host = [sum(s[p] for p in HOST_PHASES) * 1e3 for s in samples]
    gc_ms = [s["gc"] * 1e3 for s in samples]
    result["gc_ms"] = {"mean": statistics.fmean(gc_ms), "max": max(gc_ms)}
    result["host_total_ms"] = {
        "mean": statistics.fmean(host),
        "median": statistics.median(host),
        "min": min(host),
    }
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(args.profile_top)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--tokenizer", default=None, help="HF tokenizer folder (default: trained)")
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="the engine's collector settings after setup (freeze, young threshold)",
    )
    parser.add_argument("--gc-freeze-only", action="store_true", help="gc.freeze() alone")
    parser.add_argument("--profile", action="store_true", help="cProfile the decode steps")
    parser.add_argument("--profile-top", type=int, default=30)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args()
    result = run(args)
    result["args"] = vars(args)
    print(
        f"decode steps measured: {result['num_decode_steps']} (batch {args.num_requests}), "
        f"{args.clock} time"
    )
    print(f"{'phase':<10} {'mean ms':>9} {'median ms':>10} {'min ms':>8}")
    for phase in PHASES:
        m = result["phases_ms"][phase]
        print(f"{phase:<10} {m['mean']:9.3f} {m['median']:10.3f} {m['min']:8.3f}")
    h = result["host_total_ms"]
    print(
        f"{'host':<10} {h['mean']:9.3f} {h['median']:10.3f} {h['min']:8.3f}"
        "   (sum of the phases but runner and inputs_fn)"
    )
    g = result["gc_ms"]
    print(f"of which in the garbage collector: mean {g['mean']:.3f} ms, max {g['max']:.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
