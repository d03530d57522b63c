"""Server-sent events framing: ``data: {json}\\n\\n`` lines ending in ``data: [DONE]``."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

DONE = "data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(payload: BaseModel | dict[str, Any]) -> str:
    if isinstance(payload, BaseModel):
        body = payload.model_dump_json(exclude_unset=False)
    else:
        body = json.dumps(payload, ensure_ascii=False)
    return f"data: {body}\n\n"
