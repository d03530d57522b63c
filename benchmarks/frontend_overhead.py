"""Per-token CPU cost of the server front end outside HTTP, with the engine in its own
process: what the receiver thread and the serving layer do for every streamed token.

For ``--streams`` requests and ``--steps`` steps it feeds the step messages the engine
process sends (one token per request per step) through ``ProcessLink``'s message
handling (unpickle, rebuild cumulative outputs) and then through the completions
serving path per token (``advance_all`` diff, the SSE chunk). No process, no sockets,
no event loop: the rest of the per-token cost is asyncio and uvicorn.

    python benchmarks/frontend_overhead.py --streams 256 --steps 256
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from typing import Any

from engine.entrypoints.openai.choice_state import ChoiceState, advance_all
from engine.entrypoints.openai.protocol import CompletionRequest
from engine.entrypoints.openai.serving_completion import _fast_chunk, _Meta
from engine.process_link import ProcessLink, _ClientRequest
from engine.sampling_params import RequestOutputKind


def step_message(step: int, streams: int, steps: int) -> bytes:
    finished = step == steps - 1
    updates = [
        (f"r{i}", finished, None, 0, None,
         ((0, f" tok{step}", [1000 + step], None, "length" if finished else None, None),),
         None)
        for i in range(streams)
    ]  # fmt: skip
    return pickle.dumps(("step", updates, None, None, []), protocol=5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--steps", type=int, default=256)
    args = parser.parse_args()
    messages = [step_message(s, args.streams, args.steps) for s in range(args.steps)]
    front: Any = ProcessLink.__new__(ProcessLink)
    cumulative = RequestOutputKind.CUMULATIVE
    front._requests = {
        f"r{i}": _ClientRequest("p", [1, 2, 3], cumulative) for i in range(args.streams)
    }
    request = CompletionRequest(model="m", prompt="p", stream=True)
    metas = {f"r{i}": _Meta(f"cmpl-{i}", 0, "m", 1, request, []) for i in range(args.streams)}
    states = {f"r{i}": [ChoiceState(0)] for i in range(args.streams)}
    t_unpickle = t_rebuild = t_serve = 0.0
    for raw in messages:
        t0 = time.perf_counter()
        _, updates, _, _, _ = pickle.loads(raw)
        t1 = time.perf_counter()
        outputs = [front._rebuild(u) for u in updates]
        t2 = time.perf_counter()
        for out in outputs:
            for idx, delta in advance_all(states[out.request_id], out).items():
                _fast_chunk(metas[out.request_id], idx, delta)
        t3 = time.perf_counter()
        t_unpickle += t1 - t0
        t_rebuild += t2 - t1
        t_serve += t3 - t2
    tokens = args.streams * args.steps
    us = {
        "unpickle_us_per_token": 1e6 * t_unpickle / tokens,
        "rebuild_us_per_token": 1e6 * t_rebuild / tokens,
        "diff_and_chunk_us_per_token": 1e6 * t_serve / tokens,
    }
    us["total_us_per_token"] = sum(us.values())
    print(json.dumps({"streams": args.streams, "steps": args.steps, **us}, indent=2))


if __name__ == "__main__":
    main()
