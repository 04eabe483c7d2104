"""Which torch device a rank of a replica of a stage runs on."""

from __future__ import annotations

from diffserve.config.schema import StageConfig


def device_for(stage: StageConfig, rank: int, replica: int = 0) -> str:
    """The stage's device list (``devices: [0, 1]``) indexed by ``replica * world_size +
    rank`` when CUDA is present (so replicas do not pile onto one device), else the CPU.
    No list: pick by slot."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    slot = replica * stage.parallel.world_size + rank
    devices = stage.devices
    index = (
        devices[slot % len(devices)]
        if devices
        else slot % max(torch.cuda.device_count(), 1)
    )
    return f"cuda:{index}"
