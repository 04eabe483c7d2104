"""Linear layers with torchao-quantized weights (``quantization: int8 | int8_weight_only
| fp8 | fp8_weight_only``).

``quantize_linears`` walks a module, leaves the layers an ignore pattern names as they
are and hands every other one to torchao's ``quantize_``, which replaces its weight by a
quantized tensor subclass (``Int8Tensor``, ``Float8Tensor``: int8/float8 data plus
per-channel scales) whose ``F.linear`` runs the method's kernel. One of our ``Linear``
layers also gets its backend wrapped in ``QuantizedLinearBackend`` named after the
method (``int8_dynamic``...), so its calls are counted as what ran; a plain
``nn.Linear`` (a text encoder's) is only quantized. The packed oneDNN path of the
stage's backend cannot take a tensor subclass, so a quantized layer always calls
``F.linear``: torchao picks the kernel for the device.

A LoRA delta (``layers/linear/lora.py``) is added on the unquantized path: the base GEMM
is the quantized one, the adapter's two small GEMMs run in the activation's dtype.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from diffserve.layers.linear.base import LinearBackend, activate
from diffserve.layers.linear.module import Linear
from diffserve.logging import get_logger
from diffserve.registry.quantization import QUANTIZATION_METHODS, QuantizationMethod
from diffserve.registry.targets import load_target
from diffserve.types.attestation import QuantizationReport

logger = get_logger(__name__)


class QuantizedLinearBackend(LinearBackend):
    """``F.linear`` on a torchao-quantized weight (its kernel is the subclass's); one
    subclass per method (``backend_class``), so the name each call is counted under says
    the method."""

    def __init__(self, inner: LinearBackend) -> None:
        super().__init__(inner.device, inner.dtype)
        # the stage's backend, kept for what the layer ran on before quantization
        self.inner = inner

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
        activation_from: int = 0,
    ) -> torch.Tensor:
        return activate(F.linear(x, weight, bias), activation, activation_from)


class Int8DynamicLinearBackend(QuantizedLinearBackend):
    """``int8``: on a GPU our own per-token int8 GEMM (``int8_mm.py``), which never
    probes a tensor's ``repr`` as torchao's eager path does; elsewhere torchao's."""

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
        activation_from: int = 0,
    ) -> torch.Tensor:
        if x.device.type != "cuda":
            return super().linear(x, weight, bias, activation, activation_from)
        from diffserve.layers.linear.int8_mm import int8_dynamic_linear

        y = int8_dynamic_linear(x, weight, bias)
        return activate(y, activation, activation_from)


_BACKENDS: dict[str, type[QuantizedLinearBackend]] = {}


def backend_class(method: QuantizationMethod) -> type[QuantizedLinearBackend]:
    """The wrapper counted as ``method.backend`` (a backend's name is a class
    attribute)."""
    if method.backend not in _BACKENDS:
        class_name = (
            "".join(part.capitalize() for part in method.backend.split("_"))
            + "LinearBackend"
        )
        base = (
            Int8DynamicLinearBackend
            if method.name == "int8"
            else QuantizedLinearBackend
        )
        _BACKENDS[method.backend] = type(class_name, (base,), {"name": method.backend})
    return _BACKENDS[method.backend]


@dataclass
class QuantizationResult:
    """What ``quantize_linears`` did to one component (the attestation's
    ``quantization`` entry)."""

    method: str
    backend: str
    quantized_linears: int = 0
    ignored_linears: int = 0
    ignored_patterns: tuple[str, ...] = ()
    ignored_names: list[str] = field(default_factory=list)

    def attested(self) -> QuantizationReport | None:
        """The attestation's entry for the component (None when it runs unquantized)."""
        if self.method == "none":
            return None
        return QuantizationReport(
            method=self.method,
            backend=self.backend,
            quantized_linears=self.quantized_linears,
            ignored_linears=self.ignored_linears,
            ignored_patterns=list(self.ignored_patterns),
        )


def ignored(name: str, patterns: Iterable[str]) -> bool:
    """Whether module ``name`` is left unquantized: a pattern matches the name
    (``fnmatch``, case-sensitive) or one of its parents (``final_layer`` covers
    ``final_layer.linear``)."""
    parts = name.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(
        fnmatch.fnmatchcase(prefix, pattern)
        for pattern in patterns
        for prefix in prefixes
    )


def fp8_rowwise_config() -> object:
    """torchao's float8 dynamic W8A8 with per-row scales (weights per output channel,
    activations per token), the ``fp8`` method: row-wise scaled ``_scaled_mm`` GEMMs
    that inductor fuses the activation's quantization into."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow

    return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())


def torchao_config(method: QuantizationMethod) -> object:
    """The method's torchao config object (torchao is imported here, on first use
    only)."""
    # torchao logs a warning for each CUDA-only extension it cannot load into a CPU
    # build of torch: noise here.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    return load_target(method.torchao_config)()


def column_major_int8(weight: torch.Tensor) -> None:
    """Store an ``Int8Tensor``'s ``[N, K]`` rows column-major, once, so ``qdata.t()`` is
    the contiguous ``[K, N]`` operand ``torch._int_mm`` takes (``int8_mm.py``) with no
    copy per call (torchao's eager path copies the transposed weight every GEMM)."""
    qdata = getattr(weight, "qdata")  # noqa: B009
    if not qdata.t().is_contiguous():
        weight.qdata = qdata.t().contiguous().t()  # type: ignore[attr-defined]


def warn_if_eager(method_name: str, enforce_eager: bool, device: torch.device) -> None:
    """fp8 on a GPU belongs compiled: eager, its activation scaling runs as separate
    kernels around every GEMM (measured 1.49x bfloat16's time on an H200)."""
    if method_name == "fp8" and enforce_eager and device.type == "cuda":
        logger.warning(
            "quantization fp8 with enforce_eager: true runs its per-token scaling as "
            "separate eager kernels, slower than bfloat16; set enforce_eager: false "
            "to compile it (or quantization: fp8_weight_only)"
        )


def quantize_linears(
    module: nn.Module, method_name: str, ignore: Iterable[str] = ()
) -> QuantizationResult:
    """Quantize every ``Linear`` / ``nn.Linear`` under ``module`` that no pattern of
    ``ignore`` names, in place."""
    method = QUANTIZATION_METHODS[method_name]
    patterns = tuple(ignore)
    result = QuantizationResult(method.name, method.backend, ignored_patterns=patterns)
    if method.name == "none":
        return result
    from torchao.quantization import quantize_

    config = torchao_config(method)
    chosen: set[int] = set()
    for name, layer in module.named_modules():
        if not isinstance(layer, (Linear, nn.Linear)) or not isinstance(
            layer.weight, nn.Parameter
        ):
            # a GGUF layer's packed weight is already quantized (its own method)
            continue
        if ignored(name, patterns):
            result.ignored_linears += 1
            result.ignored_names.append(name)
            continue
        chosen.add(id(layer))
    with torch.no_grad():
        quantize_(module, config, filter_fn=lambda layer, _fqn: id(layer) in chosen)
    for layer in module.modules():
        if id(layer) in chosen and isinstance(layer, Linear):
            layer.backend = backend_class(method)(layer.backend)
            layer.backend_name = layer.backend.name
            if method.name == "int8" and layer.weight.device.type == "cuda":
                column_major_int8(layer.weight)
    result.quantized_linears = len(chosen)
    return result
