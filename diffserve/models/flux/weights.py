"""Map a diffusers ``FluxTransformer2DModel`` state dict onto the native module, fusing
projections.

Q/K/V become one ``qkv`` weight per stream (double blocks) or per block (single blocks)
by concatenating rows at load time (one GEMM instead of three). A single block's MLP
input stays its own ``mlp_in``: its tanh-GELU is that projection's activation, which a
linear backend may fuse into the GEMM.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch import Tensor

from diffserve.models.flux.params import FluxParams
from diffserve.models.loader import check_key_match

Rule = tuple[tuple[str, ...], Callable[[list[Tensor]], Tensor]]


def _cat(tensors: list[Tensor]) -> Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)


def _swap_halves(tensors: list[Tensor]) -> Tensor:
    # diffusers stores the final modulation as (scale, shift); the reference order is
    # (shift, scale).
    scale, shift = tensors[0].chunk(2, dim=0)
    return torch.cat((shift, scale), dim=0)


def _linear(
    rules: dict[str, Rule],
    native: str,
    *sources: str,
    fn: Callable = _cat,
    bias: bool = True,
) -> None:
    for suffix in ("weight", "bias") if bias else ("weight",):
        rules[f"{native}.{suffix}"] = (tuple(f"{s}.{suffix}" for s in sources), fn)


def _norms(rules: dict[str, Rule], native: str, q: str, k: str) -> None:
    rules[f"{native}.query_norm.scale"] = ((f"{q}.weight",), _cat)
    rules[f"{native}.key_norm.scale"] = ((f"{k}.weight",), _cat)


def conversion_rules(params: FluxParams) -> dict[str, Rule]:
    """native key -> (diffusers keys, combine function) for every native parameter."""
    rules: dict[str, Rule] = {}
    _linear(rules, "img_in", "x_embedder")
    _linear(rules, "txt_in", "context_embedder")
    _linear(rules, "time_in.in_layer", "time_text_embed.timestep_embedder.linear_1")
    _linear(rules, "time_in.out_layer", "time_text_embed.timestep_embedder.linear_2")
    _linear(rules, "vector_in.in_layer", "time_text_embed.text_embedder.linear_1")
    _linear(rules, "vector_in.out_layer", "time_text_embed.text_embedder.linear_2")
    if params.guidance_embed:
        _linear(
            rules, "guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"
        )
        _linear(
            rules, "guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"
        )
    for i in range(params.depth):
        n, d = f"double_blocks.{i}", f"transformer_blocks.{i}"
        _linear(rules, f"{n}.img_mod.lin", f"{d}.norm1.linear")
        _linear(rules, f"{n}.txt_mod.lin", f"{d}.norm1_context.linear")
        _linear(
            rules,
            f"{n}.img_attn.qkv",
            f"{d}.attn.to_q",
            f"{d}.attn.to_k",
            f"{d}.attn.to_v",
        )
        _linear(
            rules,
            f"{n}.txt_attn.qkv",
            f"{d}.attn.add_q_proj",
            f"{d}.attn.add_k_proj",
            f"{d}.attn.add_v_proj",
        )
        _norms(rules, f"{n}.img_attn.norm", f"{d}.attn.norm_q", f"{d}.attn.norm_k")
        _norms(
            rules,
            f"{n}.txt_attn.norm",
            f"{d}.attn.norm_added_q",
            f"{d}.attn.norm_added_k",
        )
        _linear(rules, f"{n}.img_attn.proj", f"{d}.attn.to_out.0")
        _linear(rules, f"{n}.txt_attn.proj", f"{d}.attn.to_add_out")
        _linear(rules, f"{n}.img_mlp.0", f"{d}.ff.net.0.proj")
        _linear(rules, f"{n}.img_mlp.1", f"{d}.ff.net.2")
        _linear(rules, f"{n}.txt_mlp.0", f"{d}.ff_context.net.0.proj")
        _linear(rules, f"{n}.txt_mlp.1", f"{d}.ff_context.net.2")
    for i in range(params.depth_single_blocks):
        n, d = f"single_blocks.{i}", f"single_transformer_blocks.{i}"
        _linear(rules, f"{n}.qkv", f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v")
        _linear(rules, f"{n}.mlp_in", f"{d}.proj_mlp")
        _linear(rules, f"{n}.linear2", f"{d}.proj_out")
        _norms(rules, f"{n}.norm", f"{d}.attn.norm_q", f"{d}.attn.norm_k")
        _linear(rules, f"{n}.modulation.lin", f"{d}.norm.linear")
    _linear(rules, "final_layer.adaLN_modulation.1", "norm_out.linear", fn=_swap_halves)
    _linear(rules, "final_layer.linear", "proj_out")
    return rules


def convert_diffusers_state_dict(
    state_dict: dict[str, Tensor], params: FluxParams, source: str = "transformer"
) -> dict[str, Tensor]:
    """Return the native state dict (consuming ``state_dict``); any missing or
    unexpected diffusers key, or projections that cannot be fused (of other widths), is
    a ``ModelLoadError`` naming ``source``."""
    rules = conversion_rules(params)
    needed = {src for sources, _ in rules.values() for src in sources}
    check_key_match(
        source,
        "the transformer's config.json",
        missing=needed - state_dict.keys(),
        unexpected=state_dict.keys() - needed,
    )
    native: dict[str, Tensor] = {}
    for key, (sources, fn) in rules.items():
        # Pop as we go so each source tensor can be freed once fused: peak memory stays
        # near one model copy.
        tensors = [state_dict.pop(s) for s in sources]
        try:
            native[key] = fn(tensors)
        except (
            RuntimeError
        ):  # torch.cat of projections whose widths differ: the odd one out is named
            widths = Counter(tuple(t.shape[1:]) for t in tensors).most_common(1)[0][0]
            odd = [
                (s, tuple(t.shape), (t.shape[0], *widths))
                for s, t in zip(sources, tensors, strict=True)
                if tuple(t.shape[1:]) != widths
            ]
            check_key_match(
                source,
                "the transformer's config.json",
                wrong_shape=odd,
                hint="a checkpoint of another model size?",
            )
            raise
    return native


def diffusers_key_names(params: FluxParams) -> Callable[[str], str]:
    """A native key -> the diffusers key(s) it is made of, for errors about a
    diffusers-layout file."""
    sources = {
        native: " + ".join(srcs)
        for native, (srcs, _) in conversion_rules(params).items()
    }
    return lambda key: sources.get(key, key)
