"""The attestation probe: a vLLM ``worker_extension_cls`` that diffserve installs in
every vLLM worker.

vLLM mixes this class into its worker (CPU, CUDA) and ``collective_rpc`` calls its
methods on every rank, so what it reports is read inside the process that runs the
model: its pid, the settings the worker received (``vllm_config``), the attention
backend of its attention layers, the experts implementation of a MoE model and its
KV-cache blocks. A forward hook counts the model's forward calls and tokens since the
last read (reset on read). Every return value is plain picklable data: vLLM's worker
pipe hangs the engine on anything else.
"""

from __future__ import annotations

import os
from typing import Any

# Module classes whose instances hold a MoE layer's experts, across vLLM versions.
_MOE_LAYER_HINTS = ("FusedMoE", "RoutedExperts", "SharedFusedMoE")


class AttestationProbe:
    """Methods vLLM adds to its worker class (``self`` is the worker: ``vllm_config``,
    ``model_runner``)."""

    vllm_config: Any
    model_runner: Any

    def _diffserve_model(self) -> Any:
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def diffserve_attest(self) -> dict[str, Any]:
        """What this rank runs, read from its own objects; installs the forward counter
        on first call."""
        config = self.vllm_config
        model = self._diffserve_model()
        if not hasattr(model, "_diffserve_counts"):
            model._diffserve_counts = {"forward_calls": 0, "tokens": 0}

            def count(module: Any, args: tuple, kwargs: dict) -> None:
                ids = kwargs.get("input_ids", args[0] if args else None)
                positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
                tokens = ids if ids is not None else positions
                module._diffserve_counts["forward_calls"] += 1
                module._diffserve_counts["tokens"] += (
                    int(tokens.numel()) if tokens is not None else 0
                )

            model.register_forward_pre_hook(count, with_kwargs=True)
        parallel, cache, model_config = (
            config.parallel_config,
            config.cache_config,
            config.model_config,
        )
        return {
            "worker_pid": os.getpid(),
            "rank": int(getattr(parallel, "rank", 0)),
            "model_class": type(model).__name__,
            "dtype": str(model_config.dtype).removeprefix("torch."),
            "enforce_eager": bool(model_config.enforce_eager),
            "max_model_len": int(model_config.max_model_len),
            "max_num_seqs": int(config.scheduler_config.max_num_seqs),
            "tensor_parallel_size": int(parallel.tensor_parallel_size),
            "enable_expert_parallel": bool(parallel.enable_expert_parallel),
            "distributed_executor_backend": str(parallel.distributed_executor_backend),
            "enable_prefix_caching": bool(cache.enable_prefix_caching),
            "block_size": int(cache.block_size),
            "kv_cache_blocks": int(cache.num_gpu_blocks or 0),
            "attention_backend": _attention_backend(model),
            "moe_experts": _moe_experts(model),
            "kv_connector": _kv_connector(config),
        }

    def diffserve_counts(self) -> dict[str, int]:
        """The model's forward calls and tokens since the last read; reading resets
        them."""
        counts = getattr(self._diffserve_model(), "_diffserve_counts", None)
        if counts is None:
            return {"forward_calls": 0, "tokens": 0}
        read = dict(counts)
        counts.update(forward_calls=0, tokens=0)
        return read


def _attention_backend(model: Any) -> str | None:
    names = set()
    for module in model.modules():
        backend = getattr(module, "attn_backend", None)
        if backend is not None and hasattr(backend, "get_name"):
            names.add(str(backend.get_name()))
    return ",".join(sorted(names)) or None


def _moe_experts(model: Any) -> str | None:
    """The class that computes a MoE layer's experts (``CPUUnquantizedExperts`` on CPU),
    None for a dense model."""
    layers = [m for m in model.modules() if type(m).__name__ in _MOE_LAYER_HINTS]
    for module in layers:
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if experts is not None:
            return type(experts).__name__
        cls = getattr(method, "experts_cls", None)
        if cls is not None:
            return str(getattr(cls, "__name__", cls))
    return type(layers[0]).__name__ if layers else None


def _kv_connector(config: Any) -> dict[str, str] | None:
    transfer = getattr(config, "kv_transfer_config", None)
    if transfer is None:
        return None
    return {"connector": str(transfer.kv_connector), "role": str(transfer.kv_role)}
