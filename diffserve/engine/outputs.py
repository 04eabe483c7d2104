"""Materialise a worker's output into the user's ``RequestOutput`` (the one owner of PIL
conversion)."""

from __future__ import annotations

from typing import Any

from diffserve.types.modality import IMAGE, Modality
from diffserve.types.request import GenerationRequest, RequestOutput
from diffserve.types.results import RequestResult, to_pil


def to_images(images: Any, output_type: str) -> list[Any]:
    """uint8 [n, H, W, 3] -> one PIL image per row (``pil``) or one tensor per row
    (``pt``/``latent``)."""
    if output_type != "pil":
        return [images[i] for i in range(images.shape[0])]
    return to_pil(images)


def build_output(
    request: GenerationRequest,
    output: RequestResult,
    queue_ms: float,
    modality: Modality = IMAGE,
) -> RequestOutput:
    """The user's output of a worker's result; its ``config_fingerprint`` is the one the
    worker attested (every worker runs the engine's resolved config: Ray actors keep the
    driver's fingerprint)."""
    config_fingerprint = str(output.attestation.get("config_fingerprint", ""))
    if modality.output == "videos":  # a video model's: [n, frames, H, W, 3]
        return _video_output(request, output, queue_ms, config_fingerprint)
    images = to_images(output.images, request.output_type)
    # "pil" outputs are [n, H, W, 3]; "pt" is [n, 3, H, W] and "latent" is packed, so
    # trust the request.
    pil = request.output_type == "pil" and output.images.ndim == 4
    height = int(output.images.shape[1]) if pil else int(request.height or 0)
    width = int(output.images.shape[2]) if pil else int(request.width or 0)
    timings, attestation = _timings(output, queue_ms), output.attestation.copy()
    return RequestOutput(
        request_id=request.request_id,
        images=images,
        seeds=list(output.seeds),
        timings=timings,
        memory_peak_mib=dict(output.memory_peak_mib),
        attestation=attestation,
        config_fingerprint=config_fingerprint,
        width=width,
        height=height,
        num_inference_steps=request.num_inference_steps or 0,
        guidance_scale=request.guidance_scale,
        prompt=request.prompt,
    )


def _video_output(
    request: GenerationRequest,
    output: RequestResult,
    queue_ms: float,
    config_fingerprint: str,
) -> RequestOutput:
    """One array per video: uint8 ``(frames, H, W, 3)`` numpy for "pil", the tensors as
    they came otherwise."""
    videos = output.images
    pil = request.output_type == "pil"
    listed = [videos[i].numpy() if pil else videos[i] for i in range(videos.shape[0])]
    timings, attestation = _timings(output, queue_ms), output.attestation.copy()
    return RequestOutput(
        request_id=request.request_id,
        images=[],
        videos=listed,
        seeds=list(output.seeds),
        timings=timings,
        memory_peak_mib=dict(output.memory_peak_mib),
        attestation=attestation,
        config_fingerprint=config_fingerprint,
        width=int(request.width or 0),
        height=int(request.height or 0),
        num_inference_steps=request.num_inference_steps or 0,
        guidance_scale=request.guidance_scale,
        prompt=request.prompt,
        num_frames=int(request.num_frames or 0),
        fps=int(request.fps or 0),
        audios=list(output.audio) if output.audio is not None else [],
        audio_sample_rate=output.audio_sample_rate,
    )


def _timings(output: RequestResult, queue_ms: float) -> dict[str, float]:
    return {
        "queue": round(queue_ms, 3),
        **{k: round(float(v), 3) for k, v in output.timings_ms.items()},
    }


def with_ar(
    final: RequestOutput,
    original_prompt: str | None,
    revised_prompt: str | None,
    ar: list[dict[str, Any]],
    stage_timings_ms: dict[str, float],
) -> RequestOutput:
    """What the AR stages did for this request: the client's prompt back as ``prompt``,
    the one they drew as ``revised_prompt``, their attestation entries
    (``attestation["ar"]``) and their times (``ar_stage_<id>``)."""
    if not ar:
        return final
    final.attestation["ar"] = ar
    final.revised_prompt = revised_prompt
    if original_prompt is not None:
        final.prompt = original_prompt
    final.timings.update(
        {
            k: round(float(v), 3)
            for k, v in stage_timings_ms.items()
            if k.startswith("ar_stage_")
        }
    )
    return final
