"""How a compiling stage compiles, by device (``models/compile_options.py``), and the
``cuda_graphs`` key: refused where no compiled CUDA graph can run, part of the config's
fingerprint where it can."""

from __future__ import annotations

import pytest
import torch

from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError
from diffserve.models.compile_options import compile_options


def test_cpu_compiles_dynamic_and_gpus_autotune_static_shapes() -> None:
    cpu = compile_options(torch.device("cpu"))
    assert (cpu.mode, cpu.dynamic) == (None, True)
    gpu = compile_options(torch.device("cuda", 0))
    assert (gpu.mode, gpu.dynamic) == ("max-autotune-no-cudagraphs", False)
    graphs = compile_options(torch.device("cuda", 0), cuda_graphs=True)
    assert (graphs.mode, graphs.dynamic) == ("max-autotune", False)


def test_cuda_graphs_needs_compiled_blocks_on_cuda(tiny_flux_dir) -> None:
    with pytest.raises(ConfigError, match="stages.0.cuda_graphs") as on_cpu:
        resolve(model=tiny_flux_dir, overrides={"cuda_graphs": True}, env={})
    assert "runs on cpu" in str(on_cpu.value)
    with pytest.raises(ConfigError, match="enforce_eager: true"):
        resolve(
            model=tiny_flux_dir,
            overrides={"cuda_graphs": True, "enforce_eager": True},
            platform="cuda",
            env={},
        )
    graphs = resolve(
        model=tiny_flux_dir, env={"DIFFSERVE_CUDA_GRAPHS": "true"}, platform="cuda"
    )
    plain = resolve(model=tiny_flux_dir, platform="cuda", env={})
    assert graphs.stages[0].cuda_graphs and not plain.stages[0].cuda_graphs
    assert graphs.provenance["stages.0.cuda_graphs"].layer == "env"
    assert graphs.fingerprint != plain.fingerprint
