"""The zoo's ``diffserve make-model KIND DIR``: write a hermetic random-weight model
(FLUX, a generic diffusers DiT, Wan, or a small causal language model for the
prompt-rewrite stage), or copy or train one of the toy models."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from diffserve.zoo.kinds import (
    DESCRIPTION,
    FLUX_KINDS,
    GENERIC_KINDS,
    LLM_KINDS,
    LORA_KINDS,
    MODEL_KINDS,
    OWN_BUILDER_KINDS,
    TRAINED_KINDS,
    TRAINED_LLM_KINDS,
    TRAINED_LORA_KINDS,
    TRAINED_VIDEO_KINDS,
    WAN_KINDS,
    own_builder,
)

# A trainer's frozen dataclass config (TrainConfig, LoraTrainConfig)
_Config = TypeVar("_Config", bound=Any)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``make-model`` sub-command's parser: every kind, with its help."""
    parser = subparsers.add_parser(
        "make-model",
        help="write a random-weight FLUX.1, FLUX.2-klein, SD3, PixArt-Sigma, "
        "Qwen-Image, Z-Image or Wan pipeline directory, "
        "or a small Qwen3 language model (no download)",
        description=DESCRIPTION,
    )
    parser.add_argument(
        "kind",
        choices=MODEL_KINDS
        + TRAINED_KINDS
        + TRAINED_VIDEO_KINDS
        + LORA_KINDS
        + TRAINED_LORA_KINDS
        + LLM_KINDS
        + TRAINED_LLM_KINDS,
        metavar="KIND",
        help=f"FLUX: {', '.join(FLUX_KINDS)}; generic diffusers DiT: "
        f"{', '.join(GENERIC_KINDS)}; "
        f"Wan video: {', '.join(WAN_KINDS)}; "
        f"families with their own builder: {', '.join(OWN_BUILDER_KINDS)}; "
        "tiny-flux-lora: a random LoRA (diffusers/PEFT layout) "
        "for the FLUX model at --base; "
        "toy-shapes: the trained demo model; toy-shapes-stars: "
        "its circles-to-stars LoRA; "
        "toy-motion: the trained toy video model; "
        f"language models: {', '.join(LLM_KINDS)} (random), "
        "toy-prompter (trained: expands short "
        "prompts into the toy grammars)",
    )
    parser.add_argument(
        "dir",
        type=Path,
        metavar="DIR",
        help="output directory (created; must be empty)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="weight seed (default 0; --train: the seed the shipped "
        "weights were trained with)",
    )
    parser.add_argument(
        "--guidance-embeds",
        action="store_true",
        help="FLUX kinds only: dev-like guidance-distilled transformer "
        "(default: schnell-like)",
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        metavar="MODEL",
        help="tiny-flux-lora and toy-shapes-stars --train: the FLUX "
        "model directory the adapter is "
        "for",
    )
    parser.add_argument(
        "--rank", type=int, default=4, help="tiny-flux-lora only: LoRA rank (default 4)"
    )
    parser.add_argument(
        "--train",
        action="store_true",
        help="toy-shapes, toy-shapes-stars, toy-motion, toy-prompter "
        "only: train it here (about 25 "
        "minutes / 1 minute / 40 minutes / 1-3 minutes on a "
        "2-core CPU) instead of copying the shipped "
        "weights",
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="--train only: CPU threads (default 2)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing model directory at DIR",
    )
    return parser


def make(args: argparse.Namespace) -> Path:
    """Write ``args.kind`` to ``args.dir``; returns what was written (a directory, or an
    adapter's file)."""
    from diffserve.errors import ConfigError
    from diffserve.zoo.flux import build_flux_model
    from diffserve.zoo.publish import check_target

    if args.kind in LORA_KINDS:
        if args.base is None:
            raise ConfigError(
                "tiny-flux-lora needs the FLUX model it adapts",
                path="--base",
                hint="pass --base DIR (e.g. a directory made by make-model tiny-flux)",
            )
        from diffserve.zoo.lora import build_flux_lora

        return build_flux_lora(
            args.base, args.dir, seed=_seed(args), rank=args.rank, force=args.force
        )
    if args.kind in TRAINED_KINDS:
        return _toy_shapes(args)
    if args.kind in TRAINED_LORA_KINDS:
        return _toy_shapes_stars(args)
    if args.kind in TRAINED_VIDEO_KINDS:
        return _toy_motion(args)
    if args.kind in LLM_KINDS + TRAINED_LLM_KINDS:
        return _language_model(args)
    if args.train:
        raise ConfigError(
            "applies to toy-shapes, toy-shapes-stars, toy-prompter "
            "and toy-motion only, not to "
            f"{args.kind}",
            path="--train",
            hint="random-weight kinds are built, not trained: drop --train",
        )
    generic = args.kind in GENERIC_KINDS
    if args.kind not in FLUX_KINDS and args.guidance_embeds:
        raise ConfigError(
            f"applies to FLUX kinds only ({', '.join(FLUX_KINDS)}), not to {args.kind}",
            path="--guidance-embeds",
            hint="drop --guidance-embeds or choose a FLUX kind",
        )
    # Fail on a bad DIR before paying for the torch/diffusers imports of the build.
    check_target(Path(args.dir).expanduser().absolute(), force=args.force)
    if generic:
        from diffserve.zoo.generic import build_generic_model

        out = build_generic_model(
            args.kind, args.dir, seed=_seed(args), force=args.force
        )
    elif args.kind in OWN_BUILDER_KINDS:
        out = own_builder(args.kind)(
            args.kind, args.dir, seed=_seed(args), force=args.force
        )
    elif args.kind in WAN_KINDS:
        from diffserve.zoo.wan import build_wan_model

        out = build_wan_model(args.kind, args.dir, seed=_seed(args), force=args.force)
    else:
        out = build_flux_model(
            args.kind,
            args.dir,
            seed=_seed(args),
            guidance_embeds=args.guidance_embeds,
            force=args.force,
        )
    return out


def _toy_shapes(args: argparse.Namespace) -> Path:
    """Train toy-shapes into DIR (--train), or copy the shipped weights there."""
    from diffserve.errors import ConfigError
    from diffserve.zoo.demo import toy_model_dir
    from diffserve.zoo.publish import build_into, check_target

    if args.guidance_embeds or args.base is not None:
        raise ConfigError(
            "toy-shapes is a trained schnell-like model",
            path="--guidance-embeds/--base",
            hint="drop them",
        )
    target = Path(args.dir).expanduser().absolute()
    check_target(target, force=args.force)
    if not args.train:
        shipped = toy_model_dir()
        return build_into(
            target, lambda staging: _copy_tree(shipped, staging), force=args.force
        )
    from diffserve.zoo.toy_shapes.train import TrainConfig, train_toy_model

    return train_toy_model(
        target, _seeded(TrainConfig(threads=args.threads), args), force=args.force
    )


def _toy_motion(args: argparse.Namespace) -> Path:
    """Train toy-motion into DIR (--train), or copy the shipped weights there."""
    from diffserve.errors import ConfigError
    from diffserve.zoo.publish import build_into, check_target
    from diffserve.zoo.wan import toy_motion_dir

    if args.guidance_embeds or args.base is not None:
        raise ConfigError(
            "toy-motion is a trained Wan2.1 model",
            path="--guidance-embeds/--base",
            hint="drop them",
        )
    target = Path(args.dir).expanduser().absolute()
    check_target(target, force=args.force)
    if not args.train:
        shipped = toy_motion_dir()
        return build_into(
            target, lambda staging: _copy_tree(shipped, staging), force=args.force
        )
    from diffserve.zoo.toy_motion.train import TrainConfig, train_toy_motion

    return train_toy_motion(
        target, _seeded(TrainConfig(threads=args.threads), args), force=args.force
    )


def _language_model(args: argparse.Namespace) -> Path:
    """A causal LM into DIR: a random tiny-qwen3(-moe), or the toy prompter (trained
    with --train, else copied)."""
    from diffserve.errors import ConfigError
    from diffserve.zoo.llm.build import LLM_MARKER, build_tiny_llm, toy_prompter_dir
    from diffserve.zoo.publish import build_into, check_target

    if args.guidance_embeds or args.base is not None:
        raise ConfigError(
            f"{args.kind} is a language model, not a FLUX pipeline",
            path="--guidance-embeds/--base",
            hint="drop them",
        )
    if args.kind in LLM_KINDS and args.train:
        raise ConfigError(
            f"{args.kind} has random weights: it is built, not trained",
            path="--train",
            hint="drop --train (toy-prompter is the trained language model)",
        )
    target = Path(args.dir).expanduser().absolute()
    # Fail on a bad DIR before paying for the torch/transformers imports of the build.
    check_target(target, force=args.force, marker=LLM_MARKER)
    if args.kind in LLM_KINDS:
        return build_tiny_llm(args.kind, target, seed=_seed(args), force=args.force)
    if not args.train:
        shipped = toy_prompter_dir()
        return build_into(
            target,
            lambda staging: _copy_tree(shipped, staging),
            force=args.force,
            marker=LLM_MARKER,
        )
    from diffserve.zoo.llm.train import PrompterTrainConfig, train_toy_prompter

    return train_toy_prompter(
        target,
        _seeded(PrompterTrainConfig(threads=args.threads), args),
        force=args.force,
    )


def _toy_shapes_stars(args: argparse.Namespace) -> Path:
    """Train the circles-to-stars LoRA into DIR (--train), or copy the shipped one;
    returns the weight file."""
    from diffserve.errors import ConfigError
    from diffserve.zoo.demo import toy_model_dir
    from diffserve.zoo.publish import build_into, check_target
    from diffserve.zoo.toy_shapes.lora import (
        WEIGHT_NAME,
        LoraTrainConfig,
        shipped_stars_lora,
        train_stars_lora,
    )

    if args.guidance_embeds:
        raise ConfigError(
            "toy-shapes-stars adapts the schnell-like toy model",
            path="--guidance-embeds",
            hint="drop it",
        )
    if args.base is not None and not args.train:
        raise ConfigError(
            "--base applies to --train only (the shipped adapter "
            "is for the shipped model)",
            path="--base",
            hint="add --train to train an adapter for that model",
        )
    target = Path(args.dir).expanduser().absolute()
    check_target(target, force=args.force, marker=WEIGHT_NAME)
    if not args.train:
        shipped = shipped_stars_lora().parent
        build_into(
            target,
            lambda staging: _copy_tree(shipped, staging),
            force=args.force,
            marker=WEIGHT_NAME,
        )
        return target / WEIGHT_NAME
    base = Path(args.base).expanduser() if args.base is not None else toy_model_dir()
    return train_stars_lora(
        target,
        base,
        _seeded(LoraTrainConfig(threads=args.threads), args),
        force=args.force,
    )


def _seed(args: argparse.Namespace) -> int:
    """A random-weight builder's seed: ``--seed``, else 0."""
    return 0 if args.seed is None else int(args.seed)


def _seeded(config: _Config, args: argparse.Namespace) -> _Config:
    """A trainer's config with ``--seed`` when given; else its own default seed (the
    shipped weights')."""
    return (
        config
        if args.seed is None
        else dataclasses.replace(config, seed=int(args.seed))
    )


def _copy_tree(source: Path, staging: Path) -> None:
    """The shipped directory's files into the build's staging directory (published by
    ``build_into``)."""
    import shutil

    shutil.copytree(source, staging, dirs_exist_ok=True)
