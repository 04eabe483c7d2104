"""Build hermetic, random-weight Wan pipelines (``tiny-wan``, ``tiny-wan22``,
``tiny-wan22-i2v``, ``small-wan``).

The builders' contract (``zoo/generic.py``): a diffusers-layout directory that plain
``diffusers.WanPipeline`` / ``WanImageToVideoPipeline.from_pretrained`` reads, every
weight from a per-component seed, byte-identical rebuilds, safetensors only, a locally
made UMT5 tokenizer, nothing downloaded, built in a staging directory and renamed into
place when complete.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffserve.zoo.components import (
    MARKER_FILE,
    save_components,
    shipped_model_dir,
    write_json,
)
from diffserve.zoo.publish import build_seeded
from diffserve.zoo.wan_specs import WAN_SPECS, WanSpec, get_wan_spec

__all__ = [
    "BUILDER_VERSION",
    "TOY_MOTION_ASSET",
    "WAN_SPECS",
    "build_wan_model",
    "toy_motion_dir",
]


BUILDER_VERSION = 1
# the toy video model: diffserve/assets/toy-motion (trained by diffserve.zoo.toy_motion)
TOY_MOTION_ASSET = "toy-motion"


def build_wan_model(
    kind: str, out_dir: Path | str, *, seed: int = 0, force: bool = False
) -> Path:
    """Write a random-weight Wan pipeline of ``kind`` (one of WAN_SPECS) to ``out_dir``;
    return its path."""
    spec = get_wan_spec(kind)
    return build_seeded(
        kind,
        out_dir,
        seed,
        lambda staging, seed: _write_pipeline(spec, staging, seed=seed),
        force=force,
    )


def toy_motion_dir() -> Path:
    """The trained toy-motion pipeline shipped in the package
    (``diffserve/assets/toy-motion``)."""
    return shipped_model_dir(TOY_MOTION_ASSET)


def _write_pipeline(spec: WanSpec, out: Path, *, seed: int) -> None:
    import diffusers
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    from diffserve.zoo.tokenizers import write_t5_tokenizer

    vocab_size = write_t5_tokenizer(out / "tokenizer")
    encoder_config = UMT5Config(
        **spec.text_encoder,
        vocab_size=vocab_size,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    UniPCMultistepScheduler(**spec.scheduler).save_pretrained(str(out / "scheduler"))
    factories: dict[str, Callable[[], Any]] = {
        "text_encoder": lambda: UMT5EncoderModel(encoder_config),
        "vae": lambda: AutoencoderKLWan(**spec.vae),
        "transformer": lambda: WanTransformer3DModel(**spec.transformer),
    }
    if spec.experts == 2:
        factories["transformer_2"] = lambda: WanTransformer3DModel(**spec.transformer)
    save_components(factories, out, seed)
    write_json(
        out / "model_index.json",
        {**spec.model_index(), "_diffusers_version": diffusers.__version__},
    )
    marker: dict[str, Any] = {
        "builder_version": BUILDER_VERSION,
        "kind": spec.name,
        "description": spec.description,
        "pipeline": spec.pipeline,
        "seed": seed,
        "random_weights": True,
    }
    if spec.request_defaults:
        marker["request_defaults"] = spec.request_defaults
    write_json(out / MARKER_FILE, marker)
