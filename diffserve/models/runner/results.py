"""The results of the requests that finished: decoded (on rank 0, or handed to the
decoding stage), timed, and attested the same way for every native family."""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch
from torch import Tensor

from diffserve.models.base import ParallelContext
from diffserve.models.lora_adapters import LoraAdapters
from diffserve.models.memory import PhasePeaks
from diffserve.models.runner.branches import BranchCaches
from diffserve.models.runner.hooks import Decoded
from diffserve.models.runner.rows import LiveRows, Member
from diffserve.types.attestation import Attestation
from diffserve.types.batching import BatchPlan
from diffserve.types.request import GenerationRequest
from diffserve.types.results import RequestResult


class Finishing(Protocol):
    """What the results need of the runner (``NativeRunner`` is one)."""

    parallel: ParallelContext
    loras: LoraAdapters | None

    def gather(self, latents: Tensor) -> Tensor: ...
    def decode(
        self, latents: Tensor, requests: list[GenerationRequest], plan: BatchPlan
    ) -> Decoded: ...
    def cfg_scale(self, request: GenerationRequest) -> float | None: ...
    def attest(
        self, request: GenerationRequest, guided: bool, schedule: Any
    ) -> dict[str, Any]: ...


def finished_results(
    runner: Finishing,
    live: LiveRows,
    done: list[Member],
    caches: BranchCaches,
    plan: BatchPlan,
    peaks: PhasePeaks,
) -> list[RequestResult]:
    """Decode ``done``'s rows and report each request (its rows leave the batch after
    this)."""
    rows = [row for member in done for row in member.rows]
    assert live.latents is not None
    latents = runner.gather(
        live.latents.index_select(0, torch.tensor(rows, device=live.latents.device))
    )
    requests = [m.request for m in done]
    start = time.perf_counter()
    peaks.start("decode")
    # Every rank holds the same latents; only rank 0's result is returned, so only it
    # decodes.
    decoded = (
        runner.decode(latents, requests, plan)
        if runner.parallel.rank == 0
        else Decoded([torch.empty(0) for _ in requests])
    )
    decode_ms = (time.perf_counter() - start) * 1000.0
    peaks.stop()
    entries = caches.entries(
        rows, [member.schedule.steps for member in done for _ in member.rows]
    )
    guided = runner.cfg_scale(requests[0]) is not None
    results, offset = [], 0
    for index, (member, output) in enumerate(zip(done, decoded.outputs, strict=True)):
        request = member.request
        attestation = Attestation(cache=entries[offset : offset + request.n])
        attestation.update(runner.attest(request, guided, member.schedule))  # type: ignore[typeddict-item]
        if decoded.vae_tiled is not None:
            attestation["vae_tiled"] = decoded.vae_tiled
        if runner.loras is not None and request.loras:
            attestation["lora"] = runner.loras.describe(request.loras)
        results.append(
            RequestResult(
                request_id=request.request_id,
                images=output,
                seeds=request.seeds,
                timings_ms={
                    "encode": member.encode_ms,
                    "denoise": (start - member.joined) * 1000.0,
                    "decode": decode_ms,
                },
                memory_peak_mib=dict(peaks.peaks),
                attestation=attestation,
                handoff=decoded.handoffs[index] if decoded.handoffs else None,
            )
        )
        offset += request.n
    return results
