"""Conformance suite for quantization methods: a quantized ``Linear`` against its dequantized
weights.

Each case builds the SDK's :class:`~engine_sdk.layers.linear.Linear` with the config under
test (so ``get_method`` / ``create_weights`` run exactly as in a model), fills its parameters
through the same path as the model weight loader (a parameter's ``weight_loader`` if it has
one, else a shape-checked copy), calls ``process_weights_after_loading``, and compares
``layer(x)`` with ``x @ W_deq.T + b`` computed in float64, where ``W_deq`` is what the
stored tensors represent. Cases vary shapes, bias and the number of tokens (1, many, and a
2-D batch of leading dimensions).

Weights come from one of two places:

- a *quantizer* you supply: ``quantizer(W) -> QuantizedWeights(tensors, dequantized)``
  maps a float32 weight [out, in] to the checkpoint tensors of the format (by parameter
  name) and the float32 weight they represent. Write it from the format's documentation,
  not from the method's code, so the suite checks the method against the format.
- the method's own quantization (online methods): the layer registers a float ``weight``,
  the suite fills it, and the method quantizes it in ``process_weights_after_loading``; the
  method must then offer ``dequantize_weight(layer, dtype) -> Tensor [out, in]``.

Use it from a plugin's tests::

    from engine_sdk.testing.quantization import QUANT_CASES, run_quantization_case

    @pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: c.name)
    def test_conformance(case):
        run_quantization_case(MyConfig, {"bits": 4}, case, quantizer=my_quantizer)

A mismatch raises ``AssertionError`` naming the case and the error; a device the config
refuses (``check_device``) raises :class:`DeviceNotSupported` with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine_sdk.interfaces.quantization import QuantizationConfig
from engine_sdk.layers.linear import Linear, UnquantizedLinearMethod

__all__ = [
    "QUANT_CASES",
    "DeviceNotSupported",
    "QuantCase",
    "QuantizedWeights",
    "Quantizer",
    "Tolerance",
    "check_quantization_method",
    "default_tolerance",
    "quantized_linears",
    "run_quantization_case",
]

PREFIX = "model.layers.0.mlp.up_proj"


@dataclass(frozen=True)
class QuantizedWeights:
    """Checkpoint tensors of one layer (by parameter name) and the weight they represent."""

    tensors: dict[str, torch.Tensor]
    dequantized: torch.Tensor  # float32 [out, in], nn.Linear orientation


Quantizer = Callable[[torch.Tensor], QuantizedWeights]


@dataclass(frozen=True)
class QuantCase:
    """One layer shape and input: ``x`` is ``[*batch_shape, input_size]``."""

    name: str
    input_size: int
    output_size: int
    bias: bool
    batch_shape: tuple[int, ...]


QUANT_CASES: tuple[QuantCase, ...] = (
    QuantCase("one_token", 128, 64, False, (1,)),
    QuantCase("many_tokens", 128, 64, False, (37,)),
    QuantCase("bias_one_token", 64, 128, True, (1,)),
    QuantCase("bias_many_tokens", 256, 96, True, (29,)),
    QuantCase("batch_2d", 128, 32, True, (3, 5)),
    QuantCase("wide", 64, 256, False, (8,)),
)


@dataclass(frozen=True)
class Tolerance:
    """Pass when ``max|out - ref| <= atol + rtol * max|ref|``."""

    rtol: float
    atol: float = 1e-6


def default_tolerance(dtype: torch.dtype) -> Tolerance:
    """Matmul rounding in ``dtype`` for a weight-dequantizing method; methods that also
    quantize activations (W8A8) need a looser, stated tolerance."""
    if dtype == torch.float32:
        return Tolerance(rtol=1e-4)
    if dtype == torch.float16:
        return Tolerance(rtol=5e-3)
    return Tolerance(rtol=2e-2)


class DeviceNotSupported(Exception):
    """The config's ``check_device`` refused the device; the message is its reason."""


