"""A third native family written as hooks of the shared runner only (``models/runner``):
no loop, no CFG, cache, join, LoRA or result code of its own. Pixel-space flow matching
over 4x4 patches with a three-block attention denoiser, every Linear and attention call
on the stage's kernels; its registry entry is the only other thing it declares.
``RegisterFamily`` is the worker extension that registers it in each worker process (the
server registers it with ``register_family`` before the engine resolves the model)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from diffserve.config.schema import StageConfig
from diffserve.layers.kernels import KernelSet
from diffserve.models.base import BuildContext, PipelineCapabilities
from diffserve.models.loader import load_strict, read_safetensors
from diffserve.models.runner import Decoded, LiveRows, NativeRunner, Prepared
from diffserve.models.stage_kernels import stage_kernels
from diffserve.models.stepcache.policy import BranchCache
from diffserve.registry.family import FamilyDefaults, Features, ModelFamily, Parallelism
from diffserve.registry.models import register_family
from diffserve.types.batching import BatchPlan, plan_of
from diffserve.types.request import GenerationRequest

PATCH, DIM, HEADS, BLOCKS, TEXT = 4, 32, 2, 3, 16
CHANNELS = 3 * PATCH * PATCH
FAMILY = ModelFamily(
    "ToyNativePipeline",
    "toy_native_family:ToyNativePipeline",
    "single",
    ("self_attention",),
    defaults=FamilyDefaults(steps=4, guidance_scale=3.0, max_sequence_length=TEXT),
    parallel=Parallelism(max_world_size=2, dims=("cfg_parallel_size",)),
    features=Features(step_caches=("fbcache",)),
)


class ToyDenoiser(nn.Module):
    def __init__(self, kernels: KernelSet) -> None:
        super().__init__()
        self.counters = kernels.counters
        self.patch_in, self.text_in = (
            kernels.make_linear(CHANNELS, DIM),
            kernels.make_linear(TEXT, DIM),
        )
        self.qkv = nn.ModuleList(
            kernels.make_linear(DIM, 3 * DIM) for _ in range(BLOCKS)
        )
        self.proj = nn.ModuleList(kernels.make_linear(DIM, DIM) for _ in range(BLOCKS))
        self.attn = nn.ModuleList(
            kernels.make_attention("self_attention") for _ in range(BLOCKS)
        )
        self.patch_out = kernels.make_linear(DIM, CHANNELS)

    def embed(self, x: Tensor, text: Tensor, t: Tensor) -> Tensor:
        freqs = torch.arange(DIM // 2, dtype=torch.float32, device=x.device)
        angle = (
            t.float()[:, None] * torch.exp(-math.log(1000.0) * freqs / (DIM // 2))[None]
        )
        time = torch.cat([angle.sin(), angle.cos()], dim=-1).to(x.dtype)
        return self.patch_in(x) + (self.text_in(text) + time)[:, None]

    def block(self, i: int, h: Tensor) -> Tensor:
        q, k, v = self.qkv[i](h).unflatten(2, (3, HEADS, -1)).permute(2, 0, 3, 1, 4)
        return h + self.proj[i](self.attn[i](q, k, v).type_as(h))

    def blocks(self, h: Tensor, start: int = 0) -> Tensor:
        for i in range(start, BLOCKS):
            h = self.block(i, h)
        return h


class ToyNativePipeline(NativeRunner):
    def __init__(
        self,
        model: ToyDenoiser,
        stage: StageConfig,
        context: BuildContext,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.parallel, self.cache, self.weights = context.parallel, stage.cache, {}
        self.capabilities = PipelineCapabilities(
            family=FAMILY.class_name,
            default_size=32,
            size_multiple=PATCH,
            max_sequence_length=TEXT,
            true_cfg=False,
            attention_roles=FAMILY.attention_roles,
            step_batching=context.parallel.world_size == 1,
            batch_invariant=stage.batch_invariant,
            default_cache_threshold=stage.cache.request_threshold,
        )

    @classmethod
    def from_stage(
        cls,
        model_dir: str | Path,
        stage: StageConfig,
        context: BuildContext = BuildContext(),
    ) -> ToyNativePipeline:
        device, dtype, kernels = stage_kernels(stage, context, FAMILY.attention_roles)
        model = ToyDenoiser(kernels)
        load_strict(
            model,
            read_safetensors(Path(model_dir) / "transformer"),
            dtype=dtype,
            device=device,
        )
        return cls(model, stage, context, device, dtype)

    @property
    def kernel_counters(self) -> Any:
        return self.model.counters

    def plan(self, request: GenerationRequest) -> BatchPlan:
        return plan_of(request)

    def cfg_scale(self, request: GenerationRequest) -> float | None:
        return (
            float(request.guidance_scale)
            if (request.guidance_scale or 0.0) > 1.0
            else None
        )

    def encode(
        self, requests: list[GenerationRequest], plan: BatchPlan, *, negative: bool
    ) -> Tensor:
        texts = [
            (r.negative_prompt or "") if negative else r.prompt
            for r in requests
            for _ in range(r.n)
        ]
        codes = [
            [b / 255.0 for b in text.encode()[:TEXT].ljust(TEXT, b"\0")]
            for text in texts
        ]
        return torch.tensor(codes, dtype=self.dtype, device=self.device)

    def prepare(self, requests: list[GenerationRequest], plan: BatchPlan) -> Prepared:
        tokens = (plan.height // PATCH) * (plan.width // PATCH)
        noise = [
            torch.randn(tokens, CHANNELS, generator=torch.Generator().manual_seed(seed))
            for r in requests
            for seed in r.seeds
        ]
        return Prepared(torch.stack(noise).to(self.device, self.dtype))

    def schedule(self, request: GenerationRequest, plan: BatchPlan) -> EulerSchedule:
        assert request.num_inference_steps is not None  # admitted
        return EulerSchedule(request.num_inference_steps)

    def velocity(
        self, latents: Tensor, text: Tensor, rows: LiveRows, cache: BranchCache | None
    ) -> Tensor:
        t = rows.per_row(lambda member, step: member.schedule.sigmas[step])
        t = t.to(self.device)
        h = self.model.embed(latents, text, t)
        if cache is None:
            self.model.counters.count_forward()
            return self.model.patch_out(self.model.blocks(h))
        # First-Block Cache: block 0's residual is the probe.
        base = self.model.block(0, h)
        compute = cache.decide(rows.steps, base - h)
        if any(compute):
            self.model.counters.count_forward()
        return self.model.patch_out(
            cache.apply(
                compute,
                base,
                lambda r: self.model.blocks(base if r is None else base[r], start=1),
            )
        )

    def decode(
        self, latents: Tensor, requests: list[GenerationRequest], plan: BatchPlan
    ) -> Decoded:
        grid = latents.float().unflatten(1, (plan.height // PATCH, plan.width // PATCH))
        pixels = (
            grid.unflatten(3, (PATCH, PATCH, 3))
            .permute(0, 1, 3, 2, 4, 5)
            .flatten(1, 2)
            .flatten(2, 3)
        )
        images = ((pixels.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return Decoded(
            [part.contiguous() for part in images.split([r.n for r in requests])]
        )


class EulerSchedule:
    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.sigmas = torch.linspace(1.0, 0.0, steps + 1)

    def begin(self, step: int) -> bool:
        return False

    def step(self, latents: Tensor, velocity: Tensor, step: int) -> Tensor:
        delta = (self.sigmas[step + 1] - self.sigmas[step]).to(latents.device)
        return (latents.float() + delta * velocity.float()).to(latents.dtype)


class RegisterFamily:
    """``worker_extension_cls``: the family in the worker's registry before the worker
    builds its pipeline."""

    def before_load(self, worker: Any) -> None:
        register_family(FAMILY)

    def after_load(self, worker: Any) -> None:
        pass


def build_toy_native(root: Path, seed: int = 0) -> Path:
    """A model directory of the family: ``model_index.json`` and the denoiser's random
    weights."""
    (root / "transformer").mkdir(parents=True, exist_ok=True)
    (root / "model_index.json").write_text(
        json.dumps({"_class_name": FAMILY.class_name})
    )
    from diffserve.config.stage_sections import AttentionBackendConfig
    from diffserve.layers.kernels import build_kernel_set

    torch.manual_seed(seed)
    kernels = build_kernel_set(
        "torch",
        AttentionBackendConfig(),
        roles=FAMILY.attention_roles,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    # Weights of std 0.5 / sqrt(fan in): a velocity of order 1, so consecutive steps'
    # residuals stay close (a step cache has something to skip).
    state = {
        k: (torch.randn_like(v) * 0.5 / math.sqrt(v.shape[-1])).contiguous()
        for k, v in ToyDenoiser(kernels).state_dict().items()
    }
    save_file(state, str(root / "transformer" / "diffusion_pytorch_model.safetensors"))
    return root
