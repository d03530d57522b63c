"""Stored responses (``store: true``): a bounded in-memory map, oldest dropped first.

It backs ``GET /v1/responses/{id}``, ``previous_response_id`` and cancel. It lives in one
API server process and is lost on restart; with ``--api-server-count`` above 1 a later
request may reach another process that never saw the response (a 404 / 400 that says so).
``--responses-store-size`` bounds it (records, not bytes: each holds the conversation text,
at most about ``max_model_len`` tokens of it); 0 turns storing off.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.responses_output import ResponseRecord

DEFAULT_STORE_SIZE = 1000


class ResponseStore:
    def __init__(self, max_size: int = DEFAULT_STORE_SIZE) -> None:
        self.max_size = max_size
        self._records: OrderedDict[str, ResponseRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def put(self, record: ResponseRecord) -> None:
        if self.max_size <= 0:
            return
        self._records[record.id] = record
        self._records.move_to_end(record.id)
        while len(self._records) > self.max_size:
            self._records.popitem(last=False)

    def get(self, response_id: str) -> ResponseRecord:
        """The record, or a 404 that says why it may be gone."""
        record = self._records.get(response_id)
        if record is None:
            raise APIError(self._missing(response_id), 404, "response_id", "not_found")
        return record

    def previous(self, response_id: str) -> ResponseRecord:
        """The record a ``previous_response_id`` names, or a 400 on that field."""
        record = self._records.get(response_id)
        if record is None:
            raise APIError(
                self._missing(response_id),
                400,
                "previous_response_id",
                "previous_response_not_found",
            )
        if record.status == "in_progress":
            raise APIError(
                f"Response {response_id!r} is still in progress; wait for it to finish.",
                400,
                "previous_response_id",
            )
        return record

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._records[response_id]

    def _missing(self, response_id: str) -> str:
        if self.max_size <= 0:
            return (
                f"Response {response_id!r} was not stored: this server keeps no responses "
                "(--responses-store-size 0)."
            )
        return (
            f"Response with id {response_id!r} not found. This server keeps the last "
            f"{self.max_size} stored responses in memory (--responses-store-size), per API "
            "server process, until restart; send the conversation as input items instead."
        )
