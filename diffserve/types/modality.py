"""What a model makes, and what that decides, in one place: ``Modality`` (image, video,
video with its sound).

A modality owns the defaults a request of its kind gets (size, and a video's clip), its
size and clip rules, the output field that carries it and the warmup request a replica
runs. The pipeline declares it once (``PipelineCapabilities.modality``); engine
admission and a library call fill a request through it, once, and nothing downstream
decides a default again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from diffserve.errors import RequestError

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.types.request import GenerationRequest


class VideoFacts(Protocol):
    """A video model's facts (``capabilities.VideoCapabilities`` is one)."""

    @property
    def temporal_factor(self) -> int: ...
    @property
    def default_height(self) -> int: ...
    @property
    def default_width(self) -> int: ...
    @property
    def animates_image(self) -> bool: ...


class ModelFacts(Protocol):
    """What a modality reads of a loaded model (``capabilities.PipelineCapabilities`` is
    one)."""

    @property
    def family(self) -> str: ...
    @property
    def default_size(self) -> int: ...
    @property
    def size_multiple(self) -> int: ...
    @property
    def max_sequence_length(self) -> int: ...
    @property
    def video(self) -> VideoFacts | None: ...


class RequestDefaults(Protocol):
    """What a request that leaves a field unset gets
    (``config.schema.RequestDefaultsConfig`` is one)."""

    @property
    def num_inference_steps(self) -> int | None: ...
    @property
    def guidance_scale(self) -> float | None: ...
    @property
    def max_sequence_length(self) -> int | None: ...
    @property
    def height(self) -> int | None: ...
    @property
    def width(self) -> int | None: ...
    @property
    def num_frames(self) -> int | None: ...
    @property
    def fps(self) -> int | None: ...


@dataclass(frozen=True)
class Modality:
    """An image model's: a request's size is its edit image's (rounded down to the
    model's multiple), else the deployment's default size, else the model's."""

    name: str = "image"
    output: str = "images"  # the ``RequestOutput`` field that carries the outputs

    def fill(
        self,
        request: GenerationRequest,
        defaults: RequestDefaults | None,
        capabilities: ModelFacts,
    ) -> GenerationRequest:
        """``request`` with every unset field this modality decides filled (steps,
        guidance, text length, size, a clip's frames and fps); set fields stay as
        sent."""
        text_length = defaults.max_sequence_length if defaults is not None else None
        fill: dict[str, Any] = {
            "num_inference_steps": defaults.num_inference_steps
            if defaults is not None
            else None,
            "guidance_scale": defaults.guidance_scale if defaults is not None else None,
            "max_sequence_length": text_length or capabilities.max_sequence_length,
            **self._size(request, defaults, capabilities),
            **self._clip(request, defaults, capabilities),
        }
        return request.with_defaults(**fill)

    def check(self, request: GenerationRequest, capabilities: ModelFacts) -> None:
        for name in ("num_frames", "fps", "seconds"):
            if getattr(request, name) is not None:
                raise RequestError(
                    f"{capabilities.family} makes images; {name} is for video models",
                    param=name,
                )

    def warmup(
        self,
        capabilities: ModelFacts,
        height: int,
        width: int,
        steps: int,
        request_id: str,
    ) -> GenerationRequest:
        """The request a replica runs once before it serves (compiles and allocates what
        the first request would)."""
        from diffserve.types.request import Carried, GenerationRequest

        return GenerationRequest(
            prompt="warmup",
            height=height,
            width=width,
            num_inference_steps=steps,
            seed=0,
            max_sequence_length=64,
            request_id=request_id,
            carried=Carried(is_warmup=True),
            **self._warmup_extra(capabilities, height, width),
        )

    def _size(
        self,
        request: GenerationRequest,
        defaults: RequestDefaults | None,
        capabilities: ModelFacts,
    ) -> dict[str, int | None]:
        if request.images:  # an edit (or an animated image) takes its image's size
            multiple = capabilities.size_multiple
            h, w = request.images[0].shape[:2]
            return {
                "height": max(multiple, h // multiple * multiple),
                "width": max(multiple, w // multiple * multiple),
            }
        height, width = self._default_size(capabilities)
        return {
            "height": (defaults.height if defaults is not None else None) or height,
            "width": (defaults.width if defaults is not None else None) or width,
        }

    def _default_size(self, capabilities: ModelFacts) -> tuple[int, int]:
        return capabilities.default_size, capabilities.default_size

    def _clip(
        self,
        request: GenerationRequest,
        defaults: RequestDefaults | None,
        capabilities: ModelFacts,
    ) -> dict[str, int | None]:
        return {}

    def _warmup_extra(
        self, capabilities: ModelFacts, height: int, width: int
    ) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class VideoModality(Modality):
    """A video model's: a clip of ``num_frames`` (``k * temporal_factor + 1``) at
    ``fps``, of the model's own default size when the request and the deployment name
    none."""

    name: str = "video"
    output: str = "videos"

    def check(self, request: GenerationRequest, capabilities: ModelFacts) -> None:
        video = capabilities.video
        assert video is not None  # a video modality is a video model's
        frames, factor = request.num_frames, video.temporal_factor
        if frames is not None and (frames - 1) % factor:
            fix = max(1, (frames - 1) // factor * factor + 1)
            raise RequestError(
                f"num_frames={frames} must be {factor}k+1 for this model (e.g. {fix})",
                param="num_frames",
            )
        if video.animates_image and not request.images:
            raise RequestError(
                f"{capabilities.family} animates an image: send one (the first frame)",
                param="image",
            )

    def _default_size(self, capabilities: ModelFacts) -> tuple[int, int]:
        video = capabilities.video
        assert video is not None
        return video.default_height, video.default_width

    def _clip(
        self,
        request: GenerationRequest,
        defaults: RequestDefaults | None,
        capabilities: ModelFacts,
    ) -> dict[str, int | None]:
        fps = request.fps or (defaults.fps if defaults is not None else None)
        frames = defaults.num_frames if defaults is not None else None
        if (
            request.seconds is not None
            and fps is not None
            and capabilities.video is not None
        ):
            frames = frames_for(
                request.seconds, fps, capabilities.video.temporal_factor
            )
        return {"num_frames": frames, "fps": fps}

    def _warmup_extra(
        self, capabilities: ModelFacts, height: int, width: int
    ) -> dict[str, Any]:
        # The shortest clip runs every kernel at the least cost.
        extra: dict[str, Any] = {"num_frames": 1}
        # A black first frame.
        if capabilities.video is not None and capabilities.video.animates_image:
            import numpy as np

            extra["images"] = (np.zeros((height, width, 3), np.uint8),)
        return extra


@dataclass(frozen=True)
class SoundingVideoModality(VideoModality):
    """A video model that makes its sound too (LTX-2): a clip as any video's, plus one
    waveform per video (``RequestOutput.audios`` at ``audio_sample_rate``), which every
    MP4 it is written to carries as its audio track."""

    name: str = "video+audio"
    audio_output: str = "audios"  # the ``RequestOutput`` field of the waveforms


def frames_for(seconds: float, fps: int, temporal_factor: int) -> int:
    """The clip length nearest ``seconds`` at ``fps`` the model can make: ``k *
    temporal_factor + 1``."""
    return temporal_factor * max(1, round(seconds * fps / temporal_factor)) + 1


IMAGE = Modality()
VIDEO = VideoModality()
SOUNDING_VIDEO = SoundingVideoModality()
