"""The offline API: ``LLM(model=...).generate(prompts, params)`` and ``.chat(messages)``.

Runs the engine in this process: requests are added up front and the engine is stepped
until all finish, so the whole batch is scheduled together. Results come back in input
order. Keywords of ``LLM(...)`` are ``EngineArgs`` fields (an unknown one raises
``TypeError`` naming the closest fields).
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from engine.config import EngineArgs
from engine.embedding_vectors import EmbeddingOutput, check_dimensions, finish_embedding
from engine.llm_engine import LLMEngine
from engine.lora.request import LoRARequest
from engine.outputs import RequestOutput, SchedulerStats
from engine.outputs_processing import EngineCounters
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.tokenization import load_chat_template
from engine.tokenization.input_processor import PromptType

Conversation = Sequence[Mapping[str, Any]]


class LLM:
    """An engine for batch generation in the current process."""

    def __init__(self, model: str, **engine_args: Any) -> None:
        args = EngineArgs.from_kwargs(model=model, **engine_args)
        self.engine = LLMEngine.from_args(args)
        self._ids = itertools.count()

    def __del__(self) -> None:
        # The engine froze its startup objects (gc.freeze, for short collections while
        # serving); frozen reference cycles are never collected, so without this a
        # discarded LLM would keep its weights and KV cache (``del llm; gc.collect()``
        # must free them, as with any Python object).
        gc.unfreeze()

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """Wrap an already built engine (tests, custom assembly)."""
        self = cls.__new__(cls)
        self.engine = engine
        self._ids = itertools.count()
        return self

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def default_sampling_params(self) -> SamplingParams:
        return self.engine.default_sampling_params()

    def stats(self) -> SchedulerStats:
        return self.engine.stats()

    def counters(self) -> EngineCounters:
        return self.engine.counters()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (a string, token ids, or {"prompt_token_ids": [...]}).

        ``lora_request``: the adapter for every prompt, or one per prompt (None: the base
        model); needs ``LLM(enable_lora=True)``."""
        if self.engine.pooling is not None:
            raise ValueError(
                "this model runs as an embedding model (task embed): use LLM.embed, or "
                "build the LLM with task='generate'"
            )
        return self._run(_as_prompt_list(prompts), params, use_tqdm, lora_request)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of messages) or a list of conversations.

        ``chat_template`` overrides the model's template (a file path or Jinja text);
        ``lora_request`` as for ``generate``.
        """
        template = load_chat_template(chat_template)
        if messages and isinstance(messages[0], Mapping):
            conversations: list[Conversation] = [messages]  # type: ignore[list-item]
        else:
            conversations = list(messages)  # type: ignore[arg-type]
        prompts: list[PromptType] = []
        for conv in conversations:
            text = self.engine.apply_chat_template(
                conv,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                chat_template=template,
                chat_template_kwargs=chat_template_kwargs,
            )
            # The template already wrote the special tokens (BOS and role markers).
            prompts.append({"prompt": text, "add_special_tokens": False})
        return self._run(prompts, params, use_tqdm, lora_request)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        dimensions: int | None = None,
        normalize: bool | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingOutput]:
        """One embedding per prompt (a string, token ids, or {"prompt_token_ids": [...]}),
        in input order; needs an embedding model (``task="embed"`` or a bare body)."""
        pooling = self.engine.pooling
        if pooling is None:
            raise ValueError(
                "this model generates text (task generate): build the LLM with task='embed' "
                "to embed with its body"
            )
        check_dimensions(pooling, dimensions)
        outputs = self._run(_as_prompt_list(prompts), None, use_tqdm)
        results = []
        for out in outputs:
            if out.pooled is None:
                raise RuntimeError(f"request {out.request_id} ended without an embedding")
            vector = finish_embedding(out.pooled, pooling, dimensions, normalize)
            results.append(EmbeddingOutput(out.request_id, out.prompt_token_ids, vector))
        return results

    def _run(
        self,
        prompts: list[PromptType],
        params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run the prompts as one request of the front end (``LLMEngine.prepare_requests``:
        all validated before any is queued, fanned out into several prompts times n, ids
        ``offline-K`` or ``offline-K-P``), then step until all finish."""
        if not prompts:
            return []
        engine = self.engine
        request_id = f"offline-{next(self._ids)}"
        prepared = engine.prepare_requests(request_id, prompts, params, lora_request=lora_request)
        for p in prepared:  # one output per prompt, when it finishes: no per-step copies
            p.set_output_kind(RequestOutputKind.FINAL_ONLY)
        engine.add_prepared_requests(prepared)
        order = {p.request_id: i for i, p in enumerate(prepared)}
        results: list[RequestOutput | None] = [None] * len(order)
        bar = _progress_bar(len(order)) if use_tqdm and len(order) > 1 else None
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            engine.abort_request(list(order))
            raise
        finally:
            if bar is not None:
                bar.close()
        missing = [i for i, r in enumerate(results) if r is None]
        assert not missing, f"requests {missing} never finished"
        return [r for r in results if r is not None]


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    items: list[Any] = list(prompts)
    if items and all(isinstance(p, int) and not isinstance(p, bool) for p in items):
        return [items]  # one prompt given as token ids
    return items


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", unit="req", dynamic_ncols=True)
