"""Schema fuzzing with schemathesis: requests generated from the server's own OpenAPI
document (both valid and schema-violating ones) against the real server. Every answer is a
documented status (never a 5xx), every error is an OpenAI error object, and the server still
answers normal requests afterwards.

One test per operation, parametrized by pytest (``test_fuzz_operation[POST /v1/completions]``)
rather than by ``schema.parametrize()``: schemathesis's items share one node id, which
pytest-xdist (the test command runs it) takes as one test, so all but one operation would
silently not run. Hypothesis draws each case from the operation's positive and negative
strategies.

``SEC_FUZZ_EXAMPLES`` sets the examples per operation (default 40, kept small for CI).
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from engine.entrypoints.openai.api_server import build_app  # noqa: E402
from engine.entrypoints.openai.metrics import ServerMetrics  # noqa: E402
from engine.entrypoints.openai.serving_base import ServingContext  # noqa: E402
from engine.server_config import ServerArgs  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    not_a_server_error,
    status_code_conformance,
)
from sec_helpers import Server, good_request  # noqa: E402

pytestmark = pytest.mark.timeout(600)
NUM_EXAMPLES = int(os.environ.get("SEC_FUZZ_EXAMPLES", "40"))


def openapi_document() -> dict[str, Any]:
    """The document the real server serves (built here: with a key, it hides /openapi.json)."""
    stub = SimpleNamespace(tokenizer=[0] * 8, max_model_len=128, stats=lambda: None)
    ctx = ServingContext(stub, ["tiny"], ServerMetrics("tiny", lambda: None))
    return build_app(ctx, ServerArgs(log_stats_interval=0)).openapi()


schema = schemathesis.openapi.from_dict(openapi_document())


def error_object_on_errors(ctx: Any, response: Any, case: Any) -> None:
    if response.status_code < 400:
        return None
    body = json.loads(response.content)
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return None


@pytest.fixture(scope="module")
def fuzz_target(sec_server: Server) -> Server:
    return sec_server


OPERATIONS = {op.label: op for op in (r.ok() for r in schema.get_all_operations())}


def cases(label: str) -> Any:
    """Valid and schema-violating requests of one operation (an operation with nothing to
    violate, such as ``GET /health``, gets valid ones only)."""
    operation = OPERATIONS[label]
    modes = [operation.as_strategy(GenerationMode.POSITIVE)]
    if operation.body or operation.query or operation.path_parameters:
        modes.append(operation.as_strategy(GenerationMode.NEGATIVE))
    return st.one_of(modes)


def test_every_operation_is_fuzzed() -> None:
    assert len(OPERATIONS) >= 15, sorted(OPERATIONS)  # the document was read
    assert {"POST /v1/chat/completions", "POST /v1/completions"} <= set(OPERATIONS)


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_fuzz_operation(label: str, fuzz_target: Server) -> None:
    @given(case=cases(label))
    @settings(
        max_examples=NUM_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case: Any) -> None:
        if isinstance(case.body, dict) and case.path in ("/v1/completions", "/v1/chat/completions"):
            case.body.setdefault("max_tokens", 4)  # keep each generation short on CPU
            case.body["stream"] = False  # SSE bodies are not what the schema describes
        response = case.call(base_url=fuzz_target.base_url, headers=fuzz_target.headers, timeout=60)
        case.validate_response(
            response, checks=[not_a_server_error, status_code_conformance, error_object_on_errors]
        )

    check()


def test_server_alive_after_fuzzing(sec_server: Server) -> None:
    good_request(sec_server)
    assert "Traceback" not in sec_server.log(), sec_server.log()[-3000:]
