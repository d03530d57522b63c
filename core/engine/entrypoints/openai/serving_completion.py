"""``POST /v1/completions``: one or many prompts (text or token ids) -> engine -> response.

The engine's front end (``prepare_prompts``) tokenizes and checks the prompts and fans
them out (``engine.fan_out``): one engine request per prompt, ids ``{id}-{p}`` for several,
each with its n samples; choice ``index`` counts across them (prompt ``p``, sample ``i``
-> ``p * n + i``). ``echo`` prepends the prompt text (and, with ``logprobs``, the prompt's
logprobs).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.entrypoints.openai.choice_state import (
    ChoiceDelta,
    ChoiceState,
    advance_all,
    finish_open,
    record_finish,
)
from engine.entrypoints.openai.errors import (
    APIError,
    internal_error,
    internal_error_body,
    stream_error_body,
)
from engine.entrypoints.openai.logprobs import TokenText, completion_logprobs
from engine.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    continuous_usage,
)
from engine.entrypoints.openai.serving_base import (
    ClientDisconnected,
    EngineStream,
    ServingContext,
    build_sampling_params,
    close_all,
    new_request_id,
    open_streams,
    prepare_prompts,
    until_disconnected,
)
from engine.entrypoints.openai.sse import DONE, HEADERS, sse_event
from engine.entrypoints.openai.structured_request import structured_outputs_from_request
from engine.fan_out import choice_index, merge_outputs, split_choice
from engine.outputs import RequestOutput
from engine.tokenization.input_processor import PreparedRequest, PromptType

logger = logging.getLogger("engine.server")


@dataclass
class _Prompt:
    text: str  # for echo
    token_ids: list[int]
    prepared: PreparedRequest
    prompt_logprobs: list[Any] | None = None


@dataclass
class _Meta:
    id: str
    created: int
    model: str
    n: int
    request: CompletionRequest
    prompts: list[_Prompt]
    chunk_prefix: str | None = None  # the constant start of every streamed chunk

    def usage(self, states: list[ChoiceState]) -> UsageInfo:
        num_prompt = sum(len(p.token_ids) for p in self.prompts)
        num_out = sum(len(s.token_ids) for s in states)
        return UsageInfo(
            prompt_tokens=num_prompt, completion_tokens=num_out, total_tokens=num_prompt + num_out
        )


class CompletionServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        model = self.ctx.resolve_model(req.model)
        req_id = new_request_id(raw)
        prompts = await self.ctx.run_prepare(self._prepare, req, req_id, model)
        meta = _Meta(f"cmpl-{req_id}", int(time.time()), model, req.n, req, prompts)
        streams = await open_streams(self.ctx, [p.prepared for p in prompts], model, "generate")
        if self.ctx.log_requests:
            logger.info(
                "completion request %s: %d prompt(s), %s prompt tokens, params=%s",
                req_id, len(prompts), [len(p.token_ids) for p in prompts],
                prompts[0].prepared.params,
            )  # fmt: skip
        tracker = self.ctx.metrics.request_tracker()
        merged = merge_outputs(streams)
        try:
            first = await until_disconnected(raw, _next_or_none(merged))
        except BaseException:
            tracker.close(sum(len(p.token_ids) for p in prompts))
            await merged.aclose()
            await close_all(streams)
            raise
        if req.stream:
            body = self._stream(streams, merged, first, meta, tracker)
            return StreamingResponse(body, media_type="text/event-stream", headers=dict(HEADERS))
        try:
            return await until_disconnected(raw, self._respond(merged, first, meta, tracker))
        except ClientDisconnected:
            return Response(status_code=499)
        finally:
            tracker.close(sum(len(p.token_ids) for p in prompts))
            await merged.aclose()
            await close_all(streams)

    def _prepare(self, req: CompletionRequest, req_id: str, model: str) -> list[_Prompt]:
        if req.suffix:
            raise APIError("suffix is not supported by this server; leave it unset.", 400, "suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(
                f"best_of ({req.best_of}) different from n ({req.n}) is not supported; "
                "leave best_of unset.",
                400,
                "best_of",
            )
        params = build_sampling_params(
            req,
            self.ctx.engine.default_sampling_params(),
            req.max_tokens,
            req.logprobs,
            prompt_logprobs=req.logprobs if req.echo and req.logprobs is not None else None,
        )
        params.structured_outputs = structured_outputs_from_request(req)
        prepared = prepare_prompts(
            self.ctx, req_id, _prompt_list(req.prompt), params, req.priority, req.cache_salt,
            model,
        )  # fmt: skip
        return [_Prompt(self._echo_text(req, p), p.prompt_token_ids, p) for p in prepared]

    def _echo_text(self, req: CompletionRequest, prepared: PreparedRequest) -> str:
        """The prompt's text, which ``echo`` prepends (token-id prompts: decoded)."""
        if prepared.prompt is not None:
            return prepared.prompt
        return str(self.ctx.tokenizer.decode(prepared.prompt_token_ids)) if req.echo else ""

    async def _respond(
        self, merged: AsyncIterator[tuple[int, RequestOutput]], first: Any, meta: _Meta,
        tracker: Any,
    ) -> Response:  # fmt: skip
        states = [ChoiceState(i) for i in range(len(meta.prompts) * meta.n)]
        async for p_idx, out in _chain(first, merged):
            if out.error:
                logger.error("request %s failed in the engine: %s", meta.id, out.error)
                raise internal_error(meta.id)
            if out.prompt_logprobs is not None:
                meta.prompts[p_idx].prompt_logprobs = out.prompt_logprobs
            deltas = advance_all(states, out, choice_index(p_idx, meta.n))
            tracker.on_tokens(sum(len(d.token_ids) for d in deltas.values()))
        finish_open(states)
        choices = []
        for s in states:
            p_idx, sample = split_choice(s.index, meta.n)
            prompt = meta.prompts[p_idx]
            record_finish(tracker, [s], len(prompt.token_ids) if sample == 0 else 0)
            text = (prompt.text if meta.request.echo else "") + s.text
            choices.append(
                CompletionChoice(
                    index=s.index,
                    text=text,
                    logprobs=self._logprobs(prompt, s, meta.request),
                    finish_reason=s.finish_reason,
                    stop_reason=s.stop_reason,
                )
            )
        response = CompletionResponse(
            id=meta.id, created=meta.created, model=meta.model, choices=choices,
            usage=meta.usage(states),
        )  # fmt: skip
        return JSONResponse(response.model_dump())

    def _logprobs(
        self, prompt: _Prompt, state: ChoiceState, req: CompletionRequest
    ) -> CompletionLogprobs | None:
        if req.logprobs is None:
            return None
        text_of = TokenText(self.ctx.tokenizer)
        entries: list[Any] = list(state.logprobs)
        ids = list(state.token_ids)
        if req.echo:
            prompt_lps = list(prompt.prompt_logprobs or [])
            prompt_lps = [None] * (len(prompt.token_ids) - len(prompt_lps)) + prompt_lps
            entries = prompt_lps + entries
            ids = prompt.token_ids + ids
        return completion_logprobs(entries, ids, text_of, req.logprobs)

    async def _stream(
        self,
        streams: list[EngineStream],
        merged: AsyncGenerator[tuple[int, RequestOutput], None],
        first: Any,
        meta: _Meta,
        tracker: Any,
    ) -> AsyncIterator[str]:
        req = meta.request
        states = [ChoiceState(i) for i in range(len(meta.prompts) * meta.n)]
        text_of = TokenText(self.ctx.tokenizer)
        offsets = [0] * len(states)
        continuous = continuous_usage(req.stream_options)
        try:
            if req.echo:
                for s in states:
                    prompt = meta.prompts[split_choice(s.index, meta.n)[0]]
                    offsets[s.index] = len(prompt.text)
                    yield sse_event(self._chunk(meta, s.index, prompt.text, None))
            async for p_idx, out in _chain(first, merged):
                if out.error:
                    logger.error("request %s failed in the engine: %s", meta.id, out.error)
                    yield sse_event(internal_error_body(meta.id))
                    yield DONE
                    return
                deltas = advance_all(states, out, choice_index(p_idx, meta.n))
                tracker.on_tokens(sum(len(d.token_ids) for d in deltas.values()))
                for idx, delta in deltas.items():
                    if req.logprobs is None and not continuous:  # the common case, fast
                        yield _fast_chunk(meta, idx, delta)
                        continue
                    lps = self._delta_logprobs(delta, text_of, req, offsets[idx])
                    offsets[idx] += len(delta.text)
                    chunk = self._chunk(meta, idx, delta.text, lps, delta)
                    chunk.usage = meta.usage(states) if continuous else None
                    yield sse_event(chunk)
            for s in states:
                delta = s.force_finish("abort")
                if delta is not None:
                    yield sse_event(self._chunk(meta, s.index, "", None, delta))
            for s in states:
                p_idx, sample = split_choice(s.index, meta.n)
                num_prompt = len(meta.prompts[p_idx].token_ids)
                record_finish(tracker, [s], num_prompt if sample == 0 else 0)
            if req.stream_options is not None and req.stream_options.include_usage:
                chunk = CompletionResponse(
                    id=meta.id, created=meta.created, model=meta.model, choices=[],
                    usage=meta.usage(states),
                )  # fmt: skip
                yield sse_event(chunk)
            yield DONE
        except Exception as exc:
            logger.exception("completion stream %s failed", meta.id)
            yield sse_event(stream_error_body(exc, meta.id))
            yield DONE
        finally:
            tracker.close(sum(len(p.token_ids) for p in meta.prompts))
            await merged.aclose()
            await close_all(streams)

    def _delta_logprobs(
        self, delta: ChoiceDelta, text_of: TokenText, req: CompletionRequest, offset: int
    ) -> CompletionLogprobs | None:
        if req.logprobs is None:
            return None
        return completion_logprobs(delta.logprobs, delta.token_ids, text_of, req.logprobs, offset)

    def _chunk(
        self,
        meta: _Meta,
        index: int,
        text: str,
        logprobs: CompletionLogprobs | None,
        delta: ChoiceDelta | None = None,
    ) -> CompletionResponse:
        choice = CompletionChoice(
            index=index,
            text=text,
            logprobs=logprobs,
            finish_reason=delta.finish_reason if delta else None,
            stop_reason=delta.stop_reason if delta else None,
        )
        return CompletionResponse(
            id=meta.id, created=meta.created, model=meta.model, choices=[choice]
        )


