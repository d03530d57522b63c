"""Slices of a request's token sequence (prompt then outputs) without concatenating it.

``Request.all_token_ids`` builds a new list of every token; the scheduler and the block
hasher need short windows of it every step, so they slice the two parts directly:

    prompt_token_ids          output_token_ids
    [p0 p1 p2 p3 p4] [o0 o1 o2]        token_slice(req, 3, 6) -> [p3, p4, o0]
"""

from __future__ import annotations

from engine.core.request import Request


def token_slice(request: Request, start: int, end: int) -> list[int]:
    """Tokens ``[start, end)`` of prompt + outputs."""
    prompt = request.prompt_token_ids
    num_prompt_tokens = len(prompt)
    if end <= num_prompt_tokens:
        return prompt[start:end]
    outputs = request.output_token_ids
    if start >= num_prompt_tokens:
        return outputs[start - num_prompt_tokens : end - num_prompt_tokens]
    return prompt[start:] + outputs[: end - num_prompt_tokens]
