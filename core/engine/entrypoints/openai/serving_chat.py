"""``POST /v1/chat/completions``: messages -> chat template -> engine -> response or SSE.

Phases: ``_prepare`` (validate, render the template, build sampling parameters; the
engine's front end tokenizes, checks the context length and fans out ``n``), then
``_respond`` (one JSON body) or ``_stream`` (chunks).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.entrypoints.openai.chat_features import ChatFeatures
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
from engine.entrypoints.openai.logprobs import TokenText, chat_logprobs
from engine.entrypoints.openai.message_parsing import (
    ChatPlan,
    ChoiceParser,
    api_delta,
    api_tool_calls,
    make_chat_plan,
    needs_special_tokens,
    tool_finish_reason,
)
from engine.entrypoints.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    DeltaMessage,
    UsageInfo,
    continuous_usage,
)
from engine.entrypoints.openai.serving_base import (
    ClientDisconnected,
    EngineStream,
    ServingContext,
    build_sampling_params,
    first_output,
    new_request_id,
    outputs_from,
    prepare_prompts,
    until_disconnected,
)
from engine.entrypoints.openai.sse import DONE, HEADERS, sse_event
from engine.entrypoints.openai.structured_request import structured_outputs_from_request
from engine.entrypoints.openai.tool_choice import plan_tools
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.tokenization.input_processor import PreparedRequest

logger = logging.getLogger("engine.server")


def messages_to_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Flatten content parts to text; 400 naming the part for anything but text."""
    out = []
    for i, msg in enumerate(messages):
        item = msg.model_dump(exclude_none=True)
        if isinstance(msg.content, list):
            texts = []
            for j, part in enumerate(msg.content):
                kind = part.get("type")
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise APIError(
                        f"messages[{i}].content[{j}]: only text parts are supported "
                        f"(got type {kind!r}); send the content as a string or text parts.",
                        400,
                        f"messages[{i}].content",
                    )
                texts.append(part["text"])
            item["content"] = "\n".join(texts)
        elif msg.content is None:
            item["content"] = ""
        out.append(item)
    return out


class ChatServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        model = self.ctx.resolve_model(req.model)
        req_id = new_request_id(raw)
        prepared, plan = await self.ctx.run_prepare(self._prepare, req, req_id, model)
        prompt_ids, params = prepared.prompt_token_ids, prepared.params
        stream = EngineStream(self.ctx, prepared, model)
        tracker = self.ctx.metrics.request_tracker()
        if self.ctx.log_requests:
            logger.info(
                "chat request %s: %d prompt tokens, params=%s", req_id, len(prompt_ids), params
            )
        try:
            first = await until_disconnected(raw, first_output(stream))
        except BaseException:
            tracker.close(len(prompt_ids))
            await stream.close()
            raise
        meta = _ResponseMeta(
            f"chatcmpl-{req_id}", int(time.time()), model, len(prompt_ids), params, req, plan
        )
        if req.stream:
            body = self._stream(stream, first, meta, tracker)
            headers = dict(HEADERS)
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        try:
            return await until_disconnected(raw, self._respond(stream, first, meta, tracker))
        except ClientDisconnected:
            return Response(status_code=499)
        finally:
            tracker.close(len(prompt_ids))
            await stream.close()

    @property
    def features(self) -> ChatFeatures:
        return self.ctx.features if self.ctx.features is not None else ChatFeatures()

    def _prepare(
        self, req: ChatCompletionRequest, req_id: str, model: str | None
    ) -> tuple[PreparedRequest, ChatPlan]:
        """The rendered prompt through the engine's front end, and how to parse the answer."""
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError("top_logprobs needs logprobs: true", 400, "top_logprobs")
        structured = structured_outputs_from_request(req)
        tool_plan = plan_tools(req.tools, req.tool_choice, self.features, req.parallel_tool_calls)
        if tool_plan.constraint is not None and structured is not None:
            raise APIError(
                f"tool_choice {tool_plan.mode} constrains the output itself; drop "
                "structured_outputs / response_format or use tool_choice auto or none",
                400,
                "tool_choice",
            )
        messages = messages_to_dicts(req.messages)
        text = self._render(req, messages, req.add_generation_prompt)
        closed = self._prompt_closed_think(req, messages, text)
        plan = make_chat_plan(tool_plan, self.features, closed)
        requested = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = build_sampling_params(
            req, self.ctx.engine.default_sampling_params(), requested, logprobs
        )
        params.structured_outputs = tool_plan.constraint or structured
        if needs_special_tokens(plan):
            params.skip_special_tokens = False
        # The template already wrote the special tokens (BOS and role markers).
        prompt = {"prompt": text, "add_special_tokens": False}
        [prepared] = prepare_prompts(
            self.ctx, req_id, [prompt], params, req.priority, req.cache_salt, model, "messages"
        )
        return prepared, plan

    def _render(
        self, req: ChatCompletionRequest, messages: list[dict[str, Any]], generation_prompt: bool
    ) -> str:
        try:
            text: str = self.ctx.engine.apply_chat_template(
                messages,
                tools=req.tools,
                add_generation_prompt=generation_prompt,
                chat_template=req.chat_template,
                chat_template_kwargs=req.chat_template_kwargs,
            )
        except APIError:
            raise
        except Exception as exc:
            raise APIError(f"Could not apply the chat template: {exc}", 400, "messages") from None
        return text

    def _prompt_closed_think(
        self, req: ChatCompletionRequest, messages: list[dict[str, Any]], text: str
    ) -> bool:
        """Whether the generation prompt (what ``add_generation_prompt`` appends) already
        closed the think section, e.g. Qwen3's ``enable_thinking=False``."""
        parser_cls = self.features.reasoning_parser_cls
        if parser_cls is None or not req.add_generation_prompt:
            return False
        without = self._render(req, messages, False)
        tail = text[len(without) :] if text.startswith(without) else text[-64:]
        return bool(parser_cls(self.ctx.tokenizer).is_reasoning_end(tail))

    async def _respond(
        self, stream: EngineStream, first: RequestOutput | None, meta: _ResponseMeta, tracker: Any
    ) -> Response:
        states = [ChoiceState(i) for i in range(meta.params.n)]
        text_of = TokenText(self.ctx.tokenizer)
        async for out in outputs_from(stream, first):
            if out.error:
                logger.error("request %s failed in the engine: %s", meta.id, out.error)
                raise internal_error(meta.id)
            num_new = sum(len(d.token_ids) for d in advance_all(states, out).values())
            tracker.on_tokens(num_new)
        finish_open(states)
        record_finish(tracker, states, meta.num_prompt_tokens)
        num_top = meta.request.top_logprobs or 0
        choices = [
            ChatChoice(
                index=s.index,
                message=message,
                logprobs=chat_logprobs(s.logprobs, text_of, num_top)
                if meta.request.logprobs
                else None,
                finish_reason=finish_reason,
                stop_reason=s.stop_reason,
            )
            for s in states
            for message, finish_reason in [self._message(s, meta.plan)]
        ]
        response = ChatCompletionResponse(
            id=meta.id, created=meta.created, model=meta.model, choices=choices,
            usage=meta.usage(states),
        )  # fmt: skip
        return JSONResponse(response.model_dump())

    def _message(self, s: ChoiceState, plan: ChatPlan) -> tuple[AssistantMessage, str | None]:
        """The assistant message of a finished choice, and its finish reason."""
        if not plan.parses:
            return AssistantMessage(content=s.text), s.finish_reason
        parsed = ChoiceParser(plan, self.ctx.tokenizer).parse(s.text)
        message = AssistantMessage(
            content=parsed.content,
            reasoning_content=parsed.reasoning,
            reasoning=parsed.reasoning,
            tool_calls=api_tool_calls(parsed.tool_calls),
        )
        return message, tool_finish_reason(s.finish_reason, len(parsed.tool_calls), plan.tools.mode)

    async def _stream(
        self, stream: EngineStream, first: RequestOutput | None, meta: _ResponseMeta, tracker: Any
    ) -> AsyncIterator[str]:
        states = [ChoiceState(i) for i in range(meta.params.n)]
        text_of = TokenText(self.ctx.tokenizer)
        req = meta.request
        num_top = (req.top_logprobs or 0) if req.logprobs else None
        plan = meta.plan
        parsers = [ChoiceParser(plan, self.ctx.tokenizer) if plan.parses else None for _ in states]
        continuous = continuous_usage(req.stream_options)
        try:
            for s in states:
                role = DeltaMessage(role="assistant", content="")
                yield sse_event(meta.chunk([ChatChunkChoice(index=s.index, delta=role)]))
            async for out in outputs_from(stream, first):
                if out.error:
                    logger.error("request %s failed in the engine: %s", meta.id, out.error)
                    yield sse_event(internal_error_body(meta.id))
                    yield DONE
                    return
                deltas = advance_all(states, out)
                tracker.on_tokens(sum(len(d.token_ids) for d in deltas.values()))
                for idx, delta in deltas.items():
                    choice = _chunk_choice(idx, delta, text_of, num_top, parsers[idx])
                    if _says_something(choice):  # a parser holding text back: no chunk
                        usage = meta.usage(states) if continuous else None
                        yield sse_event(meta.chunk([choice], usage=usage))
            for s in states:
                last = s.force_finish("abort")
                if last is not None:
                    choice = _chunk_choice(s.index, last, text_of, num_top, parsers[s.index])
                    yield sse_event(meta.chunk([choice]))
            record_finish(tracker, states, meta.num_prompt_tokens)
            if req.stream_options is not None and req.stream_options.include_usage:
                yield sse_event(meta.chunk([], usage=meta.usage(states)))
            yield DONE
        except Exception as exc:  # an error mid-stream: tell the client, then end
            logger.exception("chat stream %s failed", meta.id)
            yield sse_event(stream_error_body(exc, meta.id))
            yield DONE
        finally:
            tracker.close(meta.num_prompt_tokens)
            await stream.close()


