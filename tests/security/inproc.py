"""The real app over the real ``AsyncLLM`` (tiny model), served by uvicorn in a thread of the
test process, so tests can inject failures with monkeypatch and still talk HTTP."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from engine.async_llm import AsyncLLM
from engine.config import EngineArgs
from engine.entrypoints.openai.api_server import build_app
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.serving_base import ServingContext
from engine.server_config import ServerArgs
from sec_helpers import free_port


def make_engine(model: Path, **overrides: Any) -> AsyncLLM:
    args = EngineArgs(
        model=str(model), device="cpu", dtype="float32", max_model_len=128,
        kv_cache_memory_bytes=2 * 1024 * 1024, max_num_seqs=8, **overrides,
    )  # fmt: skip
    return AsyncLLM.from_args(args)


class InProcessServer:
    """``build_app`` over ``engine`` under uvicorn in a daemon thread."""

    def __init__(self, engine: AsyncLLM, **server: Any) -> None:
        self.engine = engine
        self.ctx = ServingContext(engine, ["tiny"], ServerMetrics("tiny", engine.stats))
        self.server_args = ServerArgs(log_stats_interval=0, **server)
        self.app = build_app(self.ctx, self.server_args)
        self.port = free_port()
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_config=None, http="h11",
            lifespan="on", timeout_keep_alive=5,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "in-process server did not start"
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    def post(self, path: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
        return httpx.post(self.base_url + path, json=body, timeout=60, **kwargs)
