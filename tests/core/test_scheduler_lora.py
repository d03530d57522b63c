"""--max-loras in the scheduler: at most that many distinct adapters run at once, the
others wait (never fail) and run once a slot frees; adapters never share cached blocks."""

from __future__ import annotations

import dataclasses

from core_fakes import make_core, make_request, reference_tokens, run_to_completion
from engine.core.request import Request
from engine.lora.request import LoRARequest

A, B, C = (LoRARequest(n, i + 1, f"/adapters/{n}") for i, n in enumerate("abc"))


def _with_lora(request: Request, lora: LoRARequest | None) -> Request:
    return dataclasses.replace(request, lora_request=lora, lora_id=None)


def test_request_takes_its_prefix_cache_key_from_the_adapter() -> None:
    request = _with_lora(make_request("r", [1, 2, 3]), B)
    assert request.lora_id == B.cache_key == "2:b"
    # a reload of the same name gets a new id: a new cache key
    assert LoRARequest("b", 7, "/adapters/b").cache_key != B.cache_key


def test_at_most_max_loras_adapters_run_and_the_rest_wait() -> None:
    core, _ = make_core(max_loras=2, max_num_seqs=8)
    loras = [A, B, C, A, None, C]
    for i, lora in enumerate(loras):
        core.add_request(_with_lora(make_request(f"r{i}", [i + 1, 2, 3, 4, 5], 3), lora))
    scheduler = core.scheduler
    seen_together: list[set[str]] = []
    for _ in range(200):
        if not core.has_unfinished_requests():
            break
        core.step()
        running = {r.lora_request.lora_name for r in scheduler.running if r.lora_request}
        assert len(running) <= 2, running
        seen_together.append(running)
        stats = scheduler.stats()
        assert stats.max_loras == 2 and set(stats.running_lora_adapters) == running
    assert not core.has_unfinished_requests()
    # c waited while a and b ran (r2 and r5 were not admitted with them), then ran
    assert {"a", "b"} in seen_together and any("c" in s for s in seen_together)
    assert not any({"a", "b", "c"} <= s for s in seen_together)


def test_waiting_adapter_does_not_block_base_or_running_adapters() -> None:
    core, _ = make_core(max_loras=1, max_num_seqs=8)
    core.add_request(_with_lora(make_request("a0", [1, 2, 3], 6), A))
    core.add_request(_with_lora(make_request("b0", [4, 5, 6], 2), B))
    core.add_request(_with_lora(make_request("base", [7, 8, 9], 2), None))
    core.add_request(_with_lora(make_request("a1", [1, 2, 4], 2), A))
    core.step()
    running = {r.req_id for r in core.scheduler.running}
    assert running == {"a0", "base", "a1"}  # b0 waits; the queue behind it goes on
    assert core.scheduler.stats().waiting_lora_adapters == ("b",)
    result = run_to_completion(core)
    assert result.finish_reasons["b0"] == "length"
    assert result.tokens["b0"] == reference_tokens([4, 5, 6], 2)


def test_two_adapters_never_share_cached_blocks() -> None:
    core, _ = make_core(max_loras=2, block_size=4)
    prompt = list(range(1, 14))  # three full blocks
    core.add_request(_with_lora(make_request("a", prompt, 1), A))
    run_to_completion(core)
    kv = core.scheduler.kv
    assert kv.get_computed_blocks(_with_lora(make_request("a2", prompt, 1), A))[1] == 12
    assert kv.get_computed_blocks(_with_lora(make_request("b", prompt, 1), B))[1] == 0
    assert kv.get_computed_blocks(_with_lora(make_request("base", prompt, 1), None))[1] == 0
    # the same name loaded again (a new id) does not reuse the old weights' blocks
    reloaded = LoRARequest("a", 9, "/adapters/a")
    assert kv.get_computed_blocks(_with_lora(make_request("a3", prompt, 1), reloaded))[1] == 0
