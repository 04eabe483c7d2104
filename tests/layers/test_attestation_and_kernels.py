from __future__ import annotations

import pytest
import torch

from diffserve.config.schema import FrozenDict
from diffserve.config.stage_sections import AttentionBackendConfig
from diffserve.errors import BackendUnavailableError, ConfigError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.kernels import build_kernel_set
from diffserve.layers.linear.registry import select_linear_backend
from diffserve.layers.observe import KernelObserver

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
    assert c.snapshot() == {
        "linear": {"torch": 3},
        "attention": {"sdpa": 1},
        "transformer_forwards": 1,
    }
    snap = c.snapshot()
    c.reset()
    assert c.snapshot() == {"linear": {}, "attention": {}, "transformer_forwards": 0}
    assert snap["linear"] == {"torch": 3}  # snapshots are copies


def attention(default: str, **roles: str) -> AttentionBackendConfig:
    return AttentionBackendConfig(default, FrozenDict(roles))


def test_per_role_choice() -> None:
    ks = build_kernel_set(
        "torch",
        attention("sdpa", single_block="math"),
        roles=ROLES,
        device="cpu",
        dtype=torch.float32,
    )
    assert ks.describe() == {
        "linear": "torch",
        "attention": {"double_block": "sdpa", "single_block": "math"},
    }
    assert ks.make_attention("single_block").backend_name == "math"
    assert ks.make_linear(3, 4).counters is ks.counters


def test_unknown_role_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="double_blok"):
        build_kernel_set(
            "torch",
            attention("auto", double_blok="math"),
            roles=ROLES,
            device="cpu",
            dtype=torch.float32,
        )


def test_explicit_flash_per_role_fails_at_build() -> None:
    with pytest.raises(BackendUnavailableError, match="flash_attn"):
        build_kernel_set(
            "auto",
            attention("sdpa", double_block="flash_attn"),
            roles=ROLES,
            device="cpu",
            dtype=torch.float32,
        )


class Counting:
    """A wrapper backend: counts its calls, delegates everything to the chosen
    backend."""

    def __init__(self, inner, calls: dict[str, int]) -> None:
        self.inner, self.calls, self.name = inner, calls, inner.name

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def linear(self, *args):
        self.calls["linear"] = self.calls.get("linear", 0) + 1
        return self.inner.linear(*args)

    def attention(self, *args):
        self.calls["attention"] = self.calls.get("attention", 0) + 1
        return self.inner.attention(*args)


class Recorder:
    """A kernel observer: records each selection and returns a counting wrapper."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self.calls: dict[str, int] = {}

    def on_select(self, kind, requested, backend):
        self.seen.append((kind, requested, backend.name))
        return Counting(backend, self.calls)


def test_observers_see_every_selection_and_may_wrap_the_backend() -> None:
    recorder = Recorder()
    ks = build_kernel_set(
        "auto",
        attention("sdpa", single_block="math"),
        roles=ROLES,
        device="cpu",
        dtype=torch.float32,
        observers=[recorder],
    )
    # Onednn where it can run, else torch.
    auto = select_linear_backend("auto", "cpu", torch.float32).name
    # One selection per distinct name (roles asking for the same name share one
    # backend).
    assert recorder.seen == [
        ("linear", "auto", auto),
        ("attention", "sdpa", "sdpa"),
        ("attention", "math", "math"),
    ]
    assert isinstance(recorder, KernelObserver)
    layer = ks.make_linear(3, 4)
    q = torch.randn(1, 2, 5, 8)
    layer(torch.randn(2, 3))
    ks.make_attention("double_block")(q, q, q)
    ks.make_attention("single_block")(q, q, q)
    # The wrapped backends served the calls, and the counters saw them under the names
    # they report. (the kernel set is batch-invariant: the 2-sample linear call is one
    # backend call per sample).
    assert recorder.calls == {"linear": 2, "attention": 2}
    assert ks.counters.snapshot()["linear"] == {auto: 1}
    assert ks.counters.snapshot()["attention"] == {"sdpa": 1, "math": 1}
