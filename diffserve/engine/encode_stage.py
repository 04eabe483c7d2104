"""The text-encoder stage of a staged topology (``split_text_encoder``,
``encode_denoise_decode``: the first stage after any AR stages), in front of the
denoising stage (``stage_loop.py``: its replicas, queue and loops).

An admitted request waits here first (after the AR stages, if any); a batch of them runs
on a text-encoder stage worker (the family's stage pipeline, registry
``stage_pipelines``), which returns one ``ConditioningPayload`` per request. The request
then carries it (``GenerationRequest. stage_input``) into the denoising stage's queue,
where it may batch and join as any request does. So the stages pipeline: while the
denoising stage runs request k, this stage already encodes k+1. What ran here is kept
per request (``RequestState.stages``) and joins the final attestation's ``stages`` list.
"""

from __future__ import annotations

from diffserve.engine.scheduler import RequestState
from diffserve.engine.stage_loop import StageLoop, stage_entry
from diffserve.errors import WorkerError
from diffserve.types.results import RequestResult

# What the final attestation takes from this stage at its top level.
CARRIED = ("conditioning_cache", "conditioning_cache_state")


class EncodeStage(StageLoop):
    def _hand_on(self, live: list[RequestState], outputs: list[RequestResult]) -> None:
        """Each request, with its payload and this stage's entry, into the denoising
        stage's queue."""
        by_id = {o.request_id: o for o in outputs}
        for state in live:
            output = self._output_of(state, by_id)
            if output is None:
                continue
            if output.handoff is None:
                state.finish(
                    WorkerError(
                        f"{self.describe()} returned "
                        "no conditioning for "
                        f"{state.request_id}"
                    )
                )
                continue
            state.request = state.request.carrying(stage_input=output.handoff)
            attestation = dict(output.attestation)
            state.stages.append(stage_entry(self.stage, attestation))
            # "encode": this stage's, not the next one's.
            state.stage_timings_ms.update(output.timings_ms)
            state.carried.update(
                {k: attestation[k] for k in CARRIED if k in attestation}
            )
            try:
                self.core.scheduler.add(state)
            except Exception as exc:  # noqa: BLE001 - a full or closed next queue fails the request, not the loop
                state.finish(exc)
