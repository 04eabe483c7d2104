"""oneDNN inner product on CPU (float32, bfloat16) with weights packed once, GELU fused
into the GEMM.

``torch.nn.functional.linear`` runs float32 through MKL's sgemm and bfloat16 through a
oneDNN matmul on the plain ``[out, in]`` weight, and adds the bias as a separate pass
(``addmm`` copies it into the output first). This backend calls the oneDNN inner product
that inductor's CPU freezing pass uses (``torch.ops.mkldnn._linear_pointwise``) on a
weight reordered once into oneDNN's blocked layout, with the bias and an optional
activation applied in the GEMM's epilogue. On the 2-core AVX512-BF16 machine of the
benchmarks, at the FLUX transformer's shapes, it is about 10-15% faster than
``F.linear`` in float32 and in bfloat16 and makes the tanh-GELU after an MLP's first
projection nearly free (docs/backends.md).

The packed copy lives beside the module's ``weight`` (which stays the loaded, shareable
parameter): it is made on a weight's first call, kept while that parameter lives, and
remade if it is modified in place. It costs one more copy of every weight that is
called.

Under ``torch.compile`` (and when autograd is recording) the backend emits ``F.linear``
(+ the activation) instead: inductor cannot lower the op on an unpacked weight and picks
the GEMM itself, and the op has no backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from diffserve.config.platform import cpu_kind
from diffserve.layers.linear.base import LinearBackend, activate

# activation -> oneDNN post-op (attr, algorithm) of ``mkldnn::_linear_pointwise``.
_POST_OPS: dict[str | None, tuple[str, str]] = {
    None: ("none", ""),
    "gelu_tanh": ("gelu", "tanh"),
}
_DTYPES = (torch.float32, torch.bfloat16)


class OneDnnLinearBackend(LinearBackend):
    name = "onednn"

    @classmethod
    def unavailable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        missing = []
        if device.type != "cpu":
            missing.append(f"it needs a CPU device, but the device is {device.type!r}")
        if not torch.backends.mkldnn.is_available():
            missing.append(
                "this torch build has no oneDNN (torch.backends.mkldnn.is_available() "
                "is False)"
            )
        elif not torch.backends.mkldnn.enabled:
            missing.append(
                "oneDNN is disabled (torch.backends.mkldnn.enabled is False)"
            )
        if dtype not in _DTYPES:
            missing.append(
                "it supports float32/bfloat16 only, but the dtype is "
                f"{str(dtype).removeprefix('torch.')}"
            )
        elif (
            dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and not (cpu_kind().avx512 and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        ):
            # The kind as well as torch's check: an emulated AVX2 kind
            # (DIFFSERVE_CPU_KIND) on an AVX512 machine must choose as a real AVX2 one
            # does, whatever torch's own detection reads.
            missing.append(
                f"this CPU ({cpu_kind().name}) has no oneDNN bfloat16 "
                "support (it needs AVX512 or AMX)"
            )
        return "; ".join(missing) or None

    @classmethod
    def auto_skip_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        # Measured on an AVX2-only CPU (2-core AMD EPYC, small-flux 256x256/4 float32
        # eager against diffusers on the same thread): onednn 1.085x diffusers' time,
        # F.linear (MKL's sgemm) 0.972x. The packed inner product pays off with AVX512
        # (10-15% over F.linear on AVX512-BF16, the AMX machine's bfloat16 tiles).
        kind = cpu_kind()
        if device.type == "cpu" and not kind.avx512:
            return (
                f"on an {kind.name} CPU F.linear (MKL's sgemm) is faster "
                "than oneDNN's packed inner product"
            )
        return None

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device, dtype)
        # weight -> (its _version when packed, the packed copy); an entry goes with its
        # weight.
        self._packed: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def packed(self, weight: torch.Tensor) -> torch.Tensor:
        """The oneDNN-layout copy of ``weight``, made on first use (and again after an
        in-place change)."""
        # An inference tensor has no version counter (its in-place changes go unseen:
        # pack, then freeze).
        version = -1 if weight.is_inference() else weight._version
        entry = self._packed.get(weight)
        if entry is None or entry[0] != version:
            with torch.no_grad():
                entry = (
                    version,
                    torch.ops.mkldnn._reorder_linear_weight(weight.detach()),
                )
            self._packed[weight] = entry
        return entry[1]

    def _fused(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether this call takes the oneDNN path: eager, CPU, one supported dtype, no
        autograd."""
        return (
            not torch.compiler.is_compiling()
            and x.device.type == "cpu"
            and x.dtype == weight.dtype
            and weight.dtype in _DTYPES
            and not (
                torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
            )
        )

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
        activation_from: int = 0,
    ) -> torch.Tensor:
        if self._fused(x, weight):
            # A post-op covers every column: a tail activation runs after the GEMM.
            attr, algorithm = _POST_OPS[None if activation_from else activation]
            y = torch.ops.mkldnn._linear_pointwise(
                x, self.packed(weight), bias, attr, [], algorithm
            )
            return activate(y, activation, activation_from) if activation_from else y
        return activate(F.linear(x, weight, bias), activation, activation_from)
