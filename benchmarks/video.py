"""(o) Video: diffserve's native Wan against ``diffusers.WanPipeline`` on the very same
directory, prompt and seed (text-to-video with CFG at Wan's 5.0), per frame count and
dtype: seconds per video, the ratio, the PSNR over all frames; the transformer step's
fraction of this machine's matmul peak; and CFG-parallel on 2 ranks (mp) against one
rank in full runs."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import interleaved, median, spread
from benchmarks.contenders import shutdown, torch_dtype
from benchmarks.section import Section
from benchmarks.settings import PROMPT, SEED, Case, Settings

GUIDANCE = 5.0  # Wan's pipeline default: real CFG, two forwards per step
NEGATIVE = "blurry, low quality"
TEXT_TOKENS = 64


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    section.columns = [
        "case",
        "frames",
        "dtype",
        "contender",
        "median s/video",
        "spread ±",
        "runs",
        "ratio vs diffusers",
        "PSNR vs diffusers (dB)",
    ]
    case = settings.video_case
    path = _ensure(case.model, models)
    for frames in settings.video_frames:
        for dtype in settings.dtypes:
            _versus_diffusers(section, settings, path, case, frames, dtype)
    _step_fraction(section, settings, path, case, max(settings.video_frames))
    # Two worker processes on a 2-core machine: a full run's measurement.
    if not settings.smoke:
        _cfg_parallel(section, settings, path, case, max(settings.video_frames))


def _ensure(kind: str, models: dict[str, Path]) -> Path:
    """Wan models are built beside the FLUX ones (same cache directory, same
    deterministic builders)."""
    from diffserve.zoo.components import MARKER_FILE
    from diffserve.zoo.wan import build_wan_model

    out = next(iter(models.values())).parent / kind
    if not (out / MARKER_FILE).is_file():
        build_wan_model(kind, out, seed=0, force=out.exists())
    return out


def _request(case: Case, frames: int) -> Any:
    from diffserve import GenerationRequest

    return GenerationRequest(
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        height=case.size,
        width=case.size,
        num_frames=frames,
        num_inference_steps=case.steps,
        guidance_scale=GUIDANCE,
        seed=SEED,
        max_sequence_length=TEXT_TOKENS,
    )


def _versus_diffusers(
    section: Section,
    settings: Settings,
    path: Path,
    case: Case,
    frames: int,
    dtype: str,
) -> None:
    import diffusers
    import torch

    from diffserve import Engine

    pipe = diffusers.WanPipeline.from_pretrained(
        str(path), torch_dtype=torch_dtype(dtype)
    )
    pipe.set_progress_bar_config(disable=True)
    engine = Engine(
        str(path),
        dtype=dtype,
        enforce_eager=True,
        distributed_executor_backend="uni",
        env={},
    )

    def diffusers_call() -> Any:
        with torch.inference_mode():
            out = pipe(
                prompt=PROMPT,
                negative_prompt=NEGATIVE,
                height=case.size,
                width=case.size,
                num_frames=frames,
                num_inference_steps=case.steps,
                guidance_scale=GUIDANCE,
                max_sequence_length=TEXT_TOKENS,
                generator=torch.Generator().manual_seed(SEED),
                output_type="np",
            ).frames[0]
        return (
            (torch.from_numpy(out) * 255).round().clamp(0, 255).to(torch.uint8).numpy()
        )

    def engine_call() -> Any:
        return engine.generate(_request(case, frames)).videos[0]

    try:
        samples, last = interleaved(
            {"diffusers": diffusers_call, "diffserve eager": engine_call},
            warmup=settings.warmup,
            iters=settings.iters,
            budget_s=settings.case_budget_s,
        )
    finally:
        shutdown(engine)
    base = median(samples["diffusers"])
    key = f"video.{case.model}.{case.size}.{frames}.{dtype}"
    for name, times in samples.items():
        quality = None if name == "diffusers" else _psnr(last[name], last["diffusers"])
        section.add(
            case.label,
            frames,
            dtype,
            name,
            round(median(times), 3),
            f"{spread(times):.0%}",
            len(times),
            round(median(times) / base, 3),
            ""
            if quality is None
            else ("identical" if quality == float("inf") else round(quality, 1)),
        )
        if name != "diffusers":
            section.metrics[f"{key}.ratio"] = median(times) / base
            section.metrics[f"{key}.psnr_db"] = quality
    del samples, last
    gc.collect()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def wan_forward_flops(params: Any, tokens: int, text_tokens: int) -> int:
    """Multiply-adds x 2 of one transformer forward: every block's projections, its
    self-attention over the video tokens and cross-attention to the text, the
    feed-forward; the embedders and head are counted too."""
    dim, ffn = params.dim, params.ffn_dim
    per_block = (
        2 * tokens * dim * dim * 4  # self-attention q, k, v, out
        + 2 * tokens * dim * dim * 2
        + 2 * text_tokens * dim * dim * 2  # cross q, out; k, v of the text
        + 2 * tokens * dim * ffn * 2  # feed-forward
        + 4 * tokens * tokens * dim
        + 4 * tokens * text_tokens * dim
    )  # the two attentions' QK^T and PV
    patch = params.patch_size[0] * params.patch_size[1] * params.patch_size[2]
    head = 2 * tokens * dim * params.out_channels * patch
    embed = 2 * tokens * params.in_channels * patch * dim + 2 * text_tokens * (
        params.text_dim * dim + dim * dim
    )
    return params.num_layers * per_block + head + embed


def _step_fraction(
    section: Section, settings: Settings, path: Path, case: Case, frames: int
) -> None:
    """One transformer forward alone (float32, the torch kernels' best backend: onednn)
    against the float32 matmul peak of this machine."""
    import torch

    from benchmarks.matmul_peak import peak_gflops
    from diffserve.config.stage_sections import AttentionBackendConfig
    from diffserve.layers.kernels import build_kernel_set
    from diffserve.models.wan.transformer import load_wan_transformer

    kernels = build_kernel_set(
        "onednn",
        AttentionBackendConfig(),
        roles=("self_attention", "cross_attention"),
        device="cpu",
        dtype=torch.float32,
        batch_invariant=False,
    )
    model = load_wan_transformer(path / "transformer", kernels)
    params = model.params
    latent = (params.in_channels, (frames - 1) // 4 + 1, case.size // 8, case.size // 8)
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, *latent, generator=generator)
    text = torch.randn(1, TEXT_TOKENS, params.text_dim, generator=generator)
    timestep = torch.tensor([500])
    rope = model.rope(latents)

    def step() -> Any:
        with torch.inference_mode():
            return model(latents, timestep, text, rope)

    samples, _ = interleaved(
        {"step": step}, warmup=settings.warmup, iters=settings.step_iters
    )
    tokens = (
        latent[1]
        * (latent[2] // params.patch_size[1])
        * (latent[3] // params.patch_size[2])
    )
    achieved = (
        wan_forward_flops(params, tokens, TEXT_TOKENS) / median(samples["step"]) / 1e9
    )
    peak = peak_gflops("float32", settings.matmul_size)
    fraction = achieved / peak["gflops"]
    section.notes.append(
        f"transformer step ({case.model}, {frames} frames at "
        f"{case.size}x{case.size}: {tokens} video "
        f"tokens, float32, onednn): {median(samples['step']) * 1000:.1f} "
        f"ms, {achieved:.0f} GFLOP/s "
        f"= {fraction:.0%} of the float32 matmul peak {peak['gflops']:.0f} GFLOP/s "
        f"({peak['backend']} at {peak['size']}²)"
    )
    section.metrics[f"video.{case.model}.step_fraction"] = fraction
    gc.collect()


def _cfg_parallel(
    section: Section, settings: Settings, path: Path, case: Case, frames: int
) -> None:
    from diffserve import Engine

    dtype = settings.dtypes[0]
    engines = {
        "1 rank (uni)": Engine(str(path), dtype=dtype, enforce_eager=True, env={}),
        "CFG-parallel 2 ranks (mp)": Engine(
            str(path),
            dtype=dtype,
            enforce_eager=True,
            env={},
            distributed_executor_backend="mp",
            cfg_parallel_size=2,
        ),
    }
    try:
        calls = {
            name: (
                lambda engine=engine: engine.generate(_request(case, frames)).videos[0]
            )
            for name, engine in engines.items()
        }
        samples, _ = interleaved(
            calls, warmup=1, iters=settings.iters, budget_s=settings.case_budget_s
        )
    finally:
        for engine in engines.values():
            shutdown(engine)
    one = median(samples["1 rank (uni)"])
    for name, times in samples.items():
        section.add(
            case.label,
            frames,
            dtype,
            name,
            round(median(times), 3),
            f"{spread(times):.0%}",
            len(times),
            "",
            "",
        )
    two = median(samples["CFG-parallel 2 ranks (mp)"])
    section.metrics[f"video.{case.model}.cfg_parallel_speedup"] = one / two
    section.notes.append(
        f"CFG-parallel: 2 ranks {two:.2f} s vs 1 rank {one:.2f} "
        f"s per video ({one / two:.2f}x); "
        f"{time.strftime('%Y-%m-%d')}"
    )
