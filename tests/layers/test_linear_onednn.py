"""The oneDNN linear backend: availability, parity with F.linear, fused GELU, packing
(batch invariance of a per-sample layer on it: tests/layers/test_per_sample.py)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from diffserve.config.platform import cpu_kind
from diffserve.errors import BackendUnavailableError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear.module import Linear
from diffserve.layers.linear.onednn import OneDnnLinearBackend
from diffserve.layers.linear.registry import select_linear_backend
from diffserve.registry.backends import LINEAR_BACKENDS

CPU = torch.device("cpu")
DTYPES = [
    d
    for d in (torch.float32, torch.bfloat16)
    if OneDnnLinearBackend.unavailable_reason(CPU, d) is None
]
pytestmark = pytest.mark.skipif(
    not DTYPES, reason="oneDNN cannot run on this CPU/torch build"
)


def _layer(
    in_f: int, out_f: int, dtype: torch.dtype, **kw
) -> tuple[Linear, KernelCounters]:
    counters = KernelCounters()
    layer = Linear(
        in_f,
        out_f,
        backend=select_linear_backend("onednn", "cpu", dtype),
        counters=counters,
        dtype=dtype,
        **kw,
    ).requires_grad_(False)
    return layer, counters


@pytest.mark.numerics
def test_registered_with_aliases_and_preferred_by_auto_where_it_pays() -> None:
    assert LINEAR_BACKENDS.spellings()["mkldnn"] == "onednn"
    assert LINEAR_BACKENDS.auto_preference == ("onednn", "torch")
    # With AVX512 the packed inner product beats F.linear; on an AVX2 CPU MKL's sgemm
    # does (docs/backends.md).
    kind = cpu_kind()
    assert select_linear_backend("auto", "cpu", DTYPES[0]).name == (
        "onednn" if kind.avx512 else "torch"
    )
    reason = OneDnnLinearBackend.auto_skip_reason(torch.device("cpu"), torch.float32)
    assert (reason is None) == kind.avx512 and (kind.avx512 or kind.name in reason)
    assert (
        OneDnnLinearBackend.auto_skip_reason(torch.device("meta"), torch.float32)
        is None
    )


@pytest.mark.numerics
def test_unavailable_reasons_name_every_missing_part() -> None:
    with pytest.raises(BackendUnavailableError) as info:
        select_linear_backend("onednn", "meta", torch.float16)
    text = str(info.value)
    assert "linear backend 'onednn' was requested but cannot run here" in text
    assert (
        "CPU device, but the device is 'meta'" in text
        and "float32/bfloat16 only" in text
    )
    assert (
        OneDnnLinearBackend.unavailable_reason(torch.device("cuda"), torch.float32)
        == "it needs a CPU device, but the device is 'cuda'"
    )


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_matches_f_linear_and_counts_under_its_name(
    dtype: torch.dtype, activation: str | None
) -> None:
    layer, counters = _layer(96, 160, dtype, activation=activation)
    x = torch.randn(2, 37, 96).to(dtype)
    expected = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    if activation:
        expected = F.gelu(expected, approximate="tanh")
    with torch.inference_mode():
        got = layer(x)
    assert got.dtype == dtype and got.shape == (2, 37, 160)
    rel = ((got.double() - expected).norm() / expected.norm()).item()
    assert rel < (1e-6 if dtype == torch.float32 else 1e-2), rel
    assert layer.backend_name == "onednn"
    assert ("activation=gelu_tanh" in repr(layer)) == (activation is not None)
    assert counters.snapshot()["linear"] == {"onednn": 1}


def test_weights_are_packed_once_and_again_after_an_in_place_change() -> None:
    layer, _ = _layer(64, 32, torch.float32)
    backend: OneDnnLinearBackend = layer.backend  # type: ignore[assignment]
    x = torch.randn(5, 64)
    with torch.inference_mode():
        first = layer(x)
        packed = backend.packed(layer.weight)
        layer(x)
        assert backend.packed(layer.weight) is packed  # cached
    with torch.no_grad():
        layer.weight.mul_(2)  # e.g. a LoRA merge: the packed copy must follow
    with torch.inference_mode():
        again = layer(x)
    assert backend.packed(layer.weight) is not packed
    torch.testing.assert_close(again - layer.bias, 2 * (first - layer.bias))
    # The packed copy goes with its parameter (no copy kept for a dropped model).
    assert len(backend._packed) == 1
    del layer
    gc.collect()
    assert len(backend._packed) == 0


def test_the_loaded_weight_stays_a_plain_parameter() -> None:
    layer, _ = _layer(64, 32, torch.float32)
    with torch.inference_mode():
        layer(torch.randn(3, 64))
    assert (
        isinstance(layer.weight, torch.nn.Parameter)
        and layer.weight.layout == torch.strided
    )
    assert set(layer.state_dict()) == {"weight", "bias"}


def test_autograd_and_foreign_dtypes_take_the_f_linear_path() -> None:
    layer, _ = _layer(16, 8, torch.float32, activation="gelu_tanh")
    layer.requires_grad_(True)
    x = torch.randn(4, 16, requires_grad=True)
    # The oneDNN op has no backward: F.linear serves recorded calls.
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    with torch.inference_mode():
        half = layer.backend.linear(
            x.detach().double(), layer.weight.double(), layer.bias.double()
        )
    assert half.dtype == torch.float64


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown activation 'relu6'"):
        _layer(4, 4, torch.float32, activation="relu6")


def test_patched_linear_sees_activation_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    layer, _ = _layer(8, 8, torch.float32, activation="gelu_tanh")
    seen = []
    original = OneDnnLinearBackend.linear

    def recording(self, *args):
        seen.append(args[3:])
        return original(self, *args)

    monkeypatch.setattr(OneDnnLinearBackend, "linear", recording)
    with torch.inference_mode():
        layer(torch.randn(2, 8))
    assert seen == [("gelu_tanh",)]
