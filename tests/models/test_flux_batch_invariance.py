"""Batch invariance by construction on the native FLUX path: the mechanism (no GEMM or
attention call's shape depends on the batch, and each prompt is encoded alone) and its
result (every image of a batch equals its request alone, bit for bit) in float32 and
bfloat16 at the widths of a real model (small-flux: K = 3072 in the MLP down-projection;
the transformer at 256x256, M = 256 image tokens), whatever this machine's kernels
happen to do."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from diffserve import Engine, GenerationRequest
from diffserve.config.stage_sections import AttentionBackendConfig
from diffserve.layers.kernels import build_kernel_set
from diffserve.models.base import library_admit
from diffserve.models.flux.params import FluxParams
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.models.flux.sampling import image_ids, text_ids
from diffserve.models.flux.transformer import FluxTransformer
from diffserve.registry.models import MODEL_FAMILIES

# Make test-kinds runs it under every emulated CPU kind.
pytestmark = pytest.mark.numerics
ROLES = MODEL_FAMILIES["FluxPipeline"].attention_roles
# small-flux's block geometry (hidden 768 = 12 x 64, MLP 3072), one block of each kind.
PARAMS = FluxParams(
    in_channels=64,
    out_channels=64,
    vec_in_dim=64,
    context_in_dim=64,
    hidden_size=768,
    mlp_ratio=4.0,
    num_heads=12,
    depth=1,
    depth_single_blocks=1,
    axes_dim=(16, 24, 24),
    theta=10_000,
    qkv_bias=True,
    guidance_embed=False,
)


class CallShapes:
    """A kernel observer recording the input shape of every backend call (linear: x;
    attention: q)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def on_select(self, kind: str, requested: str, backend: Any) -> Any:
        method = "linear" if kind == "linear" else "attention"
        inner = getattr(backend, method)

        def recorded(x: torch.Tensor, *args: Any) -> Any:
            self.calls.append((kind, tuple(x.shape)))
            return inner(x, *args)

        setattr(backend, method, recorded)
        return backend


def _transformer(
    dtype: torch.dtype, batch_invariant: bool, observer: CallShapes | None = None
) -> FluxTransformer:
    torch.manual_seed(0)
    kernels = build_kernel_set(
        "auto",
        AttentionBackendConfig(),
        roles=ROLES,
        device="cpu",
        dtype=dtype,
        observers=[observer] if observer else [],
        batch_invariant=batch_invariant,
    )
    return FluxTransformer(PARAMS, kernels).to(dtype).eval().requires_grad_(False)


