"""Chat templates: load an override and render conversations through the tokenizer.

Rendering goes through the tokenizer's ``apply_chat_template``, which uses transformers'
sandboxed Jinja environment (templates are never evaluated as Python). ``tools``,
``add_generation_prompt`` and template keywords such as ``enable_thinking`` pass through.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from engine.errors import RequestValidationError


class NoChatTemplateError(RequestValidationError):
    """The tokenizer has no chat template and none was given."""


def load_chat_template(value: str | None) -> str | None:
    """Resolve ``--chat-template``: a file path, or inline Jinja text; ``None`` stays None."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(
        f"--chat-template {value!r} is neither an existing file nor inline Jinja "
        "(inline templates contain '{{' or '{%'); pass a path to a .jinja file"
    )


def apply_chat_template(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render one conversation to the prompt text the model expects."""
    template = chat_template if chat_template is not None else tokenizer.chat_template
    if not template:
        raise NoChatTemplateError(
            "this model has no chat template; pass --chat-template FILE "
            "(or chat_template=... to LLM.chat), or use the completions API with a raw prompt"
        )
    kwargs = dict(chat_template_kwargs or {})
    reserved = {"tokenize", "conversation", "tools", "chat_template", "add_generation_prompt"}
    clash = sorted(reserved & kwargs.keys())
    if clash:
        raise RequestValidationError(
            f"chat_template_kwargs must not set {', '.join(clash)}; use the request fields"
        )
    try:
        rendered = tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **kwargs,
        )
    except RequestValidationError:
        raise
    except Exception as exc:  # jinja errors, raise_exception() inside templates
        raise RequestValidationError(f"chat template failed to render the messages: {exc}") from exc
    assert isinstance(rendered, str)
    return rendered
