"""Native FLUX transformer vs diffusers' FluxTransformer2DModel on identical weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flux_helpers import flux_transformer

from diffserve.errors import BackendUnavailableError, ModelLoadError
from diffserve.layers.attention.module import Attention
from diffserve.layers.linear.module import Linear

SMALL = dict(
    in_channels=64,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=32,
    num_attention_heads=4,
    joint_attention_dim=64,
    pooled_projection_dim=32,
    axes_dims_rope=(8, 12, 12),
)


def _make_diffusers(tmp: Path, guidance_embeds: bool, seed: int = 0, **save_kwargs):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(**SMALL, guidance_embeds=guidance_embeds).eval()
    with torch.no_grad():
        # Non-trivial norms and biases, so every mapping is exercised.
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = tmp / "transformer"
    model.save_pretrained(out, **save_kwargs)
    return model, out


@pytest.fixture(scope="module", params=[False, True], ids=["schnell-like", "dev-like"])
def pair(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flux")
    ref, path = _make_diffusers(tmp, guidance_embeds=request.param)
    return ref, path, request.param


def _inputs(
    guidance: bool,
    batch: int = 2,
    h: int = 6,
    w: int = 10,
    txt_len: int = 7,
    seed: int = 1,
):
    g = torch.Generator().manual_seed(seed)
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None, :]
    return dict(
        hidden_states=torch.randn(batch, h * w, 64, generator=g),
        encoder_hidden_states=torch.randn(batch, txt_len, 64, generator=g),
        pooled_projections=torch.randn(batch, 32, generator=g),
        timestep=torch.tensor([0.7, 0.3])[:batch],
        img_ids=img_ids.reshape(-1, 3),
        txt_ids=torch.zeros(txt_len, 3),
        guidance=torch.full((batch,), 3.5) if guidance else None,
    )


def _native(model, x):
    return model(
        x["hidden_states"],
        x["img_ids"],
        x["encoder_hidden_states"],
        x["txt_ids"],
        x["timestep"],
        x["pooled_projections"],
        x["guidance"],
    )


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.numerics
@pytest.mark.parametrize("attention", ["sdpa", "math"])
def test_parity_with_diffusers(pair, attention: str) -> None:
    ref, path, guidance = pair
    model = flux_transformer(path, attention=attention)
    x = _inputs(guidance)
    with torch.inference_mode():
        expected = ref(**x, return_dict=False)[0]
        got = _native(model, x)
    assert got.shape == expected.shape
    assert _rel(got, expected) < 1e-4


@pytest.mark.numerics
def test_math_vs_sdpa_within_1e5(pair) -> None:
    _, path, guidance = pair
    x = _inputs(guidance, seed=3)
    with torch.inference_mode():
        a = _native(flux_transformer(path, attention="sdpa"), x)
        b = _native(flux_transformer(path, attention="math"), x)
    assert _rel(a, b) < 1e-5


def test_counters_per_forward_and_backend_names(pair) -> None:
    _, path, guidance = pair
    model = flux_transformer(path, attention="sdpa")
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    assert {m.backend_name for m in linears} == {"torch"}
    assert {m.backend_name for m in attentions} == {"sdpa"}
    assert len(attentions) == SMALL["num_layers"] + SMALL["num_single_layers"]
    x = _inputs(guidance)
    with torch.inference_mode():
        _native(model, x)
        snap = model.counters.snapshot()
        assert snap == {
            "linear": {"torch": len(linears)},
            "attention": {"sdpa": len(attentions)},
            "transformer_forwards": 1,
        }
        _native(model, x)
    assert model.counters.snapshot()["linear"] == {"torch": 2 * len(linears)}
    assert model.counters.snapshot()["attention"] == {"sdpa": 2 * len(attentions)}
    with model.counters.paused():
        _native(model, x)
    assert model.counters.snapshot()["transformer_forwards"] == 2
    model.counters.reset()
    assert model.counters.snapshot()["transformer_forwards"] == 0


def test_per_role_attention_backends(pair) -> None:
    _, path, _ = pair
    model = flux_transformer(
        path, attention={"default": "sdpa", "single_block": "math"}
    )
    roles = {
        (m.role, m.backend_name) for m in model.modules() if isinstance(m, Attention)
    }
    assert roles == {("double_block", "sdpa"), ("single_block", "math")}


def test_flash_attn_fails_at_load_on_cpu(pair) -> None:
    _, path, _ = pair
    with pytest.raises(
        BackendUnavailableError, match="flash_attn package is not installed|CUDA device"
    ):
        flux_transformer(path, attention="flash_attn")


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    ref, path = _make_diffusers(
        tmp_path, guidance_embeds=False, seed=5, max_shard_size="200KB"
    )
    assert (path / "diffusion_pytorch_model.safetensors.index.json").is_file()
    model = flux_transformer(path)
    x = _inputs(False)
    with torch.inference_mode():
        assert _rel(_native(model, x), ref(**x, return_dict=False)[0]) < 1e-4


def test_missing_and_unexpected_keys_are_errors(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _, path = _make_diffusers(tmp_path, guidance_embeds=False, seed=6)
    weights = load_file(str(path / "diffusion_pytorch_model.safetensors"))
    weights.pop("transformer_blocks.0.attn.to_k.weight")
    weights["transformer_blocks.0.extra.weight"] = torch.zeros(1)
    save_file(weights, str(path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(
        ModelLoadError,
        match=r"transformer: weights do not match .*: missing 1 key: "
        r"transformer_blocks.0.attn.to_k.weight; "
        r"unexpected 1 key: transformer_blocks.0.extra.weight",
    ):
        flux_transformer(path)


def test_guidance_flag_mismatch_is_a_load_error(tmp_path: Path) -> None:
    _, path = _make_diffusers(tmp_path, guidance_embeds=True, seed=7)
    config = json.loads((path / "config.json").read_text())
    config["guidance_embeds"] = False
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="guidance_embedder"):
        flux_transformer(path)


def test_missing_shard_and_missing_weights_are_errors(tmp_path: Path) -> None:
    _, path = _make_diffusers(
        tmp_path, guidance_embeds=False, seed=8, max_shard_size="200KB"
    )
    shard = sorted(path.glob("*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(
        ModelLoadError, match=f"shard {shard.name} listed in .* is missing"
    ):
        flux_transformer(path)
    for weights in path.glob("*.safetensors*"):
        weights.unlink()
    with pytest.raises(
        ModelLoadError, match="expected diffusion_pytorch_model.safetensors"
    ):
        flux_transformer(path)
