from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffserve.errors import BackendUnavailableError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear.module import Linear
from diffserve.layers.linear.onednn import OneDnnLinearBackend
from diffserve.layers.linear.registry import select_linear_backend
from diffserve.layers.linear.torch import TorchLinearBackend


def test_auto_picks_onednn_on_cpu_where_it_runs_and_pays_else_torch() -> None:
    cpu = torch.device("cpu")
    for dtype in (torch.float32, torch.bfloat16):
        passed_over = OneDnnLinearBackend.unavailable_reason(
            cpu, dtype
        ) or OneDnnLinearBackend.auto_skip_reason(cpu, dtype)
        expected = "torch" if passed_over else "onednn"
        assert select_linear_backend("auto", "cpu", dtype).name == expected
    # float16 is not oneDNN's here: auto falls back to the reference backend.
    backend = select_linear_backend("auto", "cpu", torch.float16)
    assert backend.name == "torch"
    assert isinstance(backend, TorchLinearBackend)


def test_auto_falls_back_to_torch_when_onednn_is_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert select_linear_backend("auto", "cpu", torch.float32).name == "torch"
    with pytest.raises(BackendUnavailableError, match="oneDNN is disabled"):
        select_linear_backend("onednn", "cpu", torch.float32)


def test_unknown_backend_names_the_valid_ones() -> None:
    with pytest.raises(BackendUnavailableError, match="valid: auto, torch, onednn"):
        select_linear_backend("cutlass9", "cpu", torch.float32)


def test_linear_matches_f_linear_and_counts() -> None:
    counters = KernelCounters()
    layer = Linear(
        8,
        5,
        backend=select_linear_backend("torch", "cpu", torch.float32),
        counters=counters,
    )
    x = torch.randn(2, 3, 8)
    # The backend's own call.
    torch.testing.assert_close(
        layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0
    )
    layer(x)
    assert layer.backend_name == "torch"
    assert counters.snapshot()["linear"] == {"torch": 2}


def test_patched_backend_method_is_seen_after_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = Linear(
        4,
        4,
        bias=False,
        backend=select_linear_backend("torch", "cpu", torch.float32),
        counters=KernelCounters(),
    )
    seen = []

    def recording(self, x, weight, bias):
        seen.append(x.shape)
        return F.linear(x, weight, bias)

    monkeypatch.setattr(TorchLinearBackend, "linear", recording)
    layer(torch.randn(3, 4))
    assert seen == [torch.Size([3, 4])]
