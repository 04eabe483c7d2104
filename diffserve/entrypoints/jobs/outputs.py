"""What a finished video job leaves: its three files (the MP4 with its metadata, the
thumbnail, the sprite sheet), each published whole, and the result its row keeps; and a
stored job's input image read back."""

from __future__ import annotations

from typing import Any

from diffserve import __version__
from diffserve.entrypoints.jobs import media
from diffserve.entrypoints.jobs.artifacts import INPUT, ArtifactDir
from diffserve.entrypoints.jobs.store import Job
from diffserve.provenance.facts import from_output
from diffserve.provenance.keys import Signer, Signing
from diffserve.tracing.attributes import VIDEO_JOB
from diffserve.tracing.spans import span
from diffserve.types.request import RequestOutput


class ArtifactWriteError(Exception):
    """A file of the job could not be written (disk full, directory gone): the job
    fails, the server serves on."""


def publish(
    artifacts: ArtifactDir,
    job: Job,
    output: RequestOutput,
    owner: str,
    signer: Signer | None = None,
) -> dict[str, Any]:
    """Write the three files (blocking; a worker thread), then the result the row
    keeps. The MP4 is signed with ``signer`` (None: provenance is off)."""
    frames = output.videos[0]
    signing = _signing(job, output, signer)
    audio = output.audios[0] if output.audios else None
    tags = {
        "prompt": job.prompt,
        "model": job.model,
        "seed": str(output.seeds[0]),
        "num_frames": str(output.num_frames),
        "fps": str(output.fps),
        "config_fingerprint": output.config_fingerprint,
    }
    try:
        with span("diffserve.video_encode", {VIDEO_JOB: job.id}):
            artifacts.publish(
                job.id,
                "video",
                lambda path: media.write_mp4(
                    path,
                    frames,
                    output.fps,
                    tags,
                    audio,
                    output.audio_sample_rate,
                    signing,
                ),
            )
        artifacts.publish(
            job.id, "thumbnail", lambda path: media.write_thumbnail(path, frames)
        )
        artifacts.publish(
            job.id, "spritesheet", lambda path: media.write_spritesheet(path, frames)
        )
    except OSError as exc:
        raise ArtifactWriteError(
            f"writing the video's files failed: {type(exc).__name__}: "
            f"{exc.strerror or exc}"
        ) from exc
    # What the video object shows of the run (video_protocol.py:video_object); the
    # seed, size, steps, frames and fps are the admitted request's, stored with the
    # job.
    return {
        "config_fingerprint": output.config_fingerprint,
        "timings_ms": {k: float(v) for k, v in output.timings.items()},
        "instance": owner,
        "revised_prompt": output.revised_prompt,
        "attestation": jsonable(output.attestation),
    }


def _signing(job: Job, output: RequestOutput, signer: Signer | None) -> Signing | None:
    if signer is None:
        return None
    generation = from_output(
        output,
        model=job.model,
        prompt=job.prompt,
        seed=output.seeds[0],
        negative_prompt=job.request.get("negative_prompt"),
        edit=bool(job.request.get("has_input")),
    )
    return Signing(signer, generation, __version__)


def read_input(artifacts: ArtifactDir, job_id: str) -> Any:
    import numpy as np
    from PIL import Image

    with Image.open(artifacts.path(job_id, INPUT)) as image:
        return np.asarray(image.convert("RGB"))


def jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))
