"""Token-level stop conditions checked after every sampled token.

Order: EOS and ``stop_token_ids`` (both only once ``min_tokens`` outputs exist), then the
length limits (``max_tokens``, ``max_model_len``). A stop token sampled as the last allowed
token therefore finishes as "stop", the model's own decision. Stop *strings* are matched by
the output processor after detokenization, which calls ``finish_requests``.
"""

from __future__ import annotations

from engine.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Set the request's finished status (and ``stop_reason``) if its last token ends it."""
    params = request.sampling_params
    num_output_tokens = len(request.output_token_ids)
    if num_output_tokens >= params.min_tokens:
        last_token_id = request.output_token_ids[-1]
        if not params.ignore_eos and last_token_id in params.eos_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last_token_id in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last_token_id
            return True
    if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH
        return True
    # A sequence never grows past the model's context: prompt + outputs <= max_model_len.
    if request.num_tokens >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH
        return True
    return False
