"""The decoding stage of FLUX (``topology: encode_denoise_decode``, stage 2): the VAE on
this stage's own device, dtype and linear backend (its ``nn.Linear`` layers, in the
mid-block attention, moved onto the stage's ``Linear`` and counted), its ``vae`` section
(tiling); each request arrives with its ``LatentsPayload`` and leaves with the images it
asked for, decoded one at a time as the single-stage path does."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import torch

from diffserve.config.schema import StageConfig
from diffserve.errors import WorkerError
from diffserve.layers.attestation import KernelCounters
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext, Pipeline, PipelineCapabilities
from diffserve.models.flux.connector_payloads import LatentsPayload
from diffserve.models.flux.decode import decode_latents
from diffserve.models.generic.kernels import swap_linears
from diffserve.models.memory import PhasePeaks, component_weights
from diffserve.models.stage_kernels import stage_kernels
from diffserve.models.vae_file import load_vae
from diffserve.models.vae_tiling import configure_tiling
from diffserve.registry.models import MODEL_FAMILIES, read_class_name
from diffserve.types.attestation import Attestation
from diffserve.types.memory import ComponentWeights
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, RequestResult, StepEvent

logger = get_logger(__name__)


class FluxDecodePipeline(Pipeline):
    """Latents in, images out."""

    def __init__(
        self,
        vae: Any,
        counters: KernelCounters,
        stage: StageConfig,
        *,
        family: str,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.vae = vae
        self.counters = counters
        self.stage = stage
        self.device, self.dtype = device, dtype
        self.channels = int(vae.config.latent_channels)
        self.capabilities = PipelineCapabilities(
            family=family,
            default_size=int(vae.config.sample_size),
            size_multiple=16,
            max_sequence_length=MODEL_FAMILIES[family].defaults.max_sequence_length,
            true_cfg=True,
            attention_roles=(),
            batch_invariant=True,
        )
        self.weights: dict[str, ComponentWeights] = {
            "vae": component_weights("vae", vae)
        }

    @classmethod
    def from_stage(
        cls,
        model_dir: str | Path,
        stage: StageConfig,
        context: BuildContext = BuildContext(),
    ) -> FluxDecodePipeline:
        root = Path(model_dir)
        device, dtype, kernels = stage_kernels(stage, context)
        vae = load_vae(
            root / "vae",
            dtype=dtype,
            device=device,
            weights_file=stage.components.get("vae"),
        )
        swap_linears(vae, kernels)
        configure_tiling(vae, stage.vae)
        logger.info(
            "loaded the VAE of %s for stage %d (%s on %s, linear %s)",
            root,
            stage.stage_id,
            dtype,
            device,
            kernels.linear_backend.name,
        )
        return cls(
            vae,
            kernels.counters,
            stage,
            family=read_class_name(root),
            device=device,
            dtype=dtype,
        )

    @property
    def kernel_counters(self) -> KernelCounters:
        return self.counters

    def run(
        self,
        batch: Sequence[GenerationRequest],
        joins: Callable[[], list[GenerationRequest]] | None = None,
    ) -> Generator[StepEvent | BatchResult, None, None]:
        peaks = PhasePeaks(self.device)
        results = []
        # One request at a time: each carries its own latents and size.
        for request in batch:
            payload = request.carried.stage_input
            if not isinstance(payload, LatentsPayload):
                raise WorkerError(
                    f"stage {self.stage.stage_id} ({self.stage.role}) runs "
                    "after a denoising stage, "
                    f"but request {request.request_id} arrived without its latents",
                    remote_type="ConnectorError",
                )
            payload.check(
                stage_id=self.stage.stage_id,
                role=self.stage.role,
                images=request.n,
                channels=self.channels,
            )
            start = time.perf_counter()
            peaks.start("decode")
            latents = payload.latents.to(device=self.device, dtype=self.dtype)
            images, tiled = decode_latents(
                self.vae,
                [request],
                latents,
                payload.height,
                payload.width,
                self.stage.vae,
            )
            peaks.stop()
            attestation = (
                Attestation(vae_tiled=tiled)
                if request.output_type != "latent"
                else Attestation()
            )
            results.append(
                RequestResult(
                    request_id=request.request_id,
                    images=images[0],
                    seeds=request.seeds,
                    timings_ms={"decode": (time.perf_counter() - start) * 1000.0},
                    memory_peak_mib=dict(peaks.peaks),
                    attestation=attestation,
                )
            )
        yield BatchResult(results)

    def merge_rank_outputs(
        self, outputs: list[RequestResult], per_rank: list[list[dict[str, Any]]]
    ) -> None:
        """One rank per replica on this stage: nothing to merge."""
