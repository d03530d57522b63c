"""fp8 / compressed-tensors config parsing, layer selection, loading errors, device checks,
and the plugin's registration."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_fp8 import plugin
from engine_fp8.compressed_tensors import CompressedTensorsConfig
from engine_fp8.config import Fp8Config
from engine_fp8.method import Fp8LinearMethod
from engine_sdk.layers.linear import Linear
from engine_sdk.testing import check_plugin

FLOAT8_W = {"num_bits": 8, "type": "float", "strategy": "channel"}


def _ct(**group: Any) -> dict[str, Any]:
    base = {"targets": ["Linear"], "weights": FLOAT8_W, "input_activations": None}
    return {"quant_method": "compressed-tensors", "config_groups": {"g": {**base, **group}}}


def test_plugin_registers_both_methods_with_hardware() -> None:
    report = check_plugin(plugin, check_targets=True)
    assert not report.problems, report.problems
    specs = {s.name: s for s in plugin.register_quantization_methods()}
    assert set(specs) == {"fp8", "compressed-tensors"}
    for spec in specs.values():
        assert spec.capabilities() == {
            "devices": ["cuda"],
            "min_capability": 89,
            "reference_devices": ["cpu"],
        }


def test_online_defaults_and_options() -> None:
    scheme = Fp8Config.from_config({}).scheme
    assert (scheme.serialized, scheme.weight_strategy, scheme.activation_scheme) == (
        False,
        "tensor",
        "dynamic",
    )
    assert scheme.activation_strategy == "tensor"
    chan = Fp8Config.from_config({"weight_strategy": "channel", "activation_strategy": "token"})
    assert (chan.scheme.weight_strategy, chan.scheme.activation_strategy) == ("channel", "token")


def test_checkpoint_config() -> None:
    cfg = Fp8Config.from_config(
        {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    )
    assert cfg.scheme.serialized and cfg.scheme.activation_scheme == "static"
    block = Fp8Config.from_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert block.scheme.weight_strategy == "block" and block.scheme.block == (128, 128)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"quant_method": "fp8", "fmt": "e5m2"}, "'e5m2'"),
        ({"quant_method": "fp8", "activation_scheme": "sometimes"}, "'sometimes'"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, r"\[128\]"),
        ({"weight_block_size": [128, 128]}, "needs an fp8 checkpoint"),
        ({"activation_scheme": "static"}, "calibrated input scales"),
        ({"weight_strategy": "row"}, "'row'"),
        ({"activation_strategy": "group"}, "'group'"),
        ({"quant_method": "fp8", "weight_strategy": "channel"}, "compressed-tensors"),
        ({"quant_method": "fp8", "ignored_layers": "lm_head"}, "ignored_layers"),
    ],
)
def test_bad_fp8_configs_name_the_value(config: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Fp8Config.from_config(config)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (_ct(weights={"num_bits": 4, "type": "int", "strategy": "group"}), "num_bits=4"),
        (_ct(weights={**FLOAT8_W, "strategy": "group"}), "'group'"),
        (_ct(weights={**FLOAT8_W, "symmetric": False}), "symmetric"),
        (_ct(weights=None), "weights entry"),
        (_ct(input_activations={"num_bits": 8, "type": "int", "dynamic": True}), "type='int'"),
        (
            _ct(input_activations={"num_bits": 8, "type": "float", "strategy": "token"}),
            "static activations need strategy 'tensor'",
        ),
        ({**_ct(), "format": "pack-quantized"}, "'pack-quantized'"),
        ({"quant_method": "compressed-tensors"}, "config_groups"),
    ],
)
def test_bad_compressed_tensors_configs_name_the_value(config: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CompressedTensorsConfig.from_config(config)


def test_layer_selection() -> None:
    fp8 = Fp8Config.from_config(
        {"quant_method": "fp8", "ignored_layers": ["model.layers.1.mlp.down_proj", "o_proj"]}
    )
    assert isinstance(fp8.get_method("model.layers.0.mlp.down_proj"), Fp8LinearMethod)
    assert fp8.get_method("model.layers.1.mlp.down_proj") is None
    assert fp8.get_method("model.layers.3.self_attn.o_proj") is None
    ct = CompressedTensorsConfig.from_config(
        {**_ct(targets=["re:.*mlp.*"]), "ignore": ["re:.*layers\\.0\\..*", "lm_head"]}
    )
    assert ct.get_method("model.layers.0.mlp.up_proj") is None  # ignored by regex
    assert isinstance(ct.get_method("model.layers.1.mlp.up_proj"), Fp8LinearMethod)
    assert ct.get_method("model.layers.1.self_attn.q_proj") is None  # not targeted


def _serialized_layer() -> Linear:
    cfg = Fp8Config.from_config({"quant_method": "fp8"})
    return Linear(32, 16, False, cfg, "model.layers.0.mlp.up_proj", torch.float32)


def test_loading_a_float_weight_into_an_fp8_layout_fails_clearly() -> None:
    layer = _serialized_layer()
    with pytest.raises(ValueError, match="model.layers.0.mlp.up_proj.weight is torch.bfloat16"):
        layer.weight.weight_loader(layer.weight, torch.zeros(16, 32, dtype=torch.bfloat16))


def test_scale_shapes_from_different_exporters_load() -> None:
    layer = _serialized_layer()
    for stored in (torch.tensor(0.5), torch.tensor([0.25])):
        layer.weight_scale.weight_loader(layer.weight_scale, stored)
        assert layer.weight_scale.item() == stored.item()
    with pytest.raises(ValueError, match=r"shape \(16, 1\)"):
        layer.weight_scale.weight_loader(layer.weight_scale, torch.ones(16, 1))


def test_online_weights_are_stored_in_fp8_after_loading() -> None:
    layer = Linear(64, 32, False, Fp8Config.from_config({}), "x.up_proj", torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16
    layer.weight.data.normal_()
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.float8_e4m3fn
    assert layer.weight_scale.dtype == torch.float32 and layer.weight_scale.numel() == 1
    assert layer.weight.untyped_storage().nbytes() == 64 * 32  # one byte per weight


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


@pytest.mark.parametrize("config_cls", [Fp8Config, CompressedTensorsConfig])
def test_check_device(config_cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    config = {} if config_cls is Fp8Config else _ct()
    cfg = config_cls.from_config(config)
    assert cfg.check_device(torch.device("cpu")) is None
    assert "not on meta" in cfg.check_device(torch.device("meta"))
    _fake_gpu(monkeypatch, (8, 0))
    reason = cfg.check_device(torch.device("cuda"))
    assert reason is not None and "8.9" in reason and "8.0" in reason and "--device cpu" in reason
    allowed = config_cls.from_config({**config, "allow_reference": True})
    assert allowed.check_device(torch.device("cuda")) is None
    _fake_gpu(monkeypatch, (9, 0))
    assert cfg.check_device(torch.device("cuda")) is None
