"""(b) The transformer step alone: achieved GFLOP/s (FLOPs counted analytically, see
flops.py) of diffserve's native FLUX transformer and of diffusers'
FluxTransformer2DModel on the same weights and inputs, against this machine's measured
matmul peak for the same dtype (the best over sizes and GEMM backends, matmul_peak.py).
Also what batch invariance costs: the native transformer on a batch of 3 images with
per-sample kernel calls (``batch_invariant: true``, the default) against whole-batch
calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import interleaved, median, spread
from benchmarks.contenders import torch_dtype
from benchmarks.flops import tokens, transformer_flops
from benchmarks.matmul_peak import linear_gflops, peak_gflops
from benchmarks.section import Section
from benchmarks.settings import MAX_SEQUENCE_LENGTH, Settings


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.step_case
    path = models[case.model]
    cfg = json.loads((path / "transformer" / "config.json").read_text())
    ni, nt = tokens(case.size, case.size), MAX_SEQUENCE_LENGTH
    flops = transformer_flops(cfg, ni, nt, batch=1)
    d = int(cfg["num_attention_heads"]) * int(cfg["attention_head_dim"])
    section.notes.append(
        f"{case.model} at {case.size}x{case.size}: {ni} image "
        f"+ {nt} text tokens, hidden {d}; "
        f"{flops / 1e9:.2f} GFLOP per forward (batch 1), counted "
        "analytically from the config."
    )
    section.columns = [
        "dtype",
        "contender",
        "median ms/step",
        "spread ±",
        "runs",
        "GFLOP/s",
        "% of matmul peak",
        "% of model-shape GEMM",
        "max |Δ| vs diffusers",
    ]
    for dtype in settings.dtypes:
        square = peak_gflops(dtype, settings.matmul_size)
        section.notes.append(
            f"{dtype} matmul peak: the best median over "
            + ", ".join(f"{name} {n}² {g:.0f}" for n, name, g in square["tried"])
            + " GFLOP/s, and the model-shape GEMMs below."
        )
        shape = f"[{ni + nt}x{d}]·[{d}x{4 * d}]"
        shape_ceiling = linear_gflops(dtype, ni + nt, d, 4 * d)
        packed = _onednn_gflops(dtype, ni + nt, d, 4 * d)
        # The peak is the best GEMM seen: a model-shape GEMM that beats every square
        # sets it (a fraction of a "peak" that one of the model's own GEMMs exceeds
        # would mean nothing).
        best = {
            "gflops": square["gflops"],
            "label": f"{square['size']}² {square['backend']}",
        }
        for label, gflops in (
            (f"{shape} F.linear", shape_ceiling),
            (f"{shape} oneDNN packed", packed),
        ):
            if gflops is not None and gflops > best["gflops"]:
                best = {"gflops": gflops, "label": label}
        section.add(
            dtype,
            f"matmul {square['size']}² {square['backend']} (best square)",
            round(square["median_s"] * 1e3, 2),
            "",
            "",
            round(square["gflops"], 1),
            f"{square['gflops'] / best['gflops']:.0%}",
            "",
            "",
        )
        section.add(
            dtype,
            f"F.linear {shape}",
            "",
            "",
            "",
            round(shape_ceiling, 1),
            f"{shape_ceiling / best['gflops']:.0%}",
            "100%",
            "",
        )
        if packed is not None:
            section.add(
                dtype,
                f"oneDNN, packed weight {shape} (linear_backend onednn)",
                "",
                "",
                "",
                round(packed, 1),
                f"{packed / best['gflops']:.0%}",
                f"{packed / shape_ceiling:.0%}",
                "",
            )
            section.metrics[f"step.{dtype}.shape_gemm_onednn_gflops"] = packed
        section.notes.append(
            f"{dtype} peak: {best['gflops']:.0f} GFLOP/s ({best['label']})."
        )
        section.metrics[f"step.{dtype}.peak_gflops"] = best["gflops"]
        section.metrics[f"step.{dtype}.peak_size"] = square["size"]
        section.metrics[f"step.{dtype}.peak_backend"] = best["label"]
        section.metrics[f"step.{dtype}.shape_gemm_gflops"] = shape_ceiling
        peak = float(best["gflops"])
        _contenders(
            section, settings, path, cfg, dtype, ni, nt, flops, peak, shape_ceiling
        )
        _batch_invariance_cost(section, settings, path, cfg, dtype, ni, nt, flops, peak)
        _attention(
            section,
            settings,
            dtype,
            int(cfg["num_attention_heads"]),
            ni + nt,
            int(cfg["attention_head_dim"]),
            peak,
        )


def _contenders(
    section: Section,
    settings: Settings,
    path: Path,
    cfg: dict[str, Any],
    dtype: str,
    ni: int,
    nt: int,
    flops: int,
    peak: float,
    shape_ceiling: float,
) -> None:
    import torch
    from diffusers import FluxTransformer2DModel

    dt = torch_dtype(dtype)
    ref = FluxTransformer2DModel.from_pretrained(
        str(path), subfolder="transformer", torch_dtype=dt
    ).eval()
    native = _native_transformer(path, dtype)
    x = _inputs(cfg, ni, nt, dt)

    def run_ref() -> Any:
        with torch.inference_mode():
            return ref(
                hidden_states=x["img"],
                encoder_hidden_states=x["txt"],
                pooled_projections=x["y"],
                timestep=x["t"],
                img_ids=x["img_ids"],
                txt_ids=x["txt_ids"],
                guidance=x["guidance"],
                return_dict=False,
            )[0]

    def run_native() -> Any:
        with torch.inference_mode():
            return native(
                x["img"],
                x["img_ids"],
                x["txt"],
                x["txt_ids"],
                x["t"],
                x["y"],
                guidance=x["guidance"],
            )

    section.notes.append(
        f"{dtype}: diffserve's kernels (the resolved config's, "
        "as the engine builds them): "
        f"{native.kernels.describe()}."
    )
    calls = {"diffusers": run_ref, "diffserve": run_native}
    samples, last = interleaved(
        calls,
        warmup=max(settings.warmup, 1),
        iters=settings.step_iters,
        budget_s=settings.case_budget_s,
    )
    for name, times in samples.items():
        seconds = median(times)
        gflops = flops / seconds / 1e9
        delta = (
            ""
            if name == "diffusers"
            else f"{(last[name].float() - last['diffusers'].float()).abs().max():.2e}"
        )
        section.add(
            dtype,
            name,
            round(seconds * 1e3, 2),
            f"{spread(times):.0%}",
            len(times),
            round(gflops, 1),
            f"{gflops / peak:.0%}",
            f"{gflops / shape_ceiling:.0%}",
            delta,
        )
        section.metrics[f"step.{dtype}.{name}.gflops"] = gflops
        section.metrics[f"step.{dtype}.{name}.frac_peak"] = gflops / peak
        section.metrics[f"step.{dtype}.{name}.frac_shape_gemm"] = gflops / shape_ceiling
    # The models are freed when this function returns (the closures go with ``calls``).


def _batch_invariance_cost(
    section: Section,
    settings: Settings,
    path: Path,
    cfg: dict[str, Any],
    dtype: str,
    ni: int,
    nt: int,
    flops: int,
    peak: float,
    batch: int = 3,
) -> None:
    """The native transformer on ``batch`` images: per-sample kernel calls (batch
    invariance by construction) against whole-batch calls, interleaved; ms per image and
    the ratio."""
    import torch

    dt = torch_dtype(dtype)
    models = {
        "per-sample (batch_invariant)": _native_transformer(
            path, dtype, batch_invariant=True
        ),
        "whole batch (batch_invariant: false)": _native_transformer(
            path, dtype, batch_invariant=False
        ),
    }
    x = {
        k: (
            v.expand(batch, *v.shape[1:]).contiguous()
            if k in ("img", "txt", "y", "t")
            else v
        )
        for k, v in _inputs(cfg, ni, nt, dt).items()
    }
    guidance = (
        None if x["guidance"] is None else x["guidance"].expand(batch).contiguous()
    )

    def call(model: Any) -> Any:
        def run() -> Any:
            with torch.inference_mode():
                return model(
                    x["img"],
                    x["img_ids"],
                    x["txt"],
                    x["txt_ids"],
                    x["t"],
                    x["y"],
                    guidance=guidance,
                )

        return run

    samples, _ = interleaved(
        {name: call(model) for name, model in models.items()},
        warmup=1,
        iters=settings.step_iters,
        budget_s=settings.case_budget_s,
    )
    per_image = {name: median(times) / batch for name, times in samples.items()}
    for name, times in samples.items():
        gflops = flops / per_image[name] / 1e9
        section.add(
            dtype,
            f"diffserve, batch of {batch}: {name} (per image)",
            round(per_image[name] * 1e3, 2),
            f"{spread(times):.0%}",
            len(times),
            round(gflops, 1),
            f"{gflops / peak:.0%}",
            "",
            "",
        )
    ratio = (
        per_image["per-sample (batch_invariant)"]
        / per_image["whole batch (batch_invariant: false)"]
    )
    section.metrics[f"step.{dtype}.batch{batch}.per_sample_vs_whole"] = ratio
    section.notes.append(
        f"{dtype}: a batch of {batch} with per-sample calls "
        f"costs {ratio:.3f}x the whole-batch "
        "calls per image (what batch invariance by construction costs on this CPU)."
    )


def _attention(
    section: Section,
    settings: Settings,
    dtype: str,
    heads: int,
    length: int,
    head_dim: int,
    peak: float,
) -> None:
    """One attention call at the step's shape on each CPU attention backend: speed, and
    error against a float64 reference (``sdpa`` is torch's flash kernel, whose two GEMMs
    accumulate in float32 (on AMX through oneDNN's brgemm); ``math`` rounds the scores
    to the dtype before a float32 softmax)."""
    import time

    import torch

    from diffserve.layers.attention.registry import select_attention_backend

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, head_dim, generator=g) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double()
    )
    ref = ref.transpose(1, 2).flatten(2)
    attention_flops = 4 * heads * length * length * head_dim
    for name in ("sdpa", "math"):
        backend = select_attention_backend(name, "cpu", torch_dtype(dtype))
        x = [t.to(torch_dtype(dtype)) for t in (q, k, v)]
        with torch.inference_mode():
            out = backend.attention(*x)
            times = []
            for _ in range(max(settings.step_iters, 3) * 3):
                t0 = time.perf_counter()
                backend.attention(*x)
                times.append(time.perf_counter() - t0)
        error = ((out.double() - ref).norm() / ref.norm()).item()
        seconds = median(times)
        gflops = attention_flops / seconds / 1e9
        section.add(
            dtype,
            f"attention [{heads}x{length}x{head_dim}] backend {name} "
            f"(rel. error vs float64 {error:.1e})",
            round(seconds * 1e3, 3),
            f"{spread(times):.0%}",
            len(times),
            round(gflops, 1),
            f"{gflops / peak:.0%}",
            "",
            "",
        )
        section.metrics[f"step.{dtype}.attention.{name}.gflops"] = gflops
        section.metrics[f"step.{dtype}.attention.{name}.rel_error"] = error


def _onednn_gflops(
    dtype_name: str, tokens: int, d_in: int, d_out: int, iters: int = 10
) -> float | None:
    """GFLOP/s of the ``onednn`` linear backend's kernel (oneDNN inner product on a
    packed weight) at one of the model's shapes; ``None`` where that backend cannot
    run."""
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


def _native_transformer(path: Path, dtype: str, **stage: Any) -> Any:
    """The transformer exactly as the engine builds it: the resolved config's backends,
    eager (``stage``: more stage keys, e.g. ``batch_invariant``)."""
    from diffserve.config.resolve import resolve
    from diffserve.models.flux.pipeline import FluxPipeline

    overrides = {"dtype": dtype, "enforce_eager": True, **stage}
    stage_config = resolve(model=str(path), overrides=overrides).stage_for_role(
        "diffusion"
    )
    return FluxPipeline.from_stage(str(path), stage_config).transformer


def _inputs(cfg: dict[str, Any], ni: int, nt: int, dt: Any) -> dict[str, Any]:
    """Random activations of the right shapes; image ids laid out on the latent grid as
    FLUX does."""
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