def _inputs(
    batch: int, dtype: torch.dtype, side: int = 256, txt_len: int = 16
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return dict(
        img=torch.randn(batch, (side // 16) ** 2, 64, generator=g).to(dtype),
        img_ids=image_ids(side, side, device="cpu", dtype=dtype),
        txt=torch.randn(batch, txt_len, 64, generator=g).to(dtype),
        txt_ids=text_ids(txt_len, device="cpu", dtype=dtype),
        timesteps=torch.rand(batch, generator=g).to(dtype),
        y=torch.randn(batch, 64, generator=g).to(dtype),
    )


def _call_shapes(
    batch_invariant: bool, batch: int
) -> list[tuple[str, tuple[int, ...]]]:
    observer = CallShapes()
    model = _transformer(torch.float32, batch_invariant, observer)
    with torch.inference_mode():
        model(**_inputs(batch, torch.float32, side=64))
    return observer.calls


def _depends_on_batch(batch_invariant: bool) -> bool:
    """Whether any GEMM's M or attention call's batch changes between a batch of 3 and
    one image: the calls for 3 must be exactly the calls for 1, three times over."""
    one, three = _call_shapes(batch_invariant, 1), _call_shapes(batch_invariant, 3)
    return Counter(three) != Counter(
        {call: 3 * count for call, count in Counter(one).items()}
    )


def test_no_kernel_call_shape_depends_on_the_batch() -> None:
    calls = _call_shapes(True, 3)
    assert {kind for kind, _ in calls} == {"linear", "attention"}
    assert all(shape[0] == 1 for _, shape in calls), (
        "a backend call saw more than one sample"
    )
    assert not _depends_on_batch(True)
    # The check itself: with the mechanism off, the same model's calls do depend on the
    # batch.
    assert _depends_on_batch(False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_transformer_rows_equal_each_image_alone_at_real_shapes(
    dtype: torch.dtype,
) -> None:
    model = _transformer(dtype, batch_invariant=True)
    x = _inputs(3, dtype)
    pe = model.rope(x["txt_ids"], x["img_ids"])
    with torch.inference_mode():
        batched = model(x["img"], None, x["txt"], None, x["timesteps"], x["y"], pe=pe)
        for i in range(3):
            alone = model(
                x["img"][i : i + 1],
                None,
                x["txt"][i : i + 1],
                None,
                x["timesteps"][i : i + 1],
                x["y"][i : i + 1],
                pe=pe,
            )
            assert torch.equal(batched[i : i + 1], alone), (dtype, i)


def test_every_prompt_is_encoded_alone(tiny_flux_dir) -> None:
    pipe = FluxPipeline.from_pretrained(tiny_flux_dir)
    seen: list[int] = []
    for encoder in (pipe.encoders.clip, pipe.encoders.t5):
        encoder.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.append(args[0].shape[0]), with_kwargs=True
        )
    txt, vec = pipe.encoders.encode(["a red fox", "a blue house", "a green tree"], 32)
    assert txt.shape[0] == vec.shape[0] == 3 and seen == [1] * 6
    alone = pipe.encoders.encode(["a blue house"], 32)
    assert torch.equal(txt[1:2], alone[0]) and torch.equal(vec[1:2], alone[1])
    assert pipe.capabilities.batch_invariant


# bfloat16 compares latents: on a CPU without native bfloat16 (AVX2) the VAE's bfloat16
# convolutions run ~35x slower than float32 (a 256x256 decode 23 s against 0.6 s), and
# the decode is one image at a time by construction, its batch invariance checked in
# float32 here.
@pytest.mark.parametrize(
    ("dtype", "output_type"), [("float32", "pt"), ("bfloat16", "latent")]
)
def test_small_flux_batch_equals_each_request_alone(
    small_flux_dir, dtype: str, output_type: str
) -> None:
    # The engine, batching (max_batch_size 4) the model's real widths (M = 64 image
    # tokens at 128x128), in both dtypes a CPU defaults to.
    with Engine(str(small_flux_dir), dtype=dtype, max_batch_size=4, env={}) as engine:

        def request(**kw: Any) -> GenerationRequest:
            return GenerationRequest(
                **{
                    "prompt": "a red fox",
                    "height": 128,
                    "width": 128,
                    "num_inference_steps": 1,
                    "max_sequence_length": 16,
                    "output_type": output_type,
                    **kw,
                }
            )

        three = engine.generate(request(n=3, seed=7))
        assert (
            three.attestation["batch_invariant"] is True
            and three.attestation["dtype"] == dtype
        )
        assert three.attestation["batch_size"] == 1 and len(three.images) == 3
        for image, seed in zip(three.images, three.seeds, strict=True):
            assert torch.equal(image, engine.generate(request(seed=seed)).images[0]), (
                dtype,
                seed,
            )


def test_small_flux_batch_of_requests_equals_each_alone(small_flux_dir) -> None:
    # Several requests of one batch key, different prompts (each encoded alone), in
    # bfloat16.
    pipe = FluxPipeline.from_pretrained(small_flux_dir, dtype="bfloat16")
    batch = [
        GenerationRequest(
            prompt=p,
            height=128,
            width=128,
            num_inference_steps=1,
            max_sequence_length=16,
            seed=s,
            output_type="latent",
        )
        for p, s in (("a fox", 1), ("a house", 5))
    ]
    outputs = list(pipe.run([library_admit(pipe, r) for r in batch]))[-1].outputs
    for request, output in zip(batch, outputs, strict=True):
        assert torch.equal(output.images, pipe(request).images)
