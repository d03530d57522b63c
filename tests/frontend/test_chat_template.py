"""Chat templates: rendering, tools and template kwargs pass through, clear errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from engine.errors import RequestValidationError
from engine.tokenization import NoChatTemplateError, apply_chat_template, load_chat_template

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
]


def test_renders_chatml_with_generation_prompt(byte_tokenizer: Any) -> None:
    text = apply_chat_template(byte_tokenizer, MESSAGES)
    assert text == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    no_gen = apply_chat_template(byte_tokenizer, MESSAGES, add_generation_prompt=False)
    assert not no_gen.endswith("assistant\n")


def test_tools_and_template_kwargs_pass_through(byte_tokenizer: Any) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    text = apply_chat_template(
        byte_tokenizer, MESSAGES, tools=tools, chat_template_kwargs={"enable_thinking": False}
    )
    assert "<|im_start|>tools\nget_weather<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_override_template_inline_and_file(byte_tokenizer: Any, tmp_path: Any) -> None:
    inline = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    assert apply_chat_template(byte_tokenizer, MESSAGES, chat_template=inline) == (
        "[system]You are terse.[user]Hi"
    )
    path = tmp_path / "t.jinja"
    path.write_text(inline)
    assert load_chat_template(str(path)) == inline
    assert load_chat_template(inline) == inline
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="neither an existing file"):
        load_chat_template("/no/such/template.jinja")


def test_missing_template_error_says_what_to_do(byte_tokenizer: Any) -> None:
    tok = copy.deepcopy(byte_tokenizer)
    tok.chat_template = None
    with pytest.raises(NoChatTemplateError, match="no chat template; pass --chat-template FILE"):
        apply_chat_template(tok, MESSAGES)


def test_template_is_sandboxed(byte_tokenizer: Any) -> None:
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(RequestValidationError, match="chat template failed"):
        apply_chat_template(byte_tokenizer, MESSAGES, chat_template=evil)


def test_raise_exception_in_template_is_a_validation_error(byte_tokenizer: Any) -> None:
    tmpl = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(RequestValidationError, match="roles must alternate"):
        apply_chat_template(byte_tokenizer, MESSAGES, chat_template=tmpl)


def test_reserved_kwargs_rejected(byte_tokenizer: Any) -> None:
    with pytest.raises(RequestValidationError, match="tokenize"):
        apply_chat_template(byte_tokenizer, MESSAGES, chat_template_kwargs={"tokenize": True})
