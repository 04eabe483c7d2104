"""Staged topologies: split_text_encoder runs the text encoders as a stage of their own
(its own executor, dtype and kernels, attested per stage) whose output reaches the
denoising stage as a checked payload, a repeated prompt skips stage 0 through the
conditioning cache; encode_denoise_decode also decodes in a stage of its own. The images
are the single-stage path's: bit for bit where each stage runs the single stage's
kernels, within 60 dB where a stage moves the text encoders or the VAE onto oneDNN (the
single stage runs them on their own ``nn.Linear``, i.e. ``F.linear``: another GEMM)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from diffserve import Engine, GenerationRequest
from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError, WorkerError
from diffserve.models.flux.connector_payloads import ConditioningPayload
from diffserve.zoo.lora import build_flux_lora

pytestmark = pytest.mark.e2e

DEPLOY = """
topology: split_text_encoder
dtype: float32
stages:
  - stage_id: 0
    distributed_executor_backend: mp
    linear_backend: torch
  - stage_id: 1
    distributed_executor_backend: uni
    linear_backend: onednn
"""
REQUEST = dict(
    prompt="a staged fox",
    height=64,
    width=64,
    num_inference_steps=2,
    seed=3,
    max_sequence_length=32,
)
PICTURE = np.zeros((64, 64, 3), np.uint8)
PICTURE[:, 32:] = (30, 60, 220)


def pixels(out: Any) -> np.ndarray:
    return np.asarray(out.images[0])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_split_text_encoder_stages_attest_their_kernels_and_match_one_stage(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(DEPLOY)
    config = resolve(model=tiny_flux_dir, deploy_config=deploy, env={})
    assert [(s.stage_id, s.role) for s in config.stages] == [
        (0, "text_encoder"),
        (1, "diffusion"),
    ]
    assert config.provenance["stages.0.linear_backend"].layer == "yaml"
    edit = dict(images=(PICTURE,), strength=0.8)
    with Engine(str(tiny_flux_dir), deploy_config=str(deploy), env={}) as staged:
        first = staged.generate(GenerationRequest(**REQUEST))
        again = staged.generate(GenerationRequest(**REQUEST))
        window = staged.generate(
            GenerationRequest(**{**REQUEST, "max_sequence_length": 64})
        )
        edited = staged.generate(GenerationRequest(**REQUEST, **edit))
        weights = staged.weights
    with Engine(
        str(tiny_flux_dir), env={}, dtype="float32", linear_backend="onednn"
    ) as single:
        reference = single.generate(GenerationRequest(**REQUEST))
        reference_edit = single.generate(GenerationRequest(**REQUEST, **edit))
    encode, denoise = first.attestation["stages"]
    assert (encode["stage_id"], encode["role"], encode["executor"]) == (
        0,
        "text_encoder",
        "mp",
    )
    assert encode["worker_pid"] != os.getpid() and encode["dtype"] == "float32"
    # CLIP and T5 on stage 0's kernels.
    assert set(encode["linear"]) == {"torch"} and encode["linear"]["torch"] > 0
    assert (denoise["stage_id"], denoise["role"], denoise["executor"]) == (
        1,
        "diffusion",
        "uni",
    )
    assert denoise["worker_pid"] == os.getpid() and set(denoise["linear"]) == {"onednn"}
    assert first.attestation["conditioning_cache"] == "miss"
    assert first.timings["encode"] > 0
    # The same prompt: stage 0's conditioning cache answers, its encoders do not run (no
    # kernel call).
    assert (
        again.attestation["conditioning_cache"] == "hit"
        and again.attestation["stages"][0]["linear"] == {}
    )
    # Another window is another T5 output.
    assert window.attestation["conditioning_cache"] == "miss"
    # The same kernels as the single stage: stage 0's torch backend is F.linear, what
    # the single stage's text encoders call through their own nn.Linear; stage 1 is its
    # oneDNN transformer. So bit for bit.
    assert np.array_equal(pixels(first), pixels(reference)) and np.array_equal(
        pixels(again), pixels(reference)
    )
    # An edit's image crossed both stages.
    assert np.array_equal(pixels(edited), pixels(reference_edit))
    assert {"text_encoder", "text_encoder_2", "transformer", "vae"} <= set(weights)
    # encode_denoise_decode, every stage on worker processes: the VAE decodes in a stage
    # of its own.
    three = {
        "topology": "encode_denoise_decode",
        "dtype": "float32",
        "distributed_executor_backend": "mp",
        "linear_backend": "onednn",
    }
    with Engine(str(tiny_flux_dir), deploy_config=three, env={}) as staged:
        out = staged.generate(GenerationRequest(**REQUEST))
        health = staged.stage_health  # what /health lists per stage
        pids = staged.worker_pids
    assert health == [
        {
            "stage_id": i,
            "role": role,
            "replicas_live": 1,
            "replicas": 1,
            "queue_depth": 0,
        }
        for i, role in enumerate(("text_encoder", "diffusion", "decoder"))
    ]
    stages = out.attestation["stages"]
    assert [(s["stage_id"], s["role"], s["executor"]) for s in stages] == [
        (0, "text_encoder", "mp"),
        (1, "diffusion", "mp"),
        (2, "decoder", "mp"),
    ]
    # Three worker processes of their own.
    assert len({s["worker_pid"] for s in stages} | {os.getpid()}) == 4
    # Engine.worker_pids covers every stage.
    assert sorted(pids) == sorted(s["worker_pid"] for s in stages)
    # The VAE's calls on stage 2's kernels.
    assert stages[2]["linear"] and out.attestation["vae_tiled"] is False
    assert set(out.timings) >= {"encode", "denoise", "decode"}
    # Stages 0 and 2 put the text encoders' and the VAE's Linears on oneDNN; the single
    # stage runs them on their nn.Linear (F.linear): other GEMMs, so a PSNR, not bits.
    assert psnr(pixels(out), pixels(reference)) >= 60.0, psnr(
        pixels(out), pixels(reference)
    )


def test_lora_step_cache_and_cfg_parallel_after_a_text_encoder_stage(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    lora = build_flux_lora(tiny_flux_dir, tmp_path / "style", seed=3)
    stage: dict[str, Any] = dict(
        dtype="float32", lora_modules=f"style={lora}", cache={"backend": "fbcache"}
    )
    request = dict(
        REQUEST,
        num_inference_steps=4,
        negative_prompt="blurry",
        true_cfg_scale=2.0,
        loras=[("style", 0.8)],
        cache_threshold=0.6,
    )
    deploy = {
        "topology": "split_text_encoder",
        **stage,
        "stages": [
            {
                "stage_id": 1,
                "distributed_executor_backend": "mp",
                "parallel": {"cfg_parallel_size": 2},
            }
        ],
    }
    with Engine(str(tiny_flux_dir), deploy_config=deploy, env={}) as staged:
        out = staged.generate(GenerationRequest(**request))
    with Engine(str(tiny_flux_dir), env={}, **stage) as single:
        reference = single.generate(GenerationRequest(**request))
    att = out.attestation
    assert [s["executor"] for s in att["stages"]] == ["uni", "mp"] and att["parallel"][
        "world_size"
    ] == 2
    assert (
        att["lora"] == {"adapters": [{"name": "style", "scale": 0.8}]}
        and att["lora_linear_calls"] > 0
    )
    assert att["cache"][0]["backend"] == "fbcache" and "negative" in att["cache"][0]
    # Stage 0's linear backend is auto (oneDNN on CPU) for the text encoders, which the
    # single stage runs on their nn.Linear (F.linear): other GEMMs, so a PSNR (the CFG
    # ranks themselves are the single rank's kernels).
    assert psnr(pixels(out), pixels(reference)) >= 60.0, psnr(
        pixels(out), pixels(reference)
    )


def test_a_payload_that_does_not_fit_names_both_stages() -> None:
    payload = ConditioningPayload(
        producer_stage=0,
        producer_role="text_encoder",
        max_sequence_length=32,
        prompt_embeds=torch.zeros(1, 32, 48),
        pooled_embeds=torch.zeros(1, 32),
    )
    with pytest.raises(
        WorkerError,
        match=r"stage 0 \(text_encoder\) sent stage 1 \(diffusion\).*expected "
        r"\(1, 32, 64\)",
    ):
        payload.check(
            stage_id=1,
            role="diffusion",
            text_width=64,
            pooled_width=32,
            max_sequence_length=32,
            negative=False,
        )


def test_the_generic_path_has_no_text_encoder_stage(tiny_sd3_dir: Path) -> None:
    with pytest.raises(ConfigError, match="no text_encoder stage") as info:
        resolve(
            model=tiny_sd3_dir, overrides={"topology": "split_text_encoder"}, env={}
        )
    assert info.value.path == "topology" and "FluxPipeline" in (info.value.hint or "")


def test_ray_runs_the_text_encoder_stage(ray_session: Any, tiny_flux_dir: Path) -> None:
    """One stage on Ray (its payload through Ray's object transfer), the others in this
    process."""
    deploy = {
        "topology": "split_text_encoder",
        "dtype": "float32",
        "linear_backend": "onednn",
        "stages": [{"stage_id": 0, "distributed_executor_backend": "ray"}],
    }
    with Engine(str(tiny_flux_dir), deploy_config=deploy, env={}) as staged:
        out = staged.generate(GenerationRequest(**REQUEST))
    with Engine(
        str(tiny_flux_dir), env={}, dtype="float32", linear_backend="onednn"
    ) as single:
        reference = single.generate(GenerationRequest(**REQUEST))
    encode, denoise = out.attestation["stages"]
    assert (
        encode["executor"] == "ray"
        and encode["node"]
        and encode["worker_pid"] != os.getpid()
    )
    assert denoise["executor"] == "uni"
    # Stage 0 runs the text encoders on oneDNN, the single stage on their nn.Linear
    # (F.linear): a PSNR, not bits.
    assert psnr(pixels(out), pixels(reference)) >= 60.0, psnr(
        pixels(out), pixels(reference)
    )
