"""``OutlinesBackend``: constraints to outlines-core indexes for one tokenizer.

The byte vocabulary is built once per backend (a few seconds for a 150k-token tokenizer);
each ``compile`` is a regex (``regexes``) and an ``Index`` over that vocabulary. The engine
compiles in worker processes: the backend is pickled once per worker without its
tokenizer (``compile`` needs only the vocabulary), and the ``OutlinesGrammar`` it returns
is pickled back. Bad input raises ``ValueError`` saying what is wrong.
"""

from __future__ import annotations

from typing import Any, ClassVar

from engine_sdk.interfaces.structured_output import StructuredOutputBackend

from engine_outlines.grammar import OutlinesGrammar
from engine_outlines.regexes import constraint_regex, explain_regex_failure, one_line
from engine_outlines.vocabulary import build_vocabulary, eos_token_id_of


class OutlinesBackend(StructuredOutputBackend):
    """JSON schema, regex, choice and json_object; ``grammar`` is refused (not regular)."""

    name: ClassVar[str] = "outlines"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        self.eos_token_id = eos_token_id_of(tokenizer, vocab_size)
        self.vocabulary = build_vocabulary(tokenizer, vocab_size)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["tokenizer"] = None  # not needed to compile; large and slow to pickle
        return state

    def compile(self, kind: str, spec: Any) -> OutlinesGrammar:
        regex = constraint_regex(kind, spec)
        return OutlinesGrammar(self._index(kind, regex), self.vocab_size, self.eos_token_id, regex)

    def _index(self, kind: str, regex: str) -> Any:
        from outlines_core import Index

        try:
            return Index(regex, self.vocabulary)
        except (ValueError, TypeError) as exc:
            if kind == "regex":
                raise ValueError(explain_regex_failure(regex, one_line(exc))) from exc
            raise ValueError(f"cannot compile the {kind} constraint: {one_line(exc)}") from exc
