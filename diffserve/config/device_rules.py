"""What a stage's device must be able to do for its weight settings: refused at resolve
time, never fallen back from at run time.

A quantization method the device cannot run (``fp8`` needs CUDA compute capability >=
8.9), quantization without torchao installed, offload on a CPU-only stage, and a
quantization on top of a GGUF transformer (whose file already chose its method) are each
a ``ConfigError`` naming the stage key, the device and what would run.
"""

from __future__ import annotations

from collections.abc import Mapping

from diffserve.config.provenance import DEFAULT_SOURCE, Source
from diffserve.config.requirements import module_available
from diffserve.config.schema import StageConfig
from diffserve.errors import ConfigError
from diffserve.registry.quantization import (
    QUANTIZATION_EXTRA,
    QUANTIZATION_METHODS,
    QUANTIZATION_PACKAGE,
    QuantizationMethod,
)

_ACCELERATORS = ("cuda", "rocm", "xpu")
_QUANTIZATION_KEYS = ("quantization", "text_encoder_quantization")


def device_errors(
    stages: tuple[StageConfig, ...], platform: str, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """Every weight setting of ``stages`` that ``platform`` cannot run."""
    errors: list[ConfigError] = []
    for stage in stages:

        def error(
            key: str, rule: str, hint: str, stage_id: int = stage.stage_id
        ) -> None:
            path = f"stages.{stage_id}.{key}"
            errors.append(
                ConfigError(
                    rule,
                    path=path,
                    source=provenance.get(path, DEFAULT_SOURCE).describe(),
                    hint=hint,
                )
            )

        for key in _QUANTIZATION_KEYS:
            method = QUANTIZATION_METHODS[getattr(stage, key)]
            if method.name == "none":
                continue
            if not module_available(QUANTIZATION_PACKAGE):
                error(
                    key,
                    f"quantization {method.name!r} runs on torchao, which "
                    "is not installed",
                    f'pip install "diffserve[{QUANTIZATION_EXTRA}]", or '
                    f"set {key}: none",
                )
            missing = _device_shortfall(method, platform, stage.devices)
            if missing:
                error(
                    key,
                    f"{method.name} ({method.doc}) {missing}",
                    f"on this device use {_runnable(platform)}",
                )
        if stage.offload != "none" and platform not in _ACCELERATORS:
            error(
                "offload",
                f"offload {stage.offload!r} moves weights between an "
                "accelerator and host memory; "
                f"this stage runs on {platform}, where the weights already "
                "are in host memory",
                "set offload: none (to save memory on a CPU, use quantization: "
                "int8 or int8_weight_only)",
            )
        if stage.cuda_graphs and (platform != "cuda" or stage.enforce_eager):
            error(
                "cuda_graphs",
                "cuda_graphs replays the compiled blocks as CUDA graphs: it needs "
                f"compiled blocks on a CUDA GPU (this stage runs on {platform}, "
                f"enforce_eager: {str(stage.enforce_eager).lower()})",
                "set cuda_graphs: false, or enforce_eager: false on a CUDA GPU",
            )
        if stage.offload == "sequential" and not stage.enforce_eager:
            error(
                "offload",
                "offload 'sequential' swaps the denoiser's block weights "
                "at every call, which a "
                "compiled graph cannot follow",
                "set enforce_eager: true, or use offload: model",
            )
        if stage.quantization != "none" and stage.components.get(
            "transformer", ""
        ).endswith(".gguf"):
            error(
                "quantization",
                "a GGUF transformer is already quantized by its file (its own method)",
                "set quantization: none, or serve a safetensors transformer",
            )
    return errors


def _device_shortfall(
    method: QuantizationMethod, platform: str, devices: tuple[int, ...]
) -> str | None:
    """Why ``platform`` cannot run ``method`` (None: it can)."""
    if method.min_cuda_capability is None:
        return None
    major, minor = method.min_cuda_capability
    needs = f"needs a CUDA GPU of compute capability >= {major}.{minor}"
    if platform != "cuda":
        return f"{needs}; this stage runs on {platform}"
    import torch  # the platform is cuda: torch was imported to detect it

    if not torch.cuda.is_available():
        # a cuda platform named for another machine (config validate): checked where it
        # runs
        return None
    for index in devices or range(torch.cuda.device_count()):
        if index < torch.cuda.device_count() and torch.cuda.get_device_capability(
            index
        ) < (major, minor):
            found = ".".join(map(str, torch.cuda.get_device_capability(index)))
            return (
                f"{needs}; cuda:{index} ({torch.cuda.get_device_name(index)}) "
                f"has {found}"
            )
    return None


def _runnable(platform: str) -> str:
    names = [
        m.name
        for m in QUANTIZATION_METHODS.values()
        if m.name != "none" and (m.min_cuda_capability is None or platform == "cuda")
    ]
    return ", ".join(names[:-1]) + f" or {names[-1]}"
