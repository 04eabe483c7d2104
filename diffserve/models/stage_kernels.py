"""Where a stage's pipeline runs and on which kernels: its device, the dtype its
``dtype`` resolves to there, and the ``KernelSet`` of its linear and attention backends
(one choice, made once, for every module built)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffserve.config.schema import StageConfig
from diffserve.layers.kernels import KernelSet, build_kernel_set
from diffserve.models.base import BuildContext
from diffserve.models.dtype import resolve_dtype


def stage_kernels(
    stage: StageConfig, context: BuildContext, roles: Sequence[str] = ()
) -> tuple[torch.device, torch.dtype, KernelSet]:
    device = torch.device(context.device)
    dtype = resolve_dtype(stage.dtype, device)
    kernels = build_kernel_set(
        stage.linear_backend,
        stage.attention_backend,
        roles=roles,
        device=device,
        dtype=dtype,
        observers=context.kernel_observers,
        batch_invariant=stage.batch_invariant,
    )
    return device, dtype, kernels
