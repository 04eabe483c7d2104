"""Build hermetic, random-weight FLUX.1 pipeline directories (``tiny-flux``,
``small-flux``).

The output is a diffusers-layout directory that
``diffusers.FluxPipeline.from_pretrained`` and diffserve's own loader both read. Every
weight comes from a seeded generator and every file is written deterministically, so the
same seed reproduces byte-identical files. Nothing is downloaded. A build goes into a
temporary directory beside the target and is renamed into place only when complete, so a
failed or interrupted build never leaves a half-written model behind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffserve.errors import ConfigError
from diffserve.logging import get_logger
from diffserve.zoo.components import MARKER_FILE, save_components, write_json
from diffserve.zoo.flux_specs import SCHEDULER_CONFIG, FluxSpec, get_spec
from diffserve.zoo.publish import build_into

logger = get_logger(__name__)

# Bump when the files a build writes change.
BUILDER_VERSION = 1

# Class names as FLUX.1 checkpoints spell them. "T5TokenizerFast" is what real FLUX
# repos use; in transformers 5 it is an alias of T5Tokenizer and both load our
# tokenizer.json.
FLUX_MODEL_INDEX: dict[str, Any] = {
    "_class_name": "FluxPipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "text_encoder_2": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "FluxTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}


def build_flux_model(
    kind: str,
    out_dir: Path | str,
    *,
    seed: int = 0,
    guidance_embeds: bool = False,
    force: bool = False,
) -> Path:
    """Write a random-weight FLUX.1 pipeline of ``kind`` to ``out_dir`` and return its
    path.

    ``guidance_embeds=True`` gives a dev-like (guidance-distilled) transformer; the
    default is schnell-like. An existing non-empty ``out_dir`` is an error unless
    ``force`` is set, and even then only a previous model directory (one with
    ``model_index.json``) is replaced, so a typo cannot delete unrelated data. Raises
    ConfigError for every bad argument.
    """
    return build_flux_from_spec(
        get_spec(kind), out_dir, seed=seed, guidance_embeds=guidance_embeds, force=force
    )


def build_flux_from_spec(
    spec: FluxSpec,
    out_dir: Path | str,
    *,
    seed: int = 0,
    guidance_embeds: bool = False,
    force: bool = False,
) -> Path:
    """``build_flux_model`` for a spec that is not in ``SPECS`` (the GPU benchmark's
    FLUX.1-dev-shaped model, built on the GPU under ``torch.device("cuda")``: every
    module is constructed where the caller's default device and dtype say)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(
            f"seed must be a non-negative integer, got {seed!r}", path="seed"
        )
    target = Path(out_dir).expanduser().absolute()
    logger.info(
        "building %s (seed %d, guidance_embeds=%s) in %s",
        spec.name,
        seed,
        guidance_embeds,
        target,
    )
    return build_into(
        target,
        lambda staging: _write_pipeline(
            spec, staging, seed=seed, guidance_embeds=guidance_embeds
        ),
        force=force,
    )


def _write_pipeline(
    spec: FluxSpec, out: Path, *, seed: int, guidance_embeds: bool
) -> None:
    import diffusers
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from diffserve.zoo.tokenizers import (
        CLIP_BOS,
        CLIP_EOS,
        clip_vocab_and_merges,
        write_clip_tokenizer,
        write_t5_tokenizer,
    )

    clip_vocab_size = write_clip_tokenizer(out / "tokenizer")
    t5_vocab_size = write_t5_tokenizer(out / "tokenizer_2")
    clip_vocab, _ = clip_vocab_and_merges()
    FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG).save_pretrained(
        str(out / "scheduler")
    )

    clip_config = CLIPTextConfig(
        **spec.clip,
        vocab_size=clip_vocab_size,
        bos_token_id=clip_vocab[CLIP_BOS],
        eos_token_id=clip_vocab[CLIP_EOS],
        pad_token_id=clip_vocab[CLIP_EOS],
    )
    # T5's ids are fixed by the tokenizer layout: <pad>=0, </s>=1; decoding starts from
    # <pad>.
    t5_config = T5Config(
        **spec.t5,
        vocab_size=t5_vocab_size,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    factories: dict[str, Callable[[], Any]] = {
        "text_encoder": lambda: CLIPTextModel(clip_config),
        "text_encoder_2": lambda: T5EncoderModel(t5_config),
        "vae": lambda: AutoencoderKL(**spec.vae),
        "transformer": lambda: FluxTransformer2DModel(
            **spec.transformer_config(guidance_embeds=guidance_embeds)
        ),
    }
    save_components(factories, out, seed)

    write_json(
        out / "model_index.json",
        {
            **FLUX_MODEL_INDEX,
            "_class_name": spec.pipeline_class,
            "_diffusers_version": diffusers.__version__,
        },
    )
    write_json(
        out / MARKER_FILE,
        {
            "builder_version": BUILDER_VERSION,
            "kind": spec.name,
            "description": spec.description,
            "seed": seed,
            "guidance_embeds": guidance_embeds or spec.always_guidance_embeds,
            "random_weights": True,
        },
    )
