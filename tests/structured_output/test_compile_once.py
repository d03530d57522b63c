"""Each grammar is compiled once (issue 17 item 1): a constraint whose compile failed, or
whose grammar is too large for the whole cache, is refused on repeats without compiling
again; a flood of distinct specs keeps the refusal memory bounded; bounds are checked
before any compile."""

from __future__ import annotations

import engine_outlines.plugin
import pytest
from engine.errors import RequestValidationError
from engine.sampling_params import StructuredOutputsParams as Params
from engine.structured_output.bounds import regex_repeat_count
from engine.structured_output.cache import RefusedGrammars
from engine.structured_output.keys import GrammarKey
from structured_output_fakes import ManagerFactory


def test_a_failed_compile_is_not_repeated(make_manager: ManagerFactory) -> None:
    manager = make_manager(engine_outlines.plugin)
    for _ in range(3):
        with pytest.raises(RequestValidationError, match="cannot compile the regex"):
            manager.compile(Params(regex="(a"), timeout_s=30)
    assert manager.num_compiles == 1


def test_a_grammar_larger_than_the_cache_is_refused_and_not_rebuilt(
    make_manager: ManagerFactory,
) -> None:
    manager = make_manager(engine_outlines.plugin, max_cache_bytes=64)
    for _ in range(3):
        with pytest.raises(RequestValidationError, match="more than the server's whole grammar"):
            manager.compile(Params(regex="[a-z]{1,50}"), timeout_s=30)
    assert manager.num_compiles == 1
    assert len(manager.cache) == 0


def test_bounds_refuse_before_compiling(make_manager: ManagerFactory) -> None:
    manager = make_manager(engine_outlines.plugin)
    cases = [
        (Params(regex="a{1000}{1000}"), "1000000 repetitions"),
        (Params(json={"type": "string", "minLength": 100000}), "minLength asks for 100000"),
        (Params(json={"type": "array", "maxItems": 1000000}), "maxItems asks for 1000000"),
    ]
    for params, message in cases:
        with pytest.raises(RequestValidationError, match=message):
            manager.compile(params, timeout_s=30)
    assert manager.num_compiles == 0


@pytest.mark.parametrize(
    ("pattern", "count"),
    [
        ("a{1000}{1000}", 1_000_000),
        ("(a{10}){10}", 100),
        ("(a{10}|b{50}){3,4}", 200),
        (r"\d{3}-\d{4}", 4),
        (r"x\{5}", 1),
        (r"\p{L}{7}", 7),
        ("[{]{9}", 9),
        ("[a]{2}]{3}", 3),
        ("a{2,}", 2),
        ("a{,5}", 5),
        ("a{x}", 1),
    ],
)
def test_regex_repeat_count(pattern: str, count: int) -> None:
    assert regex_repeat_count(pattern) == count


def test_refusal_memory_is_bounded() -> None:
    refused = RefusedGrammars(max_entries=16)
    for i in range(1000):
        refused.add(GrammarKey("regex", f"x{i}" * 1000), "no")
    assert len(refused) == 16
    assert refused.get(GrammarKey("regex", "x999" * 1000)) == "no"
    assert refused.get(GrammarKey("regex", "x0" * 1000)) is None
