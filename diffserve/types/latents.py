"""The connector payload between the denoising stage and a decoding stage (``topology: encode_denoise_decode``).

One payload per request: its packed latents (``[n, tokens, 64]``: FLUX packs 2x2 latent patches into its
tokens) and the image size they unpack to, and which stage made them. The decoding stage refuses a payload of
another version or shape, naming both stages (``check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffserve.errors import WorkerError

VERSION = 1


@dataclass(frozen=True)
class LatentsPayload:
    producer_stage: int
    producer_role: str
    latents: Any  # tensor [n, (height / 16) * (width / 16), 4 * latent channels], the transformer's packing
    height: int
    width: int
    version: int = VERSION

    def check(self, *, stage_id: int, role: str, images: int, channels: int) -> None:
        problems = []
        if self.version != VERSION:
            problems.append(f"payload version {self.version}, this stage reads version {VERSION}")
        want = (images, (self.height // 16) * (self.width // 16), 4 * channels)
        if tuple(self.latents.shape) != want:
            problems.append(f"latents {tuple(self.latents.shape)}, expected {want}")
        if problems:
            raise WorkerError(f"stage {self.producer_stage} ({self.producer_role}) sent stage {stage_id} ({role}) "
                              f"latents it cannot use: {'; '.join(problems)}", remote_type="ConnectorError")
