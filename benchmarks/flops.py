"""FLOPs of one FLUX transformer forward, counted analytically from the model config.

A linear layer applied to M tokens with K inputs and N outputs costs 2*M*K*N FLOPs;
attention over S = image + text tokens with width D = heads * head_dim costs 2*S*S*D for
QK^T plus 2*S*S*D for A.V. Norms, RoPE, activations and softmax are O(S*D) and left out
(they are < 1% at these sizes), so the count is the matmul work only, which is what the
matmul peak bounds.

Per sample (B multiplies everything), with D = inner dim, J = joint_attention_dim, P =
pooled dim, C = in_channels (patchified latent channels), Ni image tokens, Nt text
tokens, S = Ni + Nt:
  embedders   2*Ni*C*D (x_embedder) + 2*Nt*J*D (context_embedder)
              + 2*(256*D + D*D) (timestep MLP) + 2*(P*D + D*D) (pooled text MLP) [+
              guidance MLP]
  double blk  2*2*D*6D (two AdaLN-Zero modulations) + 2*S*D*D*4 (q, k, v, out for both
  streams)
              + 4*S*S*D (attention) + 2*S*D*4D*2 (GELU MLP per stream)      = 24*S*D^2 +
              4*S^2*D + 24*D^2
  single blk  2*D*3D (modulation) + 2*S*D*(3D + 4D) (q, k, v, mlp-in) + 4*S*S*D
  (attention)
              + 2*S*5D*D (proj_out over [attn, mlp])                      = 24*S*D^2 +
              4*S^2*D + 6*D^2
  output      2*D*2D (AdaLN-continuous) + 2*Ni*D*C_out (proj_out)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def tokens(height: int, width: int, vae_scale: int = 8, patch: int = 2) -> int:
    """Image tokens of a FLUX latent: the VAE downsamples by 8, then 2x2 latent patches
    are packed."""
    return (height // (vae_scale * patch)) * (width // (vae_scale * patch))


def transformer_flops(
    cfg: Mapping[str, Any], image_tokens: int, text_tokens: int, batch: int = 1
) -> int:
    """Matmul FLOPs of one forward of a FluxTransformer2DModel with config ``cfg``."""
    d = int(cfg["num_attention_heads"]) * int(cfg["attention_head_dim"])
    c_in = int(cfg.get("in_channels", 64))
    c_out = int(cfg.get("out_channels") or c_in) * int(cfg.get("patch_size", 1)) ** 2
    j = int(cfg["joint_attention_dim"])
    p = int(cfg["pooled_projection_dim"])
    ni, nt = image_tokens, text_tokens
    s = ni + nt

    embed = (
        2 * ni * c_in * d + 2 * nt * j * d + 2 * (256 * d + d * d) + 2 * (p * d + d * d)
    )
    if cfg.get("guidance_embeds"):
        embed += 2 * (256 * d + d * d)
    double = 24 * s * d * d + 4 * s * s * d + 24 * d * d
    single = 24 * s * d * d + 4 * s * s * d + 6 * d * d
    out = 2 * d * 2 * d + 2 * ni * d * c_out
    per_sample = (
        embed
        + int(cfg["num_layers"]) * double
        + int(cfg["num_single_layers"]) * single
        + out
    )
    return batch * per_sample
