"""``FluxPipeline``: encode prompts -> denoise (a generator of step events) -> decode, for a batch of requests."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from diffserve.engine.request import GenerationRequest
from diffserve.errors import ModelLoadError, RequestError
from diffserve.logging import get_logger
from diffserve.models.flux.encoders import TextEncoders
from diffserve.models.flux.outputs import BatchResult, ImageResult, StepEvent, to_pil
from diffserve.models.flux.sampling import (
    check_scheduler_config,
    euler_step,
    get_noise,
    get_schedule,
    image_ids,
    pack,
    text_ids,
    unpack,
)
from diffserve.models.flux.transformer import FluxTransformer, load_flux_transformer

logger = get_logger(__name__)

__all__ = ["BatchResult", "FluxPipeline", "ImageResult", "StepEvent", "to_pil"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"`` is float32 on CPU (fast and exact there) and bfloat16 on accelerators."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if name not in _DTYPES:
        raise ValueError(f"dtype={name!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


@dataclass
class _Group:
    """Images of a batch that share a text length and so run through the transformer together."""

    rows: list[int]  # positions in the batch's flat image list
    latents: Tensor
    txt: Tensor
    vec: Tensor
    pe: Tensor
    cfg_rows: Tensor | slice | None = None  # rows (within the group) that run true CFG
    neg_txt: Tensor | None = None
    neg_vec: Tensor | None = None
    cfg_scale: float | Tensor = 1.0


class FluxPipeline:
    """Native FLUX.1 text-to-image: diffusers-format model directory in, images (and step events) out."""

    def __init__(self, transformer: FluxTransformer, encoders: TextEncoders, vae: Any,
                 scheduler_config: Mapping[str, Any], *, device: torch.device, dtype: torch.dtype) -> None:
        check_scheduler_config(scheduler_config)
        self.transformer = transformer
        self.encoders = encoders
        self.vae = vae
        self.scheduler_config = dict(scheduler_config)
        self.device = device
        self.dtype = dtype
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
        self.latent_channels = transformer.params.in_channels // 4
        self.default_size = int(vae.config.sample_size)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, *, dtype: str | torch.dtype = "float32",
                        linear_backend: str = "auto", attention_backend: str | Mapping[str, str] | Any = "auto",
                        device: str | torch.device = "cpu", compile: bool = False,
                        stage: Any = None) -> FluxPipeline:
        """Load every component of ``model_dir``; the transformer's kernels are chosen here, once."""
        if stage is not None:
            return cls.from_stage(model_dir, stage, device=device)
        from diffusers import AutoencoderKL

        root = Path(model_dir)
        if not (root / "transformer").is_dir():
            raise ModelLoadError(f"{root} is not a FLUX model directory (no transformer/ folder)")
        device = torch.device(device)
        torch_dtype = resolve_dtype(dtype, device)
        start = time.perf_counter()
        transformer = load_flux_transformer(root / "transformer", dtype=torch_dtype, device=device,
                                            linear_backend=linear_backend, attention_backend=attention_backend)
        if compile:
            transformer.compile_blocks()
        encoders = TextEncoders(root, dtype=torch_dtype, device=device)
        try:
            vae = AutoencoderKL.from_pretrained(str(root / "vae"), torch_dtype=torch_dtype).to(device).eval()
            scheduler_config = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the VAE or scheduler config from {root}: {exc}") from exc
        logger.info("loaded %s (%s on %s) in %.1fs", root, torch_dtype, device, time.perf_counter() - start)
        return cls(transformer, encoders, vae, scheduler_config, device=device, dtype=torch_dtype)

    @classmethod
    def from_stage(cls, model_dir: str | Path, stage: Any, device: str | torch.device = "cpu") -> FluxPipeline:
        """Load with a resolved ``StageConfig`` (dtype, linear_backend, attention_backend, enforce_eager)."""
        return cls.from_pretrained(model_dir, dtype=stage.dtype, linear_backend=stage.linear_backend,
                                   attention_backend=stage.attention_backend, device=device,
                                   compile=not stage.enforce_eager)

    def __call__(self, request: GenerationRequest) -> ImageResult:
        """Run one request to completion."""
        for event in self.run([request]):
            if isinstance(event, BatchResult):
                return event.outputs[0]
        raise RuntimeError("pipeline run ended without a result")  # pragma: no cover

    def run(self, batch: list[GenerationRequest]) -> Iterator[StepEvent | BatchResult]:
        """Yield a ``StepEvent`` after every denoise step, then the ``BatchResult``. Close to cancel."""
        batch = [request.with_seed() for request in batch]
        height, width, steps, guidance_scale = self._check_batch(batch)
        counting = self.transformer.counters.paused if all(r.is_warmup for r in batch) else contextlib.nullcontext

        start = time.perf_counter()
        groups, sigmas, timesteps = self._prepare(batch, height, width)
        timings = {"encode": _ms_since(start)}

        start = time.perf_counter()
        for i in range(steps):
            with counting():
                for group in groups:
                    self._denoise_step(group, sigmas, timesteps, i, guidance_scale)
            yield StepEvent(step=i + 1, total_steps=steps)
        timings["denoise"] = _ms_since(start)

        start = time.perf_counter()
        latents = self._gather(groups, sum(r.n for r in batch))
        images = self._decode(batch, latents, height, width)
        timings["decode"] = _ms_since(start)
        yield BatchResult([
            ImageResult(request_id=r.request_id, images=img, seeds=r.seeds, timings_ms=dict(timings),
                        output_type=r.output_type)
            for r, img in zip(batch, images, strict=True)
        ])

    def _check_batch(self, batch: list[GenerationRequest]) -> tuple[int, int, int, float]:
        if not batch:
            raise ValueError("run() needs at least one request")
        shapes = set()
        multiple = 2 * self.vae_scale_factor
        for request in batch:
            request.validate()
            height, width = request.height or self.default_size, request.width or self.default_size
            for name, value in (("height", height), ("width", width)):
                if value % multiple:
                    raise RequestError(f"{name}={value} must be a multiple of {multiple} for this model "
                                       f"(e.g. {max(multiple, value // multiple * multiple)})", param=name)
            shapes.add((height, width, request.num_inference_steps, request.guidance_scale))
        # The scheduler batches only requests that share these; anything else is a caller bug.
        if len(shapes) != 1:
            raise ValueError(f"a batch must share height, width, steps and guidance_scale; got {sorted(shapes)}")
        return shapes.pop()

    @torch.inference_mode()
    def _prepare(self, batch: list[GenerationRequest], height: int, width: int) -> tuple[list[_Group], Tensor, Tensor]:
        img_ids = image_ids(height, width, device=self.device, dtype=self.dtype)
        sigmas, timesteps = get_schedule(batch[0].num_inference_steps, img_ids.shape[0], self.scheduler_config)
        offsets = [sum(r.n for r in batch[:i]) for i in range(len(batch))]
        groups = []
        for length in sorted({r.max_sequence_length for r in batch}):
            members = [i for i, r in enumerate(batch) if r.max_sequence_length == length]
            requests = [batch[i] for i in members]
            repeats = torch.tensor([r.n for r in requests], device=self.device)
            txt, vec = self.encoders.encode([r.prompt for r in requests], length)
            seeds = [s for r in requests for s in r.seeds]
            noise = get_noise(seeds, self.latent_channels, height, width, dtype=self.dtype, device=self.device)
            group = _Group(
                rows=[offsets[i] + j for i in members for j in range(batch[i].n)],
                latents=pack(noise),
                txt=txt.repeat_interleave(repeats, dim=0),
                vec=vec.repeat_interleave(repeats, dim=0),
                pe=self.transformer.rope(text_ids(length, device=self.device, dtype=self.dtype), img_ids),
            )
            self._prepare_cfg(group, requests, length)
            groups.append(group)
        return groups, sigmas.to(self.device), timesteps.to(self.device)

    def _prepare_cfg(self, group: _Group, requests: list[GenerationRequest], length: int) -> None:
        """True CFG (a second, negative-prompt forward) for the requests with true_cfg_scale > 1."""
        wants = [r.true_cfg_scale > 1 and r.negative_prompt is not None for r in requests]
        if not any(wants):
            return
        cfg = [r for r, want in zip(requests, wants, strict=True) if want]
        neg_txt, neg_vec = self.encoders.encode([r.negative_prompt for r in cfg], length)
        repeats = torch.tensor([r.n for r in cfg], device=self.device)
        group.neg_txt = neg_txt.repeat_interleave(repeats, dim=0)
        group.neg_vec = neg_vec.repeat_interleave(repeats, dim=0)
        flags = [want for r, want in zip(requests, wants, strict=True) for _ in range(r.n)]
        group.cfg_rows = slice(None) if all(flags) else torch.tensor(flags, device=self.device).nonzero()[:, 0]
        scales = {r.true_cfg_scale for r in cfg}
        group.cfg_scale = scales.pop() if len(scales) == 1 else torch.tensor(
            [r.true_cfg_scale for r in cfg for _ in range(r.n)], device=self.device)[:, None, None]

    @torch.inference_mode()
    def _denoise_step(self, group: _Group, sigmas: Tensor, timesteps: Tensor, i: int, guidance_scale: float) -> None:
        x = group.latents
        # As diffusers: the timestep (sigma * 1000) goes to the model dtype, then back to [0, 1].
        t = timesteps[i].expand(x.shape[0]).to(x.dtype) / 1000
        guidance = None
        if self.transformer.params.guidance_embed:
            guidance = torch.full((x.shape[0],), guidance_scale, device=self.device, dtype=torch.float32)
        pred = self.transformer(x, None, group.txt, None, t, group.vec, guidance, pe=group.pe)
        if group.cfg_rows is not None:
            rows = group.cfg_rows
            x_cfg, t_cfg = x[rows], t[rows]
            g_cfg = guidance[rows] if guidance is not None else None
            neg = self.transformer(x_cfg, None, group.neg_txt, None, t_cfg, group.neg_vec, g_cfg, pe=group.pe)
            pred[rows] = neg + group.cfg_scale * (pred[rows] - neg)
        group.latents = euler_step(x, pred, sigmas[i], sigmas[i + 1])

    @staticmethod
    def _gather(groups: list[_Group], total: int) -> Tensor:
        if len(groups) == 1:
            return groups[0].latents
        first = groups[0].latents
        latents = first.new_empty((total, *first.shape[1:]))
        for group in groups:
            latents[torch.tensor(group.rows, device=latents.device)] = group.latents
        return latents

    @torch.inference_mode()
    def _decode(self, batch: list[GenerationRequest], latents: Tensor, height: int, width: int) -> list[Tensor]:
        """Per request: uint8 [n, H, W, 3] ("pil"), float [n, 3, H, W] in [0, 1] ("pt") or packed latents."""
        per_request = list(latents.split([r.n for r in batch]))
        decode = [i for i, r in enumerate(batch) if r.output_type != "latent"]
        if decode:
            x = unpack(torch.cat([per_request[i] for i in decode]), height, width)
            x = x / self.vae.config.scaling_factor + self.vae.config.shift_factor
            # One image at a time: batched convolutions differ in the last bit from single ones, and
            # image i of a request must equal the single-image request with its seed.
            pixels = torch.cat([self.vae.decode(z, return_dict=False)[0] for z in x.split(1)])
            pixels = (pixels * 0.5 + 0.5).clamp(0, 1)
            decoded = pixels.split([batch[i].n for i in decode])
            for i, images in zip(decode, decoded, strict=True):
                if batch[i].output_type == "pt":
                    per_request[i] = images.float()
                else:
                    per_request[i] = (images.permute(0, 2, 3, 1).float() * 255).round().to(torch.uint8)
        return [images.cpu() for images in per_request]


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
