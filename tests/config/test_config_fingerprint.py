"""The fingerprint: identical across equivalent spellings and key orders, different for
any value."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_helpers import run, write

from diffserve.config.fields import FLAT_LEAVES

SPELLING_A = """
dtype: bf16
linear_backend: TORCH
attention_backend: SDPA
distributed_executor_backend: MP
devices: 0
parallel: {ulysses_degree: 2, ring_degree: 1}
"""
SPELLING_B = """
parallel: {ring_degree: 1, ulysses_degree: 2}
distributed_executor_backend: mp
stages:
  - stage_id: 0
    devices: "0"
    attention_backend: {default: torch_sdpa}
linear_backend: torch
dtype: torch.bfloat16
"""


def test_equivalent_spellings_and_orders_share_a_fingerprint(tmp_path: Path) -> None:
    a = run(deploy_config=write(tmp_path / "a.yaml", SPELLING_A))
    b = run(deploy_config=write(tmp_path / "b.yaml", SPELLING_B))
    c = run(
        overrides={
            "distributed_executor_backend": "mp",
            "dtype": "bfloat16",
            "devices": "0",
            "attention_backend": {"default": "sdpa", "double_block": "sdpa"},
            "linear_backend": "torch",
            "ulysses_degree": 2,
        }
    )
    assert a.stages == b.stages == c.stages
    assert a.fingerprint == b.fingerprint == c.fingerprint
    assert a.provenance != c.provenance  # provenance differs, and does not count


# A second valid value for every flat setting (never its default).
OTHER = {
    "dtype": "float16",
    "linear_backend": "torch",
    "attention_backend": "math",
    "enforce_eager": False,
    "cuda_graphs": True,
    "distributed_executor_backend": "mp",
    "devices": "1",
    "worker_extension_cls": "pkg.mod.Ext",
    "topology": "split_text_encoder",
    "warmup_enabled": True,
    "allowed_hosts": "localhost",
    "expose_config": True,
    "ray_address": "auto",
    "cache_backend": "fbcache",
    "cache_threshold": 0.3,
    "cache_max_consecutive_skips": 3,
    "cache_teacache_coefficients": "wan2.1-t2v-14b",
    "batching": "request",
    "implementation": "generic",
    "default_num_inference_steps": 10,
    "default_guidance_scale": 1.5,
    "default_max_sequence_length": 64,
    "default_num_frames": 17,
    "default_fps": 24,
    "default_height": 64,
    "default_width": 96,
    "lora_modules": "style=/loras/style.safetensors",
    "lora_dir": "/loras",
    "batch_invariant": False,
    "max_step_tokens": 4096,  # default 0 (auto): doubling it changes nothing
    "components": f"transformer={__file__}",
    "vae_tiling": "off",  # resolve checks that the file exists
    "quantization": "int8",
    "quantization_ignored_layers": "final_layer",
    "text_encoder_quantization": "int8",
    "offload": "model",
    "state_dir": "/srv/diffserve",
    "job_store": "sqlite:////srv/jobs.sqlite3",
    "artifact_dir": "/srv/videos",
    "requeue_interrupted": True,
    "webhooks_endpoints": "https://hooks.example.com/diffserve",
    "webhooks_allowed_hosts": "hooks.example.com",
    "webhooks_secrets_file": "/srv/webhook-secrets",
    "webhooks_in_progress_events": True,
    "provenance_enabled": False,
    "provenance_key_file": "/srv/provenance.pem",
}
# Settings that only exist next to another one: both fingerprints are taken with these
# set.
CONTEXT = {
    "cache_threshold": {"cache_backend": "fbcache"},
    "autoscaling_min_replicas": {"autoscaling_max_replicas": 4},
}
# Settings only an accelerator takes (on cpu they are an error): resolved for this
# platform.
PLATFORM = {"offload": "cuda", "cuda_graphs": "cuda"}


@pytest.mark.parametrize("flat", sorted(FLAT_LEAVES))
def test_any_value_changes_the_fingerprint(flat: str) -> None:
    leaf = FLAT_LEAVES[flat]
    if flat in OTHER:
        value = OTHER[flat]
    elif leaf.kind in ("int", "float"):
        value = leaf.default * 2
    else:
        raise AssertionError(f"add a second valid value for {flat} to OTHER")
    context = CONTEXT.get(flat, {})
    platform = PLATFORM.get(flat, "cpu")
    assert (
        run(overrides={**context, flat: value}, platform=platform).fingerprint
        != run(overrides=context, platform=platform).fingerprint
    )


def test_a_backend_default_threshold_equals_the_same_threshold_written_out() -> None:
    # The default is filled in before fingerprinting: writing the backend's default
    # changes nothing.
    assert (
        run(overrides={"cache_backend": "fbcache"}).fingerprint
        == run(
            overrides={"cache_backend": "fbcache", "cache_threshold": 0.08}
        ).fingerprint
    )


def test_extras_roles_model_and_platform_change_the_fingerprint(
    flux_model: Path,
) -> None:
    base = run().fingerprint
    assert run(overrides={"extras": {"k": 1}}).fingerprint != base
    assert (
        run(overrides={"extras": {"k": 1}}).fingerprint
        != run(overrides={"extras": {"k": 2}}).fingerprint
    )
    assert (
        run(overrides={"attention_backend": {"double_block": "math"}}).fingerprint
        != base
    )
    assert run(platform="cuda").fingerprint != base
    assert run(model=flux_model).fingerprint != base