def _chunk_choice(
    index: int,
    delta: ChoiceDelta,
    text_of: TokenText,
    num_top: int | None,
    parser: ChoiceParser | None = None,
) -> ChatChunkChoice:
    finish_reason = delta.finish_reason
    if parser is None:
        message = DeltaMessage(content=delta.text) if delta.text else DeltaMessage()
    else:
        parsed = parser.stream(delta.text)
        if finish_reason is not None:  # the last chunk: flush what the parsers held back
            flushed = parser.finish()
            parsed.content = (parsed.content or "") + (flushed.content or "") or None
            parsed.reasoning_content = (parsed.reasoning_content or "") + (
                flushed.reasoning_content or ""
            ) or None
            parsed.tool_calls.extend(flushed.tool_calls)
            finish_reason = tool_finish_reason(
                finish_reason, parser.num_tool_calls, parser.plan.tools.mode
            )
        message = api_delta(parsed)
    return ChatChunkChoice(
        index=index,
        delta=message,
        logprobs=chat_logprobs(delta.logprobs, text_of, num_top) if num_top is not None else None,
        finish_reason=finish_reason,
        stop_reason=delta.stop_reason,
    )


def _says_something(choice: ChatChunkChoice) -> bool:
    delta = choice.delta
    return bool(
        delta.content
        or delta.reasoning_content
        or delta.tool_calls
        or choice.finish_reason is not None
        or choice.logprobs is not None
    )


class _ResponseMeta:
    def __init__(
        self, id: str, created: int, model: str, num_prompt_tokens: int,
        params: SamplingParams, request: ChatCompletionRequest, plan: ChatPlan | None = None,
    ) -> None:  # fmt: skip
        self.plan = plan or ChatPlan()
        self.id = id
        self.created = created
        self.model = model
        self.num_prompt_tokens = num_prompt_tokens
        self.params = params
        self.request = request

    def usage(self, states: list[ChoiceState]) -> UsageInfo:
        num_out = sum(len(s.token_ids) for s in states)
        return UsageInfo(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=num_out,
            total_tokens=self.num_prompt_tokens + num_out,
        )

    def chunk(self, choices: list[ChatChunkChoice], usage: UsageInfo | None = None) -> Any:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
