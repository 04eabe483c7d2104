"""(b) The transformer step alone: achieved GFLOP/s (FLOPs counted analytically, see flops.py) of
diffserve's native FLUX transformer and of diffusers' FluxTransformer2DModel on the same weights and
inputs, against this machine's measured matmul peak for the same dtype."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import interleaved, median, spread
from benchmarks.contenders import torch_dtype
from benchmarks.flops import tokens, transformer_flops
from benchmarks.matmul_peak import linear_gflops, peak_gflops
from benchmarks.section import Section, Unavailable
from benchmarks.settings import MAX_SEQUENCE_LENGTH, Settings


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.step_case
    path = models[case.model]
    cfg = json.loads((path / "transformer" / "config.json").read_text())
    ni, nt = tokens(case.size, case.size), MAX_SEQUENCE_LENGTH
    flops = transformer_flops(cfg, ni, nt, batch=1)
    d = int(cfg["num_attention_heads"]) * int(cfg["attention_head_dim"])
    section.notes.append(
        f"{case.model} at {case.size}x{case.size}: {ni} image + {nt} text tokens, hidden {d}; "
        f"{flops / 1e9:.2f} GFLOP per forward (batch 1), counted analytically from the config.")
    section.columns = ["dtype", "contender", "median ms/step", "spread ±", "runs", "GFLOP/s",
                       "% of matmul peak", "% of model-shape GEMM", "max |Δ| vs diffusers"]
    for dtype in settings.dtypes:
        peak = peak_gflops(dtype, settings.matmul_size)
        shape_ceiling = linear_gflops(dtype, ni + nt, d, 4 * d)
        section.add(dtype, f"matmul {peak['size']}² (peak: best of torch.mm, F.linear)", round(peak["median_s"] * 1e3, 2), "", "",
                    round(peak["gflops"], 1), "100%", "", "")
        section.add(dtype, f"F.linear [{ni + nt}x{d}]·[{d}x{4 * d}]", "", "", "", round(shape_ceiling, 1),
                    f"{shape_ceiling / peak['gflops']:.0%}", "100%", "")
        packed = _onednn_gflops(dtype, ni + nt, d, 4 * d)
        if packed is not None:
            section.add(dtype, f"oneDNN, packed weight [{ni + nt}x{d}]·[{d}x{4 * d}] (linear_backend onednn)", "",
                        "", "", round(packed, 1), f"{packed / peak['gflops']:.0%}", f"{packed / shape_ceiling:.0%}", "")
            section.metrics[f"step.{dtype}.shape_gemm_onednn_gflops"] = packed
        section.metrics[f"step.{dtype}.peak_gflops"] = peak["gflops"]
        section.metrics[f"step.{dtype}.peak_size"] = peak["size"]
        section.metrics[f"step.{dtype}.shape_gemm_gflops"] = shape_ceiling
        _contenders(section, settings, path, cfg, dtype, ni, nt, flops, peak["gflops"], shape_ceiling)


def _contenders(section: Section, settings: Settings, path: Path, cfg: dict[str, Any], dtype: str,
                ni: int, nt: int, flops: int, peak: float, shape_ceiling: float) -> None:
    import torch
    from diffusers import FluxTransformer2DModel

    dt = torch_dtype(dtype)
    ref = FluxTransformer2DModel.from_pretrained(str(path), subfolder="transformer", torch_dtype=dt).eval()
    native = _native_transformer(path, dtype)
    x = _inputs(cfg, ni, nt, dt)

    def run_ref() -> Any:
        with torch.inference_mode():
            return ref(hidden_states=x["img"], encoder_hidden_states=x["txt"], pooled_projections=x["y"],
                       timestep=x["t"], img_ids=x["img_ids"], txt_ids=x["txt_ids"],
                       guidance=x["guidance"], return_dict=False)[0]

    def run_native() -> Any:
        with torch.inference_mode():
            return native(x["img"], x["img_ids"], x["txt"], x["txt_ids"], x["t"], x["y"], guidance=x["guidance"])

    section.notes.append(f"{dtype}: diffserve's kernels (the resolved config's, as the engine builds them): "
                         f"{native.kernels.describe()}.")
    calls = {"diffusers": run_ref, "diffserve": run_native}
    samples, last = interleaved(calls, warmup=max(settings.warmup, 1), iters=settings.step_iters,
                                budget_s=settings.case_budget_s)
    for name, times in samples.items():
        seconds = median(times)
        gflops = flops / seconds / 1e9
        delta = "" if name == "diffusers" else f"{(last[name].float() - last['diffusers'].float()).abs().max():.2e}"
        section.add(dtype, name, round(seconds * 1e3, 2), f"{spread(times):.0%}", len(times), round(gflops, 1),
                    f"{gflops / peak:.0%}", f"{gflops / shape_ceiling:.0%}", delta)
        section.metrics[f"step.{dtype}.{name}.gflops"] = gflops
        section.metrics[f"step.{dtype}.{name}.frac_peak"] = gflops / peak
        section.metrics[f"step.{dtype}.{name}.frac_shape_gemm"] = gflops / shape_ceiling
    # The models are freed when this function returns (the closures go with ``calls``).


def _onednn_gflops(dtype_name: str, tokens: int, d_in: int, d_out: int, iters: int = 10) -> float | None:
    """GFLOP/s of the ``onednn`` linear backend's kernel (oneDNN inner product on a packed weight) at one of
    the model's shapes; ``None`` where that backend cannot run."""
    import time

    import torch

    from benchmarks.common import median
    from benchmarks.contenders import torch_dtype

    try:
        from diffserve.layers.linear.onednn import OneDnnLinearBackend
    except ImportError:
        return None
    dtype = torch_dtype(dtype_name)
    if OneDnnLinearBackend.unavailable_reason(torch.device("cpu"), dtype) is not None:
        return None
    backend = OneDnnLinearBackend(torch.device("cpu"), dtype)
    x = torch.randn(tokens, d_in).to(dtype)
    w = torch.randn(d_out, d_in).to(dtype)
    with torch.inference_mode():
        backend.linear(x, w, None)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            backend.linear(x, w, None)
            times.append(time.perf_counter() - t0)
    return 2 * tokens * d_in * d_out / median(times) / 1e9


