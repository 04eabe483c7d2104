"""One replica of an AR stage: its vLLM engine, the requests it runs, and what it
attests for each (``attestation.ar``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diffserve.ar.vllm_engine import ArOutput, VllmEngine
from diffserve.config.vllm_args import vllm_version

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.ar_schema import ArStageConfig
    from diffserve.engine.scheduler import RequestState


class ArReplica:
    """One vLLM engine of the stage, fed by its own dispatch thread; ``out`` once that
    engine failed (the replica is then out for good)."""

    def __init__(self, index: int, engine: VllmEngine, warmup_ms: float | None) -> None:
        self.index = index
        self.engine = engine
        # What its warm-up rewrite took (attested; None with warmup: false).
        self.warmup_ms = warmup_ms
        self.out: BaseException | None = None
        self.inflight: dict[str, tuple[RequestState, list[int]]] = {}
        self.finished_since_count = 0

    def entry(
        self, stage: ArStageConfig, config_fingerprint: str, output: ArOutput
    ) -> dict[str, Any]:
        """The attestation of one finished request (``attestation.ar``'s entry): what
        every worker of this replica runs, read inside it at start, and what the
        request cost."""
        first = self.engine.attestation[0]
        kv_transfer = None
        if first.get("kv_connector") is not None:
            kv_transfer = {
                **first["kv_connector"],
                "tokens_loaded": output.cached_tokens if stage.role == "decode" else 0,
                "tokens_saved": len(output.prompt_token_ids)
                if stage.role == "prefill"
                else 0,
            }
        return {
            "stage_id": stage.stage_id,
            "role": stage.role,
            "engine": "vllm",
            "vllm_version": vllm_version(),
            "replica": self.index,
            "warmup_ms": self.warmup_ms,
            "worker_pids": [a["worker_pid"] for a in self.engine.attestation],
            "workers": [dict(a) for a in self.engine.attestation],
            **{
                key: first[key]
                for key in (
                    "model_class",
                    "dtype",
                    "enforce_eager",
                    "max_num_seqs",
                    "max_model_len",
                    "tensor_parallel_size",
                    "enable_expert_parallel",
                    "distributed_executor_backend",
                    "attention_backend",
                    "moe_experts",
                    "kv_cache_blocks",
                    "block_size",
                    "enable_prefix_caching",
                )
            },
            "kv_transfer": kv_transfer,
            "prompt_tokens": len(output.prompt_token_ids),
            "output_tokens": output.output_tokens,
            "finish_reason": output.finish_reason,
            "first_token_ms": output.first_token_ms,
            "total_ms": output.total_ms,
            "config_fingerprint": config_fingerprint,
        }
