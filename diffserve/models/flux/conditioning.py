"""What every denoise step of a batch reuses (text states, pooled vectors, rotary table, the negative-prompt
branch under true CFG, an edit's inputs), and whether a request runs true CFG."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from diffserve.types.request import GenerationRequest


@dataclass
class Conditioning:
    """What every denoise step of a batch reuses: text states, pooled vectors, rotary table, and the
    negative-prompt ones when the batch runs true CFG (the batch key makes that all-or-none)."""

    txt: Tensor
    vec: Tensor
    pe: Tensor
    neg_txt: Tensor | None = None
    neg_vec: Tensor | None = None
    cfg_scale: float = 1.0
    # CFG-parallel: this rank holds one branch in txt/vec (cfg_rank 0 the prompt, 1 the negative one)
    # and gets the other from its CFG group each step.
    cfg_split: bool = False
    # Edits (models/flux/edits.py): per row, the input image's clean latents, its noise and the mask.
    edit_image: Tensor | None = None
    edit_noise: Tensor | None = None
    edit_mask: Tensor | None = None
    ref: Tensor | None = None  # Kontext: the reference image's packed latents, appended to every row's tokens


def true_cfg(request: GenerationRequest) -> bool:
    """A second (negative-prompt) branch per step; the batch key makes it all-or-none in a batch."""
    return request.true_cfg_scale > 1 and request.negative_prompt is not None
