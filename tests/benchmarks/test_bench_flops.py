"""The analytic FLOP count of a FLUX transformer forward (benchmarks/flops.py) equals
what torch's FlopCounterMode counts for diffusers' FluxTransformer2DModel, plus the
attention matmuls (on CPU, SDPA is not counted by FlopCounterMode, so the test adds
4*S^2*D per block itself)."""

from __future__ import annotations

import pytest

from benchmarks.flops import tokens, transformer_flops


@pytest.mark.parametrize("guidance", [False, True])
def test_analytic_flops_match_flop_counter(guidance: bool) -> None:
    torch = pytest.importorskip("torch")
    from diffusers import FluxTransformer2DModel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = dict(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=3,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        pooled_projection_dim=24,
        guidance_embeds=guidance,
        axes_dims_rope=(4, 6, 6),
    )
    model = FluxTransformer2DModel(**cfg).eval()
    b, ni, nt = 2, 64, 16
    kwargs = dict(
        hidden_states=torch.randn(b, ni, 16),
        encoder_hidden_states=torch.randn(b, nt, 32),
        pooled_projections=torch.randn(b, 24),
        timestep=torch.ones(b),
        img_ids=torch.zeros(ni, 3),
        txt_ids=torch.zeros(nt, 3),
        guidance=torch.ones(b) if guidance else None,
        return_dict=False,
    )
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(**kwargs)
    d, s, blocks = 4 * 16, ni + nt, 2 + 3
    attention = b * blocks * 4 * s * s * d
    counted = counter.get_total_flops()
    # SDPA not counted on this build.
    if counted < transformer_flops(cfg, ni, nt, b) - attention // 2:
        counted += attention
    assert counted == transformer_flops(cfg, ni, nt, b)


def test_image_tokens_follow_vae_and_packing() -> None:
    assert tokens(256, 256) == 256
    assert tokens(128, 128) == 64
    assert tokens(1024, 768) == 64 * 48
