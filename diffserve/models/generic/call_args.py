"""The keyword arguments of one batch's call of diffusers' pipeline: prompts, size (and
a video's frames and frame rate), steps, one seeded generator per image, the step hook
(``callback_on_step_end`` or the older ``callback``), the guidance scale where the
family's pipeline takes it, the
negative prompts its CFG needs, a reference edit's images and the family's own
overrides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import PIL.Image
import torch

from diffserve.registry.family import ModelFamily
from diffserve.types.batching import BatchPlan
from diffserve.types.request import GenerationRequest


def call_arguments(
    pipe: Any,
    family: ModelFamily,
    call_params: frozenset[str],
    batch: list[GenerationRequest],
    plan: BatchPlan,
    device: torch.device,
    on_step: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    first = batch[0]
    prompts = [r.prompt for r in batch for _ in range(r.n)]
    seeds = [s for r in batch for s in r.seeds]
    kwargs: dict[str, Any] = dict(
        prompt=prompts,
        height=plan.height,
        width=plan.width,
        num_inference_steps=plan.steps,
        num_images_per_prompt=1,
        generator=[torch.Generator(device=device).manual_seed(s) for s in seeds],
        max_sequence_length=_text_window(first.max_sequence_length, family),
        output_type="latent" if first.output_type == "latent" else "pt",
        return_dict=False,
    )
    if "callback_on_step_end" in call_params:
        kwargs["callback_on_step_end"] = on_step
    else:
        kwargs.update(
            callback=lambda step, timestep, latents: on_step(pipe, step, timestep, {}),
            callback_steps=1,
        )
    if "clean_caption" in call_params:
        # Needs bs4/ftfy; the text goes to the encoder as given.
        kwargs["clean_caption"] = False
    kwargs[family.generic.cfg_argument] = first.guidance_scale
    if first.negative_prompt is not None:  # the batch key makes it all-or-none
        kwargs["negative_prompt"] = [
            r.negative_prompt or "" for r in batch for _ in range(r.n)
        ]
    elif (
        family.generic.cfg_negative_prompt is not None
        and (first.guidance_scale or 0.0) > 1.0
    ):
        kwargs["negative_prompt"] = [family.generic.cfg_negative_prompt] * len(prompts)
    # a reference edit (Qwen-Image-Edit): each image's input, its size from
    # admission
    if first.images:
        images = [PIL.Image.fromarray(r.images[0]) for r in batch for _ in range(r.n)]
        # One image as itself: diffusers' edit pipeline resizes a list otherwise (56
        # dB apart, measured).
        kwargs["image"] = images[0] if len(images) == 1 else images
    if first.num_frames is not None:  # a video family's clip
        kwargs["num_frames"] = first.num_frames
        # LTX-2 conditions on the frame rate (and times its audio by it).
        if "frame_rate" in call_params and first.fps:
            kwargs["frame_rate"] = float(first.fps)
    kwargs.update(family.generic.call_overrides)
    # Keywords this pipeline's __call__ does not take (HunyuanVideo 1.5 has no
    # max_sequence_length) are left out rather than refused by diffusers.
    return {k: v for k, v in kwargs.items() if k in call_params}


def _text_window(length: int | None, family: ModelFamily) -> int | None:
    """The request's text window, rounded up to the family's multiple (LTX-2: 128)."""
    multiple = family.generic.text_window_multiple
    if length is None or multiple <= 1:
        return length
    return -(-length // multiple) * multiple
