"""FLUX's per-row values beside the text (the guidance of a guidance-distilled model, an
edit's inputs, a Kontext reference) and whether a request runs true CFG."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from diffserve.models.flux.edits import EditLatents
from diffserve.types.request import GenerationRequest


@dataclass
class FluxRows:
    """One row per image: joined and sliced by the runner as rows join and leave."""

    # FLUX.1-dev: the distilled guidance scale of every row.
    guidance: Tensor | None = None
    # Edits (models/flux/edits.py): clean latents, noise and mask per row.
    edit: EditLatents | None = None
    ref: Tensor | None = (
        # Kontext: the reference image's packed latents, appended to every row's tokens
        None
    )


def true_cfg(request: GenerationRequest) -> bool:
    """A second (negative-prompt) branch per step; the batch key makes it all-or-none in
    a batch."""
    return request.true_cfg_scale > 1 and request.negative_prompt is not None
