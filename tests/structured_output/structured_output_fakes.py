"""Fake structured-output backends for the manager tests (imported by spec targets).

``SleepyBackend`` compiles ``regex`` specs of the form ``"sleep:SECONDS"`` by sleeping that
long, and ``"alloc:BYTES"`` by holding that much memory; each grammar records the process
that compiled it (the manager compiles in worker processes, ``compile_worker.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from engine_sdk import StructuredOutputBackendSpec, hookimpl
from engine_sdk.interfaces.structured_output import (
    CompiledGrammar,
    GrammarMatcher,
    StructuredOutputBackend,
)

ManagerFactory = Callable[..., Any]


def load_pm(*plugins: object) -> Any:
    """An engine ``PluginManager`` holding exactly ``plugins`` (no entry points)."""
    from engine.plugins import PluginManager

    return PluginManager.load(extra_plugins=list(plugins), discover=False, env={})


class FixedMatcher(GrammarMatcher):
    """Allows a fixed set of ids forever (or nothing, to model a dead end)."""

    def __init__(self, vocab_size: int, allowed: list[int], terminated: bool = False) -> None:
        self.mask = torch.zeros(vocab_size, dtype=torch.bool)
        self.mask[allowed] = True
        self.terminated = terminated
        self.accepted: list[int] = []

    def allowed_token_ids(self) -> torch.Tensor:
        return self.mask

    def accept_token(self, token_id: int) -> bool:
        if not self.mask[token_id]:
            return False
        self.accepted.append(token_id)
        return True

    def is_terminated(self) -> bool:
        return self.terminated


class TableGrammar(CompiledGrammar):
    """A tiny DFA: ``transitions[state][token] = next state``; EOS (``eos_token_id``) is
    allowed in ``finals``; a final state with no transition is terminated. Its matchers
    name states by number (``state_key``), so two grammars share state numbers with
    different masks; ``fills`` also gives them ``fill_bitmask``."""

    def __init__(
        self,
        vocab_size: int,
        transitions: dict[int, dict[int, int]],
        finals: set[int],
        eos_token_id: int,
        fills: bool = True,
    ) -> None:
        self.vocab_size = vocab_size
        self.transitions = transitions
        self.finals = finals
        self.eos_token_id = eos_token_id
        self.fills = fills

    def new_matcher(self) -> TableMatcher:
        return TableMatcher(self)


class TableMatcher(GrammarMatcher):
    def __init__(self, grammar: TableGrammar) -> None:
        self.grammar = grammar
        self.state = 0
        self.ended = False

    def _allowed(self) -> list[int]:
        if self.ended:
            return [self.grammar.eos_token_id]
        ids = sorted(self.grammar.transitions.get(self.state, {}))
        return ids + ([self.grammar.eos_token_id] if self.state in self.grammar.finals else [])

    def allowed_token_ids(self) -> torch.Tensor:
        mask = torch.zeros(self.grammar.vocab_size, dtype=torch.bool)
        mask[self._allowed()] = True
        return mask

    def accept_token(self, token_id: int) -> bool:
        if token_id not in self._allowed() or self.ended:
            return False
        if token_id == self.grammar.eos_token_id:
            self.ended = True
        else:
            self.state = self.grammar.transitions[self.state][token_id]
        return True

    def is_terminated(self) -> bool:
        return self.ended or (
            self.state in self.grammar.finals and not self.grammar.transitions.get(self.state)
        )

    def state_key(self) -> tuple[int, bool]:
        return (self.state, self.ended)

    def fill_bitmask(self, out: torch.Tensor) -> bool:
        if not self.grammar.fills:
            return False
        words = out.numpy().view("uint32")
        for token_id in self._allowed():
            words[token_id // 32] |= 1 << (token_id % 32)
        return True


class SleptGrammar(CompiledGrammar):
    def __init__(self, spec: str, vocab_size: int, num_bytes: int) -> None:
        self.spec = spec
        self.vocab_size = vocab_size
        self.num_bytes = num_bytes
        self.pid = os.getpid()  # the process that compiled it

    def new_matcher(self) -> GrammarMatcher:
        return FixedMatcher(self.vocab_size, [1, 2, 3])


class SleepyBackend(StructuredOutputBackend):
    name: ClassVar[str] = "sleepy"

    def compile(self, kind: str, spec: Any) -> CompiledGrammar:
        what, _, value = str(spec).partition(":")
        if kind != "regex" or what not in ("sleep", "alloc"):
            raise ValueError(f"the sleepy backend only compiles 'sleep:SECONDS', got {spec!r}")
        if what == "sleep":
            time.sleep(float(value))
        else:  # touch every page, as a real compile building tables would
            held = bytearray(int(value))
            held[::4096] = b"x" * len(held[::4096])
        return SleptGrammar(spec, self.vocab_size, num_bytes=1000)


class BrokenBackend(StructuredOutputBackend):
    name: ClassVar[str] = "broken"

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        raise RuntimeError("cannot load the grammar engine's native library")

    def compile(self, kind: str, spec: Any) -> CompiledGrammar:
        raise AssertionError("never built")


class BackendPlugin:
    """A plugin object registering one backend spec (name, target class, priority)."""

    def __init__(self, name: str, target: str, priority: int) -> None:
        self.__name__ = f"fake-{name}"
        self.spec = StructuredOutputBackendSpec(name=name, target=target, priority=priority)

    @hookimpl
    def register_structured_output_backends(self) -> list[StructuredOutputBackendSpec]:
        return [self.spec]


def sleepy_plugin(priority: int = 5) -> BackendPlugin:
    return BackendPlugin("sleepy", "structured_output_fakes:SleepyBackend", priority)


def broken_plugin(priority: int = 1) -> BackendPlugin:
    return BackendPlugin("broken", "structured_output_fakes:BrokenBackend", priority)
