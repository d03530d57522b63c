"""Opening checkpoints: errors naming the path, templates, generation config, formats, dummy."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine.config import EngineArgs
from engine.errors import StartupError
from engine.model_executor.source import FormatModelSource, open_model_source
from engine.plugins import PluginManager
from engine_sdk import ModelFormatSpec, hookimpl
from engine_sdk.interfaces.model_format import ModelFormat
from model_driver import GreedyDriver, make_runner
from safetensors.torch import load_file, save_file

QWEN3_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _open(pm: Any, path: Path | str, **overrides: Any) -> Any:
    return open_model_source(EngineArgs(model=str(path), **overrides), pm)


def _copy(src: Path, dst: Path, names: tuple[str, ...] = QWEN3_FILES) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


def test_missing_path_and_missing_config(pm: Any, tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"model path .*nowhere does not exist"):
        _open(pm, tmp_path / "nowhere")
    with pytest.raises(StartupError, match="has no config.json"):
        _open(pm, tmp_path)
    with pytest.raises(StartupError, match="no model given: pass --model"):
        open_model_source(EngineArgs(model=None), pm)


def test_unknown_architecture_lists_the_installed_ones(
    pm: Any, qwen3_dir: Path, tmp_path: Path
) -> None:
    folder = _copy(qwen3_dir, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["FooForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    args = EngineArgs(model=str(folder), device="cpu", load_format="dummy")
    source = open_model_source(args, pm)
    from engine.model_executor.runner import ModelRunner

    with pytest.raises(StartupError) as info:
        ModelRunner(args, pm, source)
    msg = str(info.value)
    assert str(folder) in msg and "FooForCausalLM" in msg
    assert "Qwen3ForCausalLM" in msg and "LlamaForCausalLM" in msg


def test_no_weights_and_incomplete_or_foreign_checkpoints(
    pm: Any, qwen3_dir: Path, tmp_path: Path
) -> None:
    empty = _copy(qwen3_dir, tmp_path / "empty")
    with pytest.raises(StartupError, match="no weights in .*load-format dummy"):
        make_runner(pm, empty)
    tensors = load_file(str(qwen3_dir / "model.safetensors"))
    partial = _copy(qwen3_dir, tmp_path / "partial")
    save_file(
        {k: v for k, v in tensors.items() if "layers.1.mlp" not in k},
        str(partial / "model.safetensors"),
    )
    with pytest.raises(StartupError) as info:
        make_runner(pm, partial)
    assert "does not provide 3 parameter(s)" in str(info.value)
    assert "model.layers.1.mlp.down_proj.weight" in str(info.value)
    extra = _copy(qwen3_dir, tmp_path / "extra")
    save_file({**tensors, "model.surprise": torch.zeros(2)}, str(extra / "model.safetensors"))
    with pytest.raises(StartupError, match="'model.surprise' has no parameter"):
        make_runner(pm, extra)


def test_dummy_load_needs_only_config_and_is_seeded(
    pm: Any, qwen3_dir: Path, tmp_path: Path
) -> None:
    folder = _copy(qwen3_dir, tmp_path / "cfg", ("config.json",))
    runs = []
    for seed in (1, 1, 2):
        runner = make_runner(pm, folder, load_format="dummy", seed=seed)
        driver = GreedyDriver(runner)
        req = driver.new_request("r", [5, 6, 7, 8, 9], max_tokens=3)
        driver.run([req])
        assert all(0 <= t < runner.vocab_size for t in req.outputs)
        runs.append(runner.model.model.layers[0].mlp.up_proj.weight.clone())
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_tokenizer_chat_template_override_and_generation_config(
    pm: Any, qwen3_dir: Path, tmp_path: Path
) -> None:
    source = _open(pm, qwen3_dir)
    tok = source.load_tokenizer()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    template_file = tmp_path / "t.jinja"
    template_file.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    for value in (str(template_file), "{% for m in messages %}<{{ m.content }}>{% endfor %}"):
        tok = _open(pm, qwen3_dir, chat_template=value).load_tokenizer()
        out = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
        assert out in ("[x]", "<x>")
    with pytest.raises(StartupError, match="--chat-template 'missing.jinja'"):
        _open(pm, qwen3_dir, chat_template="missing.jinja").load_tokenizer()
    gen = source.generation_config()
    assert gen["temperature"] == 0.7 and gen["top_k"] == 20
    assert _open(pm, qwen3_dir, generation_config="vllm").generation_config() == {}


class FakeFormat(ModelFormat):
    """Reads a ``.fake`` file that points at an HF folder (to test the plugin path)."""

    name = "fake"

    @classmethod
    def claims(cls, path: Path) -> bool:
        return path.suffix == ".fake"

    def _folder(self) -> Path:
        return Path(self.path.read_text().strip())

    def load_config(self) -> Any:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(self._folder()))

    def load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self._folder()))

    def iter_weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in load_file(str(self._folder() / "model.safetensors")).items():
            yield name, tensor.to(dtype)


class FakeFormatPlugin:
    @hookimpl
    def register_model_formats(self) -> list[ModelFormatSpec]:
        return [ModelFormatSpec("fake", "test_model_source:FakeFormat", suffixes=(".fake",))]


def test_format_plugin_claims_the_path_first(qwen3_dir: Path, tmp_path: Path) -> None:
    import engine_qwen3.plugin
    import engine_reference.plugin

    pm = PluginManager.load(
        discover=False,
        extra_plugins=[engine_reference.plugin, engine_qwen3.plugin, FakeFormatPlugin()],
        env={},
    )
    pointer = tmp_path / "model.fake"
    pointer.write_text(str(qwen3_dir))
    source = _open(pm, pointer)
    assert isinstance(source, FormatModelSource)
    runner = make_runner(pm, pointer)
    driver = GreedyDriver(runner)
    req = driver.new_request("r", [5, 6, 7], max_tokens=4)
    driver.run([req])
    reference = GreedyDriver(make_runner(pm, qwen3_dir))
    ref_req = reference.new_request("r", [5, 6, 7], max_tokens=4)
    reference.run([ref_req])
    assert req.outputs == ref_req.outputs
    other = tmp_path / "model.bin"
    other.write_text("x")
    with pytest.raises(StartupError, match="is a file no format plugin reads"):
        _open(pm, other)