def _load_param(layer: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    params = dict(layer.named_parameters())
    if name not in params:
        raise AssertionError(
            f"the quantizer produced {name!r} but the layer registered only {sorted(params)}"
        )
    param = params[name]
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        loader(param, tensor.to(param.device))
        return
    if tuple(param.shape) != tuple(tensor.shape):
        raise AssertionError(
            f"{name}: quantizer tensor {tuple(tensor.shape)} vs parameter {tuple(param.shape)}"
        )
    param.data.copy_(tensor)


def _fill(layer: Linear, weight: torch.Tensor, quantizer: Quantizer | None) -> torch.Tensor | None:
    """Load the layer's quantized parameters; return the dequantized weight when known."""
    if quantizer is None:
        param = getattr(layer, "weight", None)
        if param is None or not param.is_floating_point() or param.element_size() < 2:
            raise AssertionError(
                "no quantizer was given and the layer has no float 'weight' to quantize "
                "itself; pass quantizer=... producing the checkpoint tensors"
            )
        param.data.copy_(weight)
        return None
    quantized = quantizer(weight)
    for name, tensor in quantized.tensors.items():
        _load_param(layer, name, tensor)
    unfilled = {n for n, _ in layer.named_parameters()} - set(quantized.tensors) - {"bias"}
    if unfilled:
        raise AssertionError(f"the quantizer did not fill parameters {sorted(unfilled)}")
    return quantized.dequantized.float()


def quantized_linears(
    quant_config: QuantizationConfig,
    quantizer: Quantizer | None,
    sizes_and_gains: tuple[tuple[int, float], ...],
    num_in: int = 128,
    bias: bool = False,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> list[Linear]:
    """Linears reading one input, as q/k/v or gate/up do (for merge tests): one per
    ``(output size, gain)``, random weights times ``gain`` (so a column that lands in the
    wrong layer's scales shows), loaded through ``quantizer`` (None: the method quantizes
    the float weight itself) and processed. Seeded: the same arguments give the same layers.
    """
    gen = torch.Generator().manual_seed(0)
    layers = []
    for i, (num_out, gain) in enumerate(sizes_and_gains):
        with torch.device(device):
            layer = Linear(num_in, num_out, bias, quant_config, f"model.layers.0.p{i}", dtype)
        _fill(layer, torch.randn(num_out, num_in, generator=gen) * 0.05 * gain, quantizer)
        if bias:
            layer.bias.data.copy_(torch.randn(num_out, generator=gen))
        layer.quant_method.process_weights_after_loading(layer)
        layers.append(layer)
    return layers


def _dequantize_via_method(layer: Linear, what: str) -> torch.Tensor:
    dequantize = getattr(layer.quant_method, "dequantize_weight", None)
    if dequantize is None:
        raise AssertionError(
            f"{type(layer.quant_method).__name__} has no dequantize_weight(layer, dtype); "
            f"it is needed {what}"
        )
    result: torch.Tensor = dequantize(layer, torch.float32)
    return result.float()


def run_quantization_case(
    config_cls: type[QuantizationConfig],
    config: dict[str, Any],
    case: QuantCase,
    *,
    quantizer: Quantizer | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    tolerance: Tolerance | None = None,
    weight_rtol: float = 0.25,
    seed: int = 0,
) -> None:
    """Check one case; see the module docstring. ``weight_rtol`` bounds the relative
    Frobenius error of the dequantized weight against the float weight (catches a
    quantizer or method that stores garbage consistently)."""
    device = torch.device(device)
    tolerance = tolerance or default_tolerance(dtype)
    where = f"{config_cls.__name__} {config} case {case.name!r} on {device} in {dtype}"
    quant_config = config_cls.from_config(dict(config))
    assert isinstance(quant_config, QuantizationConfig), f"{where}: from_config returned junk"
    problem = quant_config.check_device(device)
    if problem is not None:
        raise DeviceNotSupported(problem)
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(case.output_size, case.input_size, generator=gen) * 0.05
    bias = torch.randn(case.output_size, generator=gen) * 0.1 if case.bias else None
    x = torch.randn(*case.batch_shape, case.input_size, generator=gen)

    with torch.device(device):
        layer = Linear(case.input_size, case.output_size, case.bias, quant_config, PREFIX, dtype)
    assert not isinstance(layer.quant_method, UnquantizedLinearMethod), (
        f"{where}: get_method({PREFIX!r}) returned None, so nothing is quantized"
    )
    dequantized = _fill(layer, weight.to(device), quantizer)
    if bias is not None:
        layer.bias.data.copy_(bias)
    layer.quant_method.process_weights_after_loading(layer)
    if dequantized is None:
        dequantized = _dequantize_via_method(layer, "to check an online method").cpu()
    elif hasattr(layer.quant_method, "dequantize_weight"):
        own = _dequantize_via_method(layer, "").cpu()
        assert torch.allclose(own, dequantized, rtol=1e-3, atol=1e-6), (
            f"{where}: dequantize_weight disagrees with the format's dequantized weight by "
            f"{(own - dequantized).abs().max().item():.3g}"
        )
    rel = ((dequantized - weight).norm() / weight.norm()).item()
    assert rel <= weight_rtol, f"{where}: dequantized weight is {rel:.1%} off the float weight"

    with torch.inference_mode():
        out = layer(x.to(device=device, dtype=dtype))
    assert out.shape == (*case.batch_shape, case.output_size), f"{where}: shape {out.shape}"
    assert out.dtype == dtype, f"{where}: output dtype {out.dtype}, expected {dtype}"
    assert out.device.type == device.type, f"{where}: output on {out.device}"
    x_ref = x.to(dtype).double()  # the input the layer saw, rounded to dtype
    ref = torch.nn.functional.linear(
        x_ref, dequantized.double(), None if bias is None else bias.to(dtype).double()
    )
    got = out.double().cpu()
    assert torch.isfinite(got).all(), f"{where}: non-finite outputs"
    err = (got - ref).abs().max().item()
    bound = tolerance.atol + tolerance.rtol * ref.abs().max().item()
    assert err <= bound, f"{where}: max error {err:.3g} exceeds {bound:.3g} ({tolerance})"


def check_quantization_method(
    config_cls: type[QuantizationConfig],
    config: dict[str, Any],
    cases: tuple[QuantCase, ...] = QUANT_CASES,
    **kwargs: Any,
) -> None:
    """Run every case (keyword arguments as for :func:`run_quantization_case`)."""
    for case in cases:
        run_quantization_case(config_cls, config, case, **kwargs)
