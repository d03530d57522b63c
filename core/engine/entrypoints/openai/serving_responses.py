"""``POST /v1/responses``, ``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``.

A response is one chat generation (``responses_protocol.to_chat_request``): the chat path
prepares it (template, tools, reasoning, structured outputs), the engine runs it, and
``ResponseEvents`` turns the parsed output into Responses items. Streaming sends the typed
events as ``event: TYPE`` / ``data: JSON`` pairs, numbered by ``sequence_number``, from
``response.created`` to ``response.completed`` (or ``.incomplete`` / ``.failed``), with no
``[DONE]`` line, as OpenAI's stream does.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.entrypoints.openai.choice_state import ChoiceState
from engine.entrypoints.openai.errors import APIError, internal_error, stream_error_body
from engine.entrypoints.openai.message_parsing import ChatPlan, ChoiceParser
from engine.entrypoints.openai.protocol import ChatCompletionRequest
from engine.entrypoints.openai.responses_events import Event, ResponseEvents
from engine.entrypoints.openai.responses_output import ResponseRecord, finish_status
from engine.entrypoints.openai.responses_protocol import (
    ResponsesRequest,
    check_supported,
    input_messages,
    to_chat_request,
)
from engine.entrypoints.openai.responses_store import ResponseStore
from engine.entrypoints.openai.serving_base import (
    ClientDisconnected,
    EngineStream,
    ServingContext,
    first_output,
    new_request_id,
    outputs_from,
    until_disconnected,
)
from engine.entrypoints.openai.serving_chat import ChatServing
from engine.entrypoints.openai.sse import HEADERS
from engine.outputs import RequestOutput

logger = logging.getLogger("engine.server")
REQUEST_KIND = "responses"


class ResponsesServing:
    def __init__(
        self, ctx: ServingContext, chat: ChatServing, store: ResponseStore,
        validate: Callable[[ChatCompletionRequest], None] | None = None,
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.chat = chat
        self.store = store
        self.validate = validate  # the chat route's checks, on the translated request

    async def create(self, req: ResponsesRequest, raw: Request) -> Response:
        check_supported(req)
        model = self.ctx.resolve_model(req.model)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            history = self.store.previous(req.previous_response_id).conversation()
        messages = [*history, *input_messages(req.input)]
        chat_req = to_chat_request(req, [], messages)
        if self.validate is not None:
            with responses_params():
                self.validate(chat_req)
        req_id = new_request_id(raw)
        prepared, plan = await self.ctx.run_prepare(self.chat._prepare, chat_req, req_id, model)
        record = ResponseRecord(f"resp_{req_id}", model, req, messages)
        record.num_input_tokens = len(prepared.prompt_token_ids)
        stream = EngineStream(self.ctx, prepared, model)
        stream.kind = REQUEST_KIND
        record.engine_req_id = req_id
        if req.store:
            self.store.put(record)
        tracker = self.ctx.metrics.request_tracker()
        run = _Run(self.ctx, stream, record, plan, tracker)
        try:
            first = await until_disconnected(raw, first_output(stream))
        except BaseException:
            await run.close()
            record.finish("failed")
            raise
        if req.stream:
            return StreamingResponse(
                run.events(first), media_type="text/event-stream", headers=dict(HEADERS)
            )
        try:
            await until_disconnected(raw, run.collect(first))
        except APIError:
            record.finish("failed")
            raise
        except ClientDisconnected:
            return Response(status_code=499)
        finally:
            await run.close()
        return JSONResponse(record.to_dict())

    def retrieve(self, response_id: str) -> dict[str, Any]:
        return self.store.get(response_id).to_dict()

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Abort a response still being generated; its output so far is kept."""
        record = self.store.get(response_id)
        if record.status != "in_progress" or record.engine_req_id is None:
            raise APIError(
                f"Response {response_id!r} is {record.status}; only a response still in "
                "progress can be cancelled.",
                400,
                "response_id",
            )
        stream = self.ctx.inflight.streams.get(record.engine_req_id)
        if stream is not None:
            stream.aborted_by_server = True
            await stream.abort()
        record.finish("cancelled")
        return record.to_dict()