def _native_transformer(path: Path, dtype: str) -> Any:
    """The transformer exactly as the engine builds it: the resolved config's backends, eager."""
    try:
        from diffserve.config.resolve import resolve
        from diffserve.models.flux.pipeline import FluxPipeline
    except ImportError as exc:
        raise Unavailable(f"native FLUX pipeline: {exc}") from exc
    stage = resolve(model=str(path), overrides={"dtype": dtype, "enforce_eager": True}).stage_for_role("diffusion")
    return FluxPipeline.from_stage(str(path), stage).transformer


def _inputs(cfg: dict[str, Any], ni: int, nt: int, dt: Any) -> dict[str, Any]:
    """Random activations of the right shapes; image ids laid out on the latent grid as FLUX does."""
    import torch

    g = torch.Generator().manual_seed(0)
    side = int(round(ni**0.5))
    img_ids = torch.zeros(side, side, 3)
    img_ids[..., 1] = torch.arange(side)[:, None]
    img_ids[..., 2] = torch.arange(side)[None, :]
    guidance = torch.full((1,), 3.5, dtype=dt) if cfg.get("guidance_embeds") else None
    return {
        "img": torch.randn(1, ni, int(cfg["in_channels"]), generator=g).to(dt),
        "txt": torch.randn(1, nt, int(cfg["joint_attention_dim"]), generator=g).to(dt),
        "y": torch.randn(1, int(cfg["pooled_projection_dim"]), generator=g).to(dt),
        "t": torch.full((1,), 0.5, dtype=dt),
        "img_ids": img_ids.reshape(ni, 3),
        "txt_ids": torch.zeros(nt, 3),
        "guidance": guidance,
    }
