"""Hardware a method needs: shown by ``engine plugins list``; refused at startup with the
reason when the device cannot run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from engine.config import EngineArgs
from engine.errors import StartupError
from engine.model_executor.loader import resolve_quant_config
from engine.plugins import PluginManager


def _engine(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from engine.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_plugins_list_shows_the_hardware_of_each_method() -> None:
    out = _engine("plugins", "list", "--kind", "quantization_method")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[1]: line for line in out.stdout.splitlines() if line.startswith("quant")}
    assert "cuda (capability >= 8.9); reference: cpu" in lines["fp8"]
    assert "cuda (capability >= 8.9); reference: cpu" in lines["compressed-tensors"]
    assert "cuda (capability >= 7.5); reference: cpu" in lines["awq"]
    payload = json.loads(
        _engine("plugins", "list", "--json", "--kind", "quantization_method").stdout
    )
    caps = {p["name"]: p["capabilities"] for p in payload["plugins"]}
    assert caps["fp8"]["quantization_method"]["fp8"]["min_capability"] == 89


def _resolve(quant: dict | None, flag: str | None, device: str) -> object:
    pm = PluginManager.load()
    hf_config = SimpleNamespace(quantization_config=quant)
    args = EngineArgs(model="unused", quantization=flag)
    return resolve_quant_config(args, hf_config, pm, torch.device(device))


def test_old_gpu_is_a_startup_error_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(StartupError, match=r"quantization 'fp8' cannot run on cuda: .*8\.9.*8\.0"):
        _resolve(None, "fp8", "cuda")
    ct = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}
        },
    }
    with pytest.raises(StartupError, match="compressed-tensors.*--device cpu"):
        _resolve(ct, None, "cuda")
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}
    assert _resolve(awq, None, "cuda") is not None  # 8.0 >= 7.5
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    with pytest.raises(StartupError, match=r"quantization 'awq' cannot run on cuda: .*7\.5"):
        _resolve(awq, None, "cuda")


def test_cpu_runs_the_reference_path() -> None:
    assert _resolve(None, "fp8", "cpu") is not None
    assert _resolve({"quant_method": "awq", "bits": 4}, None, "cpu") is not None
    with pytest.raises(StartupError, match="quantization_config.*bits=8"):
        _resolve({"quant_method": "awq", "bits": 8}, None, "cpu")


def test_registry_lists_compressed_tensors_under_fp8() -> None:
    import tomllib

    registry = tomllib.loads((Path(__file__).parents[2] / "registry.toml").read_text())
    assert "compressed-tensors" in registry["plugins"]["fp8"]["provides"]["quantization_method"]
