"""Section o's targets (issue 31): native Wan against diffusers in the machine's default
dtype, and the transformer step's fraction of the float32 matmul peak."""

from __future__ import annotations

from typing import Any

from benchmarks.settings import Settings

VIDEO_LIMIT = 0.90
VIDEO_PSNR_DB = 40.0
STEP_FRACTION = 0.80


def video_targets(m: dict[str, Any], settings: Settings) -> list[Any]:
    from benchmarks.targets import Target

    case = settings.video_case
    default = m.get("e2e.default_dtype") or "float32"
    speed = Target(
        f"Wan {case.label} text-to-video eager in the default "
        f"dtype ({default}): diffserve / diffusers "
        "latency",
        f"<= {VIDEO_LIMIT:.2f} with PSNR >= {VIDEO_PSNR_DB:.0f} "
        "dB at every frame count",
    )
    ratios = {
        frames: (
            m.get(f"video.{case.model}.{case.size}.{frames}.{default}.ratio"),
            m.get(f"video.{case.model}.{case.size}.{frames}.{default}.psnr_db"),
        )
        for frames in settings.video_frames
    }
    if all(ratio is not None for ratio, _ in ratios.values()):
        speed.measured = ", ".join(
            f"{frames} frames {ratio:.3f} "
            f"(PSNR {'identical' if db == float('inf') else f'{db:.1f} dB'})"
            for frames, (ratio, db) in ratios.items()
        )
        ok = all(
            ratio <= VIDEO_LIMIT and db is not None and db >= VIDEO_PSNR_DB
            for ratio, db in ratios.values()
        )
        speed.status = "met" if ok else "missed"
    step = Target(
        f"Wan transformer step ({case.model}, float32): fraction "
        "of the float32 matmul peak",
        f">= {STEP_FRACTION:.0%}",
    )
    fraction = m.get(f"video.{case.model}.step_fraction")
    if fraction is not None:
        step.measured = f"{fraction:.0%}"
        step.status = "met" if fraction >= STEP_FRACTION else "missed"
    return [speed, step]
