"""The GPU paths of the quantized methods, checked where they can run here: the
int8 GEMM a GPU runs (``layers/linear/int8_mm.py``) never probes a tensor's ``repr``
(torchao's eager ``safe_int_mm`` does, a device sync per GEMM) and computes torchao's
method; fp8 is built with per-row scales."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffserve.config.platform import cpu_kind
from diffserve.layers.linear.quantized import (
    Int8DynamicLinearBackend,
    backend_class,
    torchao_config,
)
from diffserve.registry.quantization import QUANTIZATION_METHODS

pytest.importorskip("torchao")


def int8_layer(seed: int = 0) -> tuple[nn.Linear, nn.Linear]:
    """(the float layer, the same layer quantized by torchao's int8 W8A8)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(seed)
    dense = nn.Linear(256, 384).eval()
    quantized = nn.Linear(256, 384).eval()
    quantized.load_state_dict(dense.state_dict())
    quantize_(quantized, Int8DynamicActivationInt8WeightConfig())
    return dense, quantized


def snr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).mean() / (out - ref).pow(2).mean()))


def _vnni_emulated_away() -> bool:
    """An emulated kind without VNNI (AVX2) on a CPU that has it. ATen sends
    ``torch._int_mm`` to oneDNN when the hardware has VNNI (it asks cpuinfo, not
    ``ATEN_CPU_CAPABILITY``), and oneDNN capped below VNNI (``ONEDNN_MAX_CPU_ISA=AVX2``)
    then returns wrong sums (measured on Intel AMX: max error 86105 on a 256-deep
    product; torchao's own int8 path the same). A real AVX2 CPU takes ATen's exact
    reference GEMM, so the emulation cannot stand for it here."""
    kind = cpu_kind()
    if not kind.emulated_on or kind.name != "AVX2":
        return False
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
        flags = fh.read()
    return any(flag in flags for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


@pytest.mark.numerics
@pytest.mark.skipif(
    _vnni_emulated_away(),
    reason="torch._int_mm is wrong under ONEDNN_MAX_CPU_ISA=AVX2 on a VNNI CPU "
    "(an emulation artifact; the main run checks this kind's int8 GEMM natively)",
)
def test_int8_gemm_never_probes_repr_nor_torchaos_dispatch() -> None:
    from torchao.quantization.quantize_.workflows.int8 import int8_tensor

    from diffserve.layers.linear.int8_mm import int8_dynamic_linear

    dense, quantized = int8_layer()
    x = torch.randn(2, 40, 256, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference = dense(x)
        torchaos = F.linear(x, quantized.weight, quantized.bias)
        # The path torchao takes (and whose CUDA branch calls repr()) is never entered,
        # and no tensor is formatted.
        with (
            mock.patch.object(
                int8_tensor,
                "int_scaled_matmul",
                side_effect=AssertionError("torchao's int8 dispatch ran"),
            ),
            mock.patch.object(
                torch.Tensor,
                "__repr__",
                side_effect=AssertionError("Tensor.__repr__ on the hot path"),
            ),
        ):
            ours = int8_dynamic_linear(x, quantized.weight, quantized.bias)
            # The same patches do catch torchao's own path: the test can fail.
            with pytest.raises(AssertionError, match="dispatch ran"):
                F.linear(x, quantized.weight, quantized.bias)
    assert ours.shape == reference.shape and ours.dtype == reference.dtype
    # The same method: as close to the float layer as torchao's own GEMM is
    assert snr_db(ours, reference) > 35.0
    assert snr_db(ours, reference) > snr_db(torchaos, reference) - 1.0


def test_int8_backend_takes_the_repr_free_path_on_gpus_only() -> None:
    backend = backend_class(QUANTIZATION_METHODS["int8"])
    assert issubclass(backend, Int8DynamicLinearBackend)
    assert backend.name == "int8_dynamic"
    # Elsewhere it is torchao's kernel (faster on CPUs, no repr probe there)
    _, quantized = int8_layer()
    x = torch.randn(3, 256)
    inner = mock.Mock()
    with torch.inference_mode():
        out = backend(inner).linear(x, quantized.weight, quantized.bias)
        expected = F.linear(x, quantized.weight, quantized.bias)
    assert torch.equal(out, expected)


def test_fp8_scales_per_row() -> None:
    from torchao.quantization import PerRow

    config = torchao_config(QUANTIZATION_METHODS["fp8"])
    assert type(config).__name__ == "Float8DynamicActivationFloat8WeightConfig"
    assert list(config.granularity) == [PerRow(), PerRow()]


def test_column_major_int8_rows_change_no_result() -> None:
    """What quantization does to a GPU's int8 weights (a layout for ``_int_mm``, no copy
    per GEMM): the same values, torchao's own path unchanged."""
    from diffserve.layers.linear.int8_mm import int8_dynamic_linear
    from diffserve.layers.linear.quantized import column_major_int8

    _, quantized = int8_layer()
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        before = int8_dynamic_linear(x, quantized.weight, quantized.bias)
        torchaos = F.linear(x, quantized.weight, quantized.bias)
        column_major_int8(quantized.weight)
        assert quantized.weight.qdata.t().is_contiguous()
        after = int8_dynamic_linear(x, quantized.weight, quantized.bias)
        assert torch.equal(after, before)
        assert torch.equal(F.linear(x, quantized.weight, quantized.bias), torchaos)
