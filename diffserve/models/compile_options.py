"""How a stage that compiles (``enforce_eager: false``) compiles its blocks, by device.

On a GPU: inductor's ``max-autotune-no-cudagraphs`` (GEMM templates autotuned per
shape, epilogues fused into them; CUDA graphs stay off because a serving step's inputs
change address every step) with static shapes, one graph per (resolution, batch) kept
in the compile cache (``worker/compile_cache.py``), so a restart reuses the tuned
kernels. On a CPU: inductor's default mode with dynamic shapes, one graph for every
image size, because each compile costs a minute or more on a few cores. ``cuda_graphs:
true`` (GPU) adds CUDA graph replay per (shape, batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GPU_COMPILE_MODE = "max-autotune-no-cudagraphs"
# ``cuda_graphs: true``: the same, each block's graph replayed as a CUDA graph
# (inductor's cudagraph trees copy the inputs into the graph's static buffers)
GPU_CUDA_GRAPHS_MODE = "max-autotune"


@dataclass(frozen=True)
class CompileOptions:
    mode: str | None
    dynamic: bool


def compile_options(device: torch.device, cuda_graphs: bool = False) -> CompileOptions:
    """The inductor mode and shape policy for blocks running on ``device``
    (``cuda_graphs``: the stage's key, refused off CUDA by config)."""
    if device.type == "cpu":
        return CompileOptions(mode=None, dynamic=True)
    mode = GPU_CUDA_GRAPHS_MODE if cuda_graphs else GPU_COMPILE_MODE
    return CompileOptions(mode=mode, dynamic=False)
