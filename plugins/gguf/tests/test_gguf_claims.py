"""Which paths the GGUF format claims, and the plugin's registration."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from engine_gguf import plugin
from engine_gguf.format import GGUFFormat
from engine_sdk import ENTRY_POINT_GROUP, ModelFormatSpec
from engine_sdk.interfaces.model_format import ModelFormat


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_claims_a_gguf_file(tmp_path: Path) -> None:
    assert GGUFFormat.claims(_touch(tmp_path / "model.gguf"))
    assert GGUFFormat.claims(_touch(tmp_path / "upper" / "MODEL.GGUF"))


def test_claims_a_folder_with_exactly_one_gguf(tmp_path: Path) -> None:
    _touch(tmp_path / "one" / "model.Q4_1.gguf")
    _touch(tmp_path / "one" / "README.md")
    assert GGUFFormat.claims(tmp_path / "one")
    assert GGUFFormat(tmp_path / "one").file == tmp_path / "one" / "model.Q4_1.gguf"


def test_does_not_claim_other_paths(tmp_path: Path) -> None:
    _touch(tmp_path / "two" / "a.gguf")
    _touch(tmp_path / "two" / "b.gguf")
    _touch(tmp_path / "hf" / "config.json")
    _touch(tmp_path / "hf" / "model.safetensors")
    (tmp_path / "empty").mkdir()
    assert not GGUFFormat.claims(tmp_path / "two")
    assert not GGUFFormat.claims(tmp_path / "hf")
    assert not GGUFFormat.claims(tmp_path / "hf" / "model.safetensors")
    assert not GGUFFormat.claims(tmp_path / "empty")
    assert not GGUFFormat.claims(tmp_path / "missing.gguf")
    assert not GGUFFormat.claims(tmp_path / "nested")  # the .gguf below is one level down
    _touch(tmp_path / "nested" / "sub" / "model.gguf")
    assert not GGUFFormat.claims(tmp_path / "nested")


def test_hf_folder_with_a_gguf_beside_is_left_to_the_hf_loader(tmp_path: Path) -> None:
    _touch(tmp_path / "config.json")
    _touch(tmp_path / "model.safetensors")
    gguf_file = _touch(tmp_path / "model.Q8_0.gguf")
    assert not GGUFFormat.claims(tmp_path)
    assert GGUFFormat.claims(gguf_file)  # naming the file still works


def test_unclaimed_path_raises_a_clear_error(tmp_path: Path) -> None:
    _touch(tmp_path / "a.gguf")
    _touch(tmp_path / "b.gguf")
    with pytest.raises(ValueError, match="exactly one .gguf"):
        GGUFFormat(tmp_path)


def test_not_a_gguf_file_raises_on_load(tmp_path: Path) -> None:
    fmt = GGUFFormat(_touch(tmp_path / "truncated.gguf"))
    with pytest.raises(ValueError, match="cannot read .* as a GGUF file"):
        fmt.load_config()
    (tmp_path / "wrong_magic.gguf").write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="cannot read .* as a GGUF file"):
        GGUFFormat(tmp_path / "wrong_magic.gguf").load_config()


def test_plugin_declares_the_format() -> None:
    [spec] = plugin.register_model_formats()
    assert isinstance(spec, ModelFormatSpec)
    assert (spec.name, spec.target, spec.suffixes) == (
        "gguf",
        "engine_gguf.format:GGUFFormat",
        (".gguf",),
    )
    module, _, attr = spec.target.partition(":")
    target = getattr(__import__(module, fromlist=[attr]), attr)
    assert issubclass(target, ModelFormat) and target.name == "gguf"


def test_entry_point_is_installed() -> None:
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert found.get("gguf") == "engine_gguf.plugin"


def test_entry_module_imports_neither_torch_nor_gguf() -> None:
    code = (
        "import sys, engine_gguf.plugin as p; p.register_model_formats(); "
        "heavy = [m for m in ('torch', 'gguf', 'transformers', 'numpy') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
