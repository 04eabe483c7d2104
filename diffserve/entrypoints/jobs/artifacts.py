"""A job's files in the artifact directory (which several server instances may share):
the MP4, its thumbnail and sprite sheet. A file's path is built from the job id alone,
checked to be one the store makes, never from request data. A file is published
atomically: written to a temporary name in the same directory, flushed to disk, then
renamed; a reader sees the whole file or none, and a crash leaves at most a temporary
file (removed with the job's other files when the runner recovers the job, or by its
sweep of files without a row)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from diffserve.logging import get_logger

logger = get_logger(__name__)

JOB_ID = re.compile(r"video_[0-9a-f]{32}")
# What GET .../content serves.
VARIANTS = {"video": ".mp4", "thumbnail": ".webp", "spritesheet": ".jpg"}
# a job's input_reference image (PNG, decoded and re-encoded), kept until the job is
# gone
INPUT = "input"
_SUFFIXES = {**VARIANTS, INPUT: ".input.png"}
TEMPORARY = ".partial"


class ArtifactDir:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, job_id: str, variant: str = "video") -> Path:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"not a job id: {job_id!r}")
        if variant not in _SUFFIXES:
            raise ValueError(
                f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}"
            )
        return self.root / f"{job_id}{_SUFFIXES[variant]}"

    def publish(self, job_id: str, variant: str, write: Callable[[Path], None]) -> Path:
        """``write(temporary_path)`` makes the file; it becomes the variant's file in
        one rename."""
        final = self.path(job_id, variant)
        temporary = final.with_name(final.name + TEMPORARY)
        try:
            write(temporary)
            with open(temporary, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(temporary, final)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return final

    def exists(self, job_id: str, variant: str = "video") -> bool:
        return self.path(job_id, variant).is_file()

    def remove(self, job_id: str) -> None:
        """Every file of the job (and any temporary one left by a crash)."""
        for variant in _SUFFIXES:
            final = self.path(job_id, variant)
            final.unlink(missing_ok=True)
            final.with_name(final.name + TEMPORARY).unlink(missing_ok=True)

    def outputs(self) -> list[str]:
        """Job ids with a file here (the orphan sweep compares them with the store's
        rows)."""
        ids = {name.name.split(".", 1)[0] for name in self.root.glob("video_*")}
        return sorted(i for i in ids if JOB_ID.fullmatch(i))
