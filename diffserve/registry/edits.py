"""The kinds of image edit a family runs (its registry entry's ``edits``), and what each
takes from a request.

Admission (``engine/admission.py`` and a library call's
``models/base.py:library_admit``) checks an edit here (``admit_edit``); the pipelines
declare ``needs_image`` in their capabilities. Nothing tests kind names elsewhere: a new
kind is one entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from diffserve.errors import RequestError

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.types.capabilities import PipelineCapabilities
    from diffserve.types.request import GenerationRequest

# The strength of an img2img or inpainting request that names none (diffusers'
# FluxImg2ImgPipeline default).
DEFAULT_STRENGTH = 0.6


@dataclass(frozen=True)
class EditKind:
    name: str
    takes_mask: bool  # a mask of what to repaint may come with the image
    # Why a request's strength is refused (None: it sets how much noise runs)
    strength_refused: str | None
    needs_image: bool  # every request sends an image (image-to-video: the first frame)


EDIT_KINDS: dict[str, EditKind] = {
    kind.name: kind
    for kind in (
        EditKind("img2img", takes_mask=True, strength_refused=None, needs_image=False),
        EditKind("inpaint", takes_mask=True, strength_refused=None, needs_image=False),
        # The input image's latents as extra tokens (FLUX.1 Kontext, Qwen-Image-Edit):
        # the image is not noised.
        EditKind(
            "reference",
            takes_mask=False,
            strength_refused="edits from its reference image",
            needs_image=False,
        ),
        # Image-to-video (Wan2.2 I2V): the image is the first frame, every request sends
        # one.
        EditKind(
            "first_frame",
            takes_mask=False,
            strength_refused="animates its image from the first frame",
            needs_image=True,
        ),
    )
}


def edit_kinds(names: Iterable[str]) -> list[EditKind]:
    """The kinds of a family's ``edits`` (an unknown name is a KeyError: a registry
    entry's typo)."""
    return [EDIT_KINDS[name] for name in names]


def takes_mask(names: Iterable[str]) -> bool:
    return all(kind.takes_mask for kind in edit_kinds(names))


def strength_refused(names: Iterable[str]) -> str | None:
    """Why these kinds take no strength, or None when a request's strength (or the 0.6
    default) applies."""
    return next(
        (kind.strength_refused for kind in edit_kinds(names) if kind.strength_refused),
        None,
    )


def needs_image(names: Iterable[str]) -> bool:
    return any(kind.needs_image for kind in edit_kinds(names))


def admit_edit(
    request: GenerationRequest, capabilities: PipelineCapabilities
) -> GenerationRequest:
    """An edit's inputs against what the model edits; fills the strength of img2img and
    inpainting when unset."""
    if not request.images:
        return request
    kinds = capabilities.edits
    if not kinds:
        raise RequestError(
            f"{capabilities.family} ({capabilities.implementation}) "
            "does not edit images on this "
            "deployment",
            param="image",
        )
    if request.mask is not None and not takes_mask(kinds):
        raise RequestError(f"{capabilities.family} takes no mask", param="mask")
    # One image to edit, or one reference (as diffusers runs reference edits)
    if len(request.images) > 1:
        raise RequestError(
            f"{len(request.images)} images: {capabilities.family} "
            "takes one input image",
            param="image",
        )
    refused = strength_refused(kinds)
    if request.strength is not None and (refused or not capabilities.edit_strength):
        why = refused or EDIT_KINDS["reference"].strength_refused
        raise RequestError(
            f"{capabilities.family} {why} and takes no strength", param="strength"
        )
    if request.strength is None and refused is None:
        return replace(request, strength=DEFAULT_STRENGTH)
    return request
