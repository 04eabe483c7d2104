"""The kernel backends by kind: the one table of names, spellings and implementations.

``config`` derives the allowed ``linear_backend`` / ``attention_backend`` values from
these tables and ``layers`` selects and imports from them, so the two can never drift.
Adding a backend is one entry here plus one file under ``diffserve/layers/<kind>/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from diffserve.registry.targets import spelling_table


@dataclass(frozen=True)
class BackendTable:
    """Backends of one kind. ``targets`` order is the table order; ``auto_preference``
    is what ``auto`` tries, first runnable wins (a reference backend such as ``math`` is
    never chosen by ``auto``)."""

    kind: str
    targets: Mapping[str, str]
    auto_preference: tuple[str, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)

    def names(self) -> list[str]:
        return list(self.targets)

    def spellings(self) -> dict[str, str]:
        """Every accepted spelling (lower case, ``_`` for ``-``) -> canonical name,
        ``auto`` included."""
        return spelling_table(list(self.targets), dict(self.aliases), extra=("auto",))


LINEAR_BACKENDS = BackendTable(
    kind="linear",
    targets={
        "torch": "diffserve.layers.linear.torch:TorchLinearBackend",
        "onednn": "diffserve.layers.linear.onednn:OneDnnLinearBackend",
    },
    # onednn on CPU in float32/bfloat16 (packed weights, fused epilogue: faster than
    # F.linear there), torch everywhere else.
    auto_preference=("onednn", "torch"),
    aliases={"pytorch": "torch", "mkldnn": "onednn", "dnnl": "onednn"},
)

ATTENTION_BACKENDS = BackendTable(
    kind="attention",
    targets={
        "sdpa": "diffserve.layers.attention.sdpa:SdpaAttentionBackend",
        "math": "diffserve.layers.attention.math:MathAttentionBackend",
        "flash_attn": "diffserve.layers.attention.flash:FlashAttentionBackend",
        "sdpa_cudnn": "diffserve.layers.attention.sdpa_cudnn:SdpaCudnnAttentionBackend",
        "fa3": "diffserve.layers.attention.fa3:FA3AttentionBackend",
    },
    # On Hopper: FlashAttention-3 when installed, else cuDNN's attention (both measured
    # faster than the FlashAttention-2-class kernels at head_dim 128); flash_attn when
    # it can run (CUDA, half precision, package installed); else sdpa.
    auto_preference=("fa3", "sdpa_cudnn", "flash_attn", "sdpa"),
    aliases={
        "torch_sdpa": "sdpa",
        "flash_attention": "flash_attn",
        "flash": "flash_attn",
        "cudnn": "sdpa_cudnn",
        "cudnn_attention": "sdpa_cudnn",
        "flash_attn_3": "fa3",
        "flash_attention_3": "fa3",
        "fa_3": "fa3",
    },
)