# Chat field names in a validation error -> the Responses field the client sent.
_PARAMS = {"max_completion_tokens": "max_output_tokens", "messages": "input"}


@contextlib.contextmanager
def responses_params() -> Iterator[None]:
    """Re-raise a chat validation error under the Responses request's field names."""
    try:
        yield
    except APIError as exc:
        param = exc.param or ""
        for chat_name, name in _PARAMS.items():
            if param.startswith(chat_name):
                exc.param = name
                exc.message = exc.message.replace(chat_name, name)
        raise


class _Run:
    """One engine request turned into a response record (and, streaming, its events)."""

    def __init__(
        self, ctx: ServingContext, stream: EngineStream, record: ResponseRecord, plan: ChatPlan,
        tracker: Any,
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.stream = stream
        self.record = record
        self.parser = ChoiceParser(plan, ctx.tokenizer)
        self.builder = ResponseEvents()
        self.state = ChoiceState(0)
        self.tracker = tracker
        self._seq = 0

    async def collect(self, first: RequestOutput | None) -> None:
        async for _ in self._item_events(first):
            pass

    async def events(self, first: RequestOutput | None) -> AsyncIterator[str]:
        record = self.record
        try:
            yield self._sse({"type": "response.created", "response": record.to_dict()})
            yield self._sse({"type": "response.in_progress", "response": record.to_dict()})
            async for event in self._item_events(first):
                yield self._sse(event)
            # No event type names a cancelled response: it ends as incomplete, status
            # "cancelled", with the output produced until then.
            terminal = {
                "completed": "response.completed",
                "incomplete": "response.incomplete",
                "cancelled": "response.incomplete",
            }.get(record.status, "response.failed")
            yield self._sse({"type": terminal, "response": record.to_dict()})
        except Exception as exc:  # after the headers: an error event, then response.failed
            logger.exception("responses stream %s failed", record.id)
            error = stream_error_body(exc, self.stream.req_id)["error"]
            record.error = {"code": str(error["code"]), "message": error["message"]}
            record.finish("failed")
            yield self._sse(
                {"type": "error", "code": str(error["code"]), "message": error["message"],
                 "param": error["param"]}
            )  # fmt: skip
            yield self._sse({"type": "response.failed", "response": record.to_dict()})
        finally:
            await self.close()

    async def _item_events(self, first: RequestOutput | None) -> AsyncIterator[Event]:
        """Output item events as the engine produces tokens; finishes the record."""
        record = self.record
        async for out in outputs_from(self.stream, first):
            if out.error:
                logger.error("request %s failed in the engine: %s", record.id, out.error)
                raise internal_error(self.stream.req_id)
            if out.num_cached_tokens:
                record.num_cached_tokens = out.num_cached_tokens
            for completion in out.outputs:
                delta = self.state.advance(completion)
                if delta is None:
                    continue
                self.tracker.on_tokens(len(delta.token_ids))
                for event in self.builder.add(self.parser.stream(delta.text)):
                    yield event
        self.state.force_finish("abort")  # the engine left it open: aborted
        for event in self.builder.add(self.parser.finish()):
            yield event
        status, reason = finish_status(self.state.finish_reason)
        for event in self.builder.finish(status, self.parser.num_tool_calls > 0):
            yield event
        record.output = self.builder.items
        record.num_output_tokens = len(self.state.token_ids)
        reasoning = self.builder.reasoning_text
        if reasoning:
            record.num_reasoning_tokens = len(
                self.ctx.tokenizer.encode(reasoning, add_special_tokens=False)
            )
        record.finish(status, reason)
        self.tracker.on_finish(
            self.state.finish_reason or "abort", record.num_input_tokens, record.num_output_tokens
        )

    def _sse(self, event: Event) -> str:
        event = {**event, "sequence_number": self._seq}
        self._seq += 1
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    async def close(self) -> None:
        if self.record.status == "in_progress":  # the client left, or the server aborted it
            self.record.finish("cancelled")
        self.tracker.close(self.record.num_input_tokens)
        await self.stream.close()
