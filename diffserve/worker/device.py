"""Which torch device a rank of a stage runs on."""

from __future__ import annotations

from diffserve.config.schema import StageConfig


def device_for(stage: StageConfig, rank: int) -> str:
    """The stage's device list (``devices: "0,1"``) indexed by rank when CUDA is present, else the CPU."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    devices = [d for d in stage.devices.replace(" ", "").split(",") if d and d != "auto"]
    index = devices[rank % len(devices)] if devices else rank
    text = str(index)
    return text if text.startswith(("cuda", "cpu")) else f"cuda:{text}"
