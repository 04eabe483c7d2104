"""The connector payloads between FLUX's stages (``topology: split_text_encoder`` and
``encode_denoise_decode``), owned by the family that makes and reads them; the engine
carries them opaque (``Carried.stage_input``).

- ``ConditioningPayload`` (text-encoder stage -> denoising stage), one per request: its
  prompt's T5 states and
  pooled CLIP vector (and the negative prompt's under true CFG), the token window they
  were made for, and which stage made them.
- ``LatentsPayload`` (denoising stage -> decoding stage), one per request: its packed
  latents (``[n, tokens,
  64]``: FLUX packs 2x2 latent patches into its tokens), the image size they unpack to,
  and which stage made them.

They travel inside the request: in process for ``uni``, through the worker channel's
shared memory for ``mp`` (torch tensors cross as shared storage). ``VERSION`` changes
whenever the fields or their meaning do: the receiving stage refuses a payload of
another version or shape, naming both stages (``check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffserve.errors import WorkerError

VERSION = 1


@dataclass(frozen=True)
class ConditioningPayload:
    producer_stage: int  # the stage_id that encoded it
    producer_role: str
    max_sequence_length: int
    prompt_embeds: Any  # tensor [1, max_sequence_length, text width] (T5)
    pooled_embeds: Any  # tensor [1, pooled width] (CLIP)
    # Under true CFG, the negative prompt's, shaped alike.
    negative_prompt_embeds: Any = None
    negative_pooled_embeds: Any = None
    version: int = VERSION

    def check(
        self,
        *,
        stage_id: int,
        role: str,
        text_width: int,
        pooled_width: int,
        max_sequence_length: int,
        negative: bool,
    ) -> None:
        """Refuse a payload this stage cannot use: another version, or shapes that do
        not fit its model."""
        problems = []
        if self.version != VERSION:
            problems.append(
                f"payload version {self.version}, this stage reads version {VERSION}"
            )
        want = (1, max_sequence_length, text_width)
        if tuple(self.prompt_embeds.shape) != want:
            problems.append(
                f"prompt embeddings {tuple(self.prompt_embeds.shape)}, expected {want}"
            )
        if tuple(self.pooled_embeds.shape) != (1, pooled_width):
            problems.append(
                f"pooled embeddings {tuple(self.pooled_embeds.shape)}, "
                f"expected {(1, pooled_width)}"
            )
        if negative and self.negative_prompt_embeds is None:
            problems.append("no negative prompt embeddings for a true-CFG request")
        if problems:
            raise WorkerError(
                f"stage {self.producer_stage} ({self.producer_role}) "
                f"sent stage {stage_id} ({role}) "
                f"conditioning it cannot use: {'; '.join(problems)}",
                remote_type="ConnectorError",
            )


@dataclass(frozen=True)
class LatentsPayload:
    producer_stage: int
    producer_role: str
    # tensor [n, (height / 16) * (width / 16), 4 * latent channels], the transformer's
    # packing
    latents: Any
    height: int
    width: int
    version: int = VERSION

    def check(self, *, stage_id: int, role: str, images: int, channels: int) -> None:
        problems = []
        if self.version != VERSION:
            problems.append(
                f"payload version {self.version}, this stage reads version {VERSION}"
            )
        want = (images, (self.height // 16) * (self.width // 16), 4 * channels)
        if tuple(self.latents.shape) != want:
            problems.append(f"latents {tuple(self.latents.shape)}, expected {want}")
        if problems:
            raise WorkerError(
                f"stage {self.producer_stage} ({self.producer_role}) "
                f"sent stage {stage_id} ({role}) "
                f"latents it cannot use: {'; '.join(problems)}",
                remote_type="ConnectorError",
            )
