"""The denoising stage's text conditioning when another stage encodes (``topology:
split_text_encoder``): each request carries its ``ConditioningPayload``
(``models/flux/connector_payloads.py``), checked against this stage's model, in place of
the text encoders this stage then never loads. Same interface as
``CachedTextEncoders``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from diffserve.errors import WorkerError
from diffserve.models.flux.connector_payloads import ConditioningPayload
from diffserve.models.flux.params import FluxParams
from diffserve.types.attestation import Attestation
from diffserve.types.request import GenerationRequest


class PayloadText:
    def __init__(
        self,
        params: FluxParams,
        *,
        stage_id: int,
        role: str,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.params = params
        self.stage_id, self.role = stage_id, role
        self.device, self.dtype = device, dtype

    def positive(
        self, requests: Sequence[GenerationRequest], max_sequence_length: int
    ) -> tuple[Tensor, Tensor]:
        payloads = [self._payload(r, max_sequence_length) for r in requests]
        return self._rows([p.prompt_embeds for p in payloads]), self._rows(
            [p.pooled_embeds for p in payloads]
        )

    def negative(
        self, requests: Sequence[GenerationRequest], max_sequence_length: int
    ) -> tuple[Tensor, Tensor]:
        payloads = [
            self._payload(r, max_sequence_length, negative=True) for r in requests
        ]
        return (
            self._rows([p.negative_prompt_embeds for p in payloads]),
            self._rows([p.negative_pooled_embeds for p in payloads]),
        )

    def attest(self, request_id: str) -> Attestation:
        return Attestation()  # the encoding stage attests its cache

    def _payload(
        self, request: GenerationRequest, length: int, negative: bool = False
    ) -> ConditioningPayload:
        payload = request.carried.stage_input
        if not isinstance(payload, ConditioningPayload):
            raise WorkerError(
                f"stage {self.stage_id} ({self.role}) runs after a text-encoder "
                "stage, but request "
                f"{request.request_id} arrived without its conditioning",
                remote_type="ConnectorError",
            )
        payload.check(
            stage_id=self.stage_id,
            role=self.role,
            text_width=self.params.context_in_dim,
            pooled_width=self.params.vec_in_dim,
            max_sequence_length=length,
            negative=negative,
        )
        return payload

    def _rows(self, rows: list[Tensor]) -> Tensor:
        return torch.cat(rows).to(device=self.device, dtype=self.dtype)
