"""``engine chat`` and ``engine complete``: talk to a running ``engine serve`` from a terminal.

``engine chat`` is a REPL over ``/v1/chat/completions`` (streamed, with history; ``/reset``
clears it, ``/exit`` or Ctrl-D quits); ``--quick "hi"`` asks once and exits.
``engine complete`` does the same over ``/v1/completions`` without history.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

DEFAULT_URL = "http://127.0.0.1:8000/v1"

UrlOpt = Annotated[str, typer.Option("--url", help="Server base URL (with /v1).")]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Model name (default: the server's first).")
]
KeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", help="API key (default: ENGINE_API_KEY or OPENAI_API_KEY env)."),
]
QuickOpt = Annotated[
    str | None, typer.Option("--quick", help="Send this one message, print the answer, exit.")
]
MaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", help="Output token limit.")]
TempOpt = Annotated[float | None, typer.Option("--temperature", help="Sampling temperature.")]


def _client(url: str, api_key: str | None) -> Any:
    import openai

    key = api_key or os.environ.get("ENGINE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return openai.OpenAI(base_url=url, api_key=key or "EMPTY", max_retries=0)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _explain(exc: Exception, url: str) -> typer.Exit:
    import openai

    if isinstance(exc, openai.APIConnectionError):
        return _fail(f"cannot reach a server at {url}; start one with `engine serve` or set --url")
    if isinstance(exc, openai.AuthenticationError):
        return _fail("the server wants an API key: pass --api-key or set ENGINE_API_KEY")
    if isinstance(exc, openai.APIStatusError):
        return _fail(f"the server answered {exc.status_code}: {exc.message}")
    return _fail(str(exc))


def _pick_model(client: Any, model: str | None) -> str:
    if model:
        return model
    models = client.models.list().data
    if not models:
        raise _fail("the server lists no models; pass --model")
    return str(models[0].id)


def _sampling(max_tokens: int | None, temperature: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    if temperature is not None:
        out["temperature"] = temperature
    return out


def _stream_chat(client: Any, model: str, messages: list[dict[str, str]], **kw: Any) -> str:
    parts = []
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True, **kw):
        for choice in chunk.choices:
            text = choice.delta.content or ""
            parts.append(text)
            sys.stdout.write(text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(parts)


def _stream_completion(client: Any, model: str, prompt: str, **kw: Any) -> str:
    parts = []
    for chunk in client.completions.create(model=model, prompt=prompt, stream=True, **kw):
        for choice in chunk.choices:
            parts.append(choice.text)
            sys.stdout.write(choice.text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(parts)


def _read(prompt: str) -> str | None:
    try:
        return input(prompt)
    except (EOFError, KeyboardInterrupt):
        sys.stdout.write("\n")
        return None


def chat(
    url: UrlOpt = DEFAULT_URL,
    model: ModelOpt = None,
    api_key: KeyOpt = None,
    system: Annotated[str | None, typer.Option("--system", help="System prompt.")] = None,
    quick: QuickOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TempOpt = None,
) -> None:
    """Chat with a running server (streamed). /reset clears history, /exit quits."""
    client = _client(url, api_key)
    kw = _sampling(max_tokens, temperature)
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    try:
        name = _pick_model(client, model)
        if quick is not None:
            _stream_chat(client, name, [*history, {"role": "user", "content": quick}], **kw)
            return
        typer.echo(f"Chatting with {name} at {url}. /reset clears the history, /exit quits.")
        while (line := _read("> ")) is not None:
            if line.strip() in ("/exit", "/quit"):
                break
            if line.strip() == "/reset":
                history = history[:1] if system else []
                continue
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            answer = _stream_chat(client, name, history, **kw)
            history.append({"role": "assistant", "content": answer})
    except typer.Exit:
        raise
    except Exception as exc:
        raise _explain(exc, url) from None


def complete(
    url: UrlOpt = DEFAULT_URL,
    model: ModelOpt = None,
    api_key: KeyOpt = None,
    quick: QuickOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TempOpt = None,
) -> None:
    """Complete prompts with a running server (streamed); each line is a new prompt."""
    client = _client(url, api_key)
    kw = _sampling(max_tokens, temperature)
    try:
        name = _pick_model(client, model)
        if quick is not None:
            _stream_completion(client, name, quick, **kw)
            return
        typer.echo(f"Completing with {name} at {url}. /exit quits.")
        while (line := _read("> ")) is not None:
            if line.strip() in ("/exit", "/quit"):
                break
            if line.strip():
                _stream_completion(client, name, line, **kw)
    except typer.Exit:
        raise
    except Exception as exc:
        raise _explain(exc, url) from None


def register(app: typer.Typer) -> None:
    """Add ``chat`` and ``complete`` to the root CLI."""
    app.command("chat")(chat)
    app.command("complete")(complete)
