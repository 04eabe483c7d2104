"""The decoding stage of ``topology: encode_denoise_decode`` (its last stage), behind
the denoising stage (``stage_loop.py``: its replicas, queue and loops).

The denoising stage hands each finished request over with its ``LatentsPayload``
(``take``, from the batch run) instead of finishing it; a batch of them is decoded on a
decoder stage worker (the family's stage pipeline), and the request's final output joins
both results: the denoising stage's attestation, seeds and timings, the decoded images,
this stage's ``decode`` time and ``vae_tiled``, and one ``stages`` entry per stage.
"""

from __future__ import annotations

from diffserve.engine.outputs import build_output, with_ar
from diffserve.engine.scheduler import RequestState
from diffserve.engine.stage_loop import StageLoop, stage_entry
from diffserve.types.results import RequestResult


class DecodeStage(StageLoop):
    def take(self, state: RequestState, output: RequestResult, queue_ms: float) -> None:
        """A request the denoising stage finished: into this stage's queue, with its
        latents."""
        state.stages.append(stage_entry(self.core.stage, dict(output.attestation)))
        state.handed = output
        state.queue_ms = queue_ms
        state.request = state.request.carrying(stage_input=output.handoff)
        self.core.scheduler.done([state])  # it left the denoising stage
        try:
            self.scheduler.add(state)
        except Exception as exc:  # noqa: BLE001 - a full or closed queue fails the request, not the batch
            self.core.counters.requests_failed += 1
            state.finish(exc)

    def _hand_on(self, live: list[RequestState], outputs: list[RequestResult]) -> None:
        """Each decoded request's final output, joined with what the denoising stage
        reported."""
        by_id = {o.request_id: o for o in outputs}
        finals = []
        for state in live:
            decoded = self._output_of(state, by_id)
            denoised = state.handed
            if decoded is None or denoised is None:
                continue
            merged = RequestResult(
                request_id=state.request_id,
                images=decoded.images,
                seeds=denoised.seeds,
                timings_ms={**denoised.timings_ms, **decoded.timings_ms},
                memory_peak_mib={**denoised.memory_peak_mib, **decoded.memory_peak_mib},
                attestation={**denoised.attestation, **decoded.attestation},
            )
            # A decoder makes images.
            final = build_output(state.request, merged, state.queue_ms)
            final.attestation.update(state.carried)  # type: ignore[typeddict-item]
            final.attestation["stages"] = [
                *state.stages,
                stage_entry(self.stage, dict(decoded.attestation)),
            ]
            final.timings.update(
                {k: round(float(v), 3) for k, v in state.stage_timings_ms.items()}
            )
            finals.append(
                (
                    state,
                    with_ar(
                        final,
                        state.original_prompt,
                        state.revised_prompt,
                        state.ar,
                        state.stage_timings_ms,
                    ),
                )
            )
        self.core.counters.requests_ok += sum(
            1 for state, _ in finals if not state.finished
        )
        self.core.deliver(finals)
