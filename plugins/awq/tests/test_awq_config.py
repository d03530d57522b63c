"""AWQ config parsing, unsupported variants, layer selection, device checks, registration."""

from __future__ import annotations

import pytest
import torch
from engine_awq import plugin
from engine_awq.config import AwqConfig
from engine_awq.method import AwqLinearMethod
from engine_sdk.layers.linear import Linear
from engine_sdk.testing import check_plugin

GEMM = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


def test_plugin_registers_awq_with_hardware() -> None:
    report = check_plugin(plugin, check_targets=True)
    assert not report.problems, report.problems
    (spec,) = plugin.register_quantization_methods()
    assert spec.name == "awq"
    assert spec.capabilities() == {
        "devices": ["cuda"],
        "min_capability": 75,
        "reference_devices": ["cpu"],
    }


def test_parses_gemm_and_old_key_names() -> None:
    assert AwqConfig.from_config(GEMM).group_size == 128
    old = AwqConfig.from_config({"quant_method": "awq", "w_bit": 4, "q_group_size": 64})
    assert old.group_size == 64


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"bits": 8}, "bits=8"),
        ({"bits": 3}, "bits=3"),
        ({"version": "gemv"}, "version='gemv'"),
        ({"version": "marlin"}, "version='marlin'"),
        ({"version": "GEMV_FAST"}, "version='gemv_fast'"),
        ({"zero_point": False}, "zero_point=False"),
        ({"group_size": 0}, "group_size=0"),
        ({"group_size": "128"}, "group_size='128'"),
        ({"modules_to_not_convert": "visual"}, "modules_to_not_convert"),
    ],
)
def test_unsupported_configs_name_the_value(change: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AwqConfig.from_config({**GEMM, **change})


def test_online_awq_is_refused() -> None:
    with pytest.raises(ValueError, match="AutoAWQ checkpoint"):
        AwqConfig.from_config({})


def test_modules_to_not_convert() -> None:
    cfg = AwqConfig.from_config({**GEMM, "modules_to_not_convert": ["mlp.gate_proj", "visual"]})
    assert cfg.get_method("model.layers.0.mlp.gate_proj") is None
    assert cfg.get_method("visual.blocks.0.attn.qkv") is None
    assert isinstance(cfg.get_method("model.layers.0.mlp.up_proj"), AwqLinearMethod)


def test_layer_shape_errors_name_the_layer() -> None:
    cfg = AwqConfig.from_config({**GEMM, "group_size": 32})
    with pytest.raises(ValueError, match="model.x.up_proj: AWQ packs 8 output columns"):
        Linear(64, 12, False, cfg, "model.x.up_proj")
    with pytest.raises(ValueError, match="in_features 48 is not a multiple of AWQ group_size 32"):
        Linear(48, 16, False, cfg, "model.x.up_proj")


def test_loading_rejects_float_or_misshapen_tensors() -> None:
    cfg = AwqConfig.from_config({**GEMM, "group_size": 32})
    layer = Linear(64, 16, False, cfg, "model.x.up_proj")
    assert (layer.qweight.shape, layer.qzeros.shape, layer.scales.shape) == (
        (64, 2),
        (2, 2),
        (2, 16),
    )
    with pytest.raises(ValueError, match="expected int32"):
        layer.qweight.weight_loader(layer.qweight, torch.zeros(64, 2))
    with pytest.raises(ValueError, match="check group_size"):
        layer.qzeros.weight_loader(layer.qzeros, torch.zeros(4, 2, dtype=torch.int32))


def test_check_device_only_checks_what_the_spec_cannot_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Devices and capability 7.5 are the spec's data, checked by the core; Triton is not."""
    import engine_awq.config

    cfg = AwqConfig.from_config(GEMM)
    assert cfg.check_device(torch.device("cpu")) is None
    monkeypatch.setattr(engine_awq.config, "triton_available", lambda: True)
    assert cfg.check_device(torch.device("cuda")) is None
    monkeypatch.setattr(engine_awq.config, "triton_available", lambda: False)
    reason = cfg.check_device(torch.device("cuda"))
    assert reason is not None and "pip install triton" in reason