def _fast_chunk(meta: _Meta, index: int, delta: ChoiceDelta) -> str:
    """The SSE event ``CompletionResponse(choices=[CompletionChoice(...)])`` would give (same
    fields, same order), written directly: the per-token path of 256 streams runs on one
    event loop, and two pydantic models per token were a large share of it."""
    if meta.chunk_prefix is None:
        meta.chunk_prefix = (
            f'data: {{"id":{json.dumps(meta.id, ensure_ascii=False)},"object":"text_completion",'
            f'"created":{meta.created},"model":{json.dumps(meta.model, ensure_ascii=False)},'
            '"choices":[{"index":'
        )
    return (
        f'{meta.chunk_prefix}{index},"text":{json.dumps(delta.text, ensure_ascii=False)},'
        f'"logprobs":null,"finish_reason":{json.dumps(delta.finish_reason)},'
        f'"stop_reason":{json.dumps(delta.stop_reason, ensure_ascii=False)}}}],"usage":null}}\n\n'
    )


def _prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list[PromptType]:
    """The request's prompts: one string or token-id list, or a batch of them."""
    if isinstance(prompt, str):
        return [prompt]
    items: list[Any] = list(prompt)
    if items and isinstance(items[0], int):
        return [items]  # one prompt of token ids
    return items


async def _next_or_none(
    merged: AsyncIterator[tuple[int, RequestOutput]],
) -> tuple[int, RequestOutput] | None:
    try:
        return await merged.__anext__()
    except StopAsyncIteration:
        return None


async def _chain(
    first: tuple[int, RequestOutput] | None, merged: AsyncIterator[tuple[int, RequestOutput]]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    if first is None:
        return
    yield first
    async for item in merged:
        yield item
