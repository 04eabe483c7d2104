"""The native FLUX transformer on the oneDNN linear backend (what ``auto`` picks on
CPU): parity with diffusers in float32 and bfloat16, attestation under its name, and
batch invariance."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from flux_helpers import flux_transformer

from diffserve.config.stage_sections import AttentionBackendConfig
from diffserve.layers.kernels import build_kernel_set
from diffserve.layers.linear.module import Linear
from diffserve.layers.linear.onednn import OneDnnLinearBackend
from diffserve.models.base import library_admit
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.models.flux.transformer import FluxTransformer, load_flux_transformer
from diffserve.registry.models import MODEL_FAMILIES
from diffserve.types.request import GenerationRequest

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    OneDnnLinearBackend.unavailable_reason(CPU, torch.float32) is not None,
    reason="oneDNN cannot run here",
)
BF16 = OneDnnLinearBackend.unavailable_reason(CPU, torch.bfloat16) is None
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


@pytest.fixture(scope="module", params=[False, True], ids=["schnell-like", "dev-like"])
def pair(request, tmp_path_factory):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    model = FluxTransformer2DModel(**SMALL, guidance_embeds=request.param).eval()
    with torch.no_grad():
        # Non-trivial norms and biases, so every mapping is exercised.
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("flux") / "transformer"
    model.save_pretrained(path)
    return model, path, request.param


def _native_model(path: Path, linear: str, dtype: torch.dtype) -> FluxTransformer:
    kernels = build_kernel_set(
        linear,
        AttentionBackendConfig("sdpa"),
        roles=MODEL_FAMILIES["FluxPipeline"].attention_roles,
        device="cpu",
        dtype=dtype,
    )
    return load_flux_transformer(path, kernels, dtype=dtype)


def _inputs(
    guidance: bool, batch: int = 2, dtype: torch.dtype = torch.float32, seed: int = 1
) -> dict:
    g = torch.Generator().manual_seed(seed)
    h, w, txt_len = 6, 10, 7
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None, :]
    return dict(
        hidden_states=torch.randn(batch, h * w, 64, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(batch, txt_len, 64, generator=g).to(dtype),
        pooled_projections=torch.randn(batch, 32, generator=g).to(dtype),
        timestep=torch.tensor([0.7, 0.3, 0.5])[:batch].to(dtype),
        img_ids=img_ids.reshape(-1, 3),
        txt_ids=torch.zeros(txt_len, 3),
        guidance=torch.full((batch,), 3.5, dtype=dtype) if guidance else None,
    )


def _run(model: FluxTransformer, x: dict) -> torch.Tensor:
    with torch.inference_mode():
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
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.numerics
def test_float32_parity_with_diffusers_and_counters(pair) -> None:
    ref, path, guidance = pair
    model = _native_model(path, "onednn", torch.float32)
    x = _inputs(guidance)
    with torch.inference_mode():
        expected = ref(**x, return_dict=False)[0]
    got = _run(model, x)
    assert _rel(got, expected) < 1e-4
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert {m.backend_name for m in linears} == {"onednn"}
    assert model.counters.snapshot()["linear"] == {"onednn": len(linears)}
    # The MLP activations ride in their projections: still one counted call per Linear.
    assert (
        sum(m.activation == "gelu_tanh" for m in linears)
        == 2 * SMALL["num_layers"] + SMALL["num_single_layers"]
    )


@pytest.mark.numerics
@pytest.mark.skipif(not BF16, reason="no oneDNN bfloat16 on this CPU")
def test_bfloat16_is_as_close_to_float32_as_diffusers_bfloat16(pair) -> None:
    ref, path, guidance = pair
    x = _inputs(guidance)
    with torch.inference_mode():
        truth = ref(**x, return_dict=False)[0]
        theirs = copy.deepcopy(ref).to(torch.bfloat16)(
            **_inputs(guidance, dtype=torch.bfloat16), return_dict=False
        )[0]
    ours = _run(
        _native_model(path, "onednn", torch.bfloat16),
        _inputs(guidance, dtype=torch.bfloat16),
    )
    assert ours.dtype == torch.bfloat16
    # Norm, RoPE and the fused GELU round once instead of after every op: no worse than
    # diffusers' bfloat16.
    assert _rel(ours, truth) <= 1.25 * _rel(theirs, truth) + 1e-3, (
        _rel(ours, truth),
        _rel(theirs, truth),
    )
    assert _rel(ours, theirs) < 3e-2


@pytest.mark.numerics
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16] if BF16 else [torch.float32]
)
def test_a_sample_does_not_depend_on_its_batch(pair, dtype: torch.dtype) -> None:
    _, path, guidance = pair
    model = _native_model(path, "onednn", dtype)
    x = _inputs(guidance, batch=3, dtype=dtype, seed=4)
    batched = _run(model, x)
    for i in range(3):
        alone = {
            k: (
                v[i : i + 1] if k not in ("img_ids", "txt_ids") and v is not None else v
            )
            for k, v in x.items()
        }
        assert torch.equal(batched[i : i + 1], _run(model, alone)), i


@pytest.mark.numerics
def test_pipeline_batch_equals_requests_alone(tiny_flux_dir) -> None:
    pipe = FluxPipeline.from_pretrained(
        tiny_flux_dir, linear_backend="onednn", attention_backend="sdpa"
    )
    assert pipe.transformer.kernels.describe()["linear"] == "onednn"
    base = dict(
        prompt="a red fox in the snow",
        height=64,
        width=64,
        num_inference_steps=2,
        max_sequence_length=64,
    )
    batch = [
        GenerationRequest(**base, seed=1),
        GenerationRequest(**{**base, "prompt": "a blue house"}, seed=2, n=2),
    ]
    outputs = list(pipe.run([library_admit(pipe, r) for r in batch]))[-1].outputs
    for request, output in zip(batch, outputs, strict=True):
        assert torch.equal(output.images, pipe(request).images)


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="torch.compile (inductor) on CPU needs a C compiler",
)
def test_compiled_blocks_match_eager_and_still_count(tiny_flux_dir) -> None:
    # Inside a compiled block the backend emits F.linear (+ GELU) for inductor; still
    # counted as onednn.
    eager = flux_transformer(tiny_flux_dir / "transformer", linear="onednn")
    compiled = flux_transformer(tiny_flux_dir / "transformer", linear="onednn")
    compiled.compile_blocks()
    n_linear = sum(isinstance(m, Linear) for m in compiled.modules())
    n_blocks = len(compiled.double_blocks) + len(compiled.single_blocks)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        img = torch.randn(1, 16, 64, generator=g)
        img_ids = torch.stack(
            [torch.zeros(16), torch.arange(16) // 4, torch.arange(16) % 4], -1
        )
        args = (
            img,
            img_ids,
            torch.randn(1, 8, 64, generator=g),
            torch.zeros(8, 3),
            torch.tensor([0.5]),
            torch.randn(1, 32, generator=g),
        )
        torch.testing.assert_close(compiled(*args), eager(*args), rtol=1e-4, atol=1e-5)
    assert compiled.counters.snapshot() == {
        "linear": {"onednn": n_linear},
        "attention": {"sdpa": n_blocks},
        "transformer_forwards": 1,
    }
