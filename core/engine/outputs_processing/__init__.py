"""From core outputs to caller-facing RequestOutputs: detokenize, stop strings, n > 1."""

from engine.outputs_processing.output_processor import OutputProcessor, ProcessedOutputs
from engine.outputs_processing.parent_request import ParentRequest
from engine.outputs_processing.request_state import RequestState
from engine.outputs_processing.stats import (
    EngineCounters,
    FinishedRequestStats,
    IterationStats,
    RequestTiming,
)

__all__ = [
    "EngineCounters",
    "FinishedRequestStats",
    "IterationStats",
    "OutputProcessor",
    "ParentRequest",
    "ProcessedOutputs",
    "RequestState",
    "RequestTiming",
]
