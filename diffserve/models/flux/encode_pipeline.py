"""The text-encoder stage of FLUX (``topology: split_text_encoder``, stage 0): CLIP and
T5 on this stage's own device, dtype, linear backend and ``text_encoder_quantization``,
through the conditioning cache; each request leaves with a ``ConditioningPayload``
(``models/flux/connector_payloads.py``) for the denoising stage.

The encoders' ``nn.Linear`` layers are moved onto the stage's ``Linear`` (as the generic
path does for a denoiser), so their calls run on the selected backend and are counted in
this stage's attestation; their attention stays transformers' own (T5's
relative-position attention is no SDPA call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import torch

from diffserve.config.schema import StageConfig
from diffserve.errors import ModelLoadError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear.quantized import quantize_linears
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext, Pipeline, PipelineCapabilities
from diffserve.models.flux.cached_encoding import CachedTextEncoders
from diffserve.models.flux.conditioning import true_cfg
from diffserve.models.flux.connector_payloads import ConditioningPayload
from diffserve.models.flux.encoders import TextEncoders
from diffserve.models.generic.kernels import swap_linears
from diffserve.models.memory import component_weights
from diffserve.models.stage_kernels import stage_kernels
from diffserve.registry.models import MODEL_FAMILIES, read_class_name
from diffserve.types.memory import ComponentWeights, describe_weights
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, RequestResult, StepEvent

logger = get_logger(__name__)


class FluxEncodePipeline(Pipeline):
    """Prompts in, conditioning payloads out (no denoising, no images)."""

    def __init__(
        self,
        text: CachedTextEncoders,
        counters: KernelCounters,
        *,
        family: str,
        stage_id: int,
        role: str,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.text = text
        self.counters = counters
        self.stage_id, self.role = stage_id, role
        self.device, self.dtype = device, dtype
        spec = MODEL_FAMILIES[family]
        # Admission runs against the denoising stage's capabilities; these only describe
        # this stage.
        self.capabilities = PipelineCapabilities(
            family=family,
            default_size=0,
            size_multiple=1,
            max_sequence_length=spec.defaults.max_sequence_length,
            true_cfg=True,
            attention_roles=(),
            implementation="native",
            batch_invariant=text.encoders.per_prompt,
        )
        self.weights: dict[str, ComponentWeights] = {}

    @classmethod
    def from_stage(
        cls,
        model_dir: str | Path,
        stage: StageConfig,
        context: BuildContext = BuildContext(),
    ) -> FluxEncodePipeline:
        root = Path(model_dir)
        start = time.perf_counter()
        device, dtype, kernels = stage_kernels(stage, context)
        try:
            encoders = TextEncoders(
                root,
                dtype=dtype,
                device=device,
                per_prompt=stage.batch_invariant,
                weights_files=stage.components,
            )
        except OSError as exc:
            raise ModelLoadError(
                f"cannot load the text encoders of {root}: {exc}"
            ) from exc
        pipeline_weights = {}
        for name, module in encoders.modules().items():
            swap_linears(module, kernels)
            quantized = quantize_linears(
                module, stage.text_encoder_quantization
            ).attested()
            pipeline_weights[name] = component_weights(
                name, module, quantization=quantized
            )
        text = CachedTextEncoders.for_model(
            encoders,
            root,
            stage.conditioning_cache,
            dict(stage.components),
            str(dtype),
            stage.text_encoder_quantization,
            stage.batch_invariant,
            stage.linear_backend,
        )
        pipeline = cls(
            text,
            kernels.counters,
            family=read_class_name(root),
            stage_id=stage.stage_id,
            role=stage.role,
            device=device,
            dtype=dtype,
        )
        pipeline.weights = pipeline_weights
        logger.info(
            "loaded the text encoders of %s for stage %d (%s on "
            "%s, linear %s) in %.1fs; weights: %s",
            root,
            stage.stage_id,
            dtype,
            device,
            kernels.linear_backend.name,
            time.perf_counter() - start,
            describe_weights(pipeline_weights),
        )
        return pipeline

    @property
    def kernel_counters(self) -> KernelCounters:
        return self.counters

    def run(
        self,
        batch: Sequence[GenerationRequest],
        joins: Callable[[], list[GenerationRequest]] | None = None,
    ) -> Generator[StepEvent | BatchResult, None, None]:
        """One result per request, carrying its payload; the texts of a batch are
        encoded together."""
        batch = list(batch)
        start = time.perf_counter()
        windows: dict[str, int] = {}
        for r in batch:
            if r.max_sequence_length is None:
                raise ValueError(
                    f"request {r.request_id} was not admitted (max_sequence_length "
                    "must be set)"
                )
            windows[r.request_id] = r.max_sequence_length
        outputs = []
        with torch.inference_mode():
            # The batch key shares one window; a library call might not.
            for length in sorted(set(windows.values())):
                group = [r for r in batch if windows[r.request_id] == length]
                txt, vec = self.text.positive(group, length)
                cfg = [r for r in group if true_cfg(r)]
                neg = self.text.negative(cfg, length) if cfg else None
                # By id: requests compare as dataclasses, and an edit's image arrays
                # have no truth value.
                negative_row = {r.request_id: j for j, r in enumerate(cfg)}
                for i, request in enumerate(group):
                    j = negative_row.get(request.request_id)
                    payload = ConditioningPayload(
                        producer_stage=self.stage_id,
                        producer_role=self.role,
                        max_sequence_length=length,
                        prompt_embeds=txt[i : i + 1],
                        pooled_embeds=vec[i : i + 1],
                        negative_prompt_embeds=neg[0][j : j + 1]
                        if neg is not None and j is not None
                        else None,
                        negative_pooled_embeds=neg[1][j : j + 1]
                        if neg is not None and j is not None
                        else None,
                    )
                    outputs.append((request, payload))
        encode_ms = (time.perf_counter() - start) * 1000.0
        results = []
        for request, payload in outputs:
            attestation = self.text.attest(request.request_id)
            results.append(
                RequestResult(
                    request_id=request.request_id,
                    images=torch.empty(0),
                    seeds=request.seeds,
                    timings_ms={"encode": encode_ms},
                    attestation=attestation,
                    handoff=payload,
                )
            )
        yield BatchResult(results)

    def merge_rank_outputs(
        self, outputs: list[RequestResult], per_rank: list[list[dict[str, Any]]]
    ) -> None:
        """One rank per replica on this stage: nothing to merge."""
