from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from diffserve.errors import BackendUnavailableError, ConfigError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.kernels import attention_choice, build_kernel_set

ROLES = ("double_block", "single_block")


def test_counters_snapshot_reset_and_pause() -> None:
    c = KernelCounters()
    c.count_linear("torch")
    c.count_linear("torch", 2)
    c.count_attention("sdpa")
    c.count_forward()
    with c.paused():
        c.count_linear("torch")
        c.count_forward()
    assert c.snapshot() == {"linear": {"torch": 3}, "attention": {"sdpa": 1}, "transformer_forwards": 1}
    snap = c.snapshot()
    c.reset()
    assert c.snapshot() == {"linear": {}, "attention": {}, "transformer_forwards": 0}
    assert snap["linear"] == {"torch": 3}  # snapshots are copies


@pytest.mark.parametrize("spec, expected", [
    ("sdpa", ("sdpa", {})),
    ({"default": "sdpa", "single_block": "math"}, ("sdpa", {"single_block": "math"})),
    (SimpleNamespace(default="math", roles={"double_block": "sdpa"}), ("math", {"double_block": "sdpa"})),
])
def test_attention_choice_forms(spec, expected) -> None:
    assert attention_choice(spec) == expected


def test_per_role_choice() -> None:
    ks = build_kernel_set("torch", {"default": "sdpa", "single_block": "math"}, roles=ROLES,
                          device="cpu", dtype=torch.float32)
    assert ks.describe() == {"linear": "torch", "attention": {"double_block": "sdpa", "single_block": "math"}}
    assert ks.make_attention("single_block").backend_name == "math"
    assert ks.make_linear(3, 4).counters is ks.counters


def test_unknown_role_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="double_blok"):
        build_kernel_set("torch", {"double_blok": "math"}, roles=ROLES, device="cpu", dtype=torch.float32)


def test_explicit_flash_per_role_fails_at_build() -> None:
    with pytest.raises(BackendUnavailableError, match="flash_attn"):
        build_kernel_set("auto", {"default": "sdpa", "double_block": "flash_attn"}, roles=ROLES,
                         device="cpu", dtype=torch.float32)


def test_select_functions_are_looked_up_at_build_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from diffserve.layers import attention as attention_pkg
    from diffserve.layers.linear import registry as linear_registry

    seen: list[tuple[str, str]] = []
    real_linear, real_attention = linear_registry.select_linear_backend, attention_pkg.select_attention_backend

    def record_linear(name, device, dtype):
        seen.append(("linear", name))
        return real_linear(name, device, dtype)

    def record_attention(name, device, dtype):
        seen.append(("attention", name))
        return real_attention(name, device, dtype)

    monkeypatch.setattr(linear_registry, "select_linear_backend", record_linear)
    monkeypatch.setattr(attention_pkg, "select_attention_backend", record_attention)
    build_kernel_set("auto", {"default": "sdpa", "single_block": "math"}, roles=ROLES, device="cpu",
                     dtype=torch.float32)
    assert seen == [("linear", "auto"), ("attention", "sdpa"), ("attention", "math")]
